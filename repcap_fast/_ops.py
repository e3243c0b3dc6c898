"""Loads repcap_fast._C, which registers torch.ops.repcap_fast.* (schemas in csrc/module.cpp), and
registers the ops' fake (meta) kernels, so torch.compile and torch.library.opcheck can trace
them. Without a built _C nothing is registered and the dispatch layer says how to build it."""

import importlib

import torch

try:
    _C = importlib.import_module("repcap_fast._C")
except ImportError:
    _C = None

if _C is not None:

    @torch.library.register_fake("repcap_fast::pairwise_cosine_stats")
    def _pairwise_cosine_stats_fake(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
        # Results are small host tensors whatever the input device.
        return (
            torch.empty(4, dtype=torch.float64, device="cpu"),
            torch.empty(3, dtype=torch.int64, device="cpu"),
            torch.empty(bins, dtype=torch.int64, device="cpu"),
        )

    @torch.library.register_fake("repcap_fast::gram_offdiag_penalty")
    def _gram_offdiag_penalty_fake(q, x, row_offset, p, with_grad, precision):
        m, d = q.shape
        return (
            q.new_empty(m),
            q.new_empty(m, dtype=torch.float64),
            q.new_empty((m, d)) if with_grad else q.new_empty(0),
        )

    @torch.library.register_fake("repcap_fast::subspace_pga_ranks")
    def _subspace_pga_ranks_fake(x):
        n = x.shape[0]
        return x.new_empty(n * (n - 1) // 2, dtype=torch.float64)

    @torch.library.register_fake("repcap_fast::subspace_pga_rhos")
    def _subspace_pga_rhos_fake(x, bases, ref_ranks):
        return x.new_empty(bases.shape[0], dtype=torch.float64)

    if hasattr(torch.ops.repcap_fast, "grassmann_normals"):  # absent from a _C built before the op

        @torch.library.register_fake("repcap_fast::grassmann_normals")
        def _grassmann_normals_fake(out, seed, first_basis):
            return None
