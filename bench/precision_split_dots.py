"""How exact are cosines formed from split 16-bit or TF32 parts? The error against float64 of each
way a GPU could form the dot products of float32 unit rows, emulated on the CPU: every part is
a float32 value rounded to bfloat16 or TF32 (csrc/operand_rounding.h's rounding), so the products
of parts are exact in float32, as on the tensor cores, and only the float32 sums differ.

    x = hi + mid + lo          (bfloat16 parts: hi = bf16(x), mid = bf16(x − hi), lo = bf16(x − hi − mid))
    x = big + small            (TF32 parts)
    bf16x3 (2 parts):   hi·hi + hi·mid + mid·hi                       3 bf16 products
    bf16x6 (3 parts):   the above + hi·lo + lo·hi + mid·mid           6 bf16 products
    3xTF32:             big·big + big·small + small·big               3 TF32 products
    fp16x3 (scaled):    y = x·2^15, h = fp16(y), l = fp16(y − h):
                        (l·h + h·l + h·h)·2^-30                        3 float16 products
against one IEEE float32 product (FMA), one TF32 and one bf16 product; and one TF32 product of
operands truncated to TF32 (their low 13 bits dropped), which is what tensor cores make of raw
float32 operands, and what repcap_fast's "tf32" paths avoid by rounding the rows to nearest first. fp16x3 is 3xTF32's
arithmetic (11-bit parts) at the 16-bit tensor-core rate, twice TF32's; the scale 2^15 keeps the
parts of unit rows (|x| ≤ 1, so |y| ≤ 32768 < 65504) above float16's subnormals down to |x| ≈ 2^-17,
and a part below that is off by at most 2^-40 absolute. Max and rms of |c − c64| over the pairs
i<j, and the mean of the signed error (a bias), on random unit rows (d = 256, 1024, 4096), on
near-duplicate rows at cosine ≈ 0.99 (d = 1024), and on 2048 real rows of the MiniLM embedding
matrix (every 15th row).

The sums above are float32 sums rounded to nearest. Tensor cores may instead truncate when they
add a step's products into the accumulator (round toward zero; measured on V100/A100, and reported
for H100). Second table: the fp16x3 and 3xTF32 sums under that model, on 1024 rows, d = 4096
(random, and near-duplicate rows at cosine ≈ 0.99, where the accumulator's ulp is largest):
every K step of 16 (fp16) or 8 (TF32) products is added exactly, then rounded toward zero to
float32: into one accumulator over all of d ("one accumulator"); into a fresh one per 32 of d
that is then added to the total rounded to nearest ("fresh per 32"); or those fresh accumulators
summed in groups of 8 first, then the groups into the total ("fresh per 32, groups of 8"), as the
Triton split kernel does.

    python bench/precision_split_dots.py       # about 5 minutes on 2 cores
Writes bench/results/precision_split_dots_cpu.json (bench/_harness.py).
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import format_table, write_results  # noqa: E402

ROWS = 2048
TRUNCATION_ROWS = 1024


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)  # round to nearest even, as __float2bfloat16_rn


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to TF32 (nearest, ties away from zero), as round_to_tf32 of csrc/operand_rounding.h."""
    u = x.contiguous().numpy().view(np.uint32).astype(np.uint64)
    finite = (u & 0x7F800000) != 0x7F800000
    r = np.where(finite, (u + 0x1000) & 0xFFFFE000, u).astype(np.uint32)
    return torch.from_numpy(r.view(np.float32).copy())


def truncated_tf32(x: torch.Tensor) -> torch.Tensor:
    """x with the 13 bits below TF32's mantissa cleared (toward zero): raw float32 on tensor cores."""
    return (x.contiguous().view(torch.int32) & -0x2000).view(torch.float32)


SCALE = 2.0 ** 15  # fp16x3: parts of y = x·SCALE, products scaled back by SCALE^-2


def fp16_split(x: torch.Tensor):
    """(h, l) float16 parts of y = x·2^15 as float32: h = fp16(y), l = fp16(y − h), round to nearest
    even (the split of triton_kernels.pairwise_cosine_stats.split_operand)."""
    y = x.to(torch.float64) * SCALE
    h = y.to(torch.float16)
    return h.to(torch.float32), (y - h.to(torch.float64)).to(torch.float16).to(torch.float32)


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
        "fp16x3 (scaled)": _fp16x3(x, mm),
        "tf32 (1 product)": mm(big, big),
        "tf32, operands truncated (1 product)": mm(truncated_tf32(x), truncated_tf32(x)),
        "bf16 (1 product)": mm(hi, hi),
    }


def _fp16x3(x, mm):
    h, lo = fp16_split(x)
    return (mm(lo, h) + mm(h, lo) + mm(h, h)) * (1.0 / SCALE**2)


def _round_toward_zero(v: np.ndarray) -> np.ndarray:
    """float64 → float32, rounded toward zero."""
    f = v.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(v)
    return np.where(over, np.nextafter(f, np.float32(0)), f)


def truncating_sum(pairs, k_step: int, fresh_every=None, group=None) -> np.ndarray:
    """Σ over `pairs` [(A, B), ...] (float32 parts, products exact) of A·Bᵀ as a tensor core that
    truncates would form it: per K step of k_step, each pair's step products summed exactly (float64)
    and added into a float32 accumulator rounded toward zero; with fresh_every, a fresh accumulator
    per that many of d, added into the float32 total rounded to nearest; with group, those are
    summed (rounded to nearest) in groups of `group` first, and the groups into the total."""
    d = pairs[0][0].shape[1]
    block = fresh_every or d
    total = np.zeros((pairs[0][0].shape[0], pairs[0][1].shape[0]), dtype=np.float32)
    pending = np.zeros_like(total)
    for n, b0 in enumerate(range(0, d, block)):
        acc = np.zeros_like(total)
        for k0 in range(b0, min(b0 + block, d), k_step):
            for a, b in pairs:
                step = a[:, k0:k0 + k_step].double().numpy() @ b[:, k0:k0 + k_step].double().numpy().T
                acc = _round_toward_zero(acc.astype(np.float64) + step)
        if fresh_every is None:
            total = acc
        elif group is None:
            total = (total + acc).astype(np.float32)
        else:
            pending = (pending + acc).astype(np.float32)
            if (n + 1) % group == 0 or b0 + block >= d:
                total = (total + pending).astype(np.float32)
                pending = np.zeros_like(total)
    return total


def truncation_errors(x64: torch.Tensor) -> dict:
    """max and rms |c − c64| over the pairs i<j of the fp16x3 and 3xTF32 sums under truncation."""
    x = x64.to(torch.float32)
    ref = (x64 @ x64.T).numpy()
    iu = np.triu_indices(x.shape[0], 1)
    h, lo = fp16_split(x)
    big = to_tf32(x)
    small = to_tf32(x - big)
    out = {}
    for name, pairs, k_step, scale in (("fp16x3 (scaled)", [(lo, h), (h, lo), (h, h)], 16, SCALE**-2),
                                       ("3xTF32", [(small, big), (big, small), (big, big)], 8, 1.0)):
        for how, fresh, group in (("one accumulator", None, None), ("fresh per 32", 32, None),
                                  ("fresh per 32, groups of 8", 32, 8)):
            c = truncating_sum(pairs, k_step, fresh, group).astype(np.float64) * scale
            e = np.abs(c - ref)[iu]
            out[f"{name}, {how}"] = {"max": float(e.max()), "rms": float(np.sqrt(np.mean(e**2)))}
        print(f"  {name} done", flush=True)
    return out


def errors(x64: torch.Tensor) -> dict:
    x = x64.to(torch.float32)
    ref = x64 @ x64.T
    iu = torch.triu_indices(x.shape[0], x.shape[0], 1)
    out = {}
    for name, c in schemes(x).items():
        e = (c.double() - ref)[iu[0], iu[1]]
        out[name] = {"max": float(e.abs().max()), "rms": float(e.pow(2).mean().sqrt()), "mean": float(e.mean())}
    return out


def main():
    cases = {}
    g = torch.Generator().manual_seed(0)
    for d in (256, 1024, 4096):
        x = torch.randn(ROWS, d, generator=g, dtype=torch.float64)
        cases[f"random d={d}"] = errors(torch.nn.functional.normalize(x, dim=1))
        print(f"random d={d} done", flush=True)
    g_dup = torch.Generator().manual_seed(1)  # its own stream: the other cases' draws stay as they were
    base = torch.randn(1, 1024, generator=g_dup, dtype=torch.float64)
    x = base + 0.1 * torch.randn(ROWS, 1024, generator=g_dup, dtype=torch.float64)
    cases["near-duplicates (c ≈ 0.99) d=1024"] = errors(torch.nn.functional.normalize(x, dim=1))
    try:
        from repcap_fast.models import load_embeddings

        e = load_embeddings().input[::15][:ROWS].to(torch.float64)
        cases["MiniLM (2048 rows) d=384"] = errors(torch.nn.functional.normalize(e, dim=1))
    except Exception as exc:  # the model package is optional here: say so, never hide it
        print(f"MiniLM skipped: {exc}", flush=True)
    trunc = {}
    x = torch.randn(TRUNCATION_ROWS, 4096, generator=g, dtype=torch.float64)
    trunc["random d=4096"] = truncation_errors(torch.nn.functional.normalize(x, dim=1))
    base = torch.randn(1, 4096, generator=g, dtype=torch.float64)
    x = base + 0.1 * torch.randn(TRUNCATION_ROWS, 4096, generator=g, dtype=torch.float64)
    trunc["near-duplicates (c ≈ 0.99) d=4096"] = truncation_errors(torch.nn.functional.normalize(x, dim=1))
    lines = [f"max |c − c64| over the pairs i<j of {ROWS} unit rows (rms in the JSON)"]
    lines += _table(cases)
    lines += ["", "mean signed c − c64 (a bias)"]
    lines += _table(cases, "mean")
    lines += ["", f"under truncating accumulation, {TRUNCATION_ROWS} rows: max |c − c64|"]
    lines += _table(trunc)
    write_results("precision_split_dots_cpu", {"what": "cosine error of split-precision dot products, emulated",
                                               "rows": ROWS, "results": cases,
                                               "truncation_rows": TRUNCATION_ROWS, "truncation": trunc}, lines)


def _table(cases: dict, stat: str = "max") -> list:
    names = list(next(iter(cases.values())))
    rows = [{"scheme": name, **{f"{case}|{stat}": res[name][stat] for case, res in cases.items()}} for name in names]
    return format_table([("scheme", "scheme")] + [(f"{case}|{stat}", case) for case in cases], rows,
                        {f"{case}|{stat}": ".2e" for case in cases})


if __name__ == "__main__":
    main()
