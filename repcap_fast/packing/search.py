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
whole orbit of the pairs under π. The search runs a portfolio of these ansätze (``portfolio``: p = 1
(no symmetry), 2, 3, 5, … up to k; above 64 lines those without fixed points first): in round r
each ansatz gets BASE_SLICE·2^r moves from a fresh random sign start,
until one reaches F = 0 or the `steps` steps are spent. The frames this reaches and how many steps
they took on this project's CPU: docs/internals/packing.md.

Not every (k, d) has a real ETF. The search refuses the (k, d) where none can exist (the necessary
conditions of Sustik, Tropp, Dhillon and Heath (2007): k ≤ d(d+1)/2 and the same for the Naimark
complement (k, k − d); for k ≠ 2d and 1 < d < k − 1, 1/μ and λ1 odd integers; for k = 2d, k ≡ 2 mod 4
and k − 1 a sum of two squares). Where the conditions hold but the search ends without F = 0 (too few
`steps`, or no such frame), it returns the packing of least ε* it saw: the start, or the normalized
rows of the nearest tight frame to a sign matrix it evaluated (so no longer exactly tight); more
steps never give a larger ε*. The certificate gap of the result says how far that is from the
optimum.

Each move forms M = S² − aS − bI once (k³) and the F of every orbit flip from M in O(m·k) for an
orbit of m pairs (``_Orbits``: a flip changes only the rows and columns of the lines it touches),
so a move costs O(k³ + n·m·k) = O(k³) in all; where n·k³ is small (DENSE_WORK) every flipped S² is
formed instead, the same integers. The F a move predicts is checked against the F formed from
scratch at the next move. The search refuses k > MAX_K: at k = 300 a move of the plain ansatz
(n = 44,850 single pairs) takes about 0.13 s and 32 MiB of gathered rows on this project's 2-core
CPU (0.02 s at k = 126), and building its orbit table about 1 s, once.
"""

from __future__ import annotations

import math
from typing import Callable, List, Tuple

import numpy as np
import torch

MAX_K = 300  # per move: k³ + n·m·k (n orbits of m pairs, n·m ≤ k(k−1)/2)
BASE_SLICE = 200  # moves of each ansatz in the first round; doubled every round
TENURE_FRACTION = 1 / 6  # a flipped orbit is tabu for the next t − 1 moves, t = max(1, ⌊n/6⌋) + 0…2
DENSE_WORK = 1 << 24  # n·k³ up to this: every flip's F from its S² at once (faster at small k than the deltas)


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
        raise ValueError(f"method='equiangular-search' evaluates every sign flip each move (about k³ work and an "
                         f"eigendecomposition of k×k): k must be at most {MAX_K}, got k={k} (d={d}); use "
                         f"'alternating-projection'")


def _primes(n: int) -> List[int]:
    return [p for p in range(2, n + 1) if all(p % q for q in range(2, math.isqrt(p) + 1))]


PORTFOLIO_REORDER_ABOVE = 64  # above this k the ansätze without fixed points come before the plain one


def portfolio(k: int) -> List[int]:
    """The cycle lengths p of the ansätze, in the order the search gives them moves.

    Up to PORTFOLIO_REORDER_ABOVE lines: 1 (no symmetry), then every prime p ≤ k in increasing
    order. Above it, where the plain search has too many signs, the cycle structures without fixed
    points come first (p dividing k, largest first: the fewest orbits; the 126 lines in R^21 have a
    symmetry group whose order 7 divides 126), then the one with a single fixed line (p = k − 1
    prime: the cyclic group of a Paley conference frame), then 1 and the other primes.
    """
    primes = _primes(k)
    if k <= PORTFOLIO_REORDER_ABOVE:
        return [1] + primes
    free = sorted((p for p in primes if k % p == 0), reverse=True)
    paley = [k - 1] if k - 1 in primes else []
    first = free + paley
    return first + [1] + [p for p in primes if p not in first]


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


class _Orbits:
    """The structure of an ansatz's orbits, for the change of F that flipping each orbit makes.

    Per orbit o: its pairs (i, j), i < j; R_o, the distinct lines its pairs touch (padded with k);
    for each line of R_o the lines it is paired with in o (padded with k); and on R_o × R_o the
    orbit's indicator B_o and its square B_o². Flipping orbit o with signs x_o changes S by
    D = c·B_o, c = −2x_o, and M = S² − aS − bI by ΔM = c(SB + BS) + c²B² − acB: rows and columns
    R_o only. With Q = MS (M and S commute, so Q is symmetric) and Y = SB (nonzero in columns R_o),

        F(S + D) − F(S) = 2⟨M, ΔM⟩ + ‖ΔM‖²,
        ⟨M, ΔM⟩ = 4c Σ_pairs Q_ij + c²⟨M, B²⟩_R − 2ac Σ_pairs M_ij,
        ‖ΔM‖² = c²(2‖Y‖² + 2 tr(Y²)) + 4c⟨Yᵀ, E⟩_R + ‖E‖²_R,   E = c²B² − acB on R × R,

    all from O(|o|·k) numbers: for an orbit of m pairs, O(m·k + m²) work instead of the k³ of
    forming the flipped S² (``deltas``).
    """

    def __init__(self, labels: np.ndarray, n: int):
        k = labels.shape[0]
        ii, jj = np.nonzero(np.triu(labels >= 0, 1))
        orbit = labels[ii, jj]
        order = np.argsort(orbit, kind="stable")
        ii, jj, orbit = ii[order], jj[order], orbit[order]
        sizes = np.bincount(orbit, minlength=n)
        m_max = int(sizes.max())
        slot = np.arange(len(orbit)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        self.k, self.n = k, n
        self.pairs_i = np.full((n, m_max), k, dtype=np.int64)  # padded with k: a zero row and column
        self.pairs_j = np.full((n, m_max), k, dtype=np.int64)
        self.pairs_i[orbit, slot], self.pairs_j[orbit, slot] = ii, jj
        starts = np.cumsum(sizes) - sizes
        spans = [(ii[s0:s0 + m].tolist(), jj[s0:s0 + m].tolist()) for s0, m in zip(starts.tolist(), sizes.tolist())]
        lines = [sorted(set(pi) | set(pj)) for pi, pj in spans]
        r_max = max(len(r) for r in lines)
        self.lines = np.full((n, r_max), k, dtype=np.int64)
        partners = [[[] for _ in range(r_max)] for _ in range(n)]
        b = np.zeros((n, r_max, r_max))
        for o, (pi, pj) in enumerate(spans):
            where = {line: r for r, line in enumerate(lines[o])}
            self.lines[o, :len(lines[o])] = lines[o]
            for i, j in zip(pi, pj):
                partners[o][where[i]].append(j)
                partners[o][where[j]].append(i)
                b[o, where[i], where[j]] = b[o, where[j], where[i]] = 1.0
        p_max = max(len(q) for row in partners for q in row)
        self.partners = np.full((n, r_max, p_max), k, dtype=np.int64)
        for o in range(n):
            for r, q in enumerate(partners[o]):
                self.partners[o, r, :len(q)] = q
        self.b = torch.from_numpy(b)
        self.b2 = torch.from_numpy(np.einsum("nrt,nts->nrs", b, b))  # B² on R × R (B is zero off R)
        self.chunk = max(1, (1 << 22) // max(1, r_max * p_max * (k + 1)))  # ~32 MiB of gathered rows
        self._basis = None  # the orbits' indicators, n×k×k, built for the dense evaluation only
        self._eye = torch.eye(k, dtype=torch.float64)
        self._pair_cache: dict = {}  # orbit → its pairs as index tensors, for the moves made
        self.dense = n * k**3 <= DENSE_WORK  # small: every flipped S² at once (batched GEMMs)

    def signs(self, x: torch.Tensor) -> torch.Tensor:
        """S for the orbit signs x."""
        S = torch.zeros(self.k + 1, self.k + 1, dtype=torch.float64)
        i, j = torch.from_numpy(self.pairs_i), torch.from_numpy(self.pairs_j)
        S[i, j] = S[j, i] = x[:, None].expand(-1, i.shape[1])
        return S[:self.k, :self.k].clone()

    def flip(self, S: torch.Tensor, x: torch.Tensor, o: int) -> torch.Tensor:
        """S with the signs of orbit o flipped (a new tensor)."""
        S = S.clone()
        i, j = self._pairs_of(o)
        S[i, j] = S[j, i] = -x[o]
        return S

    def _pairs_of(self, o: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if o not in self._pair_cache:
            keep = self.pairs_i[o] < self.k
            self._pair_cache[o] = (torch.from_numpy(self.pairs_i[o][keep]), torch.from_numpy(self.pairs_j[o][keep]))
        return self._pair_cache[o]

    def flipped_f(self, S: torch.Tensor, M: torch.Tensor, F: float, x: torch.Tensor, a: int, b: int) -> np.ndarray:
        """F of S with each orbit flipped: exact integers in float64."""
        if self.dense:
            if self._basis is None:
                basis = torch.zeros(self.n, self.k + 1, self.k + 1, dtype=torch.float64)
                rows = torch.arange(self.n)[:, None].expand(-1, self.pairs_i.shape[1])
                i, j = torch.from_numpy(self.pairs_i), torch.from_numpy(self.pairs_j)
                basis[rows, i, j] = basis[rows, j, i] = 1.0
                self._basis = basis[:, :self.k, :self.k].contiguous()
            flipped = S[None] - 2.0 * x[:, None, None] * self._basis
            Mf = flipped @ flipped - a * flipped - b * self._eye
            return (Mf * Mf).sum((1, 2)).numpy()
        return (F + self.deltas(S, M, x, a)).numpy()

    def deltas(self, S: torch.Tensor, M: torch.Tensor, x: torch.Tensor, a: int) -> torch.Tensor:
        """F(S with orbit o flipped) − F(S) for every orbit o, exact (integers in float64)."""
        k = self.k
        pad = torch.zeros(k + 1, k + 1, dtype=torch.float64)
        s_ext, m_ext, q_ext = pad.clone(), pad.clone(), pad.clone()
        s_ext[:k, :k], m_ext[:k, :k], q_ext[:k, :k] = S, M, M @ S
        out = torch.empty(self.n, dtype=torch.float64)
        for lo in range(0, self.n, self.chunk):
            hi = min(self.n, lo + self.chunk)
            c = -2.0 * x[lo:hi, None, None]
            pi, pj = torch.from_numpy(self.pairs_i[lo:hi]), torch.from_numpy(self.pairs_j[lo:hi])
            lines = torch.from_numpy(self.lines[lo:hi])
            b, b2 = self.b[lo:hi], self.b2[lo:hi]
            # Y = SB in the columns R: Y[:, R_r] = the sum of S's columns of R_r's partners (S symmetric)
            y = s_ext[torch.from_numpy(self.partners[lo:hi])].sum(2)  # (orbits, R, k + 1): row r = Y[:, R_r]
            z = torch.gather(y, 2, lines[:, None, :].expand(-1, lines.shape[1], -1))  # z[r, s] = Y[R_s, R_r]
            m_rr = m_ext[lines[:, :, None], lines[:, None, :]]
            e = c * c * b2 - a * c * b
            sum_q = q_ext[pi, pj].sum(1)[:, None, None]
            sum_m = m_ext[pi, pj].sum(1)[:, None, None]
            inner = 4 * c * sum_q + c * c * (m_rr * b2).sum((1, 2), keepdim=True) - 2 * a * c * sum_m
            y_sq = (y * y).sum((1, 2), keepdim=True)
            tr_y2 = (z * z.transpose(1, 2)).sum((1, 2), keepdim=True)
            norm = c * c * (2 * y_sq + 2 * tr_y2) + 4 * c * (z.transpose(1, 2) * e).sum((1, 2), keepdim=True) \
                + (e * e).sum((1, 2), keepdim=True)
            out[lo:hi] = (2 * inner + norm)[:, 0, 0]
        return out


def _tabu(orbits: "_Orbits", a: int, b: int, moves: int, rng: np.random.Generator,
          on_move: Callable[[float, torch.Tensor], bool]) -> Tuple[torch.Tensor, float]:
    """Tabu search over the orbit signs for `moves` moves; returns (best S, its F), stopping at F = 0.

    on_move(F, S) is called with each sign matrix evaluated and its F; it returns False to stop (steps
    spent), and that matrix does not count. Each move forms M = S² − aS − bI once (k³) and the F of
    every orbit flip from it: by the change of F (``_Orbits.deltas``, O(m·k) an orbit of m pairs),
    or, where n·k³ is small, by forming every flipped S² (``_Orbits.dense``): the same integers. The
    F predicted for the move made is checked against the F computed from scratch at the next move,
    so a drift cannot pass unseen.
    """
    k, n = orbits.k, orbits.n
    x = torch.from_numpy(rng.choice([-1.0, 1.0], n))
    S = orbits.signs(x)
    eye = torch.eye(k, dtype=torch.float64)
    tabu_until = np.zeros(n, dtype=np.int64)
    tenure = max(1, int(n * TENURE_FRACTION))
    best_S, best = S, math.inf
    predicted = None
    for move in range(moves):
        M = S @ S - a * S - b * eye
        F = float((M * M).sum())  # an integer, exact in float64 for k ≤ MAX_K
        if predicted is not None and predicted != F:
            raise RuntimeError(f"equiangular-search: the F predicted for a flip ({predicted}) is not the F computed "
                               f"after it ({F}); please report this")
        if not on_move(F, S):
            break
        if F < best:
            best_S, best = S, F
        if F == 0:
            break
        after = orbits.flipped_f(S, M, F, x, a, b)
        Ff = after.copy()
        Ff[(tabu_until > move) & (Ff >= best)] = math.inf  # tabu, unless it beats the best (aspiration)
        ties = np.flatnonzero(Ff == Ff.min())
        o = int(ties[rng.integers(len(ties))])
        predicted = float(after[o])
        S = orbits.flip(S, x, o)
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
    ansatze = {}  # built when first used: p → its orbits

    def orbits_of(p: int) -> _Orbits:
        if p not in ansatze:
            ansatze[p] = _Orbits(*symmetry_orbits(k, p))
        return ansatze[p]
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
        for p in portfolio(k):
            best = min(best, _tabu(orbits_of(p), a, b, BASE_SLICE << rounds, rng, on_move)[1])
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
