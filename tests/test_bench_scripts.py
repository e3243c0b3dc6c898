"""The GPU-only bench scripts' helpers, run on the CPU: a GPU draw is rare, so a bug in a script
must not wait for one to show (bench/gpu_diagnostics.py lost every tile configuration of the
12-04 H200 run to one)."""

import importlib.util
import pathlib

import pytest
import torch

import repcap_fast as rf
from repcap_fast.reference import pairwise_cosine_stats_reference

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_diagnostics_tile_override_is_called_as_the_kernel_calls_it(dtype, monkeypatch):
    pytest.importorskip("triton")
    diagnostics = _load("gpu_diagnostics")
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    tile = (32, 32, 4, 1)  # not the interpreter's default (64, 64, 4, 1)
    calls = []
    default = tk._config
    fixed = diagnostics.fixed_tile_config(default, tile)

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return fixed(*args, **kwargs)

    monkeypatch.setattr(tk, "_config", recording)
    x = torch.randn(150, 24, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = rf.pairwise_cosine_stats(x, backend="triton", progress=False)
    ref = pairwise_cosine_stats_reference(x)
    assert calls, "the kernel did not ask the override for its tiles"
    assert got.count == ref["count"] == 150 * 149 // 2
    assert got.mean == pytest.approx(ref["sum"] / ref["count"], abs=1e-6)
    assert got.max == pytest.approx(ref["max"], abs=1e-6)
    # the one-pass kernel gets the tile; the split pass (if this dtype takes it) keeps its default
    for args, kwargs in calls:
        split = kwargs.get("split", args[2] if len(args) > 2 else False)
        assert fixed(*args, **kwargs) == (default(args[0], args[1], True) if split else tile)


def test_the_crash_probe_records_raised_and_crashed_probes(monkeypatch, tmp_path):
    """bench/gpu_crash_probe.py on CPU tensors: every check raises (the answer the CUDA op must
    give too); and a probe that kills its process is recorded as crashed, with its signal, while
    the next probe still runs."""
    probe = _load("gpu_crash_probe")
    out = tmp_path / "probe.json"
    rc = probe.main([str(out), "--device", "cpu", "--only", "rhos_over_the_token_limit"])
    import json

    report = json.loads(out.read_text())
    assert rc == 0, report
    for name, r in report["probes"].items():
        assert r["outcome"] == "raised" and r["rc"] == 0, (name, r)
    assert "at most 65536 tokens" in report["probes"]["rhos_over_the_token_limit"]["stdout"]
    monkeypatch.setitem(probe.PROBES, "segfault", "    import ctypes; ctypes.string_at(0)")
    monkeypatch.setattr(probe.shutil, "which", lambda name: None)  # no gdb rerun: keep it quick
    r = probe.run_probe("segfault", "cpu", 60)
    assert (r["outcome"], r["signal"]) == ("crashed", "SIGSEGV"), r
    assert "Fatal Python error" in r["stderr_tail"]


def test_the_tf32_gpu_band_holds_the_tensor_core_models():
    """The one-sided band of the GPU "tf32" test against bench/tf32_accumulation.py's models on a
    sample of that test's pairs: rounded-to-nearest float32 sums sit within TF32_SUM_TOL; the
    truncating-alignment models (0 and 1 extra bits, K = 8) that bracket the H200's measured bias
    lose less than TF32_GPU_LOSS; operands truncated instead of rounded fall far outside."""
    import numpy as np
    from test_pairwise_cosine_stats import TF32_GPU_LOSS, TF32_SUM_TOL

    model = _load("tf32_accumulation")
    precision = _load("precision_split_dots")
    x = model.near_duplicates(model.ROWS, model.D, model.SEED, model.NOISE)
    i = np.arange(0, 400)
    j = (i * 7 + 13) % model.ROWS
    j = np.where(j == i, j + 1, j)
    inv = 1.0 / x.double().norm(dim=1).numpy()

    def bias(rows, how, k=8, g=0):
        prods = rows[i] * rows[j]
        exact = (prods.sum(axis=1) * inv[i] * inv[j]).sum()
        return (float((model.dot_products(prods, how, k, g) * inv[i] * inv[j]).sum()) - exact) / exact

    r = precision.to_tf32(x).double().numpy()
    assert abs(bias(r, "rn")) < TF32_SUM_TOL
    for g in (0, 1):
        assert -TF32_GPU_LOSS < bias(r, "align", 8, g) < -5e-6, g
    truncated = precision.truncated_tf32(x).double().numpy()
    exact_rounded = ((r[i] * r[j]).sum(axis=1) * inv[i] * inv[j]).sum()
    got = ((truncated[i] * truncated[j]).sum(axis=1) * inv[i] * inv[j]).sum()
    assert (got - exact_rounded) / exact_rounded < -10 * TF32_GPU_LOSS


def test_the_panels_prediction_counts_the_launchers_panels(tmp_path):
    """bench/panels_breakdown.py's prediction (the part that runs without a GPU): the panels are
    the launcher's (upper triangle of 8192-row panels, the diagonal ones whole), so the GEMMs are a
    little over half the full GEMM, and the pairs formed cover every kept pair."""
    breakdown = _load("panels_breakdown")
    v = 151_936
    shapes = breakdown.panel_shapes(v)
    blocks = -(-v // breakdown.PANEL)
    assert len(shapes) == blocks * (blocks + 1) // 2
    p = breakdown.predict(v, 4096, 700e12, 4e12)
    assert p["pairs_formed"] >= p["pairs_kept"] == v * (v - 1) // 2
    assert 0.5 < p["gemm_fraction_of_full"] < 0.5 + 1.0 / blocks
    assert p["predicted_s"] == pytest.approx(p["gemm_s"] + p["traffic_s"])
    breakdown.main([str(tmp_path / "p.json"), "--predict-only", "--d", "896"])
    assert (tmp_path / "p.json").exists()


def test_the_pga_profile_breakdown_ranks_the_profiles_operators(tmp_path):
    """bench/pga_profile_breakdown.py at a small size on the CPU: the profile runs under
    torch.profiler, and the operators it ranks include the projections and the sorts."""
    import json

    breakdown = _load("pga_profile_breakdown")
    out = tmp_path / "b.json"
    breakdown.main([str(out), "--device", "cpu", "--layers", "2", "--n", "64", "--d", "96", "--k", "8",
                    "--nulls", "4"])
    doc = json.loads(out.read_text())
    assert doc["wall_s_under_profiler"] > 0 and doc["layers"] == 2
    names = " ".join(r["name"] for r in doc["by_host_time"])
    assert "repcap_fast::" in names or "aten::" in names, names
    assert all(r["calls"] >= 1 and r["self_cpu_s"] >= 0 for r in doc["by_host_time"])
