"""The equiangular-frame search (``packing.optimize(method="equiangular-search")``).

A real equiangular tight frame (ETF) of k lines in R^d meets the Welch bound
μ = √((k−d)/(d(k−1))), the least coherence k lines in R^d can have. Its Gram matrix is
G = I + μS with S a symmetric ±1 matrix of zero diagonal (a Seidel matrix) that has exactly two
eigenvalues, λ1 = (k/d − 1)/μ (d times) and λ2 = −1/μ: G is then (k/d) times a rank-d projector.
So the frame exists exactly when a sign matrix S satisfies

    S² − aS − bI = 0,    a = λ1 + λ2,  b = −λ1λ2  (b = k − 1),

and the search looks for one, minimizing the integer F(S) = ‖S² − aS − bI‖²_F, which is 0 exactly
at an ETF. The vectors are then the top-d eigenvectors of G scaled by √(k/d): their cosines are ±μ
to rounding.

The search looks among the S invariant under a symmetry group (an ansatz, ``packing.ansatz``: one
sign per orbit of the group on the pairs of lines, and a move flips a whole orbit), over a
portfolio of ansätze, in slices:

1. every ansatz of at most EXHAUSTIVE_BITS orbits, fewest first: all its 2^n sign patterns, in
   Gray-code order (one flip a step). This finds every Paley conference frame (3 orbits for prime
   k − 1, 9 for k − 1 = 49) and the frames of the unitary two-graphs (28 and 126 lines, 4 and 5
   orbits), and proves the small ansätze empty.
2. then rounds r = 0, 1, …: each other ansatz that fixes at most one line gets BASE_SLICE·2^r moves
   of tabu search from a fresh random sign start, fewest orbits first; from round LATER_BY on, the
   ansätze that fix more lines get BASE_SLICE·2^(r − LATER_BY) moves each after them (in the
   prototype runs every frame fell to an ansatz with at most one fixed line). Each step evaluates
   F of the current signs (a step, whether or not a move follows), stops the search if it is 0,
   and otherwise makes the best move that is not tabu: after a move, the same move is tabu for the
   next t − 1 moves, t = max(1, ⌊n·TENURE_FRACTION⌋) + (0, 1 or 2 at random), n the number of
   orbits, unless it reaches a new best F.

until a slice reaches F = 0 or the `steps` steps are spent. Slice j draws its random numbers from
numpy's default_rng([seed, j]) and uses exactly its moves unless it finds a frame, so each slice's
first step is known in advance: after PARALLEL_AFTER_S seconds in this process, the slices run in
parallel processes where the machine has cores to spare (``workers``; forked, Linux), and the
result for a seed is the same for any number of them.
The frames this reaches and how many steps and seconds they took on this project's CPU:
docs/internals/packing.md.

Not every (k, d) has a real ETF. The search refuses the (k, d) where none can exist (the necessary
conditions of Sustik, Tropp, Dhillon and Heath (2007): k ≤ d(d+1)/2 and the same for the Naimark
complement (k, k − d); for k ≠ 2d and 1 < d < k − 1, 1/μ and λ1 odd integers; for k = 2d, k ≡ 2 mod 4
and k − 1 a sum of two squares). Where the conditions hold but the search ends without F = 0 (too few
`steps`, or no frame in its ansätze), it returns the packing of least ε* it saw: the start, or the
normalized rows of the nearest tight frame to a sign matrix it evaluated (so no longer exactly
tight); more steps never give a larger ε*. The certificate gap of the result says how far that is
from the optimum.

Each move forms M = S² − aS − bI once (k³) and the F of every orbit flip from M in O(m·k + r²) for
an orbit of m pairs on r lines (``ansatz._Orbits``: a flip changes only the rows and columns of the
lines it touches), so a move costs O(k³ + Σ r²) in all; where n·k³ is small (DENSE_WORK) every
flipped S² is formed instead, the same integers. The F a move predicts is checked against the F
formed from scratch at the next move. Each step also forms the nearest tight frame (an eigh of
k×k) to keep the best packing. The search refuses k > MAX_K: on this project's 2-core CPU a move
took 0.5 ms at k = 36, 6 to 7 ms at k = 126 and 0.09 to 0.1 s at k = 300 (the plain ansatz,
44,850 single pairs, sixty 5-cycles, one 151-cycle). Memory: an ansatz's orbit table holds about
Σ r² + Σ m numbers (256 MiB at most at k = 300, for two 149-cycles; 5 MiB for the plain ansatz;
built in at most 0.7 s), a move gathers at most about 32 MiB of rows, and each process keeps the
tables of the ansätze it ran last up to ORBIT_CACHE_BYTES (512 MiB), rebuilding the others. Without
`steps`, the search takes ``default_steps(k)``: about the same wall time at every k.
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .ansatz import Ansatz, _Orbits, portfolio

MAX_K = 300  # per move: k³ + n·m·k (n orbits of m pairs, n·m ≤ k(k−1)/2)
BASE_SLICE = 200  # moves of each ansatz in the first round; doubled every round
LATER_BY = 2  # the ansätze that fix more than one line: their rounds start this many rounds later
TENURE_FRACTION = 1 / 6  # a flipped orbit is tabu for the next t − 1 moves, t = max(1, ⌊n/6⌋) + 0…2
EXHAUSTIVE_BITS = 10  # ansätze of at most this many orbits: every sign pattern, once, before the tabu rounds
PARALLEL_AFTER_S = 5.0  # slices run in this process for this long; the rest in `workers` processes
MAX_WORKERS = 8
ORBIT_CACHE_BYTES = 1 << 29  # the orbit tables a process keeps for later rounds (beyond: rebuilt, ≤ 0.7 s at k = 300)
DEFAULT_STEPS = 100_000  # when none are given, up to DEFAULT_STEPS_UP_TO lines (``default_steps``)
DEFAULT_STEPS_UP_TO = 64
WORKERS_ENV = "REPCAP_SEARCH_WORKERS"  # the number of processes, overriding the usable cores (1: none)


def default_steps(k: int) -> int:
    """The steps of the search when none are given.

    DEFAULT_STEPS up to DEFAULT_STEPS_UP_TO lines, then fewer as k³ grows (a move costs about k³),
    DEFAULT_STEPS·(DEFAULT_STEPS_UP_TO/k)³ rounded up: about the same wall time at every k, a few
    minutes on this project's 2-core CPU when no frame is found. The search stops at the first
    frame, so these are at most the steps it takes.
    """
    return min(DEFAULT_STEPS, math.ceil(DEFAULT_STEPS * (DEFAULT_STEPS_UP_TO / k) ** 3))


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


def workers() -> int:
    """The processes the search's slices run in (the result does not depend on it).

    $REPCAP_SEARCH_WORKERS, else the usable cores (at most MAX_WORKERS) on Linux, else 1.
    """
    env = os.environ.get(WORKERS_ENV)
    if env is not None:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be an integer number of processes, got {env!r}") from None
        if n < 1:
            raise ValueError(f"{WORKERS_ENV} must be at least 1, got {n} (1: no worker processes)")
        return n
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _tabu(orbits: _Orbits, a: int, b: int, moves: int, rng: np.random.Generator,
          on_move: Callable[[float, torch.Tensor], bool]) -> None:
    """Tabu search over the orbit signs for `moves` moves, stopping at F = 0.

    on_move(F, S) is called with each sign matrix evaluated and its F; it returns False to stop (steps
    spent), and that matrix does not count. Each move forms M = S² − aS − bI once (k³) and the F of
    every orbit flip from it: by the change of F (``_Orbits.deltas``, O(m·k + r²) an orbit of m pairs on r lines),
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
    best = math.inf
    predicted = None
    for move in range(moves):
        M = S @ S - a * S - b * eye
        F = float((M * M).sum())  # an integer, exact in float64 for k ≤ MAX_K
        if predicted is not None and predicted != F:
            raise RuntimeError(f"equiangular-search: the F predicted for a flip ({predicted}) is not the F computed "
                               f"after it ({F}); please report this")
        if not on_move(F, S) or F == 0:
            return
        best = min(best, F)
        after = orbits.flipped_f(S, M, F, x, a, b)
        Ff = after.copy()
        Ff[(tabu_until > move) & (Ff >= best)] = math.inf  # tabu, unless it beats the best (aspiration)
        ties = np.flatnonzero(Ff == Ff.min())
        o = int(ties[rng.integers(len(ties))])
        predicted = float(after[o])
        S = orbits.flip(S, x, o)
        x[o] = -x[o]
        tabu_until[o] = move + tenure + int(rng.integers(0, 3))


def _exhaust(orbits: _Orbits, a: int, b: int, rng: np.random.Generator,
             on_move: Callable[[float, torch.Tensor], bool]) -> None:
    """Every one of the 2^n orbit sign patterns, stopping at F = 0.

    From a random pattern, in Gray-code order (one orbit flipped a step); on_move as for ``_tabu``.
    """
    k, n = orbits.k, orbits.n
    x = torch.from_numpy(rng.choice([-1.0, 1.0], n))
    S = orbits.signs(x)
    eye = torch.eye(k, dtype=torch.float64)
    for i in range(1 << n):
        if i:
            o = (i & -i).bit_length() - 1  # the Gray code's next flip
            S = orbits.flip(S, x, o)
            x[o] = -x[o]
        M = S @ S - a * S - b * eye
        F = float((M * M).sum())
        if not on_move(F, S) or F == 0:
            return


@dataclass(frozen=True)
class _Slice:
    index: int  # its place in the schedule: seeds its random numbers
    ansatz: Ansatz
    kind: str  # "exhaustive" or "tabu"
    moves: int  # the steps it may take (its share of `steps`)


def schedule(k: int, steps: int) -> Iterator[_Slice]:
    """The slices of the search for k lines, in order, until `steps` steps are handed out (module docstring)."""
    ansatze = portfolio(k)
    sizes = {x: x.size() for x in ansatze}
    small = sorted((x for x in ansatze if sizes[x] <= EXHAUSTIVE_BITS), key=sizes.get)
    rest = [x for x in ansatze if sizes[x] > EXHAUSTIVE_BITS]
    first = sorted((x for x in rest if x.fixed <= 1), key=sizes.get)
    later = sorted((x for x in rest if x.fixed > 1), key=sizes.get)

    def slices():
        for x in small:
            yield x, "exhaustive", 1 << sizes[x]
        r = 0
        while rest:
            for x in first:
                yield x, "tabu", BASE_SLICE << r
            if r >= LATER_BY:
                for x in later:
                    yield x, "tabu", BASE_SLICE << (r - LATER_BY)
            r += 1
    used = 0
    for index, (x, kind, moves) in enumerate(slices()):
        if used >= steps:
            return
        take = min(moves, steps - used)
        used += take
        yield _Slice(index, x, kind, take)


@dataclass
class _Outcome:
    fs: List[float]  # F at each step of the slice
    eps: float  # the least ε* of its steps' frames (inf when it took none)
    rows: Optional[np.ndarray]  # that frame (the ETF where F reached 0)


class _Job:
    """One search's fixed data; ``run`` runs a slice of it (in this process or a worker)."""

    def __init__(self, k: int, d: int, seed: int, start: torch.Tensor):
        self.k, self.d, self.seed, self.start = k, d, seed, start
        self.mu, lam1, lam2 = seidel_spectrum(k, d)
        self.a, self.b = round(lam1 + lam2), round(-lam1 * lam2)
        self._orbits: Dict[Ansatz, _Orbits] = {}  # built when used, kept while they fit ORBIT_CACHE_BYTES

    def __getstate__(self):
        return {**self.__dict__, "_orbits": {}}  # a worker builds its own

    def run(self, task: _Slice, on_f: Optional[Callable[[float], None]] = None) -> _Outcome:
        orbits = self._orbits.pop(task.ansatz, None) or _Orbits(*task.ansatz.orbits())
        self._orbits[task.ansatz] = orbits  # the most recent last; the oldest go beyond ORBIT_CACHE_BYTES
        while sum(o.nbytes for o in self._orbits.values()) > ORBIT_CACHE_BYTES and len(self._orbits) > 1:
            del self._orbits[next(iter(self._orbits))]
        out = _Outcome([], math.inf, None)

        def on_move(F: float, S: torch.Tensor) -> bool:
            if len(out.fs) >= task.moves:
                return False
            out.fs.append(F)
            if on_f is not None:
                on_f(F)
            rows = _frame(S, self.mu, self.d, self.start)
            eps = _coherence(rows)
            if eps < out.eps or F == 0:  # an ETF meets the Welch bound: none is better
                out.eps, out.rows = eps, rows.numpy()
            return True
        rng = np.random.default_rng([self.seed, task.index])
        (_exhaust(orbits, self.a, self.b, rng, on_move) if task.kind == "exhaustive"
         else _tabu(orbits, self.a, self.b, task.moves, rng, on_move))
        return out


_WORKER_JOB: List[_Job] = []  # a worker process's job, set once by its initializer


def _worker_init(job: _Job) -> None:
    torch.set_num_threads(1)  # the processes share the cores
    _WORKER_JOB[:] = [job]


def _worker_run(task: _Slice) -> _Outcome:
    return _WORKER_JOB[0].run(task)


def equiangular_search(X: torch.Tensor, steps: int, seed: int, on_step: Callable[[int, float], None]) -> torch.Tensor:
    """Searches for a k×d real ETF in `steps` steps at most; returns its vectors, or the best frame seen.

    Args:
        X: the k×d seeded random start (unit rows); its rows replace any row the returned frame
            leaves out (only when no ETF was found).
        steps: sign matrices evaluated in all, ≥ 1 (a move follows each but the last).
        seed: seeds the slices' sign starts and tie-breaks (numpy's default_rng([seed, slice])).
        on_step: called as on_step(step, F) for each step in order, F = ‖S² − aS − bI‖²_F of its
            signs (after each slice where the slices run in worker processes).

    Returns:
        torch.Tensor: k×d unit rows (float64, on X's device): the ETF when F reached 0, else the
        packing of least ε* seen: the start, or the normalized rows of the nearest tight frame to
        one of the sign matrices evaluated. More steps never give a larger ε*.
    """
    k, d = X.shape
    check_size(k, d)
    start = X.detach().to(device="cpu", dtype=torch.float64)
    start = start / torch.linalg.vector_norm(start, dim=1, keepdim=True)
    processes = workers()  # a bad $REPCAP_SEARCH_WORKERS is refused before any work
    job = _Job(k, d, seed, start)
    kept = [_coherence(start), start.numpy()]  # the best packing seen, by its ε*
    step = [0]

    def count(F: float) -> None:
        on_step(step[0], F)
        step[0] += 1

    def merge(out: _Outcome, replay: bool) -> bool:
        """Takes a slice's outcome, in schedule order; True when it found the frame."""
        if replay:
            for F in out.fs:
                count(F)
        if out.rows is not None and (out.eps < kept[0] or out.fs[-1] == 0):
            kept[:] = [out.eps, out.rows]
        return bool(out.fs) and out.fs[-1] == 0

    tasks = schedule(k, steps)
    began = time.perf_counter()
    for task in tasks:
        if merge(job.run(task, count), replay=False):
            return torch.from_numpy(kept[1]).to(X.device)
        if time.perf_counter() - began > PARALLEL_AFTER_S and processes > 1:
            _run_in_workers(job, tasks, merge, processes)
            break
    return torch.from_numpy(kept[1]).to(X.device)


def _run_in_workers(job: _Job, tasks: Iterator[_Slice], merge: Callable[[_Outcome, bool], bool], n: int) -> None:
    """Runs the remaining slices in n forked processes, 2 per process in flight, merging them in order."""
    with multiprocessing.get_context("fork").Pool(n, initializer=_worker_init, initargs=(job,)) as pool:
        pending = collections.deque()
        for task in tasks:
            pending.append(pool.apply_async(_worker_run, (task,)))
            while len(pending) >= 2 * n:
                if merge(pending.popleft().get(), True):
                    return  # the pool is terminated on leaving the block
        while pending:
            if merge(pending.popleft().get(), True):
                return


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
