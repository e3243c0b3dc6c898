"""The equiangular-frame search (``packing.optimize(method="equiangular-search")``).

A real equiangular tight frame (ETF) of k lines in R^d meets the Welch bound
μ = √((k−d)/(d(k−1))), the least coherence k lines in R^d can have. Its Gram matrix is
G = I + μS with S a symmetric ±1 matrix of zero diagonal (a Seidel matrix) that has exactly two
eigenvalues, λ1 = (k/d − 1)/μ (d times) and λ2 = −1/μ: G is then (k/d) times a rank-d projector.
So the frame exists exactly when a sign matrix S satisfies

    S² − aS − bI = 0,    a = λ1 + λ2,  b = −λ1λ2  (b = k − 1),

and the search looks for one: a tabu search over the signs that minimizes the integer objective
F(S) = ‖S² − aS − bI‖²_F, which is 0 exactly at an ETF. A move flips one sign (both s_ij and s_ji).
Each step evaluates F of the current signs (a step, whether or not a move follows), stops the search
if it is 0, and otherwise makes the best move that is not tabu: after a move, the same move is tabu
for the next t − 1 moves, t = max(1, ⌊n·TENURE_FRACTION⌋) + (0, 1 or 2 at random), n the number of
possible moves, unless it reaches a new best F. The vectors are then the top-d
eigenvectors of G scaled by √(k/d): their cosines are ±μ to rounding.

Where plain sign flips stall (the conference frames (30, 15), and (36, 15)), a symmetry ansatz makes
the search space small enough: S is asked to be invariant under a permutation π of the k lines that
is a product of k // p disjoint p-cycles (p prime, the other k mod p lines fixed), and a move flips a
whole orbit of the pairs under π. The search runs a portfolio of these ansätze, p = 1 (no symmetry),
2, 3, 5, … up to k: in round r each ansatz gets BASE_SLICE·2^r moves from a fresh random sign start,
until one reaches F = 0 or the `steps` steps are spent. The frames this reaches and how many steps
they took on this project's CPU: docs/internals/packing.md.

Not every (k, d) has a real ETF. The search refuses the (k, d) where none can exist (the necessary
conditions of Sustik, Tropp, Dhillon and Heath (2007): k ≤ d(d+1)/2 and the same for the Naimark
complement (k, k − d); for k ≠ 2d and 1 < d < k − 1, 1/μ and λ1 odd integers; for k = 2d, k ≡ 2 mod 4
and k − 1 a sum of two squares). Where the conditions hold but the search ends without F = 0 (too few
`steps`, or no such frame), it returns the packing of least ε* it saw: the start, or the normalized
rows of the nearest tight frame to a sign matrix it evaluated (so no longer exactly tight); more
steps never give a larger ε*. The certificate gap of the result says how far that is from the
optimum. Each move evaluates every orbit
flip with k×k products: the search refuses k > MAX_K.
"""

from __future__ import annotations

import math
from typing import Callable, List, Tuple

import numpy as np
import torch

MAX_K = 64  # per move: n orbit flips × k³ products (n ≤ k(k−1)/2)
BASE_SLICE = 200  # moves of each ansatz in the first round; doubled every round
TENURE_FRACTION = 1 / 6  # a flipped orbit is tabu for the next t − 1 moves, t = max(1, ⌊n/6⌋) + 0…2


def seidel_spectrum(k: int, d: int) -> Tuple[float, float, float]:
    """(μ, λ1, λ2): the Welch bound and the two eigenvalues of the Seidel matrix of a k×d ETF."""
    mu = math.sqrt((k - d) / (d * (k - 1)))
    return mu, (k / d - 1) / mu, -1 / mu


def _sum_of_two_squares(n: int) -> bool:
    return any(math.isqrt(n - a * a) ** 2 == n - a * a for a in range(math.isqrt(n) + 1))


def _odd_integer(x: float) -> bool:
    return abs(x - round(x)) < 1e-9 and round(x) % 2 == 1


def etf_obstruction(k: int, d: int) -> str:
    """Why no real ETF of k lines in R^d can exist ("" when the necessary conditions hold).

    The conditions are necessary, not sufficient: "" does not promise a frame.
    """
    if k <= d:
        return f"k={k} ≤ d={d}: k orthogonal vectors pack at ε* = 0, there is no frame to search for"
    if d == 1:
        return "d=1: the lines of R^1 all coincide"
    if d == k - 1:
        return ""  # the simplex: S = −(J − I), in every dimension
    if k > d * (d + 1) // 2:
        return f"k={k} > d(d+1)/2={d * (d + 1) // 2} (Gerzon's bound on equiangular lines in R^{d})"
    if k - d >= 2 and k > (k - d) * (k - d + 1) // 2:
        return (f"k={k} > (k−d)(k−d+1)/2={(k - d) * (k - d + 1) // 2} (Gerzon's bound for the Naimark "
                f"complement in R^{k - d})")
    if k == 2 * d:
        if k % 4 != 2:
            return f"k=2d={k} is not 2 mod 4 (a symmetric conference matrix of order {k} cannot exist)"
        if not _sum_of_two_squares(k - 1):
            return f"k−1={k - 1} is not a sum of two squares (no symmetric conference matrix of order {k})"
        return ""
    mu, lam1, _ = seidel_spectrum(k, d)
    if not (_odd_integer(1 / mu) and _odd_integer(lam1)):
        return (f"1/μ={1 / mu:.6g} and λ1=(k/d−1)/μ={lam1:.6g} are not both odd integers (μ the Welch bound; "
                "required for k ≠ 2d)")
    return ""


def check_size(k: int, d: int) -> None:
    """Refuses a (k, d) with no real ETF, or k beyond MAX_K, saying why and what to use instead."""
    why = etf_obstruction(k, d)
    if why:
        raise ValueError(f"method='equiangular-search' looks for a real equiangular tight frame, and none exists "
                         f"for k={k}, d={d}: {why}; use 'minimax' or 'alternating-projection'")
    if k > MAX_K:
        raise ValueError(f"method='equiangular-search' evaluates every sign flip with k×k products each move (k⁵ "
                         f"work): k must be at most {MAX_K}, got k={k} (d={d}); use 'alternating-projection'")


def _primes(n: int) -> List[int]:
    return [p for p in range(2, n + 1) if all(p % q for q in range(2, math.isqrt(p) + 1))]


def symmetry_orbits(k: int, p: int) -> Tuple[np.ndarray, int]:
    """The orbits of the pairs {i, j} under π = k // p disjoint p-cycles (lines 0…p−1, p…2p−1, …).

    Returns (labels, n): labels[i, j] = labels[j, i] the orbit of {i, j} (−1 on the diagonal), n
    the number of orbits. p = 1 is the identity: every pair its own orbit.
    """
    perm = np.arange(k)
    for c in range(k // p):
        cycle = np.arange(c * p, (c + 1) * p)
        perm[cycle] = np.roll(cycle, -1)
    labels = np.full((k, k), -1, dtype=np.int64)
    n = 0
    for i in range(k):
        for j in range(i + 1, k):
            a, b = i, j
            while labels[a, b] < 0:
                labels[a, b] = labels[b, a] = n
                a, b = perm[a], perm[b]
            n += int(labels[i, j] == n)
    return labels, n


def _tabu(labels: np.ndarray, n: int, a: int, b: int, moves: int, rng: np.random.Generator,
          on_move: Callable[[float, torch.Tensor], bool]) -> Tuple[torch.Tensor, float]:
    """Tabu search over the orbit signs for `moves` moves; returns (best S, its F), stopping at F = 0.

    on_move(F, S) is called with each sign matrix evaluated and its F; it returns False to stop (steps
    spent), and that matrix does not count.
    """
    k = labels.shape[0]
    ii, jj = np.nonzero(labels >= 0)
    basis = torch.zeros(n, k, k, dtype=torch.float64)
    basis[torch.from_numpy(labels[ii, jj]), torch.from_numpy(ii), torch.from_numpy(jj)] = 1.0
    x = torch.from_numpy(rng.choice([-1.0, 1.0], n))
    S = torch.einsum("n,nij->ij", x, basis)
    eye = torch.eye(k, dtype=torch.float64)
    tabu_until = np.zeros(n, dtype=np.int64)
    tenure = max(1, int(n * TENURE_FRACTION))
    best_S, best = S, math.inf
    for move in range(moves):
        M = S @ S - a * S - b * eye
        F = float((M * M).sum())  # an integer, exact in float64 for k ≤ MAX_K
        if not on_move(F, S):
            break
        if F < best:
            best_S, best = S, F
        if F == 0:
            break
        flipped = S[None] - 2.0 * x[:, None, None] * basis
        Mf = flipped @ flipped - a * flipped - b * eye
        Ff = (Mf * Mf).sum((1, 2)).numpy()
        Ff[(tabu_until > move) & (Ff >= best)] = math.inf  # tabu, unless it beats the best (aspiration)
        ties = np.flatnonzero(Ff == Ff.min())
        o = int(ties[rng.integers(len(ties))])
        S = flipped[o].clone()
        x[o] = -x[o]
        tabu_until[o] = move + tenure + int(rng.integers(0, 3))
    return best_S, best


def equiangular_search(X: torch.Tensor, steps: int, seed: int, on_step: Callable[[int, float], None]) -> torch.Tensor:
    """Searches for a k×d real ETF in `steps` moves at most; returns its vectors, or the best frame seen.

    Args:
        X: the k×d seeded random start (unit rows); its rows replace any row the returned frame
            leaves out (only when no ETF was found).
        steps: sign matrices evaluated in all, ≥ 1 (a move follows each but the last).
        seed: seeds the sign starts of the portfolio (numpy's default_rng).
        on_step: called as on_step(step, F) for each move, F = ‖S² − aS − bI‖²_F at its start.

    Returns:
        torch.Tensor: k×d unit rows (float64, on X's device): the ETF when F reached 0, else the
        packing of least ε* seen: the start, or the normalized rows of the nearest tight frame to
        one of the sign matrices evaluated. More steps never give a larger ε*.
    """
    k, d = X.shape
    check_size(k, d)
    mu, lam1, lam2 = seidel_spectrum(k, d)
    a, b = round(lam1 + lam2), round(-lam1 * lam2)
    rng = np.random.default_rng(seed)
    ansatze = [symmetry_orbits(k, p) for p in [1] + _primes(k)]
    step = 0
    start = X.detach().to(device="cpu", dtype=torch.float64)
    start = start / torch.linalg.vector_norm(start, dim=1, keepdim=True)
    kept = [_coherence(start), start]  # the best packing seen, by its ε*: the start, then each step's frame

    def on_move(F: float, S: torch.Tensor) -> bool:
        nonlocal step
        if step >= steps:
            return False
        on_step(step, F)
        step += 1
        rows = _frame(S, mu, d, start)
        eps = _coherence(rows)
        if eps < kept[0] or F == 0:  # an ETF meets the Welch bound: none is better
            kept[:] = [eps, rows]
        return True

    best = math.inf
    rounds = 0
    while step < steps and best > 0:
        for labels, n in ansatze:
            best = min(best, _tabu(labels, n, a, b, BASE_SLICE << rounds, rng, on_move)[1])
            if best == 0 or step >= steps:
                break
        rounds += 1
    return kept[1].to(X.device)


def _frame(S: torch.Tensor, mu: float, d: int, start: torch.Tensor) -> torch.Tensor:
    """The unit rows of the nearest tight frame to the Gram I + μS: the top-d eigenvectors times √(k/d).

    At an ETF these are its vectors (eigenvalue k/d). A row that vanishes is replaced by start's.
    """
    k = S.shape[0]
    gram = torch.eye(k, dtype=torch.float64) + mu * S
    v = torch.linalg.eigh(gram)[1][:, k - d:] * math.sqrt(k / d)  # the top d: eigenvalue k/d at an ETF
    norms = torch.linalg.vector_norm(v, dim=1, keepdim=True)
    return torch.where(norms > 1e-8, v / norms.clamp_min(1e-300), start)


def _coherence(rows: torch.Tensor) -> float:
    """ε* = max_{i≠j} |x_i·x_j| of unit rows (float64, k ≤ MAX_K: the k×k Gram is small)."""
    g = (rows @ rows.T).abs()
    g.fill_diagonal_(0.0)
    return float(g.max())
