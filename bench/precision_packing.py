"""Does a reduced precision for the packing steps change the science? The same grid of (k, d)
cells packed by the paper's method at precision "highest", "tf32" and "bf16", three seeds each,
on the CPU, where the cpu backend emulates the tensor cores by rounding the operands of both
GEMMs (csrc/operand_rounding.h). ε* and μ + 2σ are always measured by the exact kernel.

Per cell and seed: |Δε*|/ε* of each reduced precision against "highest" (same seed, same start),
next to the seed-to-seed spread of "highest" ((max − min)/mean of ε* over the seeds); a cell
passes the issue's criterion when every seed's |Δε*|/ε* is within that spread and below 0.5 %.

Two controls at precision "highest", from the same seeded starts:
- "highest, start +-1 ulp": every start coordinate moved by one float32 ulp (random sign, seeded;
  `packing.optimizer._initial_vectors` is wrapped here for those runs only, and their sweep files are named
  for it): how far ε* moves under one perturbation at the level of float32 rounding;
- "float64 steps": the steps' loss and gradient computed in float64 (backend "torch", the
  reference) and rounded to float32: a perturbation at the level of float32 rounding in every
  step, what another backend or a GPU (another summation order) does to one seed's trajectory.
Over all (cell, seed) pairs: the mean |Δε*|/ε*, and the mean signed Δε*/ε* with its standard error (a systematic shift
would show there). Also the constant C of the JL form ε = sqrt(C ln k / d) fitted to each
precision's cells.

    python bench/precision_packing.py                 # 12 cells x 3 seeds x 3 precisions, ~10 min on 2 cores
    python bench/precision_packing.py --steps 200     # a quick look

Each (precision, seed) is one resumable sweep file under bench/results/packing_precision_cpu/
(a killed run resumes); the summary goes to bench/results/packing_precision_cpu.json with a plot
(bench/_harness.py).
"""

import argparse
import contextlib
import os
import sys

import numpy as np
import torch

from repcap_fast import fitting, packing
from repcap_fast._progress import progress_bar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import OUT_DIR, format_table, write_results  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KS = (256, 512, 1024)
DS = (16, 32, 64, 128)
SEEDS = (0, 1, 2)
PRECISIONS = ("highest", "tf32", "bf16")
CONTROL = "highest, start +-1 ulp"
CONTROL64 = "float64 steps"
CONTROLS = (CONTROL, CONTROL64)
COMPARED = PRECISIONS[1:] + CONTROLS
LIMIT = 0.005  # |Δε*|/ε* must stay below 0.5 %


@contextlib.contextmanager
def ulp_perturbed_starts():
    """Inside: packing's seeded starts with every float32 coordinate moved by one ulp (random
    sign, seeded by the start's own seed)."""
    original = packing.optimizer._initial_vectors

    def perturbed(k, d, seed):
        x = original(k, d, seed).to(torch.float32)
        sign = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(seed + 1)) * 2 - 1
        toward = torch.where(sign > 0, torch.full_like(x, float("inf")), torch.full_like(x, -float("inf")))
        return torch.nextafter(x, toward).to(torch.float64)

    packing.optimizer._initial_vectors = perturbed
    try:
        yield
    finally:
        packing.optimizer._initial_vectors = original


def run_sweeps(steps: int, work: str):
    """{(precision, seed): {(k, d): cell}} from one sweep file per (precision or control, seed)."""
    os.makedirs(work, exist_ok=True)
    cells = {}
    runs = [(precision, seed) for seed in SEEDS for precision in PRECISIONS + CONTROLS]
    with progress_bar(True, total=len(runs), desc="precision x seed", unit="sweep", leave=True) as bar:
        for precision, seed in runs:
            tag = {CONTROL: "highest_start-ulp-perturbed", CONTROL64: "highest_float64-steps"}.get(precision, precision)
            out = os.path.join(work, f"{tag}_seed{seed}_steps{steps}.json")
            with ulp_perturbed_starts() if precision == CONTROL else contextlib.nullcontext():
                done = packing.sweep(KS, DS, out, steps=steps, seed=seed, progress=True,
                                     backend="torch" if precision == CONTROL64 else "cpu",
                                     precision="highest" if precision in CONTROLS else precision)
            cells[(precision, seed)] = {(c["k"], c["d"]): c for c in done}
            bar.update(1)
    return cells


def summarize(cells):
    rows, per_cell = [], {}
    for d in DS:
        for k in KS:
            high = np.array([cells[("highest", s)][(k, d)]["eps_star"] for s in SEEDS])
            spread = float((high.max() - high.min()) / high.mean())
            entry = {"k": k, "d": d, "eps_star_highest": high.tolist(), "seed_spread": spread}
            row = {"cell": f"k={k} d={d}", "eps": float(high.mean()), "spread": spread}
            passed = True
            for precision in COMPARED:
                eps = np.array([cells[(precision, s)][(k, d)]["eps_star"] for s in SEEDS])
                rel = np.abs(eps - high) / high
                mu2s = np.array([cells[(precision, s)][(k, d)]["mu_plus_2sigma"] for s in SEEDS])
                mu2s_high = np.array([cells[("highest", s)][(k, d)]["mu_plus_2sigma"] for s in SEEDS])
                ok = bool((rel <= spread).all() and (rel < LIMIT).all())
                if precision not in CONTROLS:  # the criterion is on tf32 and bf16
                    passed = passed and ok
                entry[precision] = {"eps_star": eps.tolist(), "rel_delta_eps": rel.tolist(),
                                    "rel_delta_mu_plus_2sigma": (np.abs(mu2s - mu2s_high) / mu2s_high).tolist(),
                                    "within_seed_spread_and_limit": ok}
                row[f"{precision}_max"] = float(rel.max())
                row[f"{precision}_ok"] = "yes" if ok else "NO"
            entry["passed"] = passed
            per_cell[f"{k}x{d}"] = entry
            rows.append(row)
    overall = {}
    for precision in COMPARED:
        signed = np.array([d for entry in per_cell.values()
                           for d in (np.array(entry[precision]["eps_star"]) - np.array(entry["eps_star_highest"]))
                           / np.array(entry["eps_star_highest"])])
        overall[precision] = {"mean_abs_rel_delta": float(np.abs(signed).mean()),
                              "mean_signed_rel_delta": float(signed.mean()),
                              "sem_signed_rel_delta": float(signed.std(ddof=1) / np.sqrt(len(signed)))}
    pairs = [abs(h[i] - h[j]) / np.mean(h) for entry in per_cell.values() for h in [entry["eps_star_highest"]]
             for i in range(len(h)) for j in range(i + 1, len(h))]
    overall["seed_to_seed_mean_abs_rel_delta"] = float(np.mean(pairs))
    fits = {}
    for precision in PRECISIONS + CONTROLS:
        mean_cells = [dict(cells[(precision, SEEDS[0])][(k, d)],
                           eps_star=float(np.mean([cells[(precision, s)][(k, d)]["eps_star"] for s in SEEDS])))
                      for d in DS for k in KS]
        res = fitting.fit(mean_cells, "jl")
        fits[precision] = {"C": res.params["C"], "r2": res.r2,
                           "per_seed_C": [fitting.fit(list(cells[(precision, s)].values()), "jl").params["C"]
                                          for s in SEEDS]}
    return rows, per_cell, fits, overall


def plot(per_cell, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(per_cell)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar(x, [per_cell[n]["seed_spread"] for n in names], color="0.85", label="seed-to-seed spread (highest)")
    for (precision, marker, color), shift in zip(((CONTROL, "x", "0.3"), (CONTROL64, "+", "C2"), ("tf32", "o", "C0"),
                                                  ("bf16", "s", "C3")), (-0.27, -0.09, 0.09, 0.27)):
        for i, n in enumerate(names):
            ax.scatter([x[i] + shift] * len(SEEDS), np.maximum(per_cell[n][precision]["rel_delta_eps"], 1e-7),
                       marker=marker, color=color, label=precision if i == 0 else None, zorder=3)
    ax.axhline(LIMIT, color="k", linestyle="--", linewidth=1, label="0.5 %")
    ax.set_yscale("log")
    ax.set_xticks(x, [n.replace("x", "\nd=") for n in names], fontsize=7)
    ax.set_xlabel("cell (k, d)")
    ax.set_ylabel("|Δε*| / ε* against highest (each seed)")
    ax.set_title("Packing steps at reduced precision (CPU emulation), paper's method")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per cell (default 2000)")
    args = parser.parse_args()
    name = "packing_precision_cpu" + ("" if args.steps == 2000 else f"_steps{args.steps}")
    cells = run_sweeps(args.steps, os.path.join(OUT_DIR, "packing_precision_cpu"))
    rows, per_cell, fits, overall = summarize(cells)
    lines = [f"packing at reduced precision (cpu emulation), method paper, {args.steps} steps, seeds {SEEDS}: "
             "max over seeds of |Δε*|/ε* against highest"]
    lines += format_table([("cell", "cell"), ("eps", "ε* (highest, mean)"), ("spread", "seed spread"),
                           ("tf32_max", "tf32 max"), ("tf32_ok", "ok"), ("bf16_max", "bf16 max"), ("bf16_ok", "ok"),
                           (f"{CONTROL}_max", "1 ulp max"), (f"{CONTROL}_ok", "ok"),
                           (f"{CONTROL64}_max", "float64 max"), (f"{CONTROL64}_ok", "ok")],
                          rows, {"eps": ".5f", "spread": ".2e", "tf32_max": ".2e", "bf16_max": ".2e",
                                 f"{CONTROL}_max": ".2e", f"{CONTROL64}_max": ".2e"})
    lines += [f"{precision}: mean |Δε*|/ε* {o['mean_abs_rel_delta']:.2e}, mean signed "
              f"{o['mean_signed_rel_delta']:+.2e} ± {o['sem_signed_rel_delta']:.1e} (standard error)"
              for precision, o in overall.items() if isinstance(o, dict)]
    lines.append(f"seed to seed at highest: mean |Δε*|/ε* {overall['seed_to_seed_mean_abs_rel_delta']:.2e}")
    lines += [f"JL fit C ({precision}): {fit['C']:.5f} (R2 {fit['r2']:.4f}; per seed "
              f"{', '.join(f'{c:.5f}' for c in fit['per_seed_C'])})" for precision, fit in fits.items()]
    passed = sum(entry["passed"] for entry in per_cell.values())
    lines.append(f"cells passing for tf32 and bf16 (every seed within the seed spread and below 0.5 %): {passed} of "
                 f"{len(per_cell)}")
    plot_path = os.path.join(OUT_DIR, f"{name}.png")
    plot(per_cell, plot_path)
    write_results(name, {"what": "packing.optimize (method paper) at each precision, cpu emulation",
                         "steps": args.steps, "ks": KS, "ds": DS, "seeds": SEEDS, "limit": LIMIT,
                         "controls": CONTROLS, "cells": per_cell, "overall": overall, "jl_fits": fits,
                         "cells_passing": passed,
                         "plot": os.path.relpath(plot_path, REPO)},  # relative: no path of this machine
                        lines)
    print(f"wrote {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
