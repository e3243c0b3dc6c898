"""Deprecated alias of ``repcap_fast.ops.gram_offdiag_penalty``, removed in the next release.

The module of kernel 3 is now ``repcap_fast.ops.gram_offdiag_penalty``; the functions are also at
the top level (``repcap_fast.gram_offdiag_penalty``). Renamed:
``gram_offdiag_rows`` → ``gram_offdiag_row_stats``, ``rows_loss_and_grad`` →
``gram_offdiag_penalty_block``. ``GramOffdiagPenaltyFunction`` is the op's autograd function, whose
``apply`` takes the op's arguments (X, p, normalize, reduction, backend, precision, with_grad) and
returns (L, ∂L/∂X): call ``gram_offdiag_penalty`` instead.
"""

import warnings

from . import _validation
from .ops.gram_offdiag_penalty import (  # noqa: F401
    REDUCTIONS,
    GramOffdiagPenaltyFunction,
    gram_offdiag_max,
    gram_offdiag_penalty,
    gram_offdiag_penalty_block,
    gram_offdiag_row_stats,
)

MAX_P = 1 << 30  # the largest p this module's check_p accepted


def check_p(p) -> int:
    """The exponent p as an int in [1, MAX_P] (the old contract; the ops check p against their backend's limit)."""
    return _validation.check_p(p, MAX_P)


gram_offdiag_rows = gram_offdiag_row_stats
rows_loss_and_grad = gram_offdiag_penalty_block

warnings.warn("repcap_fast.penalty is deprecated; use repcap_fast.ops.gram_offdiag_penalty (gram_offdiag_rows is "
              "now gram_offdiag_row_stats, rows_loss_and_grad is gram_offdiag_penalty_block)", DeprecationWarning,
              stacklevel=2)
