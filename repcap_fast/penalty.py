"""The Gram off-diagonal penalty L = Σ_{i≠j} |ĝ_ij|^p and its fused gradient (Guha 2026, §1.3).

``gram_offdiag_penalty`` streams the Gram matrix of the rows of X in tiles, like streaming
attention, and never allocates k×k: per row block it loops over column blocks, forms the Gram
tile, applies the elementwise weight sign(g)(|g|/m_i)^(p−1) (diagonal masked; the factor
2p·m_i^(p−1) is applied per row afterwards) and accumulates weight × X_J. Each row keeps a
running maximum m_i = max_{j≠i}|g_ij| (online rescaling), so powers are only formed of ratios
|g|/m_i ≤ 1 and never overflow or underflow inside a tile:

    L = Σ_i m_i^p s_i,       s_i = Σ_{j≠i} (|g_ij|/m_i)^p                  (float64)
    ∂L/∂x̂_i = 2p m_i^(p−1) Σ_{j≠i} sign(g_ij)(|g_ij|/m_i)^(p−1) x̂_j
    ∂L/∂x_i = (I − x̂_i x̂_iᵀ) ∂L/∂x̂_i / ‖x_i‖                 (chain rule, normalize=True)

The factors m_i^p and m_i^(p−1) are applied in float64 log space. L itself is returned in
float32 (float64 for float64 X): it overflows to inf only when its true value exceeds that
range (possible with normalize=False, large rows and large p).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from . import _validation as val
from ._backends import resolve_backend

REDUCTIONS = ("sum", "mean")
MAX_P = 1 << 30


def check_p(p) -> int:
    """p as an int ≥ 1; floats must be finite and integral."""
    if isinstance(p, bool):
        raise TypeError("p must be an integer >= 1, got a bool")
    if isinstance(p, float):
        if not math.isfinite(p):
            raise ValueError(f"p must be finite, got {p}")
        if p != int(p):
            raise ValueError(f"p must be an integer >= 1 (|g|^p with p even or odd), got {p}")
        p = int(p)
    try:
        p = int(p)  # numpy/torch integers
    except (TypeError, ValueError):
        raise TypeError(f"p must be an integer >= 1, got {type(p).__name__}") from None
    if not 1 <= p <= MAX_P:
        raise ValueError(f"p must be an integer in [1, {MAX_P}], got {p}")
    return p


def _check_x(X, *, min_rows: int = 2) -> torch.Tensor:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor (k x d, one vector per row), got {type(X).__name__}")
    if X.dim() != 2:
        raise ValueError(f"X must be 2-D (k vectors x d dimensions), got shape {tuple(X.shape)}")
    if X.dtype not in val.FLOAT_DTYPES:
        raise TypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
    k, d = X.shape
    if k < min_rows:
        raise ValueError(f"X needs k >= {min_rows} rows (vectors), got k={k}")
    if d < 1:
        raise ValueError(f"X needs d >= 1 columns, got d={d}")
    return X


def _check_rows(X: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Float64 row norms; raises on NaN/Inf, and on zero rows when normalizing."""
    norms = val.row_norms(X.detach(), "X")  # names the first row with NaN/Inf
    if normalize:
        zero = norms == 0
        if bool(zero.any()):
            idx = torch.nonzero(zero).flatten()[:10].tolist()
            raise ValueError(
                f"X has {int(zero.sum())} zero rows (rows {idx}); normalize=True needs every row "
                "to be nonzero (its direction is undefined)"
            )
    return norms


def _prepare(X: torch.Tensor, normalize: bool):
    """(x̂, float64 row norms) or (x, None), contiguous in the compute dtype. x̂ is divided in
    float64 in row chunks and rounded once (tiny rows whose 1/‖x‖ overflows float32 are fine)."""
    norms = _check_rows(X, normalize)
    dtype = val.compute_dtype(X.dtype)
    x = X.detach()
    if not normalize:
        return x.to(dtype).contiguous(), None
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    rows = max(1, (4 << 20) // (8 * x.shape[1]))
    for r0 in range(0, x.shape[0], rows):
        chunk = x[r0 : r0 + rows].to(torch.float64)
        out[r0 : r0 + rows] = chunk / norms[r0 : r0 + rows, None]
    return out, norms


def _kernel(name: str, x: torch.Tensor, p: int, with_grad: bool, normalized: bool):
    """(row_max, row_sum float64, grad_dir) from the backend `name` (see
    csrc/gram_offdiag_penalty_ops.cpp). Rows of unit vectors have |ĝ| ≤ 1: a row maximum above 1
    is rounding (up to an ulp, more with TF32 GEMMs) and is clamped, so m^p stays ≤ 1 for any p."""
    if name in ("cpu", "cuda"):
        row_max, row_sum, grad_dir = torch.ops.repcap_fast.gram_offdiag_penalty(x, p, with_grad)
    elif name == "triton":
        from .triton_kernels import gram_offdiag_penalty_triton

        row_max, row_sum, grad_dir = gram_offdiag_penalty_triton(x, p, with_grad)
    else:
        raise AssertionError(name)
    if not (bool(torch.isfinite(row_sum).all()) and bool(torch.isfinite(row_max).all())):
        raise ValueError(
            f"X's Gram entries overflow {x.dtype} (|x_i·x_j| beyond its range); pass float64 X or "
            "rescale it (normalize=True cannot overflow)"
        )
    if normalized:
        row_max = row_max.clamp(max=1.0)
    return row_max, row_sum, grad_dir


def rows_loss_and_grad(X: torch.Tensor, row_start: int, row_stop: int, p: int, backend: str = "auto"):
    """For the rows [row_start, row_stop) of X (k×d, all rows): their part of the normalized
    penalty, Σ_{i in rows} Σ_{j≠i} |ĝ_ij|^p (a float64 0-d tensor), and ∂L/∂x_i of the full
    L = Σ_{i≠j}|ĝ_ij|^p for those rows (m×d, in the compute dtype), from the fused kernel run on
    those rows against all k. Summing the row parts over a partition of the rows gives L: this is
    how `packing.optimize` splits a step across ranks. Backends "cpu" and "cuda"."""
    X = _check_x(X)
    p = check_p(p)
    k = X.shape[0]
    if not (isinstance(row_start, int) and isinstance(row_stop, int) and 0 <= row_start < row_stop <= k):
        raise ValueError(f"rows must satisfy 0 <= row_start < row_stop <= k = {k}, got [{row_start}, {row_stop})")
    name = resolve_backend(backend, X.device, "gram_offdiag_penalty")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"rows_loss_and_grad runs on the cpu and cuda backends (the fused kernel on a row block), "
                         f"not {name!r}")
    x, norms = _prepare(X, True)
    q = x[row_start:row_stop]
    row_max, row_sum, grad_dir = torch.ops.repcap_fast.gram_offdiag_penalty_rows(q, x, row_start, p, True)
    if not (bool(torch.isfinite(row_sum).all()) and bool(torch.isfinite(row_max).all())):
        raise ValueError(f"X's Gram entries are not finite in {x.dtype}")
    row_max = row_max.clamp(max=1.0)
    loss = _row_losses(row_max, row_sum, p).sum()
    grad = _finish_grad(grad_dir, row_max, q, norms[row_start:row_stop], p, 1.0)
    return loss, grad


def _log_pow(m: torch.Tensor, e: int) -> torch.Tensor:
    """e·ln(m) in float64, -inf where m == 0 (so exp gives 0)."""
    return e * torch.log(m.to(torch.float64))


def _row_losses(row_max: torch.Tensor, row_sum: torch.Tensor, p: int) -> torch.Tensor:
    """L_i = m_i^p s_i in float64 (log space); rows with m_i = 0 (or s_i = 0) give 0."""
    terms = torch.exp(_log_pow(row_max, p) + torch.log(row_sum))
    return torch.where(row_sum > 0, terms, torch.zeros_like(terms))


def _finish_grad(grad_dir, row_max, x, norms, p: int, scale: float) -> torch.Tensor:
    """∂L/∂x in place of grad_dir: the chain rule (I − x̂x̂ᵀ) of the normalization (when norms is
    given) on the direction, then one per-row factor 2p·scale·m_i^(p−1)/‖x_i‖ formed in float64.
    O(k·d), no k×d temporaries (except float64 row chunks where the factor exceeds float32)."""
    if norms is not None:
        radial = torch.bmm(grad_dir.unsqueeze(1), x.unsqueeze(2)).reshape(-1)  # dir_i·x̂_i
        grad_dir.addcmul_(x, radial[:, None], value=-1.0)
    log_coef = _log_pow(row_max, p - 1) + math.log(2.0 * p * scale)
    if norms is not None:
        log_coef = log_coef - torch.log(norms)
    coef = torch.where(row_max > 0, torch.exp(log_coef), torch.zeros_like(log_coef))
    if grad_dir.dtype == torch.float64 or float(coef.max()) < 1e30:
        grad_dir.mul_(coef.to(grad_dir.dtype)[:, None])
    else:  # the factor alone overflows float32: multiply in float64, round each element once
        rows = max(1, (4 << 20) // (8 * grad_dir.shape[1]))
        for r0 in range(0, grad_dir.shape[0], rows):
            chunk = grad_dir[r0 : r0 + rows]
            chunk.copy_(chunk.to(torch.float64) * coef[r0 : r0 + rows, None])
    return grad_dir


class GramOffdiagPenaltyFunction(torch.autograd.Function):
    """L = Σ_{i≠j}|ĝ_ij|^p. The gradient is computed in the forward pass by the same streaming
    kernel when X requires grad (2 GEMM-equivalents in all, k×d extra memory), and only scaled
    by the incoming gradient in backward."""

    @staticmethod
    def forward(ctx, X, p, normalize, reduction, backend, with_grad):
        x, norms = _prepare(X, normalize)
        k = x.shape[0]
        with_grad = with_grad and bool(ctx.needs_input_grad[0])
        row_max, row_sum, grad_dir = _kernel(backend, x, p, with_grad, normalize)
        scale = 1.0 / (k * (k - 1)) if reduction == "mean" else 1.0
        loss = _row_losses(row_max, row_sum, p).sum() * scale
        if with_grad:
            grad = _finish_grad(grad_dir, row_max, x, norms, p, scale)
            del x, grad_dir
            ctx.save_for_backward(grad)
        ctx.x_dtype = X.dtype
        ctx.has_grad = with_grad
        return loss.to(val.compute_dtype(X.dtype))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if not ctx.has_grad:
            raise RuntimeError(
                "gram_offdiag_penalty: the gradient was not computed (the loss was formed with "
                "autograd disabled); call it again with grad enabled"
            )
        (grad,) = ctx.saved_tensors
        g = grad_loss.to(grad.dtype)
        out = grad if bool(g == 1) else grad * g
        return out.to(ctx.x_dtype), None, None, None, None, None


def gram_offdiag_penalty(
    X: torch.Tensor, p: int = 8, normalize: bool = True, reduction: str = "sum", backend: str = "auto"
) -> torch.Tensor:
    """L = Σ_{i≠j} |ĝ_ij|^p over the Gram matrix of the k rows of X, differentiable.

    Args:
        X: (k, d) tensor, one vector per row (the paper's code stores vectors as columns), any
            float dtype; k ≥ 2. 16-bit inputs are computed in float32.
        p: integer ≥ 1 (even or odd; the paper uses p = min(int(m/ln d), 20)).
        normalize: ĝ from the row-normalized X (default), else the raw Gram x_i·x_j.
        reduction: "sum" (Σ over the k(k−1) ordered pairs i≠j) or "mean" (divided by k(k−1)).
        backend: "auto", "cuda", "triton", "cpu", or "torch" (the materialized k×k Gram with
            autograd, in X's dtype: the baseline).

    Returns a 0-d tensor (float32, or float64 for float64 X). `L.backward()` gives ∂L/∂X,
    including the chain rule through the row normalization. Never allocates k×k (except the
    torch backend); extra memory O(k·d): the normalized X and the gradient. Deterministic on a
    given backend and machine. Not twice differentiable.
    """
    X = _check_x(X)
    p = check_p(p)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    name = resolve_backend(backend, X.device, "gram_offdiag_penalty")
    if name == "torch":
        _check_rows(X, normalize)  # the same errors as the kernels
        from .reference import gram_offdiag_penalty_reference

        return gram_offdiag_penalty_reference(X, p, normalize, reduction)
    # The gradient is formed in the forward pass, so only when autograd will want it.
    with_grad = torch.is_grad_enabled() and X.requires_grad
    return GramOffdiagPenaltyFunction.apply(X, p, normalize, reduction, name, with_grad)


def gram_offdiag_rows(
    X: torch.Tensor, p: int = 8, normalize: bool = True, backend: str = "auto"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-row (m_i = max_{j≠i}|ĝ_ij|, L_i = Σ_{j≠i}|ĝ_ij|^p), both float64, without gradient.

    L_i is formed from the kernel's scaled sums in log space, so it is exact to float64 range
    even where |ĝ|^p underflows float32."""
    X = _check_x(X)
    p = check_p(p)
    name = resolve_backend(backend, X.device, "gram_offdiag_penalty")
    if name == "torch":
        norms = _check_rows(X, normalize)
        x = X.detach().to(torch.float64)
        if normalize:
            x = x / norms[:, None]
        g = (x @ x.T).abs()
        g.fill_diagonal_(0.0)
        return g.amax(dim=1), g.pow(p).sum(dim=1)
    x, _ = _prepare(X, normalize)
    row_max, row_sum, _ = _kernel(name, x, p, False, normalize)
    return row_max.to(torch.float64), _row_losses(row_max, row_sum, p)


def gram_offdiag_max(X: torch.Tensor, normalize: bool = True, backend: str = "auto") -> float:
    """ε* = max_{i≠j} |ĝ_ij|, streamed (never k×k).

    With normalize=True this is kernel 1 (pairwise_cosine_stats over the pairs i<j: the largest
    |cosine| is max(|min|, |max|)); with normalize=False the row maxima of the penalty kernel."""
    X = _check_x(X)
    if normalize:
        _check_rows(X, True)
        from .cosine_stats import pairwise_cosine_stats

        stats = pairwise_cosine_stats(X.detach(), bins=1, backend=backend, progress=False)
        return max(abs(stats.min), abs(stats.max))
    row_max, _ = gram_offdiag_rows(X, p=1, normalize=False, backend=backend)
    return float(row_max.max())
