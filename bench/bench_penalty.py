"""Benchmark of gram_offdiag_penalty: one forward + backward step of the streaming kernel against
torch autograd on the materialized k×k Gram (the paper's formulation), in one run, as ratios,
with the floor (the two GEMMs of the same shape the kernel must do) and peak extra memory.

    python -m pytest bench/bench_penalty.py -s            # CPU: k=8192, d=256, p=8
    python -m pytest bench/bench_penalty.py -s -k gpu     # GPU: k=32768 and 262144, d=4096

Kernel variants are named "backend" (precision "highest") or "backend:precision" ("cuda:tf32",
"triton:bf16": the packing optimizer's reduced-precision steps).

Peak extra memory beyond X itself: on the CPU in a fresh process per variant (VmHWM growth), on a
GPU from the caching allocator's peak. Results: a table printed last and JSON under
bench/results/ (bench/_harness.py).
"""

import time

import pytest
import torch

import repcap_fast as rf
from repcap_fast._backends import cublas_precision
from repcap_fast.reference import gram_offdiag_penalty_reference

from _harness import (
    HAS_CUDA,
    SMOKE,
    emit,
    format_table,
    fresh_process_peak,
    gpu_peak_extra,
    mib,
    ratio,
    sync,
    timed,
    write_results,
)

RESULTS = {"cpu": {}, "gpu": {}, "gpu_huge": {}, "gpu_packing": {}}
P = 8

CPU_K, CPU_D = (2048, 64) if SMOKE else (8192, 256)
GPU_K, GPU_D = (4096, 512) if SMOKE else (32768, 4096)
GPU_HUGE_K = 16384 if SMOKE else 262144
PACKING_STEPS = 5 if SMOKE else 50


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
    elif variant == "torch_autograd:tf32":  # the honest baseline of "tf32": autograd with TF32 GEMMs
        with cublas_precision("tf32", X.device):
            loss = gram_offdiag_penalty_reference(X, P)
            loss.backward()
        return loss
    elif variant == "floor":
        return floor_gemms(X)
    else:
        backend, _, precision = variant.partition(":")
        loss = rf.gram_offdiag_penalty(X, P, backend=backend, precision=precision or "highest")
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
    """Seconds per step; on a GPU also the peak extra memory beyond X over the same steps (the
    caching allocator's peak, cuBLAS workspaces included)."""
    X = make_x(k, d, device).requires_grad_(True)
    return timed(lambda: step(variant, X), rounds, device=device, benchmark=benchmark,  # warm-up: Triton, cuBLAS
                 gpu_peak=device.startswith("cuda"))


def memory_variant(variant, k, d):
    """Peak extra memory of one CPU step beyond X, in a fresh process (RSS)."""
    return fresh_process_peak(f"import bench_penalty as b\nX = b.make_x({k}, {d}, 'cpu').requires_grad_(True)\n"
                              f"b.step({variant!r}, X[:257].detach().clone().requires_grad_(True))",
                              f"b.step({variant!r}, X)")


def one_step_time_and_memory(variant, k, d):
    """One cold step on the GPU, timed, with the allocator's peak: the huge cell, where each step
    takes tens of seconds and a warm-up would double the suite's time."""
    X = make_x(k, d, "cuda").requires_grad_(True)
    sync()
    t0 = time.perf_counter()
    peak = gpu_peak_extra(lambda: step(variant, X))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "min_seconds": seconds, "rounds": 1, "cold": True, "peak_extra_bytes": peak}


def run_variant(section, variant, k, d, device, rounds, benchmark=None):
    if section == "gpu_huge":
        res = one_step_time_and_memory(variant, k, d)
    else:
        res = time_variant(variant, k, d, device, rounds, benchmark)
        if device == "cpu":
            res.update(memory_variant(variant, k, d))
    res.update(k=k, d=d, p=P, device=device)
    if res.get("peak_extra_bytes") is not None:
        res["peak_extra_over_kd4"] = res["peak_extra_bytes"] / (k * d * 4)
    RESULTS[section][variant] = res
    emit(res, f"{section} {variant}")
    if benchmark is not None:
        benchmark.extra_info.update(res)
    return res


# --- CPU --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["cpu", "torch_autograd", "floor"])
def test_cpu(benchmark, variant):
    run_variant("cpu", variant, CPU_K, CPU_D, "cpu", rounds=3, benchmark=benchmark)


# --- GPU --------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")


KERNEL_VARIANTS = [f"{backend}{suffix}" for backend in ("cuda", "triton") for suffix in ("", ":tf32", ":bf16")]


@gpu
@pytest.mark.parametrize("variant", KERNEL_VARIANTS + ["torch_autograd", "torch_autograd:tf32", "floor"])
def test_gpu(benchmark, variant):
    built = rf.info()["built"]
    backend = variant.partition(":")[0]
    if backend in ("cuda", "triton") and not built[backend]:
        pytest.skip(f"{backend} not built")
    run_variant("gpu", variant, GPU_K, GPU_D, "cuda", rounds=3, benchmark=benchmark)


@gpu
@pytest.mark.parametrize("variant", ["cuda", "cuda:tf32", "cuda:bf16"])
def test_gpu_huge_k_runs(variant):
    """k = 262144, d = 4096: a materialized float32 Gram would need k²·4 B = 275 GB."""
    if not rf.info()["built"]["cuda"]:
        pytest.skip("cuda not built")
    run_variant("gpu_huge", variant, GPU_HUGE_K, GPU_D, "cuda", rounds=1)


@gpu
@pytest.mark.parametrize("precision", ["highest", "tf32", "bf16"])
def test_gpu_packing_cell(precision):
    """One packing cell at k = 32,768, d = 4096 (method "paper", default backend): PACKING_STEPS
    steps timed (after the exact ε* of the start), the paper's 5000 steps extrapolated from them
    (target: at most 10 minutes), ε* of the result measured by the exact kernel."""
    res = rf.packing.optimize(GPU_K, GPU_D, steps=PACKING_STEPS, device="cuda", precision=precision,
                              progress=False)
    out = {"k": GPU_K, "d": GPU_D, "p": res.p, "steps": PACKING_STEPS, "backend": res.backend,
           "seconds": res.seconds, "seconds_per_step": res.seconds / PACKING_STEPS,
           "extrapolated_5000_steps_s": 5000 * res.seconds / PACKING_STEPS, "eps_star": res.eps_star,
           "eps_star_init": res.eps_star_init, "loss_init": res.loss_init, "loss_final": res.loss_final}
    RESULTS["gpu_packing"][precision] = out
    emit(out, f"gpu_packing {precision}")


def _ratios(section):
    res = RESULTS[section]
    fast = "cpu" if section == "cpu" else ("cuda" if "cuda" in res else "triton")
    seconds = {name: r["seconds"] for name, r in res.items()}
    out = {f"torch_autograd_over_{fast}": ratio(seconds.get("torch_autograd"), seconds.get(fast)),
           f"{fast}_over_floor": ratio(seconds.get(fast), seconds.get("floor"))}
    if section != "cpu":
        for variant in KERNEL_VARIANTS:
            if variant != fast:
                out[f"torch_autograd_over_{variant}"] = ratio(seconds.get("torch_autograd"), seconds.get(variant))
            if variant.endswith(":tf32"):  # against autograd with TF32 on too (12-04: 1.5x, against 5.8x)
                out[f"torch_autograd_tf32_over_{variant}"] = ratio(seconds.get("torch_autograd:tf32"),
                                                                   seconds.get(variant))
    return {key: value for key, value in out.items() if value is not None}


def teardown_module(module):
    for section in ("cpu", "gpu"):
        if not RESULTS[section]:
            continue
        k = next(iter(RESULTS[section].values()))["k"]
        rows = [{"variant": name, **r, "peak_mib": mib(r.get("peak_extra_bytes"))}
                for name, r in RESULTS[section].items()]
        rows += [{"variant": f"{name} (k={r['k']}, one cold step)", **r, "peak_mib": mib(r["peak_extra_bytes"])}
                 for name, r in (RESULTS["gpu_huge"].items() if section == "gpu" else [])]
        lines = [f"gram_offdiag_penalty, forward + backward, {section}: k={k}, p={P}"]
        lines += format_table([("variant", "variant"), ("seconds", "seconds"), ("peak_mib", "peak extra MiB"),
                               ("peak_extra_over_kd4", "peak extra / (k·d·4 B)")], rows,
                              {"seconds": ".4f", "peak_mib": ".1f", "peak_extra_over_kd4": ".2f"})
        ratios = _ratios(section)
        lines += [f"{name}: {value:.2f}x" for name, value in ratios.items()]
        write_results(f"penalty_{section}", {"op": "gram_offdiag_penalty (forward + backward)", "p": P,
                                             "results": RESULTS[section], "ratios": ratios,
                                             "huge_k": RESULTS["gpu_huge"] if section == "gpu" else {}}, lines)
    if RESULTS["gpu_packing"]:
        rows = [{"precision": name, **r} for name, r in RESULTS["gpu_packing"].items()]
        lines = [f"packing cell k={GPU_K}, d={GPU_D}: {PACKING_STEPS} steps timed, 5000 extrapolated"]
        lines += format_table([("precision", "precision"), ("seconds_per_step", "s/step"),
                               ("extrapolated_5000_steps_s", "5000 steps, s"), ("eps_star", "eps*")], rows,
                              {"seconds_per_step": ".4f", "extrapolated_5000_steps_s": ".1f", "eps_star": ".6f"})
        write_results("penalty_gpu_packing",
                      {"op": "packing.optimize (method paper)", "results": RESULTS["gpu_packing"]}, lines)
