"""The dispatch table KERNELS[op][backend], its one resolution rule, info(), the kernels' limits
from the compiled module, the precision guard, and the deprecated aliases of renamed modules."""

import importlib
import json
import os
import sys
import warnings

import pytest
import torch

import repcap_fast as rf
from repcap_fast import _backends
from repcap_fast._backends import KERNELS, OPS, resolve_backend

from _helpers import INTERPRETING


def fake_build(monkeypatch, *, compiled=True, cuda=False, triton=True):
    """Pretend the build has (or lacks) the compiled module, its CUDA kernels and triton."""
    module = type("FakeC", (), {"build_info": staticmethod(lambda: {"cuda": cuda})})() if compiled else None
    monkeypatch.setattr(_backends, "_compiled", lambda: (module, None if compiled else "not built"))
    monkeypatch.setattr(_backends, "_triton", lambda: (object() if triton else None, None if triton else "no triton"))
    monkeypatch.setattr(_backends, "build_info", lambda: module.build_info() if compiled else {})


@pytest.mark.parametrize("cuda,triton,want", [(True, True, "cuda"), (False, True, "triton"), (True, False, "cuda"),
                                              (False, False, "torch")])
def test_auto_on_cuda_tensors_follows_the_build(monkeypatch, cuda, triton, want):
    fake_build(monkeypatch, cuda=cuda, triton=triton)
    for op in OPS:
        assert resolve_backend("auto", torch.device("cuda"), op) == want
        assert rf.info()["ops"][op] == {"cpu": "cpu", "cuda": want}


def test_auto_on_cpu_tensors_is_the_cpp_kernel_never_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for op in OPS:
        assert resolve_backend("auto", torch.device("cpu"), op) == "cpu"
    assert rf.pairwise_cosine_stats(torch.randn(5, 3)).backend == "cpu"


def test_without_the_compiled_module_auto_warns_and_falls_back_to_torch(monkeypatch):
    fake_build(monkeypatch, compiled=False)
    monkeypatch.setattr(_backends, "_warned_missing_compiled", False)
    with pytest.warns(RuntimeWarning, match="falls back to the slow float64 reference"):
        assert resolve_backend("auto", torch.device("cpu"), "subspace_pga") == "torch"
    with pytest.raises(RuntimeError, match="repcap_fast._C is not built.*pip install --no-build-isolation"):
        resolve_backend("cpu", torch.device("cpu"), "pairwise_cosine_stats")
    with pytest.raises(RuntimeError, match="is not built"):
        _backends.kernel_limits()


def test_every_op_has_every_backend_and_dispatch_returns_its_launcher():
    for op in OPS:
        assert sorted(KERNELS[op]) == sorted(_backends.BACKENDS), op
        name, launcher = _backends.dispatch(op, "torch", torch.device("cpu"))
        assert name == "torch" and launcher is KERNELS[op]["torch"]
    # cpu and cuda run the same registered op, which the dispatcher routes by device
    assert KERNELS["pairwise_cosine_stats"]["cpu"] is KERNELS["pairwise_cosine_stats"]["cuda"]
    assert rf.info()["backends"] == {op: sorted(_backends.BACKENDS) for op in OPS}


def test_register_kernel_rejects_unknown_names():
    with pytest.raises(KeyError, match="unknown op"):
        _backends.register_kernel("pairwise_cosine", "cpu")
    with pytest.raises(KeyError, match="unknown backend"):
        _backends.register_kernel("subspace_pga", "metal")(lambda: None)


@pytest.mark.parametrize("forced", ["cpu", "torch"] + (["triton"] if INTERPRETING else []))
def test_env_var_forces_a_backend_for_every_op(monkeypatch, forced):
    monkeypatch.setenv("REPCAP_BACKEND", forced)
    x = torch.randn(12, 4, dtype=torch.float64)
    assert rf.pairwise_cosine_stats(x).backend == forced
    assert rf.subspace_pga(x, torch.randn(20, 4, dtype=torch.float64), k=2, n_null=3).backend == forced
    assert rf.packing.optimize(6, 3, steps=2).backend == forced
    # an explicit backend wins over the variable, and info() reports the automatic choice beside it
    assert rf.pairwise_cosine_stats(x, backend="cpu").backend == "cpu"
    assert rf.info()["backend_env"] == forced and rf.info()["ops"]["pairwise_cosine_stats"]["cpu"] == "cpu"


def test_cli_json_with_forced_backend(monkeypatch, tmp_path):
    import numpy as np

    from repcap_fast.cli import main

    monkeypatch.setenv("REPCAP_BACKEND", "torch")
    src = tmp_path / "x.npy"
    np.save(src, np.random.default_rng(1).standard_normal((50, 6)).astype(np.float32))
    assert main(["epsilon", str(src), "--json", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["provenance"]["backend"] == "torch"


def test_limits_and_precision_codes_come_from_the_compiled_module():
    info = rf._C.build_info()
    assert _backends.kernel_limits()._asdict() == dict(info["limits"]) == rf.info()["limits"]
    assert info["limits"]["pga_tokens"] * (info["limits"]["pga_tokens"] - 1) < 2**32
    assert {p: _backends.precision_code(p) for p in _backends.PENALTY_PRECISIONS} == dict(info["precisions"])
    assert set(_backends.PRECISIONS) < set(_backends.PENALTY_PRECISIONS)
    with pytest.raises(ValueError, match="precision must be one of"):
        _backends.precision_code("medium")


@pytest.mark.parametrize("precision,fp32", [("highest", "ieee"), ("tf32", "tf32")])
def test_cublas_precision_sets_and_restores_the_setting_on_cuda_only(precision, fp32):
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with _backends.cublas_precision(precision, torch.device("cpu")):
        assert matmul.fp32_precision == before  # CPU tensors: nothing changes
    with _backends.cublas_precision(precision, torch.device("cuda")):
        assert matmul.fp32_precision == fp32
    assert matmul.fp32_precision == before
    with pytest.raises(ValueError, match="precision must be one of"):
        with _backends.cublas_precision("fast", torch.device("cuda")):
            pass


def test_triton_input_precision():
    assert _backends.triton_input_precision("highest", torch.float32) == "ieee"
    assert _backends.triton_input_precision("tf32", torch.float32) == "tf32"
    assert _backends.triton_input_precision("highest", torch.float64) == "ieee"
    assert _backends.triton_input_precision("highest", torch.bfloat16) == "tf32"  # 16-bit: tensor cores


def test_info_is_json_and_reports_versions():
    info = rf.info()
    assert json.loads(json.dumps(info)) == info
    assert info["built"]["cpu"] is True and info["torch"] == torch.__version__
    assert info["cuda_device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)


def test_triton_kernels_live_inside_the_package(monkeypatch):
    """Our kernels are never installed as a top-level `triton_kernels` package. The checkout's own
    triton_kernels/ folder is importable from the working directory (python -m pytest puts it on
    sys.path) whatever the checkout is called, so only the installed locations are searched."""
    import importlib
    import importlib.util

    import repcap_fast.triton_kernels as tk

    assert os.path.dirname(tk.__file__).endswith("triton_kernels")
    assert tk.__name__ == "repcap_fast.triton_kernels"
    checkout = {os.path.realpath(p) for p in ("", os.getcwd(), os.path.dirname(os.path.dirname(__file__)))}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.realpath(p or ".") not in checkout])
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("triton_kernels")
    ours = spec is not None and spec.origin and os.path.exists(os.path.join(os.path.dirname(spec.origin),
                                                                             "subspace_pga.py"))
    assert not ours, f"a top-level triton_kernels package of ours is installed at {spec.origin}"


def test_cli_info(capsys):
    from repcap_fast.cli import main

    assert main(["info"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["built"]["cpu"] is True and out["limits"]["histogram_bins"] == 65536


@pytest.mark.gpu
def test_auto_on_gpu_prefers_the_cuda_kernels():
    assert resolve_backend("auto", torch.device("cuda"), "pairwise_cosine_stats") == \
        ("cuda" if rf.info()["built"]["cuda"] else "triton")


# --- renamed modules and functions keep working, with a deprecation warning -----------------------

@pytest.mark.parametrize("module,names", [
    ("repcap_fast.cosine_stats", ["pairwise_cosine_stats", "cosine_moments", "CosineStats",
                                  "pairwise_cosine_stats_sharded", "epsilon"]),
    ("repcap_fast.penalty", ["gram_offdiag_penalty", "gram_offdiag_rows", "rows_loss_and_grad", "check_p"]),
])
def test_old_modules_warn_and_keep_their_names(module, names):
    sys.modules.pop(module, None)
    with pytest.warns(DeprecationWarning, match=module):
        mod = importlib.import_module(module)
    for name in names:
        assert callable(getattr(mod, name)), name


def test_old_module_constants_keep_their_values():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from repcap_fast import cosine_stats, penalty
    assert cosine_stats.PRECISIONS == {"highest": 0, "tf32": 1}  # the codes of csrc/kernel_settings.h
    assert penalty.MAX_P == 1 << 30 and penalty.check_p(30.0) == 30
    with pytest.raises(ValueError, match="1073741824"):
        penalty.check_p((1 << 30) + 1)
    assert rf.packing.SWEEP_FORMAT == "repcap_fast.packing.sweep/5"  # /1 to /4 files are still read


@pytest.mark.parametrize("module,name,new", [
    ("repcap_fast.capacity", "FIT_FORMS", "repcap_fast.fitting"),
    ("repcap_fast.capacity", "FitResult", "repcap_fast.fitting"),
    ("repcap_fast.report", "plot_cosine_histograms", "repcap_fast.plotting"),
    ("repcap_fast.report", "plot_pga_profile", "repcap_fast.plotting"),
    ("repcap_fast.report", "plot_spectral", "repcap_fast.plotting"),
    ("repcap_fast.cli", "plot_loss", "repcap_fast.plotting"),
])
def test_moved_names_warn_and_are_the_new_objects(module, name, new):
    with pytest.warns(DeprecationWarning, match=f"use {new}.{name}"):
        old = getattr(importlib.import_module(module), name)
    assert old is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = importlib.import_module(module).not_a_name


def test_cli_plot_histogram_still_writes_the_plot(tmp_path):
    stats = rf.pairwise_cosine_stats(torch.randn(50, 6), bins=64, progress=False)
    with pytest.warns(DeprecationWarning, match="plot_cosine_histograms"):
        rf.cli.plot_histogram(stats, str(tmp_path / "h.png"), "old name")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_old_function_names_warn_and_give_the_same_values():
    X = torch.randn(30, 5, generator=torch.Generator().manual_seed(0))
    with pytest.warns(DeprecationWarning, match="gram_offdiag_row_stats"):
        old = rf.gram_offdiag_rows(X, 4)
    new = rf.gram_offdiag_row_stats(X, 4)
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from repcap_fast.penalty import rows_loss_and_grad
    loss, grad = rows_loss_and_grad(X, 0, 30, 4)
    assert float(loss) == pytest.approx(float(new[1].sum()), rel=1e-6) and grad.shape == (30, 5)
