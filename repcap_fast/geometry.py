"""Subspace geometry of Subspace PGA (Xu 2026, DESIGN.md §1.4), all in float64.

The readout basis of an unembedding, random bases drawn uniformly from the Grassmannian, and
centering with CCR (the top principal components removed). The public names are served from
``repcap_fast.pga``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
from collections import OrderedDict
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import torch

from . import _validation as val
from . import eigen
from .ops.grassmann_normals import grassmann_normals

LAYOUTS = ("hf", "tl")
_CHUNK_BYTES = 32 << 20


class ReadoutBasis(NamedTuple):
    """The readout subspace of an unembedding W_U, as ``readout_basis`` returns it.

    Attributes:
        basis (torch.Tensor): the top-k right singular vectors of W_U, d×k float64 with
            orthonormal columns, each oriented so that its largest-magnitude entry is positive.
        singular_values (torch.Tensor): the top-k singular values of W_U, (k,) float64,
            descending.
        solver (str): how they were found: "eigh", or "subspace iteration: R rounds, P products"
            (with a certified angle to the exact subspace), or eigh as a fallback with its reason.

    Examples:
        >>> W_U = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
        >>> rb = rf.pga.readout_basis(W_U, k=3)
        >>> rb.basis.shape, rb.singular_values.shape, rb.solver
        (torch.Size([8, 3]), torch.Size([3]), 'eigh')
    """

    basis: torch.Tensor
    singular_values: torch.Tensor
    solver: str


_READOUT_CACHE: "OrderedDict[tuple, ReadoutBasis]" = OrderedDict()
_READOUT_CACHE_SIZE = 8
_DRAW_CACHE: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_DRAW_CACHE_SIZE = 2
_DRAW_CACHE_MAX_BYTES = 256 << 20  # a larger draw is not kept
_DIGEST_CHUNK = 1 << 20
_DIGEST_PRIME = 2**31 - 1
_DIGEST_WEIGHTS: Dict[str, torch.Tensor] = {}


def content_digest(x: torch.Tensor) -> Tuple:
    """A digest of a tensor's shape, dtype and every bit of its values.

    CPU tensors: BLAKE2b of their bytes. Other devices: `_device_fingerprint`, computed where the
    tensor lives (no copy to the host).
    """
    x = x.detach()
    head = (tuple(x.shape), str(x.dtype), str(x.device))
    if x.device.type == "cpu":
        data = x.contiguous().reshape(-1).view(torch.uint8).numpy()
        return (*head, hashlib.blake2b(memoryview(data), digest_size=16).hexdigest())
    return (*head, *_device_fingerprint(x))


def _device_fingerprint(x: torch.Tensor) -> Tuple[int, int]:
    """Two independent 31-bit hashes of x's 16-bit words w_i, in exact int64 arithmetic on x's device.

    h = Σ_chunks B^(…) (Σ_i w_i c_i mod P) mod P, P = 2^31 − 1, with fixed pseudo-random weights
    c_i < P per position in a chunk (every product < 2^47, every chunk sum < 2^51). An edit of any
    words changes h unless Σ Δw_i c_i ≡ 0 (mod P): a chance of 1/P per hash.
    """
    words = x.contiguous().reshape(-1).view(torch.uint8)
    if words.numel() % 2:
        words = torch.cat([words, words.new_zeros(1)])
    words = words.view(torch.int16)
    key = str(words.device)
    weights = _DIGEST_WEIGHTS.get(key)
    if weights is None:
        gen = torch.Generator().manual_seed(0x5EED)
        weights = torch.randint(1, _DIGEST_PRIME, (2, _DIGEST_CHUNK), generator=gen, dtype=torch.int64)
        weights = _DIGEST_WEIGHTS[key] = weights.to(words.device)
    sums = []
    for start in range(0, words.numel(), _DIGEST_CHUNK):
        w = words[start : start + _DIGEST_CHUNK].to(torch.int64) & 0xFFFF
        sums.append(((w * weights[:, : w.numel()]) % _DIGEST_PRIME).sum(dim=1))
    out = [0, 0]
    for part in torch.stack(sums).tolist():  # one transfer
        out = [(h * 1_000_003 + int(v)) % _DIGEST_PRIME for h, v in zip(out, part)]
    return out[0], out[1]


def clear_readout_cache() -> None:
    """Forgets every cached readout basis and every kept null draw.

    After it, ``readout_basis`` decomposes W_U again and ``grassmann_bases`` draws again (the
    same values: both are deterministic). Use it to free their memory.

    Returns:
        None.

    Examples:
        >>> rf.pga.clear_readout_cache()
    """
    _READOUT_CACHE.clear()
    _DRAW_CACHE.clear()


def readout_basis(W_U, k: int = 100, layout: str = "hf", *, solver: str = "auto") -> ReadoutBasis:
    """The readout subspace of an unembedding: the top-k right singular vectors of W_U, in float64.

    The basis B (d×k) holds the top k eigenvectors of the d×d Gram W_Uᵀ W_U (float64, accumulated
    over row chunks; never a dense SVD of V×d), and the singular values are the square roots of
    their eigenvalues. Each basis vector is oriented so that its largest-magnitude entry is
    positive. Results are cached by the content of W_U (with k, layout and solver): a loop over
    layers with one unembedding decomposes it once; the cache holds the last 8 results and
    returns copies (``clear_readout_cache`` empties it).

    Args:
        W_U (torch.Tensor | numpy.ndarray): the unembedding, any float dtype, finite.
        k: the readout dimension, 1 ≤ k < d. Defaults to 100.
        layout: "hf" (default): W_U is V×d (Hugging Face ``lm_head.weight``), the basis spans its
            row space; "tl": W_U is d×V (TransformerLens ``W_U``), the basis spans its column
            space (the eigenvectors of W_U W_Uᵀ).
        solver: the Gram's top eigenpairs, as ``eigen.top_eigenpairs``: "auto" (default;
            certified subspace iteration when k is small against d, else a full eigh),
            "iterate" (subspace iteration, eigh as a fallback) or "eigh".

    Returns:
        ReadoutBasis: (basis d×k, singular_values (k,), solver), float64 on W_U's device.

    Raises:
        ValueError: an unknown layout or solver; W_U not a 2-D float matrix (an
            ``ArgumentTypeError``, also a TypeError, for another type or dtype), empty, or with
            NaN/Inf; k not an int with 1 ≤ k < d.

    Examples:
        >>> W_U = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))  # V×d
        >>> rb = rf.pga.readout_basis(W_U, k=3)
        >>> rb.basis.shape, torch.allclose(rb.basis.T @ rb.basis, torch.eye(3, dtype=torch.float64))
        (torch.Size([8, 3]), True)
        >>> torch.allclose(rb.singular_values, torch.linalg.svdvals(W_U.double())[:3])
        True
    """
    val.check_choice(layout, "layout", LAYOUTS)
    val.check_choice(solver, "solver", eigen.SOLVERS)
    W = val.finite_matrix(W_U, "W_U")
    k = val.check_k(k, int(W.shape[1] if layout == "hf" else W.shape[0]))
    key = (content_digest(W), k, layout, solver)
    if layout == "tl":
        W = W.T
    V, d = W.shape
    hit = _READOUT_CACHE.get(key)
    if hit is not None:
        _READOUT_CACHE.move_to_end(key)
        return ReadoutBasis(hit.basis.clone(), hit.singular_values.clone(), hit.solver)
    # W/s with s a power of two near max|W| (exact): the Gram of W/s cannot overflow or underflow
    # whatever W's scale; the singular values are scaled back.
    scale = val.power_of_two_scale(W)
    gram = torch.zeros(d, d, dtype=torch.float64, device=W.device)
    rows = max(1, _CHUNK_BYTES // (8 * d))
    for r0 in range(0, V, rows):
        chunk = W[r0 : r0 + rows].to(torch.float64) / scale
        gram.addmm_(chunk.T, chunk)
    top = eigen.top_eigenpairs(gram, k, solver=solver)
    out = ReadoutBasis(_fix_signs(top.vectors.contiguous()), top.values.clamp_min(0.0).sqrt() * scale, top.solver)
    _READOUT_CACHE[key] = out
    while len(_READOUT_CACHE) > _READOUT_CACHE_SIZE:
        _READOUT_CACHE.popitem(last=False)
    return ReadoutBasis(out.basis.clone(), out.singular_values.clone(), out.solver)


def readout_rank_note(singular_values: torch.Tensor, d: int) -> Optional[str]:
    """None when all top-k singular values of W_U are nonzero, else a warning that says how many are zero.

    Zero is relative to the largest (below σ_max·√(d·eps₆₄), what the float64 Gram resolves):
    their basis vectors are arbitrary directions of W_U's null space, not readout directions.
    Raises ValueError when W_U is all zeros (no readout direction at all).
    """
    s = singular_values.to(torch.float64)  # on its device: only scalars are read
    k = int(s.numel())
    top = float(s.max()) if k else 0.0
    if top == 0.0:
        raise ValueError("W_U is all zeros: it has no readout direction, so there is no readout subspace "
                         "(check that the unembedding was loaded)")
    tol = top * math.sqrt(d * torch.finfo(torch.float64).eps)
    rank = int((s > tol).sum())
    if rank == k:
        return None
    return (f"rank-deficient readout: W_U has only {rank} nonzero singular values among its top k = {k} "
            f"(relative to the largest, below {tol / top:.1e}); the other {k - rank} readout directions are "
            f"arbitrary directions of W_U's null space, so z compares a partly random subspace. Use k <= {rank}.")


def readout_subspace(W_U, basis: Optional[torch.Tensor], k: int, layout: str,
                     d: int) -> Tuple[torch.Tensor, str, Optional[str]]:
    """The d×k readout basis (float64) from exactly one of W_U and `basis`, how it was found, and a note.

    From W_U: its top-k right singular vectors (`readout_basis`); a `basis` is checked (d×k,
    1 ≤ k < d, finite, orthonormal columns). How it was found: `ReadoutBasis.solver` for W_U,
    "given" for a basis. The note: `readout_rank_note`'s warning for W_U (None when its top k
    singular values are all nonzero, or for a basis). Raises ValueError for an all-zero W_U.
    """
    if (W_U is None) == (basis is None):
        raise ValueError("pass exactly one of W_U (the unembedding) and basis (a d×k readout basis)")
    if basis is not None:
        if isinstance(basis, torch.Tensor) and basis.dim() == 2 and basis.shape[0] == d:
            val.check_k(int(basis.shape[1]), d)
        return val.check_basis(basis, d), "given", None
    val.check_choice(layout, "layout", LAYOUTS)
    if isinstance(W_U, torch.Tensor):
        val.check_dense(W_U, "W_U")
    W = val.as_matrix(W_U, "W_U") if isinstance(W_U, (torch.Tensor, np.ndarray)) and W_U.ndim == 2 else W_U
    if not isinstance(W, (torch.Tensor, np.ndarray)):
        raise val.ArgumentTypeError(f"W_U must be a torch.Tensor or numpy.ndarray, got {type(W_U).__name__}")
    shape = tuple(W.shape)
    if len(shape) != 2 or (shape[1] if layout == "hf" else shape[0]) != d:
        expect = "V×d" if layout == "hf" else "d×V"
        raise ValueError(f"W_U must be {expect} (layout={layout!r}) with d={d} matching H, got shape {shape}")
    found = readout_basis(W, k, layout)
    return found.basis, found.solver, readout_rank_note(found.singular_values, d)


def _fix_signs(q: torch.Tensor) -> torch.Tensor:
    """Columns with their largest-|·| entry made positive (a deterministic orientation)."""
    idx = q.abs().argmax(dim=0)
    signs = torch.sign(q[idx, torch.arange(q.shape[1], device=q.device)])
    signs[signs == 0] = 1.0
    return q * signs


_DRAWS: contextvars.ContextVar[Optional[Dict[Tuple, torch.Tensor]]] = contextvars.ContextVar(
    "repcap_fast_grassmann_draws", default=None)


@contextlib.contextmanager
def reused_draws() -> Iterator[None]:
    """Inside this block grassmann_bases returns the very same tensor for the same arguments.

    It does not draw again (pga_profile: one draw for every layer and CCR variant). The tensors
    are held until the block ends; callers must not modify them.
    """
    token = _DRAWS.set({})
    try:
        yield
    finally:
        _DRAWS.reset(token)


def grassmann_bases(d: int, k: int, n: int, seed: int = 0, dtype=torch.float64, device="cpu",
                    backend: str = "auto") -> torch.Tensor:
    """Draws n orthonormal d×k bases uniformly from the Grassmannian: the null subspaces of Subspace PGA.

    Each basis is Q of the QR factorization G = QR of a standard Gaussian d×k matrix G, with R's
    diagonal made positive (which makes Q Haar-distributed). The Gaussians come from
    ``ops.grassmann_normals`` (Philox4x32-10, counter-based): entry (i, j) of basis b depends on
    (seed, b, i·k + j) alone, so a seed gives the same bases on every device (to the rounding of
    log/cos/sin and of the orthonormalization), and the first m of n bases are those of a draw
    of m. The last 2 draws of at most 256 MiB each are kept by their arguments: a repeated call
    returns a copy without drawing again (``clear_readout_cache`` forgets them).

    Args:
        d: the ambient dimension, an int ≥ 2.
        k: the subspace dimension, 1 ≤ k < d.
        n: the number of bases, ≥ 1.
        seed: an int in [0, 2^63 − 1]. Defaults to 0.
        dtype (torch.dtype): the returned dtype (they are computed in float64). Defaults to
            torch.float64.
        device (str | torch.device): where they are drawn and returned. Defaults to "cpu".
        backend: the generator's kernel, as ``ops.grassmann_normals``: "auto" (default), "cpu",
            "cuda", "triton" or "torch".

    Returns:
        torch.Tensor: (n, d, k) bases with orthonormal columns, in `dtype` on `device`.

    Raises:
        ValueError: d < 2, n < 1, k outside [1, d), a seed out of range, a device that does not
            exist here or an unknown backend (an ``ArgumentTypeError``, also a TypeError, for an
            argument of the wrong type).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        >>> B = rf.pga.grassmann_bases(8, 3, 4, seed=0)
        >>> B.shape, torch.allclose(B.transpose(1, 2) @ B, torch.eye(3, dtype=torch.float64))
        (torch.Size([4, 8, 3]), True)
        >>> torch.equal(B[:2], rf.pga.grassmann_bases(8, 3, 2, seed=0))  # the first 2 of a draw of 4
        True
    """
    d, n = val.check_int(d, "d", 2), val.check_int(n, "n", 1)
    k = val.check_k(k, d)
    seed = val.check_seed(seed)
    device = val.check_device(device)
    draws = _DRAWS.get()
    key = (d, k, n, int(seed), dtype, str(torch.device(device)), backend)
    if draws is not None and key in draws:
        return draws[key]
    kept = _DRAW_CACHE.get(key)
    if kept is not None:  # a loop over layers draws the same bases: copy the kept ones
        _DRAW_CACHE.move_to_end(key)
        out = kept.clone()
        if draws is not None:
            draws[key] = out
        return out
    out = torch.empty(n, d, k, dtype=dtype, device=device)
    per_batch = max(1, _CHUNK_BYTES // (8 * d * k))  # 32 MiB of normals at a time
    for b0 in range(0, n, per_batch):
        normals = grassmann_normals(min(per_batch, n - b0), d, k, seed, first_basis=b0, device=device,
                                    backend=backend)
        out[b0 : b0 + normals.shape[0]] = _orthonormalize(normals).to(dtype)
    if draws is not None:
        draws[key] = out
    if out.numel() * out.element_size() <= _DRAW_CACHE_MAX_BYTES:
        _DRAW_CACHE[key] = out.clone()
        while len(_DRAW_CACHE) > _DRAW_CACHE_SIZE:
            _DRAW_CACHE.popitem(last=False)
    return out


def _orthonormalize(g: torch.Tensor) -> torch.Tensor:
    """Q of the QR factorization G = QR with R's diagonal positive, for a batch of d×k matrices.

    CholeskyQR2 (R from the Cholesky factor of GᵀG, applied twice) is the same factorization
    and runs as batched GEMMs; it is used when it is accurate (well-conditioned G, always the
    case for Gaussian G with k ≤ d/2), else Householder QR with the signs fixed.
    """
    k = g.shape[-1]
    if 2 * k <= g.shape[-2]:
        q = g
        ok = True
        for _ in range(2):
            gram = q.transpose(-2, -1) @ q
            with eigen.small_lapack(g.device, k):  # n small factorizations: one thread each
                chol, info = torch.linalg.cholesky_ex(gram)
                if bool((info != 0).any()):
                    ok = False
                    break
                eye_k = torch.eye(k, dtype=g.dtype, device=g.device).expand_as(chol)
                chol_inv = torch.linalg.solve_triangular(chol, eye_k, upper=False)  # k×k: cheap
            q = q @ chol_inv.transpose(-2, -1)  # G R⁻¹ with R = Lᵀ, as one batched GEMM
        eye = torch.eye(k, dtype=g.dtype, device=g.device)
        if ok and float((q.transpose(-2, -1) @ q - eye).abs().max()) < 1e-13:
            return q
    with eigen.small_lapack(g.device, g.shape[-2]):
        q, r = torch.linalg.qr(g)
    s = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    s[s == 0] = 1.0
    return q * s[..., None, :]


class CCRResult(NamedTuple):
    """H centered, with its top m principal directions removed, as ``center_and_ccr`` returns it.

    Attributes:
        H (torch.Tensor): the residual (H − mean)(I − RᵀR), N×d float64 at H's own scale.
        removed (torch.Tensor): R, the removed directions, m×d float64 with orthonormal rows
            (0×d for m = 0).

    Examples:
        >>> H = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
        >>> res = rf.pga.center_and_ccr(H, 2)
        >>> res.H.shape, res.removed.shape
        (torch.Size([20, 8]), torch.Size([2, 8]))
    """

    H: torch.Tensor
    removed: torch.Tensor


CCR_BLOCK = 10  # CCR solves for at least this many directions, so CCR-1, -5 and -10 share one solve


def _ccr_directions(m: int, N: int, d: int) -> int:
    """How many top directions CCR-m solves for: max(m, CCR_BLOCK, the context's `shared_ccr`), below min(N, d).

    CCR-m keeps the first m: a call and a profile get the same bits.
    """
    return max(m, min(max(CCR_BLOCK, _SHARED_CCR.get()[0]), min(N, d) - 1))


_GRAM_RANK_CUT = 1e-8  # N < d: the N×N Gram route when λ_m > this·λ_1, else an SVD of x


def _top_right_singular_vectors(x: torch.Tensor, m: int) -> torch.Tensor:
    """The top-m right singular vectors of x (d×m, float64).

    They are the eigenvectors of xᵀx (d×d) when d ≤ N (`eigen.top_eigenpairs`: certified subspace
    iteration or eigh; they stay orthonormal even past the rank of x). When N < d they are
    v_i = xᵀu_i/σ_i from the top eigenpairs (u_i, σ_i²) of the N×N Gram x xᵀ, the same solver on
    the smaller matrix (a float64 SVD of a 2048×4096 x took most of a GPU PGA profile); where
    λ_m ≤ 1e-8·λ_1 (direction m at or past the numerical rank of x) from an SVD of x, whose
    directions past the rank lie in the null space of x.
    """
    n, d = x.shape
    if d <= n:
        return eigen.top_eigenpairs(x.T @ x, m).vectors
    top = eigen.top_eigenpairs(x @ x.T, m)  # m ≤ min(N, d) − 1 < N
    if bool(top.values[-1] > _GRAM_RANK_CUT * top.values[0]):
        return (x.T @ top.vectors) / top.values.sqrt()
    with eigen.small_lapack(x.device, n):
        _, _, vh = torch.linalg.svd(x, full_matrices=False)
    return vh[:m].T


_SHARED_CCR: contextvars.ContextVar[Tuple[int, Optional[Dict]]] = contextvars.ContextVar(
    "repcap_fast_shared_ccr", default=(0, None))


@contextlib.contextmanager
def shared_ccr(max_m: int) -> Iterator[None]:
    """Inside this block CCR solves for at least max_m directions and reuses them for the same H.

    Every CCR variant of the same tensor H shares them (pga_profile: one decomposition per layer
    for CCR {1, 5, 10}). A tensor changed in place is decomposed again.
    """
    token = _SHARED_CCR.set((int(max_m), {}))
    try:
        yield
    finally:
        _SHARED_CCR.reset(token)


def center_and_ccr_unscaled(H, m: int = 1) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """`center_and_ccr` before the residual is scaled back: (residual / s, directions, s).

    s is the power of two near max|H| (the residual of H near float64's maximum stays finite this
    way).
    """
    H = val.finite_matrix(H, "H")
    N, d = H.shape
    m = val.check_int(m, "ccr", 0)
    if m >= min(N, d):
        raise ValueError(f"ccr must be < min(N, d) = {min(N, d)} (N={N} tokens, d={d}), got {m}")
    x = H.to(torch.float64)
    scale = val.power_of_two_scale(x)
    x = x / scale
    x = x - x.mean(dim=0, keepdim=True)
    if m == 0:
        return x, x.new_zeros(0, d), scale
    removed = _shared_directions(H, x, _ccr_directions(m, N, d))[:m]
    return x - (x @ removed.T) @ removed, removed, scale


def _shared_directions(H, x: torch.Tensor, m: int) -> torch.Tensor:
    """The top-m directions of the centered x (m×d, signs fixed), reused within `shared_ccr`.

    They are reused for the same values of H: the same storage, shape and strides at the same
    version (H is held while the block lasts, so its memory cannot be reused by another tensor).
    """
    cache = _SHARED_CCR.get()[1]
    if cache is None:
        return _fix_signs(_top_right_singular_vectors(x, m)).T.contiguous()
    key = (H.data_ptr(), tuple(H.shape), H.stride(), H.dtype, str(H.device), H._version, m)
    if key not in cache:
        cache[key] = (H, _fix_signs(_top_right_singular_vectors(x, m)).T.contiguous())
    return cache[key][1]


def center_and_ccr(H, m: int = 1) -> CCRResult:
    """Subtracts the token mean and removes the top m principal components (CCR-m), in float64.

    With X = H − mean(H) (the mean over tokens) and R (m×d) the top-m right singular vectors of
    X, the residual is X − (X Rᵀ) R; m = 0 only centers. The directions are found for H/s, s a
    power of two near max|H| (an exact scaling), so H of any float64 magnitude (1e-200 or 1e200)
    gives the directions of H; the residual is returned at H's own scale. Each direction is
    oriented so that its largest-magnitude entry is positive.

    Args:
        H (torch.Tensor | numpy.ndarray): N×d hidden states, any float dtype, finite.
        m: the number of principal components removed, 0 ≤ m < min(N, d). Defaults to 1.

    Returns:
        CCRResult: (H, removed): the N×d float64 residual and the m×d removed directions.

    Raises:
        ValueError: H not a 2-D float matrix (an ``ArgumentTypeError``, also a TypeError, for
            another type or dtype), empty, or with NaN/Inf; m not an int with 0 ≤ m < min(N, d).

    Examples:
        >>> H = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
        >>> res = rf.pga.center_and_ccr(H, m=2)
        >>> res.H.shape, res.removed.shape
        (torch.Size([20, 8]), torch.Size([2, 8]))
        >>> float(res.H.mean(0).abs().max()) < 1e-12, float((res.H @ res.removed.T).abs().max()) < 1e-12
        (True, True)
    """
    x, removed, scale = center_and_ccr_unscaled(H, m)
    return CCRResult(x * scale, removed)
