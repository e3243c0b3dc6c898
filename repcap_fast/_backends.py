"""The dispatch table ``KERNELS[op][backend]``, its one resolution rule, and ``info()``.

Backends: ``cuda`` (C++/CUDA in repcap_fast._C), ``triton`` (which reads the kernels' limits from _C
too), ``cpu`` (C++/OpenMP in _C) and ``torch`` (plain PyTorch in float64: the reference). Each op
module registers one launcher per backend with ``register_kernel``; every launcher of an op takes
the same arguments. ``backend="auto"`` picks, for the tensor's device, the first available backend
of ``AUTO_ORDER`` (GPU: cuda, then triton, as measured on the H200 in bench/results/; CPU: the C++
kernel; the Triton interpreter is never picked automatically). The environment variable
``REPCAP_BACKEND`` forces one in place of "auto".

Also here, because every op shares them: the kernels' limits and the ``precision`` setting (one
name and one meaning in every op), both read from the compiled module, and the cuBLAS float32
precision guard of the launchers that call cuBLAS.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import platform
import warnings
from typing import Callable, Dict, Iterator, NamedTuple, Optional, Tuple

import torch

from . import _validation as val
from ._version import __version__


class BackendUnavailableError(RuntimeError):
    """The backend asked for cannot run here (not built, Triton missing, no GPU): a setup
    problem the command line reports in one line, never a bug."""

BACKENDS = ("cuda", "triton", "cpu", "torch")
BACKEND_ENV = "REPCAP_BACKEND"
OPS = ("pairwise_cosine_stats", "gram_offdiag_penalty", "subspace_pga", "grassmann_normals")
AUTO_ORDER = {"cuda": ("cuda", "triton"), "cpu": ("cpu",)}  # then "torch", the reference, when none is built
# precision: how float32 dot products are formed, in every op. "highest": IEEE float32 products
# and sums; "tf32": float32 inputs rounded to TF32 on GPU tensor cores (10-bit mantissa). 16-bit
# inputs always use exact products with float32 sums, float64 inputs float64; the CPU has no TF32.
PRECISIONS = ("highest", "tf32")
# gram_offdiag_penalty (the packing optimizer's steps) also takes "bf16": float32 operands rounded
# to bfloat16 (7-bit mantissa), exact products, float32 sums. Its CPU kernel emulates "tf32" and
# "bf16" by rounding the GEMM operands (csrc/operand_rounding.h); see csrc/kernel_settings.h.
PENALTY_PRECISIONS = ("highest", "tf32", "bf16")

# KERNELS[op][backend] -> the backend launcher of op (filled by the op modules at import).
KERNELS: Dict[str, Dict[str, Callable]] = {op: {} for op in OPS}

_BUILD_HINT = (
    "Build it with `pip install --no-build-isolation -e .` from the repcap_fast checkout "
    "(torch must already be installed)."
)
_CUDA_BUILD_HINT = (
    "The CUDA kernels are built when nvcc and a CUDA-enabled torch are present at build time: "
    "`REPCAP_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e .`."
)


def eager_only(fn: Callable) -> Callable:
    """Decorator of the analysis ops' public functions (host results, progress bars, data checks
    that read values): inside torch.compile they run eagerly, as they are, and the graph breaks
    cleanly at the call instead of tracing into them. The penalty's ops, which training steps
    compile, are custom ops instead (repcap_fast/ops/gram_offdiag_penalty.py).

    The same as ``torch.compiler.disable(fn, recursive=True)``, built from the C primitives that
    it uses so that importing repcap_fast does not import torch._dynamo (1.8 s): the wrapper
    carries the attributes by which Dynamo refuses to inline a disabled function (a clean graph
    break at the call), its own frame is marked "skip" for Dynamo's frame evaluation, and it runs
    `fn` with the frame evaluation callback cleared, so nothing inside `fn` is traced. Where
    torch lacks those primitives, it falls back to ``torch.compiler.disable``.
    """
    if _frame_eval is None:
        return torch.compiler.disable(fn, recursive=True)
    set_eval_frame, current = _frame_eval.set_eval_frame, _frame_eval.get_eval_frame_callback

    @functools.wraps(fn)
    def eager(*args, **kwargs):
        if current() is None:  # no torch.compile around: nothing to turn off
            return fn(*args, **kwargs)
        prior = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)

    eager._torchdynamo_disable = True
    eager._torchdynamo_disable_msg = "repcap_fast analysis ops run eagerly"
    eager._torchdynamo_disable_recursive = True
    eager._torchdynamo_orig_callable = fn
    eager._torchdynamo_wrapper_id = id(eager)
    _frame_eval.set_code_exec_strategy(
        eager.__code__, _frame_eval._FrameExecStrategy(_frame_eval._FrameAction.SKIP, _frame_eval._FrameAction.DEFAULT))
    return eager


def custom_op(name: str, *, mutates_args) -> Callable[[Callable], Callable]:
    """``torch.library.custom_op(name, mutates_args=...)``, whose first call does not import torch._dynamo.

    torch wraps each implementation of a custom op in ``torch._disable_dynamo``, which imports
    torch._dynamo (1.8 s) at the op's first call and keeps ``torch._dynamo.disable(impl)`` on the
    implementation as ``__dynamo_disable``. Here that attribute is set in advance to ``eager_only``
    of it, the same thing built without the import; where torch's wrapper is not found as
    expected, the op is left as torch made it (its first call then imports torch._dynamo).
    """

    def define(fn: Callable) -> Callable:
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        if _frame_eval is not None:
            for impl in getattr(op, "_backend_fns", {}).values():
                inner = getattr(impl, "__wrapped__", None)
                if callable(inner) and not hasattr(inner, "__dynamo_disable"):
                    setattr(inner, "__dynamo_disable", eager_only(inner))
        return op

    return define


def _frame_eval_primitives():
    """torch._C._dynamo.eval_frame where it has what eager_only needs (torch >= 2.6), else None."""
    try:
        from torch._C._dynamo import eval_frame
    except ImportError:  # pragma: no cover - a torch without Dynamo's C part
        return None
    names = ("set_eval_frame", "get_eval_frame_callback", "set_code_exec_strategy", "_FrameExecStrategy",
             "_FrameAction")
    return eval_frame if all(hasattr(eval_frame, n) for n in names) else None


_frame_eval = _frame_eval_primitives()


def register_kernel(op: str, *backends: str):
    """Decorator: the launcher of `op` for each of `backends` in KERNELS."""
    if op not in KERNELS:
        raise KeyError(f"unknown op {op!r}; ops: {OPS}")

    def register(launcher: Callable) -> Callable:
        for backend in backends:
            if backend not in BACKENDS:
                raise KeyError(f"unknown backend {backend!r}; backends: {BACKENDS}")
            KERNELS[op][backend] = launcher
        return launcher

    return register


@functools.lru_cache(maxsize=None)
def _compiled():
    """The compiled module repcap_fast._C and None, or None and the import error."""
    try:
        return importlib.import_module("repcap_fast._C"), None
    except ImportError as exc:  # not built
        return None, str(exc)


@functools.lru_cache(maxsize=None)
def _triton():
    try:
        return importlib.import_module("triton"), None
    except ImportError as exc:
        return None, str(exc)


def triton_kernels():
    """The package repcap_fast.triton_kernels (importing it needs triton)."""
    module, err = _triton()
    if module is None:
        raise BackendUnavailableError(f"triton is not installed ({err}); `pip install triton`")
    return importlib.import_module("repcap_fast.triton_kernels")


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def build_info() -> dict:
    """repcap_fast._C.build_info() (read once: the module cannot change in a process), or {} when
    the compiled module is not built."""
    return dict(_compiled_build_info())


@functools.lru_cache(maxsize=None)
def _compiled_build_info() -> dict:
    module, _ = _compiled()
    return module.build_info() if module is not None else {}


class KernelLimits(NamedTuple):
    """Limits of the C++, CUDA and Triton kernels, defined once in csrc/kernel_settings.h."""

    histogram_bins: int  # pairwise_cosine_stats: bins per histogram
    pga_tokens: int  # subspace_pga, both ops: N (twice the ranks of the N(N−1)/2 pairs < 2^32)
    penalty_p: int  # gram_offdiag_penalty: the exponent p


def kernel_limits() -> KernelLimits:
    """The kernels' limits, as the compiled module exports them."""
    limits = build_info().get("limits")
    if limits is None:
        raise BackendUnavailableError(f"repcap_fast._C is not built ({_compiled()[1]}), so the kernels are not "
                                      f"available. {_BUILD_HINT}")
    return KernelLimits(**{field: int(limits[field]) for field in KernelLimits._fields})


def check_precision(precision, allowed: Tuple[str, ...] = PRECISIONS) -> str:
    """`precision` when it is one of `allowed` (PRECISIONS, or PENALTY_PRECISIONS for the penalty),
    else a ValueError naming the argument and the choices."""
    if precision not in allowed:
        extra = ("; 'bf16' is gram_offdiag_penalty's and the packing optimizer's only"
                 if precision == "bf16" and "bf16" not in allowed else "")
        raise ValueError(f"precision must be one of {allowed}, got {precision!r}{extra}")
    return precision


def precision_code(precision: str) -> int:
    """The integer the compiled ops take for `precision` (csrc/kernel_settings.h, exported by _C)."""
    codes = build_info().get("precisions")
    if codes is None:
        raise BackendUnavailableError(f"repcap_fast._C is not built ({_compiled()[1]}). {_BUILD_HINT}")
    return int(codes[check_precision(precision, PENALTY_PRECISIONS)])


@contextlib.contextmanager
def cublas_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Inside: float32 GEMMs that torch runs through cuBLAS on `device` use IEEE float32
    ("highest") or TF32 tensor cores ("tf32", and "bf16", whose operands the kernels have rounded
    to bfloat16 already: TF32 holds them exactly), whatever the process-wide setting; restored on
    exit. Nothing changes for CPU tensors. Uses torch's fp32_precision setting when this torch has
    it (2.9+; mixing it with the legacy setting makes torch.get_float32_matmul_precision() raise)."""
    check_precision(precision, PENALTY_PRECISIONS)
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        saved = matmul.fp32_precision
        matmul.fp32_precision = "ieee" if precision == "highest" else "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:  # older torch
        saved = matmul.allow_tf32
        matmul.allow_tf32 = precision == "tf32"
        try:
            yield
        finally:
            matmul.allow_tf32 = saved


def triton_input_precision(precision: str, dtype: torch.dtype) -> str:
    """tl.dot's input_precision for float32 operands at `precision` ("ieee" or "tf32"); 16-bit
    operands, and "bf16" (whose kernels cast the operands to bfloat16 first), get "tf32"
    (Triton's default, which does not apply to them), float64 operands "ieee"."""
    if dtype != torch.float32:
        return "tf32" if dtype in (torch.float16, torch.bfloat16) else "ieee"
    return "ieee" if check_precision(precision, PENALTY_PRECISIONS) == "highest" else "tf32"


def built() -> dict:
    return {"cpu": _compiled()[0] is not None, "cuda": bool(build_info().get("cuda", False)),
            "triton": _triton()[0] is not None}


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
            if not build_info().get("cuda", False):
                return f"repcap_fast._C was built without CUDA kernels. {_CUDA_BUILD_HINT}"
            if device.type != "cuda":
                return f"backend 'cuda' runs on CUDA tensors, but the input is on {device}"
        return None
    # triton
    module, err = _triton()
    if module is None:
        return f"triton is not installed ({err}); `pip install triton`"
    if _compiled()[0] is None:  # the Triton launchers read the kernels' limits from _C
        return f"the Triton kernels need repcap_fast._C (their limits), which is not built ({_compiled()[1]}). " \
               f"{_BUILD_HINT}"
    if device.type == "cpu" and not triton_interpreting():
        return ("Triton kernels run on GPU tensors; on CPU tensors they need the interpreter "
                "(TRITON_INTERPRET=1, slow, for testing)")
    if device.type not in ("cpu", "cuda"):
        return f"backend 'triton' does not support device {device}"
    return None


_warned_missing_compiled = False


def _warn_missing_compiled(err: str) -> None:
    global _warned_missing_compiled
    if not _warned_missing_compiled:
        _warned_missing_compiled = True
        warnings.warn(f"repcap_fast._C could not be imported ({err}); backend='auto' falls back to the slow "
                      f"float64 reference. {_BUILD_HINT}", RuntimeWarning, stacklevel=4)


def resolve_backend(backend: Optional[str], device: torch.device, op: str, use_env: bool = True) -> str:
    """The backend that runs `op` for a tensor on `device`: the one asked for (REPCAP_BACKEND
    stands in for "auto"), or for "auto" the first available one of AUTO_ORDER.

    Raises ValueError for an unknown name and RuntimeError, with how to fix it, for a backend
    that is not available here."""
    requested = "auto" if backend is None else backend
    if not isinstance(requested, str):
        raise val.ArgumentTypeError(f"backend must be a string, got {type(backend).__name__}")
    source = "backend"
    if use_env and requested == "auto" and os.environ.get(BACKEND_ENV):
        requested, source = os.environ[BACKEND_ENV].strip(), BACKEND_ENV
    if requested != "auto" and requested not in BACKENDS:
        raise ValueError(f"{source} must be one of {('auto',) + BACKENDS}, got {requested!r}")
    if requested == "auto":
        for name in AUTO_ORDER.get(device.type, ()):
            if name in KERNELS[op] and _unavailable_reason(name, device) is None:
                return name
        module, err = _compiled()
        if module is None:
            _warn_missing_compiled(err)
        return "torch"
    reason = _unavailable_reason(requested, device)
    if reason is not None:
        raise BackendUnavailableError(f"{op}: {source}={requested!r} is not available: {reason}")
    return requested


def launcher(op: str, backend: str) -> Callable:
    """The launcher of `op` for a backend that resolve_backend has already picked."""
    return KERNELS[op][backend]


def dispatch(op: str, backend: Optional[str], device: torch.device) -> Tuple[str, Callable]:
    """(the backend's name, its launcher) for `op` on `device` (see resolve_backend)."""
    name = resolve_backend(backend, device, op)
    return name, launcher(op, name)


def info() -> dict:
    """What was built (CPU, CUDA, Triton), the versions, the kernels' limits, and each op's backend.

    The backend each op would pick for CPU and for CUDA tensors (for CUDA tensors it follows from
    the build alone, with or without a GPU here); REPCAP_BACKEND, when set, is reported beside it.

    Returns:
        dict: ``repcap_fast``, ``python``, ``torch``, ``torch_cuda`` and ``triton`` (versions);
        ``built`` ({"cpu", "cuda", "triton"}: bool); ``compiled_module_error`` (why repcap_fast._C
        did not load, or None); ``built_against_torch``, ``openmp``, ``cuda_arch_list``;
        ``limits`` (the kernels' ``histogram_bins``, ``pga_tokens`` and ``penalty_p``, or None
        without the compiled module); ``cuda_device`` (GPU 0's name, or None); ``backend_env``
        (REPCAP_BACKEND); ``triton_interpret``; ``backends`` (op → the backends registered) and
        ``ops`` (op → {"cpu": backend, "cuda": backend} that "auto" picks).

    Examples:
        >>> info = rf.info()
        >>> sorted(info["built"])
        ['cpu', 'cuda', 'triton']
        >>> info["ops"]["pairwise_cosine_stats"]["cpu"] in ("cpu", "torch")
        True
    """
    module, err = _compiled()
    build = build_info()
    triton_mod, _ = _triton()
    ops = {op: {kind: resolve_backend("auto", torch.device(kind), op, use_env=False) for kind in ("cpu", "cuda")}
           for op in OPS}
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
        "limits": dict(build["limits"]) if "limits" in build else None,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "backend_env": os.environ.get(BACKEND_ENV),
        "triton_interpret": triton_interpreting(),
        "backends": {op: sorted(KERNELS[op]) for op in OPS},
        "ops": ops,
    }
