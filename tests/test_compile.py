"""The kernels inside other people's compiled code.

* The penalty as a regularizer in a training step: torch.compile(fullgraph=True) with zero graph
  breaks, dynamic shapes without a recompile per k, the eager loss and gradients bitwise,
  gradcheck in float64, torch.func.grad, a DDP step on two gloo ranks, and the data checks
  (NaN/Inf and zero rows) in eager and in compiled code.
* The checks that CUDA graphs need, run here by forcing the op's sync-free path on the CPU (no
  value read on the host; NaN rows caught by torch._assert_async).
* The analysis ops (pairwise_cosine_stats, subspace_pga) called from compiled code: a clean graph
  break at the op boundary and the eager result.
The GPU-marked tests run the step under mode="reduce-overhead" (CUDA graphs) on cuda and triton.
"""

import os
import sys
import tempfile

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import repcap_fast as rf
from repcap_fast._backends import build_info
from repcap_fast.ops import gram_offdiag_penalty as penalty_module

pytestmark = pytest.mark.skipif(not build_info(), reason="repcap_fast._C is not built")

BACKENDS = ("cpu", "torch", "triton")


def _backend_or_skip(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    return backend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_layer(d=16, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(d, d, bias=bias, dtype=dtype)


def inputs(k, d=16, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype)


# ------------------------------------------------------------------ the step of the issue


def test_the_user_step_compiles_fullgraph_with_zero_graph_breaks():
    lin = make_layer()

    def step(x):
        y = lin(x)
        return rf.gram_offdiag_penalty(y) + y.pow(2).mean()

    x = inputs(300)
    explained = torch._dynamo.explain(step)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    got = torch.compile(step, fullgraph=True)(x)
    want = step(x)
    # The penalty is the op (bitwise); inductor sums y.pow(2).mean() in its own order.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_the_row_block_form_compiles_fullgraph_with_zero_graph_breaks():
    lin = make_layer(bias=False)

    def step(x):
        y = lin(x)
        part, grad = rf.gram_offdiag_penalty_block(y, 10, 200, 8)
        return part, grad

    x = inputs(300)
    explained = torch._dynamo.explain(step)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    got = torch.compile(step, fullgraph=True, dynamic=True)(x)
    want = step(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("form", ["penalty", "block"])
def test_dynamic_shapes_compile_once_for_every_k(form):
    from torch._dynamo.testing import CompileCounterWithBackend

    lin = make_layer(bias=False)

    def step(x):
        y = lin(x)
        if form == "penalty":
            return rf.gram_offdiag_penalty(y, p=6, reduction="mean")
        return rf.gram_offdiag_penalty_block(y, 1, y.shape[0] - 1, 6)[0]

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for k in (64, 65, 300, 517, 1024):
        x = inputs(k, seed=k)
        got, want = compiled(x), step(x)
        assert torch.equal(got, want), k
    assert counter.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_compiled_loss_and_gradients_equal_eager_bitwise(backend, dtype):
    _backend_or_skip(backend)
    k = 97 if backend == "triton" else 300
    lin_eager, lin_compiled = make_layer(bias=False, dtype=dtype), make_layer(bias=False, dtype=dtype)

    def step(lin, x):
        return rf.gram_offdiag_penalty(lin(x), p=8, backend=backend)

    x = inputs(k, dtype=dtype)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss_eager = step(lin_eager, x_eager)
    loss_eager.backward()
    loss_compiled = torch.compile(step, fullgraph=True)(lin_compiled, x_compiled)
    loss_compiled.backward()
    assert torch.equal(loss_compiled, loss_eager)
    assert torch.equal(x_compiled.grad, x_eager.grad)
    assert torch.equal(lin_compiled.weight.grad, lin_eager.weight.grad)


def test_the_full_user_step_matches_eager_within_its_stated_bound():
    """With a bias and y.pow(2).mean(), inductor's own reductions (the bias gradient, a sum of k
    float32 terms; the mean) sum in another order than eager's: the step agrees to the rounding
    of such a reordered sum (1e-5 of the gradient's scale), the penalty's part bitwise (above)."""
    lin_eager, lin_compiled = make_layer(), make_layer()

    def step(lin, x):
        y = lin(x)
        return rf.gram_offdiag_penalty(y) + y.pow(2).mean()

    x = inputs(513)
    step(lin_eager, x).backward()
    torch.compile(step, fullgraph=True)(lin_compiled, x).backward()
    for a, b in zip(lin_compiled.parameters(), lin_eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5 * float(b.grad.abs().max()))


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("normalize", [True, False])
def test_gradcheck_in_float64(backend, normalize):
    X = inputs(9, 4, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda X: rf.gram_offdiag_penalty(X, p=4, normalize=normalize, backend=backend),
                                    (X,))
    # The op itself, through its registered autograd formula.
    op = torch.ops.repcap_fast.gram_offdiag_penalty
    assert torch.autograd.gradcheck(lambda X: op(X, 4, normalize, "mean", backend, "highest", True)[0], (X,))


def test_gradcheck_in_float64_on_the_triton_kernels():
    _backend_or_skip("triton")
    X = inputs(6, 3, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda X: rf.gram_offdiag_penalty(X, p=4, backend="triton"), (X,))


def test_torch_func_grad_gives_the_autograd_gradient():
    X = inputs(50, 7)
    got = torch.func.grad(lambda X: rf.gram_offdiag_penalty(X, p=6))(X)
    Xg = X.clone().requires_grad_()
    rf.gram_offdiag_penalty(Xg, p=6).backward()
    assert torch.equal(got, Xg.grad)


# ---------------------------------------------------------------- data checks, both modes


def _bad(kind):
    x = inputs(64)
    if kind == "nan":
        x[17, 3] = float("nan")
    elif kind == "inf":
        x[5, 0] = float("inf")
    return x


@pytest.mark.parametrize("kind, match", [("nan", "NaN/Inf values \\(first in row 17\\)"),
                                         ("inf", "NaN/Inf values \\(first in row 5\\)")])
@pytest.mark.parametrize("form", ["penalty", "block"])
def test_a_nan_row_raises_the_same_error_eager_and_compiled(kind, match, form):
    def step(x):
        if form == "penalty":
            return rf.gram_offdiag_penalty(x * 1.0)
        return rf.gram_offdiag_penalty_block(x * 1.0, 0, 30, 8)[0]

    x = _bad(kind)
    with pytest.raises(ValueError, match=match):
        step(x)
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(inputs(64)), step(inputs(64)))  # compiled on a good input first
    with pytest.raises(ValueError, match=match):
        compiled(x)


def test_a_zero_row_raises_in_compiled_code():
    x = inputs(40)
    x[3] = 0.0
    compiled = torch.compile(lambda x: rf.gram_offdiag_penalty(x + 0.0), fullgraph=True)
    with pytest.raises(ValueError, match="1 zero rows \\(rows \\[3\\]\\)"):
        compiled(x)


class _HostReads(TorchDispatchMode):
    """Records every op that reads a tensor's value on the host (what a CUDA graph cannot hold)."""

    SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.equal", "aten.is_nonzero", "aten.item")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith(self.SYNCS):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_sync_free_path_reads_nothing_on_the_host_and_still_refuses_nan_rows(monkeypatch, backend):
    """Inside a CUDA graph capture the op takes its sync-free path (penalty_module._sync_free).
    Forced here on the CPU: no value is read on the host, the loss is bitwise eager's, the
    gradient within one float32 rounding of the per-row factor, and a NaN row still fails (the
    CPU runs torch._assert_async at once)."""
    x = inputs(200)
    op = torch.ops.repcap_fast.gram_offdiag_penalty
    want_loss, want_grad = op(x, 8, True, "sum", backend, "highest", True)
    monkeypatch.setattr(penalty_module, "_sync_free", lambda t: True)
    with _HostReads() as reads:
        loss, grad = op(x, 8, True, "sum", backend, "highest", True)
        block_loss, block_grad = torch.ops.repcap_fast.gram_offdiag_penalty_block(x, 3, 50, 8, backend, "highest")
    assert reads.seen == []
    assert torch.equal(loss, want_loss)
    torch.testing.assert_close(grad, want_grad, rtol=2 ** -23, atol=0)
    assert torch.equal(block_loss, rf.gram_offdiag_penalty_block(x, 3, 50, 8, backend=backend)[0])
    for bad in (_bad("nan"), torch.cat([x[:10], torch.zeros(1, 16)])):
        with pytest.raises(RuntimeError, match="NaN/Inf values, a norm beyond float64's range, or"):
            op(bad, 8, True, "sum", backend, "highest", True)


# ---------------------------------------------------------------- DDP on two gloo ranks


def _ddp_rank(rank, world, init_file, out_file):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = DDP(make_layer(bias=True))
        step = torch.compile(lambda x: rf.gram_offdiag_penalty(model(x), p=8))
        step(inputs(120, seed=10 + rank)).backward()
        if rank == 0:
            torch.save([p.grad for p in model.parameters()], out_file)
        # Wait for every queued collective, then drop DDP's reducer (it holds the process group)
        # while the group is alive: a gloo group destroyed with work still queued can deadlock on
        # the GIL in torch 2.13 (seen here: the main thread joins a gloo worker that waits for it).
        dist.barrier()
        step = model = None  # noqa: F841  (the references go before the group does)
    finally:
        dist.destroy_process_group()


def test_a_compiled_ddp_step_on_two_gloo_ranks_gives_the_single_process_gradients():
    """Rank r penalizes its own 120 rows; DDP averages the gradients. The single process computes
    the gradient of the mean of the two ranks' penalties. They agree to the rounding of the
    all-reduce's sum (rtol 1e-6)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "grads.pt")
        mp.start_processes(_ddp_rank, args=(2, init_file, out_file), nprocs=2, join=True, start_method="spawn")
        got = torch.load(out_file)
    model = make_layer(bias=True)
    loss = sum(rf.gram_offdiag_penalty(model(inputs(120, seed=10 + r)), p=8) for r in range(2)) / 2
    loss.backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------- analysis ops, compiled


def test_pairwise_cosine_stats_inside_compiled_code_gives_the_eager_result():
    E = inputs(300)

    def analysis(E):
        stats = rf.pairwise_cosine_stats(E * 2.0, bins=64, progress=False)
        return stats.mean, stats.std, stats.hist

    compiled = torch.compile(analysis)
    got, want = compiled(E), analysis(E)
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])
    E[4, 1] = float("nan")  # the op runs eagerly, with its own checks
    with pytest.raises(ValueError, match="NaN"):
        compiled(E)


def test_subspace_pga_inside_compiled_code_gives_the_eager_result():
    H, W = inputs(60, 32), inputs(100, 32, seed=2)

    def analysis(H):
        return rf.subspace_pga(H - H.mean(0), W, k=4, n_null=10, progress=False).z

    assert torch.compile(analysis)(H) == analysis(H)


def _compile_counts(op, x):
    """(graphs, frames, graph breaks) that torch.compile makes of a step calling `op`."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    def step(x):
        y = x * 2
        return y.sum() + op(y, bins=16, progress=False).mean

    got = torch.compile(step, backend="eager")(x)
    assert got == step(x)
    return counters["stats"]["unique_graphs"], counters["frames"]["total"], sum(counters["graph_break"].values())


def test_an_analysis_op_breaks_the_graph_once_as_torch_compiler_disable_does():
    # eager_only is torch.compiler.disable built without importing torch._dynamo: the same graphs,
    # frames and single graph break, and nothing inside the op traced
    from repcap_fast.ops import pairwise_cosine_stats as module

    disabled = torch.compiler.disable(module.pairwise_cosine_stats.__wrapped__, recursive=True)
    x = inputs(50, 8)
    ours, torchs = _compile_counts(rf.pairwise_cosine_stats, x), _compile_counts(disabled, x)
    assert ours == torchs and ours[2] == 1


def test_eager_only_falls_back_to_torch_compiler_disable_without_the_frame_primitives(monkeypatch):
    from repcap_fast import _backends

    def fn(x):
        return x + 1

    monkeypatch.setattr(_backends, "_frame_eval", None)
    wrapped = _backends.eager_only(fn)
    assert wrapped._torchdynamo_disable and wrapped(torch.ones(2)).tolist() == [2.0, 2.0]


# ------------------------------------------------------------------------ GPU: CUDA graphs


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("form", ["penalty", "block"])
def test_reduce_overhead_captures_the_step_in_a_cuda_graph(backend, form):
    from torch._dynamo.utils import counters

    if backend == "cuda" and not build_info().get("cuda"):
        pytest.skip("repcap_fast._C was built without CUDA")
    _backend_or_skip(backend)
    lin = make_layer(64, bias=False).cuda()

    def step(x):
        y = lin(x)
        if form == "penalty":
            return rf.gram_offdiag_penalty(y, p=8, backend=backend)
        part, grad = rf.gram_offdiag_penalty_block(y, 100, 900, 8, backend=backend)
        return part + (y[100:900] * grad.detach()).sum()

    x = inputs(1024, 64).cuda()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, recording, then replays
        got = compiled(x).clone()
        got.backward()
    assert counters["inductor"]["cudagraph_skips"] == 0
    lin.weight.grad = None
    torch.cuda.set_sync_debug_mode("error")  # a replay that reads a value on the host would raise
    try:
        for _ in range(2):
            got = compiled(x).clone()
            got.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    compiled_grad = lin.weight.grad.clone() / 2
    lin.weight.grad = None
    want = step(x)
    want.backward()
    if form == "penalty":
        assert torch.equal(got, want)  # the op's loss: the same kernels, the same order
    else:  # inductor sums (y·grad).sum() in its own order
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    # Inside a graph the op applies its per-row factor in float64 (one float32 rounding from
    # eager's product), and the weight gradient sums k such rows: agreement to 1e-5.
    scale = float(lin.weight.grad.abs().max())
    torch.testing.assert_close(compiled_grad, lin.weight.grad, rtol=1e-5, atol=1e-5 * scale)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
