"""Error of the cpu kernel against the float64 reference on the real MiniLM embeddings, for
float32, bfloat16 and float16 inputs (the same values cast, so only the arithmetic differs).

    python bench/precision_cosine_stats.py   # about 3 minutes on 2 cores
Writes bench/results/cosine_stats_cpu_precision_minilm.json.
"""

import json
import math
import os

import torch

import repcap_fast as rf
from repcap_fast.reference import pairwise_cosine_stats_reference
from repcap_fast.models import load_embeddings


def main():
    e = load_embeddings().input
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = e.to(dtype)
        s = rf.pairwise_cosine_stats(x, backend="cpu", progress=False)
        r = pairwise_cosine_stats_reference(x, bins=4096, lo=-1.0, hi=1.0)
        mean = r["sum"] / r["count"]
        std = math.sqrt(r["sum_sq"] / r["count"] - mean * mean)
        out[str(dtype)] = {
            "d_mean": abs(s.mean - mean), "d_std": abs(s.std - std),
            "d_eps": abs(s.epsilon() - mean - 2 * std),
            "d_min": abs(s.min - r["min"]), "d_max": abs(s.max - r["max"]),
            "hist_moved_frac": int((s.hist - r["hist"]).abs().sum()) / s.count, "eps": s.epsilon(),
        }
        print(dtype, out[str(dtype)], flush=True)
    path = os.path.join(os.path.dirname(__file__), "results", "cosine_stats_cpu_precision_minilm.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
