"""Backend discovery, selection and the ``info()`` report.

Backends: ``cuda`` (C++/CUDA in repcap_fast._C), ``triton``, ``cpu`` (C++/OpenMP in _C) and
``torch`` (the plain reference). ``backend="auto"`` picks the fastest built backend for the
tensor's device; the environment variable ``REPCAP_BACKEND`` forces one in place of "auto".
"""

from __future__ import annotations

import importlib
import os
import platform
import warnings
from typing import Optional

import torch

BACKENDS = ("cuda", "triton", "cpu", "torch")
BACKEND_ENV = "REPCAP_BACKEND"
OPS = ("pairwise_cosine_stats", "gram_offdiag_penalty", "subspace_pga")
# Ops that do not have every backend yet: the ones they have (every op has all four today).
OP_BACKENDS: dict = {}

_BUILD_HINT = (
    "Build it with `pip install --no-build-isolation -e .` from the repcap_fast checkout "
    "(torch must already be installed)."
)
_CUDA_BUILD_HINT = (
    "The CUDA kernels are built when nvcc and a CUDA-enabled torch are present at build time: "
    "`REPCAP_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e .`."
)


def _compiled():
    """The compiled module repcap_fast._C and None, or None and the import error."""
    try:
        return importlib.import_module("repcap_fast._C"), None
    except ImportError as exc:  # not built
        return None, str(exc)


def _triton():
    try:
        return importlib.import_module("triton"), None
    except ImportError as exc:
        return None, str(exc)


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def built() -> dict:
    module, _ = _compiled()
    info = module.build_info() if module is not None else {}
    return {
        "cpu": module is not None,
        "cuda": bool(info.get("cuda", False)),
        "triton": _triton()[0] is not None,
    }


def _unavailable_reason(backend: str, device: torch.device) -> Optional[str]:
    """None when `backend` can run on `device`, else why not and how to fix it."""
    if backend == "torch":
        return None
    if backend in ("cpu", "cuda"):
        module, err = _compiled()
        if module is None:
            return f"repcap_fast._C is not built ({err}). {_BUILD_HINT}"
        if backend == "cpu" and device.type != "cpu":
            return f"backend 'cpu' runs on CPU tensors, but the input is on {device}"
        if backend == "cuda":
            if not module.build_info().get("cuda", False):
                return f"repcap_fast._C was built without CUDA kernels. {_CUDA_BUILD_HINT}"
            if device.type != "cuda":
                return f"backend 'cuda' runs on CUDA tensors, but the input is on {device}"
        return None
    if backend == "triton":
        mod, err = _triton()
        if mod is None:
            return f"triton is not installed ({err}); `pip install triton`"
        if device.type == "cpu" and not triton_interpreting():
            return (
                "Triton kernels run on GPU tensors; on CPU tensors they need the interpreter "
                "(TRITON_INTERPRET=1, slow, for testing)"
            )
        if device.type not in ("cpu", "cuda"):
            return f"backend 'triton' does not support device {device}"
        return None
    raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")


def _auto_order(device: torch.device):
    if device.type == "cuda":
        return ("cuda", "triton", "torch")
    return ("cpu", "torch")  # the Triton interpreter is never picked automatically


_warned_missing_compiled = False


def _warn_missing_compiled(err: str) -> None:
    global _warned_missing_compiled
    if not _warned_missing_compiled:
        _warned_missing_compiled = True
        warnings.warn(
            f"repcap_fast._C could not be imported ({err}); backend='auto' falls back to the slow "
            f"float64 reference. {_BUILD_HINT}",
            RuntimeWarning,
            stacklevel=3,
        )


def resolve_backend(backend: Optional[str], device: torch.device, op: str = "", use_env: bool = True) -> str:
    """The backend that runs `op` for a tensor on `device`.

    Raises ValueError for an unknown name and RuntimeError, with how to fix it, for a backend
    that is not available.
    """
    requested = "auto" if backend is None else backend
    if not isinstance(requested, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    source = "backend"
    if use_env and requested == "auto" and os.environ.get(BACKEND_ENV):
        requested, source = os.environ[BACKEND_ENV].strip(), f"{BACKEND_ENV}"
    if requested != "auto" and requested not in BACKENDS:
        raise ValueError(f"{source} must be one of {('auto',) + BACKENDS}, got {requested!r}")
    allowed = OP_BACKENDS.get(op, BACKENDS)
    if requested != "auto" and requested not in allowed:
        if source == BACKEND_ENV:  # a global override this op cannot follow: its auto choice
            warnings.warn(f"{op} has no {requested!r} backend yet ({allowed}); {BACKEND_ENV} is "
                          "ignored for it", RuntimeWarning, stacklevel=3)
            requested = "auto"
        else:
            raise RuntimeError(f"{op}: {source}={requested!r} is not implemented yet for this op (it has {allowed})")
    if requested == "auto":
        for name in (n for n in _auto_order(device) if n in allowed):
            if _unavailable_reason(name, device) is None:
                return name
        module, err = _compiled()
        if module is None:
            _warn_missing_compiled(err)
        return "torch"
    reason = _unavailable_reason(requested, device)
    if reason is not None:
        prefix = f"{op}: " if op else ""
        raise RuntimeError(f"{prefix}{source}={requested!r} is not available: {reason}")
    return requested


def info() -> dict:
    """What was built (CPU, CUDA, Triton), versions, and the backend each op would use."""
    from . import __version__

    module, err = _compiled()
    build = module.build_info() if module is not None else {}
    triton_mod, _ = _triton()
    gpu = torch.device("cuda") if torch.cuda.is_available() else None
    # The automatic choice per device (for CUDA tensors it follows from the build alone, with or
    # without a device here); REPCAP_BACKEND, when set, is reported beside it.
    ops = {
        op: {
            "cpu": resolve_backend("auto", torch.device("cpu"), op, use_env=False),
            "cuda": resolve_backend("auto", torch.device("cuda"), op, use_env=False),
        }
        for op in OPS
    }
    return {
        "repcap_fast": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": getattr(triton_mod, "__version__", None),
        "built": built(),
        "compiled_module_error": err,
        "built_against_torch": build.get("torch_version"),
        "openmp": build.get("openmp"),
        "cuda_arch_list": build.get("cuda_arch_list") or None,
        "cuda_device": torch.cuda.get_device_name(0) if gpu is not None else None,
        "backend_env": os.environ.get(BACKEND_ENV),
        "triton_interpret": triton_interpreting(),
        "ops": ops,
    }
