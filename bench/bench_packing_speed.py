"""Steps per second of every packing method, side by side in one run (issue 36: each non-paper
method at ≥ 30 steps/s at (2000, 32) on this CPU).

Each method runs `--steps` steps from the same start (seed 0, float32, "highest") at (2000, 32) and
(8192, 256); the seconds of a run with 2 steps more are subtracted from, so the fixed cost of a
run (ε* of the start and of the result, the statistics) cancels:
steps/s = steps / (seconds(2 + steps) − seconds(2)). The methods alternate, so a slower machine
moment hits them alike; the polish of "minimax" is left out (polish_steps=0: it is a fixed number
of linear programs after the steps, not a per-step cost). "alternating-projection" is refused
beyond k = 4096 (it holds k×k Grams) and is timed at (2000, 32) only.

    python bench/bench_packing_speed.py          # about 3 minutes on 2 cores
Writes bench/results/packing_speed_cpu.json (bench/_harness.py).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from repcap_fast import packing  # noqa: E402
from repcap_fast.packing import METHODS  # noqa: E402

from _harness import SMOKE, format_table, write_results  # noqa: E402

CELLS = [(2000, 32, 60), (8192, 256, 4)] if not SMOKE else [(300, 16, 10), (600, 32, 4)]


def run_seconds(k, d, method, steps):
    extra = {"polish_steps": 0} if method == "minimax" else {}
    t0 = time.perf_counter()
    packing.optimize(k, d, steps=steps, method=method, seed=0, progress=False, **extra)
    return time.perf_counter() - t0


def main():
    rows = []
    for k, d, steps in CELLS:
        # equiangular-search: no real equiangular tight frame exists at these (k, d), so it refuses them
        methods = [m for m in METHODS if m != "equiangular-search" and not (m == "alternating-projection" and k > 4096)]
        base = {m: run_seconds(k, d, m, 2) for m in methods}  # also warms each method up
        for m in methods:
            seconds = run_seconds(k, d, m, steps + 2) - base[m]
            rows.append({"k": k, "d": d, "method": m, "steps": steps, "seconds": seconds,
                         "steps_per_s": steps / seconds if seconds > 0 else None})
            print(f"  ({k}, {d}) {m}: {rows[-1]['steps_per_s']:.3g} steps/s", flush=True)
    columns = [("k", "k"), ("d", "d"), ("method", "method"), ("steps", "steps"), ("steps_per_s", "steps/s")]
    write_results("packing_speed_cpu", {"rows": rows}, format_table(columns, rows, {"steps_per_s": ".3g"}))


if __name__ == "__main__":
    main()
