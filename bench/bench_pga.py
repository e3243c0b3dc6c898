"""Benchmark of subspace_pga: the fused CPU kernel (and method="stream") against a plain loop
over scipy.stats.spearmanr (with scipy's pdist) and against the float64 torch reference, in one
run, as ratios, with peak extra memory (fresh process per variant). On a GPU: the cuda and
triton backends against the torch per-subspace loop on the same GPU.

    python -m pytest bench/bench_pga.py -s              # CPU: N=1024, d=512, k=64, 100 nulls
    python -m pytest bench/bench_pga.py -s -k gpu       # GPU: N=4096, d=4096, k=100, 100 nulls

Results: a table printed last and JSON under bench/results/ (bench/_harness.py).
"""


import numpy as np
import pytest
import torch

from repcap_fast import pga

from _harness import (
    HAS_CUDA,
    SMOKE,
    emit,
    format_table,
    fresh_process_peak,
    mib,
    ratio,
    timed,
    write_results,
)

N, D, K, NULLS = (256, 128, 16, 20) if SMOKE else (1024, 512, 64, 100)
RESULTS = {}


def make_inputs():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=g) @ (torch.randn(D, D, generator=g) / D**0.5)
    w = torch.randn(4 * D, D, generator=g)
    return h, w


def scipy_loop(h, w):
    """What a user writes with SciPy: CCR-1, then pdist + spearmanr per subspace."""
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    x = h.double().numpy()
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x - x @ vt[:1].T @ vt[:1]
    basis = pga.readout_basis(w, K).basis.numpy()
    nulls = pga.grassmann_bases(D, K, NULLS, seed=0).numpy()
    full = pdist(x, "cosine")
    rho = lambda b: spearmanr(full, pdist(x @ b, "cosine")).statistic  # noqa: E731
    null = np.array([rho(b) for b in nulls])
    return (rho(basis) - null.mean()) / null.std(ddof=1)


def run(variant, h, w):
    if variant == "scipy_loop":
        return scipy_loop(h, w)
    if variant == "cpu_stream":
        return pga.subspace_pga(h, w, k=K, n_null=NULLS, ccr=1, seed=0, method="stream", progress=False).z
    backend = {"cpu_kernel": "cpu", "torch_reference": "torch"}[variant]
    return pga.subspace_pga(h, w, k=K, n_null=NULLS, ccr=1, seed=0, backend=backend, progress=False).z


def memory(variant):
    return fresh_process_peak("import bench_pga as b\nh, w = b.make_inputs()", f"b.run({variant!r}, h, w)")


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


@pytest.mark.parametrize("variant", ["cpu_kernel", "cpu_stream", "torch_reference", "scipy_loop"])
def test_cpu(benchmark, inputs, variant):
    h, w = inputs
    out = []
    row = timed(lambda: run(variant, h, w), 3 if variant == "cpu_kernel" else 1, benchmark=benchmark, outputs=out)
    z = float(out[0])
    for other, res in RESULTS.items():  # every variant computes the same z
        assert abs(res["z"] - z) < 1e-4 * max(1.0, abs(z)), (variant, other, z, res["z"])
    if variant == "cpu_stream" and "cpu_kernel" in RESULTS:
        RESULTS["cpu_kernel"]["z_stream_minus_exact"] = z - RESULTS["cpu_kernel"]["z"]
    RESULTS[variant] = {**row, "z": z, **memory(variant)}


GPU_RESULTS = {}
GPU_N, GPU_D, GPU_K = (1024, 512, 64) if SMOKE else (4096, 4096, 100)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "triton", "torch", "stream"])
def test_gpu(benchmark, backend):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(GPU_N, GPU_D, generator=g) @ (torch.randn(GPU_D, GPU_D, generator=g) / GPU_D**0.5)).cuda()
    w = torch.randn(2 * GPU_D, GPU_D, generator=g).cuda()
    method, name = ("stream", "auto") if backend == "stream" else ("exact", backend)

    def once():
        return pga.subspace_pga(h, w, k=GPU_K, n_null=NULLS, ccr=1, seed=0, backend=name, method=method,
                                progress=False).z

    out = []
    row = timed(once, 1 if backend in ("torch", "stream") else 3, benchmark=benchmark, outputs=out, gpu_peak=True)
    GPU_RESULTS[backend] = {**row, "z": float(out[0])}
    if backend == "cuda":
        GPU_RESULTS[backend]["setup_seconds"] = gpu_setup_seconds(h, w)
    emit(GPU_RESULTS[backend], f"pga gpu {backend}")


def gpu_setup_seconds(h, w):
    """The parts of one GPU call that are not the kernels: readout basis (eigh of the d×d Gram),
    CCR-1 (eigh of xᵀx) and the Grassmann draws (CPU sampling, GPU orthonormalization)."""
    return {name: timed(fn, 1, device="cuda")["seconds"]
            for name, fn in (("readout_basis", lambda: pga.readout_basis(w, GPU_K)),
                             ("center_and_ccr", lambda: pga.center_and_ccr(h, 1)),
                             ("grassmann_bases", lambda: pga.grassmann_bases(GPU_D, GPU_K, NULLS, 0, device="cuda")))}


def _table(results, baselines):
    rows = [{"variant": name, **r, "peak_mib": mib(r.get("peak_extra_bytes"))} for name, r in results.items()]
    return format_table([("variant", "variant"), ("seconds", "seconds"), ("z", "z"), ("peak_mib", "peak extra MiB")],
                        rows, {"seconds": ".3f", "z": ".6f", "peak_mib": ".0f"}) + \
        [f"{name}: {value:.1f}x" for name, value in baselines.items()]


def teardown_module(module):
    if GPU_RESULTS:
        ratios = {f"torch_loop_over_{name}": ratio(GPU_RESULTS.get("torch", {}).get("seconds"),
                                                   GPU_RESULTS.get(name, {}).get("seconds"))
                  for name in ("cuda", "triton")}
        ratios = {key: value for key, value in ratios.items() if value is not None}
        lines = [f"subspace_pga gpu: N={GPU_N}, d={GPU_D}, k={GPU_K}, {NULLS} nulls", *_table(GPU_RESULTS, ratios)]
        if "setup_seconds" in GPU_RESULTS.get("cuda", {}):
            lines.append("cuda call, non-kernel parts: " + ", ".join(
                f"{k} {v:.3f} s" for k, v in GPU_RESULTS["cuda"]["setup_seconds"].items()))
        write_results("pga_gpu", {"op": "subspace_pga", "N": GPU_N, "d": GPU_D, "k": GPU_K, "n_null": NULLS,
                                  "results": GPU_RESULTS, "ratios": ratios}, lines)
    if RESULTS:
        kernel = RESULTS.get("cpu_kernel", {}).get("seconds")
        ratios = {f"{other}_over_cpu_kernel": ratio(RESULTS[other]["seconds"], kernel)
                  for other in ("scipy_loop", "torch_reference", "cpu_stream") if other in RESULTS and kernel}
        lines = [f"subspace_pga cpu: N={N}, d={D}, k={K}, {NULLS} nulls", *_table(RESULTS, ratios)]
        write_results("pga_cpu", {"op": "subspace_pga (CCR-1, readout + nulls)", "N": N, "d": D, "k": K,
                                  "n_null": NULLS, "results": RESULTS, "ratios": ratios}, lines)
