"""gram_offdiag_penalty: L = Σ_{i≠j} |ĝ_ij|^p and its fused gradient (Guha 2026, §1.3), never
materializing k×k; ``gram_offdiag_penalty_block`` (a block of rows' part, for packing across
ranks), ``gram_offdiag_row_stats`` (per-row maxima and sums) and ``gram_offdiag_max`` (ε*).

The kernels stream the Gram matrix in tiles, like streaming attention: per block of rows they loop
over column blocks, form the Gram tile, apply the elementwise weight sign(g)(|g|/m_i)^(p−1)
(diagonal masked; the factor 2p·m_i^(p−1) is applied per row afterwards) and accumulate
weight × X_J. Each row keeps a running maximum m_i = max_{j≠i}|g_ij| (online rescaling), so
powers are only formed of ratios |g|/m_i ≤ 1 and never overflow or underflow inside a tile:

    L = Σ_i m_i^p s_i,       s_i = Σ_{j≠i} (|g_ij|/m_i)^p                  (float64)
    ∂L/∂x̂_i = 2p m_i^(p−1) Σ_{j≠i} sign(g_ij)(|g_ij|/m_i)^(p−1) x̂_j
    ∂L/∂x_i = (I − x̂_i x̂_iᵀ) ∂L/∂x̂_i / ‖x_i‖                 (chain rule, normalize=True)

The factors m_i^p and m_i^(p−1) are applied in float64 log space.

Layers: the public functions (metadata checks only, so they trace under torch.compile) → the
public custom ops torch.ops.repcap_fast.{gram_offdiag_penalty, gram_offdiag_penalty_block,
gram_offdiag_log_penalty, gram_offdiag_row_stats, gram_offdiag_max} (schema, fake kernel, and for
the penalty a registered autograd formula; their implementations check the data and run the rest)
→ ``_gram_offdiag_penalty`` (dispatch) → ``KERNELS["gram_offdiag_penalty"][backend]``
(``_gram_offdiag_penalty_compiled`` for cpu and cuda, ``_gram_offdiag_penalty_triton``,
``_gram_offdiag_penalty_torch``) → the kernel-layer ops (torch.ops.repcap_fast.gram_offdiag_penalty_rows
from csrc/, gram_offdiag_penalty_rows_triton around triton_kernels/) → the kernels. Every launcher
takes (q, x, row_offset, p, with_grad, precision): the rows q = x[row_offset: row_offset + m]
against all k rows of x (the square penalty: q = x, row_offset = 0), and returns (row_max [m]
x.dtype, row_sum float64 [m], grad_dir [m, d] or an empty tensor), as csrc/module.cpp states.

Inside a CUDA graph capture (torch.compile's mode="reduce-overhead") the ops read no value on the
host: the data checks become device-side asserts (torch._assert_async) and the gradient's per-row
factor is applied in float64 (within one float32 rounding of the eager gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .. import _validation as val
from .._backends import (
    PENALTY_PRECISIONS,
    check_precision,
    cublas_precision,
    kernel_limits,
    launcher,
    precision_code,
    register_kernel,
    resolve_backend,
    triton_kernels,
)
from .._ops import gram_offdiag_penalty_rows_fake
from .pairwise_cosine_stats import pairwise_cosine_stats

Tensor = torch.Tensor

REDUCTIONS = ("sum", "mean")


# ------------------------------------------------------------------------------ validation


@dataclass(frozen=True)
class _Inputs:
    """X's rows in the compute dtype (row-normalized when normalize), their float64 norms (None
    without normalize), p and the backend."""

    x: torch.Tensor
    norms: Optional[torch.Tensor]
    p: int
    backend: str
    precision: str

    @property
    def normalized(self) -> bool:
        return self.norms is not None


def _check_x(X, min_rows: int = 2) -> torch.Tensor:
    """X's type, rank, dtype and shape: metadata only, so it also runs while torch.compile traces."""
    if not isinstance(X, torch.Tensor):
        raise val.ArgumentTypeError(f"X must be a torch.Tensor (k x d, one vector per row), got {type(X).__name__}")
    if X.dim() != 2:
        raise ValueError(f"X must be 2-D (k vectors x d dimensions), got shape {tuple(X.shape)}")
    if X.dtype not in val.FLOAT_DTYPES:
        raise val.ArgumentTypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
    if X.shape[0] < min_rows:
        raise ValueError(f"X needs k >= {min_rows} rows (vectors), got k={X.shape[0]}")
    if X.shape[1] < 1:
        raise ValueError(f"X needs d >= 1 columns, got d={X.shape[1]}")
    return X


def _sync_free(x: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on x's device: then no check may read a value on
    the host, and the data checks become device-side asserts (torch._assert_async)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_rows(X: torch.Tensor, normalize: bool) -> torch.Tensor:
    """X's float64 row norms; raises on NaN/Inf, and on zero rows when normalizing. Inside a CUDA
    graph capture the same conditions (and a norm beyond float64's range) are a device-side assert."""
    if _sync_free(X):
        norms = val.row_norms(X.detach(), "X", check=False)
        ok = torch.isfinite(norms).all()
        if normalize:
            ok = ok & (norms > 0).all()
        torch._assert_async(ok, "gram_offdiag_penalty: X has NaN/Inf values, a norm beyond float64's range, or "
                                "(with normalize=True) a zero row")
        return norms
    norms = val.row_norms(X.detach(), "X")  # names the first row with NaN/Inf
    if normalize:
        zero = norms == 0
        if bool(zero.any()):
            idx = torch.nonzero(zero).flatten()[:10].tolist()
            raise ValueError(f"X has {int(zero.sum())} zero rows (rows {idx}); normalize=True needs every row "
                             "to be nonzero (its direction is undefined)")
    return norms


def check_penalty_p(p, backend: str) -> int:
    """The exponent p, an integer ≥ 1, at most the kernels' limit on a kernel backend."""
    return val.check_p(p, None if backend == "torch" else kernel_limits().penalty_p)


def _check_inputs(X, p, normalize: bool, backend, precision) -> _Inputs:
    """Validates X (finite; nonzero rows when normalizing), p, normalize, backend and precision,
    and prepares the kernels' operand: x̂ (divided in float64, rounded once) or x, contiguous in
    the compute dtype (float64 for the torch backend, the reference)."""
    X = _check_x(X)
    val.check_bool(normalize, "normalize")
    check_precision(precision, PENALTY_PRECISIONS)
    name = resolve_backend(backend, X.device, "gram_offdiag_penalty")
    p = check_penalty_p(p, name)
    norms = _check_rows(X, normalize)
    dtype = torch.float64 if name == "torch" else val.compute_dtype(X.dtype)
    if normalize:
        return _Inputs(val.unit_rows(X.detach(), dtype, norms, "X", huge_rows=not _sync_free(X)), norms, p, name,
                       precision)
    return _Inputs(X.detach().to(dtype).contiguous(), None, p, name, precision)


def _require(ok: torch.Tensor, message) -> None:
    """A ValueError unless the 0-d bool tensor ok is true; message: a string, or a function of
    nothing that forms it (called only on failure). Inside a CUDA graph capture, a device-side
    assert instead (its message formed without reading device values)."""
    if _sync_free(ok):
        torch._assert_async(ok, message if isinstance(message, str) else "gram_offdiag_penalty: a value overflows")
    elif not bool(ok):
        raise ValueError(message if isinstance(message, str) else message())


def _p_arg(p, backend, device: torch.device):
    """p as the ops' schema takes it (an int64, or a symbolic int): its range against the backend's
    limit is checked by the op, except where the schema could not carry it."""
    p = val.as_int(p, "p", integral_real=True)
    if isinstance(p, torch.SymInt) or 1 <= p < 2**63:
        return p
    check_penalty_p(p, resolve_backend(backend, device, "gram_offdiag_penalty"))  # the op's own message
    raise ValueError(f"p must be an integer in [1, 2**63 - 1], got {p}")


def _backend_arg(backend) -> str:
    """The backend argument as the ops' schema takes it: a string ("auto" for None)."""
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise val.ArgumentTypeError(f"backend must be a string, got {type(backend).__name__}")
    return backend


# -------------------------------------------------------------------------------- dispatch


def _gram_offdiag_penalty(inputs: _Inputs, row_start: int, row_stop: int, with_grad: bool):
    """(row_max, row_sum float64, grad_dir) of the rows [row_start, row_stop) from the backend's
    launcher. Unit rows have |ĝ| ≤ 1: a row maximum above 1 is rounding (up to an ulp, more with
    TF32 GEMMs) and is clamped, so m^p stays ≤ 1 for any p."""
    x = inputs.x
    run = launcher("gram_offdiag_penalty", inputs.backend)
    q = x if (row_start, row_stop) == (0, x.shape[0]) else x[row_start:row_stop]
    row_max, row_sum, grad_dir = run(q, x, row_start, inputs.p, with_grad, inputs.precision)
    _require(torch.isfinite(row_sum).all() & torch.isfinite(row_max).all(),
             f"X's Gram entries overflow {x.dtype} (|x_i·x_j| beyond its range); pass float64 X or rescale it "
             "(normalize=True cannot overflow)")
    if inputs.normalized:
        row_max = row_max.clamp(max=1.0)
    return row_max, row_sum, grad_dir


def _log_pow(m: torch.Tensor, e: int) -> torch.Tensor:
    """e·ln(m) in float64, -inf where m == 0 (so exp gives 0)."""
    return e * torch.log(m.to(torch.float64))


def _row_losses(row_max: torch.Tensor, row_sum: torch.Tensor, p: int) -> torch.Tensor:
    """L_i = m_i^p s_i in float64 (log space); rows with m_i = 0 (or s_i = 0) give 0."""
    terms = torch.exp(_log_pow(row_max, p) + torch.log(row_sum))
    return torch.where(row_sum > 0, terms, torch.zeros_like(terms))


def _finish_grad(grad_dir, row_max, x, norms, p: int, log_scale: float) -> torch.Tensor:
    """∂L/∂x in place of grad_dir: the chain rule (I − x̂x̂ᵀ) of the normalization (when norms is
    given) on the direction, then one per-row factor 2p·e^log_scale·m_i^(p−1)/‖x_i‖ formed in
    float64 log space. O(k·d), no k×d temporaries (except float64 row chunks where the factor
    exceeds float32, and always inside a CUDA graph capture, where its size cannot be read)."""
    if norms is not None:
        radial = torch.bmm(grad_dir.unsqueeze(1), x.unsqueeze(2)).reshape(-1)  # dir_i·x̂_i
        grad_dir.addcmul_(x, radial[:, None], value=-1.0)
    log_coef = _log_pow(row_max, p - 1) + (math.log(2.0 * p) + log_scale)
    if norms is not None:
        log_coef = log_coef - torch.log(norms)
    coef = torch.where(row_max > 0, torch.exp(log_coef), torch.zeros_like(log_coef))
    if grad_dir.dtype == torch.float64 or (not _sync_free(grad_dir) and float(coef.max()) < 1e30):
        grad_dir.mul_(coef.to(grad_dir.dtype)[:, None])
    else:  # the factor alone overflows float32: multiply in float64, round each element once
        rows = max(1, (4 << 20) // (8 * grad_dir.shape[1]))
        for r0 in range(0, grad_dir.shape[0], rows):
            chunk = grad_dir[r0 : r0 + rows]
            chunk.copy_(chunk.to(torch.float64) * coef[r0 : r0 + rows, None])
    return grad_dir


# ------------------------------------------------- the ops' implementations (data checks here)


def _penalty(X, p, normalize, reduction, backend, precision, with_grad):
    """(L in X's compute dtype, ∂L/∂X in the launcher's dtype or an empty tensor)."""
    val.check_choice(reduction, "reduction", REDUCTIONS)
    inputs = _check_inputs(X, p, normalize, backend, precision)
    x = inputs.x
    k = x.shape[0]
    row_max, row_sum, grad_dir = _gram_offdiag_penalty(inputs, 0, k, with_grad)
    scale = 1.0 / (k * (k - 1)) if reduction == "mean" else 1.0
    loss = _row_losses(row_max, row_sum, inputs.p).sum() * scale
    grad = _finish_grad(grad_dir, row_max, x, inputs.norms, inputs.p, math.log(scale)) if with_grad else x.new_empty(0)
    out = loss.to(val.compute_dtype(X.dtype))
    _require(torch.isfinite(out), lambda: f"the penalty ({float(loss):.3g}) overflows {out.dtype}; pass float64 X or "
                                          "rescale it (normalize=True cannot overflow)")
    return out, grad


def _check_block_rows(row_start, row_stop, k) -> None:
    if not 0 <= row_start < row_stop <= k:
        raise ValueError(f"rows must satisfy 0 <= row_start < row_stop <= k = {k}, got [{row_start}, {row_stop})")


def _penalty_block(X, row_start, row_stop, p, backend, precision):
    inputs = _check_inputs(X, p, True, backend, precision)
    _check_block_rows(row_start, row_stop, inputs.x.shape[0])
    row_max, row_sum, grad_dir = _gram_offdiag_penalty(inputs, row_start, row_stop, True)
    loss = _row_losses(row_max, row_sum, inputs.p).sum()
    grad = _finish_grad(grad_dir, row_max, inputs.x[row_start:row_stop], inputs.norms[row_start:row_stop],
                        inputs.p, 0.0)
    return loss, grad.to(val.compute_dtype(X.dtype))


def _log_penalty(X, p, backend, precision):
    inputs = _check_inputs(X, p, True, backend, precision)
    k = inputs.x.shape[0]
    row_max, row_sum, grad_dir = _gram_offdiag_penalty(inputs, 0, k, True)
    log_rows = _log_pow(row_max, inputs.p) + torch.log(row_sum)
    log_rows = torch.where((row_sum > 0) & (row_max > 0), log_rows, torch.full_like(log_rows, -math.inf))
    log_loss = torch.logsumexp(log_rows, 0)
    if not math.isfinite(float(log_loss)):
        return log_loss, torch.zeros_like(inputs.x).to(val.compute_dtype(X.dtype))
    grad = _finish_grad(grad_dir, row_max, inputs.x, inputs.norms, inputs.p, -float(log_loss))
    return log_loss, grad.to(val.compute_dtype(X.dtype))


def _row_stats(X, p, normalize, backend, precision):
    inputs = _check_inputs(X, p, normalize, backend, precision)
    row_max, row_sum, _ = _gram_offdiag_penalty(inputs, 0, inputs.x.shape[0], False)
    return row_max.to(torch.float64), _row_losses(row_max, row_sum, inputs.p)


def _max(X, normalize, backend, precision):
    check_precision(precision)
    if normalize:
        _check_rows(_check_x(X), True)  # the penalty's errors (zero rows, ...)
        stats = pairwise_cosine_stats(X.detach(), bins=1, backend=backend, precision=precision, progress=False)
        return torch.tensor(max(abs(stats.min), abs(stats.max)), dtype=torch.float64)
    row_max, _ = _row_stats(X, 1, False, backend, precision)
    return row_max.max().cpu()


# ------------------------------------------- the public custom ops: torch.ops.repcap_fast.<name>
# Each public function validates what it can without reading X's values (so it traces under
# torch.compile with no graph break) and calls its op; the op's implementation checks the data
# (NaN/Inf and zero rows) when it runs, in eager and in compiled code alike, and raises the same
# ValueError (inside a CUDA graph capture: a device-side assert, see _sync_free).


@torch.library.custom_op("repcap_fast::gram_offdiag_penalty", mutates_args=())
def _gram_offdiag_penalty_op(X: Tensor, p: int, normalize: bool, reduction: str, backend: str, precision: str,
                             with_grad: bool) -> Tuple[Tensor, Tensor]:
    """(L, ∂L/∂X or an empty tensor without with_grad): the public op of gram_offdiag_penalty."""
    return _penalty(X, p, normalize, reduction, backend, precision, with_grad)


@_gram_offdiag_penalty_op.register_fake
def _(X, p, normalize, reduction, backend, precision, with_grad):
    _check_x(X)
    grad_dtype = (torch.float64 if resolve_backend(backend, X.device, "gram_offdiag_penalty") == "torch"
                  else val.compute_dtype(X.dtype))
    return (X.new_empty((), dtype=val.compute_dtype(X.dtype)),
            X.new_empty(X.shape if with_grad else (0,), dtype=grad_dtype))


def _penalty_setup_context(ctx, inputs, output):
    ctx.x_dtype = inputs[0].dtype
    ctx.has_grad = inputs[6]
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _penalty_backward(ctx, grad_loss, grad_of_grad):
    """∂L/∂X was formed with L: backward only scales it by the incoming gradient."""
    if not ctx.has_grad:
        raise RuntimeError("gram_offdiag_penalty: the gradient was not computed (the loss was formed with "
                           "autograd disabled, or with_grad=False); call it again with grad enabled")
    if torch.is_grad_enabled() and grad_loss.requires_grad:
        raise RuntimeError("gram_offdiag_penalty is not twice differentiable")
    (grad,) = ctx.saved_tensors
    return (grad * grad_loss.to(grad.dtype)).to(ctx.x_dtype), None, None, None, None, None, None


_gram_offdiag_penalty_op.register_autograd(_penalty_backward, setup_context=_penalty_setup_context)


class GramOffdiagPenaltyFunction(torch.autograd.Function):
    """L = Σ_{i≠j}|ĝ_ij|^p through the op torch.ops.repcap_fast.gram_offdiag_penalty, whose
    registered autograd formula this repeats: the gradient is computed in the forward pass by the
    same streaming kernel when X requires grad (2 GEMM-equivalents in all, k×d extra memory), and
    only scaled by the incoming gradient in backward. This class (with setup_context) is what
    torch.func.grad needs: torch 2.13's generated autograd of custom ops does not support torch.func
    transforms (pytorch/pytorch#170834)."""

    @staticmethod
    def forward(X, p, normalize, reduction, backend, precision, with_grad):
        return torch.ops.repcap_fast.gram_offdiag_penalty(X, p, normalize, reduction, backend, precision, with_grad)

    setup_context = staticmethod(_penalty_setup_context)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, grad_of_grad):
        return _penalty_backward(ctx, grad_loss, grad_of_grad)


@torch.library.custom_op("repcap_fast::gram_offdiag_penalty_block", mutates_args=())
def _gram_offdiag_penalty_block_op(X: Tensor, row_start: int, row_stop: int, p: int, backend: str,
                                   precision: str) -> Tuple[Tensor, Tensor]:
    """(the rows' part of L, float64; ∂L/∂x_i of those rows): the public op of
    gram_offdiag_penalty_block. Not differentiable (it returns the gradient)."""
    return _penalty_block(X, row_start, row_stop, p, backend, precision)


@_gram_offdiag_penalty_block_op.register_fake
def _(X, row_start, row_stop, p, backend, precision):
    _check_x(X)
    _check_block_rows(row_start, row_stop, X.shape[0])
    return (X.new_empty((), dtype=torch.float64),
            X.new_empty((row_stop - row_start, X.shape[1]), dtype=val.compute_dtype(X.dtype)))


@torch.library.custom_op("repcap_fast::gram_offdiag_log_penalty", mutates_args=())
def _gram_offdiag_log_penalty_op(X: Tensor, p: int, backend: str, precision: str) -> Tuple[Tensor, Tensor]:
    """(ln L as a float64 0-d tensor, ∂ln L/∂X): the public op of gram_offdiag_log_penalty."""
    return _log_penalty(X, p, backend, precision)


@_gram_offdiag_log_penalty_op.register_fake
def _(X, p, backend, precision):
    _check_x(X)
    return X.new_empty((), dtype=torch.float64), X.new_empty(X.shape, dtype=val.compute_dtype(X.dtype))


@torch.library.custom_op("repcap_fast::gram_offdiag_row_stats", mutates_args=())
def _gram_offdiag_row_stats_op(X: Tensor, p: int, normalize: bool, backend: str,
                               precision: str) -> Tuple[Tensor, Tensor]:
    """(m_i, L_i), both float64 [k]: the public op of gram_offdiag_row_stats."""
    return _row_stats(X, p, normalize, backend, precision)


@_gram_offdiag_row_stats_op.register_fake
def _(X, p, normalize, backend, precision):
    _check_x(X)
    return X.new_empty(X.shape[0], dtype=torch.float64), X.new_empty(X.shape[0], dtype=torch.float64)


@torch.library.custom_op("repcap_fast::gram_offdiag_max", mutates_args=())
def _gram_offdiag_max_op(X: Tensor, normalize: bool, backend: str, precision: str) -> Tensor:
    """ε* as a float64 0-d tensor on the CPU: the public op of gram_offdiag_max."""
    return _max(X, normalize, backend, precision)


@_gram_offdiag_max_op.register_fake
def _(X, normalize, backend, precision):
    _check_x(X)
    return torch.empty((), dtype=torch.float64, device="cpu")


# ------------------------------------------------------------------------ public functions


def gram_offdiag_penalty(X: torch.Tensor, p: int = 8, normalize: bool = True, reduction: str = "sum",
                         backend: str = "auto", precision: str = "highest") -> torch.Tensor:
    """L = Σ_{i≠j} |ĝ_ij|^p over the Gram matrix of the k rows of X, differentiable.

    Args:
        X: (k, d) tensor, one vector per row (the paper's code stores vectors as columns), any
            float dtype; k ≥ 2. 16-bit inputs are computed in float32.
        p: integer ≥ 1 (even or odd; the paper uses p = min(int(m/ln d), 20)).
        normalize: ĝ from the row-normalized X (default), else the raw Gram x_i·x_j.
        reduction: "sum" (Σ over the k(k−1) ordered pairs i≠j) or "mean" (divided by k(k−1)).
        backend: "auto", "cuda", "triton", "cpu", or "torch" (plain PyTorch in float64 on the
            materialized Gram rows, O(k²) memory).
        precision: how the float32 GEMMs (the Gram entries and the gradient's weight products)
            are formed: "highest" (IEEE float32), "tf32" or "bf16" (operands rounded to TF32 or
            bfloat16, exact products, float32 sums: GPU tensor cores; the cpu backend emulates
            them by rounding the operands, the torch backend ignores precision). float64 X always
            runs in float64.

    Returns a 0-d tensor (float32, or float64 for float64 X); an L beyond that range is a ValueError
    that says to pass float64 X (never inf). `L.backward()` gives ∂L/∂X, including the chain rule
    through the row normalization. Never allocates k×k (except the torch backend); extra memory
    O(k·d): the normalized X and the gradient. Deterministic on a given backend and machine. Not
    twice differentiable. The paper's formulation with autograd is
    ``repcap_fast.reference.gram_offdiag_penalty_reference``.

    Works inside ``torch.compile(fullgraph=True, dynamic=True)`` with no graph break: it is the op
    ``torch.ops.repcap_fast.gram_offdiag_penalty(X, p, normalize, reduction, backend, precision,
    with_grad)`` → (L, ∂L/∂X), with a registered fake kernel and autograd formula. NaN/Inf rows
    (and zero rows with normalize=True) raise the same ValueError in compiled code as in eager
    mode; inside a CUDA graph (``mode="reduce-overhead"``) they fail a device-side assert.

    Example:
        >>> X = torch.randn(1000, 64, requires_grad=True)
        >>> gram_offdiag_penalty(X, p=8).backward()
    """
    X = _check_x(X)
    p = _p_arg(p, backend, X.device)
    val.check_bool(normalize, "normalize")
    val.check_choice(reduction, "reduction", REDUCTIONS)
    check_precision(precision, PENALTY_PRECISIONS)
    with_grad = torch.is_grad_enabled() and X.requires_grad  # the gradient is formed with L, when wanted
    loss, _ = GramOffdiagPenaltyFunction.apply(X, p, normalize, reduction, _backend_arg(backend), precision,
                                               with_grad)
    return loss


def gram_offdiag_penalty_block(X: torch.Tensor, row_start: int, row_stop: int, p: int, backend: str = "auto",
                               precision: str = "highest") -> Tuple[torch.Tensor, torch.Tensor]:
    """For the rows [row_start, row_stop) of X (k×d, all rows), normalized: their part of the
    penalty, Σ_{i in rows} Σ_{j≠i} |ĝ_ij|^p (a float64 0-d tensor), and ∂L/∂x_i of the full
    L = Σ_{i≠j}|ĝ_ij|^p for those rows (m×d, in the compute dtype), from the fused kernel run on
    those rows against all k. Summing the parts over a partition of the rows gives L: this is how
    `packing.optimize` splits a step across ranks. The op
    ``torch.ops.repcap_fast.gram_offdiag_penalty_block``; traces with no graph break."""
    X = _check_x(X)
    p = _p_arg(p, backend, X.device)
    check_precision(precision, PENALTY_PRECISIONS)
    row_start, row_stop = val.as_int(row_start, "row_start"), val.as_int(row_stop, "row_stop")  # numpy, torch ints
    return torch.ops.repcap_fast.gram_offdiag_penalty_block(X.detach(), row_start, row_stop, p, _backend_arg(backend),
                                                            precision)


def gram_offdiag_log_penalty(X: torch.Tensor, p: int, backend: str = "auto",
                             precision: str = "highest") -> Tuple[float, torch.Tensor]:
    """(ln L, ∂ln L/∂X) for L = Σ_{i≠j}|ĝ_ij|^p of the row-normalized X, from one pass of the fused
    kernel, without autograd.

    The log is what large p needs: L and ∂L/∂X underflow (float32 at |ĝ| = 0.2 and p = 64 already),
    while ∂ln L/∂x̂_i = 2p·m_i^(p−1)·acc_i / L has per-row factors formed in float64 log space
    (ln L = logsumexp_i(p·ln m_i + ln s_i)), bounded by about p/m_i. (1/p)·ln L is the log of the
    p-norm of the |ĝ_ij|, a smooth maximum of them that tends to ln max|ĝ| as p grows: the objective
    of the p-continuation packing methods. When every ĝ_ij is 0, ln L = −inf and the gradient is 0.
    The gradient has X's compute dtype (float32 for 16-bit X). The op
    ``torch.ops.repcap_fast.gram_offdiag_log_penalty`` returns ln L as a float64 0-d tensor."""
    X = _check_x(X)
    p = _p_arg(p, backend, X.device)
    check_precision(precision, PENALTY_PRECISIONS)
    log_loss, grad = torch.ops.repcap_fast.gram_offdiag_log_penalty(X.detach(), p, _backend_arg(backend), precision)
    return float(log_loss), grad


def gram_offdiag_row_stats(X: torch.Tensor, p: int = 8, normalize: bool = True, backend: str = "auto",
                           precision: str = "highest") -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row: (m_i = max_{j≠i}|ĝ_ij|, L_i = Σ_{j≠i}|ĝ_ij|^p), both float64, without gradient.

    L_i is formed from the kernel's scaled sums in log space, so it is exact to float64 range
    even where |ĝ|^p underflows float32. The op ``torch.ops.repcap_fast.gram_offdiag_row_stats``."""
    X = _check_x(X)
    p = _p_arg(p, backend, X.device)
    val.check_bool(normalize, "normalize")
    check_precision(precision, PENALTY_PRECISIONS)
    return torch.ops.repcap_fast.gram_offdiag_row_stats(X.detach(), p, normalize, _backend_arg(backend), precision)


def gram_offdiag_max(X: torch.Tensor, normalize: bool = True, backend: str = "auto",
                     precision: str = "highest") -> float:
    """ε* = max_{i≠j} |ĝ_ij|, streamed (never k×k).

    With normalize=True this is kernel 1 (pairwise_cosine_stats over the pairs i<j: the largest
    |cosine| is max(|min|, |max|)); with normalize=False the row maxima of the penalty kernel.
    precision: "highest" or "tf32" (a measurement; "bf16" is for the penalty's steps only). The
    op ``torch.ops.repcap_fast.gram_offdiag_max`` returns ε* as a float64 0-d CPU tensor."""
    check_precision(precision)
    X = _check_x(X)
    val.check_bool(normalize, "normalize")
    return float(torch.ops.repcap_fast.gram_offdiag_max(X.detach(), normalize, _backend_arg(backend), precision))


# ------------------------------------------------------------------------------- launchers


@register_kernel("gram_offdiag_penalty", "cpu", "cuda")
def _gram_offdiag_penalty_compiled(q, x, row_offset, p, with_grad, precision):
    """The C++ op (csrc/gram_offdiag_penalty_ops.cpp): it rounds the operands at `precision` (the
    CPU's emulation of the tensor cores), and its CUDA launcher forms the Gram panels and the
    weight products with cuBLAS (TF32 tensor cores for "tf32" and "bf16")."""
    with cublas_precision(precision, x.device):
        return torch.ops.repcap_fast.gram_offdiag_penalty_rows(q, x, row_offset, p, with_grad,
                                                               precision_code(precision))


@register_kernel("gram_offdiag_penalty", "triton")
def _gram_offdiag_penalty_triton(q, x, row_offset, p, with_grad, precision):
    return torch.ops.repcap_fast.gram_offdiag_penalty_rows_triton(q, x, row_offset, p, with_grad, precision)


@torch.library.custom_op("repcap_fast::gram_offdiag_penalty_rows_triton", mutates_args=())
def _gram_offdiag_penalty_rows_triton(q: Tensor, x: Tensor, row_offset: int, p: int, with_grad: bool,
                                      precision: str) -> Tuple[Tensor, Tensor, Tensor]:
    """The Triton kernels as a custom op: the contract of torch.ops.repcap_fast.gram_offdiag_penalty_rows
    (csrc/module.cpp), with precision by name."""
    return triton_kernels().gram_offdiag_penalty_triton(q, x, row_offset, p, with_grad, precision)


_gram_offdiag_penalty_rows_triton.register_fake(gram_offdiag_penalty_rows_fake)


@register_kernel("gram_offdiag_penalty", "torch")
def _gram_offdiag_penalty_torch(q, x, row_offset, p, with_grad, precision):
    """The same contract in plain PyTorch, in float64 whatever x's dtype (precision does not
    apply): the m×k Gram rows g = q xᵀ materialized, the diagonal entries g[r, row_offset + r]
    masked, r = |g|/m per row; row_max and grad_dir rounded to x's dtype."""
    q64, x64 = q.to(torch.float64), x.to(torch.float64)
    g = q64 @ x64.T
    rows = torch.arange(q.shape[0], device=x.device)
    g[rows, row_offset + rows] = 0.0
    a = g.abs()
    row_max = a.amax(dim=1)
    ratio = a / torch.where(row_max > 0, row_max, torch.ones_like(row_max))[:, None]
    row_sum = ratio.pow(p).sum(dim=1)
    grad_dir = (torch.sign(g) * ratio.pow(p - 1)) @ x64 if with_grad else None
    return (row_max.to(x.dtype), row_sum,
            grad_dir.to(x.dtype) if with_grad else x.new_empty(0))
