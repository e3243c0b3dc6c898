"""Subspace PGA's method="stream" (repcap_fast.ops.subspace_pga): ranks from histogram CDFs.

Every cosine distance falls in one of ``STREAM_BINS`` bins of [0, 2], and the pairs of a bin share
the bin's average rank; distances are recomputed tile by tile, so the memory is O(bins) per
subspace instead of O(pairs). It runs on torch ops on H's device.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import torch

from .._backends import cublas_precision

STREAM_BINS = 1 << 21  # histogram bins over [0, 2] of method="stream": width 9.5e-7
_STREAM_TILE_ELEMS = 1 << 18  # distances per subspace formed at once by method="stream"


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """‖x_i‖ summed in float64 and rounded to x's dtype (as the C++ kernel does).

    Float32 rows of 1e-25 keep a nonzero norm.
    """
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float64).to(x.dtype)


def _stream_bins(u: torch.Tensor, bins: int, rows: int):
    """Histogram bins of the cosine distances of the unit rows u (…, N, k), pairs i<j.

    Formed `rows` rows at a time: yields (…, pairs of the block) int64 bins, in condensed order.
    """
    N = u.shape[-2]
    for r0 in range(0, N - 1, rows):
        r1 = min(N - 1, r0 + rows)
        dots = u[..., r0:r1, :] @ u[..., r0:, :].transpose(-2, -1)  # (…, r1-r0, N-r0)
        keep = torch.ones(r1 - r0, N - r0, dtype=torch.bool, device=u.device).triu_(1)
        dist = (1.0 - dots[..., keep]).clamp_(0.0, 2.0)
        yield (dist * (bins / 2.0)).to(torch.int64).clamp_(0, bins - 1)


def _midranks(hist: torch.Tensor, mean: float):
    """(R − m per bin, Σ count·(R − m)²) per row of hist (…, bins).

    R = count below + (count + 1)/2, the average rank of a bin's pairs were they tied, in float64.
    One row's temporaries at a time: 8 B per bin per row kept, plus 16 B per bin of one row.
    """
    flat = hist.reshape(-1, hist.shape[-1])
    centered = torch.empty(flat.shape, dtype=torch.float64, device=hist.device)
    sum_sq = torch.empty(flat.shape[0], dtype=torch.float64, device=hist.device)
    for r in range(flat.shape[0]):
        h = flat[r].to(torch.float64)
        c = centered[r]
        torch.cumsum(h, dim=0, out=c)
        c.sub_(h, alpha=0.5).add_(0.5 - mean)  # count below + (count + 1)/2 − m
        sum_sq[r] = torch.dot(c * c, h)
    return centered.reshape(hist.shape), sum_sq.reshape(hist.shape[:-1])


def _subspace_rhos_stream(x: torch.Tensor, bases: torch.Tensor, batch: int, precision: str, bar,
                          name_of: Callable[[int], str], bins: int = STREAM_BINS,
                          tile_elems: int = _STREAM_TILE_ELEMS) -> List[float]:
    """ρ per basis with ranks from histogram CDFs (method="stream").

    Every distance falls in one of `bins` bins of [0, 2], and the pairs of a bin share the bin's
    average rank. Two passes over the pairs, recomputing distances tile by tile: the histograms,
    then Σ (R_F − m)(R_S − m). Memory: 12 B per bin per subspace of a batch and of the full space
    (counts, midranks), one tile of distances, never a subspace's pairs.
    """
    N = x.shape[0]
    n = N * (N - 1) // 2
    mean = 0.5 * (n + 1)
    full = x / _row_norms(x)
    # One row blocking for every pass and batch size, so the dot products (and the result) do not
    # depend on the batch.
    rows = max(1, min(N - 1, tile_elems // N))
    count_dtype = torch.int32 if n < 2**31 else torch.int64  # a bin may hold every pair

    def histogram(u):
        """The (…, bins) pair counts of the unit rows u."""
        lead = int(np.prod(u.shape[:-2])) if u.dim() > 2 else 1
        hist = torch.zeros(lead, bins, dtype=count_dtype, device=u.device)
        for b in _stream_bins(u, bins, rows):
            b = b.reshape(lead, -1)
            hist.scatter_add_(1, b, torch.ones_like(b, dtype=count_dtype))  # in place
        return hist.reshape(*u.shape[:-2], bins)

    with cublas_precision(precision, x.device):
        full_centered, full_sum_sq = _midranks(histogram(full), mean)
        rhos: List[float] = []
        for b0 in range(0, bases.shape[0], batch):
            proj = torch.matmul(x, bases[b0 : b0 + batch].to(x.dtype))  # (B, N, k)
            norms = _row_norms(proj)
            zero = (norms == 0).flatten(1).any(dim=1).tolist()
            if any(zero):
                raise ValueError(f"H projected on {name_of(b0 + zero.index(True))} has zero-norm rows; "
                                 "cosine distance is undefined")
            u = proj / norms
            del proj
            sub_centered, sub_sum_sq = _midranks(histogram(u), mean)
            cross = torch.zeros(u.shape[0], dtype=torch.float64, device=x.device)
            for bf, bs in zip(_stream_bins(full, bins, rows), _stream_bins(u, bins, rows)):
                r_full = full_centered[bf]  # (pairs,)
                r_sub = torch.gather(sub_centered, 1, bs)  # (B, pairs)
                cross += r_sub @ r_full
            den = sub_sum_sq * full_sum_sq
            rho = torch.where(den > 0, cross / den.clamp_min(1e-300).sqrt(), torch.full_like(cross, float("nan")))
            rhos.extend(rho.tolist())
            bar.update(u.shape[0])
    return rhos
