"""Benchmark of gram_offdiag_penalty: one forward + backward step of the streaming kernel against
torch autograd on the materialized k×k Gram (the paper's formulation), in one run, as ratios,
with the floor (the two GEMMs of the same shape the kernel must do) and peak extra memory.

    python -m pytest bench/bench_penalty.py -s            # CPU: k=8192, d=256, p=8
    python -m pytest bench/bench_penalty.py -s -k gpu     # GPU: k=32768 and 262144, d=4096

Peak extra memory is measured in a fresh process per variant (CPU: VmHWM growth; GPU:
torch.cuda.max_memory_allocated growth), beyond X itself. Results: a table printed last and
JSON under bench/results/ (REPCAP_BENCH_OUT overrides). REPCAP_BENCH_SMOKE=1 shrinks the sizes.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import repcap_fast as rf
from repcap_fast.reference import gram_offdiag_penalty_reference

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.environ.get("REPCAP_BENCH_SMOKE") == "1"
OUT_DIR = os.environ.get("REPCAP_BENCH_OUT", os.path.join(HERE, "results"))
HAS_CUDA = torch.cuda.is_available()
RESULTS = {"cpu": {}, "gpu": {}, "gpu_huge": {}}
P = 8

CPU_K, CPU_D = (2048, 64) if SMOKE else (8192, 256)
GPU_K, GPU_D = (4096, 512) if SMOKE else (32768, 4096)
GPU_HUGE_K = 16384 if SMOKE else 262144


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_x(k, d, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(k, d)
    for r0 in range(0, k, 16384):  # chunked: no k×d float64 temporaries at k = 262144
        x[r0 : r0 + 16384] = torch.randn(min(16384, k - r0), d, generator=g)
    return x.to(device)


def step(variant, X):
    """One forward + backward step of a variant on leaf X (requires grad)."""
    X.grad = None
    if variant == "torch_autograd":
        loss = gram_offdiag_penalty_reference(X, P)
    elif variant == "floor":
        return floor_gemms(X)
    else:
        loss = rf.gram_offdiag_penalty(X, P, backend=variant)
    loss.backward()
    return loss


def floor_gemms(X):
    """The kernel's floor: G = X Xᵀ and W X over the same tiles, nothing else."""
    x = X.detach()
    k = x.shape[0]
    block = 8192 if x.is_cuda else 256
    cols = 8192 if x.is_cuda else 512
    out = torch.empty(block * cols, dtype=x.dtype, device=x.device)
    acc = torch.empty_like(x)
    for r0 in range(0, k, block):
        a = x[r0 : r0 + block]
        for c0 in range(0, k, cols):
            b = x[c0 : c0 + cols]
            g = out[: a.shape[0] * b.shape[0]].view(a.shape[0], b.shape[0])
            torch.mm(a, b.T, out=g)
            acc[r0 : r0 + block].addmm_(g, b)


def time_variant(variant, k, d, device, rounds, benchmark=None):
    X = make_x(k, d, device).requires_grad_(True)
    step(variant, X)  # warm-up (Triton/cuBLAS setup, page faults)
    _sync(device)

    def once():
        step(variant, X)
        _sync(device)

    if benchmark is not None:  # pytest-benchmark times it
        benchmark.pedantic(once, rounds=rounds, iterations=1, warmup_rounds=0)
        st = benchmark.stats.stats
        return {"seconds": st.median, "min_seconds": st.min, "rounds": rounds}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"seconds": sorted(times)[len(times) // 2], "min_seconds": min(times), "rounds": rounds}


def memory_variant(variant, k, d, device):
    """Peak extra memory of one step beyond X: on CPU in a fresh process (RSS), on a GPU in this
    process from the caching allocator's peak (cuBLAS workspaces included), which saves a process
    start and a second k×d draw per variant on the GPU machine."""
    if device.startswith("cuda"):
        X = make_x(k, d, device).requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(variant, X)
        torch.cuda.synchronize()
        return {"peak_extra_bytes": torch.cuda.max_memory_allocated() - base}
    code = f"""
import json, os, sys, torch
sys.path.insert(0, {HERE!r})
import bench_penalty as b
X = b.make_x({k}, {d}, {device!r}).requires_grad_(True)
small = X[:257].detach().clone().requires_grad_(True)
b.step({variant!r}, small)  # load libraries and kernels first
del small
if {device!r}.startswith('cuda'):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    b.step({variant!r}, X); torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
else:
    import peak_memory
    extra = peak_memory.peak_growth(lambda: b.step({variant!r}, X))
print(json.dumps({{"peak_extra_bytes": extra}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"peak_extra_bytes": None, "memory_error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_step_time_and_memory(variant, k, d):
    """One cold step on the GPU, timed, with the allocator's peak: the huge cell, where each step
    takes tens of seconds and a warm-up would double the suite's time."""
    X = make_x(k, d, "cuda").requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    step(variant, X)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "min_seconds": seconds, "rounds": 1, "cold": True,
            "peak_extra_bytes": torch.cuda.max_memory_allocated() - base}


def run_variant(section, variant, k, d, device, rounds, benchmark=None):
    if section == "gpu_huge":
        res = one_step_time_and_memory(variant, k, d)
    else:
        res = time_variant(variant, k, d, device, rounds, benchmark)
        res.update(memory_variant(variant, k, d, device))
    res.update(k=k, d=d, p=P, device=device)
    if res.get("peak_extra_bytes") is not None:
        res["peak_extra_over_kd4"] = res["peak_extra_bytes"] / (k * d * 4)
    RESULTS[section][variant] = res
    print(f"\n[{section} {variant}] {json.dumps(res)}", flush=True)
    if benchmark is not None:
        benchmark.extra_info.update(res)
    return res


# --- CPU --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["cpu", "torch_autograd", "floor"])
def test_cpu(benchmark, variant):
    run_variant("cpu", variant, CPU_K, CPU_D, "cpu", rounds=3, benchmark=benchmark)


# --- GPU --------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


@gpu
@pytest.mark.parametrize("variant", ["cuda", "triton", "torch_autograd", "floor"])
def test_gpu(benchmark, variant):
    built = rf.info()["built"]
    if variant in ("cuda", "triton") and not built[variant]:
        pytest.skip(f"{variant} not built")
    run_variant("gpu", variant, GPU_K, GPU_D, "cuda", rounds=3, benchmark=benchmark)


@gpu
def test_gpu_huge_k_runs():
    """k = 262144, d = 4096: a materialized float32 Gram would need k²·4 B = 275 GB."""
    if not rf.info()["built"]["cuda"]:
        pytest.skip("cuda not built")
    run_variant("gpu_huge", "cuda", GPU_HUGE_K, GPU_D, "cuda", rounds=1)


def _ratios(section):
    res = RESULTS[section]
    fast = "cpu" if section == "cpu" else ("cuda" if "cuda" in res else "triton")
    out = {}
    if fast in res and "torch_autograd" in res:
        out[f"torch_autograd_over_{fast}"] = res["torch_autograd"]["seconds"] / res[fast]["seconds"]
    if fast in res and "floor" in res:
        out[f"{fast}_over_floor"] = res[fast]["seconds"] / res["floor"]["seconds"]
    if section != "cpu" and "triton" in res and "torch_autograd" in res:
        out["torch_autograd_over_triton"] = res["torch_autograd"]["seconds"] / res["triton"]["seconds"]
    return out


def teardown_module(module):
    for section in ("cpu", "gpu"):
        if not RESULTS[section]:
            continue
        payload = {
            "op": "gram_offdiag_penalty (forward + backward)",
            "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if section == "gpu" else f"CPU, {os.cpu_count()} cores",
            "smoke": SMOKE,
            "results": RESULTS[section],
            "ratios": _ratios(section),
        }
        if section == "gpu" and RESULTS["gpu_huge"]:
            payload["huge_k"] = RESULTS["gpu_huge"]
        os.makedirs(OUT_DIR, exist_ok=True)
        path = os.path.join(OUT_DIR, f"penalty_{section}{'_smoke' if SMOKE else ''}.json")
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"\n== gram_offdiag_penalty {section}: k={RESULTS[section][next(iter(RESULTS[section]))]['k']}, p={P} ==")
        for name, r in RESULTS[section].items():
            mem = r.get("peak_extra_bytes")
            mem_s = f"{mem / 2**20:9.1f} MiB ({r['peak_extra_over_kd4']:.2f}·k·d·4)" if mem is not None else "n/a"
            print(f"{name:<16} {r['seconds']:9.4f} s   peak extra {mem_s}")
        for name, v in payload["ratios"].items():
            print(f"{name:<30} {v:.2f}x")
        for name, r in RESULTS["gpu_huge"].items() if section == "gpu" else []:
            print(f"huge k={r['k']} {name:<8} {r['seconds']:9.3f} s   peak extra {r.get('peak_extra_bytes')}")
        print(f"wrote {path}")
