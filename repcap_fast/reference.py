"""Reference implementations (the ``torch`` backend): plain, chunked, float64-capable PyTorch.

They are the oracle the tests trust and the naive baseline the benchmarks beat. They take
already-validated inputs; the public functions in repcap_fast check arguments.
"""

from __future__ import annotations

from typing import Optional

import torch

_CHUNK_BYTES = 256 << 20


def histogram_bins(c: torch.Tensor, bins: int, lo: float, hi: float):
    """Bin index floor((c - lo)·bins/(hi - lo)), c == hi in the last bin; (hist, below, above)."""
    below = int((c < lo).sum())
    above = int((c > hi).sum())
    inside = c[(c >= lo) & (c <= hi)]
    idx = ((inside - lo) * (bins / (hi - lo))).floor().to(torch.int64).clamp_(max=bins - 1)
    return torch.bincount(idx, minlength=bins).cpu(), below, above


def _unit_rows(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x̂ = x/‖x‖ in `dtype`; rows are first scaled by their max |x| so the norm cannot overflow."""
    m = m.to(torch.float64)
    m = m / m.abs().amax(dim=1, keepdim=True)
    return torch.nn.functional.normalize(m, dim=1, eps=0.0).to(dtype)


def pairwise_cosine_stats_reference(
    a: torch.Tensor,
    b: Optional[torch.Tensor] = None,
    *,
    bins: int = 4096,
    lo: float = -1.0,
    hi: float = 1.0,
    dtype: torch.dtype = torch.float64,
    progress=None,
):
    """Naive chunked statistics of the pairwise cosines, computed in `dtype`.

    Full rows per chunk: C = X̂[r0:r1] X̂ᵀ, keep j > i (or all pairs with b), then separate passes
    for Σc, Σc², min, max and the histogram. Returns a dict of plain numbers and the histogram.
    """
    x = _unit_rows(a, dtype)
    y = x if b is None else _unit_rows(b, dtype)
    m, n = x.shape[0], y.shape[0]
    chunk = max(1, _CHUNK_BYTES // (n * x.element_size() * 3))
    total = torch.zeros((), dtype=torch.float64)
    total_sq = torch.zeros((), dtype=torch.float64)
    cmin, cmax = float("inf"), float("-inf")
    hist = torch.zeros(bins, dtype=torch.int64)
    below = above = count = 0
    starts = range(0, m, chunk)
    if progress is not None:
        starts = progress(starts)
    cols = torch.arange(n, device=x.device)
    for r0 in starts:
        c = x[r0 : r0 + chunk] @ y.T
        if b is None:
            rows = torch.arange(r0, r0 + c.shape[0], device=x.device)
            c = c[cols[None, :] > rows[:, None]]
        else:
            c = c.reshape(-1)
        if c.numel() == 0:
            continue
        c = c.clamp(-1.0, 1.0)
        count += c.numel()
        total += c.sum(dtype=torch.float64).cpu()
        total_sq += (c * c).sum(dtype=torch.float64).cpu()
        cmin = min(cmin, float(c.min()))
        cmax = max(cmax, float(c.max()))
        h, lo_n, hi_n = histogram_bins(c, bins, lo, hi)
        hist += h
        below += lo_n
        above += hi_n
    return {
        "count": count,
        "sum": float(total),
        "sum_sq": float(total_sq),
        "min": cmin,
        "max": cmax,
        "below": below,
        "above": above,
        "hist": hist,
    }


def cosine_moments_reference(a: torch.Tensor, b: Optional[torch.Tensor] = None):
    """Σc and Σc² over the pairs through d×d Grams, float64, O(V·d²), no pairs at all.

    Self: Σ_{i<j} c = (‖Σ_i x̂_i‖² − V)/2 and Σ_{i<j} c² = (‖X̂ᵀX̂‖_F² − V)/2.
    A×B:  Σ c = (Σ x̂_i)·(Σ ŷ_j) and Σ c² = ⟨X̂ᵀX̂, ŶᵀŶ⟩_F.
    """

    def gram_and_sum(m: torch.Tensor):
        d = m.shape[1]
        rows = max(1, _CHUNK_BYTES // (8 * d))
        gram = torch.zeros(d, d, dtype=torch.float64, device=m.device)
        total = torch.zeros(d, dtype=torch.float64, device=m.device)
        sq_norms = torch.zeros((), dtype=torch.float64, device=m.device)
        for r0 in range(0, m.shape[0], rows):
            xc = _unit_rows(m[r0 : r0 + rows], torch.float64)
            gram += xc.T @ xc
            total += xc.sum(0)
            sq_norms += (xc * xc).sum()
        return gram, total, float(sq_norms)

    gram_a, sum_a, diag_a = gram_and_sum(a)
    if b is None:
        v = a.shape[0]
        s = (float(sum_a @ sum_a) - diag_a) / 2.0
        s2 = (float(torch.vdot(gram_a.reshape(-1), gram_a.reshape(-1))) - diag_a) / 2.0
        return {"count": v * (v - 1) // 2, "sum": s, "sum_sq": s2}
    gram_b, sum_b, _ = gram_and_sum(b)
    return {
        "count": a.shape[0] * b.shape[0],
        "sum": float(sum_a @ sum_b),
        "sum_sq": float(torch.vdot(gram_a.reshape(-1), gram_b.reshape(-1))),
    }


def gram_offdiag_penalty_reference(
    X: torch.Tensor, p: int = 8, normalize: bool = True, reduction: str = "sum",
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """L = Σ_{i≠j} |ĝ_ij|^p from the materialized k×k Gram matrix, differentiable by autograd.

    The plain baseline (the paper's formulation) and the oracle of the tests: in `dtype`
    (default X's dtype), with ĝ from the row-normalized X when `normalize`. Memory O(k²).
    """
    x = X if dtype is None else X.to(dtype)
    k = x.shape[0]
    if normalize:
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
    g = x @ x.T
    off_diagonal = ~torch.eye(k, dtype=torch.bool, device=x.device)
    loss = torch.where(off_diagonal, g.abs().pow(p), torch.zeros((), dtype=g.dtype, device=g.device)).sum()
    if reduction == "mean":
        loss = loss / (k * (k - 1))
    return loss


def gram_offdiag_max_reference(X: torch.Tensor, normalize: bool = True) -> float:
    """max_{i≠j} |ĝ_ij| in float64 from the materialized Gram matrix."""
    x = X.to(torch.float64)
    if normalize:
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
    g = (x @ x.T).abs()
    g.fill_diagonal_(0.0)
    return float(g.max())
