"""Triton path of subspace PGA: a Triton kernel writes each subspace's pair distances in SciPy's
condensed order as sort keys; torch.sort (a library sort) orders them; one fused Triton kernel
turns the sorted keys into tie-averaged ranks and reduces their correlation with the reference
ranks in float64 (or, for the ranks op, scatters the ranks back to pair order).

Same contract as the C++ ops torch.ops.repcap_fast.subspace_pga_ranks / subspace_pga_rhos
(csrc/module.cpp), with the op's precision ("highest" or "tf32") for float32 work. At "tf32" the
projections are cuBLAS TF32 GEMMs (as in the C++ cuda op) and, here only, the distances' dot products
are TF32 tensor-core products of the unit rows rounded to TF32 to nearest (the C++ cuda op forms
them in IEEE float32):
    subspace_pga_ranks_triton(x, precision) -> float64[n], the average ranks of the cosine
        distances (scipy.stats.rankdata, method "average"); ValueError on a zero row
    subspace_pga_rhos_triton(x, bases, ref_ranks, precision) -> float64[B] on the CPU, Spearman's ρ
        per basis (NaN where a projected row is 0 or every distance is equal); ref_ranks must be
        average ranks (multiples of 1/2 in [1, n] summing to n(n+1)/2: ValueError otherwise)
with n = N(N−1)/2 and distances 1 − û_i·û_j clamped to [0, 2] (as scipy's pdist); rows are
normalized by division, so one-hot rows give exact ties. Float64 inputs are computed in float64,
others in float32. Both take N ≤ the limit pga_tokens (csrc/kernel_settings.h, 65,536), as the
C++ ops do.

Keys, per pair and subspace:
* float32: one int64, (bits(dist) << 32) | low, with low = 2·ref_rank[pair] for ρ (average ranks
  are multiples of 1/2; 2n < 2^32) or the pair index for the ranks op (n < 2^32). dist ∈ [0, 2] is
  a canonical +0 or positive, so its bits are monotonic in its value and the int64 is positive:
  an unstable sort of the values alone orders pairs by distance, and equal distances have equal
  high words whatever their low words. The low word travels through the sort, so the reference
  ranks arrive in sorted order without a gather.
* float64: the distance itself; a stable sort returns the order too, and the fused kernel gathers
  2·ref_rank (or the pair index) through it.

The fused kernel (grid: blocks of BLOCK sorted positions × the subspaces of a sort group) finds
each position's run of equal keys [start, end): a position whose neighbours both differ is its
own run [t, t+1); if any position of the block is tied, tied positions binary-search the block's
sorted keys for their run's first and last position, and a run through the block's first (last)
position that goes on before (after) the block is completed by one binary search over the
subspace's whole sorted row (runs can be long: one-hot rows give runs of thousands). The average
rank is (start + end − 1)/2 + 1. For ρ each program writes Σ(r−m)(s−m) and Σ(r−m)² (m = (n+1)/2,
s the reference rank, float64) to a (B, programs, 2) buffer, summed on the device by a fixed
pairwise tree: the same input gives bit-identical ρ (the float64 path sorts stably, so the order
of the reference ranks within a run is fixed too). For the ranks op it scatters r to ranks[pair].
All offsets are int64 (B·n may exceed 2^31).

Memory, per pair and subspace of a batch: 8 B of keys (float32 and float64 alike; the
torch-composed rank pass this replaces needed about 80 B). They are filled with a poison (−1, or
NaN) that the sort moves to one end of its row, where one element per row tells whether the
distance kernel missed a pair (the ranks op's scatter skips a poisoned key). torch.sort runs on
groups of rows of at most max(n, 2^22) pairs: its values and int64 indices (16 B per pair) and
its library scratch (cub's double buffers on CUDA, about 16 B per pair more) exist for one group
only. Per call, shared by the subspaces: twice the reference ranks as 32-bit integers (4 B per
pair; the caller holds ref_ranks, 8 B), about 50 B per pair of one chunk of at most 2^22 pairs
while ref_ranks is checked, the projections (B·N·k) and the partials (16 B per BLOCK pairs).
So for n ≥ 2^22 a call holds about 8·B + 4 + 40 B per pair besides ref_ranks.
"""

import torch
import triton
import triton.language as tl

from .._backends import cublas_precision, kernel_limits
from ._utils import device_guard, input_precision, interpreting, round_to_tf32, tile_counts, upper_tile_coords

_SORT_GROUP_PAIRS = 1 << 22  # rows sorted together hold at most max(n, this) pairs
_CHECK_CHUNK = 1 << 22  # ref_ranks is checked in chunks of this many pairs (~50 B each)

# OUT_MODE of the distance kernel
_OUT_DIST, _OUT_PAIR, _OUT_TWICE = 0, 1, 2


# For subspace b and an upper tile (bi, bj) of the N×N pair grid, dist_ij = clamp(1 − û_i·û_j,
# 0, 2) (+0 canonical) for j > i, stored at b·n + pair, pair = i·N − i(i+1)/2 + (j − i − 1):
#   OUT_MODE 0: dist itself (float32/float64);
#   OUT_MODE 1: int64 (bits(dist) << 32) | pair (float32 dist);
#   OUT_MODE 2: int64 (bits(dist) << 32) | twice[pair] (float32 dist; twice: uint32 in int32).
@triton.jit(do_not_specialize=["n_tokens", "n_pairs", "n_tiles", "n_col_tiles", "k"])
def _subspace_pga_distance_kernel(
    u_ptr, dist_ptr, twice_ptr, n_tokens, n_pairs, n_tiles, n_col_tiles, k, stride_ub, stride_ur,
    OUT_MODE: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    bi, bj = upper_tile_coords(t, n_col_tiles)
    rows = bi * BLOCK + tl.arange(0, BLOCK)
    cols = bj * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_tokens
    col_ok = cols < n_tokens
    base = u_ptr + b * stride_ub
    offs_k = tl.arange(0, BLOCK_K)
    dots = tl.zeros([BLOCK, BLOCK], dtype=u_ptr.dtype.element_ty)  # float32, or float64
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < k
        a = tl.load(base + rows[:, None] * stride_ur + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        c = tl.load(base + cols[:, None] * stride_ur + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        dots = tl.dot(a, tl.trans(c), dots, input_precision=INPUT_PRECISION,
                      out_dtype=dots.dtype)  # Triton 3.6 assumes float32 unless told
    # + 0.0 turns a −0 into +0 (it cannot arise from 1 − dot, but the key needs canonical zeros)
    dist = tl.minimum(tl.maximum(1.0 - dots, 0.0), 2.0) + 0.0
    keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] > rows[:, None])
    n = tl.cast(n_tokens, tl.int64)
    pair = rows[:, None] * n - rows[:, None] * (rows[:, None] + 1) // 2 + (cols[None, :] - rows[:, None] - 1)
    out = dist_ptr + b * tl.cast(n_pairs, tl.int64) + pair
    if OUT_MODE == 0:
        tl.store(out, dist, mask=keep)
    else:
        bits = dist.to(tl.int32, bitcast=True).to(tl.int64)  # dist ≥ +0: bits ≥ 0
        if OUT_MODE == 1:
            low = pair
        else:
            low = tl.load(twice_ptr + pair, mask=keep, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
        tl.store(out, (bits << 32) + low, mask=keep)


@triton.jit
def _sort_key(raw, PACKED: tl.constexpr):
    """The distance part of a sorted value: the high word of a packed int64, or the float64."""
    if PACKED:
        return raw >> 32
    else:
        return raw


# Program (p, b): the sorted positions t ∈ [p·BLOCK, (p+1)·BLOCK) of row b of `sorted` (B rows of
# n values, ascending: packed int64 keys when PACKED, else float64 distances with `order`, the
# pair of each sorted position). Each t gets the average rank r = (start + end − 1)/2 + 1 of its
# run [start, end) of equal keys. RANKS: ranks[pair(t)] = r (B = 1). Else, with s the reference
# rank (the low word / 2, or twice[order[t]] / 2) and m = (n+1)/2:
# partial[b, p] = (Σ (r−m)(s−m), Σ (r−m)²) in float64.
@triton.jit(do_not_specialize=["n_pairs", "n_iter"])
def _subspace_pga_rank_kernel(
    sorted_ptr, order_ptr, twice_ptr, ranks_ptr, partial_ptr, n_pairs, n_iter,
    PACKED: tl.constexpr, RANKS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_STEPS: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    n = tl.cast(n_pairs, tl.int64)
    row = sorted_ptr + b * n
    first = p * BLOCK
    last = first + BLOCK - 1
    t = first + tl.arange(0, BLOCK)
    ok = t < n
    raw = tl.load(row + t, mask=ok, other=0)
    key = _sort_key(raw, PACKED)
    tie_prev = ok & (t > 0) & (_sort_key(tl.load(row + t - 1, mask=ok & (t > 0), other=0), PACKED) == key)
    tie_next = ok & (t + 1 < n) & (_sort_key(tl.load(row + t + 1, mask=ok & (t + 1 < n), other=0), PACKED) == key)
    start = t
    end = t + 1
    if tl.max((tie_prev | tie_next).to(tl.int32), axis=0) > 0:
        # Inside the block, per tied lane: the first position in [first, t] with its key, and
        # the first position in (t, min(last, n−1) + 1] with a greater key or past the block.
        lo = tl.zeros_like(t) + first
        hi = t
        for _ in range(BLOCK_STEPS):
            mid = (lo + hi) // 2
            less = _sort_key(tl.load(row + mid, mask=tie_prev, other=0), PACKED) < key
            lo = tl.where(less, mid + 1, lo)
            hi = tl.where(less, hi, mid)
        start = tl.where(tie_prev, lo, t)
        lo = t + 1
        hi = tl.zeros_like(t) + tl.minimum(last + 1, n)
        for _ in range(BLOCK_STEPS):
            mid = (lo + hi) // 2
            inside = tie_next & (mid < hi)
            greater = (mid >= hi) | (_sort_key(tl.load(row + mid, mask=inside, other=0), PACKED) > key)
            hi = tl.where(greater, mid, hi)
            lo = tl.where(greater, lo, mid + 1)
        end = tl.where(tie_next, lo, t + 1)
        # A run through the block's first (last) position may begin before (end after) the
        # block: one binary search over the row for each such side.
        if first > 0:
            k_first = _sort_key(tl.load(row + first), PACKED)
            if _sort_key(tl.load(row + first - 1), PACKED) == k_first:
                slo = first * 0
                shi = first - 1  # key[shi] == k_first: the first such position is in [slo, shi]
                for _ in range(n_iter):
                    smid = (slo + shi) // 2
                    sless = _sort_key(tl.load(row + smid), PACKED) < k_first
                    slo = tl.where(sless, smid + 1, slo)
                    shi = tl.where(sless, shi, smid)
                start = tl.where(start == first, slo, start)
        if last + 1 < n:
            k_last = _sort_key(tl.load(row + last), PACKED)
            if _sort_key(tl.load(row + last + 1), PACKED) == k_last:
                slo = last + 1  # the first position with a greater key (or n) is in [slo, shi]
                shi = n
                for _ in range(n_iter):
                    smid = (slo + shi) // 2
                    skey = _sort_key(tl.load(row + smid, mask=smid < n, other=0), PACKED)
                    sgreater = (smid >= n) | (skey > k_last)
                    shi = tl.where(sgreater, smid, shi)
                    slo = tl.where(sgreater, slo, smid + 1)
                end = tl.where(end == last + 1, slo, end)
    r = (start + end - 1).to(tl.float64) * 0.5 + 1.0

    if PACKED:
        low = raw - ((raw >> 32) << 32)
    else:
        idx = tl.load(order_ptr + b * n + t, mask=ok, other=0)
        if RANKS:
            low = idx
        else:
            low = tl.load(twice_ptr + idx, mask=ok, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
    if RANKS:
        tl.store(ranks_ptr + low, r, mask=ok & (low >= 0) & (low < n))  # a poisoned key scatters nowhere
    else:
        mean = (n + 1).to(tl.float64) * 0.5
        rc = tl.where(ok, r - mean, 0.0)
        sc = tl.where(ok, low.to(tl.float64) * 0.5 - mean, 0.0)
        out = partial_ptr + (b * tl.num_programs(0) + p) * 2
        tl.store(out, tl.sum(rc * sc, axis=0))
        tl.store(out + 1, tl.sum(rc * rc, axis=0))


def _config(interpreting: bool):
    return (32, 32, 4, 1) if interpreting else (64, 32, 4, 3)  # BLOCK, BLOCK_K, warps, stages


def _rank_config(interpreting: bool):
    return (1024, 1) if interpreting else (1024, 4)  # BLOCK, warps


def _compute(x: torch.Tensor) -> torch.Tensor:
    """float64 stays float64 (tl.dot runs on fp64 tensor cores on sm_80+); else float32."""
    return x if x.dtype == torch.float64 else x.to(torch.float32)


def _unit_rows(p: torch.Tensor):
    """p / ‖p‖ per row, the norm summed in float64 and rounded to p's dtype as the C++ kernel does
    (float32 rows of 1e-25 keep a nonzero norm), divided (one-hot rows stay exact); and a mask of
    the subspaces with a zero row."""
    norms = torch.linalg.vector_norm(p, dim=-1, keepdim=True, dtype=torch.float64).to(p.dtype)
    zero = (norms == 0).any(dim=-2).reshape(-1)
    return p / torch.where(norms == 0, torch.ones_like(norms), norms), zero


def _tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 by a fixed pairwise tree (the same order on every run and device)."""
    while x.shape[0] > 1:
        h = x.shape[0] // 2
        y = x[0 : 2 * h : 2] + x[1 : 2 * h : 2]
        x = torch.cat([y, x[2 * h :]]) if x.shape[0] % 2 else y
    return x[0]


def _dot_operands(u: torch.Tensor, precision: str) -> torch.Tensor:
    """The distance kernel's operands: float32 unit rows at "tf32" rounded to TF32 to nearest
    (round_to_tf32), which the tensor cores then use exactly, instead of raw float32 rows that
    they may truncate (a one-sided error: truncation only shrinks magnitudes); else u itself."""
    if precision == "tf32" and u.dtype == torch.float32:
        return round_to_tf32(u)
    return u


def _keys(u: torch.Tensor, out_mode: int, precision: str, twice=None) -> torch.Tensor:
    """(B, n) keys of the condensed distances of the unit rows u (B, N, k): float32/float64
    distances poisoned with NaN (OUT_MODE 0), or packed int64 keys poisoned with −1. At "tf32"
    the float32 dot products are TF32 tensor-core products of the rows rounded to nearest."""
    u = _dot_operands(u, precision)
    bsz, n_tokens, k = u.shape
    n_pairs = n_tokens * (n_tokens - 1) // 2
    block, block_k, warps, stages = _config(interpreting())
    n_tiles, nb = tile_counts(n_tokens, n_tokens, True, block)
    if out_mode == _OUT_DIST:
        keys = torch.full((bsz, n_pairs), float("nan"), dtype=u.dtype, device=u.device)
    else:
        keys = torch.full((bsz, n_pairs), -1, dtype=torch.int64, device=u.device)
    with device_guard(u):
        _subspace_pga_distance_kernel[(n_tiles, bsz)](
            u, keys, keys if twice is None else twice, n_tokens, n_pairs, n_tiles, nb, k, u.stride(0), u.stride(1),
            OUT_MODE=out_mode, INPUT_PRECISION=input_precision(precision, u.dtype), BLOCK=block, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages,
        )
    return keys


def _rank_pass(keys: torch.Tensor, packed: bool, twice=None, ranks=None):
    """Sorts each row of keys (B, n) and runs the fused rank kernel on groups of rows. Returns
    the (B, programs, 2) float64 partials (None for the ranks op, which fills `ranks`) and a
    device bool: whether a poisoned (unwritten) key turned up."""
    bsz, n = keys.shape
    block, warps = _rank_config(interpreting())
    programs = triton.cdiv(n, block)
    n_iter = n.bit_length() + 1
    partial = None
    if ranks is None:
        partial = torch.empty((bsz, programs, 2), dtype=torch.float64, device=keys.device)
    group = max(1, min(bsz, _SORT_GROUP_PAIRS // n))
    poisoned = torch.zeros((), dtype=torch.bool, device=keys.device)
    for r0 in range(0, bsz, group):
        rows = keys[r0 : r0 + group]
        if packed:
            vals = torch.sort(rows, dim=1).values  # equal values are identical: no order needed
            order = vals
            poisoned = poisoned | (vals[:, 0] < 0).any()  # −1 sorts first
        else:
            vals, order = torch.sort(rows, dim=1, stable=True)  # stable: deterministic partials
            poisoned = poisoned | torch.isnan(vals[:, -1]).any()  # NaN sorts last
        out_partial = partial[r0 : r0 + group] if partial is not None else vals
        with device_guard(keys):
            _subspace_pga_rank_kernel[(programs, vals.shape[0])](
                vals, order, vals if twice is None else twice, vals if ranks is None else ranks, out_partial,
                n, n_iter, PACKED=packed, RANKS=ranks is not None, BLOCK=block,
                BLOCK_STEPS=block.bit_length(), num_warps=warps,
            )
        del vals, order
    return partial, poisoned


def _check_poison(poisoned: torch.Tensor):
    if bool(poisoned):
        raise RuntimeError("subspace_pga (triton): internal error, a pair distance was not written")


def _twice_ref_ranks(ref_ranks: torch.Tensor, n: int, device):
    """2·ref_ranks as uint32 bit patterns in an int32 tensor (checked: multiples of 1/2 in [1, n]
    summing to n(n+1)/2) and Σ(s − m)², m = (n+1)/2, summed in a fixed order."""
    ref = ref_ranks.detach().to(device=device, dtype=torch.float64).reshape(-1)
    twice = torch.empty(n, dtype=torch.int32, device=device)
    valid = torch.ones((), dtype=torch.bool, device=device)
    total = torch.zeros((), dtype=torch.int64, device=device)
    sums = []
    mean = 0.5 * (n + 1)
    for c0 in range(0, n, _CHECK_CHUNK):
        chunk = ref[c0 : c0 + _CHECK_CHUNK]
        tw = chunk * 2.0
        valid = valid & ((tw >= 2.0) & (tw <= 2.0 * n) & (tw == torch.floor(tw))).all()
        tw_int = torch.where(torch.isfinite(tw), tw, torch.zeros_like(tw)).to(torch.int64)
        total = total + tw_int.sum()
        twice[c0 : c0 + _CHECK_CHUNK] = (tw_int - ((tw_int >> 31) << 32)).to(torch.int32)
        centered = chunk - mean
        sums.append(_tree_sum(centered * centered))
    if not bool(valid):
        raise ValueError("subspace_pga_rhos (triton): ref_ranks must be average ranks (multiples of 1/2 in [1, n])")
    if int(total) != n * (n + 1):
        raise ValueError("subspace_pga_rhos (triton): ref_ranks must be average ranks (they sum to n(n+1)/2)")
    return twice, float(_tree_sum(torch.stack(sums)))


def _check_x(x: torch.Tensor, op: str, max_tokens: int) -> None:
    if x.dim() != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"{op} (triton): x must be N×d with N >= 2, got shape {tuple(x.shape)}")
    if x.shape[0] > max_tokens:
        raise ValueError(f"{op} (triton): at most {max_tokens} tokens (32-bit pair keys), got {x.shape[0]}")


def subspace_pga_ranks_triton(x: torch.Tensor, precision: str = "highest") -> torch.Tensor:
    """float64 average ranks of the condensed cosine distances of x's rows (x: N×d, rows ≠ 0)."""
    _check_x(x, "subspace_pga_ranks", kernel_limits().pga_tokens)
    u, zero = _unit_rows(_compute(x)[None])
    if bool(zero.any()):
        raise ValueError("subspace_pga_ranks (triton): x has a zero row")
    u = u.contiguous()
    n = x.shape[0] * (x.shape[0] - 1) // 2
    ranks = torch.empty(n, dtype=torch.float64, device=u.device)
    packed = u.dtype != torch.float64
    keys = _keys(u, _OUT_PAIR if packed else _OUT_DIST, precision)
    _, poisoned = _rank_pass(keys, packed, ranks=ranks)
    _check_poison(poisoned)
    return ranks


def subspace_pga_rhos_triton(x: torch.Tensor, bases: torch.Tensor, ref_ranks: torch.Tensor,
                             precision: str = "highest") -> torch.Tensor:
    """Spearman's ρ between ref_ranks and the ranks of each projected subspace's distances; the
    float32 projections (one GEMM per subspace, of the same shape whatever the batch, so no bit
    depends on the batch size) and distances at `precision`."""
    _check_x(x, "subspace_pga_rhos", kernel_limits().pga_tokens)
    n_tokens = x.shape[0]
    n = n_tokens * (n_tokens - 1) // 2
    if tuple(ref_ranks.shape) != (n,):
        raise ValueError(f"subspace_pga_rhos (triton): ref_ranks must have length {n}")
    xc = _compute(x)
    twice, ref_sum_sq = _twice_ref_ranks(ref_ranks, n, xc.device)
    bases = bases.to(xc.dtype)
    proj = torch.empty((bases.shape[0], n_tokens, bases.shape[2]), dtype=xc.dtype, device=xc.device)
    with cublas_precision(precision, xc.device):
        for b in range(bases.shape[0]):  # one GEMM of one shape per subspace: no bit depends on the batch
            torch.mm(xc, bases[b], out=proj[b])
    u, zero = _unit_rows(proj)
    packed = u.dtype != torch.float64
    keys = _keys(u.contiguous(), _OUT_TWICE if packed else _OUT_DIST, precision, twice)
    del proj, u
    partial, poisoned = _rank_pass(keys, packed, twice=None if packed else twice)
    del keys
    sums = _tree_sum(partial.transpose(0, 1))  # (B, 2)
    cross, sum_sq = sums[:, 0], sums[:, 1]
    den = sum_sq * ref_sum_sq
    rho = torch.where(den > 0, cross / den.clamp_min(1e-300).sqrt(), torch.full_like(cross, float("nan")))
    rho[zero.to(rho.device)] = float("nan")
    _check_poison(poisoned)
    return rho.cpu()
