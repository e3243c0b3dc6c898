"""The result of subspace_pga (repcap_fast.ops.subspace_pga) and its warning."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List


@dataclass
class PGAResult:
    """The Subspace-PGA result of one layer: ρ_readout, the null ρ's and z, as ``subspace_pga`` returns it.

    z = (ρ_readout − null_mean) / null_std, null_std the sample std (ddof = 1). ``warnings`` names
    what makes the result degenerate (each also raised as a ``DegenerateInputWarning``): a readout
    W_U with fewer than k nonzero singular values (some readout directions are then arbitrary; an
    all-zero W_U is refused), a CCR residual of rank ≤ 1 (z is NaN: every distance is 0 or 2, and
    rounding alone would order them), duplicated tokens (their pairs tie at distance 0 in every
    subspace), an undefined ρ, or σ_null = 0 (z is NaN).

    Attributes:
        z (float): the z-score (NaN when undefined).
        rho_readout (float): Spearman ρ of the full-space and readout-subspace distances.
        null_rhos (list): ρ of each null subspace, in draw order.
        null_mean (float): the mean of the null ρ's.
        null_std (float): the sample std (ddof = 1) of the null ρ's.
        n_pairs (int): the token pairs N(N−1)/2.
        n_tokens (int): N.
        d (int): the hidden size.
        k (int): the readout subspace's dimension.
        n_null (int): the number of null subspaces.
        ccr (int): the principal components removed after centering.
        seed (int): the seed of the null subspaces.
        method (str): "exact" or "stream".
        backend (str): the backend that ran.
        settings (dict): layout, readout ("W_U" or "basis"), readout_solver, precision, ranks and
            distances: how the result was computed.
        warnings (list): what makes the result degenerate (empty for a clean result).

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> H, W_U = torch.randn(40, 16, generator=g), torch.randn(100, 16, generator=g)
        >>> result = rf.subspace_pga(H, W_U, k=4, n_null=20)
        >>> result.n_pairs, len(result.null_rhos), result.warnings
        (780, 20, [])
        >>> sorted(result.to_dict())[:4]
        ['backend', 'ccr', 'd', 'k']
    """

    z: float
    rho_readout: float
    null_rhos: List[float]
    null_mean: float
    null_std: float
    n_pairs: int
    n_tokens: int
    d: int
    k: int
    n_null: int
    ccr: int
    seed: int
    method: str
    backend: str
    settings: Dict[str, object] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The result as a JSON-ready dict; an undefined z, ρ or null statistic (NaN) is None."""
        out = asdict(self)
        for key in ("z", "rho_readout", "null_mean", "null_std"):
            if not math.isfinite(out[key]):
                out[key] = None
        return out


class DegenerateInputWarning(RuntimeWarning):
    """The input makes a Subspace-PGA result degenerate (also recorded in PGAResult.warnings)."""
