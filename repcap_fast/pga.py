"""Subspace PGA (Xu 2026, DESIGN.md §1.4): the namespace users import.

The op ``subspace_pga`` (repcap_fast.ops.subspace_pga), the per-layer profile and the cross-model
agreement built on it, the subspace geometry (repcap_fast.geometry), the spectral metrics the
paper compares against (repcap_fast.spectral), and the rank reference (repcap_fast.reference).
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
        """What every rank must agree on (prepare_on_every_rank compares it across ranks)."""
        return {"layers": len(self.layers), "d": self.d, "readout": distributed.tensor_digest(self.readout),
                "ccrs": self.ccrs, "seed": self.seed, "n_null": self.n_null}


def _check_profile(hidden_states_by_layer, W_U, basis, k, layout, ccrs, seed, n_null, method, backend,
                   precision) -> _Profile:
    """Every argument of pga_profile checked before the first layer runs.

    Each layer's shape, dtype and values (finite), every CCR variant against every layer, the
    readout, and the settings.
    """
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

    Each entry is ``subspace_pga(H, basis=B, n_null=n_null, ccr=c, seed=seed, ...)`` of one layer
    H and one CCR variant c: the z-score of the readout subspace's Spearman ρ against the ρ's of
    random subspaces. Every argument is checked, for every layer and variant, before the first
    layer runs. The readout basis B and the null subspaces are found once and shared by every
    layer and variant, and each layer's principal directions are found once for all its
    variants; the results equal one ``subspace_pga`` call per layer and variant bit for bit when
    max(ccrs) ≤ 10.

    Args:
        hidden_states_by_layer: the layers' N×d hidden states (torch tensors or numpy arrays,
            one d, the same N tokens or not): a sequence, or a mapping layer → matrix (such as
            ``repcap_fast.models.hidden_states(...)``); each result's ``settings["layer"]`` is
            the layer's index in the sequence or its key.
        W_U (torch.Tensor | numpy.ndarray): the unembedding (layout "hf": V×d, "tl": d×V), whose
            top-k right singular vectors are the readout basis; or pass `basis` instead.
        basis: a d×k readout basis with orthonormal columns, 1 ≤ k < d. Defaults to None.
        k: the readout dimension when W_U is given, 1 ≤ k < d. Defaults to 100.
        n_null: random subspaces per layer and variant, ≥ 2. Defaults to 100.
        ccrs: the CCR variants (principal components removed after centering), distinct ints
            with 0 ≤ c < min(N, d) for every layer; an int is one variant. Defaults to (1, 5, 10).
        seed: the seed of the null subspaces, in [0, 2^63 − 1]. Defaults to 0.
        layout: "hf" (default) or "tl", W_U's layout (see ``readout_basis``).
        method: "exact" (default) or "stream", as ``subspace_pga``.
        backend: "auto" (default), "cpu", "cuda", "triton" or "torch", as ``subspace_pga``.
        precision: "highest" (default) or "tf32", as ``subspace_pga``.
        progress: a progress bar over layers × variants (on the main rank). Defaults to True.
        group (torch.distributed.ProcessGroup): the process group to split each layer's
            subspaces across, as ``subspace_pga`` (default None: torchrun's default group when it
            has more than one rank, else this process alone).

    Returns:
        Dict[int, List[PGAResult]]: for each CCR variant, one PGAResult per layer, in the layers'
        order.

    Raises:
        ValueError: hidden_states_by_layer empty, one matrix instead of a sequence (an
            ``ArgumentTypeError``, also a TypeError, for it or another wrong type), or a layer
            that is not a finite 2-D float matrix or has another d; ccrs empty or with
            duplicates; an argument that ``subspace_pga`` refuses for some layer and variant
            (N < 3, a ccr ≥ min(N, d), n_null < 2, a seed out of range, an unknown method,
            backend or precision); both or neither of W_U and basis; W_U not V×d (d×V for "tl")
            or all zeros; a basis that is not finite d×k with orthonormal columns; k outside
            [1, d).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.
        RuntimeError: `group` given while torch.distributed is not initialized; across ranks,
            ``distributed.RankFailure`` on every rank when one fails.

    Warns:
        DegenerateInputWarning: W_U has fewer than k nonzero singular values (the readout
            subspace is partly random), or a layer's result is degenerate (as ``subspace_pga``).

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> layers = [torch.randn(30, 8, generator=g) for _ in range(2)]
        >>> W_U = torch.randn(50, 8, generator=g)
        >>> prof = rf.pga.pga_profile(layers, W_U, k=3, n_null=5, ccrs=(0, 1), progress=False)
        >>> sorted(prof), len(prof[1]), prof[1][1].settings["layer"], prof[1][1].k
        ([0, 1], 2, 1, 3)
    """
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
    """How alike two models arrange the same N tokens: Spearman ρ between their pair distances.

    Both H_a and H_b are centered with CCR-`ccr` first (``center_and_ccr``). Then
    ρ = spearman(d_a, d_b) of the two models' condensed cosine distances of the token pairs
    (``pairwise_cosine_distances``), compared in each model's readout subspace (H_a projected on
    basis_a, H_b on basis_b), in the full spaces, and in random subspaces of the same
    dimensions (n_null draws per model from ``grassmann_bases``, model a with `seed` and model b
    with seed + 1). Materializes N(N−1)/2 distances per model: for moderate N.

    Args:
        H_a (torch.Tensor | numpy.ndarray): model a's N×d_a hidden states, finite.
        H_b (torch.Tensor | numpy.ndarray): model b's N×d_b hidden states of the same tokens, row
            for row.
        basis_a: model a's d_a×k_a readout basis, orthonormal columns.
        basis_b: model b's d_b×k_b readout basis, orthonormal columns.
        n_null: random subspace pairs, ≥ 2. Defaults to 20.
        ccr: principal components removed after centering, 0 ≤ ccr < min(N, d). Defaults to 1.
        seed: the seed of the random subspaces, in [0, 2^63 − 2]. Defaults to 0.

    Returns:
        dict: "readout" (ρ in the readout subspaces), "full" (ρ in the full spaces),
        "random_mean" and "random_std" (the mean and sample std, ddof = 1, of the random
        subspaces' ρ's), "random" (those ρ's), "n_tokens" (N) and "ccr".

    Raises:
        ValueError: n_null < 2 or a seed out of range; H_a or H_b not a finite 2-D float matrix
            (an ``ArgumentTypeError``, also a TypeError, for a wrong type); N differs between
            them, N < 3, or N too large for its N×N float64 distances to fit in memory; a basis
            that is not finite d×k with orthonormal columns; ccr outside [0, min(N, d)); a token
            whose projection on a subspace is zero.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> H = torch.randn(20, 8, generator=g, dtype=torch.float64)
        >>> B = rf.pga.readout_basis(torch.randn(50, 8, generator=g), k=3).basis
        >>> res = rf.pga.cross_model_agreement(H, H, B, B, n_null=5)  # a model against itself
        >>> round(res["readout"], 6), round(res["full"], 6), len(res["random"]), res["n_tokens"]
        (1.0, 1.0, 5, 20)
    """
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
