"""gram_offdiag_penalty and its gradient on every backend against the float64 reference."""

import math
import os
import subprocess
import sys

import pytest
import torch

import repcap_fast as rf
from repcap_fast import capacity
from repcap_fast.reference import gram_offdiag_max_reference, gram_offdiag_penalty_reference

from conftest import cpu_backends

KERNEL_BACKENDS = [b for b in cpu_backends() if b != "torch"]
SIZES = [(2, 1), (97, 5), (130, 33)]
PS = [2, 3, 8, 20]


def random_x(k, d, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + 7919 * k + d)
    x = torch.randn(k, d, generator=g, dtype=torch.float64)
    x += 0.5 * torch.randn(1, d, generator=g, dtype=torch.float64)  # correlated rows: larger |g|
    return (scale * x).to(dtype)


def loss_and_grad(X, p, normalize, reduction="sum", backend="auto"):
    X = X.detach().clone().requires_grad_(True)
    loss = rf.gram_offdiag_penalty(X, p, normalize, reduction, backend=backend)
    loss.backward()
    return loss.detach(), X.grad


def reference64(X, p, normalize, reduction="sum"):
    X64 = X.detach().to(torch.float64).requires_grad_(True)
    loss = gram_offdiag_penalty_reference(X64, p, normalize, reduction)
    loss.backward()
    return loss.detach(), X64.grad


def grad_magnitude(X, p, normalize):
    """max_i 2p Σ_j |ĝ_ij|^(p-1) ‖x̂_j‖ / ‖x_i‖: the size of the terms summed into ∂L/∂x_i, the
    scale of float32 rounding in any gradient (also where the true gradient is 0)."""
    x = X.detach().double()
    norms = x.norm(dim=1)
    xh = x / norms[:, None] if normalize else x
    g = (xh @ xh.T).abs()
    g.fill_diagonal_(0.0)
    mag = 2 * p * (g.pow(p - 1) @ xh.norm(dim=1))
    if normalize:
        mag = mag / norms
    return float(mag.max()) or 1.0


def assert_close_to_reference(X, p, normalize, backend, reduction="sum"):
    """flash-attention rule: the kernel's error against float64 is at most twice the error of the
    plain float32 reference (plus a float32-rounding floor), for loss and gradient."""
    loss, grad = loss_and_grad(X, p, normalize, reduction, backend)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad.dtype == X.dtype and grad.shape == X.shape
    ref_loss, ref_grad = reference64(X, p, normalize, reduction)
    if X.dtype == torch.float64:
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-11, abs=1e-300)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-11 * float(ref_grad.abs().max()))
        return
    Xf = X.detach().to(torch.float32).requires_grad_(True)
    low_loss = gram_offdiag_penalty_reference(Xf, p, normalize, reduction)
    low_loss.backward()
    low_grad = Xf.grad.double()
    scale_g = grad_magnitude(X, p, normalize)
    loss_err = abs(float(loss) - float(ref_loss))
    low_loss_err = abs(float(low_loss.detach()) - float(ref_loss)) if math.isfinite(float(low_loss.detach())) else math.inf
    assert loss_err <= 2 * low_loss_err + 2e-6 * abs(float(ref_loss)), (loss_err, low_loss_err)
    grad_err = float((grad.double() - ref_grad).abs().max())
    low_grad_err = float((low_grad - ref_grad).abs().max())
    assert grad_err <= 2 * low_grad_err + 4e-6 * scale_g, (grad_err, low_grad_err, scale_g)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("k,d", SIZES)
def test_matches_reference_float32(backend, k, d, p, normalize):
    X = random_x(k, d, torch.float32, scale=1.0 if normalize else 0.3)
    assert_close_to_reference(X, p, normalize, backend)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("p", [2, 8])
def test_matches_reference_bfloat16(backend, p):
    X = random_x(129, 31, torch.bfloat16)
    # 16-bit inputs are computed in float32: compare with float64 on the same (rounded) values.
    loss, grad = loss_and_grad(X, p, True, backend=backend)
    assert grad.dtype == torch.bfloat16 and loss.dtype == torch.float32
    ref_loss, ref_grad = reference64(X, p, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=2e-5)
    # the gradient is rounded to bfloat16 on return: 2^-8 relative
    torch.testing.assert_close(grad.double(), ref_grad, rtol=8e-3, atol=8e-3 * float(ref_grad.abs().max()))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("p", [1, 2, 3, 8, 20])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_float64_matches_reference(backend, p, reduction):
    X = random_x(67, 9, torch.float64)
    assert_close_to_reference(X, p, True, backend, reduction)
    assert_close_to_reference(X, p, False, backend, reduction)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("p", [2, 3, 8])
def test_gradcheck_float64(backend, normalize, p):
    X = random_x(7, 4, torch.float64).requires_grad_(True)
    fn = lambda x: rf.gram_offdiag_penalty(x, p, normalize, "mean", backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_odd_sizes_and_multiple_tiles(backend):
    # 1025 rows: several 256-row blocks and 512-column tiles on the CPU (last ones partial).
    X = random_x(1025 if backend == "cpu" else 300, 3, torch.float32)
    assert_close_to_reference(X, 8, True, backend)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["torch"])
def test_orthonormal_rows_give_zero(backend):
    X = torch.eye(5, 7)  # exactly orthonormal, k < d: every off-diagonal ĝ is 0
    loss, grad = loss_and_grad(X, 8, True, backend=backend)
    assert float(loss) == 0.0
    assert bool((grad == 0).all())
    q, _ = torch.linalg.qr(torch.randn(40, 12, dtype=torch.float64))  # orthonormal columns
    loss, grad = loss_and_grad(q.T.contiguous(), 8, True, backend=backend)  # 12 orthonormal rows
    assert float(loss) < 1e-100 and float(grad.abs().max()) < 1e-80


def equiangular_lines_r3():
    """The 6 diagonals of the icosahedron: |cos| = 1/√5 between every pair (the Welch bound)."""
    phi = (1 + 5**0.5) / 2
    return torch.tensor([[0, 1, phi], [0, 1, -phi], [1, phi, 0], [1, -phi, 0], [phi, 0, 1], [-phi, 0, 1]],
                        dtype=torch.float64)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["torch"])
def test_equiangular_lines_reach_the_welch_bound(backend):
    X = equiangular_lines_r3()
    welch = float(capacity.welch_bound(6, 3))
    assert welch == pytest.approx(5**-0.5, rel=1e-15)
    assert rf.gram_offdiag_max(X, backend=backend) == pytest.approx(welch, abs=1e-7)
    for p in (2, 8, 20):
        loss, _ = loss_and_grad(X, p, True, backend=backend)
        assert float(loss) == pytest.approx(30 * 5 ** (-p / 2), rel=1e-12)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_large_p_does_not_overflow(backend):
    # Raw rows of norm ~300: |g|^20 ~ 1e99 overflows float32 in the naive formulation.
    X = random_x(50, 8, torch.float32, scale=100.0)
    naive = gram_offdiag_penalty_reference(X, 20, False)
    assert not math.isfinite(float(naive))
    rows_max, rows = rf.gram_offdiag_rows(X.double(), 20, normalize=False, backend=backend)
    ref = gram_offdiag_penalty_reference(X.double(), 20, False)
    assert float(rows.sum()) == pytest.approx(float(ref), rel=1e-12)
    # float32 X: the loss itself exceeds float32's range, and the per-row form holds it in float64
    _, rows32 = rf.gram_offdiag_rows(X, 20, normalize=False, backend=backend)
    assert float(rows32.sum()) == pytest.approx(float(ref), rel=1e-4)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_large_p_does_not_underflow(backend):
    # Nearly orthogonal unit rows: |ĝ| ~ 1e-4, |ĝ|^20 ~ 1e-80 is 0 in float32.
    q, _ = torch.linalg.qr(torch.randn(64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    X = (q.T + 1e-4 * torch.randn(16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))).float()
    naive = gram_offdiag_penalty_reference(X, 20, True)
    assert float(naive) == 0.0
    _, rows = rf.gram_offdiag_rows(X, 20, normalize=True, backend=backend)
    ref = float(gram_offdiag_penalty_reference(X.double(), 20, True))
    assert 0 < ref < 1e-60
    # |ĝ| ~ 1e-4 is formed by float32 dot products (error ~1e-8 absolute, 1e-4 relative), raised to 20
    assert float(rows.sum()) == pytest.approx(ref, rel=1e-2)
    loss, grad = loss_and_grad(X.double(), 20, True, backend=backend)
    ref_loss, ref_grad = reference64(X.double(), 20, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-9)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-8 * float(ref_grad.abs().max()))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_deterministic(backend):
    X = random_x(300, 17, torch.float32)
    a = loss_and_grad(X, 8, True, backend=backend)
    b = loss_and_grad(X, 8, True, backend=backend)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cpu_result_does_not_depend_on_thread_count():
    X = random_x(1100, 40, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = loss_and_grad(X, 8, True, backend="cpu")
        torch.set_num_threads(max(2, threads))
        many = loss_and_grad(X, 8, True, backend="cpu")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_forward_without_grad_and_inference_mode():
    X = random_x(100, 10, torch.float32)
    with torch.no_grad():
        a = rf.gram_offdiag_penalty(X, 8, backend="cpu")
    with torch.inference_mode():
        b = rf.gram_offdiag_penalty(X, 8, backend="cpu")
    ref = gram_offdiag_penalty_reference(X.double(), 8, True)
    assert float(a) == float(b) == pytest.approx(float(ref), rel=1e-5)


def test_works_inside_a_training_loop():
    X = torch.nn.Parameter(random_x(64, 8, torch.float32))
    opt = torch.optim.SGD([X], lr=1e-3)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = 0.5 * rf.gram_offdiag_penalty(X, 4, backend="cpu") + X.pow(2).sum() * 0.0
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["torch"])
@pytest.mark.parametrize("normalize", [True, False])
def test_gram_offdiag_max(backend, normalize):
    X = random_x(211, 6, torch.float32)
    got = rf.gram_offdiag_max(X, normalize=normalize, backend=backend)
    assert got == pytest.approx(gram_offdiag_max_reference(X, normalize), rel=2e-6)


def test_op_passes_opcheck():
    x = random_x(33, 7, torch.float32)
    x = x / x.norm(dim=1, keepdim=True)
    for with_grad in (True, False):
        torch.library.opcheck(torch.ops.repcap_fast.gram_offdiag_penalty.default, (x, 8, with_grad))


def test_shared_epilogue_math():
    from repcap_fast import _C

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


def test_peak_memory_is_linear_in_k():
    """k = 16384: a k×k float32 Gram would take 1 GiB; the kernel's forward + backward must stay
    far below (fresh process, VmHWM)."""
    code = r"""
import torch, repcap_fast as rf
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            return int(line.split()[1]) * 1024
X = torch.randn(16384, 32).requires_grad_(True)
rf.gram_offdiag_penalty(X[:300].detach().clone().requires_grad_(True), 8, backend='cpu').backward()
open('/proc/self/clear_refs', 'w').write('5')
base = hwm()
rf.gram_offdiag_penalty(X, 8, backend='cpu').backward()
print(hwm() - base)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    extra = int(out.stdout.strip().splitlines()[-1])
    assert extra < 128 << 20, f"extra peak memory {extra / 2**20:.0f} MiB"


@pytest.mark.skipif("triton" not in KERNEL_BACKENDS, reason="Triton interpreter not available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("p", [1, 3, 20])
def test_triton_panel_path(monkeypatch, dtype, p):
    """The large-d path (Gram panels with a weight scratch, merged per panel), forced at small
    sizes with several row and column panels."""
    from repcap_fast.triton_kernels import gram_offdiag_penalty as tk

    monkeypatch.setattr(tk, "FUSED_MAX_D", {torch.float32: 0, torch.float64: 0})
    monkeypatch.setattr(tk, "PANEL_COLS", 64)
    monkeypatch.setattr(tk, "PANEL_MAX_ELEMS", 96 * 64)
    for normalize in (True, False):
        X = random_x(203, 37, dtype, scale=1.0 if normalize else 0.3)
        assert_close_to_reference(X, p, normalize, "triton")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_upstream_gradient_and_non_leaf_input(backend):
    W = random_x(40, 9, torch.float64).requires_grad_(True)
    A = torch.randn(9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (3.5 * rf.gram_offdiag_penalty(W @ A, 3, backend=backend)).backward()
    got = W.grad.clone()
    W.grad = None
    (3.5 * gram_offdiag_penalty_reference(W @ A, 3)).backward()
    torch.testing.assert_close(got, W.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_duplicated_rows_with_huge_p(backend):
    # ĝ = 1 (rounded up to 1 + ulp in float32) for the duplicated pair: m^p must not overflow.
    X = random_x(30, 6, torch.float32)
    X[7] = 3 * X[2]
    loss, grad = loss_and_grad(X, 1_000_000, True, backend=backend)
    assert float(loss) == pytest.approx(2.0, rel=1e-3)  # the pair (2, 7) both ways; the rest underflow
    assert torch.isfinite(grad).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_overflowing_gram_is_an_error(backend):
    X = torch.full((4, 3), 1e20)  # x_i·x_j = 3e40 > float32 max
    with pytest.raises(ValueError, match="overflow"):
        rf.gram_offdiag_penalty(X, 2, normalize=False, backend=backend)
    loss = rf.gram_offdiag_penalty(X.double(), 2, normalize=False, backend=backend)
    v = float(X.double()[0, 0])  # 1e20 rounded to float32
    assert float(loss) == pytest.approx(12 * (3 * v * v) ** 2, rel=1e-12)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_tiny_rows_normalize_exactly(backend):
    X = random_x(20, 5, torch.float64) * 1e-40  # float32 subnormal rows: 1/‖x‖ overflows float32
    loss, grad = loss_and_grad(X.float(), 4, True, backend=backend)
    ref_loss, ref_grad = reference64(X.float(), 4, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-4)
    # ∂L/∂x ~ 1/‖x‖ ~ 1e40 is beyond float32: inf exactly where the float64 gradient is too big
    assert torch.equal(torch.isinf(grad), ref_grad.abs() > torch.finfo(torch.float32).max)


def test_no_gradient_work_without_autograd(monkeypatch):
    from repcap_fast import penalty

    calls = []
    real = penalty._kernel

    def spy(name, x, p, with_grad, normalized):
        calls.append(with_grad)
        return real(name, x, p, with_grad, normalized)

    monkeypatch.setattr(penalty, "_kernel", spy)
    X = random_x(50, 4).requires_grad_(True)
    with torch.no_grad():
        rf.gram_offdiag_penalty(X, 4, backend="cpu")
    with torch.inference_mode():
        rf.gram_offdiag_penalty(X, 4, backend="cpu")
    rf.gram_offdiag_penalty(X.detach(), 4, backend="cpu")
    rf.gram_offdiag_penalty(X, 4, backend="cpu").backward()
    assert calls == [False, False, False, True]


def test_ops_take_tensors_that_require_grad():
    # The registered ops read values only (an out= GEMM inside an OpenMP loop used to abort).
    x = random_x(300, 8).requires_grad_(True)
    row_max, _, grad_dir = torch.ops.repcap_fast.gram_offdiag_penalty(x, 4, True)
    assert torch.isfinite(grad_dir).all() and torch.isfinite(row_max).all()
    inv = 1 / x.detach().norm(dim=1)
    moments, counts, _ = torch.ops.repcap_fast.pairwise_cosine_stats(x, inv, None, None, 16, -1.0, 1.0, 0)
    assert int(counts[0]) == 300 * 299 // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("p", [1, 2, 7, 20])
@pytest.mark.parametrize("blocks", [[(0, 1), (1, 600)], [(0, 257), (257, 513), (513, 600)], [(123, 124), (0, 600)]])
def test_row_blocks_against_all_rows_match_the_reference(blocks, p, dtype):
    """gram_offdiag_penalty_rows (a row block against all k rows, the diagonal at row_offset) and
    rows_loss_and_grad: blocks of odd sizes, one row, tiles crossed; against the float64 reference."""
    from repcap_fast.penalty import rows_loss_and_grad

    if "cpu" not in KERNEL_BACKENDS:
        pytest.skip("the cpu kernel was not built")
    X = random_x(600, 11, dtype)
    ref_loss, ref_grad = reference64(X, p, True)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for start, stop in blocks:
        loss, grad = rows_loss_and_grad(X, start, stop, p, backend="cpu")
        ref_rows = ref_grad[start:stop]
        assert grad.shape == (stop - start, 11) and grad.dtype == X.dtype
        torch.testing.assert_close(grad.double(), ref_rows, rtol=tol, atol=tol * float(ref_grad.abs().max()))
        assert loss.dtype == torch.float64 and 0 < float(loss) <= float(ref_loss) * (1 + tol)
    if blocks[-1] == (513, 600):  # a partition of the rows: the parts sum to L
        total = sum(float(rows_loss_and_grad(X, a, b, p, backend="cpu")[0]) for a, b in blocks)
        assert total == pytest.approx(float(ref_loss), rel=tol)


def test_row_block_arguments_are_checked():
    from repcap_fast.penalty import rows_loss_and_grad

    if "cpu" not in KERNEL_BACKENDS:
        pytest.skip("the cpu kernel was not built")
    X = random_x(20, 4)
    for start, stop in [(5, 5), (-1, 3), (10, 21)]:
        with pytest.raises(ValueError, match="row_start < row_stop"):
            rows_loss_and_grad(X, start, stop, 4, backend="cpu")
    with pytest.raises(ValueError, match="cpu and cuda backends"):
        rows_loss_and_grad(X, 0, 5, 4, backend="torch")
    with pytest.raises(RuntimeError, match="must lie in x's 20 rows"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X[:10], X, 15, 4, True)
    with pytest.raises(RuntimeError, match="share dtype"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X[:10].double(), X, 0, 4, True)
    torch.library.opcheck(torch.ops.repcap_fast.gram_offdiag_penalty_rows.default, (X[3:9].clone(), X, 3, 4, True))
