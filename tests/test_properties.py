"""Property-based tests (hypothesis): every op and backend against its float64 oracle on random
small inputs (duplicate, near-parallel and widely scaled rows, every dtype), the invariants of the
statistics, spearman against SciPy with ties, subspace_pga's kernel against the float64 reference
away from degenerate ranks, the capacity formulas' monotonicity, the sweep file under random
interruption, and loader round trips of written checkpoints.

The profile "repcap" (conftest.py) is derandomized, so CI runs the same examples every time;
REPCAP_HYPOTHESIS_SCALE=10 runs ten times as many (`examples`). Inputs are drawn as sizes, seeds
and structure (which rows repeat, which are near-parallel, each row's scale), so a failure shrinks
to a small matrix and prints the arguments that rebuild it.
"""

import json
import math
import os
import tempfile
import warnings

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import capacity as cap
from repcap_fast import packing, pga
from repcap_fast.geometry import center_and_ccr
from repcap_fast.models import load_embeddings
from repcap_fast.reference import condensed_cosine_distances, gram_offdiag_penalty_reference

from _helpers import (
    MOMENT_TOL,
    assert_matches,
    cosines64,
    cpu_backends,
    device_backends,
    examples,
    gpu_backend_built,
    grad_magnitude,
    loss_and_grad,
    reference64,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The Triton kernels under the interpreter (CPU, TRITON_INTERPRET=1): about 0.1 s a call at these
# sizes, so they get their own tests with smaller inputs and fewer examples.
TRITON_ON_CPU = "triton" in cpu_backends()
needs_interpreted_triton = pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton is not interpreted on CPU here")
# Kernel backends on every device, without the interpreted Triton (see above).
FAST_BACKENDS = device_backends(cpu=["cpu", "torch"])

ALL_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# Row scales 10^e, |e| ≤ this, per input dtype: the 1e-20..1e20 (float32 and bfloat16,
# which shares its exponent range) and 1e-200..1e200 (float64); float16 stays inside its range.
SCALE_EXP = {torch.float32: 20, torch.bfloat16: 20, torch.float64: 200, torch.float16: 1}


def _seed():
    return st.integers(0, 2**32 - 1)


# --- random matrices with structure -------------------------------------------------------------------

@st.composite
def structured_rows(draw, v, d, dtype, scales=True):
    """A v×d float64 matrix drawn from a seed, then structured by hypothesis (so failures shrink):
    rows copied from others (times ±1, 2, ½: cosines of exactly ±1), near-parallel rows (another
    row plus 10^-e noise), and each row scaled by 10^e_i. Returned in `dtype`, no zero row."""
    r = np.random.default_rng(draw(_seed()))
    x = r.standard_normal((v, d)) + draw(st.sampled_from([0.0, 0.3, 2.0])) * r.standard_normal((1, d))
    if v > 1:
        for dst, src, mult in draw(st.lists(st.tuples(st.integers(0, v - 1), st.integers(0, v - 1),
                                                      st.sampled_from([1.0, -1.0, 2.0, 0.5])), max_size=4)):
            x[dst] = mult * x[src]
        for dst, src, e in draw(st.lists(st.tuples(st.integers(0, v - 1), st.integers(0, v - 1),
                                                   st.integers(2, 12)), max_size=3)):
            x[dst] = x[src] + 10.0**-e * r.standard_normal(d)
    if scales and draw(st.booleans()):
        top = SCALE_EXP[dtype]
        # the ends of the range often (hypothesis draws them only now and then by itself)
        exps = draw(st.lists(st.one_of(st.sampled_from([-top, top]), st.integers(-top, top)), min_size=v, max_size=v))
        x *= np.array([10.0**e for e in exps])[:, None]
    t = torch.from_numpy(x).to(dtype)
    norms = torch.linalg.vector_norm(t.double(), dim=1)
    assume(bool(torch.isfinite(t).all() and (norms > 0).all()))  # a 16-bit row may round to 0
    return t


@st.composite
def histogram_settings(draw):
    bins = draw(st.one_of(st.sampled_from([1, 2, 7, 64, 4096]), st.integers(1, 5000)))
    if draw(st.booleans()):
        return bins, -1.0, 1.0
    lo = draw(st.floats(-1.5, 0.9))
    return bins, lo, lo + draw(st.floats(0.01, 2.0))


def _kernel_tol_dtype(backend):
    """The tolerance that applies: the torch backend works in float64, the kernels form float32
    dot products of every input dtype (float64 inputs too)."""
    return torch.float64 if backend == "torch" else torch.float32


def _check_stats(stats, c, count, backend, bins, lo, hi):
    """Invariants of any CosineStats, then the statistics against the float64 cosines c."""
    assert stats.count == count == c.numel()
    assert stats.hist.shape == (bins,) and bool((stats.hist >= 0).all()) and stats.below >= 0 and stats.above >= 0
    assert int(stats.hist.sum()) + stats.below + stats.above == stats.count
    assert torch.equal(stats.edges, torch.linspace(lo, hi, bins + 1, dtype=torch.float64))
    assert -1.0 <= stats.min <= stats.mean <= stats.max <= 1.0
    assert 0.0 <= stats.std <= 1.0
    assert stats.epsilon() == stats.mean + 2.0 * stats.std
    assert_matches(stats, c, dtype=_kernel_tol_dtype(backend), bins=bins, lo=lo, hi=hi)


# --- 1, 2. pairwise_cosine_stats, cosine_moments and the sharded form against float64 -----------------

@st.composite
def self_pair_inputs(draw, max_rows=40, max_d=24, dtypes=ALL_DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    a = draw(structured_rows(draw(st.integers(2, max_rows)), draw(st.integers(1, max_d)), dtype))
    return a, draw(histogram_settings()), draw(st.booleans())


@st.composite
def rect_pair_inputs(draw, max_rows=30, max_d=24, dtypes=ALL_DTYPES):
    d = draw(st.integers(1, max_d))
    dtype_a = draw(st.sampled_from(dtypes))
    dtype_b = draw(st.sampled_from([dtype_a, *dtypes]))  # mostly the same dtype; mixed ones meet in float32
    a = draw(structured_rows(draw(st.integers(1, max_rows)), d, dtype_a))
    b = draw(structured_rows(draw(st.integers(1, max_rows)), d, dtype_b))
    if draw(st.booleans()):  # rows shared by A and B: cosines of exactly 1
        n = min(a.shape[0], b.shape[0], draw(st.integers(1, 3)))
        b[:n] = a[:n].to(b.dtype)
    assume(bool(torch.isfinite(b).all() and (torch.linalg.vector_norm(b.double(), dim=1) > 0).all()))
    return a, b, draw(histogram_settings())


# Rows equal (cosines all equal, σ = 0) or nearly equal (σ ≈ 2e-9): μ must stay within [min, max]
# and σ within its tolerance, where Σc²/n − μ² cancels (found by these tests on the torch backend).
_ROW = [-0.7056439518928528, 0.6741186380386353]
_NEAR = [[1.5409960746765137, -0.293428897857666], [1.538817286491394, -0.2928604781627655]]


@pytest.mark.parametrize("device,backend", FAST_BACKENDS)
@settings(max_examples=examples(60))
@given(inputs=self_pair_inputs())
@example(inputs=(torch.tensor([_ROW] * 3), (1, -1.0, 1.0), False))
@example(inputs=(torch.tensor(_NEAR + _NEAR[:1]), (1, -1.0, 1.0), False))
def test_pairwise_cosine_stats_self_pairs_match_float64(device, backend, inputs):
    gpu_backend_built(backend)
    a, (bins, lo, hi), numpy = inputs
    arg = a.numpy() if numpy and device == "cpu" and a.dtype in (torch.float32, torch.float64) else a.to(device)
    stats = rf.pairwise_cosine_stats(arg, bins=bins, range=(lo, hi), backend=backend, progress=False)
    v = a.shape[0]
    assert stats.backend == backend and stats.shape_a == tuple(a.shape) and stats.shape_b is None
    _check_stats(stats, cosines64(a), v * (v - 1) // 2, backend, bins, lo, hi)


@pytest.mark.parametrize("device,backend", FAST_BACKENDS)
@settings(max_examples=examples(40))
@given(inputs=rect_pair_inputs())
@example(inputs=(torch.tensor(_NEAR), torch.tensor(_NEAR[:1]), (1, -1.0, 1.0)))
def test_pairwise_cosine_stats_a_by_b_match_float64(device, backend, inputs):
    gpu_backend_built(backend)
    a, b, (bins, lo, hi) = inputs
    stats = rf.pairwise_cosine_stats(a.to(device), b.to(device), bins=bins, range=(lo, hi), backend=backend,
                                     progress=False)
    assert stats.shape_a == tuple(a.shape) and stats.shape_b == tuple(b.shape)
    _check_stats(stats, cosines64(a, b), a.shape[0] * b.shape[0], backend, bins, lo, hi)


@needs_interpreted_triton
@settings(max_examples=examples(8))
@given(self_inputs=self_pair_inputs(max_rows=12, max_d=8), rect_inputs=rect_pair_inputs(max_rows=8, max_d=8))
def test_pairwise_cosine_stats_interpreted_triton_matches_float64(self_inputs, rect_inputs):
    a, (bins, lo, hi), _ = self_inputs
    stats = rf.pairwise_cosine_stats(a, bins=bins, range=(lo, hi), backend="triton", progress=False)
    _check_stats(stats, cosines64(a), a.shape[0] * (a.shape[0] - 1) // 2, "triton", bins, lo, hi)
    a, b, (bins, lo, hi) = rect_inputs
    stats = rf.pairwise_cosine_stats(a, b, bins=bins, range=(lo, hi), backend="triton", progress=False)
    _check_stats(stats, cosines64(a, b), a.shape[0] * b.shape[0], "triton", bins, lo, hi)


@settings(max_examples=examples(40))
@given(self_inputs=self_pair_inputs(), rect_inputs=rect_pair_inputs())
def test_cosine_moments_match_float64(self_inputs, rect_inputs):
    """The d×d Gram identity in float64: count, mean and variance of the exact cosines. (σ is
    compared as σ²: through Σc² − (Σc)²/n, σ ≈ 0 is only known to about √ulp.)"""
    tol = MOMENT_TOL[torch.float64]
    a = self_inputs[0]
    for args, c in (((a,), cosines64(a)), (rect_inputs[:2], cosines64(*rect_inputs[:2]))):
        m = rf.cosine_moments(*args)
        assert m.count == c.numel()
        assert m.mean == pytest.approx(float(c.mean()), abs=tol)
        assert m.std >= 0 and m.std**2 == pytest.approx(float(c.var(unbiased=False)), abs=tol)
        assert m.epsilon() == m.mean + 2 * m.std
        assert rf.epsilon(*args) == m.epsilon()


@settings(max_examples=examples(15))
@given(inputs=self_pair_inputs())
def test_sharded_without_a_group_is_the_single_process_op(inputs):
    """Without a process group the sharded op is pairwise_cosine_stats itself, bitwise."""
    a, (bins, lo, hi), _ = inputs
    sharded = rf.pairwise_cosine_stats_sharded(a, bins=bins, range=(lo, hi), backend="cpu", progress=False)
    single = rf.pairwise_cosine_stats(a, bins=bins, range=(lo, hi), backend="cpu", progress=False)
    assert sharded.to_dict() == single.to_dict()
    _check_stats(sharded, cosines64(a), a.shape[0] * (a.shape[0] - 1) // 2, "cpu", bins, lo, hi)


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone (torch.distributed initialized for this test
    only), so that the sharded op runs its ring code: the pieces, their merge, the collectives."""
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable or already initialized")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@settings(max_examples=examples(10))
@given(inputs=self_pair_inputs())
def test_sharded_on_a_one_rank_group_matches_float64(one_rank_group, inputs):
    a, (bins, lo, hi), _ = inputs
    stats = rf.pairwise_cosine_stats_sharded(a, group=one_rank_group, bins=bins, range=(lo, hi), backend="cpu",
                                             progress=False)
    _check_stats(stats, cosines64(a), a.shape[0] * (a.shape[0] - 1) // 2, "cpu", bins, lo, hi)
    single = rf.pairwise_cosine_stats(a, bins=bins, range=(lo, hi), backend="cpu", progress=False)
    assert (stats.count, stats.sum, stats.sum_sq, stats.min, stats.max) == \
        (single.count, single.sum, single.sum_sq, single.min, single.max)
    assert torch.equal(stats.hist, single.hist)


# --- 1. gram_offdiag_penalty: value and gradient against float64 ---------------------------------------

@st.composite
def penalty_inputs(draw, max_k=24, max_d=16, dtypes=ALL_DTYPES):
    """(X, row exponents, p, normalize, reduction). normalize=True: rows scaled by 2^e_i (exactly)
    over the dtype's range; the loss is the same and ∂L/∂x_i is 2^-e_i times that of the unscaled
    row. normalize=False: the whole X scaled by 2^e, moderately (the raw loss scales as 2^(2pe))."""
    dtype = draw(st.sampled_from(dtypes))
    normalize = draw(st.booleans())
    k, d = draw(st.integers(2, max_k)), draw(st.integers(1, max_d))
    x = draw(structured_rows(k, d, dtype, scales=False))
    if normalize:
        top = {torch.float64: 1000, torch.float16: 2}.get(dtype, 100)  # float32, bfloat16: 2^±100 ≈ 1e±30
        exps = draw(st.one_of(st.just([0] * k), st.lists(st.integers(-top, top), min_size=k, max_size=k)))
    else:
        e = draw(st.integers(-40, 40) if dtype == torch.float64 else st.integers(-6, 3))
        exps = [e] * k
    p = draw(st.integers(1, 12))
    return x, exps, p, normalize, draw(st.sampled_from(["sum", "mean"]))


def _assert_penalty_matches_reference(X, exps, p, normalize, reduction, backend, device="cpu"):
    """The kernel's loss and gradient on X with row i scaled by 2^exps[i] (exact) against the float64
    reference (materialized Gram, autograd). float32/float64 follow assert_close_to_reference (at most
    twice the plain float32 reference's error, plus a rounding floor); 16-bit X is computed in float32
    and its gradient rounded to X's dtype on return. A loss beyond the compute dtype's range must be
    a ValueError."""
    S = torch.tensor([2.0**e for e in exps], dtype=torch.float64)[:, None]
    Xs = (X.double() * S).to(X.dtype)
    # normalize: the rows at unit scale, exactly (L is scale invariant per row, ∂L/∂x_i scales as
    # 1/s_i); raw rows: the scaled matrix itself.
    X0 = Xs.double() / S if normalize else Xs.double()
    ref_loss, ref_grad = reference64(X0, p, normalize, reduction)
    limit = float(torch.finfo(torch.float64 if X.dtype == torch.float64 else torch.float32).max)
    assume(not limit / 1e3 < float(ref_loss) < 4 * limit)  # near the range's end: either answer is right
    # A gradient beyond X's dtype (float16: 65504) is left out: inf or an error could both be meant.
    assume(float((ref_grad / (S if normalize else 1.0)).abs().max()) < float(torch.finfo(X.dtype).max) / 1e3)
    if not float(ref_loss) < 4 * limit:
        with pytest.raises(ValueError, match="overflow"):
            loss_and_grad(Xs.to(device), p, normalize, reduction, backend)
        return
    loss, grad = loss_and_grad(Xs.to(device), p, normalize, reduction, backend)
    assert loss.dtype == (torch.float64 if X.dtype == torch.float64 else torch.float32) and loss.dim() == 0
    assert grad.dtype == X.dtype and grad.shape == X.shape
    assert torch.isfinite(loss) and bool(torch.isfinite(grad).all())
    loss, grad = float(loss), grad.cpu().double() * (S if normalize else 1.0)
    ref_loss = float(ref_loss)
    scale_g = grad_magnitude(X0, p, normalize)
    if X.dtype == torch.float64:
        assert loss == pytest.approx(ref_loss, rel=1e-11, abs=1e-300)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-11 * scale_g)
    elif X.dtype == torch.float32:
        Xf = X0.float().requires_grad_(True)
        low_loss = gram_offdiag_penalty_reference(Xf, p, normalize, reduction)
        low_loss.backward()
        low_loss_err = abs(float(low_loss.detach()) - ref_loss)
        low_grad_err = float((Xf.grad.double() - ref_grad).abs().max())
        low_loss_err = low_loss_err if math.isfinite(low_loss_err) else math.inf
        low_grad_err = low_grad_err if math.isfinite(low_grad_err) else math.inf
        assert abs(loss - ref_loss) <= 2 * low_loss_err + 2e-6 * abs(ref_loss), (loss, ref_loss, low_loss_err)
        grad_err = float((grad - ref_grad).abs().max())
        assert grad_err <= 2 * low_grad_err + 4e-6 * scale_g, (grad_err, low_grad_err, scale_g)
    else:
        assert loss == pytest.approx(ref_loss, rel=2e-5, abs=1e-30)
        # the gradient is rounded to X's dtype on return: 2^-8 (bfloat16) or 2^-11 (float16) relative,
        # and half the spacing of its subnormals absolute (per row, times the row's scale)
        info = torch.finfo(X.dtype)
        rtol = 8e-3 if X.dtype == torch.bfloat16 else 2e-3
        floor = info.smallest_normal * info.eps * (S if normalize else 1.0)
        assert bool(((grad - ref_grad).abs() <= rtol * (ref_grad.abs() + scale_g) + floor).all()), \
            float((grad - ref_grad).abs().max())


@pytest.mark.parametrize("device,backend", FAST_BACKENDS)
@settings(max_examples=examples(60))
@given(inputs=penalty_inputs())
def test_gram_offdiag_penalty_value_and_gradient_match_float64(device, backend, inputs):
    gpu_backend_built(backend)
    X, exps, p, normalize, reduction = inputs
    _assert_penalty_matches_reference(X, exps, p, normalize, reduction, backend, device)


@needs_interpreted_triton
@settings(max_examples=examples(8))
@given(inputs=penalty_inputs(max_k=10, max_d=6))
def test_gram_offdiag_penalty_interpreted_triton_matches_float64(inputs):
    X, exps, p, normalize, reduction = inputs
    _assert_penalty_matches_reference(X, exps, p, normalize, reduction, "triton")


# --- 3. spearman against SciPy ------------------------------------------------------------------------

SPECIAL_FLOATS = [0.0, -0.0, 1.0, 1.0 + 1e-9, 1.0 + 2**-52, -1.0, 0.5, 3.0, 1e16, 1e16 + 2.0, 1e308, -1e308,
                  1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -5e-324, 2.2250738585072014e-308,
                  1e-300, -1e-300]
SPECIAL_INTS = [0, 1, -1, 2, 2**53, 2**53 + 1, 2**62, 2**62 + 1, 2**62 + 2, 2**63 - 1, 2**63 - 2, -2**63,
                -2**63 + 1]


def _values(kind):
    """Element strategies that tie often (a small pool) and reach the extremes."""
    if kind == "float64":
        return st.one_of(st.sampled_from(SPECIAL_FLOATS), st.integers(-3, 3).map(float),
                         st.floats(allow_nan=False, allow_infinity=False))
    if kind == "float32":
        special = [float(np.float32(v)) for v in SPECIAL_FLOATS if abs(v) < 3e38]
        return st.one_of(st.sampled_from(special), st.integers(-3, 3).map(float),
                         st.floats(allow_nan=False, allow_infinity=False, width=32))
    return st.one_of(st.sampled_from(SPECIAL_INTS), st.integers(-3, 3), st.integers(2**62, 2**62 + 8),
                     st.integers(-2**63, 2**63 - 1))


@st.composite
def spearman_vector(draw, n):
    """(the argument as given: list, numpy array or tensor, and the numpy array SciPy gets)."""
    kind = draw(st.sampled_from(["float64", "float32", "int64"]))
    values = draw(st.lists(_values(kind), min_size=n, max_size=n))
    arr = np.array(values, dtype=kind)
    form = draw(st.sampled_from(["list", "numpy", "tensor"] if kind != "float32" else ["numpy", "tensor"]))
    given_ = values if form == "list" else arr if form == "numpy" else torch.from_numpy(arr.copy())
    return given_, arr


@st.composite
def spearman_inputs(draw):
    n = draw(st.integers(2, 25))
    return draw(spearman_vector(n)), draw(spearman_vector(n))


def _reprs(x):
    return f"{type(x).__name__} {x.dtype if hasattr(x, 'dtype') else ''} {list(np.asarray(x).tolist())}"


def _given(values, dtype=None):
    arr = np.array(values, dtype=dtype)
    return values, arr


@settings(max_examples=examples(100))
@given(inputs=spearman_inputs())
# the reproducers: a list rounded to float32, ±1e308 called NaN/Inf, 2**62 + i rounded to float64
@example(inputs=(_given([1.0, 1.0 + 1e-9, 0.5]), _given([2, 1, 0])))
@example(inputs=(_given([1e308, -1e308, 0.0]), _given([1, 2, 3])))
@example(inputs=((np.array([2**62, 2**62 + 1, 2**62 + 2]),) * 2, _given([3, 2, 1])))
def test_spearman_matches_scipy_with_ties_and_extremes(inputs):
    """pga.spearman ranks exactly what it is given (lists, numpy float/int64 arrays, tensors; no
    rounding to float32 or float64 first), as scipy.stats.spearmanr does, to 1e-12. The oracle is
    spearmanr of SciPy's ranks of x and of y: spearmanr(x, y) itself stacks x and y into one array
    first, so an int64 y beside a float x is rounded to float64 (2**63 − 1 ties with 2**63 − 2)."""
    from scipy.stats import ConstantInputWarning, rankdata, spearmanr

    (x, x_np), (y, y_np) = inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        want = float(spearmanr(rankdata(x_np), rankdata(y_np)).statistic)
    if math.isnan(want):  # a constant input: ρ is undefined, NaN with SciPy's warning
        with pytest.warns(ConstantInputWarning):
            got = pga.spearman(x, y)
        assert math.isnan(got), (_reprs(x), _reprs(y), got)
        return
    got = pga.spearman(x, y)
    assert abs(got - want) <= 1e-12, (_reprs(x), _reprs(y), got, want)


# --- 4. subspace_pga: the cpu kernel against the float64 reference ------------------------------------

@st.composite
def pga_inputs(draw, dtypes=(torch.float32, torch.float64)):
    n, d = draw(st.integers(8, 40)), draw(st.integers(6, 24))
    k = draw(st.integers(2, d - 1))  # k = 1: every projected distance is 0 or 2, all tied
    n_null, ccr, seed = draw(st.integers(3, 6)), draw(st.integers(0, 2)), draw(st.integers(0, 2**31))
    r = np.random.default_rng(draw(_seed()))
    h = r.standard_normal((n, d))
    if draw(st.booleans()):  # correlated coordinates: an anisotropic cloud
        h = h @ r.standard_normal((d, d))
    h = h * 10.0 ** draw(st.integers(-3, 3))
    w = r.standard_normal((draw(st.integers(d, 3 * d)), d)) * r.uniform(0.1, 3.0, size=d)
    H = torch.from_numpy(h).to(draw(st.sampled_from(dtypes)))
    return H, torch.from_numpy(w), dict(k=k, n_null=n_null, ccr=ccr, seed=seed)


def _assume_no_near_ties(H, W, kw, gap=1e-6):
    """Discards inputs where rounding could reorder distances: in every space the op ranks (the
    full one, the readout and each null subspace) sorted float64 distances are at least `gap` apart
    (float32 distances are good to a few 1e-7 here)."""
    x = center_and_ccr(H.double(), kw["ccr"]).H
    d = x.shape[1]
    bases = [pga.readout_basis(W, kw["k"]).basis, *pga.grassmann_bases(d, kw["k"], kw["n_null"], seed=kw["seed"])]
    for space in [x] + [x @ b for b in bases]:
        assume(bool(torch.linalg.vector_norm(space, dim=1).min() > 0))
        dist = condensed_cosine_distances(space).sort().values
        assume(float((dist[1:] - dist[:-1]).min()) > gap)


def _assert_pga_close(got, ref, dtype):
    tol = 1e-12 if dtype == torch.float64 else 2e-6  # float64 H: float64 distances on every backend
    assert got.n_pairs == ref.n_pairs and got.n_null == ref.n_null and got.k == ref.k
    assert got.rho_readout == pytest.approx(ref.rho_readout, abs=tol)
    np.testing.assert_allclose(got.null_rhos, ref.null_rhos, atol=tol)
    assert got.null_std > 0 and math.isfinite(got.z)
    assert got.z == pytest.approx(ref.z, rel=1e-9 if dtype == torch.float64 else 1e-4, abs=1e-6)


@settings(max_examples=examples(30))
@given(inputs=pga_inputs())
def test_subspace_pga_cpu_matches_the_float64_reference(inputs):
    H, W, kw = inputs
    _assume_no_near_ties(H, W, kw)
    ref = pga.subspace_pga(H, W, backend="torch", **kw)
    got = pga.subspace_pga(H, W, backend="cpu", **kw)
    assert got.backend == "cpu" and ref.backend == "torch"
    assert got.n_pairs == H.shape[0] * (H.shape[0] - 1) // 2
    _assert_pga_close(got, ref, H.dtype)


# The binary exponent of max|H·2^e| (max|H·2^e| in [2^(t−1), 2^t)): the ends of each dtype's
# range (a finite max near 3.4e38 or 1.8e308, normal smallest entries) often, any value between.
_TOP_EXPONENT = {torch.float32: st.one_of(st.sampled_from([128, 127, 120, -100, -108]), st.integers(-108, 128)),
                 torch.float64: st.one_of(st.sampled_from([1024, 1023, 1000, -1000, -1005]),
                                          st.integers(-1005, 1024))}


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@settings(max_examples=examples(10))
@given(inputs=pga_inputs(), data=st.data())
def test_subspace_pga_does_not_depend_on_the_scale_of_h(backend, inputs, data):
    """Cosine distances ignore scale: H·2^e (exact) gives the result of H, for any finite float32 H
    (entries up to 3.4e38) and float64 H (up to 1.8e308, down to 1e-300)."""
    H, W, kw = inputs
    _assume_no_near_ties(H, W, kw)
    top = data.draw(_TOP_EXPONENT[H.dtype], label="binary exponent of max|H·2^e|")
    e = top - math.frexp(float(H.abs().max()))[1]
    with np.errstate(over="ignore"):
        Hs = torch.from_numpy(np.ldexp(H.double().numpy(), e)).to(H.dtype)  # 2^e itself may overflow float64
    exact = np.array_equal(np.ldexp(Hs.double().numpy(), -e), H.double().numpy())
    assume(bool(torch.isfinite(Hs).all()) and exact)  # finite, and no entry rounded (subnormal)
    plain = pga.subspace_pga(H, W, backend=backend, **kw)
    scaled = pga.subspace_pga(Hs, W, backend=backend, **kw)
    _assert_pga_close(scaled, plain, H.dtype)


# --- 5. capacity formulas ------------------------------------------------------------------------------

LOG_FORMS = [cap.log_jl_capacity, cap.log_adjusted_capacity, cap.log_full_capacity]
PLAIN_FORMS = [cap.jl_capacity, cap.adjusted_capacity, cap.full_capacity]
dims = st.integers(1, 1 << 20)
epsilons = st.floats(0.0, 1.0)


def _le(a, b):
    """a ≤ b up to float64 rounding of the formulas (a few ulps)."""
    return a <= b + 4 * math.ulp(abs(b)) if math.isfinite(b) else a <= b


@settings(max_examples=examples(100))
@given(d=dims, d2=dims, eps=epsilons, eps2=epsilons)
def test_capacity_grows_with_epsilon_and_with_d(d, d2, eps, eps2):
    """Every capacity form k(d, ε) is non-decreasing in ε (a looser coherence fits more vectors) and
    in d (more room); the plain forms are exp of the log forms (inf past float64)."""
    (d, d2), (eps, eps2) = sorted((d, d2)), sorted((eps, eps2))
    for log_form, form in zip(LOG_FORMS, PLAIN_FORMS):
        assert _le(log_form(d, eps), log_form(d, eps2)), (log_form.__name__, d, eps, eps2)
        assert _le(log_form(d, eps), log_form(d2, eps)), (log_form.__name__, d, d2, eps)
        assert _le(form(d, eps), form(d, eps2)) and _le(form(d, eps), form(d2, eps))
        log_k, k = log_form(d, eps), form(d, eps)
        if math.isinf(k):
            assert log_k > 709.7
        else:
            assert k == pytest.approx(math.exp(log_k), rel=1e-13)
        assert log_k >= (math.log(d) if log_form is cap.log_adjusted_capacity else 0.0) - 1e-12


@settings(max_examples=examples(100))
@given(d=st.integers(1, 1 << 16), eps=st.floats(1e-4, 1.0))
def test_full_epsilon_inverts_full_capacity(d, eps):
    log_k = cap.log_full_capacity(d, eps)
    assume(log_k < 700)
    assert cap.full_epsilon(cap.full_capacity(d, eps), d) == pytest.approx(eps, rel=1e-9)


@settings(max_examples=examples(100))
@given(k=st.integers(2, 10**9), k2=st.integers(2, 10**9), d=st.integers(1, 10**5), d2=st.integers(1, 10**5))
def test_full_epsilon_grows_with_k_and_falls_with_d(k, k2, d, d2):
    (k, k2), (d, d2) = sorted((k, k2)), sorted((d, d2))
    assert _le(cap.full_epsilon(k, d), cap.full_epsilon(k2, d))
    assert _le(cap.full_epsilon(k, d2), cap.full_epsilon(k, d))
    assert cap.full_epsilon(k, d) >= 0.0


@settings(max_examples=examples(100))
@given(k=st.integers(2, 10**7), k2=st.integers(2, 10**7), d=st.integers(1, 4096), d2=st.integers(1, 4096),
       order=st.integers(1, 4))
@example(k=33552, k2=33552, d=448, d2=448, order=1)  # the floor's order 1 was 1 ulp below welch_bound's (array power)
def test_welch_bound_is_monotone_and_below_the_floor(k, k2, d, d2, order):
    """The Welch bound of every order lies in [0, 1], grows with k, falls with d, is 0 for k ≤ d
    (order 1: orthogonal vectors exist) and is sqrt((k−d)/(d(k−1))) at order 1; the coherence floor
    is at least every bound it combines."""
    (k, k2), (d, d2) = sorted((k, k2)), sorted((d, d2))
    w = cap.welch_bound(k, d, order)
    assert 0.0 <= w <= 1.0
    assert _le(w, cap.welch_bound(k2, d, order)) and _le(cap.welch_bound(k, d2, order), w)
    w1 = cap.welch_bound(k, d)
    if k <= d:
        assert w1 == 0.0
    else:
        assert w1 == pytest.approx(math.sqrt((k - d) / (d * (k - 1))), rel=1e-12)
    floor = cap.coherence_floor(k, d)
    assert floor <= 1.0 and all(floor >= cap.welch_bound(k, d, t) for t in range(1, 5))
    assert floor >= cap.orthoplex_bound(k, d)


@settings(max_examples=examples(30))
@given(k=st.integers(2, 60), d=st.integers(1, 12), seed=_seed())
def test_every_packing_respects_the_coherence_floor(k, d, seed):
    """No k unit vectors in R^d beat the Welch/orthoplex floor: a random packing's max|cos| is above it."""
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((k, d)))
    stats = rf.pairwise_cosine_stats(x, bins=1, backend="torch", progress=False)
    assert max(abs(stats.min), abs(stats.max)) >= cap.coherence_floor(k, d) - 1e-12


@settings(max_examples=examples(50))
@given(eps=epsilons, eps2=epsilons)
def test_model_class_is_monotone_in_epsilon(eps, eps2):
    rank = {2: 0, "borderline": 1, 1: 2}  # class 2 (near-orthogonal) < borderline < class 1
    eps, eps2 = sorted((eps, eps2))
    assert rank[cap.model_class(eps)] <= rank[cap.model_class(eps2)]


# --- 6. the sweep file under random interruption ---------------------------------------------------

SWEEP = dict(ks=[5, 8, 11], ds=[2, 3], steps=3, seed=4, progress=False)
_UNINTERRUPTED = {}


def _uninterrupted(suffix):
    """The file and records of an uninterrupted sweep (once per format)."""
    if suffix not in _UNINTERRUPTED:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, f"full{suffix}")
            cells = packing.sweep(out=out, **SWEEP)
            with open(out, "rb") as f:
                _UNINTERRUPTED[suffix] = (f.read(), cells)
    return _UNINTERRUPTED[suffix]


class _Interrupt:
    """Raises KeyboardInterrupt at the n-th call of a sweep's step: before or after an `optimize`
    (a kill while a cell runs), or while a cell's file is written (the temporary file torn
    halfway; the rename never happens)."""

    def __init__(self, where, n):
        self.where, self.n, self.calls = where, n, 0
        self.real_optimize, self.real_write = packing.optimize, packing.write_cells

    def _tick(self):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt(f"{self.where} #{self.n}")

    def optimize(self, *args, **kwargs):
        if self.where == "optimize:before":
            self._tick()
        result = self.real_optimize(*args, **kwargs)
        if self.where == "optimize:after":
            self._tick()
        return result

    def write_cells(self, path, cells):
        if self.where == "write" and self.calls + 1 == self.n:
            with tempfile.TemporaryDirectory() as tmp:
                whole = os.path.join(tmp, os.path.basename(path))
                self.real_write(whole, cells)
                with open(whole, "rb") as f:
                    data = f.read()
            with open(f"{path}.tmp-{os.getpid()}", "wb") as f:
                f.write(data[: len(data) // 2])
        if self.where == "write":
            self._tick()
        self.real_write(path, cells)


@settings(max_examples=examples(15))
@given(suffix=st.sampled_from([".json", ".csv"]),
       kills=st.lists(st.tuples(st.sampled_from(["optimize:before", "optimize:after", "write"]), st.integers(1, 6)),
                      min_size=1, max_size=4))
def test_sweep_file_survives_random_interruption(suffix, kills):
    """Killed at random points (KeyboardInterrupt) and resumed each time, the sweep ends with the
    uninterrupted run's file, byte for byte; between kills the file is always a whole sweep file
    whose cells are the uninterrupted run's; a resume runs only the cells not on disk."""
    want_bytes, want_cells = _uninterrupted(suffix)
    by_cell = {(c["k"], c["d"]): c for c in want_cells}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"sweep{suffix}")
        for where, n in kills:
            kill = _Interrupt(where, n)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(packing, "optimize", kill.optimize)
                mp.setattr(packing, "write_cells", kill.write_cells)
                try:
                    packing.sweep(out=out, **SWEEP)
                except KeyboardInterrupt:
                    pass
            on_disk = packing.load_cells(out) if os.path.exists(out) else []
            assert all(by_cell[(c["k"], c["d"])] == c for c in on_disk)
            assert len({(c["k"], c["d"]) for c in on_disk}) == len(on_disk)
        before = {(c["k"], c["d"]) for c in (packing.load_cells(out) if os.path.exists(out) else [])}
        ran = []
        cells = packing.sweep(out=out, on_cell=ran.append, **SWEEP)
        assert {(c["k"], c["d"]) for c in ran} == set(by_cell) - before
        with open(out, "rb") as f:
            assert f.read() == want_bytes
        assert cells == want_cells
        json.dumps(cells)


# --- 7. loader round trips ------------------------------------------------------------------------------

_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def _same_bits(got, want):
    return got.dtype == want.dtype and got.shape == want.shape and \
        torch.equal(got.contiguous().view(_INT_VIEW[got.dtype]), want.contiguous().view(_INT_VIEW[want.dtype]))


@st.composite
def stored_matrices(draw, dtypes=ALL_DTYPES):
    """A random matrix of every bit pattern its dtype has (NaN payloads, ±0, ±inf, subnormals):
    loaders must return the stored bytes."""
    dtype = draw(st.sampled_from(dtypes))
    v, d = draw(st.integers(1, 40)), draw(st.integers(1, 16))
    bits = np.random.default_rng(draw(_seed())).integers(0, 256, size=v * d * torch.finfo(dtype).bits // 8,
                                                       dtype=np.uint8)
    t = torch.from_numpy(bits).view(dtype).reshape(v, d).clone()
    if draw(st.booleans()):  # ordinary values, too
        t = torch.from_numpy(np.random.default_rng(draw(_seed())).standard_normal((v, d))).to(dtype)
    return t


def _write(path_dir, fmt, tensors):
    """Writes `tensors` ({name: tensor}) in format fmt; returns the path."""
    from safetensors.torch import save_file

    if fmt == "npy":
        path = os.path.join(path_dir, "m.npy")
        np.save(path, next(iter(tensors.values())).numpy())
    elif fmt == "pt-tensor":
        path = os.path.join(path_dir, "m.pt")
        torch.save(next(iter(tensors.values())), path)
    elif fmt in ("pt", "bin"):
        path = os.path.join(path_dir, f"m.{'pt' if fmt == 'pt' else 'bin'}")
        torch.save(tensors, path)
    else:
        path = os.path.join(path_dir, "m.safetensors")
        save_file(tensors, path)
    return path


@settings(max_examples=examples(40))
@given(m=stored_matrices(), fmt=st.sampled_from(["npy", "pt-tensor", "pt", "safetensors"]), data=st.data())
def test_a_single_matrix_loads_back_bitwise(m, fmt, data):
    assume(fmt != "npy" or m.dtype != torch.bfloat16)  # numpy has no bfloat16
    name = "model.embed_tokens.weight" if fmt == "safetensors" else "weight"  # a bare safetensors needs a known name
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, fmt, {name: m})
        emb = load_embeddings(path)
        assert _same_bits(emb.input, m) and emb.output is None and emb.vocab_rows == m.shape[0]
        if m.shape[0] >= 2:
            n = data.draw(st.integers(2, m.shape[0]), label="n_rows")
            assert _same_bits(load_embeddings(path, n_rows=n).input, m[:n])


@settings(max_examples=examples(20))
@given(e=stored_matrices(), u_seed=_seed(), tied=st.booleans(), fmt=st.sampled_from(["safetensors", "pt", "bin"]),
       arch=st.sampled_from([("model.embed_tokens.weight", "lm_head.weight"),
                             ("transformer.wte.weight", "lm_head.weight"),
                             ("gpt_neox.embed_in.weight", "embed_out.weight")]))
def test_an_embedding_and_unembedding_load_back_bitwise(e, u_seed, tied, fmt, arch):
    """A checkpoint with an input embedding and an unembedding (architecture inferred from the
    names, no config.json): both come back bitwise, and an lm_head equal to the embedding is tied."""
    u = e.clone() if tied else torch.from_numpy(
        np.random.default_rng(u_seed).standard_normal(tuple(e.shape))).to(e.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, fmt, {arch[0]: e, arch[1]: u})
        emb = load_embeddings(path, which="both")
        assert _same_bits(emb.input, e) and _same_bits(emb.output, u)
        assert emb.input_name == arch[0] and emb.output_name == arch[1]
        if not _same_bits(e, u):
            assert emb.tied is False
        elif bool(torch.isfinite(e).all()):
            assert emb.tied is True and emb.output is emb.input
        if fmt == "safetensors":
            assert _same_bits(load_embeddings(path, which="output").output, u)
