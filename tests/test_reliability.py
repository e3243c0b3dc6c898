"""Regression tests for the reliability probe (issue 16): each reproducer that gave a silent wrong
answer, a raw traceback or work before validation, with what it must do now. Every test here
failed before its fix."""

import json
import math
import os
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import repcap_fast as rf
from repcap_fast import packing, pga
from repcap_fast.cli import main
from repcap_fast.ops import subspace_pga as pga_op
from repcap_fast.report import ReportSettings, run_report

# -------------------------------------------------------------- 1. spearman ranks what it is given


@pytest.mark.parametrize("x, y", [
    ([1.0, 1.0 + 1e-9, 0.5], [2, 1, 0]),  # 0.866: the list was rounded to float32 (a tie)
    ([1e308, -1e308, 0.0], [1, 2, 3]),  # "contains NaN/Inf": ±1e308 overflowed float32
    (np.array([2**62, 2**62 + 1, 2**62 + 2]), [3, 2, 1]),  # NaN: int64 rounded to equal floats
    (np.array([1, 2, 3], dtype=np.uint64), [3, 1, 2]),
    (torch.tensor([1.0, 2.0, 2.0], dtype=torch.bfloat16), [1, 2, 3]),
    ([float("inf"), 1.0, -float("inf"), 2.0], [1, 2, 3, 4]),
])
def test_spearman_ranks_the_values_exactly(x, y):
    want = stats.spearmanr(x.float().numpy() if isinstance(x, torch.Tensor) else x, y).statistic
    assert pga.spearman(x, y) == pytest.approx(want, abs=1e-15)


def test_spearman_keeps_integers_beyond_int64_and_refuses_non_numbers():
    assert pga.spearman([2**64, 2**64 + 1, 3], [1, 2, 3]) == pytest.approx(-0.5)  # float64 would tie them
    with pytest.raises(ValueError, match="x contains NaN"):
        pga.spearman([1.0, float("nan"), 2.0], [1, 2, 3])
    with pytest.raises(TypeError, match="x must hold real numbers"):
        pga.spearman(["a", "b"], [1, 2])
    with pytest.raises(TypeError, match="y must hold real numbers"):
        pga.spearman([1, 2], [1 + 1j, 2])


# ------------------------------------------------------- 4. degenerate science is flagged, not hidden


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("n_tokens, ccr", [(12, 7), (3, 1)])
def test_rank_one_ccr_residual_gives_nan_with_a_warning(backend, n_tokens, ccr):
    """The residual after CCR has rank 1: every distance is 0 or 2 and rounding alone ordered them
    (z was −0.224 on cpu and +2.337 on torch, with no warning)."""
    torch.manual_seed(0)
    H, W = torch.randn(n_tokens, 8), torch.randn(30, 8)
    with pytest.warns(pga.DegenerateInputWarning, match="rank-1 residual"):
        res = pga.subspace_pga(H, W, k=3, n_null=5, ccr=ccr, backend=backend)
    assert math.isnan(res.z) and res.warnings and res.warnings[0].startswith("rank-1 residual")
    assert res.to_dict()["z"] is None and json.dumps(res.to_dict())


def test_duplicated_tokens_and_zero_null_spread_are_flagged():
    g = torch.Generator().manual_seed(3)
    H = torch.randn(20, 6, generator=g)
    H[5] = H[2]
    with pytest.warns(pga.DegenerateInputWarning, match="duplicated tokens: 1 of 20"):
        res = pga.subspace_pga(H, torch.randn(30, 6, generator=g), k=2, n_null=4)
    assert math.isfinite(res.z) and any("duplicated tokens" in w for w in res.warnings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on a clean input
        assert pga.subspace_pga(torch.randn(20, 6, generator=g), torch.randn(30, 6, generator=g), k=2,
                                n_null=4).warnings == []


def test_report_shows_the_warnings():
    from repcap_fast.report import report_markdown

    rows = [{"layer": 0, "z": None, "warnings": ["rank-1 residual: ..."]}, {"layer": 1, "z": 1.5, "warnings": []}]
    doc = {"model": {"source": "m", "path": "p", "kind": "k", "architecture": "a", "input_name": "E", "vocab_rows": 3,
                     "tokenizer_size": None, "tied": True, "tied_reason": "r", "padded_rows": 0, "rows_kept": 3},
           "epsilon": {"input": {"shape": [3, 2], "dtype": "float32", "rows_used": 3, "pairs": 3,
                                 "stream": {"mean": 0.1, "std": 0.1}, "epsilon": 0.3, "exact": {"epsilon": 0.3},
                                 "class_description": "c", "class": 2, "capacity": {"formulas": {}}}},
           "provenance": {"time_utc": "t", "versions": {"repcap_fast": "v", "torch": "t"}, "seconds": {}},
           "hidden_states": {"n_tokens": 3, "text": {"name": "x"}, "seed": 0, "windows_run": 1, "seq_len": 8},
           "pga": {"readout": "r", "k": 1, "n_null": 2, "profile": {"1": rows}},
           "spectral": {"layers": []}}
    md = report_markdown(doc)
    assert "| 0 | n/a ⚠ |" in md and "- layer 0, CCR-1: rank-1 residual" in md


# ------------------------------------------------------------- 5. scale never changes a PGA result


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 3e37), (torch.float32, 1e-35), (torch.float64, 1e-200),
                                          (torch.float64, 1e200)])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_pga_does_not_depend_on_the_scale_of_h_or_w(dtype, scale, backend):
    """float32 H near 3e38 gave z 0.2267 on cpu against 0.4682 on torch; float64 H × 1e-200 was
    refused as zero rows and × 1e200 raised a raw _LinAlgError."""
    g = torch.Generator().manual_seed(1)
    H, W = torch.randn(40, 16, generator=g, dtype=torch.float64), torch.randn(50, 16, generator=g, dtype=torch.float64)
    want = pga.subspace_pga(H, W, k=4, n_null=5, backend="torch")
    got = pga.subspace_pga((H * scale).to(dtype), (W * scale).to(dtype), k=4, n_null=5, backend=backend)
    tol = 1e-12 if dtype == torch.float64 and backend == "torch" else 2e-5
    np.testing.assert_allclose([got.rho_readout, *got.null_rhos], [want.rho_readout, *want.null_rhos], atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stream_method_does_not_depend_on_the_scale_of_h(dtype):
    g = torch.Generator().manual_seed(2)
    H, W = torch.randn(30, 8, generator=g, dtype=dtype), torch.randn(20, 8, generator=g, dtype=dtype)
    big = 3e37 if dtype == torch.float32 else 1e300
    a = pga.subspace_pga(H, W, k=3, n_null=4, method="stream")
    b = pga.subspace_pga(H * big, W, k=3, n_null=4, method="stream")
    np.testing.assert_allclose([b.rho_readout, *b.null_rhos], [a.rho_readout, *a.null_rhos], atol=1e-6)


# ---------------------------------------------------- 9, 11, 12. arguments named, rows, seeds


def test_w_u_that_is_not_a_matrix_is_named():
    H = torch.randn(20, 8)
    with pytest.raises(TypeError, match="W_U must be a torch.Tensor or numpy.ndarray, got list"):
        pga.subspace_pga(H, torch.randn(30, 8).tolist(), k=3, n_null=3)
    with pytest.raises(ValueError, match=r"W_U must be V×d .* got shape \(8,\)"):
        pga.subspace_pga(H, torch.randn(8), k=3, n_null=3)


@pytest.mark.parametrize("op", ["stats", "moments", "penalty", "penalty_torch"])
def test_float64_rows_whose_norm_overflows_are_directions(op):
    """A finite float64 row of 1e308's has a norm beyond float64: it was reported as "A contains 0
    NaN/Inf values". It is a direction like any other (here the all-ones one)."""
    g = torch.Generator().manual_seed(4)
    X = torch.randn(6, 4, generator=g, dtype=torch.float64)
    huge, ones = X.clone(), X.clone()
    huge[1], ones[1] = 1e308, 1.0
    run = {"stats": lambda a: rf.pairwise_cosine_stats(a).mean, "moments": lambda a: rf.cosine_moments(a).mean,
           "penalty": lambda a: float(rf.gram_offdiag_penalty(a, p=4)),
           "penalty_torch": lambda a: float(rf.gram_offdiag_penalty(a, p=4, backend="torch"))}[op]
    assert run(huge) == pytest.approx(run(ones), rel=1e-6 if op == "stats" else 1e-12)
    huge[2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"contains 1 NaN/Inf values \(first in row 2\)"):
        run(huge)


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (2**63, ValueError), (1.5, TypeError), (True, TypeError),
                                         ("3", TypeError)])
def test_seeds_never_alias_or_truncate(seed, error):
    """−1 drew the same nulls as 2⁶³−1, 2⁶³ the same as 0, and 1.5 was truncated to 1."""
    H, W = torch.randn(10, 4), torch.randn(8, 4)
    for call in (lambda: pga.subspace_pga(H, W, k=2, n_null=3, seed=seed),
                 lambda: pga.grassmann_bases(4, 2, 3, seed),
                 lambda: packing.optimize(5, 3, steps=1, seed=seed, progress=False),
                 lambda: ReportSettings(seed=seed)):
        with pytest.raises(error, match="seed"):
            call()


def test_the_result_records_the_seed_as_drawn():
    res = pga.subspace_pga(torch.randn(10, 4), torch.randn(8, 4), k=2, n_null=3, seed=np.int64(2**63 - 1))
    assert res.seed == 2**63 - 1 and type(res.seed) is int
    top = pga.grassmann_bases(4, 2, 3, 2**63 - 1)
    assert not torch.equal(top, pga.grassmann_bases(4, 2, 3, 0))


# ----------------------------------------------------------- 6, 13. packing and JSON hygiene


def test_float16_packing_is_refused_before_any_work(tmp_path):
    """Adam in float16 made NaN on its first step, and the error blamed the input as "X"."""
    with pytest.raises(ValueError, match="dtype float16 cannot run the packing optimizer"):
        packing.optimize(50, 8, steps=5, dtype="float16", progress=False)
    with pytest.raises(ValueError, match="dtype float16"):
        packing.sweep([10], [4], tmp_path / "s.json", steps=2, dtype=torch.float16, progress=False)
    assert not (tmp_path / "s.json").exists()


def test_divergence_is_reported_as_the_optimizer_s(monkeypatch):
    real = rf.gram_offdiag_penalty

    def poisoned(X, *a, **k):
        if poisoned.calls == 1:
            with torch.no_grad():
                X[0, 0] = float("nan")
        poisoned.calls += 1
        return real(X, *a, **k)

    poisoned.calls = 0
    monkeypatch.setattr(packing.optimizer, "gram_offdiag_penalty", poisoned)
    with pytest.raises(RuntimeError, match="packing diverged at step 1"):
        packing.optimize(10, 3, steps=3, progress=False)


def test_to_dict_is_json_with_numpy_arguments():
    n = np.int64
    H, W = torch.randn(12, 6), torch.randn(10, 6)
    docs = [pga.subspace_pga(H, W, k=n(2), n_null=n(3), ccr=n(1), seed=n(5)).to_dict(),
            packing.optimize(n(6), n(3), steps=n(2), p=n(4), seed=n(1), progress=False).to_dict(),
            rf.pairwise_cosine_stats(H, bins=n(64)).to_dict(include_hist=True),
            rf.cosine_moments(H).to_dict(),
            ReportSettings(n_tokens=n(64), k=n(4), n_null=n(3), ccrs=(n(1),), seed=n(2)).to_dict()]
    for doc in docs:
        json.loads(json.dumps(doc, allow_nan=False))


# ------------------------------------------------------- 3, 7. outputs checked first, one-line errors


def _no_work(monkeypatch):
    fail = lambda *a, **k: pytest.fail("work started before the output path was checked")  # noqa: E731
    for mod, name in ((packing, "optimize"), (pga_op, "subspace_pga")):
        monkeypatch.setattr(mod, name, fail)
    import repcap_fast.cli as cli
    import repcap_fast.report.stages as stages

    monkeypatch.setattr(cli, "load_embeddings", fail)
    monkeypatch.setattr(cli.packing, "optimize", fail)
    monkeypatch.setattr(stages, "_load_for_report", fail)


@pytest.fixture
def unwritable(tmp_path, monkeypatch):
    """A folder that cannot be written to (as for a read-only mount: also as root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    import tempfile

    real = tempfile.mkstemp

    def refuse(*a, dir=None, **k):
        if dir is not None and os.path.realpath(dir).startswith(os.path.realpath(folder)):
            raise PermissionError(13, "Permission denied", dir)
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    return folder


@pytest.mark.parametrize("argv", [
    ["sweep", "--ks", "10", "--ds", "3", "--steps", "2", "--out", "{ro}/s.json"],
    ["report", "--out", "{ro}/rep"],
    ["report", "--out", "{ro}"],
    ["pack", "--k", "10", "--d", "3", "--json", "{ro}/p.json"],
    ["pack", "--k", "10", "--d", "3", "--plot", "{ro}/p.png"],
    ["epsilon", "{npy}", "--json", "{ro}/e.json"],
    ["epsilon", "{npy}", "--plot", "{ro}/e"],
    ["fit", "{sweep}", "--json", "{ro}/f.json"],
    ["fit", "{sweep}", "--plot", "{ro}/f.png"],
])
def test_unwritable_outputs_fail_in_one_line_before_any_work(argv, unwritable, tmp_path, monkeypatch, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32))
    (tmp_path / "s.json").write_text(json.dumps({"format": packing.SWEEP_FORMAT, "cells": []}))
    _no_work(monkeypatch)
    argv = [a.format(ro=unwritable, npy=tmp_path / "x.npy", sweep=tmp_path / "s.json") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repcap: error: ") and str(unwritable) in err[0], err


@pytest.mark.parametrize("argv, message", [
    (["pack", "--k", "10", "--d", "3", "--json", "{tmp}"], "is a folder"),
    (["report", "--out", "{tmp}/file.txt"], "is a file"),
    (["pack", "--k", "10", "--d", "3", "--device", "cuda"], "no CUDA device"),
    (["pack", "--k", "10", "--d", "3", "--device", "nonsense"], "is not a device"),
    (["epsilon", "{tmp}/missing.npy"], "missing.npy"),
])
def test_bad_arguments_give_one_error_line_naming_them(argv, message, tmp_path, monkeypatch, capsys):
    if torch.cuda.is_available() and "cuda" in argv:
        pytest.skip("this machine has a CUDA device")
    (tmp_path / "file.txt").write_text("x")
    if argv[0] != "epsilon":
        _no_work(monkeypatch)
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repcap: error: ") and message in err[0], err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        main(["--debug", "pack", "--k", "10", "--d", "3", "--json", str(tmp_path)])


def test_sweep_creates_the_output_folder_and_plot_names_are_what_is_written(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "s.json"
    assert main(["sweep", "--ks", "6", "--ds", "3", "--steps", "2", "--out", str(out), "--no-progress"]) == 0
    assert out.exists()
    assert main(["pack", "--k", "6", "--d", "3", "--steps", "2", "--plot", str(tmp_path / "plots" / "loss")]) == 0
    assert (tmp_path / "plots" / "loss.png").exists()
    assert f"wrote       {tmp_path / 'plots' / 'loss.png'}" in capsys.readouterr().out


def test_run_report_checks_its_folder_before_loading(tmp_path, monkeypatch):
    _no_work(monkeypatch)
    (tmp_path / "taken").write_text("")
    with pytest.raises(ValueError, match="out .* is a file"):
        run_report("minilm", tmp_path / "taken", ReportSettings(n_tokens=64))


def test_pga_torch_reference_refuses_what_cannot_fit(monkeypatch):
    """The torch reference materializes N×N float64: refused with the size, before any work."""
    monkeypatch.setattr(pga_op, "_memory_budget", lambda dev: 1 << 20)
    monkeypatch.setattr(pga_op, "center_and_ccr_unscaled", lambda *a: pytest.fail("work started before the check"))
    with pytest.raises(ValueError, match=r"N=1000 tokens: the torch reference materializes .* GiB"):
        pga.subspace_pga(torch.randn(1000, 4), torch.randn(10, 4), k=2, n_null=2, backend="torch")


def test_penalty_p_limit_holds_on_the_kernels_and_not_on_the_reference():
    """README Guarantees: p ≤ 2^30 on the kernels (repeated squaring over 31 bits), refused before
    any work; the float64 torch reference takes any p."""
    X = torch.randn(6, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"p must be an integer in \[1, 1073741824\]"):
        rf.gram_offdiag_penalty(X, p=2**30 + 1, backend="cpu")
    assert math.isfinite(float(rf.gram_offdiag_penalty(X, p=2**30 + 1, backend="torch")))


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_a_gradient_beyond_the_input_dtype_overflows_exactly_where_float64_does(backend):
    """float16 X, normalize=False, p = 5: the loss fits, ∂L/∂x (7e4) does not fit float16. As for
    float32 (test_tiny_rows_normalize_exactly), the gradient is ±inf exactly where the float64
    gradient is beyond the dtype's range, with the right sign, and finite elsewhere (README)."""
    X = torch.tensor([[-1.58], [-4.07], [0.01]], dtype=torch.float16).requires_grad_(True)
    rf.gram_offdiag_penalty(X, p=5, normalize=False, backend=backend).backward()
    X64 = X.detach().double().requires_grad_(True)
    rf.gram_offdiag_penalty(X64, p=5, normalize=False, backend="torch").backward()
    beyond = X64.grad.abs() > torch.finfo(torch.float16).max
    assert bool(beyond.any()) and torch.equal(torch.isinf(X.grad), beyond)
    assert torch.equal(torch.sign(X.grad[beyond]).double(), torch.sign(X64.grad[beyond]))


def test_mean_stays_within_min_and_max_and_equal_cosines_have_zero_std():
    """The float64 torch backend gave μ one ulp below min = max and σ = 1.5e-8 for three equal rows
    (σ² = Σc²/n − μ² cancels)."""
    a = torch.tensor([[-0.7056439518928528, 0.6741186380386353]] * 3)
    for backend in ("torch", "cpu"):
        s = rf.pairwise_cosine_stats(a, backend=backend)
        assert s.min <= s.mean <= s.max and s.std == 0.0


def test_restart_gets_past_a_corrupt_sweep_file_and_resume_says_how(tmp_path):
    out = tmp_path / "s.json"
    packing.sweep([6], [3], out, steps=2, progress=False)
    out.write_text(out.read_text()[:80])  # torn: a kill in the middle of a write by another tool
    with pytest.raises(ValueError, match=r"starts .* anew"):
        packing.sweep([6], [3], out, steps=2, progress=False)
    cells = packing.sweep([6], [3], out, steps=2, resume=False, progress=False)
    assert packing.load_cells(out) == cells
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a repcap_fast sweep file"):
        packing.sweep([6], [3], foreign, steps=2, resume=False, progress=False)
    assert foreign.read_text() == '{"mine": 1}'


def test_resume_refuses_a_cell_with_two_values_across_files(tmp_path):
    """A resume kept duplicate (k, d) cells with conflicting ε (the last one read won)."""
    out = tmp_path / "s.json"
    cells = packing.sweep([6], [3], out, steps=2, progress=False)
    other = dict(cells[0], eps_star=cells[0]["eps_star"] - 0.1, eps_minus_bound=cells[0]["eps_minus_bound"] - 0.1)
    from repcap_fast.packing.sweep_file import part_file, write_cells

    write_cells(part_file(str(out), 1), [other])
    with pytest.raises(ValueError, match=r"the cell \(k=6, d=3\) is in .* and in .*part1 with different values"):
        packing.sweep([6], [3], out, steps=2, progress=False)


def test_merging_part_files_also_removes_a_killed_writer_s_temporary_file(tmp_path):
    """CI failure on 2026-12-02: spawn SIGTERMed rank 0 in the middle of writing its part file;
    the resume merged and removed the part files but left `out.part0.tmp-PID` behind."""
    from repcap_fast.packing.sweep_file import part_file, write_cells

    out = tmp_path / "s.json"
    cells = packing.sweep([6, 8], [3], out, steps=2, progress=False)
    out.unlink()
    write_cells(part_file(str(out), 0), cells[:1])
    torn = tmp_path / "s.json.part0.tmp-4194305"  # a pid above Linux's pid_max: its writer is gone
    torn.write_text(out.name[:3])
    assert packing.sweep([6, 8], [3], out, steps=2, progress=False) == cells
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    # starting anew removes them too
    write_cells(part_file(str(out), 1), cells[1:])
    torn.write_text("{")
    packing.sweep([6, 8], [3], out, steps=2, resume=False, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_fit_on_a_cell_too_large_for_a_float_names_the_file(tmp_path, capsys):
    out = tmp_path / "s.json"
    packing.sweep([6, 8, 10], [3, 4], out, steps=2, progress=False)
    doc = json.loads(out.read_text())
    doc["cells"][0]["k"] = 10**400
    out.write_text(json.dumps(doc))
    assert main(["fit", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repcap: error: ") and "s.json" in err[0], err


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_a_command_is_refused_and_never_run(tmp_path):
    """A .pt whose pickle calls os.system: torch names the module as blocked; the reader said
    "corrupt" instead of saying why it refuses, and it must never run the command."""
    from repcap_fast.models import load_embeddings

    marker = tmp_path / "ran"
    torch.save({"w": _RunsACommand(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"evil\.pt: refused: this checkpoint holds pickled Python objects"):
        load_embeddings(str(tmp_path / "evil.pt"))
    assert not marker.exists()


def test_a_nearly_rank_one_residual_is_computed_and_flagged_only_where_float32_cannot_resolve_it():
    """Tokens ±(1 to 2)·v + 1e-4·noise: not rank 1 (float64 gives a z, as the torch reference does), but
    below what float32 distances resolve: the float32 kernel computes and says so; it returned NaN
    as if the residual were exactly rank 1."""
    g = torch.Generator().manual_seed(7)
    v = torch.randn(16, generator=g, dtype=torch.float64)
    a = (1 + torch.rand(60, 1, generator=g, dtype=torch.float64)) * torch.tensor([1.0, -1.0]).repeat(30)[:, None]
    H = a * v + 1e-4 * torch.randn(60, 16, generator=g, dtype=torch.float64)
    W = torch.randn(40, 16, generator=g, dtype=torch.float64)
    ref = pga.subspace_pga(H, W, k=4, n_null=5, ccr=0, backend="torch")
    f64 = pga.subspace_pga(H, W, k=4, n_null=5, ccr=0, backend="cpu")
    assert ref.warnings == [] and f64.warnings == [] and math.isfinite(ref.z)
    assert f64.z == pytest.approx(ref.z, abs=1e-8)
    with pytest.warns(pga.DegenerateInputWarning, match="nearly rank-1 residual"):
        f32 = pga.subspace_pga(H.float(), W.float(), k=4, n_null=5, ccr=0, backend="cpu")
    assert not math.isnan(f32.rho_readout)


def test_pga_of_h_near_the_float64_maximum():
    """The residual was scaled back to H's magnitude and overflowed: "H contains 3 NaN/Inf"."""
    g = torch.Generator().manual_seed(8)
    H, W = torch.randn(30, 6, generator=g, dtype=torch.float64), torch.randn(20, 6, generator=g, dtype=torch.float64)
    want = pga.subspace_pga(H, W, k=2, n_null=4, backend="torch")
    got = pga.subspace_pga(H / H.abs().max() * 8e307, W, k=2, n_null=4, backend="torch")
    assert got.z == pytest.approx(want.z, abs=1e-9)


def test_cross_model_agreement_does_not_depend_on_scale():
    """H × 1e200 gave NaN and H × 1e-200 was refused as zero rows."""
    g = torch.Generator().manual_seed(9)
    H = torch.randn(25, 6, generator=g, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(6, 2, generator=g, dtype=torch.float64))[0]
    want = pga.cross_model_agreement(H, H, basis, basis, n_null=3)
    for scale in (1e200, 1e-200):
        got = pga.cross_model_agreement(H * scale, H, basis, basis, n_null=3)
        assert got["readout"] == pytest.approx(want["readout"], abs=1e-12)
        assert got["full"] == pytest.approx(1.0)
