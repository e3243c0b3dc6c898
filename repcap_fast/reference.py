"""Reference implementations: plain, chunked, float64-capable PyTorch.

They are the oracle the tests trust and the naive baseline the benchmarks beat (the ``torch``
backends call them). They take already-validated inputs; the public functions check arguments,
except ``spearman`` and ``pairwise_cosine_distances``, which are public as they are (SciPy's
spearmanr and pdist(·, "cosine")).
"""

from __future__ import annotations

import math
import warnings
from typing import List, Optional

import torch

from . import _validation as val

_CHUNK_BYTES = 256 << 20


def histogram_bins(c: torch.Tensor, bins: int, lo: float, hi: float):
    """Bin index floor((c - lo)·bins/(hi - lo)), c == hi in the last bin; (hist, below, above)."""
    below = int((c < lo).sum())
    above = int((c > hi).sum())
    inside = c[(c >= lo) & (c <= hi)]
    idx = ((inside - lo) * (bins / (hi - lo))).floor().to(torch.int64).clamp_(max=bins - 1)
    return torch.bincount(idx, minlength=bins).cpu(), below, above


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

    Per chunk of rows: C = X̂[r0:r1] X̂[r0:]ᵀ (the columns from r0 on), keep j > i (or all pairs
    with b: C = X̂[r0:r1] Ŷᵀ), then separate passes for Σc, Σc², min, max and the histogram.
    Returns a dict of plain numbers and the histogram. progress: None, or a callable that wraps
    the iterable of row chunks (a tqdm, say).
    """
    x = val.unit_rows(a, dtype)
    y = x if b is None else val.unit_rows(b, dtype)
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
    for r0 in starts:
        if b is None:  # columns j ≥ r0 only: the pairs j > i of these rows
            c = x[r0 : r0 + chunk] @ x[r0:].T
            rows = torch.arange(c.shape[0], device=x.device)
            cols = torch.arange(c.shape[1], device=x.device)
            c = c[cols[None, :] > rows[:, None]]
        else:
            c = (x[r0 : r0 + chunk] @ y.T).reshape(-1)
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
            xc = val.unit_rows(m[r0 : r0 + rows], torch.float64)
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


# ------------------------------------------------------------- Subspace PGA: ranks and ρ


def condensed_cosine_distances(x: torch.Tensor, name: str = "H") -> torch.Tensor:
    """Cosine distances 1 − cos(x_i, x_j) of the rows of x for i<j in SciPy's condensed order, in x's dtype.

    Clamped to [0, 2] as scipy's pdist does (duplicate tokens give exactly 0, not −2e-16).
    Materializes N(N−1)/2 values. Zero rows are an error (their cosine is undefined). Rows of any
    finite scale are directions: norms that underflow or overflow (below 1e-150 or not finite)
    are taken with `_validation.unit_rows` instead of the plain x/‖x‖.
    """
    norms = torch.linalg.vector_norm(x, dim=1)
    extreme = ~torch.isfinite(norms) | (norms < 1e-150)
    if bool(extreme.any()):
        norms = val.row_norms(x, name)
    zero = norms == 0
    if bool(zero.any()):
        idx = torch.nonzero(zero).flatten()[:10].tolist()
        raise ValueError(f"{name} has {int(zero.sum())} zero-norm rows (rows {idx}); cosine distance is undefined")
    u = val.unit_rows(x, x.dtype, norms, name) if bool(extreme.any()) else x / norms[:, None]
    n = u.shape[0]
    iu = torch.triu_indices(n, n, 1, device=u.device)
    return (1.0 - (u @ u.T)[iu[0], iu[1]]).clamp_(0.0, 2.0).contiguous()


def pairwise_cosine_distances(H) -> torch.Tensor:
    """The cosine distances of every pair of rows of H, in float64, as SciPy's ``pdist(H, "cosine")``.

    d_ij = 1 − h_i·h_j/(‖h_i‖‖h_j‖) for i < j, in the condensed order of
    ``scipy.spatial.distance.pdist`` ((0, 1), (0, 2), …, (1, 2), …), clamped to [0, 2].
    Materializes N(N−1)/2 values: for small N and tests.

    Args:
        H (torch.Tensor | numpy.ndarray): N×d rows, any float dtype, finite, none zero.

    Returns:
        torch.Tensor: (N(N−1)/2,) float64 on H's device.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for
            another type or dtype), empty, or with NaN/Inf; a zero row (its cosine is undefined).

    Examples:
        >>> rf.pga.pairwise_cosine_distances(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        tensor([1.0000, 0.2929, 0.2929], dtype=torch.float64)
    """
    return condensed_cosine_distances(val.finite_matrix(H, "H").to(torch.float64), "H")


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """The 1-based ranks of the values of a 1-D tensor, ties given their average rank.

    As ``scipy.stats.rankdata(x, method="average")``: the i-th smallest value has rank i, and a
    group of equal values shares the mean of their ranks.

    Args:
        x: a 1-D tensor of real values.

    Returns:
        torch.Tensor: the ranks, float64, on x's device.

    Raises:
        ValueError: x is not 1-D.

    Examples:
        >>> rf.pga.average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0]))
        tensor([3.5000, 1.0000, 3.5000, 2.0000], dtype=torch.float64)
    """
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
    n = x.numel()
    order = torch.argsort(x, stable=True)
    xs = x[order]
    new_group = torch.ones(n, dtype=torch.bool, device=x.device)
    new_group[1:] = xs[1:] != xs[:-1]
    group = torch.cumsum(new_group.to(torch.int64), 0) - 1
    starts = torch.nonzero(new_group).flatten()
    ends = torch.cat([starts[1:], torch.tensor([n], device=x.device)])
    group_rank = (starts + ends - 1).to(torch.float64) / 2.0 + 1.0
    ranks = torch.empty(n, dtype=torch.float64, device=x.device)
    ranks[order] = group_rank[group]
    return ranks


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """The Pearson correlation of two 1-D tensors in float64 (NaN when one is constant)."""
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else float("nan")


def spearman(x, y) -> float:
    """Spearman's rank correlation ρ of x and y, ties given their average rank, in float64.

    ρ is the Pearson correlation of ``average_ranks(x)`` and ``average_ranks(y)``. It matches
    ``scipy.stats.spearmanr(x, y).statistic`` wherever SciPy's conversion of x and y to one float64
    array is exact (SciPy rounds integers beyond 2^53 next to floats; this does not): x and y are
    ranked exactly as given, so 1 and 1 + 1e-9, or 2**62 and 2**62 + 1, stay distinct. ±inf are
    ranked as the largest/smallest values, as SciPy does.

    Args:
        x (array-like): real values: a list, a numpy array of any real dtype, or a tensor
            (flattened).
        y (array-like): as many real values as x.

    Returns:
        float: ρ in [−1, 1]; NaN, with SciPy's ``ConstantInputWarning``, when x or y is constant
        (ρ is undefined), as SciPy does.

    Raises:
        ValueError: x or y holds NaN (SciPy would propagate it) or values that are not real
            numbers (an ``ArgumentTypeError``, also a TypeError); x and y differ in length or
            have fewer than 2 values.

    Examples:
        >>> rf.pga.spearman([1, 2, 3, 4], [1, 3, 2, 4])
        0.8
    """
    x = val.as_rank_keys(x, "x")
    y = val.as_rank_keys(y, "y")
    if x.numel() != y.numel():
        raise ValueError(f"x and y must have the same length, got {x.numel()} and {y.numel()}")
    if x.numel() < 2:
        raise ValueError(f"spearman needs at least 2 values, got {x.numel()}")
    if bool((x == x[0]).all()) or bool((y == y[0]).all()):
        from scipy.stats import ConstantInputWarning  # the warning class SciPy users filter on

        warnings.warn("An input array is constant; the correlation coefficient is not defined.",
                      ConstantInputWarning, stacklevel=2)
        return float("nan")
    return pearson(average_ranks(x), average_ranks(y).to(x.device))


def subspace_rhos_reference(x: torch.Tensor, bases: torch.Tensor, progress=None,
                            name_of=lambda b: f"subspace {b}") -> List[float]:
    """Spearman(d_full, d_S) for each basis S of bases (B, d, k), in x's dtype (float64 for the reference).

    The per-subspace loop, one subspace's N(N−1)/2 distances at a time. progress: None, or an
    object with update(n) called once per subspace; name_of(b) names basis b in the error for a
    zero projected row.
    """
    full_ranks = average_ranks(condensed_cosine_distances(x, "H"))
    rhos = []
    for b in range(bases.shape[0]):
        dist = condensed_cosine_distances(x @ bases[b], f"H projected on {name_of(b)}")
        rhos.append(pearson(full_ranks, average_ranks(dist)))
        if progress is not None:
            progress.update(1)
    return rhos


# ---------------------------------------------------------------- grassmann_normals (Philox)

_PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)
_MASK32 = 0xFFFFFFFF


def _mulhilo32(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit words of a·b for a constant a < 2^32 and int64 b in [0, 2^32).

    Without overflowing int64: b in 16-bit halves (each partial product < 2^48).
    """
    p0 = a * (b & 0xFFFF)
    p1 = a * (b >> 16)
    mid = p1 + (p0 >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (p0 & 0xFFFF)


def philox4x32_10_reference(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 (Random123) of counters (c0, c1, c2, c3) under the key (k0, k1).

    The counters are int64 tensors of 32-bit words; returns the four output words as int64
    tensors in [0, 2^32). The same rounds as csrc/grassmann_normals.h, in int64 torch ops on any
    device.
    """
    m0, m1 = _PHILOX_MULTIPLIERS
    for _ in range(10):
        hi0, lo0 = _mulhilo32(m0, c0)
        hi1, lo1 = _mulhilo32(m1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _PHILOX_WEYL[0]) & _MASK32, (k1 + _PHILOX_WEYL[1]) & _MASK32
    return c0, c1, c2, c3


def grassmann_normals_reference(n: int, d: int, k: int, seed: int, first_basis: int = 0, device="cpu") -> torch.Tensor:
    """The (n, d, k) float64 standard normals of bases first_basis … first_basis + n − 1 for `seed`.

    As csrc/grassmann_normals.h defines them (Philox4x32-10 keyed by the seed, counter
    (e div 4, basis), two Box–Muller pairs per counter; entry (i, j) of a basis is normal i·k + j),
    in plain torch ops on `device`.
    """
    per_basis = d * k
    groups = (per_basis + 3) // 4
    group = torch.arange(groups, dtype=torch.int64, device=device).repeat(n)
    basis = (torch.arange(n, dtype=torch.int64, device=device) + first_basis).repeat_interleave(groups)
    words = philox4x32_10_reference(group & _MASK32, group >> 32, basis & _MASK32, basis >> 32,
                                    seed & _MASK32, seed >> 32)
    u = [(w.to(torch.float64) + 0.5) * 2.0**-32 for w in words]
    out = []
    for a, b in ((u[0], u[1]), (u[2], u[3])):
        radius = torch.sqrt(-2.0 * torch.log(a))
        angle = (2.0 * math.pi) * b
        out += [radius * torch.cos(angle), radius * torch.sin(angle)]
    normals = torch.stack(out, dim=1).reshape(n, groups * 4)[:, :per_basis]
    return normals.reshape(n, d, k).contiguous()
