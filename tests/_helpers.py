"""Helpers shared by the tests: which backends run where, random inputs, and the float64 oracles'
comparisons. (Fixtures live in conftest.py; this module holds plain functions.)"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast.reference import gram_offdiag_penalty_reference, histogram_bins

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
HYPOTHESIS_SCALE = int(os.environ.get("REPCAP_HYPOTHESIS_SCALE", "1"))


def examples(n: int) -> int:
    """Hypothesis examples of a property test: n in CI, n × REPCAP_HYPOTHESIS_SCALE locally."""
    return n * HYPOTHESIS_SCALE


def rng(seed):
    """A seeded numpy generator."""
    return np.random.default_rng(seed)


def cpu_backends(kernels_only: bool = False):
    """Backends that run on CPU tensors here: the C++ kernel, Triton (under the interpreter) and
    the torch reference (not with kernels_only)."""
    out = ["cpu"] + ([] if kernels_only else ["torch"])
    if HAS_TRITON and INTERPRETING:
        out.append("triton")
    return out


def device_backends(kernels_only: bool = False, cpu=None, gpu=("cuda", "triton")):
    """pytest parameters (device, backend) for one test body run on every device: each backend
    that runs on CPU tensors here, and the GPU backends on CUDA tensors, marked gpu (skipped
    without a GPU, selected by the GPU suite with -m gpu)."""
    cpu = cpu_backends(kernels_only) if cpu is None else [b for b in cpu if b in cpu_backends()]
    return ([pytest.param("cpu", b, id=f"cpu-{b}") for b in cpu]
            + [pytest.param("cuda", b, id=f"cuda-{b}", marks=pytest.mark.gpu) for b in gpu])


def gpu_backend_built(backend: str) -> None:
    """On a GPU machine every GPU backend must have been built: fail (not skip) otherwise."""
    if backend == "cuda" and not rf.info()["built"]["cuda"]:
        pytest.fail("the cuda backend was not built on this GPU machine")


def has_triton_nvidia_backend():
    """Whether Triton can compile for NVIDIA GPUs here (its backend and ptxas are installed)."""
    try:
        import triton.backends.nvidia
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas"))


# --- pairwise_cosine_stats ------------------------------------------------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Kernels form dot products of the (exactly upcast) inputs in float32; these bound the error of
# mean/std and of min/max against float64 for d ≤ 384 and unit-scale inputs, per input dtype.
SIGMA_FLOOR = 6e-8  # σ = sqrt(Σc²/n − μ²) in float64 as σ → 0, relative to rms(c)
MOMENT_TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-6, torch.float16: 2e-6, torch.float64: 1e-10}
EXTREME_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5, torch.float64: 1e-12}
# Largest |c_kernel - c_float64| allowed for any pair; pairs this close to a bin edge may switch bins.
COSINE_TOL = 2e-6


def random_matrix(v, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * v + d)
    a = torch.randn(v, d, generator=g)
    a += 0.3 * torch.randn(1, d, generator=g)  # a shared direction: mean cosine ≠ 0
    return a.to(dtype)


def cosines64(a, b=None):
    """Every pair's cosine in float64, materialized (small sizes only)."""
    def unit(m):  # rows scaled by max|x| first: float64 norms of 1e300-sized rows overflow
        m = m.detach().cpu().double()
        return torch.nn.functional.normalize(m / m.abs().amax(dim=1, keepdim=True), dim=1, eps=0.0)

    x = unit(a)
    if b is None:
        iu = torch.triu_indices(x.shape[0], x.shape[0], 1)
        return (x @ x.T)[iu[0], iu[1]].clamp(-1, 1)
    return (x @ unit(b).T).reshape(-1).clamp(-1, 1)


def rounded64(x: torch.Tensor, precision: str) -> torch.Tensor:
    """float32 values x rounded to TF32 (11 significant bits, to nearest, ties away from zero) or
    bfloat16 (8 bits, to nearest, ties to even), in float64 arithmetic from frexp: independent
    of the kernels' bit arithmetic. Subnormals keep the fixed quantum of the smallest exponent."""
    bits = 11 if precision == "tf32" else 8
    v = x.double().numpy()
    mant, exp = np.frexp(v)
    exp = np.maximum(exp, -125)  # 2^-126 = 0.5·2^-125, the smallest normal
    scaled = np.abs(v) * np.exp2(bits - exp)
    if precision == "tf32":
        r = np.floor(scaled + 0.5)
    else:
        r = np.round(scaled)  # half to even
    out = np.where(np.isfinite(v), np.copysign(r * np.exp2(exp - bits), v), v)
    return torch.from_numpy(out)


def tf32_operands64(x: torch.Tensor, truncate: bool = False) -> torch.Tensor:
    """float32 values x as TF32 tensor cores use them, in float64: rounded to nearest by rounded64
    (the independent frexp reference; what the "tf32" paths feed them), or, truncate, with their
    low 13 bits dropped (what tensor cores may make of raw float32 operands)."""
    if truncate:
        return (x.contiguous().view(torch.int32) & -0x2000).view(torch.float32).double()
    return rounded64(x, "tf32")


def near_edge(c, bins, lo, hi, delta):
    """How many of the cosines c lie within delta of a bin edge."""
    pos = (c - lo) * (bins / (hi - lo))
    dist = (pos - pos.round()).abs() * ((hi - lo) / bins)
    return int((dist < delta).sum())


def assert_matches(stats, c, *, dtype, bins=4096, lo=-1.0, hi=1.0):
    """The statistics against the float64 cosines c, to the tolerances of the kernels' dtype (a
    pair may change bin only within COSINE_TOL of an edge)."""
    n = c.numel()
    assert stats.count == n
    assert int(stats.hist.sum()) + stats.below + stats.above == n
    assert stats.mean == pytest.approx(float(c.mean()), abs=MOMENT_TOL[dtype])
    # σ from float64 power sums: below about 1e-7·rms(c) it is good to SIGMA_FLOOR·rms(c) (README)
    floor = SIGMA_FLOOR * float(c.pow(2).mean().sqrt())
    assert stats.std == pytest.approx(float(c.std(unbiased=False)), abs=MOMENT_TOL[dtype] + floor)
    assert stats.min == pytest.approx(float(c.min()), abs=EXTREME_TOL[dtype])
    assert stats.max == pytest.approx(float(c.max()), abs=EXTREME_TOL[dtype])
    assert stats.epsilon() == pytest.approx(float(c.mean() + 2 * c.std(unbiased=False)),
                                            abs=3 * MOMENT_TOL[dtype] + 2 * floor)
    ref_hist, ref_below, ref_above = histogram_bins(c, bins, lo, hi)
    moved = int((stats.hist - ref_hist).abs().sum()) + abs(stats.below - ref_below) + abs(stats.above - ref_above)
    assert moved <= 2 * near_edge(c, bins, lo, hi, COSINE_TOL), moved


def kernel_dtype(backend, dtype):
    """The dtype whose tolerance applies: the torch backend computes in float64."""
    return torch.float64 if backend == "torch" else dtype


# --- gram_offdiag_penalty --------------------------------------------------------------------------

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
    """The loss and gradient of the paper's formulation (materialized Gram, autograd) in float64."""
    X64 = X.detach().cpu().to(torch.float64).requires_grad_(True)
    loss = gram_offdiag_penalty_reference(X64, p, normalize, reduction)
    loss.backward()
    return loss.detach(), X64.grad


def grad_magnitude(X, p, normalize):
    """max_i 2p Σ_j |ĝ_ij|^(p-1) ‖x̂_j‖ / ‖x_i‖: the size of the terms summed into ∂L/∂x_i, the
    scale of float32 rounding in any gradient (also where the true gradient is 0)."""
    x = X.detach().cpu().double()
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
    plain float32 reference on the same device (plus a float32-rounding floor), for loss and
    gradient. Same device, as flash-attention's tests do: at large p the error is the rounding of
    the largest |ĝ| amplified p-fold, and a GPU's GEMM rounds differently from the CPU's."""
    loss, grad = loss_and_grad(X, p, normalize, reduction, backend)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad.dtype == X.dtype and grad.shape == X.shape and grad.device == X.device
    loss, grad = loss.cpu(), grad.cpu()
    ref_loss, ref_grad = reference64(X, p, normalize, reduction)
    if X.dtype == torch.float64:
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-11, abs=1e-300)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-11 * float(ref_grad.abs().max()))
        return
    Xf = X.detach().to(torch.float32).requires_grad_(True)
    low_loss = gram_offdiag_penalty_reference(Xf, p, normalize, reduction)
    low_loss.backward()
    low_loss, low_grad = low_loss.cpu(), Xf.grad.cpu().double()
    scale_g = grad_magnitude(X, p, normalize)
    loss_err = abs(float(loss) - float(ref_loss))
    low_loss_err = abs(float(low_loss.detach()) - float(ref_loss)) if math.isfinite(float(low_loss.detach())) \
        else math.inf
    assert loss_err <= 2 * low_loss_err + 2e-6 * abs(float(ref_loss)), (loss_err, low_loss_err)
    grad_err = float((grad.double() - ref_grad).abs().max())
    low_grad_err = float((low_grad - ref_grad).abs().max())
    assert grad_err <= 2 * low_grad_err + 4e-6 * scale_g, (grad_err, low_grad_err, scale_g)


# --- subspace_pga ----------------------------------------------------------------------------------

def planted(seed=0, n=120, d=64, k=8, dominant=0.0):
    """W_U whose top-k right singular subspace is span(Q); H whose pair structure lives in
    span(Q), plus optionally a dominant direction u orthogonal to it (float64)."""
    import numpy as np

    r = np.random.default_rng(seed)
    q_full, _ = np.linalg.qr(r.standard_normal((d, d)))
    q, u = q_full[:, :k], q_full[:, k]
    w = r.standard_normal((500, k)) * 10 @ q.T + 0.1 * r.standard_normal((500, d))
    h = r.standard_normal((n, k)) * 3 @ q.T + 0.05 * r.standard_normal((n, d))
    if dominant:
        h = h + dominant * r.standard_normal((n, 1)) * u[None, :]
    return torch.from_numpy(h), torch.from_numpy(w)


_HWM = """
import torch, repcap_fast as rf
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            return int(line.split()[1]) * 1024
"""


def extra_peak_bytes(setup: str, measured: str) -> int:
    """The peak resident memory (VmHWM) that `measured` adds in a fresh Python process (torch and
    repcap_fast imported as rf) after `setup` has run (and warmed up the op); 2 threads."""
    code = (_HWM + setup + "\nopen('/proc/self/clear_refs', 'w').write('5')\nbase = hwm()\n" + measured
            + "\nprint(hwm() - base)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


class HostCopies(torch.overrides.TorchFunctionMode):
    """Records every copy of tensor data to the host that repcap_fast's own code makes while the
    mode is on: .cpu(), .numpy(), __array__, .tolist(), and .to() onto the CPU written as such
    ("cpu" on the calling line; a .to(device) that follows the caller's device is not a copy off
    it). Scalar reads (.item(), float(), bool()) and one-element tensors are not data leaving the
    device and are not recorded. On a CPU run nothing actually moves: what this checks is where
    the code *would* copy on a GPU. `sites` maps (file relative to the package, function) to the
    largest number of elements copied there."""

    _HOST = ("cpu", "numpy", "__array__", "tolist")

    def __init__(self):
        super().__init__()
        self.sites = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in self._HOST or name == "to") and args and isinstance(args[0], torch.Tensor) and args[0].numel() > 1:
            site = self._caller()
            if site is not None and (name != "to" or "cpu" in site[2]):
                key = site[:2]
                self.sites[key] = max(self.sites.get(key, 0), int(args[0].numel()))
        return func(*args, **kwargs)

    @staticmethod
    def _caller():
        """(file relative to repcap_fast/, function, source line) of the innermost frame of the
        package or of its Triton kernels (triton_kernels/...)."""
        import linecache

        package = os.path.dirname(os.path.abspath(rf.__file__))
        roots = [(package + os.sep, "")]
        spec = importlib.util.find_spec("repcap_fast.triton_kernels")
        if spec is not None and spec.submodule_search_locations:  # installed beside the package (editable)
            kernels = os.path.abspath(list(spec.submodule_search_locations)[0])
            if not kernels.startswith(package + os.sep):
                roots.append((kernels + os.sep, "triton_kernels/"))
        frame = sys._getframe(2)
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            for root, prefix in roots:
                if path.startswith(root):
                    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
                    return prefix + path[len(root):], name, linecache.getline(path, frame.f_lineno)
            frame = frame.f_back
        return None


# --- subspace PGA at "tf32" ------------------------------------------------------------------------


def near_duplicate_unit_rows(b, n, k, seed):
    """b sets of n float32 unit rows scattered around one direction (distances ≈ 0.01), where the
    rounding of the dot operands shows most."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 1, k, generator=g) + 0.1 * torch.randn(b, n, k, generator=g)
    return (x / x.double().norm(dim=-1, keepdim=True).float()).contiguous()


def condensed_distances64(u64):
    """1 − u_i·u_j over the pairs j > i of each set of rows (b, n, k), in float64."""
    iu = torch.triu_indices(u64.shape[1], u64.shape[1], 1)
    return (1.0 - u64 @ u64.transpose(1, 2))[:, iu[0], iu[1]]


def tf32_distances64(u, truncate=False):
    """The distances tensor cores form at "tf32" from the float32 unit rows u, in float64, from the
    rows as `tf32_operands64` gives them (rounded to nearest, or truncated)."""
    return condensed_distances64(tf32_operands64(u, truncate))


def key_distances(keys):
    """The float distances inside the distance kernel's keys (float32 bits in the high word of the
    packed int64, or the distances themselves)."""
    if keys.dtype == torch.int64:
        return (keys >> 32).to(torch.int32).view(torch.float32).double()
    return keys.double()


def randn(*shape, seed=0, dtype=torch.float32):
    """Seeded standard normals of `shape`, drawn in float32 and cast to `dtype`."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)


def checkpoint(directory, tensors, config=None):
    """A one-file safetensors checkpoint (model.safetensors, + config.json when given)."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"))
    if config is not None:
        write_json(os.path.join(directory, "config.json"), config)
    return str(directory)


def raised(fn, *args):
    """(type, message) of the exception fn(*args) raises, or None: to compare errors across modes."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001  the type itself is what is compared
        return type(exc), str(exc)
    return None
