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
