"""The autograd of gram_offdiag_penalty (repcap_fast.ops.gram_offdiag_penalty).

The op torch.ops.repcap_fast.gram_offdiag_penalty returns (L, ∂L/∂X): the gradient is formed with
L by the same streaming kernel, and backward only scales it by the incoming gradient. The
formula registered on the op (``_penalty_setup_context``, ``_penalty_backward``) and the
autograd.Function that repeats it for torch.func.
"""

from __future__ import annotations

import torch


def _penalty_setup_context(ctx, inputs, output):
    """Saves ∂L/∂X (output[1]), X's dtype and whether the gradient was formed."""
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
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, grad_of_grad):
        """∂L/∂X scaled by the incoming gradient."""
        return _penalty_backward(ctx, grad_loss, grad_of_grad)
