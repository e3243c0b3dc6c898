"""Loads repcap_fast._C (which registers torch.ops.repcap_fast.*) and the ops' fake kernels."""

import torch

try:
    from . import _C  # noqa: F401  registers the ops with the dispatcher
except ImportError:  # not built: the dispatch layer reports how to build it
    _C = None

if _C is not None:

    @torch.library.register_fake("repcap_fast::pairwise_cosine_stats")
    def _pairwise_cosine_stats_fake(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, math_mode):
        # Results are small host tensors whatever the input device.
        return (
            torch.empty(4, dtype=torch.float64, device="cpu"),
            torch.empty(3, dtype=torch.int64, device="cpu"),
            torch.empty(bins, dtype=torch.int64, device="cpu"),
        )

    @torch.library.register_fake("repcap_fast::gram_offdiag_penalty")
    def _gram_offdiag_penalty_fake(x, p, with_grad):
        k, d = x.shape
        return (
            x.new_empty(k),
            x.new_empty(k, dtype=torch.float64),
            x.new_empty((k, d)) if with_grad else x.new_empty(0),
        )

    @torch.library.register_fake("repcap_fast::gram_offdiag_penalty_rows")
    def _gram_offdiag_penalty_rows_fake(q, x, row_offset, p, with_grad):
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
