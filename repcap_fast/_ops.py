"""The kernel layer's custom ops: loads repcap_fast._C, which registers the C++/CUDA ops
torch.ops.repcap_fast.{pairwise_cosine_stats, gram_offdiag_penalty_rows, subspace_pga_ranks,
subspace_pga_rhos, grassmann_normals} (schemas in csrc/module.cpp), and registers their fake (meta)
kernels, so torch.compile and torch.library.opcheck can trace them. The Triton launchers are
registered as custom ops of their own with the same contracts and these fakes
(``<op>_triton``, in each op's module). Without a built _C none of the C++ ops exists and the
dispatch layer says how to build it.

The public ops that users call from compiled code (``torch.ops.repcap_fast.gram_offdiag_penalty``
and its forms) are registered over these in repcap_fast/ops/gram_offdiag_penalty.py.
"""

import importlib

import torch

try:
    _C = importlib.import_module("repcap_fast._C")
except ImportError:
    _C = None


def pairwise_cosine_stats_fake(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    """Results are small host tensors whatever the input device: (moments float64[4], counts
    int64[3], hist int64[bins])."""
    return (
        torch.empty(4, dtype=torch.float64, device="cpu"),
        torch.empty(3, dtype=torch.int64, device="cpu"),
        torch.empty(bins, dtype=torch.int64, device="cpu"),
    )


def gram_offdiag_penalty_rows_fake(q, x, row_offset, p, with_grad, precision):
    """(row_max [m] x.dtype, row_sum float64 [m], grad_dir [m, d] or [0]) on x's device."""
    m, d = q.shape
    return (
        q.new_empty(m),
        q.new_empty(m, dtype=torch.float64),
        q.new_empty((m, d)) if with_grad else q.new_empty(0),
    )


def subspace_pga_ranks_fake(x, *precision):
    n = x.shape[0]
    return x.new_empty(n * (n - 1) // 2, dtype=torch.float64)


def subspace_pga_rhos_fake(x, bases, ref_ranks, *precision):
    return x.new_empty(bases.shape[0], dtype=torch.float64)


def grassmann_normals_fake(out, seed, first_basis):
    return None


if _C is not None:
    torch.library.register_fake("repcap_fast::pairwise_cosine_stats")(pairwise_cosine_stats_fake)
    torch.library.register_fake("repcap_fast::gram_offdiag_penalty_rows")(gram_offdiag_penalty_rows_fake)
    torch.library.register_fake("repcap_fast::subspace_pga_ranks")(subspace_pga_ranks_fake)
    torch.library.register_fake("repcap_fast::subspace_pga_rhos")(subspace_pga_rhos_fake)
    torch.library.register_fake("repcap_fast::grassmann_normals")(grassmann_normals_fake)
