"""Spectral metrics of a layer's hidden states that the Subspace-PGA paper compares against.

RankMe, α-ReQ, isotropy and the condition number, and the alignment of the top principal
directions with a readout subspace; all in float64. The public names are served from
``repcap_fast.pga``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from . import _validation as val


def _centered64(H, center: bool) -> torch.Tensor:
    """H checked (finite matrix) as float64, centered over its rows when `center`."""
    x = val.finite_matrix(H, "H").to(torch.float64)
    return x - x.mean(dim=0, keepdim=True) if center else x


def _singular_values(H, center: bool) -> torch.Tensor:
    return torch.linalg.svdvals(_centered64(H, center))


def _svd_right(x: torch.Tensor):
    """(σ, Vᵀ) of x (N×d), without forming the N×min(N, d) left singular vectors when x is tall.

    For a tall x (N ≥ 2d) they come from the SVD of R in x = QR, whose singular values and right
    singular vectors are x's (Householder QR is backward stable, as the SVD is); else from the SVD
    of x.
    """
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
    """How much of each of the top m principal directions of H lies in the readout subspace.

    For each of the top m right singular vectors v of the centered H (its principal directions),
    the fraction ‖Bᵀv‖² of the unit direction v that lies in span(B), B = `basis`: 1 inside, 0
    orthogonal; a random direction keeps k/d on average.

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        basis: a d×k readout basis with orthonormal columns (e.g. ``readout_basis(W_U).basis``).
        m: the number of top directions, 1 ≤ m ≤ min(N, d). Defaults to 10.

    Returns:
        torch.Tensor: (m,) float64, the fraction for each direction, the largest principal
        direction first.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf; `basis` not a finite d×k tensor with orthonormal
            columns; m outside [1, min(N, d)].

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> H = torch.randn(50, 6, generator=g) * torch.tensor([10.0, 1, 1, 1, 1, 1])  # most variance along e_0
        >>> basis = torch.eye(6, dtype=torch.float64)[:, :2]  # span(e_0, e_1)
        >>> a = rf.pga.direction_alignment(H, basis, m=3)
        >>> a.shape, bool(a[0] > 0.99)
        (torch.Size([3]), True)
    """
    x = _centered64(H, True)
    b = val.check_basis(basis, x.shape[1])
    m = _check_m(m, x)
    return _alignment_from(_svd_right(x)[1], b, m)


def _rankme_from(s: torch.Tensor, eps: float) -> float:
    """RankMe of the singular values s."""
    p = s / s.sum() + eps
    return float(torch.exp(-(p * torch.log(p)).sum()))


def rankme(H, center: bool = False, eps: float = 1e-7) -> float:
    r"""RankMe (Garrido et al., 2023): the effective rank of H, exp of the entropy of its singular values.

    $\text{RankMe} = \exp(-\sum_i p_i \ln p_i)$ with $p_i = \sigma_i/\sum_j \sigma_j + \text{eps}$,
    over the singular values σ_i of H themselves (not their squares, the eigenvalues of HᵀH). Between 1 and min(N, d).

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        center: subtract the mean over tokens first. Defaults to False (H as given).
        eps: added to each p_i, ≥ 0. Defaults to 1e-7.

    Returns:
        float: RankMe.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf; eps not a real number ≥ 0.

    Examples:
        >>> round(rf.pga.rankme(torch.eye(4)), 4)  # four equal singular values
        4.0
    """
    eps = val.check_real(eps, "eps", 0.0)
    return _rankme_from(_singular_values(H, center), eps)


def _check_fit_range(fit_range, n_values: Optional[int] = None):
    """fit_range as (first, last) ints with 1 <= first < last (<= n_values), or None.

    Checked before any SVD; integers of any kind, never truncated (1.5 is refused).
    """
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
    """α-ReQ from the singular values s of a matrix of n_rows rows."""
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
    r"""α-ReQ (Agrawal et al., 2022): the decay exponent α of the covariance eigenspectrum.

    $\lambda_i \propto i^{-\alpha}$, with λ_i = σ_i²/(N − 1) from the singular values σ_i of H
    (centered by default); α is minus the least-squares slope of ln λ_i on ln i over the nonzero
    eigenvalues (above λ_1·1e-12), or over the 1-based index range `fit_range`.

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        center: subtract the mean over tokens first. Defaults to True.
        fit_range (tuple of int): (first, last), 1-based and inclusive, 1 ≤ first < last ≤
            min(N, d). Defaults to None (every nonzero eigenvalue).

    Returns:
        float: α.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf; fit_range not a pair of ints with 1 ≤ first < last ≤
            min(N, d); fewer than two nonzero eigenvalues in the fit range.

    Examples:
        >>> H = torch.diag(1.0 / torch.arange(1, 9, dtype=torch.float64))  # σ_i = 1/i, λ_i ∝ i^-2
        >>> round(rf.pga.alpha_req(H, center=False), 6)
        2.0
    """
    _check_fit_range(fit_range)
    x = _centered64(H, center)
    return _alpha_from(torch.linalg.svdvals(x), x.shape[0], fit_range)


def _isotropy_from(x: torch.Tensor, vecs: torch.Tensor) -> float:
    """min_c Z(c) / max_c Z(c) over the columns c of vecs and their negatives.

    Directions of HᵀH's null space that vecs leaves out (N < d) have Z = N.
    """
    proj = x @ vecs
    # both orientations ±c of each eigenvector (LAPACK's signs are arbitrary; Z(c) ≠ Z(−c))
    log_z = torch.logsumexp(torch.cat([proj, -proj], dim=1), dim=0)
    lo, hi = log_z.min(), log_z.max()
    if vecs.shape[1] < x.shape[1]:
        log_n = torch.tensor(math.log(x.shape[0]), dtype=log_z.dtype, device=log_z.device)
        lo, hi = torch.minimum(lo, log_n), torch.maximum(hi, log_n)
    return float(torch.exp(lo - hi))


def isotropy(H, center: bool = False) -> float:
    r"""Partition-function isotropy (Mu & Viswanath, 2018): how evenly the rows of H spread over directions.

    $I(H) = \min_c Z(c) / \max_c Z(c)$ with $Z(c) = \sum_i \exp(c^\top h_i)$, over the eigenvectors c of HᵀH and
    their negatives, computed in log space (no overflow). 1 is perfectly isotropic, near 0
    strongly anisotropic.

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states h_i (rows), any float dtype, finite.
        center: subtract the mean over tokens first. Defaults to False (H as given).

    Returns:
        float: the isotropy, in (0, 1].

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf.

    Examples:
        >>> rf.pga.isotropy(torch.cat([torch.eye(3), -torch.eye(3)]))  # ±e_1, ±e_2, ±e_3
        1.0
    """
    x = _centered64(H, center)
    _, vecs = torch.linalg.eigh(x.T @ x)
    return _isotropy_from(x, vecs)


def _condition_from(s: torch.Tensor, shape) -> float:
    """σ_max/σ_min of the descending singular values s of a matrix of `shape`, or inf."""
    # numerically zero (rank-deficient, e.g. centered H with N ≤ d): below σ_max·max(N, d)·eps
    tol = float(s[0]) * max(shape) * torch.finfo(torch.float64).eps
    return float(s[0] / s[-1]) if float(s[-1]) > tol else float("inf")


def condition_number(H, center: bool = True) -> float:
    """The condition number σ_max/σ_min of H (centered by default), over its min(N, d) singular values.

    It is inf when H is numerically rank-deficient: σ_min ≤ σ_max·max(N, d)·eps, eps the float64
    machine epsilon (e.g. a centered H with N ≤ d).

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        center: subtract the mean over tokens first. Defaults to True.

    Returns:
        float: σ_max/σ_min, ≥ 1, or inf.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf.

    Examples:
        >>> rf.pga.condition_number(torch.diag(torch.tensor([4.0, 2.0, 1.0])), center=False)
        4.0
    """
    x = _centered64(H, center)
    return _condition_from(torch.linalg.svdvals(x), x.shape)


def spectral_metrics(H, basis: Optional[torch.Tensor] = None, m: int = 10) -> Dict[str, object]:
    """Every spectral metric of H at once: RankMe, α-ReQ, isotropy, condition number, and the readout alignment.

    Each metric with its function's defaults (``rankme``, ``alpha_req``, ``isotropy``,
    ``condition_number``) and, given a readout basis, ``direction_alignment`` of the top m
    principal directions; all from two SVDs (of H as given, and centered) instead of one
    decomposition per metric. Equal to the separate functions up to rounding (isotropy: up to
    the choice of eigenvectors inside a repeated eigenvalue).

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        basis: a d×k readout basis with orthonormal columns, or None (default: no alignment).
        m: the top directions for the alignment, ≥ 1, capped at min(N, d). Defaults to 10.

    Returns:
        Dict[str, object]: "rankme", "alpha_req" (NaN when fewer than two eigenvalues are
        nonzero), "isotropy" and "condition_number" as floats, and with a basis
        "readout_alignment_top", a (min(m, N, d),) float64 CPU tensor.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for another
            type or dtype), empty, or with NaN/Inf; `basis` not a finite d×k tensor with orthonormal
            columns; m not an int ≥ 1.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> H = torch.randn(50, 6, generator=g) * torch.tensor([10.0, 1, 1, 1, 1, 1])
        >>> out = rf.pga.spectral_metrics(H, torch.eye(6, dtype=torch.float64)[:, :2], m=3)
        >>> sorted(out)
        ['alpha_req', 'condition_number', 'isotropy', 'rankme', 'readout_alignment_top']
        >>> abs(out["rankme"] - rf.pga.rankme(H)) < 1e-9
        True
    """
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
