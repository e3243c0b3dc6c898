"""Error of the cpu kernel against the float64 reference on the real MiniLM embeddings, for
float32, bfloat16 and float16 inputs (the same values cast, so only the arithmetic differs).

    python bench/precision_cosine_stats.py   # about 3 minutes on 2 cores
Writes bench/results/cosine_stats_cpu_precision_minilm.json (bench/_harness.py).
"""

import math
import os
import sys

import torch

import repcap_fast as rf
from repcap_fast.models import load_embeddings
from repcap_fast.reference import pairwise_cosine_stats_reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import format_table, write_results  # noqa: E402


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
    lines = format_table([("dtype", "input"), ("d_mean", "|Δμ|"), ("d_std", "|Δσ|"), ("d_eps", "|Δε|"),
                          ("d_min", "|Δmin|"), ("d_max", "|Δmax|"), ("hist_moved_frac", "pairs in another bin")],
                         [{"dtype": k.replace("torch.", ""), **v} for k, v in out.items()],
                         {k: ".2g" for k in ("d_mean", "d_std", "d_eps", "d_min", "d_max", "hist_moved_frac")})
    write_results("cosine_stats_cpu_precision_minilm", {"op": "pairwise_cosine_stats (cpu) against float64",
                                                        "results": out}, lines)


if __name__ == "__main__":
    main()
