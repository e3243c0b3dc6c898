"""The argument checks of gram_offdiag_penalty that read no values (repcap_fast.ops.gram_offdiag_penalty).

The public functions run them while torch.compile traces: X's type, rank, dtype and shape, p,
the backend argument and a block's rows. The checks of X's values (NaN/Inf, zero rows) run inside
the ops, in gram_offdiag_penalty.py, beside their sync-free path for CUDA graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import _validation as val
from .._backends import kernel_limits


@dataclass(frozen=True)
class _Inputs:
    """The validated inputs of one call.

    X's rows in the compute dtype (row-normalized when normalize), their float64 norms (None
    without normalize), p and the backend.
    """

    x: torch.Tensor
    norms: Optional[torch.Tensor]
    p: int
    backend: str
    precision: str

    @property
    def normalized(self) -> bool:
        """Whether x holds the unit rows of X."""
        return self.norms is not None


def _check_x(X, min_rows: int = 2, allow_meta: bool = True) -> torch.Tensor:
    """X's type, layout, rank, dtype and shape: metadata only, so it also runs while torch.compile traces.

    A meta X is allowed where the op returns tensors (meta ones: shapes only, as any PyTorch op);
    the functions that return Python numbers refuse it (allow_meta=False).
    """
    if not isinstance(X, torch.Tensor):
        raise val.ArgumentTypeError(f"X must be a torch.Tensor (k x d, one vector per row), got {type(X).__name__}")
    val.check_dense(X, "X", allow_meta=allow_meta)
    if X.dim() != 2:
        raise ValueError(f"X must be 2-D (k vectors x d dimensions), got shape {tuple(X.shape)}")
    if X.dtype not in val.FLOAT_DTYPES:
        raise val.ArgumentTypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
    if X.shape[0] < min_rows:
        raise ValueError(f"X needs k >= {min_rows} rows (vectors), got k={X.shape[0]}")
    if X.shape[1] < 1:
        raise ValueError(f"X needs d >= 1 columns, got d={X.shape[1]}")
    return X


def check_penalty_p(p, backend: str) -> int:
    """The exponent p, an integer ≥ 1, at most the kernels' limit on a kernel backend."""
    return val.check_p(p, None if backend == "torch" else kernel_limits().penalty_p)


def _p_arg(p):
    """The exponent p as the ops' schema takes it (an int64, or a symbolic int).

    Its range (≥ 1, at most the backend's limit) is checked by the op when it runs, in eager and
    compiled code alike; an integer beyond int64, which the schema cannot carry, is refused here.
    """
    p = val.as_int(p, "p", integral_real=True)
    if isinstance(p, torch.SymInt) or -(2**63) <= p < 2**63:
        return p
    raise ValueError(f"p must be an integer >= 1 (at most the kernels' limit, info()['limits']['penalty_p']), got {p}")


def _backend_arg(backend) -> str:
    """The backend argument as the ops' schema takes it: a string ("auto" for None)."""
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise val.ArgumentTypeError(f"backend must be a string, got {type(backend).__name__}")
    return backend


def _check_block_rows(row_start, row_stop, k) -> None:
    """A ValueError unless 0 <= row_start < row_stop <= k."""
    if not 0 <= row_start < row_stop <= k:
        raise ValueError(f"rows must satisfy 0 <= row_start < row_stop <= k = {k}, got [{row_start}, {row_stop})")
