"""Top eigenpairs of a symmetric PSD d×d matrix G, with a certificate, without a full eigh when that is cheaper.

G is a Gram: WᵀW for the readout basis, xᵀx for CCR.

Method: Chebyshev-filtered block subspace iteration (Zhou & Saad, 2007). A block of s = m + p
orthonormal vectors Q is filtered by C_n(t(G)), the degree-n Chebyshev polynomial of the map
t(λ) = (2λ − c)/c that sends [0, c] to [−1, 1] (c: the block's smallest Ritz value, an estimate of
λ_s), which damps every eigenvalue below c and amplifies those above it by cosh(n·acosh t(λ)).
Q ← orth(filtered Q), then a Rayleigh–Ritz step in float64 gives Ritz pairs θ_1 ≥ … ≥ θ_s, v_i
and residuals r_i = G v_i − θ_i v_i. The iteration stops when the Davis–Kahan sin Θ theorem
certifies the top-m eigenspace U_m:

    ‖sin Θ(V_m, U_m)‖_F ≤ ‖R_m‖_F / δ,   δ = θ_m − (θ_{m+1} + ‖r_{m+1}‖),

where θ_{m+1} + ‖r_{m+1}‖ bounds λ_{m+1} from above when the block holds the eigenvectors above it
(a random start does, with probability 1). The degree of each round is capped so that the
filter amplifies the largest moving Ritz value over c by at most 1e4, so that rounding along the
top directions cannot swamp the rest; leading Ritz vectors already at float64's floor
(‖r_i‖ ≤ 1e-14·θ_1) are locked, kept out of the filter, and no longer cap its degree. The first
rounds filter in float32 (half the bytes; tensor cores on GPUs where the float32 matmul precision
allows them) until ‖R_m‖_F ≤ 1e-5·θ_1, near what float32 resolves; the rest, every Rayleigh–Ritz
step and the bound run in float64.

When the bound does not reach `angle_tol` within the work of one full `torch.linalg.eigh` (a
clustered spectrum at m, so that δ is tiny, or slow convergence), the result is that of eigh: the
work spent is lost, the answer is the same as without the iteration. A block larger than d/8 goes
to eigh directly (there the full decomposition is cheaper).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, NamedTuple

import torch

SOLVERS = ("auto", "iterate", "eigh")
ANGLE_TOL = 1e-10  # the certified ‖sin Θ‖_F at which the iteration stops
_MAX_GAIN = 1e4  # the most one filter round amplifies θ_1 over the cut
_MAX_DEGREE = 32
_LOCK = 1e-14  # a Ritz vector with ‖r_i‖ ≤ this·θ_1 is at float64's floor: locked
_FLOAT32_UNTIL = 1e-5  # filter in float32 while ‖R_m‖_F > this·θ_1 (float32 resolves about 1e-7)
_EIGH_FLOPS_PER_D3 = 10.0  # a full symmetric eigendecomposition with vectors, about 10·d³ flops
_ITERATE_BLOCK_FRACTION = 8  # iterate only when the block s ≤ d / 8


SMALL_LAPACK = 1024  # CPU LAPACK calls on matrices up to this size run on one thread


@contextlib.contextmanager
def small_lapack(device: torch.device, size: int) -> Iterator[None]:
    """Runs the block on one intra-op thread when it is a CPU LAPACK call on a matrix of at most SMALL_LAPACK rows.

    There one thread is about as fast as two on an idle machine, and on a shared one a second
    thread that waits for a busy core is what costs.
    """
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or size > SMALL_LAPACK or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class TopEigenpairs(NamedTuple):
    """The top-m eigenvalues (descending, float64) and eigenvectors (d×m, orthonormal columns, float64) of G.

    `solver` says how they were found ("subspace iteration: R rounds, P products" or "eigh", with
    the reason when eigh was a fallback); `angle_bound` is the certified bound on ‖sin Θ‖_F to the
    exact top-m eigenspace of the float64 G (NaN after eigh).
    """

    values: torch.Tensor
    vectors: torch.Tensor
    solver: str
    angle_bound: float


def block_size(m: int, d: int) -> int:
    """The block of the subspace iteration: m plus an oversampling of max(10, m/2), at most d."""
    return min(d, m + max(10, m // 2))


def top_eigenpairs(gram: torch.Tensor, m: int, *, solver: str = "auto", angle_tol: float = ANGLE_TOL,
                   seed: int = 0) -> TopEigenpairs:
    """The top-m eigenpairs of the symmetric PSD float64 matrix `gram` (d×d), 1 ≤ m < d.

    solver: "auto" (subspace iteration when the block is at most d/8, else eigh), "iterate"
    (subspace iteration, falling back to eigh when it cannot certify `angle_tol`) or "eigh".
    seed: the start block's CPU generator (the same start on every device).
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if gram.dim() != 2 or gram.shape[0] != gram.shape[1] or gram.dtype != torch.float64:
        raise ValueError(f"gram must be a square float64 matrix, got {tuple(gram.shape)} {gram.dtype}")
    d = int(gram.shape[0])
    if not 1 <= m < d:
        raise ValueError(f"m must satisfy 1 <= m < d = {d}, got {m}")
    s = block_size(m, d)
    if solver == "eigh" or (solver == "auto" and _ITERATE_BLOCK_FRACTION * s > d) or s >= d:
        return _by_eigh(gram, m, "eigh")
    return _subspace_iteration(gram, m, s, angle_tol, seed)


def _by_eigh(gram: torch.Tensor, m: int, solver: str) -> TopEigenpairs:
    """The top-m eigenpairs from a full eigh, `solver` the reason recorded."""
    with small_lapack(gram.device, gram.shape[0]):
        values, vectors = torch.linalg.eigh(gram)  # ascending
    return TopEigenpairs(values[-m:].flip(0), vectors[:, -m:].flip(1), solver, math.nan)


def _rayleigh_ritz(gram: torch.Tensor, q: torch.Tensor):
    """Ritz values (descending), Ritz vectors and residual norms of G on span(q) (float64)."""
    gq = gram @ q
    t = q.T @ gq
    with small_lapack(t.device, t.shape[0]):
        theta, w = torch.linalg.eigh(0.5 * (t + t.T))
    theta, w = theta.flip(0), w.flip(1)
    v = q @ w
    res = gq @ w - v * theta
    return theta, v, torch.linalg.vector_norm(res, dim=0)


def _chebyshev_filter(gram: torch.Tensor, x: torch.Tensor, cut: float, degree: int) -> torch.Tensor:
    """C_n(t(G)) x with t(λ) = (2λ − cut)/cut, by the three-term recurrence.

    Y_{j+1} = 2 t(G) Y_j − Y_{j−1}, Y_0 = x, Y_1 = t(G) x; each Y rescaled by the same scalar as it
    goes (directions are what matter) to stay within range.
    """
    half = 0.5 * cut

    def t_of(y):
        return (gram @ y - half * y) / half

    prev, cur = x, t_of(x)
    for _ in range(degree - 1):
        nxt = 2.0 * t_of(cur) - prev
        scale = float(torch.linalg.vector_norm(nxt)) or 1.0
        prev, cur = cur / scale, nxt / scale
    return cur


def _orthonormal(y: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (Q of a QR) of the columns of y."""
    with small_lapack(y.device, y.shape[1]):
        q, _ = torch.linalg.qr(y)
    return q


def _subspace_iteration(gram: torch.Tensor, m: int, s: int, angle_tol: float, seed: int) -> TopEigenpairs:
    """The Chebyshev-filtered subspace iteration of the module docstring, with a block of s vectors."""
    d = int(gram.shape[0])
    budget = _EIGH_FLOPS_PER_D3 * d**3
    product = 2.0 * d * d * s  # one G·Q
    round_overhead = 4.0 * d * s * s + 2 * product  # QR, and the Rayleigh–Ritz step's G·Q and Q·W
    start = torch.randn(d, s, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    q = _orthonormal(start.to(gram.device))
    gram32 = None  # the float32 copy, while the float32 phase lasts
    float32_phase = True
    spent, rounds, products = 0.0, 0, 0
    bounds = []  # the bound after each round of the current phase

    def stalled() -> bool:  # no halving over the last three rounds of this phase
        return len(bounds) >= 4 and not bounds[-1] < 0.5 * bounds[-4]

    while True:
        theta, v, res = _rayleigh_ritz(gram, q)
        spent += round_overhead
        gap = float(theta[m - 1] - theta[m] - res[m])
        residual = float(torch.linalg.vector_norm(res[:m]))
        bound = residual / gap if gap > 0 else math.inf
        bounds.append(bound)
        if bound <= angle_tol:
            return TopEigenpairs(theta[:m].clone(), v[:, :m].contiguous(),
                                 f"subspace iteration: {rounds} rounds, {products} products", bound)
        if float32_phase and (residual <= _FLOAT32_UNTIL * float(theta[0]) or stalled()):
            float32_phase, gram32, bounds = False, None, [bound]  # float64 from here on
        # Leading Ritz vectors already at the rounding floor are locked: kept as they are, so the
        # filter's gain is capped against the largest Ritz value still moving.
        locked = int(torch.cumprod(res <= _LOCK * float(theta[0]), dim=0).sum())
        locked = min(locked, m)
        cut, top = float(theta[s - 1]), float(theta[locked])
        if not (cut > 0 and top > cut):  # rank below s, or a flat block: nothing to separate
            return _by_eigh(gram, m, f"eigh (fallback: the block's Ritz values are not separated, "
                                     f"θ_{locked + 1} = {top:.3g}, θ_s = {cut:.3g})")
        degree = max(1, min(_MAX_DEGREE, int(math.acosh(_MAX_GAIN) / math.acosh((2.0 * top - cut) / cut))))
        cost = degree * product * (0.5 if float32_phase else 1.0)
        if spent + cost > budget or (not float32_phase and stalled()):
            why = "the bound stalled" if stalled() else "no certificate within the work of eigh"
            return _by_eigh(gram, m, f"eigh (fallback: {why}; bound {bound:.1e} > {angle_tol:.0e} after "
                                     f"{rounds} rounds)")
        active = v[:, locked:]
        if float32_phase:
            if gram32 is None:
                gram32 = gram.to(torch.float32)
            y = _chebyshev_filter(gram32, active.to(torch.float32), cut, degree).to(torch.float64)
        else:
            y = _chebyshev_filter(gram, active, cut, degree)
        spent += cost * (s - locked) / s
        q = _orthonormal(torch.cat([v[:, :locked], y], dim=1))
        rounds += 1
        products += degree
