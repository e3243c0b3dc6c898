"""gram_offdiag_penalty and its gradient on every backend and device against the float64
reference (the paper's formulation with autograd); the row-block form, the per-row statistics, ε*."""

import math

import pytest
import torch

import repcap_fast as rf
from repcap_fast import capacity
from repcap_fast.ops import gram_offdiag_penalty as op
from repcap_fast.reference import gram_offdiag_max_reference, gram_offdiag_penalty_reference

from _helpers import (
    assert_close_to_reference,
    device_backends,
    extra_peak_bytes,
    gpu_backend_built,
    grad_magnitude,
    loss_and_grad,
    random_x,
    reference64,
    rounded64,
)

SIZES = [(2, 1), (97, 5), (130, 33)]
PS = [2, 3, 8, 20]


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("k,d", SIZES)
def test_matches_reference_float32(device, backend, k, d, p, normalize):
    gpu_backend_built(backend)
    X = random_x(k, d, torch.float32, scale=1.0 if normalize else 0.3)
    assert_close_to_reference(X.to(device), p, normalize, backend)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("p", [21, 37, 64, 255])
def test_large_p_without_a_compiled_case_matches_reference(device, backend, p, dtype):
    # p > 20 takes the CPU kernel's run-time-p path, and most ratios |ĝ|/m fall below the floor
    # under which their p-th power would be subnormal (counted as 0 there)
    gpu_backend_built(backend)
    X = random_x(130, 33, dtype)
    assert_close_to_reference(X.to(device), p, True, backend)


@pytest.mark.parametrize("p", [64, 255])
def test_flushing_subnormals_to_zero_changes_nothing_at_large_p(p):
    """GPUs may flush float32 subnormals to zero. The kernels form |ĝ|^p only as ratios r^p ≤ 1 to
    each row's maximum, so a flushed r^p < 1.2e-38 is below the row's own term 1 by 38 orders and
    L = Σ m_i^p s_i is formed in float64: the CPU kernel with flush-to-zero on (one thread, so
    the flag covers the kernel) gives the same loss and gradient. (The H200's 12-04 miss at
    p = 255, 4.2e-38 on a loss of 1.29e-33, is 3.2e-5 relative: the float32 Gram's rounding of the
    largest |ĝ| amplified p-fold, not a flushed subnormal.)"""
    X = random_x(130, 33, torch.float32)
    plain = loss_and_grad(X, p, True, "sum", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush subnormals")
        assert float(torch.tensor([2e-38]) * torch.tensor([0.5])) == 0.0  # the flag is on
        flushed = loss_and_grad(X, p, True, "sum", "cpu")
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    assert float(flushed[0]) == pytest.approx(float(plain[0]), rel=1e-12)
    assert float((flushed[1] - plain[1]).abs().max()) <= 1e-9 * float(plain[1].abs().max())


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("p", [1 << 20, 1 << 27, 1 << 30])
def test_the_subnormal_floor_never_drops_a_row_maximum(device, backend, p, dtype):
    # The CPU kernel counts ratios whose p-th power would be subnormal as 0; uncapped, that floor
    # reached 1 near p = 8.5e7 and wiped out whole rows (L = 0 instead of 2 here).
    gpu_backend_built(backend)
    X = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8]], dtype=dtype)
    _, rows = rf.gram_offdiag_row_stats(X.to(device), p, backend=backend)
    assert float(rows.sum()) == pytest.approx(2.0, rel=1e-6)
    log_loss, _ = rf.gram_offdiag_log_penalty(X.to(device), p, backend=backend)
    assert log_loss == pytest.approx(math.log(2.0), abs=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("p", [2, 20])
def test_matches_reference_at_d_4096_on_gpu(backend, p, normalize):
    # raw rows are scaled so that max |g|^p stays inside float32 at d = 4096 (at scale 0.3 the true
    # loss at p = 20 is 4e44, and inf is the right float32 answer)
    X = random_x(300, 4096, torch.float32, scale=1.0 if normalize else 0.3 * (33 / 4096) ** 0.5)
    assert_close_to_reference(X.cuda(), p, normalize, backend)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("p", [2, 8])
def test_matches_reference_bfloat16(device, backend, p):
    X = random_x(129, 31, torch.bfloat16)
    # 16-bit inputs are computed in float32: compare with float64 on the same (rounded) values.
    loss, grad = loss_and_grad(X.to(device), p, True, backend=backend)
    assert grad.dtype == torch.bfloat16 and loss.dtype == torch.float32
    ref_loss, ref_grad = reference64(X, p, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=2e-5)
    # the gradient is rounded to bfloat16 on return: 2^-8 relative
    torch.testing.assert_close(grad.cpu().double(), ref_grad, rtol=8e-3, atol=8e-3 * float(ref_grad.abs().max()))


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("p", [1, 2, 3, 8, 20])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_float64_matches_reference(device, backend, p, reduction):
    X = random_x(67, 9, torch.float64).to(device)
    assert_close_to_reference(X, p, True, backend, reduction)
    assert_close_to_reference(X, p, False, backend, reduction)


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("p", [2, 3, 8])
def test_gradcheck_float64(device, backend, normalize, p):
    X = random_x(7, 4, torch.float64).to(device).requires_grad_(True)
    fn = lambda x: rf.gram_offdiag_penalty(x, p, normalize, "mean", backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("device,backend", device_backends())
def test_odd_sizes_and_multiple_tiles(device, backend):
    # 1025 rows: several 256-row blocks and 512-column tiles on the CPU (last ones partial);
    # 9000 > one 8192-row CUDA panel: rows rescaled across panels.
    k = {"cpu": 1025, "torch": 1025, "triton": 300}[backend] if device == "cpu" else 9000
    X = random_x(k, 3 if device == "cpu" else 16, torch.float32)
    assert_close_to_reference(X.to(device), 8, True, backend)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_orthonormal_rows_give_zero(device, backend):
    X = torch.eye(5, 7, device=device)  # exactly orthonormal, k < d: every off-diagonal ĝ is 0
    loss, grad = loss_and_grad(X, 8, True, backend=backend)
    assert float(loss) == 0.0
    assert bool((grad == 0).all())
    q, _ = torch.linalg.qr(torch.randn(40, 12, dtype=torch.float64))  # orthonormal columns
    loss, grad = loss_and_grad(q.T.contiguous().to(device), 8, True, backend=backend)  # 12 orthonormal rows
    assert float(loss) < 1e-100 and float(grad.abs().max()) < 1e-80


def equiangular_lines_r3():
    """The 6 diagonals of the icosahedron: |cos| = 1/√5 between every pair (the Welch bound)."""
    phi = (1 + 5**0.5) / 2
    return torch.tensor([[0, 1, phi], [0, 1, -phi], [1, phi, 0], [1, -phi, 0], [phi, 0, 1], [-phi, 0, 1]],
                        dtype=torch.float64)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_equiangular_lines_reach_the_welch_bound(device, backend):
    X = equiangular_lines_r3().to(device)
    welch = float(capacity.welch_bound(6, 3))
    assert welch == pytest.approx(5**-0.5, rel=1e-15)
    assert rf.gram_offdiag_max(X, backend=backend) == pytest.approx(welch, abs=1e-7)
    for p in (2, 8, 20):
        loss, _ = loss_and_grad(X, p, True, backend=backend)
        assert float(loss) == pytest.approx(30 * 5 ** (-p / 2), rel=1e-12)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_large_p_does_not_overflow(device, backend):
    # Raw rows of norm ~300: |g|^20 ~ 1e99 overflows float32 in the naive formulation.
    X = random_x(50, 8, torch.float32, scale=100.0)
    naive = gram_offdiag_penalty_reference(X, 20, False)
    assert not math.isfinite(float(naive))
    rows_max, rows = rf.gram_offdiag_row_stats(X.double().to(device), 20, normalize=False, backend=backend)
    ref = gram_offdiag_penalty_reference(X.double(), 20, False)
    assert float(rows.sum()) == pytest.approx(float(ref), rel=1e-12)
    # float32 X: the loss itself exceeds float32's range, and the per-row form holds it in float64
    _, rows32 = rf.gram_offdiag_row_stats(X.to(device), 20, normalize=False, backend=backend)
    assert float(rows32.sum()) == pytest.approx(float(ref), rel=1e-4)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_large_p_does_not_underflow(device, backend):
    # Nearly orthogonal unit rows: |ĝ| ~ 1e-4, |ĝ|^20 ~ 1e-80 is 0 in float32.
    q, _ = torch.linalg.qr(torch.randn(64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    X = (q.T + 1e-4 * torch.randn(16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))).float()
    naive = gram_offdiag_penalty_reference(X, 20, True)
    assert float(naive) == 0.0
    _, rows = rf.gram_offdiag_row_stats(X.to(device), 20, normalize=True, backend=backend)
    ref = float(gram_offdiag_penalty_reference(X.double(), 20, True))
    assert 0 < ref < 1e-60
    # |ĝ| ~ 1e-4 is formed by float32 dot products (error ~1e-8 absolute, 1e-4 relative), raised to 20
    assert float(rows.sum()) == pytest.approx(ref, rel=1e-2)
    loss, grad = loss_and_grad(X.double().to(device), 20, True, backend=backend)
    ref_loss, ref_grad = reference64(X.double(), 20, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-9)
    torch.testing.assert_close(grad.cpu(), ref_grad, rtol=1e-8, atol=1e-8 * float(ref_grad.abs().max()))


@pytest.mark.parametrize("device,backend", device_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_deterministic(device, backend, dtype):
    X = random_x(300, 17, dtype).to(device)
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


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
@pytest.mark.parametrize("normalize", [True, False])
def test_gram_offdiag_max(device, backend, normalize):
    X = random_x(211, 6, torch.float32)
    got = rf.gram_offdiag_max(X.to(device), normalize=normalize, backend=backend)
    assert got == pytest.approx(gram_offdiag_max_reference(X, normalize), rel=2e-6)


def test_peak_memory_is_linear_in_k():
    """k = 16384: a k×k float32 Gram would take 1 GiB; the kernel's forward + backward must stay
    far below (fresh process, VmHWM)."""
    extra = extra_peak_bytes(
        "X = torch.randn(16384, 32).requires_grad_(True)\n"
        "rf.gram_offdiag_penalty(X[:300].detach().clone().requires_grad_(True), 8, backend='cpu').backward()",
        "rf.gram_offdiag_penalty(X, 8, backend='cpu').backward()")
    assert extra < 128 << 20, f"extra peak memory {extra / 2**20:.0f} MiB"


@pytest.mark.parametrize("device,backend", device_backends(cpu=["triton"], gpu=["triton"]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("p", [1, 3, 20])
def test_triton_panel_path(monkeypatch, device, backend, dtype, p):
    """The large-d path (Gram panels with a weight scratch, merged per panel), forced at small
    sizes with several row and column panels."""
    from repcap_fast.triton_kernels import gram_offdiag_penalty as tk

    monkeypatch.setattr(tk, "FUSED_MAX_D", {torch.float32: 0, torch.float64: 0})
    monkeypatch.setattr(tk, "PANEL_COLS", 64)
    monkeypatch.setattr(tk, "PANEL_MAX_ELEMS", 96 * 64)
    for normalize in (True, False):
        X = random_x(203, 37, dtype, scale=1.0 if normalize else 0.3)
        assert_close_to_reference(X.to(device), p, normalize, backend)
    # Row blocks (the diagonal at row_offset > 0, inside a later row and column panel), summing to L.
    ref_loss, ref_grad = reference64(X, p, True)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    total = 0.0
    for start, stop in [(0, 70), (70, 71), (71, 203)]:
        loss, grad = rf.gram_offdiag_penalty_block(X.to(device), start, stop, p, backend=backend)
        torch.testing.assert_close(grad.cpu().double(), ref_grad[start:stop], rtol=tol,
                                   atol=tol * float(ref_grad.abs().max()))
        total += float(loss)
    assert total == pytest.approx(float(ref_loss), rel=tol)


@pytest.mark.parametrize("device,backend", device_backends())
def test_upstream_gradient_and_non_leaf_input(device, backend):
    W = random_x(40, 9, torch.float64).to(device).requires_grad_(True)
    A = torch.randn(9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(device)
    (3.5 * rf.gram_offdiag_penalty(W @ A, 3, backend=backend)).backward()
    got = W.grad.clone()
    W.grad = None
    (3.5 * gram_offdiag_penalty_reference(W @ A, 3)).backward()
    torch.testing.assert_close(got, W.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_duplicated_rows_with_huge_p_are_as_exact_as_the_dtype(device, backend):
    """The pair (2, 7) both ways contributes 2·ĝ^p; the other terms underflow. ĝ = 1 may round to
    1 + ulp (m^p must not overflow) or to 1 − a few ulp, which p = 10⁶ amplifies: the README
    promises 2·ĝ^p ∈ [2(1 − (d+2)u)^p, 2] for the dtype's unit roundoff u, so float32 gives at
    least 1.24 at d = 6 and float64 gives 2 to 1e-8."""
    p, d = 1_000_000, 6
    for seed in range(8):
        for dtype in (torch.float32, torch.float64):
            g = torch.Generator().manual_seed(seed)
            X = torch.randn(30, d, generator=g, dtype=dtype)
            X[7] = (0.1 + 10 * float(torch.rand(1, generator=g))) * X[2]
            loss, grad = loss_and_grad(X.to(device), p, True, backend=backend)
            u = torch.finfo(dtype).eps / 2 if backend != "torch" else torch.finfo(torch.float64).eps / 2
            floor = 2 * (1 - (d + 2) * u) ** p
            assert floor <= float(loss) <= 2.0 + 1e-12, (seed, dtype)
            assert torch.isfinite(grad).all()
            if dtype == torch.float64:
                assert float(loss) == pytest.approx(2.0, abs=1e-8)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_overflowing_gram_is_an_error(device, backend):
    X = torch.full((4, 3), 1e20, device=device)  # x_i·x_j = 3e40 > float32 max
    v = float(X.double()[0, 0])  # 1e20 rounded to float32
    with pytest.raises(ValueError, match="overflow"):  # the torch reference (float64) overflows the float32 loss
        rf.gram_offdiag_penalty(X, 2, normalize=False, backend=backend)
    with pytest.raises(ValueError, match="overflows torch.float32"):  # entries fit, the loss does not
        rf.gram_offdiag_penalty(X * 1e-5, 4, normalize=False, backend=backend)
    X = torch.full((4, 3), 1e160, device=device, dtype=torch.float64)  # x_i·x_j = 3e320 > float64 max
    with pytest.raises(ValueError, match="overflow"):
        rf.gram_offdiag_penalty(X, 2, normalize=False, backend=backend)
    loss = rf.gram_offdiag_penalty(X.new_full((4, 3), v), 2, normalize=False, backend=backend)
    assert float(loss) == pytest.approx(12 * (3 * v * v) ** 2, rel=1e-12)


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
def test_tiny_rows_normalize_exactly(device, backend):
    X = random_x(20, 5, torch.float64) * 1e-40  # float32 subnormal rows: 1/‖x‖ overflows float32
    loss, grad = loss_and_grad(X.float().to(device), 4, True, backend=backend)
    ref_loss, ref_grad = reference64(X.float(), 4, True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-4)
    # ∂L/∂x ~ 1/‖x‖ ~ 1e40 is beyond float32: inf exactly where the float64 gradient is too big
    assert torch.equal(torch.isinf(grad.cpu()), ref_grad.abs() > torch.finfo(torch.float32).max)


def test_no_gradient_work_without_autograd(monkeypatch):
    calls = []
    real = op._gram_offdiag_penalty

    def spy(inputs, row_start, row_stop, with_grad):
        calls.append(with_grad)
        return real(inputs, row_start, row_stop, with_grad)

    monkeypatch.setattr(op, "_gram_offdiag_penalty", spy)
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
    row_max, _, grad_dir = torch.ops.repcap_fast.gram_offdiag_penalty_rows(x, x, 0, 4, True, 0)
    assert torch.isfinite(grad_dir).all() and torch.isfinite(row_max).all()
    inv = 1 / x.detach().norm(dim=1)
    moments, counts, _ = torch.ops.repcap_fast.pairwise_cosine_stats(x, inv, None, None, 16, -1.0, 1.0, 0)
    assert int(counts[0]) == 300 * 299 // 2


@pytest.mark.parametrize("device,backend", device_backends(gpu=("cuda", "triton", "torch")))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("p", [1, 2, 7, 20])
@pytest.mark.parametrize("blocks", [[(0, 1), (1, 600)], [(0, 257), (257, 513), (513, 600)], [(123, 124), (0, 600)]])
def test_row_blocks_against_all_rows_match_the_reference(device, backend, blocks, p, dtype):
    """gram_offdiag_penalty_block (a row block against all k rows, the diagonal at row_offset):
    blocks of odd sizes, one row, tiles crossed; against the float64 reference."""
    k = 600
    if device == "cpu" and backend == "triton":  # interpreter time: 150 rows, the blocks scaled
        if p not in (1, 20):
            pytest.skip("interpreter time: the Triton row blocks are covered at p = 1 and 20")
        k = 150
        blocks = [(a if b - a == 1 else a // 4, b if b - a == 1 else b // 4) for a, b in blocks]
    X = random_x(k, 11, dtype)
    ref_loss, ref_grad = reference64(X, p, True)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    total = 0.0
    for start, stop in blocks:
        loss, grad = rf.gram_offdiag_penalty_block(X.to(device), start, stop, p, backend=backend)
        ref_rows = ref_grad[start:stop]
        assert grad.shape == (stop - start, 11) and grad.dtype == X.dtype
        torch.testing.assert_close(grad.cpu().double(), ref_rows, rtol=tol, atol=tol * float(ref_grad.abs().max()))
        assert loss.dtype == torch.float64 and 0 < float(loss) <= float(ref_loss) * (1 + tol)
        total += float(loss)
    if blocks[-1][1] == k and blocks[0][0] == 0 and len(blocks) == 3:  # a partition: the parts sum to L
        assert total == pytest.approx(float(ref_loss), rel=tol)


def test_row_block_arguments_are_checked():
    X = random_x(20, 4)
    for start, stop in [(5, 5), (-1, 3), (10, 21)]:
        with pytest.raises(ValueError, match="row_start < row_stop"):
            rf.gram_offdiag_penalty_block(X, start, stop, 4, backend="cpu")
    with pytest.raises(RuntimeError, match="must lie in x's 20 rows"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X[:10], X, 15, 4, True, 0)
    with pytest.raises(RuntimeError, match="share dtype"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X[:10].double(), X, 0, 4, True, 0)
    with pytest.raises(RuntimeError, match=r"p must be in \[1, 1073741824\]"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X, X, 0, 0, True, 0)
    with pytest.raises(RuntimeError, match="unknown precision code 3"):
        torch.ops.repcap_fast.gram_offdiag_penalty_rows(X, X, 0, 4, True, 3)


def test_precision_is_checked():
    X = random_x(40, 6)
    with pytest.raises(ValueError, match="precision must be one of"):
        rf.gram_offdiag_penalty(X, 4, precision="high")
    with pytest.raises(ValueError, match="precision must be one of"):  # ε* is a measurement: no bf16
        rf.gram_offdiag_max(X, precision="bf16")


def float32_values_to_round(precision: str) -> torch.Tensor:
    """Normals over many scales, exact ties (both parities), subnormals, ±0, the largest finite
    float32 (rounds to inf), ±inf and NaN."""
    g = torch.Generator().manual_seed(5)
    scales = torch.exp2(torch.randint(-140, 127, (3000,), generator=g).double())
    normal = (torch.randn(3000, generator=g, dtype=torch.float64) * scales).float()
    raw = torch.randint(0, 2**31, (2000,), generator=g, dtype=torch.int64)
    drop = 13 if precision == "tf32" else 16
    tie = (raw >> drop << drop) | (1 << (drop - 1))  # exactly half an ulp of the format below
    tie = tie[((tie >> 23) & 0xFF) != 0xFF].to(torch.int32).view(torch.float32)  # finite ones
    special = torch.tensor([0.0, -0.0, 1e-45, -3e-39, 1.1754942e-38, 3.4028235e38, -3.4028235e38, float("inf"),
                            -float("inf"), float("nan"), 1.0, -1.0], dtype=torch.float32)
    return torch.cat([normal, tie, -tie, special])


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_operand_rounding_matches_an_independent_reference(precision):
    hook = rf._C._round_to_tf32 if precision == "tf32" else rf._C._round_to_bf16
    x = float32_values_to_round(precision)
    got = torch.tensor([hook(float(v)) for v in x], dtype=torch.float32)
    want = rounded64(x, precision).float()
    nan = torch.isnan(x)
    assert torch.isnan(got[nan]).all()
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    assert float(got[x == 3.4028235e38][0]) == float("inf")  # past the largest finite value
    if precision == "bf16":  # what torch's float32 → bfloat16 conversion gives (the CUDA path's cast)
        torch_bf16 = x.to(torch.bfloat16).float()
        assert torch.equal(got[~nan].view(torch.int32), torch_bf16[~nan].view(torch.int32))


def test_torch_tf32_rounding_matches_an_independent_reference():
    """round_to_tf32 (torch's integer ops; the Triton stats launcher's rounding of float32 rows at
    "tf32") gives the bits of the frexp reference: ties away from zero, subnormals, overflow to
    inf, ±inf; NaN stays NaN; a strided view is rounded as its values. The C++ rounding is held
    to the same reference above."""
    pytest.importorskip("triton")
    from repcap_fast.triton_kernels._utils import round_to_tf32

    x = float32_values_to_round("tf32")
    got, want, nan = round_to_tf32(x), rounded64(x, "tf32").float(), torch.isnan(x)
    assert int(nan.sum()) == 1 and torch.isnan(got[nan]).all()
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    assert float(got[x == 3.4028235e38][0]) == float("inf")  # past the largest finite value
    assert torch.equal(round_to_tf32(x[~nan][::3]).view(torch.int32), want[~nan][::3].view(torch.int32))
    with pytest.raises(TypeError, match="x must be float32"):
        round_to_tf32(x.double())

def unit_rows32(X: torch.Tensor) -> torch.Tensor:
    """The row-normalized X as the op forms it: divided in float64, rounded once to float32."""
    x = X.detach().cpu().double()
    return (x / x.norm(dim=1, keepdim=True)).float()


@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True))
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("p", [2, 8])
def test_reduced_precision_forms_the_gram_of_rounded_operands(device, backend, precision, p):
    """At "tf32"/"bf16" the loss is the float64 penalty of the unit rows rounded to that format
    (to float32 summation error), and visibly not the "highest" loss. On the CPU and under the
    interpreter this is the emulation; on CUDA both backends round the operands themselves (Triton
    casts to bfloat16), and the tensor cores may truncate their float32 sums."""
    gpu_backend_built(backend)
    X = random_x(130, 33)
    xr = rounded64(unit_rows32(X), precision)
    g = (xr @ xr.T).fill_diagonal_(0.0)
    ref = float(g.abs().pow(p).sum())
    _, rows = rf.gram_offdiag_row_stats(X.to(device), p, backend=backend, precision=precision)
    _, rows_high = rf.gram_offdiag_row_stats(X.to(device), p, backend=backend, precision="highest")
    tol = 2e-6 if device == "cpu" else p * 33 * 2.0**-23  # tensor cores may truncate their float32 sums
    assert float(rows.sum()) == pytest.approx(ref, rel=tol)
    if device == "cpu":
        assert abs(float(rows_high.sum()) - ref) > 10 * tol * ref


@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True))
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_float64_ignores_the_precision(device, backend, precision):
    """float64 X runs in float64 at any precision: bitwise the "highest" loss and gradient."""
    gpu_backend_built(backend)
    X = random_x(97, 5, torch.float64).to(device)
    out = {}
    for prec in ("highest", precision):
        Xg = X.clone().requires_grad_(True)
        loss = rf.gram_offdiag_penalty(Xg, 8, backend=backend, precision=prec)
        loss.backward()
        out[prec] = (loss.detach(), Xg.grad)
    assert torch.equal(out["highest"][0], out[precision][0]) and torch.equal(out["highest"][1], out[precision][1])


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_reduced_precision_rounds_the_weights_of_the_gradient(precision):
    """The gradient's second GEMM also takes rounded operands: with k ≤ 512 (one CPU tile, whose
    running maximum is the row maximum m_i), grad_dir_i = Σ_j round(sign(g_ij)(|g_ij|/m_i)^(p−1))·x̂r_j
    with x̂r the rounded unit rows. The op's result lies far closer to that than to the same sum
    with the weights unrounded."""
    p = 8
    X = random_x(300, 24)
    xr32 = rounded64(unit_rows32(X), precision).float()
    _, _, grad_dir = torch.ops.repcap_fast.gram_offdiag_penalty_rows(
        xr32, xr32, 0, p, True, rf._backends.precision_code(precision))
    g = (xr32 @ xr32.T).double().fill_diagonal_(0.0)  # the op's float32 Gram entries, as float64
    m = g.abs().amax(dim=1, keepdim=True)
    w = torch.sign(g) * (g.abs() / m).pow(p - 1)
    w_rounded = rounded64(w.float(), precision)
    x64 = xr32.double()
    err_rounded = float((grad_dir.double() - w_rounded @ x64).norm())
    err_unrounded = float((grad_dir.double() - w @ x64).norm())
    assert err_rounded < 0.1 * err_unrounded, (err_rounded, err_unrounded)


@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True))
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("path", ["fused", "panel"])
def test_reduced_precision_gradient_is_within_the_formats_rounding(monkeypatch, device, backend, precision, path):
    """Loss and gradient at "tf32"/"bf16" against the float64 reference: within a few unit
    roundoffs of the format (2^-11, 2^-8) times the size of the summed terms, on every path
    (Triton's panel path forced with several row and column panels)."""
    gpu_backend_built(backend)
    if path == "panel":
        if backend != "triton":
            pytest.skip("the panel path is Triton's")
        from repcap_fast.triton_kernels import gram_offdiag_penalty as tk

        monkeypatch.setattr(tk, "FUSED_MAX_D", {torch.float32: 0, torch.float64: 0})
        monkeypatch.setattr(tk, "PANEL_COLS", 64)
        monkeypatch.setattr(tk, "PANEL_MAX_ELEMS", 96 * 64)
    X = random_x(203, 37)
    ref_loss, ref_grad = reference64(X, 8, True)
    Xg = X.to(device).clone().requires_grad_(True)
    loss = rf.gram_offdiag_penalty(Xg, 8, backend=backend, precision=precision)
    loss.backward()
    unit = 2.0**-11 if precision == "tf32" else 2.0**-8
    scale = grad_magnitude(X, 8, True)
    assert float(loss.detach()) == pytest.approx(float(ref_loss), rel=8 * 8 * unit)
    assert float((Xg.grad.cpu().double() - ref_grad).abs().max()) <= 8 * unit * scale


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton", "torch"])
def test_precision_highest_is_ieee_float32_whatever_the_global_setting(backend, monkeypatch):
    """precision="highest" forms the Gram in IEEE float32 even when torch's process-wide setting
    allows TF32; "tf32" uses the tensor cores (about 1e-3 per Gram entry). The caller's setting is
    put back."""
    X = random_x(2000, 512, torch.float32).cuda()
    monkeypatch.setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32")
    high = loss_and_grad(X, 8, True, backend=backend)
    tf32 = rf.gram_offdiag_row_stats(X, 8, backend=backend, precision="tf32")
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # restored by the op
    ref_loss, _ = reference64(X, 8, True)
    assert float(high[0]) == pytest.approx(float(ref_loss), rel=1e-5)
    assert float(tf32[1].sum()) == pytest.approx(float(ref_loss), rel=5e-2)


@pytest.mark.gpu
def test_packing_on_gpu():
    res = rf.packing.optimize(300, 16, steps=200, device="cuda")
    assert res.eps_star < 0.8 * res.eps_star_init and res.eps_star > res.welch
    assert res.backend == ("cuda" if rf.info()["built"]["cuda"] else "triton") and res.device == "cuda"
