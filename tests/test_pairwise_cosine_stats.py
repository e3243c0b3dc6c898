"""pairwise_cosine_stats (and cosine_moments, epsilon) on every backend and device against the
float64 reference: odd sizes, every dtype, histograms, extreme norms, the real MiniLM matrix."""

import math

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast.ops import pairwise_cosine_stats as op
from repcap_fast.reference import histogram_bins

from _helpers import (
    DTYPES,
    INTERPRETING,
    assert_matches,
    cosines64,
    cpu_backends,
    device_backends,
    extra_peak_bytes,
    gpu_backend_built,
    kernel_dtype,
    near_edge,
    random_matrix,
    tf32_operands64,
)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", [2, 97, 1023, 1025])
@pytest.mark.parametrize("d", [1, 3, 64, 384])
def test_self_pairs_match_reference(device, backend, dtype, v, d):
    if device == "cpu" and backend == "triton" and dtype != torch.float32 and v > 1000 and d > 64:
        pytest.skip("interpreter time: 16-bit Triton covered at the smaller sizes")
    gpu_backend_built(backend)
    a = random_matrix(v, d, dtype)
    stats = rf.pairwise_cosine_stats(a.to(device), backend=backend)
    assert stats.backend == backend
    assert stats.count == v * (v - 1) // 2
    assert_matches(stats, cosines64(a), dtype=kernel_dtype(backend, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_many_tiles_on_gpu(backend, dtype):
    gpu_backend_built(backend)
    a = random_matrix(3000, 129, dtype)
    assert_matches(rf.pairwise_cosine_stats(a.cuda(), backend=backend), cosines64(a), dtype=dtype)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,d", [(1, 1, 5), (97, 1, 64), (1023, 130, 33), (65, 1025, 384)])
def test_rectangular_a_by_b(device, backend, dtype, m, n, d):
    a = random_matrix(m, d, dtype, seed=1)
    b = random_matrix(n, d, dtype, seed=2)
    stats = rf.pairwise_cosine_stats(a.to(device), b.to(device), backend=backend)
    assert stats.count == m * n and stats.shape_b == (n, d)
    assert_matches(stats, cosines64(a, b), dtype=kernel_dtype(backend, dtype))


def spy_on_grouped_launches(monkeypatch, tk) -> list:
    """Records the `tma` flag of each launch of the grouped kernel (whether it read through TMA)."""
    launches = []
    launch = tk._launch_grouped

    def recorded(*args, tma=False, **kwargs):
        launches.append(tma)
        return launch(*args, tma=tma, **kwargs)

    monkeypatch.setattr(tk, "_launch_grouped", recorded)
    return launches


def test_tma_needs_rows_of_16_bytes_at_aligned_addresses():
    """TMA descriptors read rows of a multiple of 16 bytes from 16-byte aligned addresses only: a
    view 4 bytes into its storage, or rows of 33 float32, fall back to the grouped kernel's loads."""
    pytest.importorskip("triton")
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    def ops(a, b=None):
        return tk.KernelOperands(a, a, None, b, b, None, False, a.dtype)

    storage = torch.zeros(1 + 64 * 32)
    aligned, shifted = storage[:-1].view(64, 32), storage[1:].view(64, 32)
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 4
    assert tk.tma_applies(ops(aligned), interp=True)
    assert not tk.tma_applies(ops(shifted), interp=True)
    assert not tk.tma_applies(ops(aligned, shifted), interp=True)
    assert not tk.tma_applies(ops(torch.zeros(64, 33)), interp=True)
    assert tk.tma_applies(ops(torch.zeros(64, 8, dtype=torch.bfloat16)), interp=True)


@pytest.mark.parametrize("device,backend", device_backends(cpu=["triton"], gpu=["triton"]))
@pytest.mark.parametrize("variant", ["grouped", "grouped_tma"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [256, 8])
@pytest.mark.parametrize("shape", [(300, None, 24), (97, 1, 64), (130, 259, 33)], ids=["self", "one-col", "rect"])
def test_triton_grouped_variant_matches_the_reference(monkeypatch, device, backend, variant, dtype, window, shape):
    """The grouped Triton kernel (super-tile order, per-tile partials, windowed histogram; window 8
    drives the pairs beyond the window through their own atomics), with pointer loads or TMA
    descriptors (grouped_tma; rows of 33 elements are not a multiple of 16 bytes, so that shape
    runs without), against float64; under the interpreter its integer counts, min and max are the
    strided kernel's, bitwise (the same tiles, so the same cosines)."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    m, n, d = shape
    a = random_matrix(m, d, dtype, seed=3)
    b = None if n is None else random_matrix(n, d, dtype, seed=4)
    monkeypatch.setattr(tk, "WINDOW", window)
    monkeypatch.setenv(tk.KERNEL_ENV, variant)
    launches = spy_on_grouped_launches(monkeypatch, tk)
    got = rf.pairwise_cosine_stats(a.to(device), None if b is None else b.to(device), backend=backend,
                                   bins=1000, range=(-0.6, 0.7))
    assert_matches(got, cosines64(a, b), dtype=dtype, bins=1000, lo=-0.6, hi=0.7)
    if device == "cpu":
        assert launches == [variant == "grouped_tma" and d * a.element_size() % 16 == 0]
        monkeypatch.setenv(tk.KERNEL_ENV, "strided")
        strided = rf.pairwise_cosine_stats(a, b, backend=backend, bins=1000, range=(-0.6, 0.7))
        assert torch.equal(got.hist, strided.hist) and (got.below, got.above) == (strided.below, strided.above)
        assert (got.min, got.max) == (strided.min, strided.max)
        monkeypatch.setenv(tk.KERNEL_ENV, variant)
        again = rf.pairwise_cosine_stats(a, b, backend=backend, bins=1000, range=(-0.6, 0.7))
        assert (again.sum, again.sum_sq) == (got.sum, got.sum_sq)  # bitwise repeatable


@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sigma_of_concentrated_cosines_keeps_float64_sums(monkeypatch, device, backend, dtype):
    """σ ≪ μ (μ ≈ 0.999, σ ≈ 1.6e-4): σ² = Σc²/n − μ² cancels 4e7-fold, so a float32 sum anywhere in
    Σc² would move σ by ~1e-5; every kernel sums the float32 cosines in float64, so σ holds to the
    float32 cosines' own error. (Half-precision inputs: float32 inputs at "highest" take μ and σ
    from the float64 Gram identity. The grouped Triton kernel once summed each tile in float32:
    Δσ = 1.2e-5 here; Hypothesis found it at 7 rows with σ = 0.017, Δσ = 2.7e-6.)"""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    x = near_duplicates(400, 32, seed=5, noise=0.03).to(dtype)
    c = cosines64(x)
    assert float(c.std()) < 1e-3 * float(c.mean())
    for variant in ("strided", "grouped", "grouped_tma") if backend == "triton" else (None,):
        if variant is not None:
            monkeypatch.setenv(tk.KERNEL_ENV, variant)
        s = rf.pairwise_cosine_stats(x.to(device), backend=backend, bins=64, range=(0.9, 1.0))
        assert s.mean == pytest.approx(float(c.mean()), abs=1e-7), variant
        assert s.std == pytest.approx(float(c.std(unbiased=False)), abs=1e-7), variant


@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True))
def test_float32_highest_takes_mean_and_std_from_the_gram_identity(device, backend):
    """float32 inputs at "highest": Σc, Σc², μ and σ are cosine_moments' (float64 Gram identity),
    min, max and the histogram the pass's; "tf32" and 16-bit inputs keep the pass's own sums."""
    gpu_backend_built(backend)
    a = random_matrix(300, 24, torch.float32)
    b = random_matrix(50, 24, torch.float32, seed=2)
    for args in ((a,), (a, b)):
        exact = rf.cosine_moments(*args)
        got = rf.pairwise_cosine_stats(*(x.to(device) for x in args), backend=backend)
        rel = 0.0 if device == "cpu" else 1e-12  # the GPU forms the d×d Grams in another order
        assert got.sum == pytest.approx(exact.sum, rel=rel, abs=1e-12)
        assert got.sum_sq == pytest.approx(exact.sum_sq, rel=rel)
        assert (got.mean, got.std) == (pytest.approx(exact.mean, rel=rel, abs=1e-15), pytest.approx(exact.std, rel=rel))
        assert got.settings["compute"].startswith("mean and std from the float64 Gram identity")
        assert_matches(got, cosines64(*args), dtype=torch.float32)
    assert rf.pairwise_cosine_stats(a.bfloat16().to(device), backend=backend).settings["compute"] == \
        "float32 dot products, float64 sums"


# --- the split pass: float32 at "highest" from three float16 products ------------------------------

SPLIT_COSINE_TOL = 1e-6  # the bound on min, max and each cosine of float32 inputs at "highest"


def near_duplicates(v, d, seed=0, noise=0.1):
    """Rows scattered around one direction: cosines ≈ 1/(1 + noise²) (0.99 at noise 0.1), where a
    float32 accumulator's ulp is largest."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, d, generator=g) + noise * torch.randn(v, d, generator=g)


def split_cosines(x, y=None, block_k=32, group_steps=8):
    """The split pass emulated on the CPU, in the kernel's order: per step of `block_k` columns the
    three products of the float16 parts (exact: 11 × 11 bits) are summed exactly (float64) and each
    added to a fresh float32 accumulator, rounded to nearest; the steps are summed in float32 in
    groups of `group_steps`, and the groups into the dots. The sums do not depend on the BLAS's
    blocking (a float32 matmul's did: 1.15e-6 on one CPU, under 1e-6 on another)."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    def parts(m):
        h, lo, inv = tk.split_operand(m, (1.0 / m.double().norm(dim=1)).float())
        assert h.dtype == lo.dtype == torch.float16 and torch.all(inv == 2.0**-15)
        return h.float(), lo.float()

    hx, lx = parts(x)
    hy, ly = (hx, lx) if y is None else parts(y)
    d = hx.shape[1]
    dots = torch.zeros(hx.shape[0], hy.shape[0], dtype=torch.float32)
    for g0 in range(0, d, block_k * group_steps):
        group = torch.zeros_like(dots)
        for k0 in range(g0, min(g0 + block_k * group_steps, d), block_k):
            cols = slice(k0, k0 + block_k)
            step = (lx[:, cols].double() @ hy[:, cols].double().T).float()
            step = (step.double() + hx[:, cols].double() @ ly[:, cols].double().T).float()
            step = (step.double() + hx[:, cols].double() @ hy[:, cols].double().T).float()
            group += step
        dots += group
    c = dots.double() * 2.0**-30
    if y is None:
        iu = torch.triu_indices(x.shape[0], x.shape[0], 1)
        return c[iu[0], iu[1]]
    return c.reshape(-1)


def test_split_operand_keeps_22_bits_of_each_unit_row():
    """y = x̂·2^15 = h + l to 2^-22·|y| (or 2^-25 absolute, float16's subnormal half-spacing), with
    |h| ≤ 2^15: rows with huge, tiny, zero and ±1 elements, and float16's subnormal range."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 300, generator=g) * torch.logspace(-12, 12, 300).float()[torch.randperm(300, generator=g)]
    x[0] = 0.0
    x[0, 7] = -4.0  # a unit row -e_7 (inverse norm 1/4, exact): y = -2^15 exactly
    x[1, :] = 1e-9
    x[1, 0] = 1.0  # one large element among tiny ones (parts far below float16's normals)
    inv = (1.0 / x.double().norm(dim=1)).float()
    h, lo, scale = tk.split_operand(x, inv, chunk_bytes=8 * 300 * 5)  # chunks of 5 rows
    assert h.dtype == lo.dtype == torch.float16 and torch.isfinite(h).all() and torch.isfinite(lo).all()
    y = x.double() * inv.double()[:, None] * 2.0**15
    err = (y - h.double() - lo.double()).abs()
    assert torch.all(err <= 2.0**-22 * y.abs() + 2.0**-25), float((err / y.abs().clamp_min(1e-300)).max())
    assert h.double().abs().max() <= 2.0**15 and float(h[0, 7]) == -(2.0**15) and float(lo[0, 7]) == 0.0
    assert torch.all(scale == 2.0**-15)


@pytest.mark.parametrize("case", ["random-384", "near-duplicates-384", "near-duplicates-4096", "rect-1000"])
def test_split_products_emulated_hold_each_cosine_to_1e6(case):
    """Every cosine of the split pass, emulated (the parts' products exact in float32, float32 sums),
    within 1e-6 of float64: on random rows, and on near-duplicates (cosines to 0.99) at d = 4096."""
    kind, d = case.rsplit("-", 1)
    d = int(d)
    if kind == "random":
        x, y = random_matrix(600, d, torch.float32), None
    elif kind == "rect":
        x, y = random_matrix(200, d, torch.float32, seed=1), near_duplicates(300, d, seed=2)
    else:
        x, y = near_duplicates(300 if d == 4096 else 600, d), None
    c64 = cosines64(x, y)
    err = (split_cosines(x, y) - c64).abs()
    assert float(err.max()) <= SPLIT_COSINE_TOL, float(err.max())
    if kind == "near-duplicates":
        assert float(c64.max()) > 0.98  # the case it stands for


@pytest.mark.slow
def test_split_products_emulated_on_minilm_rows(minilm_embeddings):
    """The same bound on 1500 real MiniLM rows across the vocabulary."""
    e = minilm_embeddings[::15][:1500].float()
    err = (split_cosines(e) - cosines64(e)).abs()
    assert float(err.max()) <= SPLIT_COSINE_TOL, float(err.max())


@pytest.mark.parametrize("device,backend", device_backends(cpu=["triton"], gpu=["triton"]))
@pytest.mark.parametrize("variant", ["strided", "grouped", "grouped_tma"])
@pytest.mark.parametrize("case", ["random", "near-duplicates", "rect"])
def test_triton_split_pass_holds_float32_bounds(monkeypatch, device, backend, variant, case):
    """float32 at "highest" on Triton (the split pass, the default): min and max within 1e-6 of
    float64, μ and σ within 1e-9 (the Gram identity), and a pair changes bin only within 1e-6 of an
    edge, on the full range and on a fine histogram over the top of the near-duplicates' range."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    monkeypatch.delenv(tk.FP32_PASS_ENV, raising=False)
    monkeypatch.setenv(tk.KERNEL_ENV, variant)
    d = 96
    if case == "random":
        x, y = random_matrix(260, d, torch.float32, seed=5), None
    elif case == "near-duplicates":
        x, y = near_duplicates(260, d, seed=6, noise=0.05), None
    else:
        x, y = random_matrix(70, d, torch.float32, seed=7), near_duplicates(150, d, seed=8)
    c = cosines64(x, y)
    for bins, (lo, hi) in ((4096, (-1.0, 1.0)), (20000, (float(c.quantile(0.2)), float(c.max())))):
        s = rf.pairwise_cosine_stats(x.to(device), None if y is None else y.to(device), backend=backend, bins=bins,
                                     range=(lo, hi))
        assert "split float16 parts" in s.settings["compute"]
        assert abs(s.min - float(c.min())) <= SPLIT_COSINE_TOL and abs(s.max - float(c.max())) <= SPLIT_COSINE_TOL
        assert s.mean == pytest.approx(float(c.mean()), abs=1e-9)
        assert s.std == pytest.approx(float(c.std(unbiased=False)), abs=1e-9)
        ref_hist, ref_below, ref_above = histogram_bins(c, bins, lo, hi)
        moved = int((s.hist - ref_hist).abs().sum()) + abs(s.below - ref_below) + abs(s.above - ref_above)
        assert moved <= 2 * near_edge(c, bins, lo, hi, SPLIT_COSINE_TOL), moved


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["strided", "grouped", "grouped_tma"])
def test_triton_split_pass_on_a_gpu_at_d_4096(monkeypatch, variant):
    """The split pass on the tensor cores, at d = 4096 on near-duplicates (cosines to 0.99): the
    fresh accumulator per BLOCK_K keeps min and max within 1e-6 even if the tensor cores truncate."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    gpu_backend_built("triton")
    monkeypatch.delenv(tk.FP32_PASS_ENV, raising=False)
    monkeypatch.setenv(tk.KERNEL_ENV, variant)
    x = near_duplicates(2048, 4096, seed=9)
    c = cosines64(x)
    s = rf.pairwise_cosine_stats(x.cuda(), backend="triton")
    assert abs(s.min - float(c.min())) <= SPLIT_COSINE_TOL and abs(s.max - float(c.max())) <= SPLIT_COSINE_TOL
    ref_hist, _, _ = histogram_bins(c, 4096, -1.0, 1.0)
    assert int((s.hist - ref_hist).abs().sum()) <= 2 * near_edge(c, 4096, -1.0, 1.0, SPLIT_COSINE_TOL)


def test_triton_fp32_pass_is_chosen_by_name(monkeypatch):
    """REPCAP_TRITON_STATS_FP32_PASS: "split" by default, "ieee" selectable (and what the
    statistics say they used), anything else refused by name."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    monkeypatch.delenv(tk.FP32_PASS_ENV, raising=False)
    assert tk.fp32_pass() == "split"
    monkeypatch.setenv(tk.FP32_PASS_ENV, "ieee")
    assert tk.fp32_pass() == "ieee"
    assert not tk.kernel_operands(torch.ones(3, 2), torch.ones(3), None, None, "highest").split
    monkeypatch.setenv(tk.FP32_PASS_ENV, "split")
    assert tk.kernel_operands(torch.ones(3, 2), torch.ones(3), None, None, "highest").split
    assert not tk.kernel_operands(torch.ones(3, 2), torch.ones(3), None, None, "tf32").split
    assert not tk.kernel_operands(torch.ones(3, 2).bfloat16(), torch.ones(3), None, None, "highest").split
    monkeypatch.setenv(tk.FP32_PASS_ENV, "bf16x3")
    with pytest.raises(ValueError, match="REPCAP_TRITON_STATS_FP32_PASS must be one of"):
        tk.fp32_pass()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bins", [4096, 65536], ids=["shared-hist", "global-hist"])
def test_cuda_panels_variant_matches_the_reference(monkeypatch, dtype, bins):
    """REPCAP_CUDA_STATS_KERNEL=panels: cuBLAS panels of 8192 x 8192 dot products and the
    reduction kernel. 9000 rows make a diagonal panel, an off-diagonal one and a second diagonal
    one of 808 rows; B of 8300 rows two column panels."""
    gpu_backend_built("cuda")
    monkeypatch.setenv("REPCAP_CUDA_STATS_KERNEL", "panels")
    a = random_matrix(9000, 64, dtype)
    stats = rf.pairwise_cosine_stats(a.cuda(), backend="cuda", bins=bins)
    assert_matches(stats, cosines64(a), dtype=dtype, bins=bins)
    again = rf.pairwise_cosine_stats(a.cuda(), backend="cuda", bins=bins)
    assert (again.sum, again.sum_sq, again.min, again.max) == (stats.sum, stats.sum_sq, stats.min, stats.max)
    assert torch.equal(again.hist, stats.hist)
    b = random_matrix(8300, 64, dtype, seed=5)
    rect = rf.pairwise_cosine_stats(a[:100].cuda(), b.cuda(), backend="cuda", bins=bins, range=(-0.3, 0.4))
    assert_matches(rect, cosines64(a[:100], b), dtype=dtype, bins=bins, lo=-0.3, hi=0.4)
    monkeypatch.setenv("REPCAP_CUDA_STATS_KERNEL", "fastest")
    with pytest.raises(RuntimeError, match="REPCAP_CUDA_STATS_KERNEL must be auto, tiles or panels"):
        rf.pairwise_cosine_stats(a[:10].cuda(), backend="cuda")


@pytest.mark.parametrize("self_pairs", [True, False])
@pytest.mark.parametrize("rows,cols,group", [(1, 1, 2), (7, 7, 2), (9, 13, 4), (40, 40, 16), (3, 50, 16)])
def test_grouped_tile_order_is_a_permutation_in_super_tiles(self_pairs, rows, cols, group):
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    if self_pairs:
        cols = rows
    order = tk._grouped_order_cpu(rows, cols, self_pairs, group)
    tiles = [tuple(t) for t in order.tolist()]
    want = {(i, j) for i in range(rows) for j in range(cols) if not self_pairs or i <= j}
    assert len(tiles) == len(want) and set(tiles) == want
    supers = [(i // group, j // group) for i, j in tiles]
    # each super-tile's tiles are consecutive, and super-tiles come row-major
    runs = [s for k, s in enumerate(supers) if k == 0 or s != supers[k - 1]]
    assert len(runs) == len(set(supers)) and runs == sorted(runs)


def test_triton_kernel_variant_is_chosen_by_name(monkeypatch):
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    monkeypatch.delenv(tk.KERNEL_ENV, raising=False)
    assert tk.kernel_variant(torch.bfloat16, 896) in tk.KERNEL_VARIANTS  # the measured table's (test_kernel_choices)
    for variant in ("strided", "grouped", "grouped_tma"):
        monkeypatch.setenv(tk.KERNEL_ENV, variant)
        assert tk.kernel_variant(torch.float32, 896) == variant
    monkeypatch.setenv(tk.KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match="REPCAP_TRITON_STATS_KERNEL must be 'auto' or one of"):
        tk.kernel_variant(torch.float32, 896)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("bins,value_range", [(100, (-0.2, 0.25)), (1, (-0.3, 0.35)), (37, (-0.23, 0.31)),
                                              (20000, (-0.3, 0.35))])
def test_narrow_range_counts_outside_never_drops(device, backend, bins, value_range):
    a = random_matrix(300, 16, torch.float32)
    stats = rf.pairwise_cosine_stats(a.to(device), bins=bins, range=value_range, backend=backend)
    c = cosines64(a)
    lo, hi = value_range
    assert stats.below == int((c < lo).sum()) and stats.above == int((c > hi).sum())
    assert stats.below > 0 and stats.above > 0
    assert_matches(stats, c, dtype=torch.float32, bins=bins, lo=lo, hi=hi)


@pytest.mark.parametrize("device,backend", device_backends())
def test_histogram_exact_at_bin_centres(device, backend):
    # Cosines placed at bin centres: no rounding can move them, the histogram is exact.
    bins = 64
    centres = -1 + (np.arange(bins) + 0.5) * (2 / bins)
    picks = np.repeat(centres, np.arange(bins) % 5 + 1)
    b = torch.tensor(np.stack([picks, np.sqrt(1 - picks**2)], 1), dtype=torch.float32)
    a = torch.tensor([[1.0, 0.0]])
    stats = rf.pairwise_cosine_stats(a.to(device), b.to(device), bins=bins, backend=backend)
    assert stats.hist.tolist() == (np.arange(bins) % 5 + 1).tolist()


@pytest.mark.parametrize("device,backend", device_backends())
def test_bitwise_repeatable(device, backend):
    a = random_matrix(300 if (device, backend) == ("cpu", "triton") else 2500, 64, torch.bfloat16).to(device)
    first = rf.pairwise_cosine_stats(a, backend=backend).to_dict()
    second = rf.pairwise_cosine_stats(a, backend=backend).to_dict()
    assert first == second


def test_cpu_kernel_is_independent_of_thread_count():
    a = random_matrix(1500, 48, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rf.pairwise_cosine_stats(a, backend="cpu")
        torch.set_num_threads(max(2, threads))  # never one thread twice (OMP_NUM_THREADS=1)
        many = rf.pairwise_cosine_stats(a, backend="cpu")
    finally:
        torch.set_num_threads(threads)
    # Σc and Σc² are merged per tile row in a fixed order; BLAS may round tile GEMMs differently
    # with another thread count, so compare to float32 rounding of the dot products.
    assert one.count == many.count
    assert one.mean == pytest.approx(many.mean, abs=1e-7)
    assert int((one.hist - many.hist).abs().sum()) <= 2 * near_edge(cosines64(a), 4096, -1, 1, 1e-6)


@pytest.mark.parametrize("device,backend", device_backends())
def test_job_plan_spans_many_groups(device, backend, monkeypatch):
    # More rows than one job group: the upper triangle is cut into diagonal and off-diagonal jobs.
    monkeypatch.setitem(op._JOB_ROWS, device, 100)
    a = random_matrix(1025, 24, torch.float32)
    assert len(op._job_plan(1025, torch.device(device))[1]) == 11 * 12 // 2
    assert_matches(rf.pairwise_cosine_stats(a.to(device), backend=backend), cosines64(a),
                   dtype=kernel_dtype(backend, torch.float32))
    b = random_matrix(37, 24, torch.float32, seed=9)
    assert_matches(rf.pairwise_cosine_stats(a.to(device), b.to(device), backend=backend), cosines64(a, b),
                   dtype=kernel_dtype(backend, torch.float32))


@pytest.mark.parametrize("device,backend", device_backends())
def test_mixed_dtypes_meet_in_float32(device, backend):
    a = random_matrix(300, 24, torch.bfloat16)
    b = random_matrix(77, 24, torch.float32, seed=4)
    s = rf.pairwise_cosine_stats(a.to(device), b.to(device), backend=backend)
    assert_matches(s, cosines64(a, b), dtype=torch.float32)


def test_numpy_input_and_float64_input():
    a = random_matrix(200, 10, torch.float64)
    s_np = rf.pairwise_cosine_stats(a.numpy(), backend="cpu")
    s_t = rf.pairwise_cosine_stats(a, backend="cpu")
    assert s_np.to_dict() == s_t.to_dict()
    exact = rf.pairwise_cosine_stats(a, backend="torch")
    c = cosines64(a)
    assert exact.mean == pytest.approx(float(c.mean()), abs=1e-13)


def test_n_rows_restricts_to_leading_rows():
    a = random_matrix(500, 20, torch.float32)
    padded = torch.cat([a, torch.zeros(12, 20)])  # padded vocabulary rows
    s = rf.pairwise_cosine_stats(padded, n_rows=500, backend="cpu")
    assert s.to_dict() | {"settings": None} == rf.pairwise_cosine_stats(a, backend="cpu").to_dict() | {"settings": None}


def test_zero_rows_drop_reports_count():
    a = random_matrix(300, 20, torch.float32)
    a[[3, 77, 150]] = 0
    s = rf.pairwise_cosine_stats(a, zero_rows="drop", backend="cpu")
    keep = torch.ones(300, dtype=torch.bool)
    keep[[3, 77, 150]] = False
    assert s.dropped_rows_a == 3 and s.count == 297 * 296 // 2
    assert_matches(s, cosines64(a[keep]), dtype=torch.float32)
    m = rf.cosine_moments(a, zero_rows="drop")
    assert m.dropped_rows_a == 3 and m.mean == pytest.approx(s.mean, abs=1e-6)


@pytest.mark.parametrize("device,backend", device_backends())
def test_extreme_norms_do_not_overflow_float32(device, backend):
    a = random_matrix(200, 32, torch.float32)
    a[:50] *= 1e30
    a[50:100] *= 1e-30
    assert_matches(rf.pairwise_cosine_stats(a.to(device), backend=backend), cosines64(a),
                   dtype=kernel_dtype(backend, torch.float32))


def test_quantile_and_tail_count_against_numpy():
    a = random_matrix(800, 16, torch.float32)
    s = rf.pairwise_cosine_stats(a, backend="cpu")
    c = cosines64(a).numpy()
    for q in (0.01, 0.5, 0.9, 0.999):
        assert abs(s.quantile(q) - np.quantile(c, q)) <= s.bin_width
    qs = s.quantile([0.1, 0.5])
    assert qs.shape == (2,)
    edge = float(s.edges[2500])
    assert abs(s.tail_count(edge) - int((c >= edge).sum())) <= near_edge(torch.from_numpy(c), 4096, -1, 1, 1e-5)
    assert s.tail_count(-1.0) == s.count
    assert s.quantile(0.0) == s.min and s.quantile(1.0) == s.max
    with pytest.raises(ValueError, match="q must be"):
        s.quantile(1.5)
    with pytest.raises(ValueError, match="t must lie"):
        s.tail_count(2.0)


def test_quantile_outside_range_raises():
    a = random_matrix(300, 8, torch.float32)
    s = rf.pairwise_cosine_stats(a, range=(-0.1, 0.1), backend="cpu")
    with pytest.raises(ValueError, match="outside the histogram range"):
        s.quantile(0.999)


def test_to_dict_is_json_ready_and_epsilon_takes_k_sigma():
    import json

    a = random_matrix(100, 8, torch.float32)
    c = cosines64(a)
    s = rf.pairwise_cosine_stats(a, backend="cpu")
    d = json.loads(json.dumps(s.to_dict()))
    assert d["count"] == c.numel() and len(d["hist"]) == 4096 and len(d["edges"]) == 4097
    assert d["epsilon"] == pytest.approx(float(c.mean() + 2 * c.std(unbiased=False)), abs=5e-6)
    assert s.epsilon(3.0) == pytest.approx(float(c.mean() + 3 * c.std(unbiased=False)), abs=5e-6)
    assert d["settings"]["precision"] == "highest" and d["backend"] == "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cosine_moments_gram_identity(dtype):
    a = random_matrix(517, 40, dtype)
    b = random_matrix(211, 40, dtype, seed=5)
    c = cosines64(a)
    m = rf.cosine_moments(a)
    assert m.count == c.numel()
    assert m.mean == pytest.approx(float(c.mean()), abs=1e-12)
    assert m.std == pytest.approx(float(c.std(unbiased=False)), abs=1e-12)
    cab = cosines64(a, b)
    mab = rf.cosine_moments(a, b)
    assert mab.mean == pytest.approx(float(cab.mean()), abs=1e-12)
    assert mab.std == pytest.approx(float(cab.std(unbiased=False)), abs=1e-12)


def test_epsilon_methods_agree():
    a = random_matrix(600, 30, torch.float32)
    e_gram = rf.epsilon(a)
    e_stream = rf.epsilon(a, method="stream", backend="cpu")
    assert e_gram == pytest.approx(e_stream, abs=5e-6)
    assert rf.epsilon(a, k_sigma=0) == pytest.approx(rf.cosine_moments(a).mean)
    with pytest.raises(ValueError, match="method"):
        rf.epsilon(a, method="pairs")


def test_opcheck_registered_op():
    a = random_matrix(70, 9, torch.float32)
    inv = (1 / a.double().norm(dim=1)).float()
    b = random_matrix(33, 9, torch.float32, seed=3)
    inv_b = (1 / b.double().norm(dim=1)).float()
    op_ = torch.ops.repcap_fast.pairwise_cosine_stats.default
    torch.library.opcheck(op_, (a, inv, None, None, 128, -1.0, 1.0, 0))
    torch.library.opcheck(op_, (a, inv, b, inv_b, 128, -1.0, 1.0, 0))


def test_op_rejects_an_unknown_precision_code():
    a = random_matrix(20, 4, torch.float32)
    inv = (1 / a.double().norm(dim=1)).float()
    with pytest.raises(RuntimeError, match="unknown precision code"):
        torch.ops.repcap_fast.pairwise_cosine_stats(a, inv, None, None, 8, -1.0, 1.0, 3)
    with pytest.raises(RuntimeError, match="precision bf16 is gram_offdiag_penalty's"):
        torch.ops.repcap_fast.pairwise_cosine_stats(a, inv, None, None, 8, -1.0, 1.0, 2)
    with pytest.raises(ValueError, match="precision must be one of"):
        rf.pairwise_cosine_stats(a, precision="high")
    with pytest.raises(ValueError, match="'bf16' is gram_offdiag_penalty's and the packing optimizer's only"):
        rf.pairwise_cosine_stats(a, precision="bf16")


# --- TF32 and the GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_tf32_error_is_bounded_and_highest_is_exact(backend):
    a = random_matrix(1500, 256, torch.float32)
    c = cosines64(a)
    s = rf.pairwise_cosine_stats(a.cuda(), backend=backend, precision="tf32")
    assert abs(s.mean - float(c.mean())) < 1e-4 and abs(s.std - float(c.std(unbiased=False))) < 1e-4
    assert_matches(rf.pairwise_cosine_stats(a.cuda(), backend=backend, precision="highest"), c,
                   dtype=torch.float32)


def tf32_cosines64(x, y=None, truncate=False):
    """The cosines the tensor cores form at "tf32", in float64: the rows rounded to TF32 to nearest
    (rounded64, the independent frexp reference; truncate: their low 13 bits dropped instead),
    scaled by the unrounded rows' inverse norms."""
    def parts(m):
        return tf32_operands64(m, truncate), 1.0 / m.double().norm(dim=1)

    rx, nx = parts(x)
    ry, ny = (rx, nx) if y is None else parts(y)
    c = (rx @ ry.T) * nx[:, None] * ny[None, :]
    if y is None:
        iu = torch.triu_indices(x.shape[0], x.shape[0], 1)
        return c[iu[0], iu[1]]
    return c.reshape(-1)


# float32 sums of the exact products of TF32 operands, rounded to nearest (d ≤ 4096): the
# interpreter and the CPU emulation, within TF32_SUM_TOL either way.
TF32_SUM_TOL = 1e-6
# On a GPU the tensor cores add each mma step's products after aligning them to the step's
# largest exponent and dropping the bits below (round toward zero), so every sum can only lose:
# bench/tf32_accumulation.py emulates that on the GPU test's input (d = 1024, cosines ≈ 0.99) at
# a bias of −1.0e-5 to −1.8e-5 (0 to 1 extra alignment bits), and the H200 measured −1.22e-5
# (cuda panels, Triton) and −1.62e-5 (cuda tiles) on 2026-12-04. One-sided: up to
# TF32_GPU_LOSS below the rounded-to-nearest model, at most TF32_SUM_TOL above it. (Operands
# truncated instead of rounded would be −7e-4.)
TF32_GPU_LOSS = 3e-5


def assert_tf32_statistics(s, c, tol=TF32_SUM_TOL, loss=None, bins=4096, lo=-1.0, hi=1.0):
    """min, max, Σc and Σc² of the pass against the float64 cosines c of TF32-rounded rows, and a
    pair in another bin only within tol of an edge; with loss (tensor cores), each may also fall
    below the model by up to loss (relative; Σc² by twice that), never more than tol above it.
    (Not σ: near-duplicates' σ comes from Σc²/n − μ² with μ ≈ 1, 4e4-fold cancellation.)"""
    below = tol if loss is None else loss

    def within(got, want, scale, squares=1):
        return -below * squares * scale <= got - want <= tol * scale

    assert within(s.min, float(c.min()), 1.0) and within(s.max, float(c.max()), 1.0), (s.min, s.max)
    assert within(s.sum, float(c.sum()), abs(float(c.sum()))), (s.sum, float(c.sum()))
    sum_sq = float((c * c).sum())
    assert within(s.sum_sq, sum_sq, sum_sq, squares=1 if loss is None else 2), (s.sum_sq, sum_sq)
    ref_hist, ref_below, ref_above = histogram_bins(c, bins, lo, hi)
    moved = int((s.hist - ref_hist).abs().sum()) + abs(s.below - ref_below) + abs(s.above - ref_above)
    assert moved <= 2 * near_edge(c, bins, lo, hi, max(tol, below)), moved


@pytest.mark.parametrize("variant", ["strided", "grouped", "grouped_tma"])
@pytest.mark.parametrize("case", ["near-duplicates", "rect"])
def test_triton_tf32_rounds_the_rows_to_nearest(monkeypatch, variant, case):
    """float32 at "tf32" on Triton: the launcher rounds the rows to TF32 to nearest, so the kernel's
    TF32 dots are exact products of rounded rows (under the interpreter tl.dot multiplies the
    float32 values as given: without the rounding it would return float32 cosines, which these
    near-duplicates put more than 1e-5 from the TF32 ones; truncated rows, what tensor cores
    make of raw float32 operands, more than 1e-4)."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    if not INTERPRETING:
        pytest.skip("the interpreter's float32 dots tell rounded rows from unrounded ones")
    monkeypatch.setenv(tk.KERNEL_ENV, variant)
    if case == "near-duplicates":
        x, y = near_duplicates(260, 96, seed=6, noise=0.05), None
    else:
        x, y = near_duplicates(70, 96, seed=8, noise=0.05), near_duplicates(150, 96, seed=8)  # one direction
    c = tf32_cosines64(x, y)
    # The case tells the three apart (by far more than the tolerance).
    assert abs(float(c.max()) - float(cosines64(x, y).max())) > 1e-5
    assert abs(float(c.max()) - float(tf32_cosines64(x, y, truncate=True).max())) > 1e-4
    s = rf.pairwise_cosine_stats(x, y, backend="triton", precision="tf32")
    assert s.settings["compute"] == "TF32 tensor-core dot products of the rows rounded to TF32 to nearest, float64 sums"
    assert_tf32_statistics(s, c)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda-panels", "triton", "triton-grouped", "triton-grouped_tma"])
def test_tf32_on_a_gpu_uses_rows_rounded_to_nearest(monkeypatch, backend):
    """Every GPU path at "tf32" forms the cosines of rows rounded to TF32 to nearest (the cuda tiles
    kernel with cvt.rna, the cuda panels and Triton from rounded copies), at d = 1024 on
    near-duplicates, where truncated operands would move every cosine by about -7e-4: within
    the one-sided band of tensor cores that truncate as they accumulate (TF32_GPU_LOSS)."""
    from repcap_fast.ops import pairwise_cosine_stats as stats_op

    name, _, variant = backend.partition("-")
    gpu_backend_built(name)
    if name == "cuda":
        monkeypatch.setenv(stats_op.CUDA_KERNEL_ENV, variant or "tiles")
    else:
        from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

        monkeypatch.setenv(tk.KERNEL_ENV, variant or "strided")
    x = near_duplicates(2048, 1024, seed=9)
    s = rf.pairwise_cosine_stats(x.cuda(), backend=name, precision="tf32")
    assert_tf32_statistics(s, tf32_cosines64(x), loss=TF32_GPU_LOSS)


@pytest.mark.gpu
def test_auto_on_gpu_tensors():
    a = random_matrix(300, 16, torch.float32).cuda()
    assert rf.pairwise_cosine_stats(a).backend == ("cuda" if rf.info()["built"]["cuda"] else "triton")
    with pytest.raises(RuntimeError, match="backend 'cpu' runs on CPU tensors"):
        rf.pairwise_cosine_stats(a, backend="cpu")


# --- the real model --------------------------------------------------------------------------------

@pytest.mark.slow
def test_minilm_cpu_matches_reference(minilm_embeddings, minilm_reference):
    e, ref = minilm_embeddings, minilm_reference
    s = rf.pairwise_cosine_stats(e, backend="cpu")
    v = e.shape[0]
    assert s.count == ref["count"] == v * (v - 1) // 2 == int(s.hist.sum())
    mean_ref = ref["sum"] / ref["count"]
    std_ref = math.sqrt(ref["sum_sq"] / ref["count"] - mean_ref**2)
    # Measured: |Δμ| 7e-12, |Δσ| 5e-11, |Δmin| 1e-8, |Δmax| 1.2e-7, 1.6e-5 of the pairs change bin.
    assert s.mean == pytest.approx(mean_ref, abs=1e-9)
    assert s.std == pytest.approx(std_ref, abs=1e-9)
    assert s.epsilon() == pytest.approx(mean_ref + 2 * std_ref, abs=3e-9)
    assert s.min == pytest.approx(ref["min"], abs=1e-6)
    assert s.max == pytest.approx(ref["max"], abs=1e-6)
    moved = int((s.hist - ref["hist"]).abs().sum())
    assert moved <= 3e-5 * s.count, moved
    # The exact Gram identity agrees with the stream.
    g = rf.cosine_moments(e)
    assert g.mean == pytest.approx(s.mean, abs=1e-9)
    assert g.std == pytest.approx(s.std, abs=1e-9)
    assert g.mean == pytest.approx(mean_ref, abs=1e-10)
    assert g.std == pytest.approx(std_ref, abs=1e-10)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "cuda-panels", "triton", "triton-grouped", "triton-grouped_tma"])
def test_minilm_gpu_matches_reference(minilm_embeddings, minilm_reference, backend, monkeypatch):
    if "-" in backend:  # the other kernel variants of each, by name
        backend, variant = backend.split("-")
        monkeypatch.setenv(f"REPCAP_{backend.upper()}_STATS_KERNEL", variant)
    gpu_backend_built(backend)
    e, ref = minilm_embeddings, minilm_reference
    mean_ref = ref["sum"] / ref["count"]
    g = rf.pairwise_cosine_stats(e.cuda(), backend=backend)
    assert g.count == ref["count"]
    assert g.mean == pytest.approx(mean_ref, abs=2e-7)
    assert g.std == pytest.approx(math.sqrt(ref["sum_sq"] / ref["count"] - mean_ref**2), abs=2e-7)
    assert int((g.hist - ref["hist"]).abs().sum()) <= 1e-3 * ref["count"]
    gb = rf.pairwise_cosine_stats(e.cuda().bfloat16(), backend=backend)
    assert gb.epsilon() == pytest.approx(g.epsilon(), abs=5e-3)  # bf16 rounding of the weights


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_minilm_subset_every_backend(minilm_embeddings, dtype):
    e = minilm_embeddings[::15][:1500].to(dtype)  # 1500 real rows across the vocabulary
    c = cosines64(e)
    for backend in cpu_backends():
        s = rf.pairwise_cosine_stats(e, backend=backend)
        assert_matches(s, c, dtype=kernel_dtype(backend, dtype))


# --- inputs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device,backend", device_backends())
def test_parameters_and_graph_tensors_are_accepted(device, backend):
    emb = torch.nn.Embedding(120, 16).to(device)
    s = rf.pairwise_cosine_stats(emb.weight, backend=backend)
    assert_matches(s, cosines64(emb.weight), dtype=kernel_dtype(backend, torch.float32))
    assert rf.cosine_moments(emb.weight * 2).mean == pytest.approx(s.mean, abs=1e-6)


def test_tail_count_keeps_duplicate_rows_in_the_closed_last_bin():
    a = random_matrix(50, 8, torch.float32)
    a[10] = a[3]
    a[20] = a[3]  # three identical rows: 3 pairs with c == 1
    s = rf.pairwise_cosine_stats(a, backend="cpu")
    assert s.max == 1.0 and int(s.hist[-1]) >= 3
    assert s.tail_count(1.0) == int(s.hist[-1]) >= 3
    assert s.tail_count(0.9999) == int(s.hist[-1])


def test_mixed_dtypes_with_extreme_norms():
    a = random_matrix(60, 12, torch.bfloat16)
    a[0] *= 1e20
    b = random_matrix(40, 12, torch.bfloat16, seed=3)
    s = rf.pairwise_cosine_stats(a, b, backend="cpu")
    assert_matches(s, cosines64(a, b), dtype=torch.float32)


@pytest.mark.parametrize("device,backend", device_backends())
def test_float64_values_beyond_float32(device, backend):
    a = random_matrix(80, 10, torch.float64)
    a[:20] *= 1e300
    s = rf.pairwise_cosine_stats(a.to(device), backend=backend)
    assert_matches(s, cosines64(a), dtype=kernel_dtype(backend, torch.float32))
    assert rf.cosine_moments(a).mean == pytest.approx(s.mean, abs=1e-6)


def test_n_rows_with_b_trims_both_sides_or_each():
    a = random_matrix(90, 8, torch.float32)
    b = random_matrix(70, 8, torch.float32, seed=6)
    both = rf.pairwise_cosine_stats(a, b, n_rows=50, backend="cpu")
    assert both.shape_a == (50, 8) and both.shape_b == (50, 8)
    assert_matches(both, cosines64(a[:50], b[:50]), dtype=torch.float32)
    each = rf.pairwise_cosine_stats(a, b, n_rows=(60, None), backend="cpu")
    assert each.shape_a == (60, 8) and each.shape_b == (70, 8)
    with pytest.raises(ValueError, match=r"n_rows must be in \[1, 70\]"):
        rf.pairwise_cosine_stats(a, b, n_rows=80)
    with pytest.raises(ValueError, match="n_rows as a pair"):
        rf.pairwise_cosine_stats(a, n_rows=(10, 10))


def test_bins_limit_comes_from_the_compiled_kernels():
    limit = rf.info()["limits"]["histogram_bins"]
    a = random_matrix(30, 4, torch.float32)
    with pytest.raises(ValueError, match=rf"bins must be an int in \[1, {limit}\]"):
        rf.pairwise_cosine_stats(a, bins=limit + 1, backend="cpu")
    # the float64 reference keeps a histogram in memory and has no such limit
    s = rf.pairwise_cosine_stats(a, bins=limit + 1, backend="torch")
    assert s.hist.numel() == limit + 1 and int(s.hist.sum()) == s.count


def test_peak_memory_is_linear_in_v():
    """V = 20,000: the V×V float32 cosines would take 1.5 GiB; the stream's extra peak memory
    (fresh process, VmHWM) must stay within O(V·d) plus the per-tile buffers (README Guarantees)."""
    extra = extra_peak_bytes("A = torch.randn(20000, 32)\nrf.pairwise_cosine_stats(A[:300], progress=False)",
                             "rf.pairwise_cosine_stats(A, progress=False)")
    assert extra < 64 << 20, f"extra peak memory {extra / 2**20:.0f} MiB"
