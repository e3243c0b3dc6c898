"""The argument checks of pairwise_cosine_stats and cosine_moments (repcap_fast.ops.pairwise_cosine_stats).

``check_operands`` (the matrices: shape, dtype, device, finite values, zero rows, n_rows) and
``check_settings`` (everything that needs no pass over the matrices), which the CLI and the
reports also run before loading a matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .. import _validation as val
from .._backends import check_precision, kernel_limits, resolve_backend


@dataclass(frozen=True)
class Operands:
    """Rows of A (and B) with their float64 row norms, zero rows dropped per the policy."""

    a: torch.Tensor
    norms_a: torch.Tensor
    dropped_a: int
    b: Optional[torch.Tensor]
    norms_b: Optional[torch.Tensor]
    dropped_b: int


def _split_n_rows(n_rows, has_b):
    """n_rows -> (rows of A, rows of B).

    An int applies to both (a padded vocabulary on both sides), a pair (n_a, n_b) to each; None
    keeps all rows.
    """
    if isinstance(n_rows, (tuple, list)):
        if len(n_rows) != 2 or not has_b:
            raise ValueError(f"n_rows as a pair (n_a, n_b) needs B and two entries, got {n_rows!r}")
        return n_rows[0], n_rows[1]
    return n_rows, (n_rows if has_b else None)


def check_operands(A, B, zero_rows: str, n_rows) -> Operands:
    """A (and B) validated.

    2-D float matrices on one device with the same d, first n_rows rows, finite, zero rows
    refused or dropped; A needs two rows when alone.
    """
    n_rows_a, n_rows_b = _split_n_rows(n_rows, B is not None)
    a = val.restrict_rows(val.as_matrix(A, "A"), n_rows_a, "A")
    norms_a = val.row_norms(a, "A")
    a, norms_a, dropped_a = val.drop_zero_rows(a, norms_a, zero_rows, "A")
    norms_b, dropped_b, b = None, 0, None
    if B is not None:
        b = val.restrict_rows(val.as_matrix(B, "B"), n_rows_b, "B")
        val.check_pair(a, b)
        norms_b = val.row_norms(b, "B")
        b, norms_b, dropped_b = val.drop_zero_rows(b, norms_b, zero_rows, "B")
        if b.shape[0] == 0:
            raise ValueError("B has no rows left after dropping zero-norm rows")
        if a.shape[0] == 0:
            raise ValueError("A has no rows left after dropping zero-norm rows")
    elif a.shape[0] < 2:
        raise ValueError(f"A needs at least 2 rows to form a pair, got {a.shape[0]}"
                         + (f" after dropping {dropped_a} zero-norm rows" if dropped_a else ""))
    return Operands(a, norms_a, dropped_a, b, norms_b, dropped_b)


def check_settings(device, bins, value_range=(-1.0, 1.0), zero_rows: str = "error", backend="auto",
                   precision: str = "highest") -> Tuple[str, int, float, float]:
    """Everything about a call on tensors on `device` that needs no pass over the matrices.

    The precision, the backend (resolved), bins against its limit, the range, the zero-rows
    policy. Returns (backend, bins, lo, hi). Callers that load the matrices first (the CLI,
    reports) run it before loading.
    """
    check_precision(precision)
    val.check_choice(zero_rows, "zero_rows", ("error", "drop"))
    name = resolve_backend(backend, torch.device(device), "pairwise_cosine_stats")
    max_bins = None if name == "torch" else kernel_limits().histogram_bins
    bins, lo, hi = val.check_histogram(bins, value_range, max_bins)
    return name, bins, lo, hi
