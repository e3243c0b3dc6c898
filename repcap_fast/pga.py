"""Subspace PGA (Xu 2026, DESIGN.md §1.4): does a layer's pairwise-distance structure survive
projection onto the unembedding's readout subspace better than onto random subspaces?

For hidden states H (N×d) of one layer:
  1. center H and remove its top m principal components (CCR-m, default m = 1);
  2. V_k = top-k right singular vectors of W_U (default k = 100), through the d×d Gram in float64;
  3. d_full = cosine distances 1 − cos of all pairs i<j (SciPy's condensed ``pdist`` order), and
     d_S the same after projecting onto a subspace S;
  4. ρ_readout = Spearman(d_full, d_{V_k}) with average ranks for ties (as scipy.stats.spearmanr);
  5. ρ_b likewise for n_null subspaces drawn uniformly from the Grassmannian (seeded);
  6. z = (ρ_readout − mean ρ_b) / std ρ_b (sample std, ddof = 1).

This module holds the public API and the plain float64 reference (backend "torch"): a
per-subspace loop with exact average ranks. It materializes the N(N−1)/2 distances of one
subspace at a time (O(N²) memory for one subspace, never for all of them).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import _validation as val

LAYOUTS = ("hf", "tl")
METHODS = ("exact", "stream")
STREAM_BINS = 1 << 21  # histogram bins over [0, 2] of method="stream": width 9.5e-7
_STREAM_TILE_ELEMS = 1 << 18  # distances per subspace formed at once by method="stream"
_STREAM_BATCH = 4  # default subspaces per pass of method="stream"
_CHUNK_BYTES = 32 << 20


# ------------------------------------------------------------------------- bases


class ReadoutBasis(NamedTuple):
    """The top-k right singular vectors of W_U (d×k, float64, columns orthonormal) and all of
    W_U's singular values (descending, float64)."""

    basis: torch.Tensor
    singular_values: torch.Tensor


def _as_float_matrix(x, name: str) -> torch.Tensor:
    x = val.as_matrix(x, name)
    val.row_norms(x, name)  # NaN/Inf check with the first bad row
    return x


def readout_basis(W_U, k: int = 100, layout: str = "hf") -> ReadoutBasis:
    """Top-k right singular vectors of the unembedding W_U, through the d×d Gram in float64.

    layout "hf": W_U is V×d (Hugging Face ``lm_head.weight``): the basis spans the row space,
    the right singular vectors, eigenvectors of W_Uᵀ W_U. layout "tl": W_U is d×V (TransformerLens
    ``W_U``): the same subspace is its column space, eigenvectors of W_U W_Uᵀ (its left singular
    vectors). Never runs a dense SVD of V×d; the Gram is accumulated over row chunks in float64.
    Eigenvector signs are fixed so that each basis vector's largest-magnitude entry is positive.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} ('hf': V×d, 'tl': d×V), got {layout!r}")
    W = _as_float_matrix(W_U, "W_U")
    if layout == "tl":
        W = W.T
    V, d = W.shape
    k = _check_k(k, d)
    gram = torch.zeros(d, d, dtype=torch.float64, device=W.device)
    rows = max(1, _CHUNK_BYTES // (8 * d))
    for r0 in range(0, V, rows):
        chunk = W[r0 : r0 + rows].to(torch.float64)
        gram.addmm_(chunk.T, chunk)
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    evals = evals.flip(0).clamp_min(0.0)
    evecs = evecs.flip(1)
    basis = _fix_signs(evecs[:, :k].contiguous())
    return ReadoutBasis(basis, evals.sqrt())


def _fix_signs(q: torch.Tensor) -> torch.Tensor:
    """Columns with their largest-|·| entry made positive (a deterministic orientation)."""
    idx = q.abs().argmax(dim=0)
    signs = torch.sign(q[idx, torch.arange(q.shape[1], device=q.device)])
    signs[signs == 0] = 1.0
    return q * signs


def _subspace_seed(seed: int, b: int) -> int:
    """The generator seed of basis b of a draw with `seed` (SeedSequence mixing: independent
    streams for every (seed, b))."""
    return int(np.random.SeedSequence([int(seed) & (2**63 - 1), int(b)]).generate_state(1, dtype=np.uint64)[0] >> 1)


def grassmann_bases(d: int, k: int, n: int, seed: int = 0, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """n orthonormal d×k bases drawn uniformly from the Grassmannian: QR of a standard Gaussian
    d×k matrix with the signs fixed (R's diagonal made positive, which makes Q Haar-distributed).
    Basis b comes from its own CPU generator seeded by (seed, b) (float32 normals, drawn in
    parallel threads), so a seed gives the same bases on every device and the first m of n
    bases are those of a draw of m. They are orthonormalized in float64 on `device` (batched
    GEMMs; equal across devices to rounding). Returns (n, d, k), float64 by default."""
    for name, v, lo in (("d", d, 2), ("n", n, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    k = _check_k(k, int(d))
    n, d = int(n), int(d)
    g = torch.empty(n, d, k, dtype=torch.float32)  # float32 normals: torch's float64 sampler is ~5x slower

    def draw(b: int) -> None:
        torch.randn(d, k, generator=torch.Generator().manual_seed(_subspace_seed(seed, b)), out=g[b])

    workers = max(1, min(n, torch.get_num_threads()))
    if workers == 1 or n * d * k < 1 << 16:
        for b in range(n):
            draw(b)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as pool:  # torch releases the GIL while sampling
            list(pool.map(draw, range(n)))
    out = _orthonormalize(g.to(device=device, dtype=torch.float64))
    return out.to(dtype=dtype)


def _orthonormalize(g: torch.Tensor) -> torch.Tensor:
    """Q of the QR factorization G = QR with R's diagonal positive, for a batch of d×k matrices.

    CholeskyQR2 (R from the Cholesky factor of GᵀG, applied twice) is the same factorization
    and runs as batched GEMMs; it is used when it is accurate (well-conditioned G, always the
    case for Gaussian G with k ≤ d/2), else Householder QR with the signs fixed."""
    k = g.shape[-1]
    if 2 * k <= g.shape[-2]:
        q = g
        ok = True
        for _ in range(2):
            chol, info = torch.linalg.cholesky_ex(q.transpose(-2, -1) @ q)
            if bool((info != 0).any()):
                ok = False
                break
            eye_k = torch.eye(k, dtype=g.dtype, device=g.device).expand_as(chol)
            chol_inv = torch.linalg.solve_triangular(chol, eye_k, upper=False)  # k×k: cheap
            q = q @ chol_inv.transpose(-2, -1)  # G R⁻¹ with R = Lᵀ, as one batched GEMM
        eye = torch.eye(k, dtype=g.dtype, device=g.device)
        if ok and float((q.transpose(-2, -1) @ q - eye).abs().max()) < 1e-13:
            return q
    q, r = torch.linalg.qr(g)
    s = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    s[s == 0] = 1.0
    return q * s[..., None, :]


def _check_k(k, d: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= int(k) < d:
        raise ValueError(f"k must satisfy 1 <= k < d = {d}, got k={k}")
    return int(k)


def check_orthonormal(basis: torch.Tensor, name: str = "basis", tol: Optional[float] = None) -> torch.Tensor:
    """A d×k basis with orthonormal columns (to `tol`, by default 1e-4 for 16/32-bit and 1e-10
    for float64), or a ValueError naming the largest deviation of BᵀB from I."""
    if not isinstance(basis, torch.Tensor) or basis.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (d×k) tensor with orthonormal columns")
    if tol is None:
        tol = 1e-10 if basis.dtype == torch.float64 else 1e-4
    b = basis.to(torch.float64)
    dev = float((b.T @ b - torch.eye(b.shape[1], dtype=torch.float64, device=b.device)).abs().max())
    if not dev <= tol:
        raise ValueError(f"{name} is not orthonormal: max |BᵀB − I| = {dev:.3g} > {tol:g}")
    return basis


# ------------------------------------------------------------------ preprocessing


class CCRResult(NamedTuple):
    """H centered with its top m principal directions removed (float64), and those directions
    (m×d, rows orthonormal; empty for m = 0)."""

    H: torch.Tensor
    removed: torch.Tensor


def _top_right_singular_vectors(x: torch.Tensor, m: int) -> torch.Tensor:
    """The top-m right singular vectors of x (d×m, float64): eigenvectors of xᵀx (d×d) when
    d ≤ N, which stay orthonormal even past the rank of x; otherwise an SVD of x."""
    n, d = x.shape
    if d <= n:
        _, vecs = torch.linalg.eigh(x.T @ x)
        return vecs[:, -m:].flip(1)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    return vh[:m].T


def center_and_ccr(H, m: int = 1) -> CCRResult:
    """Subtracts the token mean and removes the top m principal components (CCR-m), in float64.

    The directions are the top-m right singular vectors of the centered H (eigenvectors of HᵀH
    when d ≤ N, else an SVD; float64); m = 0 only centers.
    """
    H = _as_float_matrix(H, "H")
    N, d = H.shape
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"ccr must be an int >= 0, got {m!r}")
    if m >= min(N, d):
        raise ValueError(f"ccr must be < min(N, d) = {min(N, d)} (N={N} tokens, d={d}), got {m}")
    x = H.to(torch.float64)
    x = x - x.mean(dim=0, keepdim=True)
    if m == 0:
        return CCRResult(x, x.new_zeros(0, d))
    removed = _fix_signs(_top_right_singular_vectors(x, m)).T.contiguous()
    x = x - (x @ removed.T) @ removed
    return CCRResult(x, removed)


# ----------------------------------------------------------- distances and ranks


def pairwise_cosine_distances(H) -> torch.Tensor:
    """Condensed cosine distances 1 − cos(h_i, h_j) for i<j in float64, in the order of
    ``scipy.spatial.distance.pdist(H, "cosine")``. Materializes N(N−1)/2 values: small N and
    tests. Zero rows are an error (their cosine is undefined)."""
    H = _as_float_matrix(H, "H")
    return _condensed_cosine_distances(H.to(torch.float64), "H")


def _condensed_cosine_distances(x: torch.Tensor, name: str) -> torch.Tensor:
    norms = torch.linalg.vector_norm(x, dim=1)
    zero = norms == 0
    if bool(zero.any()):
        idx = torch.nonzero(zero).flatten()[:10].tolist()
        raise ValueError(f"{name} has {int(zero.sum())} zero-norm rows (rows {idx}); cosine distance is undefined")
    u = x / norms[:, None]
    n = u.shape[0]
    iu = torch.triu_indices(n, n, 1, device=u.device)
    # clamped to [0, 2] as scipy's pdist does (duplicate tokens give exactly 0, not −2e-16)
    return (1.0 - (u @ u.T)[iu[0], iu[1]]).clamp_(0.0, 2.0).contiguous()


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor with ties given their average rank (scipy's rankdata,
    method="average"), float64."""
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


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else float("nan")


def spearman(x, y) -> float:
    """Spearman's ρ with average ranks for ties: the Pearson correlation of the ranks, in
    float64. Matches ``scipy.stats.spearmanr(x, y).statistic``. If x or y is constant, ρ is
    undefined: NaN, with scipy's ``ConstantInputWarning``, as scipy does. NaN in the input is an
    error (scipy would propagate it)."""
    x = _as_vector(x, "x")
    y = _as_vector(y, "y")
    if x.numel() != y.numel():
        raise ValueError(f"x and y must have the same length, got {x.numel()} and {y.numel()}")
    if x.numel() < 2:
        raise ValueError(f"spearman needs at least 2 values, got {x.numel()}")
    if bool((x == x[0]).all()) or bool((y == y[0]).all()):
        from scipy.stats import ConstantInputWarning

        warnings.warn("An input array is constant; the correlation coefficient is not defined.",
                      ConstantInputWarning, stacklevel=2)
        return float("nan")
    return _pearson(average_ranks(x), average_ranks(y.to(x.device)))


def _as_vector(x, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    elif not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    x = x.detach().reshape(-1).to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN/Inf")
    return x


# ----------------------------------------------------------------- subspace PGA


@dataclass
class PGAResult:
    """ρ_readout, the null ρ's and z = (ρ_readout − mean)/std (ddof = 1)."""

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

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in ("z", "rho_readout", "null_mean", "null_std"):
            if not math.isfinite(out[key]):
                out[key] = None
        return out


def _readout_from(W_U, basis, k: int, layout: str, d: int) -> torch.Tensor:
    if (W_U is None) == (basis is None):
        raise ValueError("pass exactly one of W_U (the unembedding) and basis (a d×k readout basis)")
    if basis is not None:
        if not isinstance(basis, torch.Tensor) or basis.dim() != 2:
            raise ValueError("basis must be a 2-D (d×k) tensor")
        if basis.shape[0] != d:
            raise ValueError(f"basis has d={basis.shape[0]} rows but H has d={d}")
        _check_k(int(basis.shape[1]), d)
        if not bool(torch.isfinite(basis).all()):
            raise ValueError("basis contains NaN/Inf")
        return check_orthonormal(basis).to(torch.float64)
    W = W_U.detach() if isinstance(W_U, torch.Tensor) else W_U
    shape = tuple(W.shape)
    wd = shape[1] if layout == "hf" else shape[0]
    if len(shape) != 2 or wd != d:
        expect = "V×d" if layout == "hf" else "d×V"
        raise ValueError(f"W_U must be {expect} (layout={layout!r}) with d={d} matching H, got shape {shape}")
    return readout_basis(W, k, layout).basis


def _check_common(H, k, n_null, method):
    H = _as_float_matrix(H, "H")
    N, d = H.shape
    if N < 3:
        raise ValueError(f"H needs N >= 3 tokens (rows), got N={N}")
    if isinstance(n_null, bool) or not isinstance(n_null, (int, np.integer)) or n_null < 2:
        raise ValueError(f"n_null must be an int >= 2 (the null std needs two), got {n_null!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return H, N, d


def _subspace_rhos_torch(x: torch.Tensor, d_full_ranks: torch.Tensor, bases: torch.Tensor, progress=None,
                         first: int = 0) -> List[float]:
    """Spearman(d_full, d_S) for each basis S (b, d, k; bases[0] the readout): the per-subspace
    loop of the reference."""
    rhos = []
    for b in range(bases.shape[0]):
        proj = x @ bases[b]
        dist = _condensed_cosine_distances(proj, f"H projected on {_subspace_name(first + b)}")
        ranks = average_ranks(dist)
        rhos.append(_pearson(d_full_ranks, ranks))
        if progress is not None:
            progress.update(1)
    return rhos


# Bytes per pair of one kernel call: (per subspace in flight, held once per call) for float32
# keys, and the extra of float64 keys. cpu: each thread sorts keys and 32-bit payloads with
# scratch twins; once: the float64 reference ranks and twice them as uint32. cuda: keys and
# payloads of every subspace of the batch; once: reference ranks, twice them, and the shared
# sort scratch. triton: see triton_kernels/subspace_pga.py.
_PAIR_BYTES = {"cpu": ((16, 12), (8, 0)), "cuda": ((8, 20), (4, 4)), "triton": ((8, 52), (0, 0))}


def _memory_budget(device: torch.device) -> int:
    """Half of the memory available now. GPU: free device memory plus what torch's caching
    allocator holds unused. Host: MemAvailable (page cache counts as available), capped by a
    cgroup memory limit when there is one."""
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
    """Peak extra bytes of one kernel call over `batch` subspaces (the model the auto batch
    size uses): per pair, per subspace in flight, plus what the call holds once."""
    n = n_tokens * (n_tokens - 1) // 2
    (per, once), (per_wide, once_wide) = _PAIR_BYTES[backend]
    wide = dtype == torch.float64
    elem = 8 if wide else 4
    in_flight = min(batch, torch.get_num_threads()) if backend == "cpu" else batch
    rows = n_tokens * (k + 1 + (256 if backend == "cpu" else 0))  # projection, norms, a Gram tile
    return in_flight * (n * (per + wide * per_wide) + rows * elem) + n * (once + wide * once_wide)


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """‖x_i‖ summed in float64 and rounded to x's dtype (as the C++ kernel does): float32 rows of
    1e-25 keep a nonzero norm."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float64).to(x.dtype)


def _stream_bins(u: torch.Tensor, bins: int, rows: int):
    """Histogram bins of the cosine distances of the unit rows u (…, N, k), pairs i<j, formed
    `rows` rows at a time: yields (…, pairs of the block) int64 bins, in condensed order."""
    N = u.shape[-2]
    for r0 in range(0, N - 1, rows):
        r1 = min(N - 1, r0 + rows)
        dots = u[..., r0:r1, :] @ u[..., r0:, :].transpose(-2, -1)  # (…, r1-r0, N-r0)
        keep = torch.ones(r1 - r0, N - r0, dtype=torch.bool, device=u.device).triu_(1)
        dist = (1.0 - dots[..., keep]).clamp_(0.0, 2.0)
        yield (dist * (bins / 2.0)).to(torch.int64).clamp_(0, bins - 1)


def _midranks(hist: torch.Tensor, mean: float):
    """(R − m per bin, Σ count·(R − m)²) per row of hist (…, bins): R = count below +
    (count + 1)/2, the average rank of a bin's pairs were they tied, in float64. One row's
    temporaries at a time: 8 B per bin per row kept, plus 16 B per bin of one row."""
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


def _subspace_rhos_stream(x: torch.Tensor, bases: torch.Tensor, batch: int, bins: int = STREAM_BINS,
                          tile_elems: int = _STREAM_TILE_ELEMS, progress=None) -> List[float]:
    """ρ per basis with ranks from histogram CDFs (method="stream"): every distance falls in one
    of `bins` bins of [0, 2], and the pairs of a bin share the bin's average rank. Two passes
    over the pairs, recomputing distances tile by tile: the histograms, then Σ (R_F − m)(R_S − m).
    Memory: 12 B per bin per subspace of a batch and of the full space (counts, midranks), one
    tile of distances, never a subspace's pairs."""
    N = x.shape[0]
    n = N * (N - 1) // 2
    mean = 0.5 * (n + 1)
    full = x / _row_norms(x)
    # One row blocking for every pass and batch size, so the dot products (and the result) do not
    # depend on the batch.
    rows = max(1, min(N - 1, tile_elems // N))
    count_dtype = torch.int32 if n < 2**31 else torch.int64  # a bin may hold every pair

    def histogram(u):  # (…, bins) pair counts
        lead = int(np.prod(u.shape[:-2])) if u.dim() > 2 else 1
        hist = torch.zeros(lead, bins, dtype=count_dtype, device=u.device)
        for b in _stream_bins(u, bins, rows):
            b = b.reshape(lead, -1)
            hist.scatter_add_(1, b, torch.ones_like(b, dtype=count_dtype))  # in place
        return hist.reshape(*u.shape[:-2], bins)

    full_centered, full_sum_sq = _midranks(histogram(full), mean)
    rhos: List[float] = []
    for b0 in range(0, bases.shape[0], batch):
        proj = torch.matmul(x, bases[b0 : b0 + batch].to(x.dtype))  # (B, N, k)
        norms = _row_norms(proj)
        zero = (norms == 0).flatten(1).any(dim=1).tolist()
        if any(zero):
            raise ValueError(f"H projected on {_subspace_name(b0 + zero.index(True))} has zero-norm rows; "
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
        if progress is not None:
            progress.update(u.shape[0])
    return rhos


def _warn_tf32(x: torch.Tensor) -> None:
    if x.dtype == torch.float32 and x.is_cuda and torch.get_float32_matmul_precision() != "highest":
        warnings.warn("torch.get_float32_matmul_precision() is not 'highest': the projections and "
                      "distances may use TF32 (10-bit mantissa), which reorders near-tied distances "
                      "and moves ρ; set it to 'highest' for exact float32 ranks", RuntimeWarning,
                      stacklevel=3)


def _batch_size(batch, name: str, n_tokens: int, k: int, n_bases: int, dtype, device) -> int:
    """Subspaces per kernel call: `batch`, or the most that fit half of the available memory."""
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"batch must be an int >= 1 (subspaces per kernel call), got {batch!r}")
        return int(batch)
    budget = _memory_budget(device)
    fit = 1
    while fit < n_bases and pga_batch_bytes(name, n_tokens, k, fit * 2, dtype) <= budget:
        fit *= 2
    while fit > 1 and pga_batch_bytes(name, n_tokens, k, fit, dtype) > budget:
        fit //= 2
    return max(1, min(fit, n_bases, 16 if name == "cpu" else 64))  # cpu: progress granularity


def _subspace_name(b: int) -> str:
    return "the readout subspace" if b == 0 else f"null subspace {b - 1}"


def _kernel_ops(name: str):
    """(ranks, rhos) functions of a kernel backend, with the ops' contract."""
    if name in ("cpu", "cuda"):
        return torch.ops.repcap_fast.subspace_pga_ranks, torch.ops.repcap_fast.subspace_pga_rhos
    from .triton_kernels import subspace_pga_ranks_triton, subspace_pga_rhos_triton

    return subspace_pga_ranks_triton, subspace_pga_rhos_triton


def _subspace_rhos_kernel(name, x, bases, batch, progress=None, first: int = 0):
    """ρ per basis (bases[0] the readout) from a kernel backend, `batch` subspaces per call."""
    ranks_fn, rhos_fn = _kernel_ops(name)
    ref = ranks_fn(x)
    rhos = []
    for b0 in range(0, bases.shape[0], batch):
        chunk = bases[b0 : b0 + batch].to(x.dtype).contiguous()
        rhos.extend(rhos_fn(x, chunk, ref).tolist())
        if progress is not None:
            progress.update(chunk.shape[0])
    for b, r in enumerate(rhos):
        if math.isnan(r):  # a zero projected row, or all distances equal (ρ undefined: NaN)
            norms = torch.linalg.vector_norm(x @ bases[b].to(x.dtype), dim=1)
            if bool((norms == 0).any()):
                raise ValueError(f"H projected on {_subspace_name(first + b)} has zero-norm rows; cosine distance is "
                                 f"undefined")
    return rhos


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
    progress: Optional[bool] = None,
    group=None,
    _nulls: Optional[torch.Tensor] = None,
) -> PGAResult:
    """Subspace PGA z-score of one layer's hidden states H (N×d) against W_U's readout subspace.

    Args:
        H: (N, d) hidden states of one layer, N ≥ 3 tokens, any float dtype.
        W_U: the unembedding (layout "hf": V×d, "tl": d×V); or pass `basis` (d×k, orthonormal
            columns) instead.
        k: readout dimension (1 ≤ k < d), when W_U is given.
        n_null: number of random subspaces (≥ 2), drawn with `grassmann_bases(d, k, n_null, seed)`.
        ccr: principal components removed after centering (0 ≤ ccr < min(N, d)).
        method: "exact" (average ranks over all N(N−1)/2 pairs, sorted), or "stream": ranks from
            histogram CDFs (STREAM_BINS = 2^21 bins over [0, 2]; the pairs of a bin share its
            average rank), with distances recomputed tile by tile in two passes, so memory is
            about 12 B per bin per subspace of a batch (24 MiB; default batch 4) and a tile,
            instead of O(pairs). Runs on torch ops on H's device (backend "auto" or "torch").
            Measured |Δρ| against exact: 7.5e-5 at N = 20 (where the float32 kernel itself is
            1.5e-4 off float64), 3e-6 at N = 50, 1e-7 at N = 300, 3e-9 at N = 2048: two pairs in
            one bin tie, and the fewer the pairs, the more one tie moves ρ. Tested at N = 20..300
            (2e-5, or twice the float32 kernel's own error) and at N = 2048 (1e-6).
        batch: subspaces per call of the fused kernel. Default: the most that fit half of the
            memory available now (GPU memory for CUDA tensors, else host memory), at most 16 on the
            cpu backend and 64 on the GPU; progress is reported per call. `pga_batch_bytes`
            gives the model: per pair, each subspace in flight holds 16 B on cpu (24 B for
            float64 H; in flight: min(batch, threads)), 8 B on cuda (12 B) and 8 B on triton;
            a call also holds 12-52 B per pair once (reference ranks, sort scratch).
            Never all subspaces' distances at once beyond that budget.
        backend: "auto" picks "cpu" for CPU tensors and "cuda" (else "triton") for CUDA tensors.
            "cpu": the fused C++ kernel (projection, distance keys, radix sort, tie-aware ranks
            and their correlation), multi-threaded over subspaces, at most 65,536 tokens.
            "cuda": the projections by cuBLAS (one GEMM per subspace), then a kernel that normalizes the rows
            and writes every pair's sortable distance key with its reference rank, a CUB radix
            sort per subspace, and one fused pass from sorted keys to tie-averaged ranks and ρ.
            "triton": a Triton kernel writes a batch of subspaces' distance keys (float32: the
            distance bits and twice the reference rank packed in one int64), torch.sort orders
            them, and one fused Triton kernel turns sorted keys into tie-averaged ranks and
            reduces ρ in float64 (GPU tensors, or CPU under TRITON_INTERPRET=1).
            "torch": the float64 reference, a per-subspace loop.
            The kernels form distances in float32 (float64 for float64 H) after centering and
            CCR in float64. The rank pass is shared host/device code
            (csrc/subspace_pga_epilogue.h).
        progress: a bar over the subspaces (default: on when N(N−1)/2·(n_null+1) ≥ 2e8).
        group: a torch.distributed process group. When one is given, or the default group is
            initialized with more than one rank (torchrun), the readout and null subspaces are split
            across the ranks in contiguous blocks, which must all pass the same H, W_U and settings
            (checked); every rank returns the single-process result (the same ρ's, bitwise).

    Returns a PGAResult (z, rho_readout, null_rhos, null_mean, null_std with ddof = 1, n_pairs).
    """
    from .distributed import prepare_on_every_rank, resolve_group, tensor_digest

    group = resolve_group(group)

    def prepare():
        H_, N_, d_ = _check_common(H, k, n_null, method)
        from ._backends import resolve_backend

        if method == "stream":
            if backend not in ("auto", "torch", None):
                raise ValueError(f"method='stream' runs on torch ops on H's device; backend must be 'auto' or "
                                 f"'torch', got {backend!r}")
            name_ = "torch"
        else:
            name_ = resolve_backend(backend, H_.device, "subspace_pga")
        readout_ = _readout_from(W_U, basis, k, layout, d_)
        k_ = int(readout_.shape[1])
        x_, _ = center_and_ccr(H_, ccr)
        norms = torch.linalg.vector_norm(x_, dim=1)
        if bool((norms == 0).any()):
            n_zero = int((norms == 0).sum())
            raise ValueError(
                f"H has {n_zero} zero-norm rows after centering and CCR-{ccr} (an all-constant layer, "
                "or tokens equal to the mean); their cosine distance is undefined"
            )
        if _nulls is None:
            nulls_ = grassmann_bases(d_, k_, n_null, seed, device=x_.device)
        else:  # pga_profile's, drawn once with the same (d, k, n_null, seed)
            nulls_ = _nulls.to(x_.device)
        return H_, N_, d_, name_, readout_, k_, x_, nulls_

    H, N, d, name, readout, k, x, nulls = prepare_on_every_rank(
        "subspace_pga", prepare,
        lambda prep: {"H": tensor_digest(prep[0]), "readout": tensor_digest(prep[4]), "nulls": tensor_digest(prep[7]),
                      "k": prep[5], "n_null": int(n_null), "ccr": int(ccr), "seed": int(seed), "method": method,
                      "backend": prep[3]}, group)
    n_pairs = N * (N - 1) // 2
    from .distributed import contiguous_share, rank_and_world

    all_bases = torch.cat([readout.to(x.device)[None], nulls])
    mine = range(n_null + 1)
    if group is not None:
        rank, world = rank_and_world(group)
        mine = contiguous_share(n_null + 1, rank, world)
    show = progress if progress is not None else n_pairs * (n_null + 1) >= 2e8
    show = show and (group is None or rank_and_world(group)[0] == 0)
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(mine), desc="subspace PGA", unit=" subspace", leave=False)

    def rhos_of(bases, first=0):  # bases[0] is subspace `first` (0: the readout)
        if len(bases) == 0:
            return []
        if method == "stream":
            xk = x.to(val.compute_dtype(H.dtype)).contiguous()
            size = _STREAM_BATCH if batch is None else _batch_size(batch, name, N, k, n_null + 1, xk.dtype, xk.device)
            _warn_tf32(xk)
            return _subspace_rhos_stream(xk, bases, size, progress=bar)
        if name in ("cpu", "cuda", "triton"):
            xk = x.to(val.compute_dtype(H.dtype)).contiguous()
            _warn_tf32(xk)
            size = _batch_size(batch, name, N, k, n_null + 1, xk.dtype, xk.device)
            return _subspace_rhos_kernel(name, xk, bases, size, bar, first)
        d_full_ranks = average_ranks(_condensed_cosine_distances(x, "H"))
        return _subspace_rhos_torch(x, d_full_ranks, bases, bar, first)

    try:
        if group is not None:
            from .distributed import run_on_every_rank, sum_across_ranks

            share = torch.zeros(n_null + 1, dtype=torch.float64)
            got = run_on_every_rank("subspace_pga", lambda: rhos_of(all_bases[mine.start : mine.stop], mine.start), group)
            share[mine.start : mine.stop] = torch.tensor(got, dtype=torch.float64)
            rhos = sum_across_ranks([share], group, x.device)[0].tolist()
            rho_readout, null_rhos = rhos[0], rhos[1:]
        else:
            rhos = rhos_of(all_bases)
            rho_readout, null_rhos = rhos[0], rhos[1:]
    finally:
        if bar is not None:
            bar.close()
    null = np.asarray(null_rhos, dtype=np.float64)
    null_mean = float(null.mean())
    null_std = float(null.std(ddof=1))
    z = (rho_readout - null_mean) / null_std if null_std > 0 else float("nan")
    return PGAResult(
        z=float(z), rho_readout=float(rho_readout), null_rhos=[float(r) for r in null_rhos],
        null_mean=null_mean, null_std=null_std, n_pairs=n_pairs, n_tokens=N, d=d, k=k,
        n_null=int(n_null), ccr=int(ccr), seed=int(seed), method=method, backend=name,
        settings={"layout": layout, "readout": "basis" if basis is not None else "W_U",
                  "ranks": "average (ties)" if method == "exact" else
                  f"histogram CDF: {STREAM_BINS} bins over [0, 2], a bin's pairs share its average rank",
                  "distances": "cosine, float64" if (name == "torch" and method == "exact") or H.dtype == torch.float64
                  else "cosine, float32 (projection and dot products)"},
    )


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
    progress: bool = True,
    group=None,
) -> Dict[int, List[PGAResult]]:
    """Subspace PGA of every layer, for each CCR variant: {ccr: [PGAResult per layer]}.

    The readout basis and the null subspaces are drawn once (the same seed) and shared by
    every layer and CCR variant. Shows a progress bar over layers × variants."""
    from .distributed import is_main, prepare_on_every_rank, resolve_group, tensor_digest

    group = resolve_group(group)
    layers = list(hidden_states_by_layer)

    def prepare():
        if not layers:
            raise ValueError("hidden_states_by_layer is empty")
        d_ = int(layers[0].shape[-1])
        for i, H in enumerate(layers):
            if int(H.shape[-1]) != d_:
                raise ValueError(f"hidden_states_by_layer[{i}] has d={H.shape[-1]}, layer 0 has d={d_}")
        readout_ = _readout_from(W_U, basis, k, layout, d_)
        nulls_ = grassmann_bases(d_, int(readout_.shape[1]), n_null, seed, device=torch.as_tensor(layers[0]).device) \
            if isinstance(n_null, (int, np.integer)) and not isinstance(n_null, bool) and n_null >= 2 else None
        return d_, readout_, nulls_, [int(c) for c in ccrs]

    d, readout, nulls, ccrs = prepare_on_every_rank(
        "pga_profile", prepare, lambda prep: {"layers": len(layers), "d": prep[0], "readout": tensor_digest(prep[1]),
                                              "ccrs": prep[3], "seed": seed, "n_null": n_null}, group)
    bar = None
    if progress and is_main(group):
        from tqdm.auto import tqdm

        bar = tqdm(total=len(layers) * len(ccrs), desc="PGA profile", unit=" layer")
    out: Dict[int, List[PGAResult]] = {c: [] for c in ccrs}
    try:
        for c in ccrs:
            for i, H in enumerate(layers):
                res = subspace_pga(H, basis=readout, n_null=n_null, ccr=c, seed=seed, layout=layout,
                                   method=method, backend=backend, progress=False, group=group, _nulls=nulls)
                res.settings["readout"] = "basis" if basis is not None else "W_U"
                out[c].append(res)
                if bar is not None:
                    bar.set_postfix_str(f"ccr={c} layer={i}")
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


# ------------------------------------------------ diagnostics and baselines (the paper's)


def _centered64(H, center: bool) -> torch.Tensor:
    x = _as_float_matrix(H, "H").to(torch.float64)
    return x - x.mean(dim=0, keepdim=True) if center else x


def _singular_values(H, center: bool) -> torch.Tensor:
    return torch.linalg.svdvals(_centered64(H, center))


def _check_m(m, x: torch.Tensor) -> int:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= min(x.shape):
        raise ValueError(f"m must be an int in [1, min(N, d) = {min(x.shape)}], got {m!r}")
    return int(m)


def _alignment_from(vh: torch.Tensor, basis: torch.Tensor, m: int) -> torch.Tensor:
    d = vh.shape[1]
    if basis.shape[0] != d:
        raise ValueError(f"basis has d={basis.shape[0]} rows but H has d={d}")
    b = check_orthonormal(basis).to(torch.float64)
    return ((vh[:m] @ b.to(vh.device)) ** 2).sum(dim=1)


def direction_alignment(H, basis: torch.Tensor, m: int = 10) -> torch.Tensor:
    """For each of the top m principal directions v of the centered H, the fraction ‖Bᵀv‖² of
    the unit direction that lies in span(basis) (1: inside, 0: orthogonal; a random direction
    keeps k/d on average). Returns (m,) float64."""
    x = _centered64(H, True)
    if basis.shape[0] != x.shape[1]:
        raise ValueError(f"basis has d={basis.shape[0]} rows but H has d={x.shape[1]}")
    m = _check_m(m, x)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    return _alignment_from(vh, basis, m)


def _rankme_from(s: torch.Tensor, eps: float) -> float:
    p = s / s.sum() + eps
    return float(torch.exp(-(p * torch.log(p)).sum()))


def rankme(H, center: bool = False, eps: float = 1e-7) -> float:
    """RankMe (Garrido et al., 2023): exp of the entropy of the normalized singular values
    p_i = σ_i/Σσ + eps. Uses the singular values of H themselves, not their squares (the
    eigenvalues of HᵀH), and H as given unless center=True. Between 1 and min(N, d)."""
    return _rankme_from(_singular_values(H, center), eps)


def _alpha_from(s: torch.Tensor, n_rows: int, fit_range=None) -> float:
    lam = s ** 2 / max(1, n_rows - 1)
    idx = torch.arange(1, lam.numel() + 1, dtype=torch.float64, device=lam.device)
    keep = lam > lam[0] * 1e-12
    if fit_range is not None:
        first, last = (int(v) for v in fit_range)
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
    from two SVDs (H as given, and centered) instead of one decomposition per metric. Equal to
    the separate functions up to rounding (isotropy: up to the choice of eigenvectors inside a
    repeated eigenvalue). α-ReQ is NaN when fewer than two eigenvalues are nonzero."""
    raw = _as_float_matrix(H, "H").to(torch.float64)
    centered = raw - raw.mean(dim=0, keepdim=True)
    _, s_raw, vh_raw = torch.linalg.svd(raw, full_matrices=False)
    _, s_c, vh_c = torch.linalg.svd(centered, full_matrices=False)
    try:
        alpha = _alpha_from(s_c, raw.shape[0])
    except ValueError:
        alpha = float("nan")
    out: Dict[str, object] = {"rankme": _rankme_from(s_raw, 1e-7), "alpha_req": alpha,
                              "isotropy": _isotropy_from(raw, vh_raw.T), "condition_number": _condition_from(s_c, raw.shape)}
    if basis is not None:
        out["readout_alignment_top"] = _alignment_from(vh_c, basis, _check_m(min(m, *raw.shape), raw)).cpu()
    return out


def cross_model_agreement(H_a, H_b, basis_a: torch.Tensor, basis_b: torch.Tensor, *, n_null: int = 20,
                          ccr: int = 1, seed: int = 0) -> dict:
    """Spearman between two models' pair distances on the same N tokens (rows aligned):
    in each model's readout subspace (H_a on basis_a, H_b on basis_b), in the full spaces, and
    in random subspaces of the same dimensions (n_null draws per model, seeded; mean and sample
    std of the ρ's). Both are centered with CCR-`ccr` first."""
    xa, _ = center_and_ccr(H_a, ccr)
    xb, _ = center_and_ccr(H_b, ccr)
    if xa.shape[0] != xb.shape[0]:
        raise ValueError(f"H_a and H_b must hold the same tokens: N={xa.shape[0]} vs N={xb.shape[0]}")
    if xa.shape[0] < 3:
        raise ValueError(f"need N >= 3 tokens, got {xa.shape[0]}")
    ba = _readout_from(None, basis_a, 1, "hf", xa.shape[1])
    bb = _readout_from(None, basis_b, 1, "hf", xb.shape[1])
    if isinstance(n_null, bool) or not isinstance(n_null, (int, np.integer)) or n_null < 2:
        raise ValueError(f"n_null must be an int >= 2, got {n_null!r}")

    def rho(pa, pb):
        return _pearson(average_ranks(_condensed_cosine_distances(pa, "H_a")),
                        average_ranks(_condensed_cosine_distances(pb, "H_b")))

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
    "CCRResult", "PGAResult", "ReadoutBasis", "alpha_req", "average_ranks", "center_and_ccr",
    "check_orthonormal", "condition_number", "cross_model_agreement", "direction_alignment",
    "grassmann_bases", "isotropy", "pairwise_cosine_distances", "pga_profile", "rankme",
    "readout_basis", "spearman", "subspace_pga",
]
