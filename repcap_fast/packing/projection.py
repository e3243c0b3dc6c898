"""The alternating-projection packing method (``packing.optimize(method="alternating-projection")``).

Tropp, Dhillon, Heath and Strohmer (2005), "Designing structured tight frames via an alternating
projection method", and Dhillon, Heath, Strohmer and Tropp (2008), "Constructing packings in
Grassmannian manifolds via alternating projection". The iterate is the k×k Gram matrix G of the
packing; each step projects it onto two sets in turn:

* the structural set {H symmetric: H_ii = 1, |H_ij| ≤ μ}: the off-diagonal entries clipped to
  [−μ, μ] and the diagonal set to 1 (the nearest such matrix in the Frobenius norm);
* the spectral set of tight frames {(k/d)·P: P a rank-d orthogonal projector}: G = (k/d)·V Vᵀ
  with V an orthonormal basis of the top d eigenvectors of H (the nearest such matrix). For
  k ≤ EIGH_MAX_K (or d ≥ k), V is read off ``torch.linalg.eigh``, O(k³). Beyond, V comes from
  SUBSPACE_ITERATIONS steps of subspace iteration warm-started at the previous step's V
  (V ← QR(H·V)), O(k²d): H is a small change of the previous rank-d Gram, so its top-d subspace
  is close to the previous one. G is then still a tight frame, with the top-d subspace up to the
  iteration's convergence (how this compares with ``eigh``: docs/internals/packing.md).

The packing of a step is the rows of V, normalized (vectors in R^d, in the eigenvectors'
coordinates: a rotation of the frame, which changes no cosine). μ is annealed down to the best
lower bound b that applies (``capacity.coherence_bound``: Welch for equiangular tight frames) as
μ_t = b·(1 + MU_AMPLITUDE·exp(−t/τ)), τ = min(MU_STEPS, steps/MU_DECAYS) (so μ is within
MU_AMPLITUDE·e^−15 of b at the last step of any run), and the method returns the packing of least ε*
seen over the run. As a polish after another method (``optimize(..., projection_steps=n)``), μ starts
at the ε* of that method's packing instead, μ_t = b + (ε*₀ − b)·exp(−t/τ), and the start itself counts
as seen (the polish never raises ε*). Where an equiangular tight frame exists it is the fixed point, and the
iteration reaches it from many starts (test_packing_projection.py lists which); where b is not
reachable the iterates keep moving and the best one seen is kept.

Each step holds k×k float64 matrices: the method refuses k > MAX_K. It runs in float64 on the vectors' device.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

MAX_K = 4096  # k×k float64 Grams (128 MiB) per step
EIGH_MAX_K = 256  # up to this k, the exact projection (one eigh per step; 256³ is cheap)
SUBSPACE_ITERATIONS = 2  # beyond it: H·V products (and QRs) per step, d < k
MU_AMPLITUDE = 0.5  # μ starts at (1 + MU_AMPLITUDE)·bound …
MU_STEPS = 300.0  # … and decays to the bound with this time constant (steps) …
MU_DECAYS = 15.0  # … or, in a run of fewer than MU_STEPS·MU_DECAYS steps, steps/MU_DECAYS


def check_size(k: int, d: int, what: str = "method='alternating-projection'") -> None:
    """Refuses a k beyond MAX_K, naming `what` asked for it, the limit and why."""
    if k > MAX_K:
        raise ValueError(f"{what} holds k×k Gram matrices (float64, several per step of the alternating "
                         f"projection): k must be at most {MAX_K}, got k={k} (d={d}); use 'minimax' or "
                         "'riemannian' alone for larger k")


def coherence(x: torch.Tensor) -> float:
    """max_{i≠j} |x_i·x_j| of rows x (unit rows: ε*), float64."""
    g = x @ x.T
    g.fill_diagonal_(0.0)
    return float(g.abs().max())


def alternating_projection(X: torch.Tensor, steps: int, bound: float,
                           on_step: Callable[[int, float], None], mu_start: Optional[float] = None) -> torch.Tensor:
    """Runs `steps` alternating projections from the unit rows X; returns the best packing seen.

    Args:
        X: the k×d start, unit rows.
        steps: projection steps, ≥ 1.
        bound: the lower bound μ is annealed to (capacity.coherence_bound of k and d).
        on_step: called as on_step(step, ε* of that step's packing) after each step (the best
            so far in a step whose frame leaves a row out, rare).
        mu_start: the first μ (default (1 + MU_AMPLITUDE)·bound); the polish passes the start's ε*.

    Returns:
        torch.Tensor: the k×d packing of least ε* (float64, unit rows, on X's device).
    """
    k, d = X.shape
    check_size(k, d)
    x = X.detach().to(torch.float64)
    x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
    best, best_eps = x, coherence(x)
    gram = x @ x.T
    m = min(k, d)
    exact = d >= k or k <= EIGH_MAX_K
    basis = None if exact else torch.linalg.qr(x).Q  # k×d: the top-d eigenvectors of x·xᵀ, the start
    tau = min(MU_STEPS, steps / MU_DECAYS)
    mu_start = bound * (1.0 + MU_AMPLITUDE) if mu_start is None else max(float(mu_start), bound)
    for step in range(steps):
        mu = bound + (mu_start - bound) * math.exp(-step / tau)
        h = gram.clamp(-mu, mu)
        h.fill_diagonal_(1.0)
        if basis is None:
            v = torch.linalg.eigh(h)[1][:, k - m:]  # ascending eigenvalues: the top m
        else:
            for _ in range(SUBSPACE_ITERATIONS):
                basis = torch.linalg.qr(h @ basis).Q
            v = basis
        gram = (k / d) * (v @ v.T)
        scale = gram.diagonal().rsqrt()  # the cosines of the rows of v: the Gram, rescaled
        if bool(torch.isfinite(scale).all()):
            cosines = gram * scale[:, None] * scale[None, :]
            cosines.fill_diagonal_(0.0)
            eps = float(cosines.abs().max())
            if eps < best_eps:
                best = torch.zeros(k, d, dtype=torch.float64, device=x.device)
                best[:, :m] = v * (scale[:, None] * math.sqrt(k / d))
                best_eps = eps
        else:  # a row left out of the frame: no packing this step
            eps = math.inf
        on_step(step, eps if math.isfinite(eps) else best_eps)
    return best
