"""Benchmark of the representation monitor during training: what RepcapCallback adds to a Trainer run.

    python -m pytest bench/bench_monitor.py -s

A GPT-2-shaped model of about 11 M parameters (d = 256, 4 layers, 4 heads, MiniLM's 30,522-token
vocabulary, tied embeddings, 128 positions) is trained from scratch by the Hugging Face Trainer
for 200 optimizer steps (batch 8 × 128 tokens of the bundled corpus, AdamW; the probe from its
last 341 paragraphs) on this machine's device, without the callback and with
``RepcapCallback(every_n_steps=50)`` (measuring before the first step and at steps 50, 100, 150
and 200: ε of the embedding, and the Subspace-PGA z of the 5 layers at CCR-1 with k = 100 and
100 null subspaces over 512 probe tokens). Each run is a
fresh process; the runs alternate without, with, with, without (ABBA), so drift hits both alike.
Target (issue 49): the callback adds at most 10 % of wall time.

Also timed: one ``measure`` of the trained model with every measure (the spectral metrics too),
3 times, with the seconds of each part. The JSONL of the last run with the callback is kept as
bench/results/monitor_<device>_metrics.jsonl and plotted (``repcap plot-training``).

REPCAP_BENCH_SMOKE=1: 20 steps, every 10, 2 layers, one pair. Results: bench/results/monitor_<device>.json.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from _harness import HAS_CUDA, OUT_DIR, SMOKE, format_table, write_results

DEVICE = "cuda" if HAS_CUDA else "cpu"
STEPS, EVERY, LAYERS = (20, 10, 2) if SMOKE else (200, 50, 4)
ORDER = ["without", "with"] if SMOKE else ["without", "with", "with", "without"]

CHILD = r"""
import json, os, sys, time
import torch
import repcap_fast as rf
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
mode, steps, every, layers, device, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5], sys.argv[6]
tok = AutoTokenizer.from_pretrained(rf.models.resolve_source("minilm").path)
name, paragraphs = rf.models.default_corpus()
stream = torch.tensor(tok(" ".join(paragraphs[:2200]), add_special_tokens=False)["input_ids"])
windows = stream[: stream.numel() // 128 * 128].view(-1, 128)

class Windows(torch.utils.data.Dataset):
    def __len__(self):
        return windows.shape[0]
    def __getitem__(self, i):
        return {"input_ids": windows[i], "labels": windows[i]}

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=256, n_layer=layers, n_head=4,
                                   bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id))
params = sum(p.numel() for p in model.parameters())
callbacks, monitor, timings = [], None, []
if mode == "with":
    from repcap_fast.integrations.transformers import RepcapCallback
    monitor = rf.RepresentationMonitor(model, texts=paragraphs[2200:], tokenizer=tok, n_tokens=512,
                                       output=os.path.join(out, "metrics.jsonl"))
    measure = monitor.measure
    def timed(step):
        values = measure(step)
        timings.append(dict(monitor.timings))
        return values
    monitor.measure = timed
    callbacks = [RepcapCallback(monitor, every_n_steps=every)]
args = TrainingArguments(os.path.join(out, "trainer"), max_steps=steps, per_device_train_batch_size=8,
                         learning_rate=5e-4, warmup_steps=steps // 10, logging_steps=every, report_to=[],
                         save_strategy="no", use_cpu=device == "cpu", seed=0, dataloader_drop_last=True,
                         disable_tqdm=False)
trainer = Trainer(model=model, args=args, train_dataset=Windows(), callbacks=callbacks)
t0 = time.perf_counter()
trainer.train()
wall = time.perf_counter() - t0
doc = {"mode": mode, "wall_s": wall, "params": params, "measure_timings": timings,
       "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
if monitor is not None:  # the trained model, every measure, 3 times
    full = rf.RepresentationMonitor(model, texts=paragraphs[2200:], tokenizer=tok, n_tokens=512,
                                    measures=("epsilon", "pga", "spectral"))
    doc["full_measure"] = []
    for _ in range(3):
        full.measure(steps)
        doc["full_measure"].append(dict(full.timings))
    doc["monitor"] = monitor.settings
with open(os.path.join(out, "result.json"), "w") as fh:
    json.dump(doc, fh)
"""


def run(mode: str, tmp: str) -> dict:
    out = tempfile.mkdtemp(dir=tmp)
    subprocess.run([sys.executable, "-c", CHILD, mode, str(STEPS), str(EVERY), str(LAYERS), DEVICE, out], check=True)
    with open(os.path.join(out, "result.json")) as fh:
        doc = json.load(fh)
    doc["dir"] = out
    return doc


def test_monitor_cost_in_a_trainer_run(tmp_path):
    runs = [run(mode, str(tmp_path)) for mode in ORDER]
    without = [r["wall_s"] for r in runs if r["mode"] == "without"]
    with_cb = [r["wall_s"] for r in runs if r["mode"] == "with"]
    last_with = [r for r in runs if r["mode"] == "with"][-1]
    measures = [t for r in runs if r["mode"] == "with" for t in r["measure_timings"]]
    parts = ("hidden_states", "epsilon", "pga", "spectral")
    share = {p: statistics.median(t[p] for t in measures) for p in parts if p in measures[0]}
    share["total"] = statistics.median(t["total"] for t in measures)
    full = {p: statistics.median(t[p] for t in last_with["full_measure"]) for p in (*parts, "total")}
    overhead = statistics.median(with_cb) / statistics.median(without) - 1
    rows = [{"run": f"{r['mode']} callback ({i + 1})", "wall_s": r["wall_s"]} for i, r in enumerate(runs)]
    lines = format_table([("run", "run"), ("wall_s", "wall s")], rows, {"wall_s": ".1f"})
    lines += ["", f"overhead of the callback: {overhead:+.1%} of wall time (median with / median without − 1), "
              f"{len(measures) // len(with_cb)} measurements per run, {runs[0]['params'] / 1e6:.1f} M parameters"]
    lines += [""] + format_table(
        [("part", "part of one measure"), ("callback_s", "in the runs (s)"), ("callback_share", "share"),
         ("full_s", "all measures, trained model (s)"), ("full_share", "share")],
        [{"part": p, "callback_s": share.get(p), "callback_share": share[p] / share["total"] if p in share else None,
          "full_s": full[p], "full_share": full[p] / full["total"]} for p in (*parts, "total")],
        {"callback_s": ".3f", "callback_share": ".1%", "full_s": ".3f", "full_share": ".1%"})
    name = f"monitor_{DEVICE}{'_smoke' if SMOKE else ''}"
    os.makedirs(OUT_DIR, exist_ok=True)
    metrics = os.path.join(OUT_DIR, f"{name}_metrics.jsonl")
    shutil.copy(os.path.join(last_with["dir"], "metrics.jsonl"), metrics)
    subprocess.run([sys.executable, "-m", "repcap_fast.cli", "plot-training", metrics, "--title",
                    f"GPT-2-shaped, {runs[0]['params'] / 1e6:.0f} M parameters, {STEPS} Trainer steps ({DEVICE})"],
                   check=True)
    write_results(f"monitor_{DEVICE}", {
        "steps": STEPS, "every_n_steps": EVERY, "layers": LAYERS, "order": ORDER, "params": runs[0]["params"],
        "wall_s": {"without": without, "with": with_cb}, "overhead": overhead, "target_overhead": 0.10,
        "measure_parts_s": share, "full_measure_parts_s": full,
        "monitor": {**last_with["monitor"], "output": f"{os.path.basename(metrics)} (the run's metrics.jsonl, copied)"},
        "losses": {r["mode"] + str(i): r["losses"] for i, r in enumerate(runs)},
        "losses_identical": all(r["losses"] == runs[0]["losses"] for r in runs)}, lines)
    assert all(r["losses"] == runs[0]["losses"] for r in runs), "the logged losses differ with the callback"
