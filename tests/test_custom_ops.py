"""Every op is a registered PyTorch custom op: torch.library.opcheck (schema, fake kernel, autograd
registration, AOT dispatch static and dynamic) on each one, at odd shapes and in every dtype it
accepts.

Two layers are covered:
* the public ops that users call, also from compiled code: torch.ops.repcap_fast.gram_offdiag_penalty
  and its block, log, row-stats and max forms, on every backend that runs here (cpu, the Triton
  interpreter, the torch reference), in float16, bfloat16, float32 and float64;
* the kernel layer under every launcher: the C++/CUDA ops (pairwise_cosine_stats,
  gram_offdiag_penalty_rows, subspace_pga_ranks/_rhos, grassmann_normals) and their Triton twins
  (<op>_triton), in the dtypes their contracts take.
The GPU-marked twin runs the same cases on cuda tensors (C++ ops, Triton ops, public ops).
"""

import pytest
import torch

import repcap_fast  # noqa: F401  (registers the ops)
from repcap_fast._backends import build_info

OPS = torch.ops.repcap_fast
UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
         "test_aot_dispatch_dynamic")
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_FLOATS = (torch.float32, torch.float64)
SHAPES = ((2, 1), (37, 5))  # the smallest k, and an odd one that is no multiple of a tile

pytestmark = pytest.mark.skipif(not build_info(), reason="repcap_fast._C is not built")


def rand(k, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype).to(device)


def inv_norms(a):
    return (1.0 / a.double().norm(dim=1)).float()


def opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=UTILS)


def _precision_arg(family, name):
    """The C++ ops take the precision's integer code, the Triton twins its name."""
    return build_info()["precisions"][name] if family == "compiled" else name


def _kernel(family, op):
    return getattr(OPS, op if family == "compiled" else f"{op}_triton").default


# ------------------------------------------------------------------------------ kernel layer


def kernel_cases(device):
    """(id, family, op name, args) of every kernel-layer op at odd shapes in its dtypes."""
    cases = []
    for family in ("compiled", "triton"):
        hi = _precision_arg(family, "highest")
        for dtype in FLOATS:  # the stats kernels take 16-bit operands as they are
            for m, d in SHAPES:
                a = rand(m, d, dtype, device)
                cases.append((f"{family}-stats-{dtype}-{m}x{d}", family, "pairwise_cosine_stats",
                              (a, inv_norms(a), None, None, 33, -1.0, 1.0, hi)))
            a, b = rand(5, 3, dtype, device), rand(7, 3, dtype, device, seed=1)
            cases.append((f"{family}-stats-ab-{dtype}", family, "pairwise_cosine_stats",
                          (a, inv_norms(a), b, inv_norms(b), 1, -0.5, 0.5, hi)))
        for dtype in KERNEL_FLOATS:
            for k, d in SHAPES:
                x = rand(k, d, dtype, device)
                x = x / x.norm(dim=1, keepdim=True)
                for with_grad in (True, False):
                    cases.append((f"{family}-rows-{dtype}-{k}x{d}-{with_grad}", family, "gram_offdiag_penalty_rows",
                                  (x, x, 0, 8, with_grad, hi)))
            x = rand(37, 5, dtype, device)
            x = x / x.norm(dim=1, keepdim=True)
            precision = _precision_arg(family, "bf16")
            cases.append((f"{family}-rows-block-{dtype}", family, "gram_offdiag_penalty_rows",
                          (x[3:9].clone(), x, 3, 7, True, precision)))
            for n, d in ((2, 3), (37, 5)):
                h = rand(n, d, dtype, device)
                ranks_args = (h,) if family == "compiled" else (h, "highest")
                cases.append((f"{family}-ranks-{dtype}-{n}x{d}", family, "subspace_pga_ranks", ranks_args))
            h = rand(37, 5, dtype, device)
            ref = OPS.subspace_pga_ranks(h.double().cpu()).to(device)
            bases = torch.linalg.qr(rand(15, 2, torch.float64, device, seed=2).reshape(3, 5, 2))[0].to(dtype)
            rhos_args = (h, bases, ref) if family == "compiled" else (h, bases, ref, "highest")
            cases.append((f"{family}-rhos-{dtype}", family, "subspace_pga_rhos", rhos_args))
        for first in (0, 5):
            out = torch.empty(3, 5, 2, dtype=torch.float64, device=device)
            cases.append((f"{family}-normals-{first}", family, "grassmann_normals", (out, 7, first)))
    return cases


def _run_kernel_case(family, op, args):
    if family == "triton":
        pytest.importorskip("triton")
    opcheck(_kernel(family, op), args)


CPU_KERNEL_CASES = kernel_cases("cpu")


@pytest.mark.parametrize("family, op, args", [c[1:] for c in CPU_KERNEL_CASES], ids=[c[0] for c in CPU_KERNEL_CASES])
def test_kernel_ops_pass_opcheck(family, op, args):
    _run_kernel_case(family, op, args)


@pytest.mark.gpu
def test_kernel_ops_pass_opcheck_on_cuda():
    if not build_info().get("cuda"):
        pytest.skip("repcap_fast._C was built without CUDA")
    for _, family, op, args in kernel_cases("cuda"):
        _run_kernel_case(family, op, args)


# ------------------------------------------------------------------------------ public ops


def public_cases(device, backends):
    """(id, op, args) of the public ops in every float dtype, on each backend."""
    cases = []
    for backend in backends:
        for dtype in FLOATS:
            for k, d in SHAPES:
                x = rand(k, d, dtype, device).requires_grad_()
                cases.append((f"penalty-{backend}-{dtype}-{k}x{d}", "gram_offdiag_penalty",
                              (x, 8, True, "sum", backend, "highest", True)))
            x = rand(37, 5, dtype, device)
            cases.append((f"penalty-nograd-{backend}-{dtype}", "gram_offdiag_penalty",
                          (x, 3, False, "mean", backend, "highest", False)))
            cases.append((f"block-{backend}-{dtype}", "gram_offdiag_penalty_block", (x, 3, 20, 8, backend, "bf16")))
            cases.append((f"log-{backend}-{dtype}", "gram_offdiag_log_penalty", (x, 9, backend, "tf32")))
            cases.append((f"rowstats-{backend}-{dtype}", "gram_offdiag_row_stats", (x, 4, False, backend, "highest")))
            for normalize in (True, False):
                cases.append((f"max-{backend}-{dtype}-{normalize}", "gram_offdiag_max",
                              (x, normalize, backend, "highest")))
        x = rand(11, 4, torch.float64, device).requires_grad_()
        cases.append((f"penalty-mean-raw-{backend}", "gram_offdiag_penalty",
                      (x, 5, False, "mean", backend, "tf32", True)))
    return cases


def _run_public_case(op, args):
    if args[-3 if op == "gram_offdiag_penalty" else -2] == "triton":
        pytest.importorskip("triton")
    opcheck(getattr(OPS, op).default, args)


CPU_PUBLIC_CASES = public_cases("cpu", ("cpu", "triton", "torch"))


@pytest.mark.parametrize("op, args", [c[1:] for c in CPU_PUBLIC_CASES], ids=[c[0] for c in CPU_PUBLIC_CASES])
def test_public_ops_pass_opcheck(op, args):
    _run_public_case(op, args)


@pytest.mark.gpu
def test_public_ops_pass_opcheck_on_cuda():
    backends = ("cuda", "triton", "torch") if build_info().get("cuda") else ("triton", "torch")
    for _, op, args in public_cases("cuda", backends):
        _run_public_case(op, args)


def test_every_op_of_the_namespace_is_checked():
    """A new op must join these tests: the registered names are exactly the ones covered."""
    kernel = {op if family == "compiled" else f"{op}_triton" for _, family, op, _ in CPU_KERNEL_CASES}
    public = {op for _, op, _ in CPU_PUBLIC_CASES}
    registered = {name.split("::")[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("repcap_fast::")}
    assert registered == kernel | public | {"argument_error"}


@pytest.mark.parametrize("kind", ["ValueError", "ArgumentTypeError", "BackendUnavailableError", "TypeError"])
def test_the_argument_error_op_raises_its_kind_with_its_message_and_has_a_fake(kind):
    """The op that compiled code raises an argument error with (repcap_fast/ops/_compiled_errors.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from repcap_fast.ops import _compiled_errors

    with pytest.raises(_compiled_errors._KINDS[kind], match="^X needs k >= 2 rows$") as raised:
        OPS.argument_error(kind, "X needs k >= 2 rows")
    assert type(raised.value).__name__ == kind
    with FakeTensorMode():
        fake = OPS.argument_error(kind, "never raised while tracing")
    assert fake.shape == () and fake.dtype == torch.float32
