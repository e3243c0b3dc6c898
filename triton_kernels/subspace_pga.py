"""Triton path of subspace PGA: a Triton kernel writes each subspace's pair distances in SciPy's
condensed order; torch.sort (a batched, stable library sort) orders them; the tie-aware ranks and
their correlation with the reference ranks are then reduced with vectorized torch ops in float64.

Float64 inputs are computed in float64, others in float32. Same contract as the C++ ops torch.ops.repcap_fast.subspace_pga_ranks / subspace_pga_rhos:
    subspace_pga_ranks_triton(x) -> float64[n], the average ranks of the cosine distances
    subspace_pga_rhos_triton(x, bases, ref_ranks) -> float64[B], Spearman's ρ per basis (NaN where
        a projected row is 0 or every distance is equal)
with n = N(N−1)/2 and distances 1 − û_i·û_j clamped to [0, 2] (as scipy's pdist).
Still to do: the rank/correlation pass as one fused kernel (it is torch-composed here).
"""

import contextlib
import os

import torch
import triton
import triton.language as tl

from .pairwise_cosine_stats import _upper_tile_coords


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# For subspace b and an upper tile (bi, bj) of the N×N pair grid:
#   dist_ij = clamp(1 − û_i·û_j, 0, 2) for j > i, stored at b·n + i·N − i(i+1)/2 + (j − i − 1).
@triton.jit(do_not_specialize=["n_tokens", "n_pairs", "n_tiles", "n_col_tiles", "k"])
def _subspace_pga_distance_kernel(
    u_ptr, dist_ptr, n_tokens, n_pairs, n_tiles, n_col_tiles, k, stride_ub, stride_ur,
    INPUT_PRECISION: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    bi, bj = _upper_tile_coords(t, n_col_tiles)
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
        dots = tl.dot(a, tl.trans(c), dots, input_precision=INPUT_PRECISION)
    dist = tl.minimum(tl.maximum(1.0 - dots, 0.0), 2.0)
    keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] > rows[:, None])
    n = tl.cast(n_tokens, tl.int64)
    pair = rows[:, None] * n - rows[:, None] * (rows[:, None] + 1) // 2 + (cols[None, :] - rows[:, None] - 1)
    tl.store(dist_ptr + b * n_pairs + pair, dist, mask=keep)


def _config(interpreting: bool):
    return (32, 32, 4, 1) if interpreting else (64, 32, 4, 3)  # BLOCK, BLOCK_K, warps, stages


def _compute(x: torch.Tensor) -> torch.Tensor:
    """float64 stays float64 (tl.dot runs on fp64 tensor cores on sm_80+); else float32."""
    return x if x.dtype == torch.float64 else x.to(torch.float32)


def _unit_rows(p: torch.Tensor):
    """p / ‖p‖ per row (division, so one-hot rows stay exact); a mask of subspaces with a zero row."""
    norms = torch.linalg.vector_norm(p, dim=-1, keepdim=True)
    zero = (norms == 0).any(dim=-2).reshape(-1)
    return p / torch.where(norms == 0, torch.ones_like(norms), norms), zero


def _distances(u: torch.Tensor) -> torch.Tensor:
    """(B, n) condensed distances of the unit rows u (B, N, k), in u's dtype (float32/64)."""
    interpreting = _interpreting()
    bsz, n_tokens, k = u.shape
    n_pairs = n_tokens * (n_tokens - 1) // 2
    block, block_k, warps, stages = _config(interpreting)
    nb = triton.cdiv(n_tokens, block)
    n_tiles = nb * (nb + 1) // 2
    dist = torch.full((bsz, n_pairs), float("nan"), dtype=u.dtype, device=u.device)  # poisoned
    guard = torch.cuda.device(u.device) if u.device.type == "cuda" else contextlib.nullcontext()
    precision = "ieee" if u.dtype == torch.float64 or torch.get_float32_matmul_precision() == "highest" else "tf32"
    with guard:
        _subspace_pga_distance_kernel[(n_tiles, bsz)](
            u, dist, n_tokens, n_pairs, n_tiles, nb, k, u.stride(0), u.stride(1),
            INPUT_PRECISION=precision, BLOCK=block, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
        )
    if n_pairs and bool(torch.isnan(dist).any()):
        raise RuntimeError("subspace_pga (triton): internal error, a pair distance was not written")
    return dist


def _run_bounds(sorted_vals: torch.Tensor):
    """Per sorted position t of each row: the run of equal values [start, end) holding it."""
    bsz, n = sorted_vals.shape
    pos = torch.arange(n, device=sorted_vals.device).expand(bsz, n)
    new = torch.ones_like(sorted_vals, dtype=torch.bool)
    new[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    start = torch.where(new, pos, torch.zeros_like(pos)).cummax(dim=1).values
    last = torch.ones_like(new)
    last[:, :-1] = new[:, 1:]
    end = torch.where(last, pos + 1, torch.full_like(pos, n)).flip(1).cummin(dim=1).values.flip(1)
    return start, end


def _average_ranks_sorted(sorted_vals: torch.Tensor) -> torch.Tensor:
    start, end = _run_bounds(sorted_vals)
    return 0.5 * (start + end - 1).to(torch.float64) + 1.0


def subspace_pga_ranks_triton(x: torch.Tensor) -> torch.Tensor:
    """float64 average ranks of the condensed cosine distances of x's rows (x: N×d, rows ≠ 0)."""
    u, zero = _unit_rows(_compute(x)[None])
    if bool(zero.any()):
        raise ValueError("subspace_pga_ranks (triton): x has a zero row")
    dist = _distances(u.contiguous())
    sorted_vals, order = torch.sort(dist, dim=1, stable=True)
    ranks = torch.empty_like(dist, dtype=torch.float64)
    ranks.scatter_(1, order, _average_ranks_sorted(sorted_vals))
    return ranks[0]


def subspace_pga_rhos_triton(x: torch.Tensor, bases: torch.Tensor, ref_ranks: torch.Tensor) -> torch.Tensor:
    """Spearman's ρ between ref_ranks and the ranks of each projected subspace's distances."""
    n_tokens = x.shape[0]
    n = n_tokens * (n_tokens - 1) // 2
    if ref_ranks.shape != (n,):
        raise ValueError(f"subspace_pga_rhos (triton): ref_ranks must have length {n}")
    proj = torch.matmul(_compute(x), bases.to(_compute(x).dtype))  # (B, N, k), batched GEMM
    u, zero = _unit_rows(proj)
    dist = _distances(u.contiguous())
    sorted_vals, order = torch.sort(dist, dim=1, stable=True)
    mean = 0.5 * (n + 1)
    ref_centered = ref_ranks.to(torch.float64) - mean
    ref_sum_sq = float((ref_centered * ref_centered).sum())
    r = _average_ranks_sorted(sorted_vals) - mean
    cross = (r * ref_centered[order]).sum(dim=1)
    den = (r * r).sum(dim=1) * ref_sum_sq
    rho = torch.where(den > 0, cross / den.clamp_min(1e-300).sqrt(), torch.full_like(cross, float("nan")))
    rho[zero.to(rho.device)] = float("nan")
    return rho.cpu()
