"""Benchmark of how fast the package starts: the import, `repcap --help`, and the first call of each op.

    python -m pytest bench/bench_startup.py -s

Startup: `python -c "import torch"`, `python -c "import repcap_fast"` and `repcap --help` (the
installed console script, run by this interpreter, without any shim), each in a fresh process,
interleaved round by round so that the machine's drift hits the three alike; medians.
Targets (issue 49): the import at most 0.3 s and `repcap --help` at most 0.5 s over `import torch`.

First calls: in a fresh process, the op on inputs A (the first call), then on new inputs B of the
same shape (a later call; the null subspaces of subspace_pga, which depend only on d, k, n_null
and the seed, are reused as in any later call), then on new inputs C after
`pga.clear_readout_cache()` (a later call with nothing cached: what the cold start alone costs).
Target: first ≤ 1.15× the later call on new inputs with nothing cached. Sizes: the README's
(pairwise_cosine_stats of a 30522×384 matrix; gram_offdiag_penalty forward and backward of the
1024×256 output of the README's model, in a process where that model already took a step) and
the issue's for subspace_pga (N = 1024, d = 512, k = 64, 100 null subspaces, W of 5000×512);
also the readout of a new W (`pga.readout_basis`: the d×d Gram and its certified top eigenpairs)
against a float64 SVD of W.

REPCAP_BENCH_SMOKE=1: 3 rounds and smaller sizes; REPCAP_STARTUP_ROUNDS sets the rounds.
Results: bench/results/startup_<device>.json.
"""

import json
import os
import statistics
import subprocess
import sys

from _harness import HAS_CUDA, SMOKE, format_table, write_results

ROUNDS = int(os.environ.get("REPCAP_STARTUP_ROUNDS", 3 if SMOKE else 10))
DEVICE = "cuda" if HAS_CUDA else "cpu"

STARTUP = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import repcap_fast": [sys.executable, "-c", "import repcap_fast"],
    "repcap --help": [sys.executable, "-c", "import sys; from repcap_fast.cli import main; sys.argv = ['repcap', "
                      "'--help']; main()"],
}

FIRST_CALL = r"""
import json, sys, time
import torch
import repcap_fast as rf
from repcap_fast import pga
op, device, smoke = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
g = torch.Generator().manual_seed(0)
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def make(seed):
    g.manual_seed(seed)
    if op == "pairwise_cosine_stats":
        return (torch.randn(4000 if smoke else 30522, 384, generator=g).to(device),)
    if op == "gram_offdiag_penalty":  # the output of the README's model
        x = torch.randn(256 if smoke else 1024, 64, generator=g).to(device)
        return (model(x).detach().requires_grad_(),)
    n, d, v = (256, 128, 1000) if smoke else (1024, 512, 5000)
    H = torch.randn(n, d, generator=g)
    return ((H - H.mean(0)).to(device), torch.randn(v, d, generator=g).to(device))
def call(args):
    if op == "pairwise_cosine_stats":
        return rf.pairwise_cosine_stats(args[0], progress=False).count
    if op == "gram_offdiag_penalty":
        loss = rf.gram_offdiag_penalty(args[0], p=8)
        loss.backward()
        return float(loss)
    if op == "subspace_pga":
        return rf.subspace_pga(args[0], args[1], k=16 if smoke else 64, n_null=20 if smoke else 100,
                               progress=False).z
    if op == "readout_basis":
        return pga.readout_basis(args[1], k=16 if smoke else 64).solver
    if op == "svd":
        return torch.linalg.svd(args[1].double(), full_matrices=False)[1][0].item()
if op == "gram_offdiag_penalty":  # a training step of the README's model ran before, as in its loop
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).to(device)
    model(torch.randn(8, 64, device=device)).pow(2).mean().backward()
inputs = [make(s) for s in range(3)]
sync()
out = {}
for name, args in zip(("first", "later", "later_nothing_cached"), inputs):
    if name == "later_nothing_cached":
        pga.clear_readout_cache()
    t0 = time.perf_counter()
    call(args)
    sync()
    out[name] = time.perf_counter() - t0
out["dynamo_loaded"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def _seconds(cmd) -> float:
    import time

    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def startup() -> dict:
    """Median and min seconds of each startup command over ROUNDS interleaved rounds."""
    times = {name: [] for name in STARTUP}
    for _ in range(ROUNDS):
        for name, cmd in STARTUP.items():
            times[name].append(_seconds(cmd))
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "runs_s": t} for name, t in times.items()}


def first_calls(op: str) -> dict:
    """Medians over ROUNDS fresh processes of the first call, a later one, and one with nothing cached."""
    runs = []
    for _ in range(ROUNDS):
        out = subprocess.run([sys.executable, "-c", FIRST_CALL, op, DEVICE, "1" if SMOKE else "0"], check=True,
                             capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    row = {"op": op}
    for key in ("first", "later", "later_nothing_cached"):
        row[f"{key}_s"] = statistics.median(r[key] for r in runs)
    row["first_over_later"] = row["first_s"] / row["later_s"]
    row["first_over_nothing_cached"] = row["first_s"] / row["later_nothing_cached_s"]
    row["dynamo_loaded"] = any(r["dynamo_loaded"] for r in runs)
    row["runs"] = runs
    return row


def test_startup_and_first_calls():
    start = startup()
    torch_s = start["import torch"]["median_s"]
    lines = format_table([("what", "command"), ("median_s", "median s"), ("min_s", "min s"), ("over", "over torch s")],
                         [{"what": name, **r, "over": r["median_s"] - torch_s} for name, r in start.items()],
                         {"median_s": ".3f", "min_s": ".3f", "over": "+.3f"})
    rows = [first_calls(op) for op in ("pairwise_cosine_stats", "gram_offdiag_penalty", "subspace_pga",
                                       "readout_basis", "svd")]
    lines += [""] + format_table(
        [("op", "op (fresh process)"), ("first_s", "first s"), ("later_s", "later s"),
         ("later_nothing_cached_s", "later, nothing cached s"), ("first_over_nothing_cached", "first/nothing cached"),
         ("first_over_later", "first/later"), ("dynamo_loaded", "torch._dynamo loaded")], rows,
        {"first_s": ".4f", "later_s": ".4f", "later_nothing_cached_s": ".4f", "first_over_nothing_cached": ".2f",
         "first_over_later": ".2f"})
    write_results(f"startup_{DEVICE}", {"rounds": ROUNDS, "startup": start, "first_calls": rows,
                                        "targets": {"import_over_torch_s": 0.3, "help_over_torch_s": 0.5,
                                                    "first_over_later_nothing_cached": 1.15}}, lines)
    assert not any(r["dynamo_loaded"] for r in rows), "an op imported torch._dynamo at its first call"


if __name__ == "__main__":
    test_startup_and_first_calls()
