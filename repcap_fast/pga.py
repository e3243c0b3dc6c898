"""Subspace PGA (Xu 2026, DESIGN.md §1.4), the namespace users import: the op ``subspace_pga``
(repcap_fast.ops.subspace_pga), the per-layer profile and the cross-model agreement built on it,
the subspace geometry (repcap_fast.geometry), the spectral metrics the paper compares against
(repcap_fast.spectral), and the rank reference (repcap_fast.reference).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from . import _validation as val
from . import distributed
from ._progress import progress_bar
from ._validation import check_basis, check_n_null, check_orthonormal
from .geometry import (
    LAYOUTS,
    CCRResult,
    ReadoutBasis,
    center_and_ccr,
    clear_readout_cache,
    grassmann_bases,
    readout_basis,
    readout_subspace,
    reused_draws,
    shared_ccr,
)
from .ops.subspace_pga import (
    METHODS,
    STREAM_BINS,
    DegenerateInputWarning,
    PGAResult,
    check_settings,
    pga_batch_bytes,
    subspace_pga,
)
from .reference import average_ranks, condensed_cosine_distances, pairwise_cosine_distances, pearson, spearman
from .spectral import alpha_req, condition_number, direction_alignment, isotropy, rankme, spectral_metrics


@dataclass(frozen=True)
class _Profile:
    """pga_profile's validated layers, readout basis (and how it was found) and CCR variants."""

    layers: List
    labels: List
    d: int
    readout: torch.Tensor
    readout_solver: str  # ReadoutBasis.solver, or "given"
    ccrs: List[int]
    seed: int
    n_null: int
    readout_note: Optional[str] = None  # readout_rank_note's warning for W_U

    def signature(self) -> Dict[str, object]:
        return {"layers": len(self.layers), "d": self.d, "readout": distributed.tensor_digest(self.readout),
                "ccrs": self.ccrs, "seed": self.seed, "n_null": self.n_null}


def _check_profile(hidden_states_by_layer, W_U, basis, k, layout, ccrs, seed, n_null, method, backend,
                   precision) -> _Profile:
    """Every argument of pga_profile checked before the first layer runs: each layer's shape,
    dtype and values (finite), every CCR variant against every layer, the readout, and the
    settings."""
    if isinstance(hidden_states_by_layer, Mapping):  # e.g. repcap_fast.models.hidden_states(...)
        labels, layers = list(hidden_states_by_layer.keys()), list(hidden_states_by_layer.values())
    elif isinstance(hidden_states_by_layer, (torch.Tensor, np.ndarray)) and hidden_states_by_layer.ndim == 2:
        raise val.ArgumentTypeError("hidden_states_by_layer must be a sequence (or a mapping) of N×d matrices, one "
                                    "per layer, got one matrix: pass [H] for one layer, or use subspace_pga")
    else:
        try:
            layers = list(hidden_states_by_layer)
        except TypeError:
            raise val.ArgumentTypeError("hidden_states_by_layer must be a sequence (or a mapping) of N×d matrices, got "
                            f"{type(hidden_states_by_layer).__name__}") from None
        labels = list(range(len(layers)))
    if not layers:
        raise ValueError("hidden_states_by_layer is empty")
    layers = [val.finite_matrix(H, f"hidden_states_by_layer[{label!r}]") for label, H in zip(labels, layers)]
    d = int(layers[0].shape[1])
    for label, H in zip(labels, layers):
        if int(H.shape[1]) != d:
            raise ValueError(f"hidden_states_by_layer[{label!r}] has d={H.shape[1]}, the first layer has d={d}")
    if isinstance(ccrs, (int, np.integer)):
        ccrs = [ccrs]
    ccrs = list(ccrs)
    if not ccrs:
        raise ValueError("ccrs is empty: give at least one CCR variant, e.g. (1,)")
    if len(set(ccrs)) != len(ccrs):
        raise ValueError(f"ccrs has duplicates: {tuple(ccrs)}; each CCR variant is computed once")
    n_null = check_n_null(n_null)
    for label, H in zip(labels, layers):
        for c in ccrs:
            check_settings(int(H.shape[0]), d, H.device, n_null, c, seed, method, backend, precision, None,
                           name=f"hidden_states_by_layer[{label!r}]")
    readout, readout_solver, readout_note = readout_subspace(W_U, basis, k, layout, d)
    return _Profile(layers, labels, d, readout, readout_solver, [int(c) for c in ccrs], int(seed), n_null,
                    readout_note)


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

    hidden_states_by_layer: a sequence of N×d matrices, or a mapping layer → matrix (such as
    `repcap_fast.models.hidden_states(...)`); each result's settings["layer"] is its index in
    the sequence or its key. ccrs: distinct CCR variants. Every argument is checked, for every
    layer and variant, before the first layer runs. The readout basis and the null subspaces
    are drawn once (the same seed) and shared by every layer and CCR variant, and each layer's
    principal directions are found once for all its CCR variants (`geometry.shared_ccr`; the
    results equal one `subspace_pga` call per layer and variant bit for bit when max(ccrs) ≤
    geometry.CCR_BLOCK = 10). Shows a progress bar over layers × variants."""
    group = distributed.resolve_group(group)
    prof = distributed.prepare_on_every_rank("pga_profile", group, _check_profile, hidden_states_by_layer, W_U, basis,
                                             k, layout, ccrs, seed, n_null, method, backend, precision)
    out: Dict[int, List[PGAResult]] = {c: [] for c in prof.ccrs}
    if prof.readout_note:
        warnings.warn(f"pga_profile: {prof.readout_note}", DegenerateInputWarning, stacklevel=2)
    with reused_draws(), shared_ccr(max(prof.ccrs)), progress_bar(
            progress and distributed.is_main(group), total=len(prof.layers) * len(prof.ccrs), desc="PGA profile",
            unit="layer", leave=True) as bar:
        for c in prof.ccrs:
            for i, H in enumerate(prof.layers):
                res = subspace_pga(H, basis=prof.readout, n_null=n_null, ccr=c, seed=seed, layout=layout,
                                   method=method, backend=backend, precision=precision, progress=False, group=group)
                res.settings["readout"] = "basis" if basis is not None else "W_U"
                res.settings["readout_solver"] = prof.readout_solver
                res.settings["layer"] = prof.labels[i]
                if prof.readout_note:
                    res.warnings.insert(0, prof.readout_note)
                out[c].append(res)
                bar.set_postfix_str(f"ccr={c} layer={prof.labels[i]}")
                bar.update(1)
    return out


def cross_model_agreement(H_a, H_b, basis_a: torch.Tensor, basis_b: torch.Tensor, *, n_null: int = 20,
                          ccr: int = 1, seed: int = 0) -> dict:
    """Spearman between two models' pair distances on the same N tokens (rows aligned):
    in each model's readout subspace (H_a on basis_a, H_b on basis_b), in the full spaces, and
    in random subspaces of the same dimensions (n_null draws per model, seeded; mean and sample
    std of the ρ's). Both are centered with CCR-`ccr` first."""
    n_null = check_n_null(n_null)
    seed = val.check_int(seed, "seed", 0, val.MAX_SEED - 1)  # model b draws with seed + 1
    H_a, H_b = val.finite_matrix(H_a, "H_a"), val.finite_matrix(H_b, "H_b")  # all checks before any work
    if H_a.shape[0] != H_b.shape[0]:
        raise ValueError(f"H_a and H_b must hold the same tokens: N={H_a.shape[0]} vs N={H_b.shape[0]}")
    if H_a.shape[0] < 3:
        raise ValueError(f"need N >= 3 tokens, got {H_a.shape[0]}")
    ba = check_basis(basis_a, H_a.shape[1], "basis_a")
    bb = check_basis(basis_b, H_b.shape[1], "basis_b")
    for name, H in (("H_a", H_a), ("H_b", H_b)):
        check_settings(int(H.shape[0]), int(H.shape[1]), H.device, n_null, ccr, seed, "exact", "torch", "highest",
                       None, name=name)
    xa, _ = center_and_ccr(H_a, ccr)
    xb, _ = center_and_ccr(H_b, ccr)

    def rho(pa, pb):
        return pearson(average_ranks(condensed_cosine_distances(pa, "H_a")),
                       average_ranks(condensed_cosine_distances(pb, "H_b")))

    null_a = grassmann_bases(xa.shape[1], ba.shape[1], n_null, seed, dtype=xa.dtype, device=xa.device)
    null_b = grassmann_bases(xb.shape[1], bb.shape[1], n_null, seed + 1, dtype=xb.dtype, device=xb.device)
    ba, bb = ba.to(xa.device, xa.dtype), bb.to(xb.device, xb.dtype)
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
    "CCRResult", "DegenerateInputWarning", "LAYOUTS", "METHODS", "PGAResult", "ReadoutBasis", "STREAM_BINS",
    "alpha_req", "average_ranks", "center_and_ccr", "check_orthonormal", "clear_readout_cache", "condition_number",
    "cross_model_agreement",
    "direction_alignment", "grassmann_bases", "isotropy", "pairwise_cosine_distances", "pga_batch_bytes",
    "pga_profile", "rankme", "readout_basis", "spearman", "spectral_metrics", "subspace_pga",
]
