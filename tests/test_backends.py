import json
import os

import pytest
import torch

import repcap_fast as rf
from repcap_fast._backends import resolve_backend


def test_info_reports_build_and_choices():
    info = rf.info()
    json.dumps(info)  # serializable
    assert info["built"]["cpu"] is True
    assert info["built"]["triton"] is True
    assert info["ops"]["pairwise_cosine_stats"]["cpu"] == "cpu"
    expected_gpu = "cuda" if info["built"]["cuda"] else ("triton" if info["built"]["triton"] else "torch")
    assert info["ops"]["pairwise_cosine_stats"]["cuda"] == expected_gpu
    assert info["cuda_device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    assert info["torch"] == torch.__version__


def test_auto_picks_cpp_on_cpu_and_never_the_interpreter():
    assert resolve_backend("auto", torch.device("cpu")) == "cpu"
    assert rf.pairwise_cosine_stats(torch.randn(5, 3)).backend == "cpu"


@pytest.mark.parametrize("forced", ["cpu", "cuda", "triton", "torch"])
def test_info_works_whatever_the_env_var(monkeypatch, forced):
    monkeypatch.setenv("REPCAP_BACKEND", forced)
    info = rf.info()
    assert info["backend_env"] == forced
    assert info["ops"]["pairwise_cosine_stats"]["cpu"] == "cpu"


def test_cli_json_with_forced_backend(monkeypatch, tmp_path):
    from repcap_fast.cli import main
    import numpy as np

    monkeypatch.setenv("REPCAP_BACKEND", "cpu")
    src = tmp_path / "x.npy"
    np.save(src, np.random.default_rng(1).standard_normal((50, 6)).astype(np.float32))
    assert main(["epsilon", str(src), "--json", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["provenance"]["backend"] == "cpu"


def test_env_var_forces_a_backend(monkeypatch):
    monkeypatch.setenv("REPCAP_BACKEND", "torch")
    assert rf.pairwise_cosine_stats(torch.randn(5, 3)).backend == "torch"
    # An explicit backend wins over the variable.
    assert rf.pairwise_cosine_stats(torch.randn(5, 3), backend="cpu").backend == "cpu"


def test_triton_kernels_live_inside_the_package():
    import repcap_fast.triton_kernels as tk

    assert os.path.dirname(tk.__file__).endswith("triton_kernels")
    assert tk.__name__ == "repcap_fast.triton_kernels"
    # Our kernels are never installed as a top-level `triton_kernels` package.
    import importlib.util

    spec = importlib.util.find_spec("triton_kernels")
    assert spec is None or "repcap" not in (spec.origin or "")


def test_cli_info(capsys):
    from repcap_fast.cli import main

    assert main(["info"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["built"]["cpu"] is True


@pytest.mark.gpu
def test_auto_on_gpu_prefers_cuda_kernels():
    name = resolve_backend("auto", torch.device("cuda"))
    assert name == ("cuda" if rf.info()["built"]["cuda"] else "triton")
