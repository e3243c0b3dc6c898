"""Triton kernel of pairwise_cosine_stats: tl.dot tiles + fused statistics epilogue.

Each program walks a fixed, strided set of tiles of the upper triangle (or of the full m x n
grid) and keeps its own partials: Σc and Σc² in float64 (each c squared and summed in float64),
min, max, counts below/above the histogram range, and its own int64 histogram slice (integer
atomics). The launcher merges the per-program partials on the host in program order, so results
are bitwise repeatable.
"""

import torch
import triton
import triton.language as tl

from .._backends import kernel_limits
from ._utils import device_guard, input_precision, interpreting, tile_counts, upper_tile_coords


# c_ij = clamp(a_i·b_j · inv‖a_i‖ · inv‖b_j‖, -1, 1) over kept pairs (j > i when SELF_PAIRS);
# per program: Σc, Σc², min c, max c, #(c < lo), #(c > hi), hist[floor((c - lo)·bins/(hi - lo))].
# Sizes are not specialized (a size of 1 would become a constexpr and recompile the kernel);
# d and the strides are, for aligned vector loads.
@triton.jit(do_not_specialize=["m", "n", "n_tiles", "n_col_tiles", "tiles_per_program", "bins"])
def _pairwise_cosine_stats_kernel(
    a_ptr, b_ptr, a_inv_ptr, b_inv_ptr,
    m, n, d, stride_a, stride_b, n_tiles, n_col_tiles, tiles_per_program,
    lo, hi, bins_per_unit, bins,
    sum_ptr, sum_sq_ptr, min_ptr, max_ptr, outside_ptr, hist_ptr,
    SELF_PAIRS: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    acc_sum = tl.zeros([1], dtype=tl.float64)
    acc_sum_sq = tl.zeros([1], dtype=tl.float64)
    acc_min = tl.full([1], float("inf"), dtype=tl.float32)
    acc_max = tl.full([1], float("-inf"), dtype=tl.float32)
    acc_below = tl.zeros([1], dtype=tl.int64)
    acc_above = tl.zeros([1], dtype=tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    for it in range(0, tiles_per_program):
        # Static strided assignment: program p takes tiles p, p + P, p + 2P, ...
        t_raw = pid.to(tl.int64) + it * n_programs
        tile_ok = t_raw < n_tiles
        t64 = tl.minimum(t_raw, n_tiles - 1)
        if SELF_PAIRS:
            bi, bj = upper_tile_coords(t64, n_col_tiles)
        else:
            bi = t64 // n_col_tiles
            bj = t64 % n_col_tiles
        rows = bi * BLOCK_M + offs_m + tl.where(tile_ok, 0, m)  # a spare iteration keeps nothing
        cols = bj * BLOCK_N + offs_n
        row_ok = rows < m
        col_ok = cols < n
        dots = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, d, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < d
            a = tl.load(a_ptr + rows[:, None] * stride_a + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + cols[:, None] * stride_b + ks[None, :],
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            dots = tl.dot(a, tl.trans(b), dots, input_precision=INPUT_PRECISION, out_dtype=dots.dtype)
        inv_a = tl.load(a_inv_ptr + rows, mask=row_ok, other=0.0)
        inv_b = tl.load(b_inv_ptr + cols, mask=col_ok, other=0.0)
        c = dots * inv_a[:, None] * inv_b[None, :]
        c = tl.minimum(tl.maximum(c, -1.0), 1.0)
        keep = row_ok[:, None] & col_ok[None, :]
        if SELF_PAIRS:
            keep = keep & (cols[None, :] > rows[:, None])
        c_kept = tl.where(keep, c, 0.0).to(tl.float64)
        acc_sum += tl.sum(tl.sum(c_kept, axis=1), axis=0)
        acc_sum_sq += tl.sum(tl.sum(c_kept * c_kept, axis=1), axis=0)
        acc_min = tl.minimum(acc_min, tl.min(tl.min(tl.where(keep, c, float("inf")), axis=1), axis=0))
        acc_max = tl.maximum(acc_max, tl.max(tl.max(tl.where(keep, c, float("-inf")), axis=1), axis=0))
        below = keep & (c < lo)
        above = keep & (c > hi)
        acc_below += tl.sum(tl.sum(below.to(tl.int32), axis=1), axis=0).to(tl.int64)
        acc_above += tl.sum(tl.sum(above.to(tl.int32), axis=1), axis=0).to(tl.int64)
        inside = keep & (c >= lo) & (c <= hi)
        bin_idx = tl.minimum(((c - lo) * bins_per_unit).to(tl.int32), bins - 1)
        bin_idx = tl.where(inside, bin_idx, 0)
        # Integer atomics into this program's own slice: order-independent, so deterministic.
        # (tl.histogram keeps bins/32 counters per thread: it spills and compiles for minutes.)
        tl.atomic_add(hist_ptr + pid.to(tl.int64) * bins + bin_idx,
                      tl.full([BLOCK_M, BLOCK_N], 1, tl.int64), mask=inside, sem="relaxed")
    one = tl.arange(0, 1)
    tl.store(sum_ptr + pid + one, acc_sum)
    tl.store(sum_sq_ptr + pid + one, acc_sum_sq)
    tl.store(min_ptr + pid + one, acc_min)
    tl.store(max_ptr + pid + one, acc_max)
    tl.store(outside_ptr + 2 * pid + one, acc_below)
    tl.store(outside_ptr + 2 * pid + 1 + one, acc_above)


def _config(dtype: torch.dtype, interp: bool):
    """(BLOCK_M=BLOCK_N, BLOCK_K, num_warps, num_stages)."""
    if interp:
        return 64, 64, 4, 1
    if dtype == torch.float32:
        return 128, 32, 8, 3
    return 128, 64, 8, 3


def _num_programs(n_tiles: int, slots: int) -> int:
    """Persistent programs: one per tile, at most `slots` (`_program_slots`)."""
    return max(1, min(n_tiles, slots))


def _program_slots(device: torch.device, interp: bool) -> int:
    """4 programs per SM on a GPU; 4 under the interpreter."""
    return 4 if interp else 4 * torch.cuda.get_device_properties(device).multi_processor_count


def _partials(programs: int, bins: int, device) -> dict:
    """Per-program partial buffers, poisoned: a slot the kernel fails to write shows up as NaN
    or a huge count (the histogram is counted into by atomics, so it starts at 0)."""
    poison = 1 << 60
    return {"sums": torch.full((programs,), float("nan"), dtype=torch.float64, device=device),
            "sums_sq": torch.full((programs,), float("nan"), dtype=torch.float64, device=device),
            "mins": torch.full((programs,), float("nan"), dtype=torch.float32, device=device),
            "maxs": torch.full((programs,), float("nan"), dtype=torch.float32, device=device),
            "outside": torch.full((programs, 2), poison, dtype=torch.int64, device=device),
            "hist": torch.zeros((programs, bins), dtype=torch.int64, device=device)}


def _launch(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision, programs, partials, interp):
    """Launches the kernel over `programs` programs into `partials` (contiguous a, b; b is None
    for the pairs i<j of a). No host synchronization."""
    self_pairs = b is None
    b = a if self_pairs else b
    b_inv_norm = a_inv_norm if self_pairs else b_inv_norm
    m, d = a.shape
    n = b.shape[0]
    block, block_k, num_warps, num_stages = _config(a.dtype, interp)
    n_tiles, col_tiles = tile_counts(m, n, self_pairs, block)
    # The same float32 histogram spec as make_histogram_spec in the C++/CUDA epilogue.
    spec_lo, spec_hi = float(torch.tensor(lo, dtype=torch.float32)), float(torch.tensor(hi, dtype=torch.float32))
    bins_per_unit = float(torch.tensor(bins / (spec_hi - spec_lo), dtype=torch.float32))
    _pairwise_cosine_stats_kernel[(programs,)](
        a, b, a_inv_norm, b_inv_norm,
        m, n, d, a.stride(0), b.stride(0), n_tiles, col_tiles, triton.cdiv(n_tiles, programs),
        spec_lo, spec_hi, bins_per_unit, bins,
        partials["sums"], partials["sums_sq"], partials["mins"], partials["maxs"], partials["outside"],
        partials["hist"],
        SELF_PAIRS=self_pairs,
        UPCAST=a.dtype != torch.float32 and interp,  # tl.dot on bf16 is wrong when interpreting
        INPUT_PRECISION=input_precision(precision, a.dtype),
        BLOCK_M=block, BLOCK_N=block, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )


def pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision="highest"):
    """Launcher. The contract of torch.ops.repcap_fast.pairwise_cosine_stats (csrc/module.cpp),
    with precision "highest" or "tf32" (float32 inputs).

    Returns (moments float64[4] = Σc, Σc², min, max; counts int64[3] = pairs, below, above;
    hist int64[bins]) on the CPU.
    """
    if not 1 <= bins <= kernel_limits().histogram_bins:
        raise ValueError(f"pairwise_cosine_stats (triton): bins must be in [1, {kernel_limits().histogram_bins}], "
                         f"got {bins}")
    interp = interpreting()
    self_pairs = b is None
    a, a_inv_norm = a.contiguous(), a_inv_norm.contiguous()
    if not self_pairs:
        b, b_inv_norm = b.contiguous(), b_inv_norm.contiguous()
    m = a.shape[0]
    n = m if self_pairs else b.shape[0]
    n_tiles, _ = tile_counts(m, n, self_pairs, _config(a.dtype, interp)[0])
    programs = _num_programs(n_tiles, _program_slots(a.device, interp))
    partials = _partials(programs, bins, a.device)
    with device_guard(a):
        _launch(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision, programs, partials, interp)
    # Fixed-order float64 merge of the per-program partials.
    sums, sums_sq = partials["sums"].cpu().tolist(), partials["sums_sq"].cpu().tolist()
    total_sum = total_sum_sq = 0.0
    for k in range(programs):
        total_sum += sums[k]
        total_sum_sq += sums_sq[k]
    moments = torch.tensor([total_sum, total_sum_sq, float(partials["mins"].min()), float(partials["maxs"].max())],
                           dtype=torch.float64)
    pairs = m * (m - 1) // 2 if self_pairs else m * n
    below, above = partials["outside"].sum(0).cpu().tolist()
    counts = torch.tensor([pairs, below, above], dtype=torch.int64)
    merged_hist = partials["hist"].sum(0).cpu()
    if not torch.isfinite(moments).all() or int(merged_hist.sum()) + below + above != pairs:
        raise RuntimeError("pairwise_cosine_stats (triton): internal error, a program did not write its partials")
    return moments, counts, merged_hist
