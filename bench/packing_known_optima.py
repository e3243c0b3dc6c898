"""How close the packing methods get to known optimal line packings: the real equiangular tight
frames (k lines in R^d whose coherence meets the Welch bound sqrt((k−d)/(d(k−1))), so the bound is
the optimum), from several seeds, with the paper's method beside the best one.

    python bench/packing_known_optima.py --out bench/results/packing_known_optima_cpu.json
"""

from __future__ import annotations

import argparse
import json

import torch
from tqdm import tqdm

from repcap_fast import capacity, packing

# (k, d) of real equiangular tight frames: the icosahedron's 6 diagonals, the 4 diagonals of the
# cube, the conference-matrix frames (2d lines in R^d for d = 5, 7, 9, 13), and 16 in R^6, 28 in
# R^7, 36 in R^15.
ETFS = [(4, 3), (6, 3), (10, 5), (14, 7), (16, 6), (18, 9), (26, 13), (28, 7), (36, 15)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", default="bench/results/packing_known_optima_cpu.json")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for k, d in tqdm(ETFS, desc="frames", unit="frame"):
        optimum = capacity.welch_bound(k, d)
        row = {"k": k, "d": d, "optimum": optimum}
        for method in ("paper", "minimax"):
            eps = [packing.optimize(k, d, steps=args.steps, seed=s, method=method, dtype=torch.float64,
                                    progress=False).eps_star for s in seeds]
            row[method] = {"eps_star": eps, "best_minus_optimum": min(eps) - optimum,
                           "seeds_within_1e-3": sum(e - optimum < 1e-3 for e in eps)}
        rows.append(row)
        print(f"({k:>2},{d:>2}) optimum {optimum:.6f}  paper best {row['paper']['best_minus_optimum']:+.2e}  "
              f"minimax best {row['minimax']['best_minus_optimum']:+.2e} "
              f"({row['minimax']['seeds_within_1e-3']}/{len(seeds)} seeds within 1e-3)", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"steps": args.steps, "seeds": seeds, "dtype": "float64", "frames": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
