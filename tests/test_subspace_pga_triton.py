"""The Triton backend of subspace PGA (triton_kernels/subspace_pga.py) against SciPy and the
float64 torch reference, under TRITON_INTERPRET=1 on CPU: exact tie-aware ranks, ρ per subspace,
NaN cases, determinism, checks of ref_ranks. Small N: the interpreter is slow."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import rankdata

from repcap_fast import pga
from repcap_fast.reference import average_ranks, condensed_cosine_distances, subspace_rhos_reference

from _helpers import condensed_distances64, cpu_backends, key_distances, near_duplicate_unit_rows, rng, tf32_distances64

pytestmark = pytest.mark.skipif("triton" not in cpu_backends(), reason="Triton interpreter not available")

DTYPES = [torch.float32, torch.float64]


@pytest.fixture(scope="module")
def kern():
    from repcap_fast.triton_kernels import subspace_pga

    return subspace_pga


def one_hot(n, d, seed, scales=(49.0, 7.0, 11.0, 0.1, 3.0, -2.5)):
    """Scaled one-hot rows: every cosine distance is exactly 0, 1 or 2, long runs of ties."""
    r = rng(seed)
    h = np.zeros((n, d))
    h[np.arange(n), r.integers(0, d, n)] = r.choice(scales, n)
    return h


def signed_subsets(seed, d=16):
    """Rows of ±1 on 1, 4 or 16 of d = 16 coordinates, scaled by powers of 2, some repeated
    (scaled too): unit rows have entries ±1, ±1/2 or ±1/4, so every dot product is exact in any
    summation order and equal distances are equal bit for bit (runs of ties of many lengths)."""
    r = rng(seed)
    rows = []
    for size in [1] * 6 + [4] * 14 + [16] * 6:
        row = np.zeros(d)
        row[r.choice(d, size, replace=False)] = r.choice([-1.0, 1.0], size)
        rows.append(row * 2.0 ** r.integers(-3, 4))
    rows = np.array(rows)
    return np.vstack([rows, rows[:5], 4.0 * rows[7:10], 0.5 * rows[:2]])


def with_duplicates(seed):
    """Random rows plus exact copies and copies scaled by 2 (the same unit rows, bit for bit;
    their distances tie only where the dot products are formed in the same order)."""
    base = rng(seed).standard_normal((24, 6))
    return np.vstack([base, base[:4], 2.0 * base[:3], base[5:6]])


def reference_rhos(x, bases):
    """The float64 torch reference, NaN where a projected row is 0."""
    x64, b64 = x.double(), bases.double()
    usable = torch.tensor([not bool((torch.linalg.vector_norm(x64 @ b, dim=1) == 0).any()) for b in b64])
    out = np.full(len(b64), np.nan)
    if bool(usable.any()):
        out[usable.numpy()] = subspace_rhos_reference(x64, b64[usable])
    return out


def ref_ranks_of(x):
    return average_ranks(condensed_cosine_distances(x.double(), "x"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["one_hot", "duplicates", "no_ties", "n2"])
def test_ranks_match_scipy_rankdata(kern, case, dtype):
    h = {"one_hot": lambda: one_hot(70, 5, 4), "duplicates": lambda: signed_subsets(1),
         "no_ties": lambda: rng(2).standard_normal((37, 6)), "n2": lambda: rng(3).standard_normal((2, 3))}[case]()
    ranks = kern.subspace_pga_ranks_triton(torch.from_numpy(h).to(dtype))
    assert ranks.dtype == torch.float64 and ranks.shape == (h.shape[0] * (h.shape[0] - 1) // 2,)
    np.testing.assert_array_equal(ranks.numpy(), rankdata(pdist(h, "cosine")))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ranks_runs_across_small_blocks_and_sort_groups(kern, dtype, monkeypatch):
    """Blocks of 16 sorted positions: most runs cross blocks (binary searches on both sides);
    one row per sort."""
    monkeypatch.setattr(kern, "_rank_config", lambda interpreting: (16, 1))
    monkeypatch.setattr(kern, "_SORT_GROUP_PAIRS", 1)
    for h in (one_hot(40, 4, 5), signed_subsets(6)):
        ranks = kern.subspace_pga_ranks_triton(torch.from_numpy(h).to(dtype))
        np.testing.assert_array_equal(ranks.numpy(), rankdata(pdist(h, "cosine")))
    x = torch.from_numpy(signed_subsets(7)).to(dtype)
    bases = pga.grassmann_bases(16, 3, 3, seed=1).to(dtype)
    ref = ref_ranks_of(x)
    # signed_subsets repeats rows (scaled): projected on a random basis, such a pair's distance is
    # 0 or ±2e-16 depending on the summation order, so the kernel and the reference may split that
    # tie differently (the documented ~1e-7 in ρ for float64 H); distinct rows agree to 1e-12.
    tol = 5e-7 if dtype == torch.float64 else 2e-6
    np.testing.assert_allclose(kern.subspace_pga_rhos_triton(x, bases, ref).numpy(),
                               reference_rhos(x, bases), rtol=0, atol=tol)


@pytest.mark.parametrize("block", [16, 1024])
def test_fused_rank_kernel_on_synthetic_keys(kern, monkeypatch, block):
    """The sort + fused rank pass alone, on distances with chosen run structure: a few levels
    (runs of hundreds), one run but the ends, all distinct, all equal."""
    monkeypatch.setattr(kern, "_rank_config", lambda interpreting: (block, 1))
    r = rng(block)
    n = 1500 if block > 256 else 200  # several blocks either way
    levels = np.array([r.integers(0, 5, n), np.r_[0, np.full(n - 2, 3), 7], r.permutation(n), np.full(n, 2)])
    dist = torch.from_numpy(levels / 1024.0)  # in [0, 2], exact in float32
    ref = torch.from_numpy(rankdata(r.integers(0, 40, n)))
    twice, ref_sum_sq = kern._twice_ref_ranks(ref, n, "cpu")
    m = (n + 1) / 2
    want_r = np.array([rankdata(row) for row in levels]) - m
    want = np.stack([want_r @ (ref.numpy() - m), (want_r * want_r).sum(1)], axis=1)
    bits = dist.float().view(torch.int32).to(torch.int64) << 32
    for keys, packed, extra in [(bits + twice.to(torch.int64), True, None), (dist.clone(), False, twice)]:
        partial, poisoned = kern._rank_pass(keys, packed, twice=extra)
        assert not bool(poisoned)
        np.testing.assert_allclose(kern._tree_sum(partial.transpose(0, 1)).numpy(), want, rtol=1e-13, atol=0)
    assert ref_sum_sq == pytest.approx(float(((ref - m) ** 2).sum()), rel=1e-14)
    pair = torch.arange(n, dtype=torch.int64)
    for b in range(len(levels)):
        for keys, packed in [((bits[b] + pair)[None], True), (dist[b : b + 1].clone(), False)]:
            ranks = torch.full((n,), float("nan"), dtype=torch.float64)
            kern._rank_pass(keys, packed, ranks=ranks)
            np.testing.assert_array_equal(ranks.numpy(), rankdata(levels[b]))


def test_ranks_reject_a_zero_row_and_too_many_tokens(kern):
    x = torch.randn(5, 3)
    x[2] = 0
    with pytest.raises(ValueError, match="zero row"):
        kern.subspace_pga_ranks_triton(x)
    with pytest.raises(ValueError, match="at most 65536 tokens"):  # the one limit of both ops
        kern.subspace_pga_ranks_triton(torch.ones(65537, 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,d,k", [(3, 4, 2), (5, 7, 3), (37, 12, 1), (37, 12, 5), (130, 16, 6)])
def test_rhos_match_the_float64_reference(kern, n, d, k, dtype):
    r = rng(10 * n + k)
    x = torch.from_numpy(r.standard_normal((n, d)) @ r.standard_normal((d, d))).to(dtype)
    bases = pga.grassmann_bases(d, k, 4, seed=n).to(dtype)
    ref = ref_ranks_of(x)
    rhos = kern.subspace_pga_rhos_triton(x, bases, ref)
    assert rhos.dtype == torch.float64 and rhos.device.type == "cpu" and rhos.shape == (4,)
    # float64: the same distances, so the same ranks; k = 1: distances exactly 0 or 2 in any
    # arithmetic; otherwise float32 distances (a near tie may order differently).
    tol = 1e-12 if dtype == torch.float64 or k == 1 else 2e-6
    np.testing.assert_allclose(rhos.numpy(), reference_rhos(x, bases), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rhos_with_exact_ties_on_both_sides(kern, dtype):
    """Exact ties in the reference ranks (distances 0, 1/4, ..., 2 of signed_subsets) and in
    every subspace (k = 1: distances 0 or 2), long runs on both sides, exact in any arithmetic."""
    x = torch.from_numpy(signed_subsets(3)).to(dtype)
    bases = pga.grassmann_bases(16, 1, 6, seed=2).to(dtype)
    ref = ref_ranks_of(x)
    assert len(torch.unique(ref)) < 0.05 * len(ref)
    rhos = kern.subspace_pga_rhos_triton(x, bases, ref)
    np.testing.assert_allclose(rhos.numpy(), reference_rhos(x, bases), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rhos_nan_for_constant_distances_and_zero_projected_rows(kern, dtype):
    r = rng(8)
    x = torch.from_numpy(r.standard_normal((9, 3))).to(dtype)
    x[:, 0] = x[:, 0].abs() + 0.5  # all rows on one side of e0: every distance on span(e0) is 0
    x[4, :2] = 0  # row 4 lies along e2: projected to 0 on span(e0, e1)
    eye = torch.eye(3, dtype=dtype)
    on_e0 = torch.cat([eye[:, [0]], torch.zeros(3, 1, dtype=dtype)], dim=1)  # projections (x0, 0): û = (1, 0)
    bases = torch.stack([eye[:, [0, 2]], on_e0, eye[:, [0, 1]], eye[:, [1, 2]]])
    ref = ref_ranks_of(x)
    rhos = kern.subspace_pga_rhos_triton(x, bases, ref).numpy()
    assert np.isfinite(rhos[0]) and np.isnan(rhos[1]) and np.isnan(rhos[2]) and np.isfinite(rhos[3])
    np.testing.assert_allclose(rhos[[0, 3]], reference_rhos(x, bases[[0, 3]]), rtol=0,
                               atol=1e-12 if dtype == torch.float64 else 2e-6)
    ones = torch.ones(2, 3, dtype=dtype)  # N = 2: one pair, ρ undefined
    assert np.isnan(kern.subspace_pga_rhos_triton(ones + torch.eye(2, 3, dtype=dtype), bases[:1],
                                                  torch.ones(1, dtype=torch.float64)).item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rhos_are_deterministic(kern, dtype):
    x = torch.from_numpy(with_duplicates(9)).to(dtype)
    bases = pga.grassmann_bases(6, 3, 4, seed=4).to(dtype)
    ref = ref_ranks_of(x)
    a = kern.subspace_pga_rhos_triton(x, bases, ref)
    b = kern.subspace_pga_rhos_triton(x, bases, ref)
    assert torch.equal(a, b)
    assert torch.equal(kern.subspace_pga_ranks_triton(x), kern.subspace_pga_ranks_triton(x))


def test_rhos_reject_bad_ref_ranks(kern):
    x = torch.from_numpy(rng(11).standard_normal((6, 4)))
    bases = pga.grassmann_bases(4, 2, 2, seed=0)
    ref = ref_ranks_of(x)  # n = 15
    bad = {
        "quarter": torch.cat([ref[:1] + 0.25, ref[1:2] - 0.25, ref[2:]]),  # the sum is kept
        "below 1": torch.where(ref == 1, torch.zeros_like(ref), ref),
        "above n": torch.where(ref == 15, torch.full_like(ref, 16.0), ref),
        "sum": torch.where(ref == 15, torch.full_like(ref, 14.0), ref),
        "nan": torch.where(ref == 15, torch.full_like(ref, float("nan")), ref),
    }
    for _name, r in bad.items():
        with pytest.raises(ValueError, match="ref_ranks must be average ranks"):
            kern.subspace_pga_rhos_triton(x, bases, r)
    with pytest.raises(ValueError, match="ref_ranks must have length 15"):
        kern.subspace_pga_rhos_triton(x, bases, ref[:-1])
    with pytest.raises(ValueError, match="at most 65536 tokens"):
        kern.subspace_pga_rhos_triton(torch.ones(65537, 1), torch.ones(1, 1, 1), torch.ones(1, dtype=torch.float64))
    tied = torch.full((15,), 8.0, dtype=torch.float64)  # one run of 15 ties: valid, ρ undefined
    assert torch.isnan(kern.subspace_pga_rhos_triton(x, bases, tied)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_unwritten_pair_is_detected(kern, dtype, monkeypatch):
    real = kern._keys

    def drop_a_pair(u, out_mode, precision, twice=None):
        keys = real(u, out_mode, precision, twice)
        keys[:, 3] = float("nan") if keys.dtype == torch.float64 else -1  # the poison
        return keys

    monkeypatch.setattr(kern, "_keys", drop_a_pair)
    x = torch.from_numpy(rng(12).standard_normal((8, 4))).to(dtype)
    with pytest.raises(RuntimeError, match="was not written"):
        kern.subspace_pga_ranks_triton(x)
    with pytest.raises(RuntimeError, match="was not written"):
        kern.subspace_pga_rhos_triton(x, pga.grassmann_bases(4, 2, 2, seed=0).to(dtype), ref_ranks_of(x))


# --- "tf32": TF32 dots of unit rows rounded to nearest ----------------------------------------------


@pytest.mark.parametrize("out_mode", ["distances", "packed"])
def test_tf32_distances_are_dots_of_rows_rounded_to_nearest(kern, out_mode):
    """float32 at "tf32": the launcher rounds the unit rows to TF32 to nearest, so the kernel's TF32
    dots are products of rounded rows (under the interpreter tl.dot multiplies the float32 values as
    given: without the rounding it would return the IEEE distances, which these near-duplicates put
    more than 1e-5 from the TF32 ones; truncated rows more than 1e-4). "highest" keeps the rows."""
    from repcap_fast.triton_kernels._utils import interpreting

    if not interpreting():
        pytest.skip("the interpreter's float32 dots tell rounded rows from unrounded ones")
    mode = kern._OUT_DIST if out_mode == "distances" else kern._OUT_PAIR
    u = near_duplicate_unit_rows(2, 70, 96, seed=3)
    want = tf32_distances64(u)
    ieee = condensed_distances64(u.double())
    assert float((want - ieee).abs().max()) > 1e-5  # the case tells the three apart
    assert float((want - tf32_distances64(u, truncate=True)).abs().max()) > 1e-4
    got = key_distances(kern._keys(u, mode, "tf32"))
    assert float((got - want).abs().max()) <= 1e-6
    highest = key_distances(kern._keys(u, mode, "highest"))
    assert float((highest - ieee).abs().max()) <= 1e-6


def test_tf32_rhos_rank_the_distances_of_rounded_rows(kern, monkeypatch):
    """subspace_pga_rhos_triton at "tf32" hands the distance kernel its float32 projections' unit
    rows, which it rounds: the distances it ranks are those of the rounded rows."""
    from repcap_fast.triton_kernels._utils import interpreting

    if not interpreting():
        pytest.skip("the interpreter's float32 dots tell rounded rows from unrounded ones")
    seen = []
    real = kern._keys

    def spy(u, out_mode, precision, twice=None):
        seen.append((u.clone(), precision))
        return real(u, out_mode, precision, twice)

    monkeypatch.setattr(kern, "_keys", spy)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(1, 64, generator=g) + 0.1 * torch.randn(60, 64, generator=g)).float()
    bases = pga.grassmann_bases(64, 48, 3, seed=1).float()
    kern.subspace_pga_rhos_triton(x, bases, ref_ranks_of(x), "tf32")
    (u, precision), = seen
    assert precision == "tf32" and u.dtype == torch.float32 and u.shape == (3, 60, 48)
    proj = torch.stack([x @ b for b in bases])
    unit = proj / torch.linalg.vector_norm(proj, dim=-1, keepdim=True, dtype=torch.float64).float()
    torch.testing.assert_close(u, unit, rtol=0, atol=0)
    # what the kernel ranks: its keys' distances, those of the rounded unit rows
    got = key_distances(real(u, kern._OUT_PAIR, "tf32"))
    assert float((got - tf32_distances64(u)).abs().max()) <= 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rhos_do_not_depend_on_the_batch(kern, dtype):
    """One projection GEMM per subspace, of one shape: a subspace's ρ is the same bits in any batch."""
    r = rng(21)
    x = torch.from_numpy(r.standard_normal((40, 24)) @ r.standard_normal((24, 24))).to(dtype)
    bases = pga.grassmann_bases(24, 5, 5, seed=3).to(dtype)
    ref = ref_ranks_of(x)
    whole = kern.subspace_pga_rhos_triton(x, bases, ref)
    one_by_one = torch.cat([kern.subspace_pga_rhos_triton(x, bases[b : b + 1], ref) for b in range(5)])
    assert torch.equal(whole, one_by_one)
