"""The autograd of gram_offdiag_penalty (repcap_fast.ops.gram_offdiag_penalty).

The op torch.ops.repcap_fast.gram_offdiag_penalty returns (L, ∂L/∂X): the gradient is formed with
L by the same streaming kernel, and backward only scales it by the incoming gradient. The
formula registered on the op (``_penalty_setup_context``, ``_penalty_backward``) and the
autograd.Function that repeats it for torch.func.
"""

from __future__ import annotations

import torch


def _penalty_setup_context(ctx, inputs, output):
    """Saves ∂L/∂X (output[1]) and X, with X's dtype, p, normalize, the scale and whether ∂L/∂X was formed."""
    X, p, normalize, reduction = inputs[:4]
    ctx.x_dtype = X.dtype
    ctx.has_grad = inputs[6]
    ctx.p, ctx.normalize = p, normalize
    ctx.scale = 1.0 / (X.shape[0] * (X.shape[0] - 1)) if reduction == "mean" else 1.0
    ctx.save_for_backward(output[1], X)
    ctx.mark_non_differentiable(output[1])


def _penalty_backward(ctx, grad_loss, grad_of_grad):
    """∂L/∂X was formed with L: backward scales it by the incoming gradient.

    When a graph of the gradient is asked for (``create_graph=True``: grad mode is on here and X
    requires grad), the gradient's own derivative comes from ``_penalty_grad_graph``: the value
    stays the kernel's, and a second backward gives the Hessian-vector product.
    """
    if not ctx.has_grad:
        raise RuntimeError("gram_offdiag_penalty: the gradient was not computed (the loss was formed with "
                           "autograd disabled, or with_grad=False); call it again with grad enabled")
    grad, X = ctx.saved_tensors
    if torch.is_grad_enabled() and X.requires_grad and not torch.compiler.is_compiling():
        graph = _penalty_grad_graph(X, ctx.p, ctx.normalize, ctx.scale).to(grad.dtype)
        grad = grad + (graph - graph.detach())
    return (grad * grad_loss.to(grad.dtype)).to(ctx.x_dtype), None, None, None, None, None, None


_BLOCK_ELEMENTS = 1 << 21  # float64 elements of one row block of a k-wide Gram strip (16 MiB)


def _row_blocks(k: int):
    """Row ranges [r0, r1) of the blocks, each strip of rows × k under _BLOCK_ELEMENTS."""
    rows = max(1, _BLOCK_ELEMENTS // max(k, 1))
    return ((r0, min(r0 + rows, k)) for r0 in range(0, k, rows))


def _weights(x: torch.Tensor, r0: int, r1: int, p: int):
    """(ĝ, w, w') of the rows [r0, r1) against all k: ĝ = x_b xᵀ with the diagonal zeroed,
    w = sign(ĝ)|ĝ|^(p−1) and w' = dw/dĝ = (p−1)|ĝ|^(p−2), both 0 on the diagonal."""
    g = x[r0:r1] @ x.T
    diag = torch.arange(r1 - r0, device=x.device)
    g[diag, diag + r0] = 0.0
    a = g.abs()
    w = torch.sign(g) * a.pow(p - 1)
    dw = (p - 1) * a.pow(p - 2) if p >= 2 else torch.zeros_like(g)
    dw[diag, diag + r0] = 0.0
    return g, w, dw


class _PairGrad(torch.autograd.Function):
    """Y = ∂L/∂x = 2p Σ_{j≠i} sign(g_ij)|g_ij|^(p−1) x_j of L = Σ_{i≠j}|x_i·x_j|^p at the rows as given.

    Streamed in row blocks (O(block·k) memory, never k×k), and differentiable once more: its
    backward is the vector-Jacobian product 2p (W U + (W' ∘ (U xᵀ + x Uᵀ)) x) in the same blocks.
    """

    @staticmethod
    def forward(x, p):
        """Y, as the penalty kernels' gradient before the normalization's chain rule."""
        out = torch.empty_like(x)
        for r0, r1 in _row_blocks(x.shape[0]):
            _, w, _ = _weights(x, r0, r1, p)
            out[r0:r1] = (2.0 * p) * (w @ x)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Saves x and p."""
        ctx.save_for_backward(inputs[0])
        ctx.p = inputs[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, u):
        """∂⟨Y, u⟩/∂x (a third derivative of L is refused by once_differentiable)."""
        (x,) = ctx.saved_tensors
        p = ctx.p
        out = torch.empty_like(x)
        for r0, r1 in _row_blocks(x.shape[0]):
            _, w, dw = _weights(x, r0, r1, p)
            sym = u[r0:r1] @ x.T + x[r0:r1] @ u.T  # x_j·u_m + x_m·u_j
            out[r0:r1] = (2.0 * p) * (w @ u + (dw * sym) @ x)
        return out, None


def _penalty_grad_graph(X: torch.Tensor, p: int, normalize: bool, scale: float) -> torch.Tensor:
    """∂L/∂X in float64 as a differentiable function of X (the double-backward path).

    With normalize: x̂ = X/‖X‖, Y = ∂L/∂x̂ from _PairGrad, and ∂L/∂X_i = (Y_i − (Y_i·x̂_i) x̂_i)/‖X_i‖;
    autograd differentiates the normalization, _PairGrad the pair sum. Memory O(block·k + k·d).
    """
    x = X.to(torch.float64)
    if not normalize:
        return _PairGrad.apply(x, p) * scale
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    unit = x / norms
    y = _PairGrad.apply(unit, p)
    radial = (y * unit).sum(dim=1, keepdim=True)
    return (y - radial * unit) / norms * scale


class GramOffdiagPenaltyFunction(torch.autograd.Function):
    """L = Σ_{i≠j}|ĝ_ij|^p through the op torch.ops.repcap_fast.gram_offdiag_penalty.

    It repeats the op's registered autograd formula: the gradient is computed in the forward pass
    by the same streaming kernel when X requires grad (2 GEMM-equivalents in all, k×d extra
    memory), and only scaled by the incoming gradient in backward. This class (with
    setup_context) is what torch.func.grad needs: torch 2.13's generated autograd of custom ops
    does not support torch.func transforms (pytorch/pytorch#170834).
    """

    @staticmethod
    def forward(X, p, normalize, reduction, backend, precision, with_grad):
        """(L, ∂L/∂X or an empty tensor) from the op."""
        return torch.ops.repcap_fast.gram_offdiag_penalty(X, p, normalize, reduction, backend, precision, with_grad)

    setup_context = staticmethod(_penalty_setup_context)

    @staticmethod
    def backward(ctx, grad_loss, grad_of_grad):
        """∂L/∂X scaled by the incoming gradient (differentiable again under create_graph)."""
        return _penalty_backward(ctx, grad_loss, grad_of_grad)
