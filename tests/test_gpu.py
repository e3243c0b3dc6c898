"""GPU twins of the kernel tests: the cuda and triton backends on CUDA tensors against the
float64 reference. Skipped without a CUDA device; run by bench/gpu_suite.sh."""

import pytest
import torch

import repcap_fast as rf

from test_pairwise_cosine_stats import DTYPES, assert_matches, cosines64, random_matrix

pytestmark = pytest.mark.gpu


def gpu_backends():
    built = rf.info()["built"]
    return [b for b in ("cuda", "triton") if built[b]]


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v,d", [(2, 1), (97, 3), (1023, 64), (1025, 384), (3000, 129)])
def test_self_pairs_on_gpu(backend, dtype, v, d):
    if backend not in gpu_backends():
        pytest.fail(f"backend {backend} was not built on this GPU machine")
    a = random_matrix(v, d, dtype)
    stats = rf.pairwise_cosine_stats(a.cuda(), backend=backend)
    assert stats.backend == backend
    assert_matches(stats, cosines64(a), dtype=dtype)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,d", [(1, 1, 5), (1023, 130, 33), (65, 1025, 384)])
def test_rectangular_on_gpu(backend, dtype, m, n, d):
    a = random_matrix(m, d, dtype, seed=1)
    b = random_matrix(n, d, dtype, seed=2)
    stats = rf.pairwise_cosine_stats(a.cuda(), b.cuda(), backend=backend)
    assert_matches(stats, cosines64(a, b), dtype=dtype)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_tf32_error_is_bounded(backend):
    a = random_matrix(1500, 256, torch.float32)
    c = cosines64(a)
    s = rf.pairwise_cosine_stats(a.cuda(), backend=backend, precision="tf32")
    assert abs(s.mean - float(c.mean())) < 1e-4 and abs(s.std - float(c.std(unbiased=False))) < 1e-4


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("bins", [1, 100, 4096, 20000])
def test_bins_and_narrow_range_on_gpu(backend, bins):
    a = random_matrix(700, 48, torch.bfloat16)
    s = rf.pairwise_cosine_stats(a.cuda(), bins=bins, range=(-0.3, 0.35), backend=backend)
    assert_matches(s, cosines64(a), dtype=torch.bfloat16, bins=bins, lo=-0.3, hi=0.35)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_bitwise_repeatable_on_gpu(backend):
    a = random_matrix(5000, 200, torch.bfloat16).cuda()
    assert rf.pairwise_cosine_stats(a, backend=backend).to_dict() == rf.pairwise_cosine_stats(a, backend=backend).to_dict()


def test_cuda_matches_cpu_kernel_on_minilm(minilm_embeddings):
    e = minilm_embeddings
    cpu = rf.pairwise_cosine_stats(e, backend="cpu")
    for backend in gpu_backends():
        g = rf.pairwise_cosine_stats(e.cuda(), backend=backend)
        assert g.count == cpu.count
        assert g.mean == pytest.approx(cpu.mean, abs=2e-7) and g.std == pytest.approx(cpu.std, abs=2e-7)
        assert int((g.hist - cpu.hist).abs().sum()) <= 1e-3 * cpu.count
        gb = rf.pairwise_cosine_stats(e.cuda().bfloat16(), backend=backend)
        assert gb.epsilon() == pytest.approx(cpu.epsilon(), abs=5e-3)  # bf16 rounding of the weights


def test_auto_on_gpu_tensors():
    a = random_matrix(300, 16, torch.float32).cuda()
    assert rf.pairwise_cosine_stats(a).backend in ("cuda", "triton")
    with pytest.raises(RuntimeError, match="backend 'cpu' runs on CPU tensors"):
        rf.pairwise_cosine_stats(a, backend="cpu")


# --- gram_offdiag_penalty on CUDA tensors ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("p", [2, 3, 8, 20])
@pytest.mark.parametrize("k,d", [(2, 1), (97, 5), (1025, 33), (300, 4096)])
def test_penalty_on_gpu(backend, k, d, p, normalize):
    from test_gram_offdiag_penalty import assert_close_to_reference, random_x

    if backend not in gpu_backends():
        pytest.fail(f"backend {backend} was not built on this GPU machine")
    # raw rows are scaled so that max |g|^p stays inside float32 at d = 4096 (at scale 0.3 the true
    # loss at p = 20 is 4e44, and inf is the right float32 answer)
    X = random_x(k, d, torch.float32, scale=1.0 if normalize else 0.3 * min(1.0, (33 / d) ** 0.5))
    assert_close_to_reference(X.cuda(), p, normalize, backend)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_penalty_panels_on_gpu(backend):
    """k = 9000 > one 8192-row CUDA panel: rows rescaled across panels."""
    from test_gram_offdiag_penalty import loss_and_grad, random_x

    X = random_x(9000, 16, torch.float32)
    loss, grad = loss_and_grad(X.cuda(), 8, True, backend=backend)
    ref_loss, ref_grad = loss_and_grad(X, 8, True, backend="cpu")
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-4)
    torch.testing.assert_close(grad.cpu(), ref_grad, rtol=1e-3, atol=1e-4 * float(ref_grad.abs().max()))


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_penalty_gradcheck_float64_on_gpu(backend):
    from test_gram_offdiag_penalty import random_x

    X = random_x(7, 4, torch.float64).cuda().requires_grad_(True)
    fn = lambda x: rf.gram_offdiag_penalty(x, 3, True, "mean", backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_penalty_bfloat16_and_determinism_on_gpu(backend):
    from test_gram_offdiag_penalty import loss_and_grad, random_x, reference64

    X = random_x(513, 64, torch.bfloat16).cuda()
    a = loss_and_grad(X, 8, True, backend=backend)
    b = loss_and_grad(X, 8, True, backend=backend)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ref_loss, ref_grad = reference64(X.cpu(), 8, True)
    assert float(a[0]) == pytest.approx(float(ref_loss), rel=2e-5)
    torch.testing.assert_close(a[1].cpu().double(), ref_grad, rtol=8e-3, atol=8e-3 * float(ref_grad.abs().max()))


def test_packing_on_gpu():
    from repcap_fast import packing

    res = packing.optimize(300, 16, steps=200, device="cuda")
    assert res.eps_star < 0.8 * res.eps_star_init and res.eps_star > res.welch
    assert res.backend == ("cuda" if rf.info()["built"]["cuda"] else "triton") and res.device == "cuda"


# --- subspace PGA on CUDA tensors -----------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,d,k", [(3, 5, 2), (97, 33, 5), (1025, 256, 64), (130, 40, 1)])
def test_pga_on_gpu(n, d, k, dtype, backend):
    from repcap_fast import pga

    if backend not in gpu_backends():
        pytest.fail(f"backend {backend} was not built on this GPU machine")
    g = torch.Generator().manual_seed(n + d)
    h = (torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)).to(dtype)
    w = torch.randn(3 * d, d, generator=g, dtype=torch.float64)
    # CCR-1 leaves 3 centered points on a line, where two distances tie at exactly 2 and rounding
    # decides their order (ρ then moves by 1 − √3/2 between devices): no CCR at n = 3
    ccr = 0 if n < 5 else 1
    got = pga.subspace_pga(h.cuda(), w.cuda(), k=k, n_null=9, ccr=ccr, seed=4, backend=backend, batch=4)
    assert got.backend == backend
    ref = pga.subspace_pga(h, w, k=k, n_null=9, ccr=ccr, seed=4, backend="torch")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got.rho_readout == pytest.approx(ref.rho_readout, abs=tol)
    assert max(abs(a - b) for a, b in zip(got.null_rhos, ref.null_rhos)) <= tol


def test_pga_auto_on_gpu_is_the_cuda_kernel_and_deterministic():
    from repcap_fast import pga

    g = torch.Generator().manual_seed(3)
    h = torch.randn(700, 64, generator=g, dtype=torch.float64)
    w = torch.randn(200, 64, generator=g, dtype=torch.float64)
    a = pga.subspace_pga(h.float().cuda(), w.cuda(), k=16, n_null=20)
    b = pga.subspace_pga(h.float().cuda(), w.cuda(), k=16, n_null=20, batch=3)
    assert a.backend == ("cuda" if rf.info()["built"]["cuda"] else "triton")
    assert a.to_dict() == b.to_dict()  # batching does not change a bit
    cpu = pga.subspace_pga(h.float(), w, k=16, n_null=20, backend="cpu")
    assert max(abs(x - y) for x, y in zip([a.rho_readout, *a.null_rhos], [cpu.rho_readout, *cpu.null_rhos])) < 2e-6


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_pga_ranks_on_gpu_match_scipy_with_exact_ties(backend):
    import numpy as np
    from scipy.spatial.distance import pdist
    from scipy.stats import rankdata

    from repcap_fast import pga

    r = np.random.default_rng(4)
    h = np.zeros((900, 5))  # scaled one-hot rows: every distance is exactly 0 or 1, runs of ~10^5
    h[np.arange(900), r.integers(0, 5, 900)] = r.choice([49.0, 7.0, 11.0, 0.1, 3.0, -2.5], 900)
    ranks_fn, rhos_fn = pga._kernel_ops(backend)
    for dtype in (torch.float32, torch.float64):
        ranks = ranks_fn(torch.from_numpy(h).to(dtype).cuda())
        np.testing.assert_array_equal(ranks.cpu().numpy(), rankdata(pdist(h, "cosine")))
    x = r.standard_normal((1500, 7))
    ranks = ranks_fn(torch.from_numpy(x).float().cuda()).cpu().numpy()
    dist = pdist(x.astype(np.float32).astype(np.float64), "cosine")
    # float32 distances are off by a few ulps, so pairs closer than that may swap: every rank must
    # lie between the ranks of the float64 distances delta below and delta above its own. (On an
    # H200, 7.7% of the 1.1M ranks moved, by at most 2.5.)
    delta = 4e-6
    ordered = np.sort(dist)
    lowest = np.searchsorted(ordered, dist - delta, side="left") + 1
    highest = np.searchsorted(ordered, dist + delta, side="right")
    assert np.all(lowest <= ranks) and np.all(ranks <= highest)
    assert np.abs(ranks - rankdata(dist)).max() <= 4.0


def test_pga_cuda_rejects_bad_reference_ranks_and_zero_rows():
    from repcap_fast import pga

    if "cuda" not in gpu_backends():
        pytest.fail("backend cuda was not built on this GPU machine")
    x = torch.randn(30, 6, device="cuda")
    bases = pga.grassmann_bases(6, 2, 3, seed=0).float().cuda()
    ranks = torch.ops.repcap_fast.subspace_pga_ranks(x)
    with pytest.raises(RuntimeError, match="ref_ranks must be average ranks"):
        torch.ops.repcap_fast.subspace_pga_rhos(x, bases, ranks + 0.25)
    with pytest.raises(RuntimeError, match="ref_ranks must be average ranks"):
        torch.ops.repcap_fast.subspace_pga_rhos(x, bases, torch.ones_like(ranks))
    with pytest.raises(RuntimeError, match="zero row"):
        torch.ops.repcap_fast.subspace_pga_ranks(torch.zeros(5, 3, device="cuda"))
    e = torch.eye(6, dtype=torch.float32, device="cuda")
    h = torch.cat([e, torch.randn(20, 6, device="cuda")])
    full_rank = torch.linalg.qr(torch.randn(6, 2, device="cuda"))[0]
    rhos = torch.ops.repcap_fast.subspace_pga_rhos(h, torch.stack([e[:, :2], full_rank, e[:, 2:4]]),
                                                   torch.ops.repcap_fast.subspace_pga_ranks(h))
    # rows e2..e5 project to zero on span(e0, e1): NaN there and on span(e2, e3), a number between
    assert torch.isnan(rhos[0]) and torch.isnan(rhos[2]) and torch.isfinite(rhos[1])
    torch.library.opcheck(torch.ops.repcap_fast.subspace_pga_ranks.default, (x,))
    torch.library.opcheck(torch.ops.repcap_fast.subspace_pga_rhos.default, (x, bases, ranks))


def test_pga_cuda_past_the_grid_y_limit():
    """70,000 subspaces in one call: the kernels' subspace axis is launched in chunks of 65,535."""
    if "cuda" not in gpu_backends():
        pytest.fail("backend cuda was not built on this GPU machine")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    bases = torch.nn.functional.normalize(torch.randn(70_000, 3, 1, generator=g, dtype=torch.float64), dim=1)
    ranks = torch.ops.repcap_fast.subspace_pga_ranks(x)
    want = torch.ops.repcap_fast.subspace_pga_rhos(x, bases, ranks)  # the CPU kernel
    got = torch.ops.repcap_fast.subspace_pga_rhos(x.cuda(), bases.cuda(), ranks.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-12, equal_nan=True)



def test_pga_stream_on_gpu_matches_exact():
    """method="stream" (histogram CDF ranks on torch ops) on CUDA tensors, against the exact ranks."""
    from repcap_fast import pga

    g = torch.Generator().manual_seed(11)
    h = torch.randn(2048, 64, generator=g, dtype=torch.float64) @ torch.randn(64, 64, generator=g, dtype=torch.float64)
    w = torch.randn(300, 64, generator=g, dtype=torch.float64)
    stream = pga.subspace_pga(h.float().cuda(), w.cuda(), k=8, n_null=6, ccr=1, seed=2, method="stream")
    exact = pga.subspace_pga(h, w, k=8, n_null=6, ccr=1, seed=2, backend="torch")
    assert stream.method == "stream"
    got, want = [stream.rho_readout, *stream.null_rhos], [exact.rho_readout, *exact.null_rhos]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6
