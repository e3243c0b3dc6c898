"""Spectral metrics of a layer's hidden states that the Subspace-PGA paper compares against
(RankMe, α-ReQ, isotropy, condition number), and the alignment of the top principal directions
with a readout subspace. All in float64.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from . import _validation as val


def _centered64(H, center: bool) -> torch.Tensor:
    x = val.finite_matrix(H, "H").to(torch.float64)
    return x - x.mean(dim=0, keepdim=True) if center else x


def _singular_values(H, center: bool) -> torch.Tensor:
    return torch.linalg.svdvals(_centered64(H, center))


def _svd_right(x: torch.Tensor):
    """(σ, Vᵀ) of x (N×d): for a tall x (N ≥ 2d) from the SVD of R in x = QR, whose singular values
    and right singular vectors are x's (Householder QR is backward stable, as the SVD is), without
    forming the N×min(N, d) left vectors (0.6 of the time at 2048×576 here); else the SVD of x."""
    n, d = x.shape
    if n >= 2 * d:
        x = torch.linalg.qr(x, mode="r")[1]
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    return s, vh


def _check_m(m, x: torch.Tensor) -> int:
    return val.check_int(m, f"m (in [1, min(N, d) = {min(x.shape)}])", 1, min(x.shape))


def _alignment_from(vh: torch.Tensor, b: torch.Tensor, m: int) -> torch.Tensor:
    """‖Bᵀv‖² of the top m right singular vectors, for a checked (`val.check_basis`) basis B."""
    return ((vh[:m] @ b.to(vh.device)) ** 2).sum(dim=1)


def direction_alignment(H, basis: torch.Tensor, m: int = 10) -> torch.Tensor:
    """For each of the top m principal directions v of the centered H, the fraction ‖Bᵀv‖² of
    the unit direction that lies in span(basis) (1: inside, 0: orthogonal; a random direction
    keeps k/d on average). Returns (m,) float64."""
    x = _centered64(H, True)
    b = val.check_basis(basis, x.shape[1])
    m = _check_m(m, x)
    return _alignment_from(_svd_right(x)[1], b, m)


def _rankme_from(s: torch.Tensor, eps: float) -> float:
    p = s / s.sum() + eps
    return float(torch.exp(-(p * torch.log(p)).sum()))


def rankme(H, center: bool = False, eps: float = 1e-7) -> float:
    """RankMe (Garrido et al., 2023): exp of the entropy of the normalized singular values
    p_i = σ_i/Σσ + eps. Uses the singular values of H themselves, not their squares (the
    eigenvalues of HᵀH), and H as given unless center=True. Between 1 and min(N, d)."""
    eps = val.check_real(eps, "eps", 0.0)
    return _rankme_from(_singular_values(H, center), eps)


def _check_fit_range(fit_range, n_values: Optional[int] = None):
    """fit_range as (first, last) ints with 1 <= first < last (<= n_values), or None: checked
    before any SVD; integers of any kind, never truncated (1.5 is refused)."""
    if fit_range is None:
        return None
    if isinstance(fit_range, (str, bytes)) or not hasattr(fit_range, "__len__") or len(fit_range) != 2:
        raise ValueError(f"fit_range must be a pair (first, last) of 1-based indices, got {fit_range!r}")
    first, last = (val.as_int(v, "fit_range") for v in fit_range)
    top = "" if n_values is None else f" <= {n_values}"
    if not 1 <= first < last or (n_values is not None and last > n_values):
        raise ValueError(f"fit_range must satisfy 1 <= first < last{top}, got {fit_range!r}")
    return first, last


def _alpha_from(s: torch.Tensor, n_rows: int, fit_range=None) -> float:
    lam = s ** 2 / max(1, n_rows - 1)
    idx = torch.arange(1, lam.numel() + 1, dtype=torch.float64, device=lam.device)
    keep = lam > lam[0] * 1e-12
    if fit_range is not None:
        first, last = _check_fit_range(fit_range)
        if not 1 <= first < last <= lam.numel():
            raise ValueError(f"fit_range must satisfy 1 <= first < last <= {lam.numel()}, got {fit_range!r}")
        keep = keep & (idx >= first) & (idx <= last)
    if int(keep.sum()) < 2:
        raise ValueError("alpha_req needs at least two nonzero eigenvalues in the fit range")
    lx, ly = torch.log(idx[keep]), torch.log(lam[keep])
    lx_c = lx - lx.mean()
    return float(-(lx_c @ (ly - ly.mean())) / (lx_c @ lx_c))


def alpha_req(H, center: bool = True, fit_range=None) -> float:
    """α-ReQ (Agrawal et al., 2022): the decay exponent α of the covariance eigenspectrum,
    λ_i ∝ i^(−α), by least squares of log λ_i on log i over the nonzero eigenvalues (or the
    1-based index range `fit_range=(first, last)`, inclusive)."""
    _check_fit_range(fit_range)
    x = _centered64(H, center)
    return _alpha_from(torch.linalg.svdvals(x), x.shape[0], fit_range)


def _isotropy_from(x: torch.Tensor, vecs: torch.Tensor) -> float:
    """min_c Z(c) / max_c Z(c) over the columns c of vecs and their negatives; directions of
    HᵀH's null space that vecs leaves out (N < d) have Z = N."""
    proj = x @ vecs
    # both orientations ±c of each eigenvector (LAPACK's signs are arbitrary; Z(c) ≠ Z(−c))
    log_z = torch.logsumexp(torch.cat([proj, -proj], dim=1), dim=0)
    lo, hi = log_z.min(), log_z.max()
    if vecs.shape[1] < x.shape[1]:
        log_n = torch.tensor(math.log(x.shape[0]), dtype=log_z.dtype, device=log_z.device)
        lo, hi = torch.minimum(lo, log_n), torch.maximum(hi, log_n)
    return float(torch.exp(lo - hi))


def isotropy(H, center: bool = False) -> float:
    """Partition-function isotropy (Mu & Viswanath, 2018): min_c Z(c) / max_c Z(c) with
    Z(c) = Σ_i exp(cᵀh_i) over the eigenvectors c of HᵀH and their negatives, in log space (no
    overflow). 1 is
    perfectly isotropic, near 0 strongly anisotropic. H as given unless center=True."""
    x = _centered64(H, center)
    _, vecs = torch.linalg.eigh(x.T @ x)
    return _isotropy_from(x, vecs)


def _condition_from(s: torch.Tensor, shape) -> float:
    # numerically zero (rank-deficient, e.g. centered H with N ≤ d): below σ_max·max(N, d)·eps
    tol = float(s[0]) * max(shape) * torch.finfo(torch.float64).eps
    return float(s[0] / s[-1]) if float(s[-1]) > tol else float("inf")


def condition_number(H, center: bool = True) -> float:
    """σ_max/σ_min of H (centered by default), over min(N, d) singular values; inf when H is
    numerically rank-deficient (σ_min ≤ σ_max·max(N, d)·eps_float64)."""
    x = _centered64(H, center)
    return _condition_from(torch.linalg.svdvals(x), x.shape)


def spectral_metrics(H, basis: Optional[torch.Tensor] = None, m: int = 10) -> Dict[str, object]:
    """RankMe, α-ReQ, isotropy and condition number of H, each with its function's defaults, and
    (given a readout basis, d×k) `direction_alignment` of the top m principal directions: all
    from two SVDs (H as given, and centered; of R in H = QR when N ≥ 2d) instead of one
    decomposition per metric. Equal to the separate functions up to rounding (isotropy: up to the
    choice of eigenvectors inside a repeated eigenvalue). α-ReQ is NaN when fewer than two
    eigenvalues are nonzero. m is capped at min(N, d) (`direction_alignment` refuses a larger m)."""
    m = val.check_int(m, "m", 1)
    raw = val.finite_matrix(H, "H").to(torch.float64)
    b = None if basis is None else val.check_basis(basis, raw.shape[1])
    centered = raw - raw.mean(dim=0, keepdim=True)
    s_raw, vh_raw = _svd_right(raw)
    s_c, vh_c = _svd_right(centered)
    try:
        alpha = _alpha_from(s_c, raw.shape[0])
    except ValueError:
        alpha = float("nan")
    out: Dict[str, object] = {"rankme": _rankme_from(s_raw, 1e-7), "alpha_req": alpha,
                              "isotropy": _isotropy_from(raw, vh_raw.T),
                              "condition_number": _condition_from(s_c, raw.shape)}
    if b is not None:
        out["readout_alignment_top"] = _alignment_from(vh_c, b, _check_m(min(m, *raw.shape), raw)).cpu()
    return out
