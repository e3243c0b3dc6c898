"""Subspace geometry of Subspace PGA (Xu 2026, DESIGN.md §1.4): the readout basis of an
unembedding, random bases drawn uniformly from the Grassmannian, and centering with CCR (the top
principal components removed). All in float64.
"""

from __future__ import annotations

import contextlib
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import torch

from . import _validation as val

LAYOUTS = ("hf", "tl")
_CHUNK_BYTES = 32 << 20


class ReadoutBasis(NamedTuple):
    """The top-k right singular vectors of W_U (d×k, float64, columns orthonormal) and all of
    W_U's singular values (descending, float64)."""

    basis: torch.Tensor
    singular_values: torch.Tensor


def readout_basis(W_U, k: int = 100, layout: str = "hf") -> ReadoutBasis:
    """Top-k right singular vectors of the unembedding W_U, through the d×d Gram in float64.

    layout "hf": W_U is V×d (Hugging Face ``lm_head.weight``): the basis spans the row space,
    the right singular vectors, eigenvectors of W_Uᵀ W_U. layout "tl": W_U is d×V (TransformerLens
    ``W_U``): the same subspace is its column space, eigenvectors of W_U W_Uᵀ (its left singular
    vectors). Never runs a dense SVD of V×d; the Gram is accumulated over row chunks in float64.
    Eigenvector signs are fixed so that each basis vector's largest-magnitude entry is positive.
    """
    val.check_choice(layout, "layout", LAYOUTS)
    W = val.finite_matrix(W_U, "W_U")
    if layout == "tl":
        W = W.T
    V, d = W.shape
    k = val.check_k(k, d)
    # W/s with s a power of two near max|W| (exact): the Gram of W/s cannot overflow or underflow
    # whatever W's scale; the singular values are scaled back.
    scale = val.power_of_two_scale(W)
    gram = torch.zeros(d, d, dtype=torch.float64, device=W.device)
    rows = max(1, _CHUNK_BYTES // (8 * d))
    for r0 in range(0, V, rows):
        chunk = W[r0 : r0 + rows].to(torch.float64) / scale
        gram.addmm_(chunk.T, chunk)
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    evals = evals.flip(0).clamp_min(0.0)
    evecs = evecs.flip(1)
    basis = _fix_signs(evecs[:, :k].contiguous())
    return ReadoutBasis(basis, evals.sqrt() * scale)


def readout_subspace(W_U, basis: Optional[torch.Tensor], k: int, layout: str, d: int) -> torch.Tensor:
    """The d×k readout basis (float64) from exactly one of W_U (its top-k right singular vectors,
    `readout_basis`) and `basis` (checked: d×k, 1 ≤ k < d, finite, orthonormal columns)."""
    if (W_U is None) == (basis is None):
        raise ValueError("pass exactly one of W_U (the unembedding) and basis (a d×k readout basis)")
    if basis is not None:
        if isinstance(basis, torch.Tensor) and basis.dim() == 2 and basis.shape[0] == d:
            val.check_k(int(basis.shape[1]), d)
        return val.check_basis(basis, d)
    val.check_choice(layout, "layout", LAYOUTS)
    W = val.as_matrix(W_U, "W_U") if isinstance(W_U, (torch.Tensor, np.ndarray)) and W_U.ndim == 2 else W_U
    if not isinstance(W, (torch.Tensor, np.ndarray)):
        raise val.ArgumentTypeError(f"W_U must be a torch.Tensor or numpy.ndarray, got {type(W_U).__name__}")
    shape = tuple(W.shape)
    if len(shape) != 2 or (shape[1] if layout == "hf" else shape[0]) != d:
        expect = "V×d" if layout == "hf" else "d×V"
        raise ValueError(f"W_U must be {expect} (layout={layout!r}) with d={d} matching H, got shape {shape}")
    return readout_basis(W, k, layout).basis


def _fix_signs(q: torch.Tensor) -> torch.Tensor:
    """Columns with their largest-|·| entry made positive (a deterministic orientation)."""
    idx = q.abs().argmax(dim=0)
    signs = torch.sign(q[idx, torch.arange(q.shape[1], device=q.device)])
    signs[signs == 0] = 1.0
    return q * signs


def _subspace_seed(seed: int, b: int) -> int:
    """The generator seed of basis b of a draw with `seed` (SeedSequence mixing: independent
    streams for every (seed, b))."""
    return int(np.random.SeedSequence([int(seed), int(b)]).generate_state(1, dtype=np.uint64)[0] >> 1)


_DRAWS: contextvars.ContextVar[Optional[Dict[Tuple, torch.Tensor]]] = contextvars.ContextVar(
    "repcap_fast_grassmann_draws", default=None)


@contextlib.contextmanager
def reused_draws() -> Iterator[None]:
    """Inside this block grassmann_bases returns the very same tensor for the same arguments
    instead of drawing again (pga_profile: one draw for every layer and CCR variant). The
    tensors are held until the block ends; callers must not modify them."""
    token = _DRAWS.set({})
    try:
        yield
    finally:
        _DRAWS.reset(token)


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
    k = val.check_k(k, int(d))
    n, d, seed = int(n), int(d), val.check_seed(seed)
    draws = _DRAWS.get()
    key = (d, k, n, int(seed), dtype, str(torch.device(device)))
    if draws is not None and key in draws:
        return draws[key]
    g = torch.empty(n, d, k, dtype=torch.float32)  # float32 normals: torch's float64 sampler is ~5x slower

    def draw(b: int) -> None:
        torch.randn(d, k, generator=torch.Generator().manual_seed(_subspace_seed(seed, b)), out=g[b])

    workers = max(1, min(n, torch.get_num_threads()))
    if workers == 1 or n * d * k < 1 << 16:
        for b in range(n):
            draw(b)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:  # torch releases the GIL while sampling
            list(pool.map(draw, range(n)))
    out = _orthonormalize(g.to(device=device, dtype=torch.float64)).to(dtype=dtype)
    if draws is not None:
        draws[key] = out
    return out


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


def center_and_ccr_unscaled(H, m: int = 1) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """`center_and_ccr` before the residual is scaled back: (residual / s, directions, s), s the
    power of two near max|H| (the residual of H near float64's maximum stays finite this way)."""
    H = val.finite_matrix(H, "H")
    N, d = H.shape
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"ccr must be an int >= 0, got {m!r}")
    if m >= min(N, d):
        raise ValueError(f"ccr must be < min(N, d) = {min(N, d)} (N={N} tokens, d={d}), got {m}")
    x = H.to(torch.float64)
    scale = val.power_of_two_scale(x)
    x = x / scale
    x = x - x.mean(dim=0, keepdim=True)
    if m == 0:
        return x, x.new_zeros(0, d), scale
    removed = _fix_signs(_top_right_singular_vectors(x, m)).T.contiguous()
    return x - (x @ removed.T) @ removed, removed, scale


def center_and_ccr(H, m: int = 1) -> CCRResult:
    """Subtracts the token mean and removes the top m principal components (CCR-m), in float64.

    The directions are the top-m right singular vectors of the centered H (eigenvectors of HᵀH
    when d ≤ N, else an SVD; float64); m = 0 only centers. They are found for H/s, s a power of
    two near max|H| (an exact scaling), so H of any float64 magnitude (1e-200 or 1e200) gives the
    directions of H; the residual is returned at H's own scale.
    """
    x, removed, scale = center_and_ccr_unscaled(H, m)
    return CCRResult(x * scale, removed)
