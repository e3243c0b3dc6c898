"""Triton kernel of pairwise_cosine_stats: tl.dot tiles + fused statistics epilogue.

Each program walks a fixed, strided set of tiles of the upper triangle (or of the full m x n
grid) and keeps its own partials: Σc and Σc² in float64 (each c squared and summed in float64),
min, max, counts below/above the histogram range, and its own int64 histogram slice (integer
atomics). The launcher merges
the per-program partials on the host in program order, so results are bitwise repeatable.
"""

import contextlib
import os

import torch
import triton
import triton.language as tl

# math_mode of the op (repcap_fast.cosine_stats.PRECISIONS) -> tl.dot input_precision.
MATH_EXACT_FP32 = 0
MATH_TF32 = 1
_INPUT_PRECISION = {MATH_EXACT_FP32: "ieee", MATH_TF32: "tf32"}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _upper_tile_coords(t, nb):
    # Row-major enumeration of tiles bi <= bj: row bi starts at bi*nb - bi*(bi-1)/2.
    two_n1 = tl.cast(2 * nb + 1, tl.float64)  # nb may be a constexpr int (== 1) on GPU
    disc = two_n1 * two_n1 - 8.0 * t.to(tl.float64)
    bi = ((two_n1 - tl.sqrt(tl.maximum(disc, 0.0))) * 0.5).to(tl.int64)
    bi = tl.minimum(tl.maximum(bi, 0), nb - 1)
    bi = tl.where(bi * nb - bi * (bi - 1) // 2 > t, bi - 1, bi)
    bi = tl.where((bi + 1) * nb - (bi + 1) * bi // 2 <= t, bi + 1, bi)
    bj = bi + (t - (bi * nb - bi * (bi - 1) // 2))
    return bi, bj


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
            bi, bj = _upper_tile_coords(t64, n_col_tiles)
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


def _config(dtype: torch.dtype, interpreting: bool):
    """(BLOCK_M=BLOCK_N, BLOCK_K, num_warps, num_stages)."""
    if interpreting:
        return 64, 64, 4, 1
    if dtype == torch.float32:
        return 128, 32, 8, 3
    return 128, 64, 8, 3


def _num_programs(n_tiles: int, device: torch.device, interpreting: bool) -> int:
    if interpreting:
        return max(1, min(n_tiles, 4))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(n_tiles, 4 * sms))


def pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, math_mode):
    """Launcher. Same contract as torch.ops.repcap_fast.pairwise_cosine_stats.

    Returns (moments float64[4] = Σc, Σc², min, max; counts int64[3] = pairs, below, above;
    hist int64[bins]) on the CPU.
    """
    interpreting = _interpreting()
    self_pairs = b is None
    a = a.contiguous()
    b = a if self_pairs else b.contiguous()
    a_inv_norm = a_inv_norm.contiguous()
    b_inv_norm = a_inv_norm if self_pairs else b_inv_norm.contiguous()
    m, d = a.shape
    n = b.shape[0]
    block, block_k, num_warps, num_stages = _config(a.dtype, interpreting)
    row_tiles = triton.cdiv(m, block)
    col_tiles = triton.cdiv(n, block)
    n_tiles = row_tiles * (row_tiles + 1) // 2 if self_pairs else row_tiles * col_tiles
    programs = _num_programs(n_tiles, a.device, interpreting)
    dev = a.device
    # Poisoned partials: a slot the kernel fails to write shows up as NaN or a huge count.
    poison = 1 << 60
    sums = torch.full((programs,), float("nan"), dtype=torch.float64, device=dev)
    sums_sq = torch.full((programs,), float("nan"), dtype=torch.float64, device=dev)
    mins = torch.full((programs,), float("nan"), dtype=torch.float32, device=dev)
    maxs = torch.full((programs,), float("nan"), dtype=torch.float32, device=dev)
    outside = torch.full((programs, 2), poison, dtype=torch.int64, device=dev)
    hist = torch.zeros((programs, bins), dtype=torch.int64, device=dev)  # counted into by atomics
    # The same float32 histogram spec as make_histogram_spec in the C++/CUDA epilogue.
    spec_lo, spec_hi = float(torch.tensor(lo, dtype=torch.float32)), float(torch.tensor(hi, dtype=torch.float32))
    bins_per_unit = float(torch.tensor(bins / (spec_hi - spec_lo), dtype=torch.float32))
    upcast = a.dtype != torch.float32 and interpreting  # tl.dot on bf16 is wrong when interpreting
    guard = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
    with guard:  # launch on the input's GPU
        _pairwise_cosine_stats_kernel[(programs,)](
            a, b, a_inv_norm, b_inv_norm,
            m, n, d, a.stride(0), b.stride(0), n_tiles, col_tiles, triton.cdiv(n_tiles, programs),
            spec_lo, spec_hi, bins_per_unit, bins,
            sums, sums_sq, mins, maxs, outside, hist,
            SELF_PAIRS=self_pairs, UPCAST=upcast,
            # input_precision only concerns float32 operands; 16-bit ones keep Triton's default.
            INPUT_PRECISION=_INPUT_PRECISION[math_mode] if a.dtype == torch.float32 else "tf32",
            BLOCK_M=block, BLOCK_N=block, BLOCK_K=block_k,
            num_warps=num_warps, num_stages=num_stages,
        )
    # Fixed-order float64 merge of the per-program partials.
    sums, sums_sq, mins, maxs = sums.cpu(), sums_sq.cpu(), mins.cpu(), maxs.cpu()
    total_sum = 0.0
    total_sum_sq = 0.0
    for k in range(programs):
        total_sum += float(sums[k])
        total_sum_sq += float(sums_sq[k])
    moments = torch.tensor(
        [total_sum, total_sum_sq, float(mins.min()), float(maxs.max())], dtype=torch.float64
    )
    pairs = m * (m - 1) // 2 if self_pairs else m * n
    below, above = outside.sum(0).cpu().tolist()
    counts = torch.tensor([pairs, below, above], dtype=torch.int64)
    merged_hist = hist.sum(0).cpu()
    if not torch.isfinite(moments).all() or int(merged_hist.sum()) + below + above != pairs:
        raise RuntimeError("pairwise_cosine_stats (triton): internal error, a program did not write its partials")
    return moments, counts, merged_hist
