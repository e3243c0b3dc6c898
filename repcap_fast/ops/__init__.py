"""The ops, one module each: its public function, its dispatch and its backend launchers.

The dispatch goes through the one table ``repcap_fast._backends.KERNELS``; a module's private
helpers (``_<op>_<concern>.py``: result classes, argument checks) sit beside it.

* ``pairwise_cosine_stats`` (and ``cosine_moments``, ``epsilon``): kernel 1;
  ``pairwise_cosine_stats_sharded``: the same op over row blocks held by different ranks.
* ``gram_offdiag_penalty`` (and ``gram_offdiag_penalty_block``, ``gram_offdiag_row_stats``,
  ``gram_offdiag_max``): kernel 3.
* ``subspace_pga``: kernel 2.
* ``grassmann_normals``: the counter-based normals behind subspace_pga's null subspaces.
"""

# The modules (not their functions, which share their names: repcap_fast.ops.subspace_pga is the
# module, repcap_fast.subspace_pga the function). Importing them registers their launchers.
from . import (  # noqa: F401
    gram_offdiag_penalty,
    grassmann_normals,
    pairwise_cosine_stats,
    pairwise_cosine_stats_sharded,
    subspace_pga,
)
