"""The shared host/device epilogue (csrc/pairwise_cosine_stats_epilogue.h), called from the CPU
build: the CUDA kernel runs exactly these functions."""

import math

import numpy as np
import pytest
import torch

import repcap_fast  # noqa: F401
from repcap_fast import _C


@pytest.mark.parametrize("nb", [1, 2, 3, 7, 64, 1187])
def test_upper_tile_coords_enumerates_the_upper_triangle_in_order(nb):
    expected = [(i, j) for i in range(nb) for j in range(i, nb)]
    if len(expected) > 20000:
        picks = np.random.default_rng(0).choice(len(expected), 20000, replace=False)
        picks = sorted(set(picks.tolist()) | {0, len(expected) - 1})
    else:
        picks = range(len(expected))
    for t in picks:
        assert _C._upper_tile_coords(t, nb) == expected[t], t


def test_upper_tile_coords_at_16m_rows():
    # V = 16M rows, 128-row tiles: nb = 131072, 8.6e9 tiles (past 2^32).
    nb = 131072
    total = nb * (nb + 1) // 2
    for t in [0, 1, nb - 1, nb, total // 2, total - 2, total - 1]:
        bi, bj = _C._upper_tile_coords(t, nb)
        start = bi * nb - bi * (bi - 1) // 2
        assert 0 <= bi <= bj < nb and start + (bj - bi) == t


def test_histogram_bin_edges_and_outside():
    bins, lo, hi = 4096, -1.0, 1.0
    width = (hi - lo) / bins
    for k in [0, 1, 2047, 2048, 4094, 4095]:
        centre = lo + (k + 0.5) * width
        assert _C._histogram_bin(centre, lo, hi, bins) == k
    assert _C._histogram_bin(-1.0, lo, hi, bins) == 0
    assert _C._histogram_bin(1.0, lo, hi, bins) == bins - 1  # closed last edge
    assert _C._histogram_bin(-1.0001, lo, hi, bins) == -1  # below
    assert _C._histogram_bin(1.0001, lo, hi, bins) == -2  # above
    assert _C._histogram_bin(0.3, 0.0, 0.5, 10) == 6
    assert _C._histogram_bin(float("nan"), lo, hi, bins) == -1  # memory-safe; inputs are checked
    assert _C._histogram_bin(1e30, lo, hi, bins) == -2 and _C._histogram_bin(-1e30, lo, hi, bins) == -1


def test_cosine_from_dot_scales_and_clamps():
    assert _C._cosine_from_dot(6.0, 0.5, 0.25) == 0.75
    assert _C._cosine_from_dot(1.0 + 1e-6, 1.0, 1.0) == 1.0
    assert _C._cosine_from_dot(-3.0, 1.0, 1.0) == -1.0
    assert math.isclose(_C._cosine_from_dot(2.0, 0.3, 0.7), 2.0 * 0.3 * 0.7, rel_tol=1e-6)
