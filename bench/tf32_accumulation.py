"""Why the "tf32" statistics of the H200 run of 2026-12-04 sat 1.2e-5 below their model: the
accumulation models of a TF32 tensor core, emulated on the CPU on the GPU test's own input.

The GPU test (tests/test_pairwise_cosine_stats.py::test_tf32_on_a_gpu_uses_rows_rounded_to_nearest)
forms the cosines of 2048 near-duplicate rows (cosine ≈ 0.99, d = 1024) at precision "tf32" and
compares Σc with the model "rows rounded to TF32 to nearest, exact products, float32 sums rounded
to nearest". Measured on the H200 (relative to that model's Σc = 2054735.19):

    cuda panels, triton strided/grouped/grouped_tma   2054710.10   −1.22e-5
    cuda tiles (WMMA)                                  2054701.99   −1.62e-5

The TF32 products of rounded operands are exact (11 × 11 significand bits), so the difference is
in the sums. Tensor cores do not add in IEEE float32: per mma step of K products, the products
and the accumulator are aligned to the largest exponent among them and their bits below the
accumulator's precision are dropped (round toward zero), then the sum is normalized, again
truncating (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores",
PeerJ CS 2021, for V100/T4/A100). Models, each a dot product of length d over steps of K:

    rn        float32 sums rounded to nearest (the test's model)
    rz-step   each step's products summed exactly, added to the accumulator rounded toward zero
    align-g   every term of a step (accumulator included) truncated to 24 + g bits below the step's
              largest exponent, summed exactly, the result truncated to float32 (g extra bits)

The relative bias of Σc under each, on a random sample of the test's pairs, against the measured.

    python bench/tf32_accumulation.py          # about 20 s on 2 cores
Writes bench/results/tf32_accumulation_cpu.json (bench/_harness.py).
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from precision_split_dots import _round_toward_zero, to_tf32  # noqa: E402

from _harness import format_table, write_results  # noqa: E402

ROWS, D, SEED, NOISE = 2048, 1024, 9, 0.1  # the GPU test's near_duplicates(2048, 1024, seed=9)
SAMPLE_PAIRS = 20_000
MEASURED = {"cuda panels, triton (all variants)": 2054710.10, "cuda tiles (WMMA)": 2054701.99}
MODEL_SUM = 2054735.1884080563  # the test's model, printed by the H200 run


def near_duplicates(v, d, seed, noise):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, d, generator=g) + noise * torch.randn(v, d, generator=g)


def _rz32(v: np.ndarray) -> np.ndarray:
    """float64 → float32 values rounded toward zero, kept as float64."""
    return _round_toward_zero(v).astype(np.float64)


def _truncate_to(v: np.ndarray, quantum: np.ndarray) -> np.ndarray:
    """v rounded toward zero to a multiple of quantum (a power of two per row)."""
    return np.trunc(v / quantum) * quantum


def dot_products(prods: np.ndarray, model: str, k: int, g: int = 0) -> np.ndarray:
    """Σ_t prods[:, t] under one accumulation model (prods exact, float64, one row per pair)."""
    n, d = prods.shape
    if model == "rn":
        acc = np.zeros(n, dtype=np.float32)
        for t in range(d):
            acc = (acc + prods[:, t].astype(np.float32)).astype(np.float32)
        return acc.astype(np.float64)
    acc = np.zeros(n)
    for s in range(0, d, k):
        step = prods[:, s:s + k]
        if model == "rz-step":
            acc = _rz32(acc + step.sum(axis=1))
            continue
        terms = np.concatenate([acc[:, None], step], axis=1)
        big = np.abs(terms).max(axis=1)
        _, e = np.frexp(np.where(big > 0, big, 1.0))  # big in [2^(e-1), 2^e)
        quantum = np.ldexp(1.0, e - 24 - g)[:, None]
        acc = _rz32(_truncate_to(terms, quantum).sum(axis=1))
    return acc


def main():
    x = near_duplicates(ROWS, D, SEED, NOISE)
    r = to_tf32(x).double().numpy()
    inv = 1.0 / x.double().norm(dim=1).numpy()
    rng = np.random.default_rng(0)
    i = rng.integers(0, ROWS, SAMPLE_PAIRS)
    j = rng.integers(0, ROWS, SAMPLE_PAIRS)
    keep = i != j
    i, j = i[keep], j[keep]
    prods = r[i] * r[j]  # exact: 11 × 11 bits
    exact = prods.sum(axis=1) * inv[i] * inv[j]
    ref_sum = float(exact.sum())
    rows, out = [], {}
    cases = [("rn", 1, 0), ("rz-step", 8, 0), ("rz-step", 4, 0)]
    cases += [("align", k, g) for k in (8, 4) for g in (0, 1, 2, 3)]
    for model, k, g in cases:
        c = dot_products(prods, "rn" if model == "rn" else model, k, g) * inv[i] * inv[j]
        bias = (float(c.sum()) - ref_sum) / ref_sum
        name = "rn (float32, nearest)" if model == "rn" else f"{model}{'-' + str(g) if model == 'align' else ''}, K={k}"
        out[name] = {"relative_bias": bias, "rms_relative_error": float(np.sqrt(np.mean(((c - exact) / exact) ** 2)))}
        rows.append({"model": name, "bias": bias, "rms": out[name]["rms_relative_error"]})
        print(f"  {name}: {bias:.3e}", flush=True)
    measured = {k: (v - MODEL_SUM) / MODEL_SUM for k, v in MEASURED.items()}
    for name, bias in measured.items():
        rows.append({"model": f"measured on the H200 (12-04): {name}", "bias": bias})
    columns = [("model", "model"), ("bias", "relative bias of Σc"), ("rms", "rms relative error per cosine")]
    lines = format_table(columns, rows, {"bias": ".2e", "rms": ".2e"})
    lines.insert(0, f"near-duplicate rows {ROWS}×{D} (cosine ≈ 0.99), {len(i)} sampled pairs, rows rounded to TF32")
    write_results("tf32_accumulation_cpu", {"rows": ROWS, "d": D, "pairs": int(len(i)), "models": out,
                                            "measured_h200_20261204": measured}, lines)


if __name__ == "__main__":
    main()
