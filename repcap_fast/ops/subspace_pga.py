"""subspace_pga: the Subspace-PGA z-score of one layer (Xu 2026, DESIGN.md §1.4).

Does a layer's pairwise-distance structure survive projection onto the unembedding's readout
subspace better than onto random subspaces?

For hidden states H (N×d) of one layer:
  1. center H and remove its top m principal components (CCR-m, default m = 1);
  2. V_k = top-k right singular vectors of W_U (default k = 100), through the d×d Gram in float64;
  3. d_full = cosine distances 1 − cos of all pairs i<j (SciPy's condensed ``pdist`` order), and
     d_S the same after projecting onto a subspace S;
  4. ρ_readout = Spearman(d_full, d_{V_k}) with average ranks for ties (as scipy.stats.spearmanr);
  5. ρ_b likewise for n_null subspaces drawn uniformly from the Grassmannian (seeded);
  6. z = (ρ_readout − mean ρ_b) / std ρ_b (sample std, ddof = 1).

Layers: ``subspace_pga`` (validates, preprocesses, draws the bases) → ``_subspace_pga`` (splits the
subspaces across ranks, sizes the batches, dispatches) → ``KERNELS["subspace_pga"][backend]``
(``_subspace_pga_compiled`` for cpu and cuda, ``_subspace_pga_triton``, ``_subspace_pga_torch``)
→ the kernels (torch.ops.repcap_fast.subspace_pga_ranks/_rhos, triton_kernels.subspace_pga,
reference.subspace_rhos_reference). ``method="stream"`` (histogram ranks) runs on torch ops.

Every launcher takes (x, bases, batch, precision, progress, name_of): the preprocessed H (N×d,
in the compute dtype), the bases (B, d, k), subspaces per kernel call, the precision, a progress
bar and the name of basis b for errors; it returns ρ per basis (NaN where a projected row is 0).
The result class is in ``_subspace_pga_result``, method="stream" in ``_subspace_pga_stream``.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import _validation as val
from .. import distributed
from .._backends import (
    check_precision,
    cublas_precision,
    custom_op,
    eager_only,
    kernel_limits,
    launcher,
    register_kernel,
    resolve_backend,
    triton_kernels,
)
from .._ops import subspace_pga_ranks_fake
from .._progress import progress_bar
from ..geometry import center_and_ccr_unscaled, grassmann_bases, readout_subspace
from ..reference import subspace_rhos_reference
from ._subspace_pga_result import DegenerateInputWarning, PGAResult
from ._subspace_pga_stream import STREAM_BINS, _subspace_rhos_stream

__all__ = ["METHODS", "STREAM_BINS", "DegenerateInputWarning", "PGAResult", "pga_batch_bytes", "subspace_pga"]

METHODS = ("exact", "stream")
_STREAM_BATCH = 4  # default subspaces per pass of method="stream"
_PROGRESS_WORK = 2e8  # pairs × subspaces above which a bar is shown by default
# cpu: the most pairs × subspaces of one kernel call when `batch` is left to us (at least 16
# subspaces). Each call converts the reference ranks and sets up every thread's buffers (about
# 3 ms at N = 1024 here), so small N gets few calls; large N still updates the bar about every
# half second of this machine's work.
_CPU_PAIRS_PER_CALL = 1 << 26
# Bytes per pair of one kernel call: (per subspace in flight, held once per call) for float32
# keys, and the extra of float64 keys. cpu: each thread holds its float32 pairs as 8-byte items
# (plus two copies of the largest bucket: a few percent of the pairs for spread distances, up to
# all of them when nearly every distance shares its top 16 bits), or float64 keys and 32-bit
# payloads with scratch twins; once: the float64 reference ranks and twice them as uint32.
# cuda: keys and payloads of every subspace of the batch; once: reference ranks, twice them, and
# the shared sort scratch. triton: see triton_kernels/subspace_pga.py.
_PAIR_BYTES = {"cpu": ((8, 12), (16, 0)), "cuda": ((8, 20), (4, 4)), "triton": ((8, 52), (0, 0))}
# The torch reference's peak per token pair (N² of them): the N×N float64 Gram, its upper
# triangle and the ranks and sort scratch of the condensed distances.
_REFERENCE_PAIR_BYTES = 24


# ------------------------------------------------------------------------------ validation


@dataclass(frozen=True)
class _Inputs:
    """The validated inputs of one call.

    H validated; x: H centered, CCR'd and with unit rows (float64); the readout basis, the null
    bases and the settings (batch: subspaces per kernel call, None for the memory-sized default);
    what makes the input degenerate.
    """

    H: torch.Tensor
    x: torch.Tensor
    readout: torch.Tensor
    nulls: torch.Tensor
    ccr: int
    seed: int
    method: str
    backend: str
    precision: str
    batch: Optional[int]
    warnings: Tuple[str, ...] = ()
    readout_solver: str = "given"  # how the readout basis was found (ReadoutBasis.solver), or "given"

    def signature(self) -> Dict[str, object]:
        """What every rank must agree on (batch may differ across ranks: it changes no result)."""
        return {"H": distributed.tensor_digest(self.H), "readout": distributed.tensor_digest(self.readout),
                "nulls": distributed.tensor_digest(self.nulls), "k": int(self.readout.shape[1]),
                "n_null": int(self.nulls.shape[0]), "ccr": self.ccr, "seed": self.seed, "method": self.method,
                "backend": self.backend, "precision": self.precision}


@dataclass(frozen=True)
class Settings:
    """The validated settings of a Subspace-PGA call (everything but the matrices' values)."""

    n_null: int
    ccr: int
    seed: int
    method: str
    backend: str
    precision: str
    batch: Optional[int]


def check_settings(N: int, d: int, device: torch.device, n_null, ccr, seed, method, backend, precision,
                   batch, name: str = "H") -> Settings:
    """Checks everything about a call on an N×d `name` that needs no pass over its values.

    N ≥ 3, n_null, ccr (0 ≤ ccr < min(N, d)), seed, method, backend (and its token limit),
    precision, batch, and, for the torch reference, that its N×N float64 working set fits in
    memory.
    """
    if N < 3:
        raise ValueError(f"{name} needs N >= 3 tokens (rows), got N={N}")
    n_null = val.check_n_null(n_null)
    seed = val.check_seed(seed)
    ccr = val.check_int(ccr, "ccr", 0)
    if ccr >= min(N, d):
        raise ValueError(f"ccr must be < min(N, d) = {min(N, d)} ({name}: N={N} tokens, d={d}), got {ccr}")
    if batch is not None:
        batch = val.check_int(batch, "batch", 1)  # subspaces per kernel call
    val.check_choice(method, "method", METHODS)
    check_precision(precision)
    if method == "stream":
        if backend not in ("auto", "torch", None):
            raise ValueError(f"method='stream' runs on torch ops on H's device; backend must be 'auto' or "
                             f"'torch', got {backend!r}")
        backend_name = "torch"
    else:
        backend_name = resolve_backend(backend, device, "subspace_pga")
        if backend_name != "torch" and N > kernel_limits().pga_tokens:
            raise ValueError(f"{name} has N={N} tokens; the {backend_name} kernel takes at most "
                             f"{kernel_limits().pga_tokens} (twice the ranks of the N(N−1)/2 pairs are 32-bit): use "
                             f"backend='torch' or method='stream', or sample fewer tokens")
        if backend_name == "torch":
            need = _REFERENCE_PAIR_BYTES * N * N
            budget = _memory_budget(torch.device(device))
            if need > budget:
                raise ValueError(f"{name} has N={N} tokens: the torch reference materializes N×N float64 "
                                 f"distances (about {need / 2**30:.1f} GiB) and half the available memory is "
                                 f"{budget / 2**30:.1f} GiB; use method='stream', a kernel backend, or fewer tokens")
    return Settings(n_null, int(ccr), seed, method, backend_name, precision, None if batch is None else int(batch))


def _compute_dtype(backend: str, method: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype distances are computed in.

    Float64 for the torch reference (exact method) and float64 H, float32 otherwise.
    """
    return torch.float64 if backend == "torch" and method == "exact" else val.compute_dtype(dtype)


def _degeneracy_warnings(u: torch.Tensor, ccr: int, dtype: torch.dtype) -> List[str]:
    """What makes PGA on the unit rows u (float64, the centered, CCR'd tokens) degenerate.

    When its distances are computed in `dtype`: rank ≤ 1 in float64 (every row ± one direction to
    64 ulp: what CCR leaves of an exactly rank-1 residual; z is then undefined), rank ≤ 1 to the
    resolution of float32 distances (computed, with a warning), and duplicated rows.
    """
    out = []
    parallel = 1.0 - (u @ u[0]).abs().min()  # 0 when every row is ± the first
    if parallel <= 64 * torch.finfo(torch.float64).eps:
        out.append(f"rank-1 residual: after centering and CCR-{ccr} every token lies on one line, so every "
                   "cosine distance is 0 or 2 and rounding alone orders them; z and the ρ's are undefined (NaN). "
                   "Use a smaller ccr or more tokens.")
        return out
    if dtype != torch.float64 and parallel <= 64 * torch.finfo(dtype).eps:
        out.append(f"nearly rank-1 residual: after centering and CCR-{ccr} every token lies within "
                   f"{float(parallel):.1e} (in 1 − |cos|) of one line, below what {str(dtype)[6:]} distances "
                   "resolve; pass float64 H (or backend='torch') for a z that rounding does not decide.")
    # Duplicates: equal rows have equal keys u·r; rows next to each other in key order are then
    # compared exactly (O(N·d) and N keys, no sort of the rows themselves).
    r = torch.randn(u.shape[1], dtype=u.dtype, generator=torch.Generator().manual_seed(0)).to(u.device)
    keys, order = torch.sort(u @ r)
    same = torch.nonzero(keys[1:] == keys[:-1]).flatten()
    n_dup = int((u[order[same]] == u[order[same + 1]]).all(dim=1).sum()) if same.numel() else 0
    if n_dup:
        out.append(f"duplicated tokens: {n_dup} of {u.shape[0]} tokens repeat another token's hidden state; their "
                   "pairs tie at distance 0 in every subspace (average ranks).")
    return out


def _check_inputs(H, W_U, basis, k, n_null, ccr, seed, layout, method, backend, precision, batch) -> _Inputs:
    """Every argument of subspace_pga checked; H preprocessed, the readout and null bases found."""
    H = val.as_matrix(H, "H")  # NaN/Inf: center_and_ccr checks
    N, d = H.shape
    s = check_settings(N, d, H.device, n_null, ccr, seed, method, backend, precision, batch)
    H = val.finite_matrix(H, "H")  # before the readout's O(V·d²) work
    readout, readout_solver, readout_note = readout_subspace(W_U, basis, k, layout, d)
    x, _, _ = center_and_ccr_unscaled(H, s.ccr)  # x = residual / 2^e: never overflows, whatever H's scale
    norms = val.row_norms(x, "H")
    zero = norms == 0
    if bool(zero.any()):
        raise ValueError(f"H has {int(zero.sum())} zero-norm rows after centering and CCR-{s.ccr} (an all-constant "
                         "layer, or tokens equal to the mean); their cosine distance is undefined")
    # Cosine distances, in the full space and in every subspace, do not change when a row is
    # scaled: the kernels get the unit rows (divided in float64), so no H scale overflows or
    # underflows the float32 compute dtype.
    u = val.unit_rows(x, torch.float64, norms)
    nulls = grassmann_bases(d, int(readout.shape[1]), s.n_null, s.seed, device=x.device)
    return _Inputs(H, u, readout, nulls, s.ccr, s.seed, s.method, s.backend, s.precision, s.batch,
                   ((readout_note,) if readout_note else ())
                   + tuple(_degeneracy_warnings(u, s.ccr, _compute_dtype(s.backend, s.method, H.dtype))),
                   readout_solver)


# ------------------------------------------------------------------------- public function


@eager_only
def subspace_pga(
    H,
    W_U=None,
    *,
    basis: Optional[torch.Tensor] = None,
    k: int = 100,
    n_null: int = 100,
    ccr: int = 1,
    seed: int = 0,
    layout: str = "hf",
    method: str = "exact",
    batch: Optional[int] = None,
    backend: str = "auto",
    precision: str = "highest",
    progress: Optional[bool] = None,
    group=None,
) -> PGAResult:
    r"""The Subspace-PGA z-score of one layer's hidden states H (N×d) against W_U's readout subspace.

    H is centered and its top ccr principal components removed (CCR); V_k holds the top-k right
    singular vectors of W_U. d_full are the cosine distances 1 − cos of all N(N−1)/2 token pairs,
    d_S the same after projecting onto a subspace S. $\rho_\text{readout}$ = Spearman($d_\text{full}$,
    $d_{V_k}$) (average ranks for ties), $\rho_b$ likewise for n_null random subspaces drawn
    uniformly from the Grassmannian, and
    $z = (\rho_\text{readout} - \operatorname{mean}_b \rho_b) / \operatorname{std}_b \rho_b$
    (sample std, ddof = 1). A degenerate
    input (see ``PGAResult``) gives a ``DegenerateInputWarning``.

    Args:
        H (torch.Tensor or numpy.ndarray): (N, d) hidden states of one layer, N ≥ 3 tokens, any
            float dtype (tensor or numpy).
        W_U (torch.Tensor or numpy.ndarray, optional): the unembedding (layout "hf": V×d, "tl":
            d×V); pass exactly one of W_U and `basis`.
        basis: a (d, k) readout basis with orthonormal columns, instead of W_U (default None).
        k: the readout dimension, 1 ≤ k < d, when W_U is given (default 100).
        n_null: the number of random subspaces, ≥ 2 (default 100), drawn with
            ``grassmann_bases(d, k, n_null, seed)``.
        ccr: principal components removed after centering, 0 ≤ ccr < min(N, d) (default 1).
        seed: the seed of the random subspaces, an int in [0, 2^63 − 1] (default 0).
        layout: W_U's layout, "hf" (default, V×d) or "tl" (d×V).
        method: "exact" (default: average ranks over all pairs, sorted) or "stream" (ranks from
            histogram CDFs of ``STREAM_BINS`` bins over [0, 2], distances recomputed tile by tile:
            O(bins) memory per subspace instead of O(pairs); runs on torch ops).
        batch: subspaces per kernel call, ≥ 1 (default None: the most that fit half of the memory
            available now, by ``pga_batch_bytes``).
        backend: "auto" (default: cpu for CPU tensors; cuda, else triton, for CUDA tensors),
            "cpu", "cuda", "triton" or "torch" (the float64 reference).
        precision: "highest" (default: float32 projections and distances in IEEE float32) or
            "tf32" (GPU tensor cores for the float32 projections; this can reorder near-tied
            distances and move ρ). The kernels compute in float32 for 16/32-bit H and float64
            for float64 H.
        progress: a progress bar over the subspaces (default None: on for large inputs).
        group (torch.distributed.ProcessGroup, optional): a process group. When
            one is given, or the default group is initialized with more than one rank (torchrun),
            the subspaces are split across the ranks; every rank must pass the same H, W_U and
            settings (checked) and returns the single-process result, bitwise.

    Returns:
        PGAResult: z, rho_readout, null_rhos, null_mean, null_std, n_pairs, the settings and the
        warnings.

    Raises:
        ValueError: H not 2-D or with N < 3; NaN/Inf values; both or neither of W_U and basis;
            W_U of the wrong shape for its layout, or all zero; a basis that is not d×k with
            orthonormal columns; k, n_null, ccr, seed or batch out of range; an unknown method,
            layout, backend or precision; method="stream" with a kernel backend; N above a
            kernel's token limit (``info()["limits"]["pga_tokens"]``); the torch reference's N×N
            working set beyond half the available memory; zero rows after centering and CCR, or
            after projecting onto a subspace; with a group, an input that is invalid or differs
            on some rank.
        TypeError: H, W_U or basis not a float tensor or array, or an integer argument of
            another type (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.
        repcap_fast.distributed.RankFailure: with a group, the computation failed on some rank.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> H, W_U = torch.randn(40, 16, generator=g), torch.randn(100, 16, generator=g)
        >>> result = rf.subspace_pga(H, W_U, k=4, n_null=20)
        >>> round(result.z, 2), round(result.rho_readout, 3), round(result.null_std, 3)
        (0.34, 0.477, 0.052)
    """
    group = distributed.resolve_group(group)
    inputs = distributed.prepare_on_every_rank("subspace_pga", group, _check_inputs, H, W_U, basis, k, n_null, ccr,
                                               seed, layout, method, backend, precision, batch)
    notes = list(inputs.warnings)
    rank_one = any(n.startswith("rank-1 residual") for n in notes)
    if rank_one:
        rhos = [float("nan")] * (1 + inputs.nulls.shape[0])  # nothing to compute: every ρ is rounding
    else:
        rhos = _subspace_pga(inputs, progress, group)
    rho_readout, null = rhos[0], np.asarray(rhos[1:], dtype=np.float64)
    null_mean, null_std = float(null.mean()), float(null.std(ddof=1))
    z = (rho_readout - null_mean) / null_std if null_std > 0 else float("nan")
    undefined = [_subspace_name(b) for b, r in enumerate(rhos) if math.isnan(r)]
    if undefined and not rank_one:
        notes.append(f"undefined ρ (every distance equal) on {len(undefined)} subspaces: {', '.join(undefined[:3])}"
                     + (", ..." if len(undefined) > 3 else ""))
    if null_std == 0:
        notes.append("σ_null = 0: every null ρ is the same, so z is undefined (NaN)")
    for note in notes:  # stacklevel 3: the caller's line, past eager_only's wrapper frame
        warnings.warn(f"subspace_pga: {note}", DegenerateInputWarning, stacklevel=3)
    N, d = inputs.H.shape
    return PGAResult(
        z=float(z), rho_readout=float(rho_readout), null_rhos=null.tolist(), null_mean=null_mean,
        null_std=null_std, n_pairs=N * (N - 1) // 2, n_tokens=N, d=d, k=int(inputs.readout.shape[1]),
        n_null=int(inputs.nulls.shape[0]), ccr=inputs.ccr, seed=inputs.seed, method=method, backend=inputs.backend,
        settings={"layout": layout, "readout": "basis" if basis is not None else "W_U",
                  "readout_solver": inputs.readout_solver, "precision": precision,
                  "ranks": "average (ties)" if method == "exact" else
                  f"histogram CDF: {STREAM_BINS} bins over [0, 2], a bin's pairs share its average rank",
                  "distances": "cosine, float64" if (inputs.backend == "torch" and method == "exact")
                  or inputs.H.dtype == torch.float64 else "cosine, float32 (projection and dot products)"},
        warnings=notes,
    )


# -------------------------------------------------------------------------------- dispatch


def _subspace_name(b: int) -> str:
    """The name of subspace b in errors and warnings."""
    return "the readout subspace" if b == 0 else f"null subspace {b - 1}"


def _subspace_pga(inputs: _Inputs, progress: Optional[bool], group) -> List[float]:
    """ρ of the readout (first) and every null subspace.

    With a group, each rank runs a contiguous share of the subspaces and the ρ's are summed back
    into place (exact: each is nonzero on one rank).
    """
    x = inputs.x
    bases = torch.cat([inputs.readout.to(x.device)[None], inputs.nulls])
    n_bases = bases.shape[0]
    N = x.shape[0]
    rank, world = (0, 1) if group is None else distributed.rank_and_world(group)
    mine = distributed.contiguous_share(n_bases, rank, world)
    dtype = _compute_dtype(inputs.backend, inputs.method, inputs.H.dtype)
    xk = x.to(dtype).contiguous()

    def run() -> List[float]:
        """ρ of this rank's share of the subspaces."""
        share = bases[mine.start : mine.stop]
        with progress_bar(progress if rank == 0 else False, total=len(share), desc="subspace PGA", unit="subspace",
                          work=N * (N - 1) // 2 * n_bases, auto_above=_PROGRESS_WORK) as bar:
            if len(share) == 0:
                return []
            name_of = lambda b: _subspace_name(mine.start + b)  # noqa: E731
            if inputs.method == "stream":
                size = _STREAM_BATCH if inputs.batch is None else inputs.batch
                rhos = _subspace_rhos_stream(xk, share, size, inputs.precision, bar, name_of)
            else:
                size = _batch_size(inputs.batch, inputs.backend, N, share.shape[-1], n_bases, dtype, x.device)
                rhos = launcher("subspace_pga", inputs.backend)(xk, share, size, inputs.precision, bar, name_of)
        for b, r in enumerate(rhos):
            if math.isnan(r):  # a zero projected row, or all distances equal (ρ undefined: NaN)
                norms = torch.linalg.vector_norm(xk @ share[b].to(dtype), dim=1)
                if bool((norms == 0).any()):
                    raise ValueError(f"H projected on {name_of(b)} has zero-norm rows; cosine distance is undefined")
        return rhos

    if group is None:
        return run()
    share = torch.zeros(n_bases, dtype=torch.float64)
    share[mine.start : mine.stop] = torch.tensor(distributed.run_on_every_rank("subspace_pga", run, group),
                                                 dtype=torch.float64)
    return distributed.sum_across_ranks([share], group)[0].tolist()


def _memory_budget(device: torch.device) -> int:
    """Half of the memory available now.

    GPU: free device memory plus what torch's caching allocator holds unused. Host: MemAvailable
    (page cache counts as available), capped by a cgroup memory limit when there is one.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return (free + cached) // 2
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 8 << 30
    try:  # cgroup v2: limit − usage
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                available = min(available, int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        pass
    return max(available, 0) // 2


def pga_batch_bytes(backend: str, n_tokens: int, k: int, batch: int, dtype=torch.float32) -> int:
    """The peak extra bytes of one Subspace-PGA kernel call over `batch` subspaces.

    The model that ``subspace_pga``'s default batch follows (the most subspaces whose call fits
    half the available memory): per token pair, bytes per subspace in flight (on cpu at most one
    per thread) plus what the call holds once, and the projected rows.

    Args:
        backend: "cpu", "cuda" or "triton".
        n_tokens: the number of tokens N (N(N−1)/2 pairs).
        k: the subspaces' dimension.
        batch: the subspaces per call.
        dtype (torch.dtype): the compute dtype (default torch.float32; torch.float64 for float64 H).

    Returns:
        int: the bytes.

    Raises:
        KeyError: a backend other than "cpu", "cuda" or "triton" (the torch reference has no
            batch).

    Examples:
        >>> rf.pga.pga_batch_bytes("cuda", 1024, 100, 16)
        84137984
    """
    n = n_tokens * (n_tokens - 1) // 2
    (per, once), (per_wide, once_wide) = _PAIR_BYTES[backend]
    wide = dtype == torch.float64
    elem = 8 if wide else 4
    in_flight = min(batch, torch.get_num_threads()) if backend == "cpu" else batch
    rows = n_tokens * (k + 1 + (256 if backend == "cpu" else 0))  # projection, norms, a Gram tile
    return in_flight * (n * (per + wide * per_wide) + rows * elem) + n * (once + wide * once_wide)


def _batch_size(batch, name: str, n_tokens: int, k: int, n_bases: int, dtype, device) -> int:
    """Subspaces per kernel call: `batch` (validated), or the most that fit half of the available memory."""
    if batch is not None:
        return batch
    if name == "torch":
        return 1
    budget = _memory_budget(device)
    fit = 1
    while fit < n_bases and pga_batch_bytes(name, n_tokens, k, fit * 2, dtype) <= budget:
        fit *= 2
    while fit > 1 and pga_batch_bytes(name, n_tokens, k, fit, dtype) > budget:
        fit //= 2
    n_pairs = n_tokens * (n_tokens - 1) // 2
    cap = max(16, _CPU_PAIRS_PER_CALL // max(n_pairs, 1)) if name == "cpu" else 64  # cpu: progress granularity
    return max(1, min(fit, n_bases, cap))


# ------------------------------------------------------------------------------- launchers


def _rhos_in_batches(ranks_fn: Callable, rhos_fn: Callable, x, bases, batch: int, bar) -> List[float]:
    """The fused kernels' loop: the reference ranks of x once, then ρ per call of `batch` bases."""
    ref = ranks_fn(x)
    rhos: List[float] = []
    for b0 in range(0, bases.shape[0], batch):
        chunk = bases[b0 : b0 + batch].to(x.dtype).contiguous()
        rhos.extend(rhos_fn(x, chunk, ref).tolist())
        bar.update(chunk.shape[0])
    return rhos


@register_kernel("subspace_pga", "cpu", "cuda")
def _subspace_pga_compiled(x, bases, batch, precision, bar, name_of):
    """The C++ ops (csrc/subspace_pga_ops.cpp); on CUDA the projections are cuBLAS GEMMs at `precision`."""
    with cublas_precision(precision, x.device):
        return _rhos_in_batches(torch.ops.repcap_fast.subspace_pga_ranks, torch.ops.repcap_fast.subspace_pga_rhos,
                                x, bases, batch, bar)


@register_kernel("subspace_pga", "triton")
def _subspace_pga_triton(x, bases, batch, precision, bar, name_of):
    """The Triton kernels, through their custom ops."""
    return _rhos_in_batches(lambda u: torch.ops.repcap_fast.subspace_pga_ranks_triton(u, precision),
                            lambda u, b, ref: torch.ops.repcap_fast.subspace_pga_rhos_triton(u, b, ref, precision),
                            x, bases, batch, bar)


@custom_op("repcap_fast::subspace_pga_ranks_triton", mutates_args=())
def _subspace_pga_ranks_triton(x: torch.Tensor, precision: str) -> torch.Tensor:
    """The Triton kernels as a custom op.

    The contract of torch.ops.repcap_fast.subspace_pga_ranks (csrc/module.cpp), with the
    precision of the distances by name.
    """
    return triton_kernels().subspace_pga_ranks_triton(x, precision)


_subspace_pga_ranks_triton.register_fake(subspace_pga_ranks_fake)


@custom_op("repcap_fast::subspace_pga_rhos_triton", mutates_args=())
def _subspace_pga_rhos_triton(x: torch.Tensor, bases: torch.Tensor, ref_ranks: torch.Tensor,
                              precision: str) -> torch.Tensor:
    """The Triton kernels as a custom op.

    The contract of torch.ops.repcap_fast.subspace_pga_rhos, with the precision by name; the ρ's
    come back on the CPU.
    """
    return triton_kernels().subspace_pga_rhos_triton(x, bases, ref_ranks, precision)


@_subspace_pga_rhos_triton.register_fake
def _(x, bases, ref_ranks, precision):
    """A float64 CPU tensor of one ρ per basis."""
    return torch.empty(bases.shape[0], dtype=torch.float64, device="cpu")


@register_kernel("subspace_pga", "torch")
def _subspace_pga_torch(x, bases, batch, precision, bar, name_of):
    """The reference's per-subspace loop (float64 x: batch and precision do not apply)."""
    return subspace_rhos_reference(x, bases.to(x.dtype), bar, name_of)
