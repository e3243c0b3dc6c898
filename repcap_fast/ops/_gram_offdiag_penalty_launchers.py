"""The backend launchers of gram_offdiag_penalty (repcap_fast.ops.gram_offdiag_penalty).

``KERNELS["gram_offdiag_penalty"][backend]``: the C++/CUDA op for cpu and cuda, the Triton kernels
through their custom op, and the plain-PyTorch float64 reference. Every launcher takes
(q, x, row_offset, p, with_grad, precision) and returns (row_max, row_sum float64, grad_dir), as
csrc/module.cpp states. Importing this module registers them.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .._backends import cublas_precision, custom_op, precision_code, register_kernel, triton_kernels
from .._ops import gram_offdiag_penalty_rows_fake

Tensor = torch.Tensor


@register_kernel("gram_offdiag_penalty", "cpu", "cuda")
def _gram_offdiag_penalty_compiled(q, x, row_offset, p, with_grad, precision):
    """The C++ op (csrc/gram_offdiag_penalty_ops.cpp).

    It rounds the operands at `precision` (the CPU's emulation of the tensor cores), and its CUDA
    launcher forms the Gram panels and the weight products with cuBLAS (TF32 tensor cores for
    "tf32" and "bf16").
    """
    with cublas_precision(precision, x.device):
        return torch.ops.repcap_fast.gram_offdiag_penalty_rows(q, x, row_offset, p, with_grad,
                                                               precision_code(precision))


@register_kernel("gram_offdiag_penalty", "triton")
def _gram_offdiag_penalty_triton(q, x, row_offset, p, with_grad, precision):
    """The Triton kernels, through their custom op."""
    return torch.ops.repcap_fast.gram_offdiag_penalty_rows_triton(q, x, row_offset, p, with_grad, precision)


@custom_op("repcap_fast::gram_offdiag_penalty_rows_triton", mutates_args=())
def _gram_offdiag_penalty_rows_triton(q: Tensor, x: Tensor, row_offset: int, p: int, with_grad: bool,
                                      precision: str) -> Tuple[Tensor, Tensor, Tensor]:
    """The Triton kernels as a custom op.

    The contract of torch.ops.repcap_fast.gram_offdiag_penalty_rows (csrc/module.cpp), with
    precision by name.
    """
    return triton_kernels().gram_offdiag_penalty_triton(q, x, row_offset, p, with_grad, precision)


_gram_offdiag_penalty_rows_triton.register_fake(gram_offdiag_penalty_rows_fake)


@register_kernel("gram_offdiag_penalty", "torch")
def _gram_offdiag_penalty_torch(q, x, row_offset, p, with_grad, precision):
    """The same contract in plain PyTorch, in float64 whatever x's dtype (precision does not apply).

    The m×k Gram rows g = q xᵀ materialized, the diagonal entries g[r, row_offset + r] masked,
    r = |g|/m per row; row_max and grad_dir rounded to x's dtype.
    """
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
