"""Input checks shared by the public functions. Every error names the argument."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NORM_CHUNK_BYTES = 4 << 20  # float64 working copy of a row chunk
# Kernels keep one int64 histogram per GPU block/program (or CPU thread): this bounds that memory.
MAX_BINS = 1 << 16


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in: float64 stays float64, every other float is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_matrix(x, name: str) -> torch.Tensor:
    """A 2-D floating tensor, non-empty; numpy arrays are converted (without a copy)."""
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"{name} must have a floating dtype, got numpy {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    x = x.detach()  # statistics of the values; nn.Parameter and tensors in a graph are fine
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows x d), got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}"
        )
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(x.shape)}")
    return x


def restrict_rows(x: torch.Tensor, n_rows: Optional[int], name: str, arg: str = "n_rows"):
    if n_rows is None:
        return x
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)):
        raise TypeError(f"{arg} must be an int, got {type(n_rows).__name__}")
    if not 1 <= int(n_rows) <= x.shape[0]:
        raise ValueError(f"{arg} must be in [1, {x.shape[0]}] ({name} has {x.shape[0]} rows), got {n_rows}")
    return x[: int(n_rows)]


def row_norms(x: torch.Tensor, name: str) -> torch.Tensor:
    """Float64 row norms, in row chunks (no float64 copy of all of x); raises on NaN/Inf in x."""
    rows = max(1, _NORM_CHUNK_BYTES // (8 * x.shape[1]))
    norms = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    for r0 in range(0, x.shape[0], rows):
        chunk = x[r0 : r0 + rows]
        if x.dtype != torch.float64:
            # Squares of float32/16-bit values neither overflow nor underflow in float64, and a
            # NaN/Inf value makes its row's norm non-finite.
            norms[r0 : r0 + rows] = torch.linalg.vector_norm(chunk, dim=1, dtype=torch.float64)
            continue
        # ‖x‖ = s·‖x/s‖ with s = max|x|: no overflow or underflow even for extreme float64 rows.
        scale = chunk.abs().amax(dim=1, keepdim=True)
        safe = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        norms[r0 : r0 + rows] = torch.linalg.vector_norm(chunk / safe, dim=1) * scale[:, 0]
    finite = torch.isfinite(norms)
    if not bool(finite.all()):
        n_bad = int((~torch.isfinite(x)).sum())
        first = int(torch.nonzero(~finite)[0])
        raise ValueError(f"{name} contains {n_bad} NaN/Inf values (first in row {first})")
    return norms


def drop_zero_rows(
    x: torch.Tensor, norms: torch.Tensor, zero_rows: str, name: str
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """Applies the zero_rows policy: "error" raises, "drop" removes them and counts them."""
    if zero_rows not in ("error", "drop"):
        raise ValueError(f"zero_rows must be 'error' or 'drop', got {zero_rows!r}")
    zero = norms == 0
    n_zero = int(zero.sum())
    if n_zero == 0:
        return x, norms, 0
    if zero_rows == "error":
        idx = torch.nonzero(zero).flatten()[:10].tolist()
        more = ", ..." if n_zero > 10 else ""
        raise ValueError(
            f"{name} has {n_zero} zero-norm rows (rows {idx}{more}); their cosine is undefined. "
            "Pass zero_rows='drop' to drop them (the count is reported)."
        )
    keep = ~zero
    return x[keep], norms[keep], n_zero


def check_pair(a: torch.Tensor, b: torch.Tensor, name_a: str = "A", name_b: str = "B"):
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{name_a} and {name_b} must have the same d: {name_a} is {tuple(a.shape)}, "
            f"{name_b} is {tuple(b.shape)}"
        )
    if a.device != b.device:
        raise ValueError(f"{name_a} is on {a.device} but {name_b} is on {b.device}; move them to one device")


def check_histogram(bins, value_range) -> Tuple[int, float, float]:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an int in [1, {MAX_BINS}], got {bins!r}")
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ValueError(f"range must be a pair (lo, hi), got {value_range!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"range must be finite with lo < hi, got {value_range!r}")
    return int(bins), lo, hi
