"""gram_offdiag_penalty: L = Σ_{i≠j} |ĝ_ij|^p and its fused gradient (Guha 2026, §1.3), never k×k.

Also ``gram_offdiag_penalty_block`` (a block of rows' part, for packing across ranks),
``gram_offdiag_log_penalty`` (ln L and its gradient), ``gram_offdiag_row_stats`` (per-row maxima
and sums) and ``gram_offdiag_max`` (ε*). The checks that read no values are in
``_gram_offdiag_penalty_args``, the autograd formula in ``_gram_offdiag_penalty_autograd``.

The kernels stream the Gram matrix in tiles with a running maximum m_i = max_{j≠i}|g_ij| per row
(online rescaling), so powers are only formed of ratios |g|/m_i ≤ 1; the factors m_i^p and
m_i^(p−1) are applied in float64 log space (docs/internals/gram-offdiag-penalty.md).

Layers: the public functions (metadata checks only, so they trace under torch.compile) → the
public custom ops torch.ops.repcap_fast.{gram_offdiag_penalty, gram_offdiag_penalty_block,
gram_offdiag_log_penalty, gram_offdiag_row_stats, gram_offdiag_max} (schema, fake kernel, and for
the penalty a registered autograd formula; their implementations check the data and run the rest)
→ ``_gram_offdiag_penalty`` (dispatch) → ``KERNELS["gram_offdiag_penalty"][backend]``
(``_gram_offdiag_penalty_compiled`` for cpu and cuda, ``_gram_offdiag_penalty_triton``,
``_gram_offdiag_penalty_torch``, in ``_gram_offdiag_penalty_launchers``) → the kernel-layer ops
(torch.ops.repcap_fast.gram_offdiag_penalty_rows from csrc/, gram_offdiag_penalty_rows_triton
around triton_kernels/) → the kernels. Every launcher takes (q, x, row_offset, p, with_grad,
precision): the rows q = x[row_offset: row_offset + m] against all k rows of x (the square
penalty: q = x, row_offset = 0), and returns (row_max [m] x.dtype, row_sum float64 [m], grad_dir
[m, d] or an empty tensor), as csrc/module.cpp states.

Inside a CUDA graph capture (torch.compile's mode="reduce-overhead") the ops read no value on the
host: the data checks become device-side asserts (torch._assert_async) and the gradient's per-row
factor is applied in float64 (within one float32 rounding of the eager gradient).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from .. import _validation as val
from .._backends import (
    PENALTY_PRECISIONS,
    check_precision,
    custom_op,
    launcher,
    resolve_backend,
)
from . import _gram_offdiag_penalty_launchers  # noqa: F401  registers the backend launchers
from ._compiled_errors import checked
from ._gram_offdiag_penalty_args import _backend_arg, _check_block_rows, _check_x, _Inputs, _p_arg, check_penalty_p
from ._gram_offdiag_penalty_autograd import GramOffdiagPenaltyFunction, _penalty_backward, _penalty_setup_context
from ._gram_offdiag_penalty_grad import _finish_grad, _log_pow, _row_losses
from .pairwise_cosine_stats import pairwise_cosine_stats

__all__ = [
    "gram_offdiag_log_penalty",
    "gram_offdiag_max",
    "gram_offdiag_penalty",
    "gram_offdiag_penalty_block",
    "gram_offdiag_row_stats",
]

Tensor = torch.Tensor

REDUCTIONS = ("sum", "mean")


# ------------------------------------------------------------------------------ validation


def _sync_free(x: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on x's device.

    Then no check may read a value on the host, and the data checks become device-side asserts
    (torch._assert_async).
    """
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_rows(X: torch.Tensor, normalize: bool) -> torch.Tensor:
    """X's float64 row norms; raises on NaN/Inf, and on zero rows when normalizing.

    Inside a CUDA graph capture the same conditions (and a norm beyond float64's range) are a
    device-side assert.
    """
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


def _check_inputs(X, p, normalize: bool, backend, precision) -> _Inputs:
    """Validates X (finite; nonzero rows when normalizing), p, normalize, backend and precision.

    And prepares the kernels' operand: x̂ (divided in float64, rounded once) or x, contiguous in
    the compute dtype (float64 for the torch backend, the reference).
    """
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
    """A ValueError unless the 0-d bool tensor ok is true.

    message: a string, or a function of nothing that forms it (called only on failure). Inside a
    CUDA graph capture, a device-side assert instead (its message formed without reading device
    values).
    """
    if _sync_free(ok):
        torch._assert_async(ok, message if isinstance(message, str) else "gram_offdiag_penalty: a value overflows")
    elif not bool(ok):
        raise ValueError(message if isinstance(message, str) else message())


# -------------------------------------------------------------------------------- dispatch


def _gram_offdiag_penalty(inputs: _Inputs, row_start: int, row_stop: int, with_grad: bool):
    """(row_max, row_sum float64, grad_dir) of the rows [row_start, row_stop) from the backend's launcher.

    Unit rows have |ĝ| ≤ 1: a row maximum above 1 is rounding (up to an ulp, more with TF32
    GEMMs) and is clamped, so m^p stays ≤ 1 for any p.
    """
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
    grad = (_finish_grad(grad_dir, row_max, x, inputs.norms, inputs.p, math.log(scale), _sync_free(x)) if with_grad
            else x.new_empty(0))
    out = loss.to(val.compute_dtype(X.dtype))
    _require(torch.isfinite(out), lambda: f"the penalty ({float(loss):.3g}) overflows {out.dtype}; pass float64 X or "
                                          "rescale it (normalize=True cannot overflow)")
    return out, grad


def _penalty_block(X, row_start, row_stop, p, backend, precision):
    """(the rows' part of L, float64; ∂L/∂x_i of those rows in X's compute dtype)."""
    inputs = _check_inputs(X, p, True, backend, precision)
    _check_block_rows(row_start, row_stop, inputs.x.shape[0])
    row_max, row_sum, grad_dir = _gram_offdiag_penalty(inputs, row_start, row_stop, True)
    loss = _row_losses(row_max, row_sum, inputs.p).sum()
    grad = _finish_grad(grad_dir, row_max, inputs.x[row_start:row_stop], inputs.norms[row_start:row_stop],
                        inputs.p, 0.0, _sync_free(inputs.x))
    return loss, grad.to(val.compute_dtype(X.dtype))


def _log_penalty(X, p, backend, precision):
    """(ln L, float64 0-d; ∂ln L/∂X in X's compute dtype)."""
    inputs = _check_inputs(X, p, True, backend, precision)
    k = inputs.x.shape[0]
    row_max, row_sum, grad_dir = _gram_offdiag_penalty(inputs, 0, k, True)
    log_rows = _log_pow(row_max, inputs.p) + torch.log(row_sum)
    log_rows = torch.where((row_sum > 0) & (row_max > 0), log_rows, torch.full_like(log_rows, -math.inf))
    log_loss = torch.logsumexp(log_rows, 0)
    if not math.isfinite(float(log_loss)):
        return log_loss, torch.zeros_like(inputs.x).to(val.compute_dtype(X.dtype))
    grad = _finish_grad(grad_dir, row_max, inputs.x, inputs.norms, inputs.p, -float(log_loss), _sync_free(inputs.x))
    return log_loss, grad.to(val.compute_dtype(X.dtype))


def _row_stats(X, p, normalize, backend, precision):
    """(m_i, L_i), both float64 [k]."""
    inputs = _check_inputs(X, p, normalize, backend, precision)
    row_max, row_sum, _ = _gram_offdiag_penalty(inputs, 0, inputs.x.shape[0], False)
    return row_max.to(torch.float64), _row_losses(row_max, row_sum, inputs.p)


def _max(X, normalize, backend, precision):
    """ε* = max_{i≠j} |ĝ_ij| as a float64 0-d CPU tensor."""
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


def _fake_dtype(X: torch.Tensor) -> torch.dtype:
    """The compute dtype of X for the fake kernels, which never raise.

    The ops' implementations refuse a bad X when they run, with the eager error, in compiled code
    as in eager mode.
    """
    return val.compute_dtype(X.dtype) if X.dtype in val.FLOAT_DTYPES else torch.float32


def _resolves_to_torch(backend, device) -> bool:
    """Whether `backend` runs on the torch backend (float64 results); False where it is refused."""
    try:
        return resolve_backend(backend, device, "gram_offdiag_penalty") == "torch"
    except (ValueError, TypeError, RuntimeError):
        return False


@custom_op("repcap_fast::gram_offdiag_penalty", mutates_args=())
def _gram_offdiag_penalty_op(X: Tensor, p: int, normalize: bool, reduction: str, backend: str, precision: str,
                             with_grad: bool) -> Tuple[Tensor, Tensor]:
    """(L, ∂L/∂X or an empty tensor without with_grad): the public op of gram_offdiag_penalty."""
    return _penalty(X, p, normalize, reduction, backend, precision, with_grad)


@_gram_offdiag_penalty_op.register_fake
def _(X, p, normalize, reduction, backend, precision, with_grad):
    """The shapes and dtypes of (L, ∂L/∂X)."""
    grad_dtype = torch.float64 if _resolves_to_torch(backend, X.device) else _fake_dtype(X)
    return (X.new_empty((), dtype=_fake_dtype(X)),
            X.new_empty(X.shape if with_grad else (0,), dtype=grad_dtype))


_gram_offdiag_penalty_op.register_autograd(_penalty_backward, setup_context=_penalty_setup_context)


@custom_op("repcap_fast::gram_offdiag_penalty_block", mutates_args=())
def _gram_offdiag_penalty_block_op(X: Tensor, row_start: int, row_stop: int, p: int, backend: str,
                                   precision: str) -> Tuple[Tensor, Tensor]:
    """(the rows' part of L, float64; ∂L/∂x_i of those rows): the public op of gram_offdiag_penalty_block.

    Not differentiable (it returns the gradient).
    """
    return _penalty_block(X, row_start, row_stop, p, backend, precision)


@_gram_offdiag_penalty_block_op.register_fake
def _(X, row_start, row_stop, p, backend, precision):
    """The shapes and dtypes of (the rows' part of L, their gradient)."""
    return (X.new_empty((), dtype=torch.float64),
            X.new_empty((max(row_stop - row_start, 0), X.shape[-1] if X.dim() else 0), dtype=_fake_dtype(X)))


@custom_op("repcap_fast::gram_offdiag_log_penalty", mutates_args=())
def _gram_offdiag_log_penalty_op(X: Tensor, p: int, backend: str, precision: str) -> Tuple[Tensor, Tensor]:
    """(ln L as a float64 0-d tensor, ∂ln L/∂X): the public op of gram_offdiag_log_penalty."""
    return _log_penalty(X, p, backend, precision)


@_gram_offdiag_log_penalty_op.register_fake
def _(X, p, backend, precision):
    """The shapes and dtypes of (ln L, ∂ln L/∂X)."""
    return X.new_empty((), dtype=torch.float64), X.new_empty(X.shape, dtype=_fake_dtype(X))


@custom_op("repcap_fast::gram_offdiag_row_stats", mutates_args=())
def _gram_offdiag_row_stats_op(X: Tensor, p: int, normalize: bool, backend: str,
                               precision: str) -> Tuple[Tensor, Tensor]:
    """(m_i, L_i), both float64 [k]: the public op of gram_offdiag_row_stats."""
    return _row_stats(X, p, normalize, backend, precision)


@_gram_offdiag_row_stats_op.register_fake
def _(X, p, normalize, backend, precision):
    """The shapes and dtypes of (m_i, L_i)."""
    rows = X.shape[0] if X.dim() else 0
    return X.new_empty(rows, dtype=torch.float64), X.new_empty(rows, dtype=torch.float64)


@custom_op("repcap_fast::gram_offdiag_max", mutates_args=())
def _gram_offdiag_max_op(X: Tensor, normalize: bool, backend: str, precision: str) -> Tensor:
    """ε* as a float64 0-d tensor on the CPU: the public op of gram_offdiag_max."""
    return _max(X, normalize, backend, precision)


@_gram_offdiag_max_op.register_fake
def _(X, normalize, backend, precision):
    """A float64 0-d CPU tensor (a meta one for a meta X, whose value cannot be read)."""
    return torch.empty((), dtype=torch.float64, device="meta" if X.is_meta else "cpu")


# ------------------------------------------------------------------------ public functions


def gram_offdiag_penalty(X: torch.Tensor, p: int = 8, normalize: bool = True, reduction: str = "sum",
                         backend: str = "auto", precision: str = "highest") -> torch.Tensor:
    r"""The penalty $L = \sum_{i \ne j} |\hat g_{ij}|^p$ over the Gram matrix of the k rows of X, differentiable.

    $\hat g_{ij} = \hat x_i \cdot \hat x_j$ of the row-normalized X ($x_i \cdot x_j$ with
    normalize=False), over the k(k−1) ordered pairs $i \ne j$, streamed: no k×k matrix (except on
    the torch backend), O(k·d) extra memory. ``L.backward()`` gives ∂L/∂X, including the chain rule
    through the row normalization; the gradient is formed with L by the same kernel. Deterministic
    on a given backend and machine. Twice differentiable: with ``create_graph=True`` the gradient
    has a graph whose backward is a Hessian-vector product, streamed in float64 row blocks (a third
    derivative raises). ``repcap_fast.reference.gram_offdiag_penalty_reference`` is the paper's
    formulation with autograd.

    Works inside ``torch.compile(fullgraph=True, dynamic=True)`` with no graph break: it is the op
    ``torch.ops.repcap_fast.gram_offdiag_penalty(X, p, normalize, reduction, backend, precision,
    with_grad)`` → (L, ∂L/∂X), with a registered fake kernel and autograd formula. Every bad
    argument, NaN/Inf rows and zero rows with normalize=True raise the same exception with the
    same message in compiled code as in eager mode; inside a CUDA graph
    (``mode="reduce-overhead"``) the value checks fail a device-side assert.

    Args:
        X: (k, d) tensor, one vector per row (the paper's code stores vectors as columns), any
            float dtype; k ≥ 2. 16-bit inputs are computed in float32.
        p: the exponent, an integer ≥ 1 (default 8; the paper uses p = min(int(m/ln d), 20)).
        normalize: ĝ from the row-normalized X (default True), else the raw Gram x_i·x_j.
        reduction: "sum" (default: Σ over the k(k−1) ordered pairs) or "mean" (divided by k(k−1)).
        backend: "auto" (default), "cuda", "triton", "cpu", or "torch" (plain PyTorch in float64
            on the materialized Gram rows, O(k²) memory).
        precision: how the float32 GEMMs are formed: "highest" (default, IEEE float32), "tf32"
            or "bf16" (operands rounded to TF32 or bfloat16, exact products, float32 sums: GPU
            tensor cores; the cpu backend emulates them, the torch backend ignores precision).
            float64 X always runs in float64.

    Returns:
        torch.Tensor: L, a 0-d tensor (float32, or float64 for float64 X), with a gradient when
        X requires grad.

    Raises:
        ValueError: X not 2-D, with fewer than 2 rows or no columns; NaN/Inf values; zero rows with
            normalize=True; p < 1 or above the kernels' limit (``info()["limits"]["penalty_p"]``);
            an unknown backend or precision; an invalid reduction; an L beyond the result's dtype
            (pass float64 X). Inside a CUDA graph capture the value checks are device-side asserts
            instead.
        TypeError: X not a float tensor, p not an integer, normalize not a bool, or backend not a
            string (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], requires_grad=True)
        >>> L = rf.gram_offdiag_penalty(X, p=2)  # 4 pairs with ĝ² = 1/2
        >>> round(L.item(), 4)
        2.0
        >>> L.backward()
        >>> X.grad.round(decimals=3)
        tensor([[0., 2.],
                [0., 0.],
                [2., 0.]])
    """
    def checks():
        x = _check_x(X)
        val.check_bool(normalize, "normalize")
        val.check_choice(reduction, "reduction", REDUCTIONS)
        check_precision(precision, PENALTY_PRECISIONS)
        return x, _p_arg(p), _backend_arg(backend)

    args, failed = checked(checks, lambda error: error)
    if failed is not None:
        return failed  # the graph raises the eager error when it runs (torch.compile)
    X, p_, backend_ = args
    with_grad = torch.is_grad_enabled() and X.requires_grad  # the gradient is formed with L, when wanted
    loss, _ = GramOffdiagPenaltyFunction.apply(X, p_, normalize, reduction, backend_, precision, with_grad)
    return loss


def gram_offdiag_penalty_block(X: torch.Tensor, row_start: int, row_stop: int, p: int, backend: str = "auto",
                               precision: str = "highest") -> Tuple[torch.Tensor, torch.Tensor]:
    r"""The part of the penalty of the rows [row_start, row_stop) of X, and its gradient on them.

    For the row-normalized X (all k rows): $\sum_{i \in \text{rows}} \sum_{j \ne i} |\hat g_{ij}|^p$,
    and $\partial L/\partial x_i$ of the full $L = \sum_{i \ne j} |\hat g_{ij}|^p$ for those rows, from
    the fused kernel run on those rows against all k.
    Summing the parts over a partition of the rows gives L: this is how ``packing.optimize``
    splits a step across ranks. It is the op ``torch.ops.repcap_fast.gram_offdiag_penalty_block``
    and traces with no graph break; it does not build an autograd graph.

    Args:
        X: (k, d) tensor, all k rows, any float dtype; k ≥ 2.
        row_start: the first row of the block, 0 ≤ row_start < row_stop.
        row_stop: one past the last row of the block, ≤ k.
        p: the exponent, an integer ≥ 1.
        backend: "auto" (default), "cuda", "triton", "cpu" or "torch".
        precision: "highest" (default), "tf32" or "bf16", as in ``gram_offdiag_penalty``.

    Returns:
        tuple: (the rows' part of L, a float64 0-d tensor; ∂L/∂x_i of those rows, (m, d) in X's
        compute dtype: float32, or float64 for float64 X).

    Raises:
        ValueError: X not 2-D, with fewer than 2 rows or no columns; NaN/Inf values; zero rows; p <
            1 or above the kernels' limit (``info()["limits"]["penalty_p"]``); an unknown backend or
            precision; rows not 0 ≤ row_start < row_stop ≤ k. Inside a CUDA graph capture the value
            checks are device-side asserts instead.
        TypeError: X not a float tensor, p not an integer (or row_start, row_stop), or backend not a
            string (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
        >>> part, grad = rf.gram_offdiag_penalty_block(X, 0, 2, p=2)
        >>> round(part.item(), 4), tuple(grad.shape)
        (1.5, (2, 2))
    """
    def checks():
        x = _check_x(X)
        p_ = _p_arg(p)
        check_precision(precision, PENALTY_PRECISIONS)
        rows = val.as_int(row_start, "row_start"), val.as_int(row_stop, "row_stop")  # numpy, torch ints
        _check_block_rows(*rows, x.shape[0])
        return x, rows, p_, _backend_arg(backend)

    args, failed = checked(checks, lambda error: (error.double(), error))
    if failed is not None:
        return failed  # the graph raises the eager error when it runs (torch.compile)
    X, (start, stop), p_, backend_ = args
    return torch.ops.repcap_fast.gram_offdiag_penalty_block(X.detach(), start, stop, p_, backend_, precision)


def gram_offdiag_log_penalty(X: torch.Tensor, p: int, backend: str = "auto",
                             precision: str = "highest") -> Tuple[float, torch.Tensor]:
    r"""The log of the penalty, ln L, and its gradient ∂ln L/∂X.

    For $L = \sum_{i \ne j} |\hat g_{ij}|^p$ of the row-normalized X, from one pass of the fused
    kernel, without autograd. The log is what large p needs: L and ∂L/∂X underflow float32, while
    $\ln L = \operatorname{logsumexp}_i(p \ln m_i + \ln s_i)$, with
    $m_i = \max_{j \ne i} |\hat g_{ij}|$ and $s_i = \sum_{j \ne i} (|\hat g_{ij}|/m_i)^p$, and its
    gradient stay finite. (1/p)·ln L is the log of the p-norm of the |ĝ_ij|, a smooth maximum that
    tends to ln max|ĝ| as p grows: the objective of the p-continuation packing methods. When every
    ĝ_ij is 0, ln L = −inf and the gradient is 0. The op
    ``torch.ops.repcap_fast.gram_offdiag_log_penalty`` returns ln L as a float64 0-d tensor.

    Args:
        X: (k, d) tensor, any float dtype; k ≥ 2.
        p: the exponent, an integer ≥ 1.
        backend: "auto" (default), "cuda", "triton", "cpu" or "torch".
        precision: "highest" (default), "tf32" or "bf16", as in ``gram_offdiag_penalty``.

    Returns:
        tuple: (ln L as a float; ∂ln L/∂X, (k, d) in X's compute dtype: float32 for 16-bit X).

    Raises:
        ValueError: X not 2-D, with fewer than 2 rows or no columns; NaN/Inf values; zero rows; p <
            1 or above the kernels' limit (``info()["limits"]["penalty_p"]``); an unknown backend or
            precision. Inside a CUDA graph capture the value checks are device-side asserts instead.
        TypeError: X not a float tensor, p not an integer, or backend not a string
            (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
        >>> log_L, grad = rf.gram_offdiag_log_penalty(X, p=2)
        >>> round(log_L, 4)  # ln 2
        0.6931
    """
    def checks():
        x = _check_x(X, allow_meta=False)  # a meta X has no ln L to return
        p_ = _p_arg(p)
        check_precision(precision, PENALTY_PRECISIONS)
        return x, p_, _backend_arg(backend)

    args, failed = checked(checks, lambda error: (float(error), error))
    if failed is not None:
        return failed  # the graph raises the eager error when it runs (torch.compile)
    X, p_, backend_ = args
    log_loss, grad = torch.ops.repcap_fast.gram_offdiag_log_penalty(X.detach(), p_, backend_, precision)
    return float(log_loss), grad


def gram_offdiag_row_stats(X: torch.Tensor, p: int = 8, normalize: bool = True, backend: str = "auto",
                           precision: str = "highest") -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Per row i of X, the largest off-diagonal |ĝ| and the row's part of the penalty, without gradient.

    $m_i = \max_{j \ne i} |\hat g_{ij}|$ and $L_i = \sum_{j \ne i} |\hat g_{ij}|^p$. $\sum_i L_i$ is
    the penalty L of ``gram_offdiag_penalty``. L_i is formed in float64 log space, so it keeps
    float64's range even where |ĝ|^p underflows float32. The op
    ``torch.ops.repcap_fast.gram_offdiag_row_stats``.

    Args:
        X: (k, d) tensor, any float dtype; k ≥ 2.
        p: the exponent, an integer ≥ 1 (default 8).
        normalize: ĝ from the row-normalized X (default True), else the raw Gram x_i·x_j.
        backend: "auto" (default), "cuda", "triton", "cpu" or "torch".
        precision: "highest" (default), "tf32" or "bf16", as in ``gram_offdiag_penalty``.

    Returns:
        tuple: (m, L_rows), two float64 tensors of k values each.

    Raises:
        ValueError: X not 2-D, with fewer than 2 rows or no columns; NaN/Inf values; zero rows with
            normalize=True; p < 1 or above the kernels' limit (``info()["limits"]["penalty_p"]``);
            an unknown backend or precision. Inside a CUDA graph capture the value checks are
            device-side asserts instead.
        TypeError: X not a float tensor, p not an integer, normalize not a bool, or backend not a
            string (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
        >>> m, L_rows = rf.gram_offdiag_row_stats(X, p=2)
        >>> m.round(decimals=4).tolist(), L_rows.round(decimals=4).tolist()
        ([0.7071, 0.7071, 0.7071], [0.5, 1.0, 0.5])
    """
    def checks():
        x = _check_x(X)
        p_ = _p_arg(p)
        val.check_bool(normalize, "normalize")
        check_precision(precision, PENALTY_PRECISIONS)
        return x, p_, _backend_arg(backend)

    args, failed = checked(checks, lambda error: (error.double(), error.double()))
    if failed is not None:
        return failed  # the graph raises the eager error when it runs (torch.compile)
    X, p_, backend_ = args
    return torch.ops.repcap_fast.gram_offdiag_row_stats(X.detach(), p_, normalize, backend_, precision)


def gram_offdiag_max(X: torch.Tensor, normalize: bool = True, backend: str = "auto",
                     precision: str = "highest") -> float:
    r"""The largest off-diagonal |entry| of X's Gram matrix, ε*, streamed (never k×k).

    $\varepsilon^* = \max_{i \ne j} |\hat g_{ij}|$. With normalize=True this is
    ``pairwise_cosine_stats`` over the pairs i<j (the largest |cosine| is max(|min|, |max|)); with
    normalize=False the row maxima of the penalty's kernel. The op
    ``torch.ops.repcap_fast.gram_offdiag_max`` returns ε* as a float64 0-d CPU tensor.

    Args:
        X: (k, d) tensor, any float dtype; k ≥ 2.
        normalize: ĝ from the row-normalized X (default True: cosines), else the raw Gram x_i·x_j.
        backend: "auto" (default), "cuda", "triton", "cpu" or "torch".
        precision: "highest" (default) or "tf32" ("bf16" is for the penalty's steps only).

    Returns:
        float: ε*.

    Raises:
        ValueError: X not 2-D, with fewer than 2 rows or no columns; NaN/Inf values; zero rows with
            normalize=True; an unknown backend or precision. Inside a CUDA graph capture the value
            checks are device-side asserts instead.
        TypeError: X not a float tensor, normalize not a bool, or backend not a string
            (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
        >>> round(rf.gram_offdiag_max(X), 4), rf.gram_offdiag_max(X, normalize=False)
        (0.7071, 1.0)
    """
    def checks():
        check_precision(precision)
        x = _check_x(X, allow_meta=False)  # a meta X has no ε* to return
        val.check_bool(normalize, "normalize")
        return x, _backend_arg(backend)

    args, failed = checked(checks, float)
    if failed is not None:
        return failed  # the graph raises the eager error when it runs (torch.compile)
    X, backend_ = args
    return float(torch.ops.repcap_fast.gram_offdiag_max(X.detach(), normalize, backend_, precision))
