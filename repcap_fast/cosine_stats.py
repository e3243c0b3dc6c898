"""Deprecated alias of ``repcap_fast.ops.pairwise_cosine_stats``, removed in the next release.

The module of kernel 1 is now ``repcap_fast.ops.pairwise_cosine_stats`` (and
``repcap_fast.ops.pairwise_cosine_stats_sharded``); the functions are also at the top level
(``repcap_fast.pairwise_cosine_stats``).
"""

import warnings

from . import _backends
from .ops.pairwise_cosine_stats import (  # noqa: F401
    CosineMoments,
    CosineStats,
    cosine_moments,
    epsilon,
    pairwise_cosine_stats,
)
from .ops.pairwise_cosine_stats_sharded import pairwise_cosine_stats_sharded  # noqa: F401
from .reference import cosine_moments_reference, pairwise_cosine_stats_reference  # noqa: F401

warnings.warn("repcap_fast.cosine_stats is deprecated; use repcap_fast.ops.pairwise_cosine_stats (or the "
              "top-level repcap_fast.pairwise_cosine_stats)", DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    """PRECISIONS, as this module exported it."""
    if name == "PRECISIONS":  # {name: the compiled op's integer code}, as this module exported it
        return {precision: _backends.precision_code(precision) for precision in _backends.PRECISIONS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
