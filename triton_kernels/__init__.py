"""Triton kernels of repcap_fast, installed as ``repcap_fast.triton_kernels``.

Importing this package needs ``triton``. Under ``TRITON_INTERPRET=1`` the kernels run on the CPU
(numpy), which is how the tests check them on a machine without a GPU.
"""

from .gram_offdiag_penalty import gram_offdiag_penalty_triton
from .grassmann_normals import grassmann_normals_triton
from .pairwise_cosine_stats import fp32_pass as pairwise_cosine_stats_fp32_pass
from .pairwise_cosine_stats import pairwise_cosine_stats_triton
from .subspace_pga import subspace_pga_ranks_triton, subspace_pga_rhos_triton

__all__ = [
    "gram_offdiag_penalty_triton",
    "grassmann_normals_triton",
    "pairwise_cosine_stats_fp32_pass",
    "pairwise_cosine_stats_triton",
    "subspace_pga_ranks_triton",
    "subspace_pga_rhos_triton",
]
