"""Benchmark of subspace_pga: the fused CPU kernel (and method="stream") against a plain loop
over scipy.stats.spearmanr (with scipy's pdist) and against the float64 torch reference, in one
run, as ratios, with peak extra memory (fresh process per variant). On a GPU: the cuda and
triton backends against the torch per-subspace loop on the same GPU.

    python -m pytest bench/bench_pga.py -s              # CPU: N=1024, d=512, k=64, 100 nulls
    python -m pytest bench/bench_pga.py -s -k gpu       # GPU: N=4096, d=4096, k=100, 100 nulls

Results: a table printed last and JSON under bench/results/ (REPCAP_BENCH_OUT overrides).
REPCAP_BENCH_SMOKE=1 shrinks the sizes.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from repcap_fast import pga

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.environ.get("REPCAP_BENCH_SMOKE") == "1"
OUT_DIR = os.environ.get("REPCAP_BENCH_OUT", os.path.join(HERE, "results"))
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
    code = f"""
import json, sys
sys.path.insert(0, {HERE!r})
import bench_pga as b
import peak_memory
h, w = b.make_inputs()
print(json.dumps({{"peak_extra_bytes": peak_memory.peak_growth(lambda: b.run({variant!r}, h, w))}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"peak_extra_bytes": None, "memory_error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


@pytest.mark.parametrize("variant", ["cpu_kernel", "cpu_stream", "torch_reference", "scipy_loop"])
def test_cpu(benchmark, inputs, variant):
    h, w = inputs
    z = run(variant, h, w)  # warm-up
    rounds = 3 if variant == "cpu_kernel" else 1
    benchmark.pedantic(lambda: run(variant, h, w), rounds=rounds, iterations=1, warmup_rounds=0)
    st = benchmark.stats.stats
    for other, res in RESULTS.items():  # every variant computes the same z
        assert abs(res["z"] - float(z)) < 1e-4 * max(1.0, abs(float(z))), (variant, other, z, res["z"])
    if variant == "cpu_stream" and "cpu_kernel" in RESULTS:
        RESULTS["cpu_kernel"]["z_stream_minus_exact"] = float(z) - RESULTS["cpu_kernel"]["z"]
    RESULTS[variant] = {"seconds": st.median, "min_seconds": st.min, "rounds": rounds, "z": float(z),
                        **memory(variant)}


GPU_RESULTS = {}
GPU_N, GPU_D, GPU_K = (1024, 512, 64) if SMOKE else (4096, 4096, 100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "triton", "torch", "stream"])
def test_gpu(benchmark, backend):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(GPU_N, GPU_D, generator=g) @ (torch.randn(GPU_D, GPU_D, generator=g) / GPU_D**0.5)).cuda()
    w = torch.randn(2 * GPU_D, GPU_D, generator=g).cuda()

    def once():
        method, name = ("stream", "auto") if backend == "stream" else ("exact", backend)
        z = pga.subspace_pga(h, w, k=GPU_K, n_null=NULLS, ccr=1, seed=0, backend=name, method=method, progress=False).z
        torch.cuda.synchronize()
        return z

    z = once()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    benchmark.pedantic(once, rounds=1 if backend in ("torch", "stream") else 3, iterations=1, warmup_rounds=0)
    GPU_RESULTS[backend] = {"seconds": benchmark.stats.stats.median, "z": float(z),
                            "peak_extra_bytes": torch.cuda.max_memory_allocated() - base}
    if backend == "cuda":
        GPU_RESULTS[backend]["setup_seconds"] = gpu_setup_seconds(h, w)
    print(f"\n[pga gpu {backend}] {json.dumps(GPU_RESULTS[backend])}", flush=True)


def gpu_setup_seconds(h, w):
    """The parts of one GPU call that are not the kernels: readout basis (eigh of the d×d Gram),
    CCR-1 (eigh of xᵀx) and the Grassmann draws (CPU sampling, GPU orthonormalization)."""
    out = {}
    for name, fn in (("readout_basis", lambda: pga.readout_basis(w, GPU_K)),
                     ("center_and_ccr", lambda: pga.center_and_ccr(h, 1)),
                     ("grassmann_bases", lambda: pga.grassmann_bases(GPU_D, GPU_K, NULLS, 0, device="cuda"))):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out[name] = time.perf_counter() - t0
    return out


def teardown_module(module):
    if GPU_RESULTS:
        payload = {"op": "subspace_pga", "N": GPU_N, "d": GPU_D, "k": GPU_K, "n_null": NULLS,
                   "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(0), "results": GPU_RESULTS}
        for name in ("cuda", "triton"):
            if {name, "torch"} <= set(GPU_RESULTS):
                payload[f"torch_loop_over_{name}"] = GPU_RESULTS["torch"]["seconds"] / GPU_RESULTS[name]["seconds"]
        os.makedirs(OUT_DIR, exist_ok=True)
        with open(os.path.join(OUT_DIR, "pga_gpu.json"), "w") as f:
            json.dump(payload, f, indent=2)
        print(f"\n== subspace_pga gpu: N={GPU_N}, d={GPU_D}, k={GPU_K}, {NULLS} nulls ==")
        for name, r in GPU_RESULTS.items():
            print(f"{name:<8} {r['seconds']:9.3f} s   z={r['z']:.6f}   peak extra {r['peak_extra_bytes'] / 2**20:.0f} MiB")
        for key in ("torch_loop_over_cuda", "torch_loop_over_triton"):
            if key in payload:
                print(f"{key:<24} {payload[key]:.1f}x")
        if "setup_seconds" in GPU_RESULTS.get("cuda", {}):
            print("cuda call, non-kernel parts: " + ", ".join(
                f"{k} {v:.3f} s" for k, v in GPU_RESULTS["cuda"]["setup_seconds"].items()))
    if not RESULTS:
        return
    ratios = {}
    if "cpu_kernel" in RESULTS:
        for other in ("scipy_loop", "torch_reference", "cpu_stream"):
            if other in RESULTS:
                ratios[f"{other}_over_cpu_kernel"] = RESULTS[other]["seconds"] / RESULTS["cpu_kernel"]["seconds"]
    payload = {"op": "subspace_pga (CCR-1, readout + nulls)", "N": N, "d": D, "k": K, "n_null": NULLS,
               "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
               "device": f"CPU, {os.cpu_count()} cores", "smoke": SMOKE, "results": RESULTS, "ratios": ratios}
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"pga_cpu{'_smoke' if SMOKE else ''}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"\n== subspace_pga cpu: N={N}, d={D}, k={K}, {NULLS} nulls ==")
    for name, r in RESULTS.items():
        mem = r.get("peak_extra_bytes")
        mem_s = f"{mem / 2**20:8.1f} MiB" if mem is not None else "n/a"
        print(f"{name:<16} {r['seconds']:9.3f} s   z={r['z']:.6f}   peak extra {mem_s}")
    for name, v in ratios.items():
        print(f"{name:<34} {v:.1f}x")
    print(f"wrote {path}")
