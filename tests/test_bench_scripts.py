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
