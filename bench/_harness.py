"""The one benchmark harness: timing (medians, the device synchronized), peak memory (a fresh
process's resident-set growth on the CPU, the caching allocator's peak on a GPU), the results
table printed last, and JSON under bench/results/ with the machine and the versions.

Every bench_<op>.py measures its fast path against the naive torch baseline at the same size in
one run and reports ratios; REPCAP_BENCH_SMOKE=1 shrinks the sizes, REPCAP_BENCH_OUT moves the
JSON."""

import json
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.environ.get("REPCAP_BENCH_SMOKE") == "1"
OUT_DIR = os.environ.get("REPCAP_BENCH_OUT", os.path.join(HERE, "results"))
HAS_CUDA = torch.cuda.is_available()


def sync(device=None) -> None:
    """Waits for the GPU (a no-op on the CPU)."""
    if HAS_CUDA and (device is None or str(device).startswith("cuda")):
        torch.cuda.synchronize()


def timed(fn: Callable, rounds: int = 3, *, device=None, warmup: Optional[Callable] = None, benchmark=None,
          outputs: Optional[list] = None, gpu_peak: bool = False) -> Dict:
    """Median and minimum seconds of `rounds` calls of fn (the device synchronized after each),
    after one warm-up call (of `warmup` if given: a smaller call that compiles or loads the same
    kernels; `warmup=False` for none). With a pytest-benchmark fixture the rounds are its own.
    `outputs`, when given, receives fn's last return value. gpu_peak: also "peak_extra_bytes",
    by how much the caching allocator's peak grew over the calls (no extra call for it)."""
    if gpu_peak:
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    row = _timed_rounds(fn, rounds, device, warmup, benchmark, outputs)
    if gpu_peak:
        sync()
        row["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
    return row


def _timed_rounds(fn, rounds, device, warmup, benchmark, outputs) -> Dict:
    if warmup is not False:
        (warmup or fn)()
        sync(device)

    def once():
        out = fn()
        sync(device)
        if outputs is not None:
            outputs[:] = [out]
        return out

    if benchmark is not None:
        benchmark.pedantic(once, rounds=rounds, iterations=1, warmup_rounds=0)
        stats = benchmark.stats.stats
        return {"seconds": stats.median, "min_seconds": stats.min, "rounds": rounds}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"seconds": times[len(times) // 2], "min_seconds": times[0], "rounds": rounds}


def mib(nbytes: Optional[int]) -> Optional[float]:
    """Bytes in MiB (None stays None: a measurement that failed)."""
    return None if nbytes is None else nbytes / 2**20


def gpu_peak_extra(fn: Callable) -> int:
    """Bytes by which the caching allocator's peak grew while fn() ran (workspaces included)."""
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    sync()
    return torch.cuda.max_memory_allocated() - base


def vmhwm() -> int:
    """Peak resident memory of this process (Linux VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_growth(fn: Callable) -> int:
    """Bytes by which this process's peak RSS grew while fn() ran (the peak is reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = vmhwm()
    fn()
    return vmhwm() - base


def fresh_process_peak(setup: str, call: str, timeout: int = 1800) -> Dict:
    """Peak extra memory of the Python statement `call` in a fresh process, after `setup` (both
    source text; bench/ is on sys.path, so `import bench_penalty as b` works), beyond what the
    process holds before the call: RSS growth (VmHWM; not ru_maxrss, which keeps the parent's peak
    across fork + exec). Returns {"peak_extra_bytes": int} or the error."""
    code = (f"import json, sys\nsys.path.insert(0, {HERE!r})\nimport _harness\n{setup}\n"
            f"print(json.dumps({{'peak_extra_bytes': _harness.peak_growth(lambda: {call})}}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        return {"peak_extra_bytes": None, "memory_error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


class PeakRSS:
    """Peak resident-set growth of this process during a block, sampled every 2 ms. Memory freed
    earlier may be reused without growing the RSS: fresh_process_peak is the stricter measure."""

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


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> Dict:
    """The machine, the versions and the build, for every results file."""
    import repcap_fast as rf

    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "platform": platform.platform(),
            "processor": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if HAS_CUDA else None, "smoke": SMOKE, "info": rf.info()}


def format_table(columns: Sequence, rows: List[Dict], fmt: Optional[Dict] = None) -> List[str]:
    """Text table: one column per (key, title); numbers formatted by fmt[key] (default .4g)."""
    fmt = fmt or {}

    def cell(row, key):
        value = row.get(key)
        if value is None:
            return "n/a"
        if isinstance(value, float):
            return format(value, fmt.get(key, ".4g"))
        return str(value)

    cells = [[title for _, title in columns]] + [[cell(r, key) for key, _ in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in cells]


def write_results(name: str, payload: Dict, lines: Sequence[str] = ()) -> str:
    """Prints the table lines and writes OUT_DIR/<name>[_smoke].json with the machine."""
    if lines:
        print("\n" + "\n".join(lines))
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"{name}{'_smoke' if SMOKE else ''}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), **payload, "table": list(lines)}, f, indent=1)
    print(f"wrote {path}")
    return path


def emit(row: Dict, tag: str, partial_name: Optional[str] = None, partial: Optional[Dict] = None) -> None:
    """Prints one measurement as it lands (a GPU suite cut short by its budget keeps it) and
    rewrites the partial results file when given."""
    print(f"\n[{tag}] {json.dumps(row)}", flush=True)
    if partial_name is not None:
        os.makedirs(OUT_DIR, exist_ok=True)
        with open(os.path.join(OUT_DIR, f"{partial_name}_partial.json"), "w") as f:
            json.dump({"machine": machine(), "results": partial}, f, indent=1)
