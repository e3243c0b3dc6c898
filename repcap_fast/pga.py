"""Subspace PGA (Xu 2026, DESIGN.md §1.4), the namespace users import: the op ``subspace_pga``
(repcap_fast.ops.subspace_pga), the per-layer profile and the cross-model agreement built on it,
the subspace geometry (repcap_fast.geometry), the spectral metrics the paper compares against
(repcap_fast.spectral), and the rank reference (repcap_fast.reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from . import distributed
from ._progress import progress_bar
from ._validation import check_basis, check_n_null, check_orthonormal
from .geometry import (
    LAYOUTS,
    CCRResult,
    ReadoutBasis,
    center_and_ccr,
    grassmann_bases,
    readout_basis,
    readout_subspace,
    reused_draws,
)
from .ops.subspace_pga import METHODS, STREAM_BINS, PGAResult, pga_batch_bytes, subspace_pga
from .reference import average_ranks, condensed_cosine_distances, pairwise_cosine_distances, pearson, spearman
from .spectral import alpha_req, condition_number, direction_alignment, isotropy, rankme, spectral_metrics


@dataclass(frozen=True)
class _Profile:
    """pga_profile's validated layers, readout basis and CCR variants."""

    layers: List
    d: int
    readout: torch.Tensor
    ccrs: List[int]
    seed: int
    n_null: int

    def signature(self) -> Dict[str, object]:
        return {"layers": len(self.layers), "d": self.d, "readout": distributed.tensor_digest(self.readout),
                "ccrs": self.ccrs, "seed": self.seed, "n_null": self.n_null}


def _check_profile(hidden_states_by_layer, W_U, basis, k, layout, ccrs, seed, n_null) -> _Profile:
    layers = list(hidden_states_by_layer)
    if not layers:
        raise ValueError("hidden_states_by_layer is empty")
    d = int(layers[0].shape[-1])
    for i, H in enumerate(layers):
        if int(H.shape[-1]) != d:
            raise ValueError(f"hidden_states_by_layer[{i}] has d={H.shape[-1]}, layer 0 has d={d}")
    return _Profile(layers, d, readout_subspace(W_U, basis, k, layout, d), [int(c) for c in ccrs], seed,
                    check_n_null(n_null))


def pga_profile(
    hidden_states_by_layer: Sequence,
    W_U=None,
    *,
    basis: Optional[torch.Tensor] = None,
    k: int = 100,
    n_null: int = 100,
    ccrs: Sequence[int] = (1, 5, 10),
    seed: int = 0,
    layout: str = "hf",
    method: str = "exact",
    backend: str = "auto",
    precision: str = "highest",
    progress: bool = True,
    group=None,
) -> Dict[int, List[PGAResult]]:
    """Subspace PGA of every layer, for each CCR variant: {ccr: [PGAResult per layer]}.

    The readout basis and the null subspaces are drawn once (the same seed) and shared by
    every layer and CCR variant. Shows a progress bar over layers × variants."""
    group = distributed.resolve_group(group)
    prof = distributed.prepare_on_every_rank("pga_profile", group, _check_profile, hidden_states_by_layer, W_U, basis,
                                             k, layout, ccrs, seed, n_null)
    out: Dict[int, List[PGAResult]] = {c: [] for c in prof.ccrs}
    with reused_draws(), progress_bar(progress and distributed.is_main(group), total=len(prof.layers) * len(prof.ccrs),
                                      desc="PGA profile", unit="layer", leave=True) as bar:
        for c in prof.ccrs:
            for i, H in enumerate(prof.layers):
                res = subspace_pga(H, basis=prof.readout, n_null=n_null, ccr=c, seed=seed, layout=layout,
                                   method=method, backend=backend, precision=precision, progress=False, group=group)
                res.settings["readout"] = "basis" if basis is not None else "W_U"
                out[c].append(res)
                bar.set_postfix_str(f"ccr={c} layer={i}")
                bar.update(1)
    return out


def cross_model_agreement(H_a, H_b, basis_a: torch.Tensor, basis_b: torch.Tensor, *, n_null: int = 20,
                          ccr: int = 1, seed: int = 0) -> dict:
    """Spearman between two models' pair distances on the same N tokens (rows aligned):
    in each model's readout subspace (H_a on basis_a, H_b on basis_b), in the full spaces, and
    in random subspaces of the same dimensions (n_null draws per model, seeded; mean and sample
    std of the ρ's). Both are centered with CCR-`ccr` first."""
    n_null = check_n_null(n_null)
    xa, _ = center_and_ccr(H_a, ccr)
    xb, _ = center_and_ccr(H_b, ccr)
    if xa.shape[0] != xb.shape[0]:
        raise ValueError(f"H_a and H_b must hold the same tokens: N={xa.shape[0]} vs N={xb.shape[0]}")
    if xa.shape[0] < 3:
        raise ValueError(f"need N >= 3 tokens, got {xa.shape[0]}")
    ba = check_basis(basis_a, xa.shape[1], "basis_a")
    bb = check_basis(basis_b, xb.shape[1], "basis_b")

    def rho(pa, pb):
        return pearson(average_ranks(condensed_cosine_distances(pa, "H_a")),
                       average_ranks(condensed_cosine_distances(pb, "H_b")))

    null_a = grassmann_bases(xa.shape[1], ba.shape[1], n_null, seed)
    null_b = grassmann_bases(xb.shape[1], bb.shape[1], n_null, seed + 1)
    rand = np.array([rho(xa @ null_a[i], xb @ null_b[i]) for i in range(n_null)])
    return {
        "readout": rho(xa @ ba, xb @ bb),
        "full": rho(xa, xb),
        "random_mean": float(rand.mean()),
        "random_std": float(rand.std(ddof=1)),
        "random": rand.tolist(),
        "n_tokens": int(xa.shape[0]),
        "ccr": int(ccr),
    }


__all__ = [
    "CCRResult", "LAYOUTS", "METHODS", "PGAResult", "ReadoutBasis", "STREAM_BINS", "alpha_req", "average_ranks",
    "center_and_ccr", "check_orthonormal", "condition_number", "cross_model_agreement", "direction_alignment",
    "grassmann_bases", "isotropy", "pairwise_cosine_distances", "pga_batch_bytes", "pga_profile", "rankme",
    "readout_basis", "spearman", "spectral_metrics", "subspace_pga",
]
