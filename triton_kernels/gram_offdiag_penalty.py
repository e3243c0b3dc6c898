"""Triton kernels of gram_offdiag_penalty: the off-diagonal Gram power penalty, streamed.

For the rows i ∈ [row_offset, row_offset + m) of x (k×d) and g = x xᵀ (never materialized),
per row i (output row r = i − row_offset; the square penalty is row_offset = 0, m = k):
    m_i        = max_{j≠i} |g_ij|                                   (row_max, x.dtype; 0 when k = 1)
    s_i        = Σ_{j≠i} (|g_ij| / m_i)^p                           (row_sum, float64; 0 when m_i = 0)
    grad_dir_i = Σ_{j≠i} sign(g_ij) (|g_ij| / m_i)^(p-1) x_j        (x.dtype; 0 when m_i = 0)
The caller forms L = Σ_i m_i^p s_i and ∂L/∂x_i = 2p m_i^(p-1) grad_dir_i in float64. Powers are only
taken of ratios r = min(|g|/m, 1) ∈ [0, 1], with m the running maximum of the very |g| values that
are scaled (online rescaling as in flash attention), so nothing overflows for large |g| or p and the
largest terms never underflow.

Kernels:
  * forward only (any d): one program per row block streams all column blocks; Gram tiles in
    registers, the running (m, s) per row. One Gram, no scratch.
  * with grad, d ≤ FUSED_MAX_D[dtype]: the same stream with the (BLOCK_M × d) gradient
    accumulator in registers: acc ← β·acc + W X_J per column block (flash-attention forward with
    head dimension d).
  * with grad, larger d: column panels of at most PANEL_COLS columns (and PANEL_MAX_ELEMS scratch
    elements) for a row panel: (1) a Gram-tile kernel writes tile-local weights
    W'_ij = sign(g_ij)(|g_ij|/t_i)^(p-1) with t_i the tile's own row maximum, and per-tile
    (t_i, Σ_j (|g_ij|/t_i)^p); (2) a merge kernel folds the tile partials into the running
    (m, s) and gives β = (m_old/m_new)^(p-1) and γ_tile = (t/m_new)^(p-1); (3) a GEMM kernel
    acc ← β·acc + (γ∘W') X_panel. The Gram is formed once, the W X product once.

Everything is bitwise repeatable: fixed reduction orders, no float atomics. Integer powers by
repeated squaring with a runtime exponent (one compiled kernel serves every p).

Precision (float32 x): "highest" IEEE float32 dots; "tf32" both dots' operands (x, and the
weights) rounded to TF32 to nearest, then TF32 tensor cores; "bf16" the operands cast to bfloat16;
float32 accumulation. Under the interpreter both are rounded in the bits (see _operand), as the C++
CPU kernel emulates them.
"""

import math
from collections import namedtuple

import torch
import triton
import triton.language as tl

from .._backends import kernel_limits
from ._utils import device_guard, input_precision, interpreting

# Largest d for which the gradient accumulator (BLOCK_M × next_pow2(d)) stays in registers; beyond
# it the panel path runs. Tests monkeypatch these to drive either path at small sizes.
FUSED_MAX_D = {torch.float32: 256, torch.float64: 128}
# Panel path: columns per panel (rounded down to the tile quantum) and the largest scratch panel
# (rows × columns, elements of x.dtype) of tile-local weights.
PANEL_COLS = 2048
PANEL_MAX_ELEMS = 1 << 26


# r^e for an integer e = Σ_b bit_b 2^b ≥ 0 with nbits = e.bit_length(): repeated squaring,
# r^0 = 1 (also for r = 0).
@triton.jit
def _powi(r, e, nbits):
    out = tl.full(r.shape, 1.0, r.dtype)
    base = r
    for b in range(0, nbits):
        out = tl.where(((e >> b) & 1) != 0, out * base, out)
        base = base * base
    return out


# a/b rounded to nearest (float32 `/` is div.full, within 2 ulp; float64 `/` is div.rn).
@triton.jit
def _div_rn(a, b):
    if a.dtype == tl.float64:
        return a / b
    else:
        return tl.div_rn(a, b)


# 1/m where m > 0, else 0 (the row has no nonzero entry yet).
@triton.jit
def _safe_inv(m):
    pos = m > 0
    return tl.where(pos, _div_rn(tl.full(m.shape, 1.0, m.dtype), tl.where(pos, m, 1.0)), 0.0)


# ρ = m_old/m_new in float64 (0 where m_new = 0); returns (ρ^e, ρ^(e+1)).
@triton.jit
def _rescale(m_old, m_new, e, nbits):
    mo = m_old.to(tl.float64)
    mn = m_new.to(tl.float64)
    pos = mn > 0
    ratio = tl.where(pos, mo / tl.where(pos, mn, 1.0), 0.0)
    power = _powi(ratio, e, nbits)
    return power, power * ratio


# A dot operand v (float32 or float64) in the format of the op's precision (ROUNDING, see
# _operand_rounding): "none" as loaded; "bf16" cast to bfloat16 (round to nearest even; exact
# products, float32 sums); "tf32_rna" rounded to TF32 in the bits (nearest, ties away from zero, as
# csrc/operand_rounding.h), so the TF32 tensor cores see exact TF32 values; "bf16_rne" rounded to
# bfloat16 in the bits, the values kept float32 (the interpreter: its tl.dot returns garbage for
# bfloat16 operands, and its float32 → bfloat16 cast truncates). NaN and ±Inf pass through.
@triton.jit
def _operand(v, ROUNDING: tl.constexpr):
    if ROUNDING == "bf16":
        return v.to(tl.bfloat16)
    elif ROUNDING == "tf32_rna" or ROUNDING == "bf16_rne":
        u = v.to(tl.uint32, bitcast=True)
        if ROUNDING == "tf32_rna":
            rounded = (u + 0x1000) & 0xFFFFE000
        else:
            rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        special = (u & 0x7F800000) == 0x7F800000
        return tl.where(special, v, rounded.to(tl.float32, bitcast=True))
    else:
        return v


# G = X[rows] X[cols]ᵀ, accumulated over d in BLOCK_K steps in x's dtype (float32 or float64),
# the operands in the format of ROUNDING.
@triton.jit
def _gram_tile(x_ptr, rows, cols, row_ok, col_ok, d, stride_x,
               INPUT_PRECISION: tl.constexpr, ROUNDING: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_k = tl.arange(0, BLOCK_K)
    a_base = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    b_base = x_ptr + cols.to(tl.int64)[:, None] * stride_x
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=x_ptr.dtype.element_ty)
    for k0 in range(0, d, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < d
        a = tl.load(a_base + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_base + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        g = tl.dot(_operand(a, ROUNDING), tl.trans(_operand(b, ROUNDING)), g, input_precision=INPUT_PRECISION,
                   out_dtype=g.dtype)
    return g


# g_ij on kept pairs (j < k, j ≠ i by global index), 0 elsewhere.
@triton.jit
def _offdiag(g, rows, cols, k):
    keep = (cols[None, :] < k) & (cols[None, :] != rows[:, None])
    return tl.where(keep, g, 0.0)


# r = |g|/m per row: min(|g|·(1/m), 1) (the min only removes rounding excess), and exactly 1 where
# |g| = m > 0, so each row's largest term is exactly 1 (s ≥ 1 even for huge p); 0 where m = 0.
@triton.jit
def _ratio(a, m, inv):
    top = tl.where(m > 0, 1.0, 0.0).to(a.dtype)
    return tl.where(a < m[:, None], tl.minimum(a * inv[:, None], 1.0), top[:, None])


# Per tile with row maximum m ≥ max|g|: w = sign(g)·r^(p-1) (0 where g = 0, also for p = 1) and
# Σ_j r^p per row (float64). r is formed twice rather than kept live through the power loop.
@triton.jit
def _weights_and_sums(g, m, pm1, nbits):
    inv = _safe_inv(m)
    pw = _powi(_ratio(tl.abs(g), m, inv), pm1, nbits)
    sums = tl.sum((pw * _ratio(tl.abs(g), m, inv)).to(tl.float64), axis=1)
    w = tl.where(g > 0, pw, tl.where(g < 0, -pw, 0.0))
    return w, sums


# Per row block I (rows i = row_offset + r, r < m), streamed over column blocks J:
#   G = X_I X_Jᵀ,  a_ij = |G_ij| (j ≠ i),  m' = max(m, max_j a_ij),
#   s ← s·(m/m')^p + Σ_j min(a_ij/m', 1)^p  (float64),  m ← m'.
# Out: row_max[r] = m_i, row_sum[r] = s_i. Sizes and the exponent p (pbits = p.bit_length()) are
# not specialized (a value of 1 would become a constexpr); d and the stride are, for aligned loads.
@triton.jit(do_not_specialize=["k", "row_offset", "m", "p", "pbits"])
def _gram_offdiag_forward_kernel(
    x_ptr, k, row_offset, m, d, stride_x, p, pbits,
    row_max_ptr, row_sum_ptr,
    INPUT_PRECISION: tl.constexpr, ROUNDING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    local = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = row_offset + local
    row_ok = local < m
    mx = tl.zeros([BLOCK_M], dtype=x_ptr.dtype.element_ty)
    s = tl.zeros([BLOCK_M], dtype=tl.float64)
    for col0 in range(0, k, BLOCK_N):
        cols = col0 + tl.arange(0, BLOCK_N)
        g = _gram_tile(x_ptr, rows, cols, row_ok, cols < k, d, stride_x,
                       INPUT_PRECISION, ROUNDING, BLOCK_M, BLOCK_N, BLOCK_K)
        a = tl.abs(_offdiag(g, rows, cols, k))
        m_new = tl.maximum(mx, tl.max(a, axis=1))
        terms = _powi(_ratio(a, m_new, _safe_inv(m_new)), p, pbits)
        alpha, _ = _rescale(mx, m_new, p, pbits)
        s = s * alpha + tl.sum(terms.to(tl.float64), axis=1)
        mx = m_new
    tl.store(row_max_ptr + local, mx, mask=row_ok)
    tl.store(row_sum_ptr + local, s, mask=row_ok)


# As the forward kernel, plus the gradient direction with X_I and the accumulator in registers
# (d ≤ BLOCK_D):
#   w_ij = sign(G_ij)·min(a_ij/m', 1)^(p-1) (0 where a_ij = 0),
#   acc ← acc·(m/m')^(p-1) + W X_J     (the operands of both dots in the format of ROUNDING).
# Out: grad[r, :d] = acc_i.
@triton.jit(do_not_specialize=["k", "row_offset", "m", "pm1", "nbits"])
def _gram_offdiag_fused_kernel(
    x_ptr, k, row_offset, m, d, stride_x, pm1, nbits,
    row_max_ptr, row_sum_ptr, grad_ptr, stride_grad,
    INPUT_PRECISION: tl.constexpr, ROUNDING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    local = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = row_offset + local
    row_ok = local < m
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d
    dtype = x_ptr.dtype.element_ty
    xi = _operand(tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + offs_d[None, :],
                          mask=row_ok[:, None] & d_ok[None, :], other=0.0), ROUNDING)
    mx = tl.zeros([BLOCK_M], dtype=dtype)
    s = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=dtype)
    for col0 in range(0, k, BLOCK_N):
        cols = col0 + tl.arange(0, BLOCK_N)
        xj = _operand(tl.load(x_ptr + cols.to(tl.int64)[:, None] * stride_x + offs_d[None, :],
                              mask=(cols < k)[:, None] & d_ok[None, :], other=0.0), ROUNDING)
        g = tl.dot(xi, tl.trans(xj), tl.zeros([BLOCK_M, BLOCK_N], dtype=dtype),
                   input_precision=INPUT_PRECISION, out_dtype=dtype)
        g = _offdiag(g, rows, cols, k)
        m_new = tl.maximum(mx, tl.max(tl.abs(g), axis=1))
        w, sums = _weights_and_sums(g, m_new, pm1, nbits)
        beta, alpha = _rescale(mx, m_new, pm1, nbits)
        s = s * alpha + sums
        acc = tl.dot(_operand(w, ROUNDING), xj, acc * beta.to(dtype)[:, None], input_precision=INPUT_PRECISION,
                     out_dtype=dtype)
        mx = m_new
    tl.store(row_max_ptr + local, mx, mask=row_ok)
    tl.store(row_sum_ptr + local, s, mask=row_ok)
    tl.store(grad_ptr + local.to(tl.int64)[:, None] * stride_grad + offs_d[None, :], acc,
             mask=row_ok[:, None] & d_ok[None, :])


# Panel step 1. Tile (ib, jb) of the panel rows row0.., columns col0..:
#   G = X_I X_Jᵀ,  a_ij = |G_ij| (j ≠ i),  t_i = max_j a_ij,  r_ij = min(a_ij/t_i, 1),
#   W'_ij = sign(G_ij) r_ij^(p-1)  (0 where a_ij = 0),   σ_i = Σ_j r_ij^p (float64).
# Out (panel-local): w[i, j] = W'_ij, tmax[i, jb] = t_i, tsum[i, jb] = σ_i.
@triton.jit(do_not_specialize=["k", "row0", "col0", "n_col_tiles", "pm1", "nbits"])
def _gram_panel_kernel(
    x_ptr, k, d, stride_x, row0, col0, n_col_tiles, pm1, nbits,
    w_ptr, stride_w, tmax_ptr, tsum_ptr, stride_t,
    INPUT_PRECISION: tl.constexpr, ROUNDING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    ib = pid // n_col_tiles
    jb = pid % n_col_tiles
    lrows = ib * BLOCK_M + tl.arange(0, BLOCK_M)
    lcols = jb * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = row0 + lrows
    cols = col0 + lcols
    g = _gram_tile(x_ptr, rows, cols, rows < k, cols < k, d, stride_x,
                   INPUT_PRECISION, ROUNDING, BLOCK_M, BLOCK_N, BLOCK_K)
    g = _offdiag(g, rows, cols, k)
    t = tl.max(tl.abs(g), axis=1)
    w, sigma = _weights_and_sums(g, t, pm1, nbits)
    lrows64 = lrows.to(tl.int64)
    # The scratch is padded to whole tiles: every tile of the panel grid is in bounds.
    tl.store(w_ptr + lrows64[:, None] * stride_w + lcols[None, :], w)
    tl.store(tmax_ptr + lrows64 * stride_t + jb, t)
    tl.store(tsum_ptr + lrows64 * stride_t + jb, sigma)


# Panel step 2, per panel row i (first: no running state yet, m = s = 0):
#   m' = max(m, max_tile t),  s ← s·(m/m')^p + Σ_tile σ·(t/m')^p  (fixed tile order),
#   β_i = (m/m')^(p-1),  γ_i,tile = (t/m')^(p-1),  m ← m'.
# Out: row_max, row_sum (running; the pointers start at the panel's first row, of which n_rows
# are kept); beta[i], gamma[i, tile] (panel-local, x.dtype).
@triton.jit(do_not_specialize=["n_rows", "n_col_tiles", "first", "pm1", "nbits"])
def _panel_merge_kernel(
    tmax_ptr, tsum_ptr, stride_t, n_rows, n_col_tiles, first, pm1, nbits,
    row_max_ptr, row_sum_ptr, beta_ptr, gamma_ptr,
    BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0)
    lrows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = lrows < n_rows
    tiles = tl.arange(0, BLOCK_T)
    t_ok = row_ok[:, None] & (tiles < n_col_tiles)[None, :]
    t_off = lrows.to(tl.int64)[:, None] * stride_t + tiles[None, :]
    tmax = tl.load(tmax_ptr + t_off, mask=t_ok, other=0.0)
    tsum = tl.load(tsum_ptr + t_off, mask=t_ok, other=0.0)
    # (splat first: a scalar compare as a mask trips the interpreter)
    has_state = row_ok & (tl.full([BLOCK_M], first, tl.int32) == 0)
    m = tl.load(row_max_ptr + lrows, mask=has_state, other=0.0)
    s = tl.load(row_sum_ptr + lrows, mask=has_state, other=0.0)
    m_new = tl.maximum(m, tl.max(tmax, axis=1))
    beta, alpha = _rescale(m, m_new, pm1, nbits)
    mn = m_new.to(tl.float64)[:, None]
    pos = mn > 0
    ratio = tl.where(pos, tmax.to(tl.float64) / tl.where(pos, mn, 1.0), 0.0)
    gamma = tl.where(t_ok, _powi(ratio, pm1, nbits), 0.0)
    s = s * alpha + tl.sum(tsum * gamma * ratio, axis=1)
    dtype = row_max_ptr.dtype.element_ty
    tl.store(row_max_ptr + lrows, m_new, mask=row_ok)
    tl.store(row_sum_ptr + lrows, s, mask=row_ok)
    tl.store(beta_ptr + lrows, beta.to(dtype))
    tl.store(gamma_ptr + t_off, gamma.to(dtype))


# Panel step 3. Block (ib, db) of the gradient, panel rows i, columns c of the panel:
#   acc[i, D] ← β_i·acc[i, D] + Σ_c γ_i,tile(c) W'_ic x_{col0+c, D}
# (acc read only when not first; the operands γ∘W' and x in the format of ROUNDING). TILE_N
# (step 1's BLOCK_N) is a multiple of BLOCK_K, so one γ per row and K step.
@triton.jit(do_not_specialize=["n_rows", "col0", "n_cols", "first"])
def _panel_gemm_kernel(
    w_ptr, stride_w, gamma_ptr, stride_t, beta_ptr, x_ptr, stride_x, grad_ptr, stride_grad,
    n_rows, d, col0, n_cols, first,
    INPUT_PRECISION: tl.constexpr, ROUNDING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr, TILE_N: tl.constexpr,
):
    pid = tl.program_id(0)
    n_d_blocks = tl.cdiv(d, BLOCK_D)
    ib = pid // n_d_blocks
    db = pid % n_d_blocks
    lrows = ib * BLOCK_M + tl.arange(0, BLOCK_M)
    lrows64 = lrows.to(tl.int64)
    row_ok = lrows < n_rows  # grad_ptr starts at the panel's first row, of which n_rows are kept
    dcols = db * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = dcols < d
    offs_c = tl.arange(0, BLOCK_K)
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=dtype)
    for c0 in range(0, n_cols, BLOCK_K):
        lc = c0 + offs_c
        c_ok = lc < n_cols
        w = tl.load(w_ptr + lrows64[:, None] * stride_w + lc[None, :], mask=c_ok[None, :], other=0.0)
        gam = tl.load(gamma_ptr + lrows64 * stride_t + c0 // TILE_N)
        xc = tl.load(x_ptr + (col0 + lc).to(tl.int64)[:, None] * stride_x + dcols[None, :],
                     mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.dot(_operand(w * gam[:, None], ROUNDING), _operand(xc, ROUNDING), acc,
                     input_precision=INPUT_PRECISION, out_dtype=dtype)
    out = grad_ptr + lrows64[:, None] * stride_grad + dcols[None, :]
    out_ok = row_ok[:, None] & d_ok[None, :]
    has_state = (tl.full([BLOCK_M], first, tl.int32) == 0)[:, None]
    old = tl.load(out, mask=out_ok & has_state, other=0.0)
    beta = tl.load(beta_ptr + lrows)
    tl.store(out, old * beta[:, None] + acc, mask=out_ok)


Tile = namedtuple("Tile", "block_m block_n block_k num_warps num_stages")


def _config(kind: str, dtype: torch.dtype, interp: bool, precision: str = "ieee",
            block_d: int = 0) -> Tile:
    """Tile sizes per kernel. kind: "gram" (forward and panel step 1: BLOCK_M, BLOCK_N, BLOCK_K),
    "fused" (BLOCK_M, BLOCK_N; block_k unused), "gemm" (BLOCK_M, BLOCK_D as block_n, BLOCK_K),
    "merge" (BLOCK_M). GPU tiles: the largest that ptxas fits in registers for sm_90 without
    spilling, per `python tests/triton_aot.py --ptxas-info` with Triton 3.6 (2026-12-03, bytes of
    spill stores per thread: tf32 panel step 1 28, tf32 fused 64 with the operands rounded in the
    bits; bf16 on sm_80 panel step 1 112, fused 48; none else)."""
    fp64 = dtype == torch.float64
    tf32 = precision == "tf32" and not fp64
    if interp:
        return Tile(32, 32, 32, 4, 1)
    if kind == "gram":
        if fp64:
            return Tile(64, 64, 32, 8, 3)
        return Tile(128, 128, 32, 8, 3) if tf32 else Tile(128, 64, 32, 8, 3)
    if kind == "fused":
        if fp64:
            return Tile(64, 32, 0, 8, 2) if block_d <= 64 else Tile(32, 32, 0, 4, 2)
        return Tile(64, 64, 0, 8, 2) if block_d <= 128 else Tile(64, 32, 0, 8, 2)
    if kind == "gemm":
        return Tile(64, 64, 32, 4, 3) if fp64 else Tile(128, 128, 32, 8, 3)
    if kind == "merge":
        return Tile(64, 0, 0, 4, 1)
    raise ValueError(kind)


def _fused_block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _round_up(n: int, q: int) -> int:
    return -(-n // q) * q


def _panel_configs(dtype: torch.dtype, interp: bool, precision: str):
    return tuple(_config(kind, dtype, interp, precision) for kind in ("gram", "gemm", "merge"))


def _panel_shape(m: int, k: int, dtype: torch.dtype, interp: bool, precision: str):
    """(rows R, columns C, BLOCK_T) of a panel of the m rows against k columns: C ≤ PANEL_COLS and
    R·C ≤ PANEL_MAX_ELEMS where the tile quanta allow, both whole tiles; BLOCK_T ≥ C/step-1 BLOCK_N
    (independent of k)."""
    gram, gemm, merge = _panel_configs(dtype, interp, precision)
    assert gram.block_n % gemm.block_k == 0
    col_q = gram.block_n
    row_q = math.lcm(gram.block_m, gemm.block_m, merge.block_m)
    max_cols = max(col_q, PANEL_COLS // col_q * col_q)
    cols = min(_round_up(k, col_q), max_cols)
    rows = min(_round_up(m, row_q), max(row_q, PANEL_MAX_ELEMS // cols // row_q * row_q))
    return rows, cols, triton.next_power_of_2(max_cols // col_q)


def _operand_rounding(precision: str, dtype: torch.dtype, interp: bool) -> str:
    """The kernels' ROUNDING for `precision` and x's dtype (see _operand): float64 and "highest"
    are not rounded; "bf16" casts to bfloat16 (rounded in the bits under the interpreter, whose
    tl.dot computes in float32 and whose cast truncates); "tf32" is rounded in the bits everywhere:
    the tensor cores would otherwise drop the 13 low bits of each float32 operand (truncation), and
    the CPU emulation and the CUDA backend round to nearest."""
    if dtype != torch.float32 or precision == "highest":
        return "none"
    if precision == "bf16":
        return "bf16_rne" if interp else "bf16"
    return "tf32_rna"


def _launch(x, row_offset, m, p, with_grad, row_max, row_sum, grad, precision, interp):
    """Runs the kernels for the rows [row_offset, row_offset + m) of x into the (poisoned)
    outputs of m rows. x contiguous, k, d ≥ 1. No host synchronization."""
    k, d = x.shape
    dtype = x.dtype
    pm1 = p - 1
    nbits = pm1.bit_length()
    rounding = _operand_rounding(precision, dtype, interp)
    precision = input_precision(precision, dtype)
    if not with_grad:
        cfg = _config("gram", dtype, interp, precision)
        _gram_offdiag_forward_kernel[(triton.cdiv(m, cfg.block_m),)](
            x, k, row_offset, m, d, x.stride(0), p, p.bit_length(), row_max, row_sum,
            INPUT_PRECISION=precision, ROUNDING=rounding, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return
    if d <= FUSED_MAX_D[dtype]:
        block_d = _fused_block_d(d)
        cfg = _config("fused", dtype, interp, precision, block_d)
        _gram_offdiag_fused_kernel[(triton.cdiv(m, cfg.block_m),)](
            x, k, row_offset, m, d, x.stride(0), pm1, nbits, row_max, row_sum, grad, grad.stride(0),
            INPUT_PRECISION=precision, ROUNDING=rounding, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return
    gram, gemm, merge = _panel_configs(dtype, interp, precision)
    panel_rows, panel_cols, block_t = _panel_shape(m, k, dtype, interp, precision)
    dev = x.device
    # Panel-local scratch, rewritten by each panel before it is read (zeroed once, so rows of a
    # short last row panel that step 3 reads but no output keeps are finite). Per-tile arrays have
    # BLOCK_T columns, so the merge kernel's whole tile rows are in bounds.
    w = torch.zeros((panel_rows, panel_cols), dtype=dtype, device=dev)
    tmax = torch.zeros((panel_rows, block_t), dtype=dtype, device=dev)
    tsum = torch.zeros((panel_rows, block_t), dtype=torch.float64, device=dev)
    gamma = torch.zeros((panel_rows, block_t), dtype=dtype, device=dev)
    beta = torch.zeros((panel_rows,), dtype=dtype, device=dev)
    for r0 in range(0, m, panel_rows):  # panel rows: output rows r0.., x rows row_offset + r0..
        n_rows = min(panel_rows, m - r0)
        for col0 in range(0, k, panel_cols):
            n_cols = min(panel_cols, k - col0)
            n_col_tiles = triton.cdiv(n_cols, gram.block_n)
            first = int(col0 == 0)
            _gram_panel_kernel[(triton.cdiv(n_rows, gram.block_m) * n_col_tiles,)](
                x, k, d, x.stride(0), row_offset + r0, col0, n_col_tiles, pm1, nbits,
                w, w.stride(0), tmax, tsum, tmax.stride(0),
                INPUT_PRECISION=precision, ROUNDING=rounding, BLOCK_M=gram.block_m, BLOCK_N=gram.block_n,
                BLOCK_K=gram.block_k, num_warps=gram.num_warps, num_stages=gram.num_stages,
            )
            _panel_merge_kernel[(triton.cdiv(n_rows, merge.block_m),)](
                tmax, tsum, tmax.stride(0), n_rows, n_col_tiles, first, pm1, nbits,
                row_max[r0:], row_sum[r0:], beta, gamma,
                BLOCK_M=merge.block_m, BLOCK_T=block_t,
                num_warps=merge.num_warps, num_stages=merge.num_stages,
            )
            _panel_gemm_kernel[(triton.cdiv(n_rows, gemm.block_m) * triton.cdiv(d, gemm.block_n),)](
                w, w.stride(0), gamma, gamma.stride(0), beta, x, x.stride(0), grad[r0:], grad.stride(0),
                n_rows, d, col0, n_cols, first,
                INPUT_PRECISION=precision, ROUNDING=rounding, BLOCK_M=gemm.block_m, BLOCK_D=gemm.block_n,
                BLOCK_K=gemm.block_k, TILE_N=gram.block_n,
                num_warps=gemm.num_warps, num_stages=gemm.num_stages,
            )


def gram_offdiag_penalty_triton(q: torch.Tensor, x: torch.Tensor, row_offset: int, p: int, with_grad: bool,
                                precision: str = "highest"):
    """Launcher. The contract of torch.ops.repcap_fast.gram_offdiag_penalty (csrc/module.cpp):
    the rows q = x[row_offset : row_offset + m] (read from x) against all k rows of x, float32 or
    float64 on a CUDA device (or the CPU under TRITON_INTERPRET=1), p ≥ 1, precision "highest",
    "tf32" or "bf16". Returns (row_max [m] x.dtype, row_sum [m] float64, grad_dir [m, d] x.dtype, or
    x.new_empty(0) without with_grad) on x's device; see the module docstring for the math."""
    interp = interpreting()
    if x.dim() != 2 or q.dim() != 2 or q.shape[1] != x.shape[1]:
        raise ValueError(f"gram_offdiag_penalty (triton): q (m×d) and x (k×d) must be 2-D with one d, got shapes "
                         f"{tuple(q.shape)} and {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float64) or q.dtype != x.dtype:
        raise TypeError(f"gram_offdiag_penalty (triton): x and q must be float32 or float64, got {x.dtype}, {q.dtype}")
    if x.device.type != "cuda" and not interp:
        raise ValueError("gram_offdiag_penalty (triton): x must be on a CUDA device")
    p = int(p)
    if not 1 <= p <= kernel_limits().penalty_p:
        raise ValueError(f"gram_offdiag_penalty (triton): p must be in [1, {kernel_limits().penalty_p}], got {p}")
    m = q.shape[0]
    if not (0 <= row_offset and row_offset + m <= x.shape[0]):
        raise ValueError(f"gram_offdiag_penalty (triton): rows [row_offset, row_offset + m) must lie in x's "
                         f"{x.shape[0]} rows, got row_offset {row_offset} and m {m}")
    with_grad = bool(with_grad)
    x = x.contiguous()
    k, d = x.shape
    dev = x.device
    if m == 0 or k == 0 or d == 0:  # no nonzero pair: m = s = 0, grad = 0
        grad = torch.zeros((m, d), dtype=x.dtype, device=dev) if with_grad else x.new_empty(0)
        return (torch.zeros(m, dtype=x.dtype, device=dev), torch.zeros(m, dtype=torch.float64, device=dev), grad)
    # Poisoned outputs: a slot the kernels fail to write shows up as NaN.
    row_max = torch.full((m,), float("nan"), dtype=x.dtype, device=dev)
    row_sum = torch.full((m,), float("nan"), dtype=torch.float64, device=dev)
    grad = torch.full((m, d), float("nan"), dtype=x.dtype, device=dev) if with_grad else x.new_empty(0)
    with device_guard(x):
        _launch(x, int(row_offset), m, p, with_grad, row_max, row_sum, grad, precision, interp)
    return row_max, row_sum, grad
