"""The shared host/device headers (csrc/*_epilogue.h), called from the CPU build through test
hooks of repcap_fast._C: the CUDA kernels run exactly these functions. Also the CPU kernel's
bucketed sort of subspace PGA's pairs, through its hooks."""

import math
import os
import platform
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

import repcap_fast  # noqa: F401
from repcap_fast import _C

from _helpers import rng


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


# --- Subspace PGA: the key map and the rank pass (csrc/subspace_pga_epilogue.h) ---------------------


def test_sortable_keys_order_like_the_floats():
    r = rng(21)
    vals = np.concatenate([[0.0, 2.0, 1.0, np.nextafter(0, 1), np.nextafter(2, 0), -1.5, -0.25],
                           r.uniform(0, 2, 200), r.standard_normal(50)])
    for f in (_C._sortable_key_f32, _C._sortable_key_f64):
        cast = np.float32 if f is _C._sortable_key_f32 else np.float64
        v = np.unique(vals.astype(cast))  # strictly increasing
        keys = [f(float(x)) for x in v]
        assert all(a < b for a, b in zip(keys, keys[1:]))


@pytest.mark.parametrize("runs", [[1] * 9, [5], [1, 3, 1, 2, 1, 40, 1], [1000, 1, 17, 256]])
def test_run_bounds_match_searchsorted(runs):
    sorted_keys = np.repeat(np.arange(len(runs)) * 7 + 3, runs).astype(np.uint64)
    for t in range(0, len(sorted_keys), max(1, len(sorted_keys) // 97)):
        lo = np.searchsorted(sorted_keys, sorted_keys[t], "left")
        hi = np.searchsorted(sorted_keys, sorted_keys[t], "right")
        assert _C._run_bounds(sorted_keys.tolist(), t) == (lo, hi)


@pytest.mark.parametrize("levels", [3, 40, 10**6])
def test_per_position_rank_pass_matches_scipy(levels):
    """The CUDA kernel's per-position pass (neighbour test, galloping run search, average rank,
    float64 terms), run on the host through the shared header, against scipy.stats.spearmanr."""
    r = rng(levels)
    n = 3000
    a = r.integers(0, levels, n).astype(np.uint64)  # the subspace's keys, with ties
    ref = rankdata(r.integers(0, 50, n))  # reference average ranks, with ties
    order = np.argsort(a, kind="stable")
    twice_ref = (2 * ref[order]).astype(np.uint32)
    mean = (n + 1) / 2
    cross, sum_sq, rho = _C._rank_correlation_sorted(a[order].tolist(), twice_ref.tolist(),
                                                    float(((ref - mean) ** 2).sum()))
    ra = rankdata(a)
    assert sum_sq == pytest.approx(((ra - mean) ** 2).sum(), rel=1e-12)
    assert cross == pytest.approx(((ra - mean) * (ref - mean)).sum(), rel=1e-12, abs=1e-6)
    assert rho == pytest.approx(spearmanr(a, ref).statistic, abs=1e-13)
    assert math.isnan(_C._rank_correlation_sorted([5] * 10, list(range(2, 22, 2)), 82.5)[2])  # constant side


# --- gram_offdiag_penalty: the elementwise weight and the online rescaling ---------------------------

def test_penalty_term_and_rescaling():
    for g, inv, p in [(0.5, 2.0, 3), (-0.25, 2.0, 8), (0.0, 1.0, 1), (-0.3, 1 / 0.3, 1), (0.7, 1.0, 20)]:
        r = min(abs(g) * inv, 1.0)
        term, weight = _C._penalty_term_f64(g, inv, p)
        assert term == pytest.approx(r**p, rel=1e-15)
        assert weight == pytest.approx(math.copysign(r ** (p - 1), g) if g != 0 else 0.0, rel=1e-15)
    # a ratio above 1 from rounding is clamped
    assert _C._penalty_term_f32(1.0000001, 1.0, 4)[0] == 1.0
    inv_max, alpha, beta = _C._penalty_rescale_f64(0.5, 2.0, 4)
    assert (inv_max, alpha, beta) == (0.5, 0.25**4, 0.25**3)
    assert _C._penalty_rescale_f64(0.0, 0.0, 4) == (0.0, 1.0, 1.0)


def _bucketed_cases():
    r = np.random.default_rng(21)
    top = lambda v: np.asarray(v, dtype=np.uint32) << np.uint32(16)  # noqa: E731
    gauss = np.clip(1 - 0.125 * r.standard_normal(200_000), 0, 2).astype(np.float32)
    return {
        "one": np.array([7], dtype=np.uint32),
        "two equal": np.array([3, 3], dtype=np.uint32),
        "all equal": np.full(50_000, 0x9000ABCD, dtype=np.uint32),
        "uniform 32-bit": r.integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32),
        "extremes": r.choice(np.array([0, 2**32 - 1], dtype=np.uint32), 40_000),
        "one top value, ties": top(0x8000) + r.integers(0, 300, 30_000).astype(np.uint32),
        "one top value over a bucket": top(0x8000) + r.integers(0, 2**16, 120_000).astype(np.uint32),
        "adjacent top values": top(0x8000) + r.integers(0, 2**18, 120_000).astype(np.uint32),
        "ties across 50 top values": top(r.integers(0, 50, 90_000)) + r.integers(0, 3, 90_000).astype(np.uint32),
        # runs of every length around the tie correction's longest offset (32)
        "runs of 1 to 80 equal keys": r.permutation(
            top(0x8000) + np.repeat(7 * np.arange(80, dtype=np.uint32), np.arange(1, 81))),
        "sparse top values": top(r.integers(0, 2**16, 100_000)) + r.integers(0, 2**16, 100_000).astype(np.uint32),
        "distances": np.array([_C._sortable_key_f32(float(v)) for v in gauss], dtype=np.uint32),
        # one bucket whose sums pass 2^64: the correlation's 128-bit path
        "one top value, 1.7M items": top(0x8000) + r.integers(0, 2**16, 1_700_000).astype(np.uint32),
        "all equal, 1.7M items": np.full(1_700_000, 0x9000ABCD, dtype=np.uint32),
    }


@pytest.mark.parametrize("case", list(_bucketed_cases()))
def test_bucketed_sort_gives_scipy_average_ranks_and_correlation(case):
    """The CPU kernel's sort of packed items (a scatter by the keys' top 16 bits into buckets,
    then each bucket sorted in cache) on keys that hit its edges: one item, all equal, both
    extremes, a top value holding more than a bucket, ties next to bucket borders, runs of ties of
    every length up to 80, a bucket whose correlation sums need 128 bits. The correlation is exact,
    from the AVX-512 pass (where this CPU has it) and from the portable one alike: its cross term
    is the integer (Σ 2r·2s − n(n + 1)²)/4 and Σ (r − m)² = (n³ − n − Σ (L³ − L))/12, each
    rounded once."""
    keys = _bucketed_cases()[case]
    ranks = np.asarray(_C._bucketed_sort_ranks(keys.tolist()))
    expected = rankdata(keys.astype(np.int64), method="average")
    np.testing.assert_array_equal(ranks, expected)
    n = keys.size
    twice_ref = 2 * np.random.default_rng(3).permutation(n).astype(np.int64) + 2
    twice_rank = (2 * expected).astype(np.int64)
    exact_cross_times_4 = int(np.dot(twice_rank.astype(object), twice_ref.astype(object))) - n * (n + 1) ** 2
    runs = np.unique(keys, return_counts=True)[1].astype(object)
    exact_sum_sq_times_12 = n**3 - n - int(np.sum(runs**3 - runs))
    for vectorized in (True, False):
        cross, sum_sq = _C._bucketed_sort_correlation(keys.tolist(), twice_ref.astype(np.uint32).tolist(),
                                                      vectorized=vectorized)
        assert cross == float(Fraction(exact_cross_times_4, 4)), vectorized
        assert sum_sq == float(Fraction(exact_sum_sq_times_12, 12)), vectorized


def test_the_avx512_rank_pass_runs_where_the_cpu_has_it():
    """The vectorized pass is the one the kernel takes on an AVX-512 CPU (so the test above checks
    it there; the build compiles it with GCC on x86-64); elsewhere the portable pass runs alone."""
    if platform.machine() != "x86_64" or not os.path.exists("/proc/cpuinfo"):
        pytest.skip("not an x86-64 Linux CPU")
    with open("/proc/cpuinfo") as f:
        flags = f.read().split()
    assert _C._avx512_rank_pass() == ("avx512f" in flags)
