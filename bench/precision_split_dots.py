"""How exact are cosines formed from split 16-bit or TF32 parts? The error against float64 of each
way a GPU could form the dot products of float32 unit rows, emulated on the CPU: every part is
a float32 value rounded to bfloat16 or TF32 (csrc/operand_rounding.h's rounding), so the products
of parts are exact in float32, as on the tensor cores, and only the float32 sums differ.

    x = hi + mid + lo          (bfloat16 parts: hi = bf16(x), mid = bf16(x − hi), lo = bf16(x − hi − mid))
    x = big + small            (TF32 parts)
    bf16x3 (2 parts):   hi·hi + hi·mid + mid·hi                       3 bf16 products
    bf16x6 (3 parts):   the above + hi·lo + lo·hi + mid·mid           6 bf16 products
    3xTF32:             big·big + big·small + small·big               3 TF32 products
against one IEEE float32 product (FMA), one TF32 and one bf16 product. Max and rms of
|c − c64| over the pairs i<j, on random unit rows (d = 256, 1024, 4096) and on 2048 real rows of
the MiniLM embedding matrix (every 15th row).

    python bench/precision_split_dots.py       # about a minute on 2 cores
Writes bench/results/precision_split_dots_cpu.json (bench/_harness.py).
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import format_table, write_results  # noqa: E402

ROWS = 2048


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)  # round to nearest even, as __float2bfloat16_rn


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to TF32 (nearest, ties away from zero), as round_to_tf32 of csrc/operand_rounding.h."""
    u = x.contiguous().numpy().view(np.uint32).astype(np.uint64)
    finite = (u & 0x7F800000) != 0x7F800000
    r = np.where(finite, (u + 0x1000) & 0xFFFFE000, u).astype(np.uint32)
    return torch.from_numpy(r.view(np.float32).copy())


def schemes(x: torch.Tensor) -> dict:
    def mm(a, b):
        return a @ b.T

    hi = to_bf16(x)
    mid = to_bf16(x - hi)
    lo = to_bf16(x - hi - mid)
    big = to_tf32(x)
    small = to_tf32(x - big)
    bf16x3 = mm(hi, hi) + mm(hi, mid) + mm(mid, hi)
    return {
        "fp32 FMA": mm(x, x),
        "bf16x3 (2 parts, 3 products)": bf16x3,
        "bf16x6 (3 parts, 6 products)": bf16x3 + mm(hi, lo) + mm(lo, hi) + mm(mid, mid),
        "3xTF32": mm(big, big) + mm(big, small) + mm(small, big),
        "tf32 (1 product)": mm(big, big),
        "bf16 (1 product)": mm(hi, hi),
    }


def errors(x64: torch.Tensor) -> dict:
    x = x64.to(torch.float32)
    ref = x64 @ x64.T
    iu = torch.triu_indices(x.shape[0], x.shape[0], 1)
    out = {}
    for name, c in schemes(x).items():
        e = (c.double() - ref)[iu[0], iu[1]].abs()
        out[name] = {"max": float(e.max()), "rms": float(e.pow(2).mean().sqrt())}
    return out


def main():
    cases = {}
    g = torch.Generator().manual_seed(0)
    for d in (256, 1024, 4096):
        x = torch.randn(ROWS, d, generator=g, dtype=torch.float64)
        cases[f"random d={d}"] = errors(torch.nn.functional.normalize(x, dim=1))
        print(f"random d={d} done", flush=True)
    try:
        from repcap_fast.models import load_embeddings

        e = load_embeddings().input[::15][:ROWS].to(torch.float64)
        cases["MiniLM (2048 rows) d=384"] = errors(torch.nn.functional.normalize(e, dim=1))
    except Exception as exc:  # the model package is optional here: say so, never hide it
        print(f"MiniLM skipped: {exc}", flush=True)
    names = list(next(iter(cases.values())))
    rows = [{"scheme": name, **{f"{case}|max": res[name]["max"] for case, res in cases.items()}} for name in names]
    lines = [f"max |c − c64| over the pairs i<j of {ROWS} unit rows (rms in the JSON)"]
    lines += format_table([("scheme", "scheme")] + [(f"{case}|max", case) for case in cases], rows,
                          {f"{case}|max": ".2e" for case in cases})
    write_results("precision_split_dots_cpu", {"what": "cosine error of split-precision dot products, emulated",
                                               "rows": ROWS, "results": cases}, lines)


if __name__ == "__main__":
    main()
