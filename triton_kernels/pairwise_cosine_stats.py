"""Triton kernels of pairwise_cosine_stats: tl.dot tiles + fused statistics epilogue.

Three variants, selected by name (``KERNEL_VARIANTS``; the environment variable
``REPCAP_TRITON_STATS_KERNEL``, default "auto": the variant measured fastest for the dtype and d,
from the table of repcap_fast/_kernel_choices.py):

* "strided": each program walks a fixed, strided set of tiles of the upper triangle (or of the
  full m x n grid) in row-major tile order and keeps its own partials: Σc and Σc² in float64
  (each c converted and summed in float64), min, max, counts below/above the histogram range,
  and its own int64 histogram slice (one integer atomic per pair). The launcher merges the
  per-program partials on the host in program order.
* "grouped": persistent programs over the tiles in a grouped (super-tile) order, so the tiles in
  flight at once share few row and column panels, which stay in L2; each tile is reduced in
  float32 (Σc, Σc², min, max, below, above) and written as one partial per tile (the sums as
  float64), summed afterwards by torch over the tiles (a fixed reduction tree); the histogram of
  each tile is counted in registers over a window of WINDOW bins centred on the tile mean's bin
  (the cosines of a tile cluster: σ ≈ 1/√d) and added to the program's slice with one vector of
  integer atomics, only the pairs outside the window taking one atomic each.
* "grouped_tma": the grouped kernel reading its operand blocks through TMA tensor descriptors
  (the hardware copies each block to shared memory, zero-filled past the matrix; no address
  arithmetic or masks in registers). It applies where rows are a multiple of 16 bytes on a GPU of
  compute capability 9 or newer (``tma_applies``); elsewhere it runs as "grouped".

Both are bitwise repeatable (the partials do not depend on the schedule, and are merged in a fixed
order), and their integer counts are exact.

float32 inputs at precision "highest" run the split pass (``FP32_PASSES``; the environment variable
``REPCAP_TRITON_STATS_FP32_PASS``, default "split"): each unit row x̂ = x/‖x‖, scaled to
y = x̂·2^15, is split into two float16 parts, h = fp16(y) and l = fp16(y − h) (``split_operand``),
and the kernel forms y_i·y_j ≈ l_i·h_j + h_i·l_j + h_i·h_j from three float16 tensor-core products,
which are exact in float32, scaled back by 2^-30. That is 3xTF32's arithmetic (11-bit parts) at
the 16-bit rate, twice TF32's; 2^15 keeps the parts of unit rows (|y| ≤ 2^15 < 65504) clear of
float16's subnormals down to |x̂| ≈ 2^-17, and a smaller part is off by at most 2^-40. The three
products of each BLOCK_K step go into a fresh float32 accumulator; the steps are summed rounded to
nearest in groups of SPLIT_GROUP_STEPS, and the groups into the tile's dots. Tensor cores may
truncate as they accumulate: one accumulator over all of d would then bias a cosine near 1 by about
1e-5 (bench/precision_split_dots.py). The error per cosine is float32's (about 2e-7 on MiniLM).
"ieee" runs float32 FMA dots instead (no tensor cores).

float32 inputs at precision "tf32" are rounded to TF32 to nearest by the launcher, once
(``kernel_operands``), and the kernel's TF32 dots then use them exactly: the tensor cores' own
handling of raw float32 operands (reported to drop the low 13 bits) never applies, and the
cosines are those of the cuda backend's kernels, which round the same way (cvt.rna.tf32.f32).
"""

import dataclasses
import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .._backends import kernel_limits
from .._kernel_choices import choose
from ._utils import device_guard, input_precision, interpreting, round_to_tf32, tile_counts, upper_tile_coords

# The split pass sums its BLOCK_K steps in groups of this many (then the groups): a cosine near 1
# under truncating tensor cores is off by about 3e-7 at d = 4096 with groups of 8 steps of 32,
# against 8e-7 with the steps summed straight into the tile's dots (bench/precision_split_dots.py).
SPLIT_GROUP_STEPS = tl.constexpr(8)


# The dot products of one tile, Σ_k a_ik·b_jk over d in BLOCK_K steps, accumulated in float32.
# With TMA, a_ptr and b_ptr are tensor descriptors of blocks [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K]
# and the tile's blocks start at rows row0 and col0: the hardware copies them to shared memory,
# filling rows and columns past the matrix with zeros (what the masked loads give).
@triton.jit
def _tile_dots(a_ptr, b_ptr, rows, cols, row0, col0, m, n, d, stride_a, stride_b, UPCAST: tl.constexpr,
               INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    offs_k = tl.arange(0, BLOCK_K)
    dots = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        if TMA:
            a = a_ptr.load([row0, k0])
            b = b_ptr.load([col0, k0])
        else:
            ks = k0 + offs_k
            a = tl.load(a_ptr + rows[:, None] * stride_a + ks[None, :],
                        mask=(rows < m)[:, None] & (ks < d)[None, :], other=0.0)
            b = tl.load(b_ptr + cols[:, None] * stride_b + ks[None, :],
                        mask=(cols < n)[:, None] & (ks < d)[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        dots = tl.dot(a, tl.trans(b), dots, input_precision=INPUT_PRECISION, out_dtype=dots.dtype)
    return dots


# The split pass's dot products of one tile: a, b hold the high float16 parts h of the scaled rows,
# a_lo, b_lo the low parts l. Each BLOCK_K step forms l_a·h_bᵀ + h_a·l_bᵀ + h_a·h_bᵀ (smallest
# products first) in a fresh float32 accumulator, so the tensor cores never add into a large
# running sum; the steps are summed in float32, rounded to nearest, per group of GROUP_STEPS steps,
# and the groups into the tile's dots, which keeps that rounding small too (a two-level sum).
# (With TMA, the four operands are tensor descriptors, as in _tile_dots.)
@triton.jit
def _split_tile_dots(a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, rows, cols, row0, col0, m, n, d, stride_a, stride_b,
                     UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_STEPS: tl.constexpr):
    offs_k = tl.arange(0, BLOCK_K)
    dots = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, d, BLOCK_K * GROUP_STEPS):
        group = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(g0, tl.minimum(g0 + BLOCK_K * GROUP_STEPS, d), BLOCK_K):
            if TMA:
                a = a_ptr.load([row0, k0])
                b = b_ptr.load([col0, k0])
                a_lo = a_lo_ptr.load([row0, k0])
                b_lo = b_lo_ptr.load([col0, k0])
            else:
                ks = k0 + offs_k
                a_offs = rows[:, None] * stride_a + ks[None, :]
                b_offs = cols[:, None] * stride_b + ks[None, :]
                a_mask = (rows < m)[:, None] & (ks < d)[None, :]
                b_mask = (cols < n)[:, None] & (ks < d)[None, :]
                a = tl.load(a_ptr + a_offs, mask=a_mask, other=0.0)
                b = tl.load(b_ptr + b_offs, mask=b_mask, other=0.0)
                a_lo = tl.load(a_lo_ptr + a_offs, mask=a_mask, other=0.0)
                b_lo = tl.load(b_lo_ptr + b_offs, mask=b_mask, other=0.0)
            if UPCAST:
                a, b, a_lo, b_lo = a.to(tl.float32), b.to(tl.float32), a_lo.to(tl.float32), b_lo.to(tl.float32)
            step = tl.dot(a_lo, tl.trans(b), input_precision=INPUT_PRECISION, out_dtype=tl.float32)
            step = tl.dot(a, tl.trans(b_lo), step, input_precision=INPUT_PRECISION, out_dtype=tl.float32)
            step = tl.dot(a, tl.trans(b), step, input_precision=INPUT_PRECISION, out_dtype=tl.float32)
            group += step
        dots += group
    return dots


# The cosines of one tile, rows × cols of a against b (a spare iteration passes rows ≥ m):
#   c_ij = clamp(a_i·b_j · inv‖a_i‖ · inv‖b_j‖, −1, 1), the dot products from _tile_dots, or from
#   _split_tile_dots when SPLIT (the inverse norms are then 2^-15); keep = the pairs inside both
#   matrices (and j > i when SELF_PAIRS). The operand blocks start at rows row0 and col0 (TMA).
@triton.jit
def _cosine_tile(a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, a_inv_ptr, b_inv_ptr, rows, cols, row0, col0, m, n, d,
                 stride_a, stride_b, SELF_PAIRS: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 SPLIT: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    row_ok = rows < m
    col_ok = cols < n
    if SPLIT:
        dots = _split_tile_dots(a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, rows, cols, row0, col0, m, n, d, stride_a,
                                stride_b, UPCAST, INPUT_PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_GROUP_STEPS)
    else:
        dots = _tile_dots(a_ptr, b_ptr, rows, cols, row0, col0, m, n, d, stride_a, stride_b, UPCAST,
                          INPUT_PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    inv_a = tl.load(a_inv_ptr + rows, mask=row_ok, other=0.0)
    inv_b = tl.load(b_inv_ptr + cols, mask=col_ok, other=0.0)
    c = tl.minimum(tl.maximum(dots * inv_a[:, None] * inv_b[None, :], -1.0), 1.0)
    keep = row_ok[:, None] & col_ok[None, :]
    if SELF_PAIRS:
        keep = keep & (cols[None, :] > rows[:, None])
    return c, keep


# c_ij = clamp(a_i·b_j · inv‖a_i‖ · inv‖b_j‖, -1, 1) over kept pairs (j > i when SELF_PAIRS);
# per program: Σc, Σc², min c, max c, #(c < lo), #(c > hi), hist[floor((c - lo)·bins/(hi - lo))].
# Sizes are not specialized (a size of 1 would become a constexpr and recompile the kernel);
# d and the strides are, for aligned vector loads.
@triton.jit(do_not_specialize=["m", "n", "n_tiles", "n_col_tiles", "tiles_per_program", "bins"])
def _pairwise_cosine_stats_kernel(
    a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, a_inv_ptr, b_inv_ptr,
    m, n, d, stride_a, stride_b, n_tiles, n_col_tiles, tiles_per_program,
    lo, hi, bins_per_unit, bins,
    sum_ptr, sum_sq_ptr, min_ptr, max_ptr, outside_ptr, hist_ptr,
    SELF_PAIRS: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
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
        rows = bi * BLOCK_M + tl.arange(0, BLOCK_M) + tl.where(tile_ok, 0, m)  # a spare iteration keeps nothing
        cols = bj * BLOCK_N + tl.arange(0, BLOCK_N)
        c, keep = _cosine_tile(a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, a_inv_ptr, b_inv_ptr, rows, cols, 0, 0, m, n, d,
                               stride_a, stride_b, SELF_PAIRS, UPCAST, INPUT_PRECISION, SPLIT, False,
                               BLOCK_M, BLOCK_N, BLOCK_K)
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


# The grouped variant. Tile t = (bi, bj) = (order[2t], order[2t+1]) (the grouped order, built on
# the host); program p takes tiles p, p + P, ... so the P tiles in flight are consecutive in that
# order. Per tile, over its kept pairs (j > i when SELF_PAIRS), c_ij = clamp(a_i·b_j·inv_a_i·inv_b_j):
#   tile_sum[t] = Σc, tile_sq[t] = Σc² (float64 sums over the tile),
#   tile_min[t], tile_max[t], tile_outside[t] = (#c < lo, #c > hi);
#   hist[p, bin] += #{c in bin} with bin = min(floor((c − lo)·bins_per_unit), bins − 1) for
#   lo ≤ c ≤ hi: counted in registers over bins [b0, b0 + WINDOW) centred on the tile mean's bin,
#   then one integer atomic per window bin; a pair outside the window takes its own atomic.
@triton.jit(do_not_specialize=["m", "n", "n_tiles", "tiles_per_program", "bins"])
def _pairwise_cosine_stats_grouped_kernel(
    a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, a_inv_ptr, b_inv_ptr, order_ptr,
    m, n, d, stride_a, stride_b, n_tiles, tiles_per_program,
    lo, hi, bins_per_unit, bins,
    tile_sum_ptr, tile_sq_ptr, tile_min_ptr, tile_max_ptr, tile_outside_ptr, hist_ptr,
    SELF_PAIRS: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WINDOW: tl.constexpr,
):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_w = tl.arange(0, WINDOW)
    hist_row = hist_ptr + pid.to(tl.int64) * bins
    for it in range(0, tiles_per_program):
        t_raw = pid.to(tl.int64) + it * n_programs
        tile_ok = t_raw < n_tiles
        t = tl.minimum(t_raw, n_tiles - 1)
        bi = tl.load(order_ptr + 2 * t).to(tl.int64)
        bj = tl.load(order_ptr + 2 * t + 1).to(tl.int64)
        rows = bi * BLOCK_M + tl.arange(0, BLOCK_M) + tl.where(tile_ok, 0, m)  # a spare iteration keeps nothing
        cols = bj * BLOCK_N + tl.arange(0, BLOCK_N)
        row0 = (bi * BLOCK_M).to(tl.int32)  # the tile's first row and column (TMA block coordinates)
        col0 = (bj * BLOCK_N).to(tl.int32)
        c, keep = _cosine_tile(a_ptr, b_ptr, a_lo_ptr, b_lo_ptr, a_inv_ptr, b_inv_ptr, rows, cols, row0, col0,
                               m, n, d, stride_a, stride_b, SELF_PAIRS, UPCAST, INPUT_PRECISION, SPLIT, TMA,
                               BLOCK_M, BLOCK_N, BLOCK_K)
        # float64 sums, as the one-pass kernel and the CUDA kernels: with float32 tile sums the
        # rounding of Σc² (~1e-7 relative) leaks into σ² = Σc²/n − μ² amplified by μ²/σ²
        c_kept = tl.where(keep, c, 0.0).to(tl.float64)
        tl.store(tile_sum_ptr + t, tl.sum(tl.sum(c_kept, axis=1), axis=0), mask=tile_ok)
        tl.store(tile_sq_ptr + t, tl.sum(tl.sum(c_kept * c_kept, axis=1), axis=0), mask=tile_ok)
        tl.store(tile_min_ptr + t, tl.min(tl.min(tl.where(keep, c, float("inf")), axis=1), axis=0), mask=tile_ok)
        tl.store(tile_max_ptr + t, tl.max(tl.max(tl.where(keep, c, float("-inf")), axis=1), axis=0), mask=tile_ok)
        below = tl.sum(tl.sum((keep & (c < lo)).to(tl.int32), axis=1), axis=0)
        above = tl.sum(tl.sum((keep & (c > hi)).to(tl.int32), axis=1), axis=0)
        tl.store(tile_outside_ptr + 2 * t, below, mask=tile_ok)
        tl.store(tile_outside_ptr + 2 * t + 1, above, mask=tile_ok)
        inside = keep & (c >= lo) & (c <= hi)
        bin_idx = tl.minimum(((c - lo) * bins_per_unit).to(tl.int32), bins - 1)
        # The window: WINDOW bins centred on the bin of the tile's mean, kept inside [0, bins). The
        # tile's pair count per row is counted from the indices (no pass over the tile).
        first_col = bj * BLOCK_N
        if SELF_PAIRS:
            first_col = tl.maximum(first_col, rows + 1)
        last_col = tl.minimum(bj * BLOCK_N + BLOCK_N, n)
        n_kept = tl.sum(tl.where(rows < m, tl.maximum(last_col - first_col, 0), 0), axis=0)
        tile_mean = tl.sum(tl.sum(c_kept, axis=1), axis=0) / tl.maximum(n_kept, 1).to(tl.float32)
        b_mean = ((tl.minimum(tl.maximum(tile_mean, lo), hi) - lo) * bins_per_unit).to(tl.int32)
        b0 = tl.maximum(tl.minimum(b_mean - WINDOW // 2, bins - WINDOW), 0)
        rel = bin_idx - b0
        in_window = inside & (rel >= 0) & (rel < WINDOW)
        window = tl.histogram(tl.reshape(tl.where(in_window, rel, 0), [BLOCK_M * BLOCK_N]), WINDOW,
                              mask=tl.reshape(in_window, [BLOCK_M * BLOCK_N]))
        tl.atomic_add(hist_row + b0 + offs_w, window.to(tl.int64), mask=(window > 0) & (b0 + offs_w < bins),
                      sem="relaxed")
        beyond = inside & ((rel < 0) | (rel >= WINDOW))  # the tails of a tile wider than the window
        tl.atomic_add(hist_row + tl.where(beyond, bin_idx, 0), tl.full([BLOCK_M, BLOCK_N], 1, tl.int64),
                      mask=beyond, sem="relaxed")


# Tiles per side of a super-tile of the grouped order (GROUP x GROUP tiles): the operand panels
# of the tiles in flight at once (2·GROUP panels of BLOCK rows × d) should fit in L2.
GROUP_L2_BYTES = 24 << 20
# Histogram bins counted in registers per tile (tests shrink it). A tile's cosines spread over
# about 2048/√d of 4096 bins per σ (σ ≈ 1/√d): 128 bins hold ±2σ at d = 4096 and ±0.9σ at d = 896;
# ptxas for sm_90 (Triton 3.6, bf16 tiles of 128×128, 8 warps) spills 352 bytes per thread at 128
# bins, 88 at 64 (the strided kernel: 192), once per tile, in the epilogue.
WINDOW = 128


def _group_size(block: int, d: int, itemsize: int) -> int:
    panel = block * d * itemsize
    return max(2, min(16, GROUP_L2_BYTES // (2 * panel)))


@functools.lru_cache(maxsize=16)
def _grouped_order_cpu(row_tiles: int, col_tiles: int, self_pairs: bool, group: int) -> torch.Tensor:
    """(n_tiles, 2) int32 tile coordinates (bi, bj) in grouped order: super-tiles of group×group
    tiles, row-major over the super-tile grid (its upper triangle for self pairs), each super-tile
    row-major inside (only bi ≤ bj for self pairs)."""
    if self_pairs:
        bi, bj = torch.triu_indices(row_tiles, col_tiles, dtype=torch.int64)
    else:
        bi = torch.arange(row_tiles).repeat_interleave(col_tiles)
        bj = torch.arange(col_tiles).repeat(row_tiles)
    super_cols = -(-col_tiles // group)
    key = ((bi // group) * super_cols + bj // group) * (group * group) + (bi % group) * group + bj % group
    order = torch.argsort(key)
    return torch.stack([bi[order], bj[order]], dim=1).to(torch.int32).contiguous()


@functools.lru_cache(maxsize=16)
def _grouped_order_on(row_tiles: int, col_tiles: int, self_pairs: bool, group: int, device: str) -> torch.Tensor:
    """The grouped order on `device`, copied there once (a call's jobs share it)."""
    return _grouped_order_cpu(row_tiles, col_tiles, self_pairs, group).to(device)


def _grouped_order(row_tiles: int, col_tiles: int, self_pairs: bool, group: int, device) -> torch.Tensor:
    return _grouped_order_on(row_tiles, col_tiles, self_pairs, group, str(torch.device(device)))


def _config(dtype: torch.dtype, interp: bool, split: bool = False):
    """(BLOCK_M=BLOCK_N, BLOCK_K, num_warps, num_stages). On a GPU the split pass loads four
    float16 tiles per step (32 KB per stage at BLOCK_K = 32) and refreshes its accumulator every 32
    of d."""
    if interp:
        return 64, 64, 4, 1
    if dtype == torch.float32 or split:
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


def _histogram_spec(bins: int, lo: float, hi: float):
    """(lo, hi, bins_per_unit) as float32 values: the spec of make_histogram_spec in the C++/CUDA
    epilogue, so every backend bins a cosine alike."""
    spec_lo, spec_hi = float(torch.tensor(lo, dtype=torch.float32)), float(torch.tensor(hi, dtype=torch.float32))
    return spec_lo, spec_hi, float(torch.tensor(bins / (spec_hi - spec_lo), dtype=torch.float32))


SPLIT_SCALE = 2.0 ** 15  # the split pass's rows y = x̂·2^15: |y| ≤ 2^15 < 65504, float16's largest
FP32_PASSES = ("split", "ieee")
FP32_PASS_ENV = "REPCAP_TRITON_STATS_FP32_PASS"


def fp32_pass() -> str:
    """How float32 inputs at "highest" form their dot products: REPCAP_TRITON_STATS_FP32_PASS,
    "split" (the default: three float16 tensor-core products of split rows) or "ieee" (float32
    FMA), or a ValueError naming the variable."""
    name = os.environ.get(FP32_PASS_ENV, "split")
    if name not in FP32_PASSES:
        raise ValueError(f"{FP32_PASS_ENV} must be one of {FP32_PASSES}, got {name!r}")
    return name


def split_operand(x: torch.Tensor, inv_norm: torch.Tensor, chunk_bytes: int = 256 << 20):
    """(h, l, inv): the float16 parts of the scaled unit rows y = x·inv_norm·2^15, formed in
    float64, h = fp16(y) and l = fp16(y − h) (round to nearest), so y = h + l to about 2^-22·|y|;
    inv is 2^-15 per row, the kernel's scale back. Worked in row chunks of chunk_bytes of float64."""
    m, d = x.shape
    hi = torch.empty(m, d, dtype=torch.float16, device=x.device)
    lo = torch.empty_like(hi)
    rows = max(1, chunk_bytes // (8 * d))
    for r0 in range(0, m, rows):
        y = x[r0:r0 + rows].to(torch.float64) * (inv_norm[r0:r0 + rows].to(torch.float64) * SPLIT_SCALE)[:, None]
        h = y.to(torch.float16)
        hi[r0:r0 + rows] = h
        lo[r0:r0 + rows] = (y - h.to(torch.float64)).to(torch.float16)
    return hi, lo, torch.full((m,), 1.0 / SPLIT_SCALE, dtype=torch.float32, device=x.device)


@dataclasses.dataclass(frozen=True)
class KernelOperands:
    """What a kernel reads: a and b (b None for the pairs i<j of a) with their inverse norms; for
    the split pass, the high parts in a and b and the low parts in a_lo and b_lo (otherwise a_lo
    is a, b_lo is b, unread)."""

    a: torch.Tensor
    a_lo: torch.Tensor
    a_inv: torch.Tensor
    b: Optional[torch.Tensor]
    b_lo: Optional[torch.Tensor]
    b_inv: Optional[torch.Tensor]
    split: bool
    dtype: torch.dtype  # the inputs' dtype (float32 for the split pass)


def kernel_operands(a, a_inv_norm, b, b_inv_norm, precision: str) -> KernelOperands:
    """The operands of one launch: float32 inputs at "highest" split when fp32_pass() is "split";
    float32 inputs at "tf32" rounded to TF32 to nearest (round_to_tf32, as the cuda backend's
    kernels do), since tl.dot hands the tensor cores raw float32 values, which they are reported to
    truncate (dropping the low 13 bits biases cosines near 1 by about -7e-4 at d = 1024, where
    rounded rows err by at most 7e-5 without bias; bench/precision_split_dots.py). The inverse
    norms stay those of the unrounded rows."""
    if a.dtype == torch.float32 and precision == "tf32":
        a = round_to_tf32(a)
        b = None if b is None else round_to_tf32(b)
        return KernelOperands(a, a, a_inv_norm, b, b, b_inv_norm, False, torch.float32)
    if a.dtype != torch.float32 or precision != "highest" or fp32_pass() != "split":
        return KernelOperands(a, a, a_inv_norm, b, b, b_inv_norm, False, a.dtype)
    a_hi, a_lo, a_inv = split_operand(a, a_inv_norm)
    b_hi, b_lo, b_inv = (None, None, None) if b is None else split_operand(b, b_inv_norm)
    return KernelOperands(a_hi, a_lo, a_inv, b_hi, b_lo, b_inv, True, torch.float32)


def _launch(ops: KernelOperands, bins, lo, hi, precision, programs, partials, interp):
    """Launches the kernel over `programs` programs into `partials` (contiguous operands; ops.b
    None for the pairs i<j of ops.a). No host synchronization."""
    self_pairs = ops.b is None
    a, a_lo, a_inv_norm = ops.a, ops.a_lo, ops.a_inv
    b, b_lo, b_inv_norm = (a, a_lo, a_inv_norm) if self_pairs else (ops.b, ops.b_lo, ops.b_inv)
    block, block_k, num_warps, num_stages = _config(ops.dtype, interp, ops.split)
    n_tiles, col_tiles = tile_counts(a.shape[0], b.shape[0], self_pairs, block)
    spec_lo, spec_hi, bins_per_unit = _histogram_spec(bins, lo, hi)
    m, d = a.shape
    n = b.shape[0]
    _pairwise_cosine_stats_kernel[(programs,)](
        a, b, a_lo, b_lo, a_inv_norm, b_inv_norm,
        m, n, d, a.stride(0), b.stride(0), n_tiles, col_tiles, triton.cdiv(n_tiles, programs),
        spec_lo, spec_hi, bins_per_unit, bins,
        partials["sums"], partials["sums_sq"], partials["mins"], partials["maxs"], partials["outside"],
        partials["hist"],
        SELF_PAIRS=self_pairs,
        UPCAST=a.dtype != torch.float32 and interp,  # tl.dot on bf16 is wrong when interpreting
        INPUT_PRECISION=input_precision(precision, a.dtype), SPLIT=ops.split,
        BLOCK_M=block, BLOCK_N=block, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )


KERNEL_VARIANTS = ("strided", "grouped", "grouped_tma")
KERNEL_ENV = "REPCAP_TRITON_STATS_KERNEL"


def kernel_variant(dtype: torch.dtype, d: int) -> str:
    """The variant that runs for inputs of `dtype` with `d` columns: REPCAP_TRITON_STATS_KERNEL, or
    for "auto" (the default) the packaged table's choice (repcap_fast._kernel_choices.choose); a
    ValueError names the variable."""
    name = os.environ.get(KERNEL_ENV, "auto")
    if name == "auto":
        return choose("pairwise_cosine_stats", "triton", dtype, d)
    if name not in KERNEL_VARIANTS:
        raise ValueError(f"{KERNEL_ENV} must be 'auto' or one of {KERNEL_VARIANTS}, got {name!r}")
    return name


def tma_applies(ops: KernelOperands, interp: bool) -> bool:
    """Whether the operands can be read through TMA tensor descriptors: rows of a multiple of 16
    bytes starting at 16-byte aligned addresses (so every row starts aligned; a row slice of a
    larger matrix, as the jobs pass, keeps that), on a GPU of compute capability 9 or newer
    (Hopper's tensor memory accelerator) or under the interpreter."""
    operands = [x for x in (ops.a, ops.a_lo, ops.b, ops.b_lo) if x is not None]
    if any(x.shape[1] * x.element_size() % 16 or x.data_ptr() % 16 for x in operands):
        return False
    return interp or torch.cuda.get_device_capability(ops.a.device)[0] >= 9


def _descriptor(x: torch.Tensor, block: int, block_k: int) -> TensorDescriptor:
    """A TMA descriptor of the rows of x (contiguous), read in blocks of block × block_k."""
    return TensorDescriptor.from_tensor(x, [block, block_k])


def _launch_grouped(ops: KernelOperands, bins, lo, hi, precision, programs, partials, interp, tma=False):
    """The grouped kernel over `programs` programs into `partials` (_grouped_partials); with tma
    (tma_applies), the operands are read through TMA tensor descriptors."""
    self_pairs = ops.b is None
    a, a_lo, a_inv_norm = ops.a, ops.a_lo, ops.a_inv
    b, b_lo, b_inv_norm = (a, a_lo, a_inv_norm) if self_pairs else (ops.b, ops.b_lo, ops.b_inv)
    block, block_k, num_warps, num_stages = _config(ops.dtype, interp, ops.split)
    n_tiles = partials["tile_sum"].shape[0]
    spec_lo, spec_hi, bins_per_unit = _histogram_spec(bins, lo, hi)
    m, d = a.shape
    n = b.shape[0]
    stride_a, stride_b = a.stride(0), b.stride(0)
    if tma:
        descriptors = {id(x): _descriptor(x, block, block_k) for x in (a, a_lo, b, b_lo)}  # shared ones once
        a, a_lo, b, b_lo = (descriptors[id(x)] for x in (a, a_lo, b, b_lo))
    _pairwise_cosine_stats_grouped_kernel[(programs,)](
        a, b, a_lo, b_lo, a_inv_norm, b_inv_norm, partials["order"],
        m, n, d, stride_a, stride_b, n_tiles, triton.cdiv(n_tiles, programs),
        spec_lo, spec_hi, bins_per_unit, bins,
        partials["tile_sum"], partials["tile_sq"], partials["tile_min"], partials["tile_max"],
        partials["tile_outside"], partials["hist"],
        SELF_PAIRS=self_pairs,
        UPCAST=ops.a.dtype != torch.float32 and interp,  # tl.dot on bf16 is wrong when interpreting
        INPUT_PRECISION=input_precision(precision, ops.a.dtype), SPLIT=ops.split, TMA=tma,
        BLOCK_M=block, BLOCK_N=block, BLOCK_K=block_k, WINDOW=min(WINDOW, triton.next_power_of_2(bins)),
        num_warps=num_warps, num_stages=num_stages,
    )


def _grouped_partials(m: int, n: int, d: int, self_pairs: bool, dtype: torch.dtype, programs: int, bins: int,
                      device, interp: bool) -> dict:
    """The grouped order and the per-tile partials, poisoned (NaN sums, huge counts) so a tile the
    kernel fails to write shows up; the histogram slices start at 0 (atomics count into them)."""
    block = _config(dtype, interp)[0]
    row_tiles, col_tiles = triton.cdiv(m, block), triton.cdiv(n, block)
    order = _grouped_order(row_tiles, col_tiles, self_pairs, _group_size(block, d, torch.finfo(dtype).bits // 8),
                           device)
    n_tiles = order.shape[0]
    nan = float("nan")
    return {"order": order,
            "tile_sum": torch.full((n_tiles,), nan, dtype=torch.float64, device=device),
            "tile_sq": torch.full((n_tiles,), nan, dtype=torch.float64, device=device),
            "tile_min": torch.full((n_tiles,), nan, dtype=torch.float32, device=device),
            "tile_max": torch.full((n_tiles,), nan, dtype=torch.float32, device=device),
            "tile_outside": torch.full((n_tiles, 2), 1 << 30, dtype=torch.int32, device=device),
            "hist": torch.zeros((programs, bins), dtype=torch.int64, device=device)}


def pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision="highest"):
    """Launcher. The contract of torch.ops.repcap_fast.pairwise_cosine_stats (csrc/module.cpp),
    with precision "highest" or "tf32" (float32 inputs); the kernel variant of kernel_variant(),
    and for float32 inputs at "highest" the pass of fp32_pass().

    Returns (moments float64[4] = Σc, Σc², min, max; counts int64[3] = pairs, below, above;
    hist int64[bins]) on the CPU.
    """
    if not 1 <= bins <= kernel_limits().histogram_bins:
        raise ValueError(f"pairwise_cosine_stats (triton): bins must be in [1, {kernel_limits().histogram_bins}], "
                         f"got {bins}")
    interp = interpreting()
    variant = kernel_variant(a.dtype, a.shape[1])
    self_pairs = b is None
    a, a_inv_norm = a.contiguous(), a_inv_norm.contiguous()
    if not self_pairs:
        b, b_inv_norm = b.contiguous(), b_inv_norm.contiguous()
    m = a.shape[0]
    n = m if self_pairs else b.shape[0]
    n_tiles, _ = tile_counts(m, n, self_pairs, _config(a.dtype, interp)[0])
    programs = _num_programs(n_tiles, _program_slots(a.device, interp))
    pairs = m * (m - 1) // 2 if self_pairs else m * n
    with device_guard(a):
        ops = kernel_operands(a, a_inv_norm, b, b_inv_norm, precision)
    if variant in ("grouped", "grouped_tma"):
        partials = _grouped_partials(m, n, a.shape[1], self_pairs, a.dtype, programs, bins, a.device, interp)
        with device_guard(a):
            _launch_grouped(ops, bins, lo, hi, precision, programs, partials, interp,
                            tma=variant == "grouped_tma" and tma_applies(ops, interp))
        # torch's float64 sum of the per-tile partials: a fixed reduction tree, the same on every run.
        moments = torch.stack([partials["tile_sum"].sum(), partials["tile_sq"].sum(),
                               partials["tile_min"].min().double(), partials["tile_max"].max().double()]).cpu()
        below, above = partials["tile_outside"].sum(0, dtype=torch.int64).cpu().tolist()
    else:
        partials = _partials(programs, bins, a.device)
        with device_guard(a):
            _launch(ops, bins, lo, hi, precision, programs, partials, interp)
        # Fixed-order float64 merge of the per-program partials.
        sums, sums_sq = partials["sums"].cpu().tolist(), partials["sums_sq"].cpu().tolist()
        total_sum = total_sum_sq = 0.0
        for k in range(programs):
            total_sum += sums[k]
            total_sum_sq += sums_sq[k]
        moments = torch.tensor([total_sum, total_sum_sq, float(partials["mins"].min()),
                                float(partials["maxs"].max())], dtype=torch.float64)
        below, above = partials["outside"].sum(0).cpu().tolist()
    counts = torch.tensor([pairs, below, above], dtype=torch.int64)
    merged_hist = partials["hist"].sum(0).cpu()
    if not torch.isfinite(moments).all() or int(merged_hist.sum()) + below + above != pairs:
        raise RuntimeError(f"pairwise_cosine_stats (triton, {variant}): internal error, a program did not write its "
                           "partials")
    return moments, counts, merged_hist
