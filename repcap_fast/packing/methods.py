"""The optimizers behind ``packing.optimize(method=...)``, and the active-set polish.

They drive k unit vectors in R^d to a small coherence ε* = max_{i≠j}|ĝ_ij|. The kernels they call
live in ``repcap_fast.ops``.

Methods (``METHODS``):

* ``"paper"``: the published algorithm (Guha 2026, §1.3), bit for bit: Adam (torch.optim.Adam) on
  the raw k×d parameters, the loss Σ_{i≠j}|ĝ_ij|^p at the fixed p = min(int(m/ln d), 20) of the
  row-normalized parameters. It is run by ``packing.optimize`` itself.
* ``"p-continuation"``: the same Adam on the raw parameters, but on (1/p)·ln Σ|ĝ_ij|^p with p
  growing geometrically from ``p_start`` to ``p_end`` over the run (so the objective approaches
  ln max|ĝ|), and the learning rate decaying geometrically to ``LR_END_FRACTION`` of lr. The log
  keeps the gradient representable at any p (``gram_offdiag_log_penalty``; Σ|ĝ|^64 underflows).
* ``"smooth-max"``: T·ln Σ_{i≠j} exp(|ĝ_ij|/T), a log-sum-exp of the |ĝ_ij|, at a temperature
  annealed as T = ε*/q with the sharpness q growing geometrically from ``p_start`` to ``p_end``
  (ε* of the previous step), by Riemannian Adam on the sphere. Streamed by PyTorch in row blocks
  (b×k Gram tiles, never k×k), not by a compiled kernel.
* ``"riemannian"``: the p-continuation objective by Riemannian Adam on the sphere: the rows stay
  unit, the gradient is the tangent one (the kernel's chain rule through the normalization at
  unit rows), Adam's first moment is carried to the new tangent spaces by projection, its second
  moment is one number per row (the sphere of each row is one factor of the product manifold),
  and each step is retracted by normalizing.
* ``"minimax"``: ``"riemannian"`` followed by ``polish_steps`` of the active-set polish below.
* ``"alternating-projection"``: Tropp, Dhillon, Heath and Strohmer's alternating projection between
  the Gram matrices with |ĝ_ij| ≤ μ and the tight frames, μ annealed to the best lower bound
  (``repcap_fast.packing.projection``): it reaches equiangular tight frames that the gradient
  methods miss. No p, p_start or lr; k ≤ ``packing.projection.MAX_K``; float64, O(k³) per step.
* ``"equiangular-search"``: a combinatorial search for the Seidel sign matrix of a real equiangular
  tight frame (``repcap_fast.packing.search``): where it succeeds, ε* is the Welch bound to rounding.
  Only for the (k, d) where such a frame can exist, k ≤ ``packing.search.MAX_K``; a step evaluates
  one sign matrix (and flips the signs of one orbit of pairs), and the search stops at the first
  frame; its default steps depend on k (``packing.search.default_steps``). No p, p_start or lr.

The active-set polish (any method, ``polish_steps`` > 0): sequential linear programming on the
pairs near the maximum. Each step linearizes ĝ_ij(x + δ) ≈ ĝ_ij + x̂_j·δ_i + x̂_i·δ_j for the pairs
with |ĝ_ij| ≥ ε* − τ, where τ = 2r√d + d·r² bounds how much any pair can move under a step with
|δ_ic| ≤ r (so no pair outside the band can reach the maximum; at most MAX_POLISH_PAIRS of them,
the largest), and solves the linear program
min t subject to sign(ĝ_ij)·(linearized ĝ_ij) ≤ t, x̂_i·δ_i = 0 (tangent), |δ_ic| ≤ r (SciPy's
HiGHS). The step is retracted (rows normalized) and kept only when the true ε* drops; the trust
radius r doubles after a step that achieved more than 3/4 of the predicted drop, stays after one
that achieved more than 1/4, and shrinks otherwise. In float64, on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from .. import _validation as val
from ..coherence_bounds import coherence_bound
from ..ops.gram_offdiag_penalty import gram_offdiag_log_penalty, gram_offdiag_max
from . import projection, search

METHODS = ("paper", "p-continuation", "smooth-max", "riemannian", "minimax", "alternating-projection",
           "equiangular-search")
NO_P = ("alternating-projection", "equiangular-search")  # methods without an exponent, a p_start or a learning rate
DEFAULT_P_START = 4
DEFAULT_P_END = 1024
DEFAULT_POLISH_STEPS = 40
DEFAULT_STEPS = 5000  # the paper's
LR_END_FRACTION = 0.01  # the continuation methods decay lr geometrically to this fraction of it
CONTINUATION_LR_FACTOR = 2.0  # their first lr: twice the paper's (0.01 for d ≤ 1024), measured in the README
_ADAM_BETAS = (0.9, 0.999)
_EXP_FLOOR = -80.0  # smooth-max: exp of anything lower is a float32 subnormal (exp(−87.3) is the least normal)
_ADAM_EPS = 1e-12  # the log objectives have gradients of order 1/ε*: no need for the paper's 1e-8


@dataclass(frozen=True)
class MethodSettings:
    """One packing method and its settings, as recorded with every result and sweep cell.

    p_start, p_end: the continuation's first and last p (the sharpness q of "smooth-max"); equal
    for "paper" (its fixed p). polish_steps: active-set polish steps after the optimizer.
    """

    method: str
    p_start: int
    p_end: int
    polish_steps: int

    def to_dict(self) -> dict:
        """The settings as a sweep cell records them (p_end under the name "p")."""
        return {"method": self.method, "p_start": self.p_start, "p": self.p_end, "polish_steps": self.polish_steps}


class PackingDiverged(RuntimeError):
    """The optimizer's vectors became NaN/Inf or collapsed to zero.

    The cause: too large an lr for the dtype, or a dtype too narrow. Served as
    ``repcap_fast.packing.PackingDiverged``.
    """


class RowsCollapsed(PackingDiverged):
    """check_rows_alive's PackingDiverged: packing.optimize adds the run's settings and lr to it."""


def check_rows_alive(rows: torch.Tensor, step: int) -> None:
    """Raises PackingDiverged when a row of the optimizer's vectors is NaN/Inf, beyond its dtype, or zero.

    The rows are unit rows, or Adam's raw parameters; such a row comes from a step too large for
    the dtype (their normalization would give NaN or zero rows, refused later as bad input).
    """
    norms = torch.linalg.vector_norm(rows, dim=1)
    alive = torch.isfinite(norms) & (norms > 0)
    if not bool(alive.all()):
        n_bad = int((~alive).sum())
        raise RowsCollapsed(f"packing diverged at step {step}: {n_bad} of the {rows.shape[0]} vectors became NaN/Inf "
                              f"or zero (a step beyond the range of {str(rows.dtype).replace('torch.', '')})")


def check_method(method, p: Optional[int], p_start, polish_steps, paper_p: int, check_p) -> MethodSettings:
    """The settings of `method` (a name of METHODS), checked, with their defaults filled in.

    p is the paper's fixed p ("paper"; default `paper_p`) or the continuation's last p (default
    DEFAULT_P_END); p_start the first (default DEFAULT_P_START, at most p); polish_steps (default
    DEFAULT_POLISH_STEPS for "minimax", else 0).
    """
    val.check_choice(method, "method", METHODS)
    if method in NO_P:
        for name, value in (("p", p), ("p_start", p_start)):
            if value is not None:
                raise ValueError(f"{name} does not apply to method={method!r} (it has no exponent)")
        polish = 0 if polish_steps is None else val.check_int(polish_steps, "polish_steps", 0)
        return MethodSettings(method, 1, 1, polish)
    if method == "paper":
        if p_start is not None:
            raise ValueError("p_start applies to the continuation methods, not method='paper' (its p is fixed)")
        p = paper_p if p is None else check_p(p)
        polish = 0 if polish_steps is None else val.check_int(polish_steps, "polish_steps", 0)
        return MethodSettings(method, p, p, polish)
    p_end = DEFAULT_P_END if p is None else check_p(p)
    if p_start is None:
        start = min(DEFAULT_P_START, p_end)
    else:
        start = val.check_int(p_start, "p_start", 1)
    if start > p_end:
        raise ValueError(f"p_start must be at most p (the last p of the continuation), got p_start={start}, p={p_end}")
    default_polish = DEFAULT_POLISH_STEPS if method == "minimax" else 0
    polish = default_polish if polish_steps is None else val.check_int(polish_steps, "polish_steps", 0)
    return MethodSettings(method, start, p_end, polish)


def check_sizes(method: str, k: int, d: int, projection_steps: int = 0) -> None:
    """Refuses a (k, d) that `method` or the alternating-projection polish cannot run, before anything runs.

    The matrix methods (alternating projection, the equiangular search) and the polish have size
    limits (and the search needs a (k, d) where a real equiangular tight frame can exist); the
    other methods have none here.
    """
    if method == "alternating-projection":
        projection.check_size(k, d)
    elif method == "equiangular-search":
        search.check_size(k, d)
    if projection_steps:
        projection.check_size(k, d, "projection_steps")


def default_steps(method: str, k: int) -> int:
    """The steps of `method` when none are given.

    DEFAULT_STEPS (the paper's 5000), and for "equiangular-search", which stops at the first frame,
    ``search.default_steps(k)``.
    """
    return search.default_steps(k) if method == "equiangular-search" else DEFAULT_STEPS


def default_lr(method: str, paper_lr: float) -> float:
    """The learning rate of `method` when none is given.

    It is the paper's for "paper", 0 for the methods without one (NO_P), else
    CONTINUATION_LR_FACTOR times it (the first lr of the decaying schedule).
    """
    if method in NO_P:
        return 0.0
    return paper_lr if method == "paper" else CONTINUATION_LR_FACTOR * paper_lr


def p_at(step: int, steps: int, p_start: int, p_end: int) -> int:
    """The continuation's p at `step` of `steps`: geometric from p_start to p_end, rounded."""
    if steps <= 1 or p_start == p_end:
        return p_end
    return int(round(p_start * (p_end / p_start) ** (step / (steps - 1))))


def lr_at(step: int, steps: int, lr: float) -> float:
    """The continuation methods' learning rate: geometric from lr to LR_END_FRACTION·lr."""
    if steps <= 1:
        return lr
    return lr * LR_END_FRACTION ** (step / (steps - 1))


# ------------------------------------------------------------------------------ objectives


def log_power_objective(X: torch.Tensor, p: int, backend: str, precision: str) -> Tuple[float, torch.Tensor]:
    """(1/p)·ln Σ_{i≠j}|ĝ_ij|^p and its gradient with respect to X, from the fused penalty kernel.

    The gradient is taken through the normalization of the rows.
    """
    log_loss, grad = gram_offdiag_log_penalty(X, p, backend=backend, precision=precision)
    return log_loss / p, grad.div_(p)


def _block_rows(k: int, elements: int = 1 << 22) -> int:
    return max(1, min(k, elements // max(1, k)))


def smooth_max_objective(X: torch.Tensor, temperature: float) -> Tuple[float, torch.Tensor, float]:
    """(T·ln Σ_{i≠j} exp(|ĝ_ij|/T), its tangent gradient, max|ĝ_ij|) for unit rows X.

    Streamed in row blocks of b×k Gram entries (never k×k). Per row i with m_i = max_{j≠i}|ĝ_ij|:
    s_i = Σ_j exp((|ĝ_ij| − m_i)/T) ≤ k, ln Z = logsumexp_i
    (m_i/T + ln s_i), and ∂(T ln Z)/∂x̂_i = 2·exp(m_i/T − ln Z)·Σ_j sign(ĝ_ij) exp((|ĝ_ij| − m_i)/T) x̂_j
    (every pair is counted as (i, j) and (j, i)), projected onto the tangent space at x̂_i.
    """
    k = X.shape[0]
    rows = _block_rows(k)
    grad = torch.empty_like(X)
    log_rows = torch.empty(k, dtype=torch.float64, device=X.device)
    row_max = torch.empty(k, dtype=X.dtype, device=X.device)
    for r0 in range(0, k, rows):
        r1 = min(k, r0 + rows)
        g = X[r0:r1] @ X.T
        idx = torch.arange(r1 - r0, device=X.device)
        g[idx, r0 + idx] = 0.0
        w = g.abs()
        m = w.amax(dim=1, keepdim=True)
        # in place (one b×k buffer besides g); exponents below −80 clamped, so that exp never forms a
        # float32 subnormal (slow on x86): those terms are < 2e-35 of the row's largest, 1
        w.sub_(m).mul_(1.0 / temperature).clamp_(min=_EXP_FLOOR).exp_()
        w[idx, r0 + idx] = 0.0
        s = w.sum(dim=1).to(torch.float64)  # terms in (0, 1], at least one 1: float32 sums are exact to 1e-7
        grad[r0:r1] = g.sign_().mul_(w) @ X
        row_max[r0:r1] = m.squeeze(1)
        log_rows[r0:r1] = m.squeeze(1).to(torch.float64) / temperature + torch.log(s)
    log_z = torch.logsumexp(log_rows, 0)
    coef = 2.0 * torch.exp(row_max.to(torch.float64) / temperature - log_z)
    grad.mul_(coef.to(X.dtype)[:, None])
    grad.sub_(X * (grad * X).sum(dim=1, keepdim=True))
    return float(temperature * log_z), grad, float(row_max.max())


# ------------------------------------------------------------------------------ optimizers


class RiemannianAdam:
    """Adam on a product of unit spheres (one per row of X), as in Bécigneul & Ganea (2019).

    The tangent gradient updates the first moment, one second moment per row (the mean square of
    its tangent gradient), the step is retracted by normalizing the rows, and the first moment is
    carried to the new tangent spaces by projection. X is updated in place and stays unit.
    """

    def __init__(self, X: torch.Tensor, betas=_ADAM_BETAS, eps: float = _ADAM_EPS):
        self.X = X
        self.betas = betas
        self.eps = eps
        self.m = torch.zeros_like(X)
        self.v = torch.zeros(X.shape[0], 1, dtype=X.dtype, device=X.device)
        self.t = 0

    def step(self, grad: torch.Tensor, lr: float) -> None:
        """One Adam step along the tangent part of `grad` with learning rate `lr`, X retracted."""
        b1, b2 = self.betas
        X = self.X
        self.t += 1
        grad = grad - X * (grad * X).sum(dim=1, keepdim=True)  # tangent (a no-op for tangent input)
        self.m.mul_(b1).add_(grad, alpha=1 - b1)
        self.v.mul_(b2).add_(grad.pow(2).mean(dim=1, keepdim=True), alpha=1 - b2)
        m_hat = self.m / (1 - b1**self.t)
        v_hat = self.v / (1 - b2**self.t)
        X.sub_(lr * m_hat / (v_hat.sqrt() + self.eps))
        X.div_(torch.linalg.vector_norm(X, dim=1, keepdim=True))
        self.m.sub_(X * (self.m * X).sum(dim=1, keepdim=True))


def run_optimizer(settings: MethodSettings, X: torch.Tensor, steps: int, lr: float, backend: str, precision: str,
                  eps_start: float, on_step: Callable[[int, float], None], seed: int = 0) -> torch.Tensor:
    """Runs the optimizer of a continuation method (every method but "paper") for `steps` steps.

    It starts from the unit rows X and calls `on_step(step, objective)` after each step; returns
    the final rows. The steps' kernel runs at `precision`; at a reduced one the objective reported
    for the first and the last step is evaluated again at "highest" (the same rows, before that
    step's update). `seed` seeds the sign starts of "equiangular-search".
    """
    method = settings.method
    if method == "equiangular-search":
        return search.equiangular_search(X, steps, seed, on_step)
    if method == "alternating-projection":
        k, d = X.shape
        return projection.alternating_projection(X, steps, coherence_bound(k, d)[0], on_step)

    def reported(value: float, rows: torch.Tensor, p: int, step: int) -> float:
        if precision == "highest" or step not in (0, steps - 1):
            return value
        return log_power_objective(rows, p, backend, "highest")[0]

    if method == "p-continuation":  # Adam on the raw parameters, as the paper
        param = X.clone().requires_grad_(True)
        opt = torch.optim.Adam([param], lr=lr, eps=_ADAM_EPS)
        for step in range(steps):
            p = p_at(step, steps, settings.p_start, settings.p_end)
            value, grad = log_power_objective(param.detach(), p, backend, precision)
            value = reported(value, param.detach(), p, step)
            param.grad = grad.to(param.dtype)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr)
            opt.step()
            check_rows_alive(param.detach(), step)
            on_step(step, value)
        out = param.detach()
        return out / torch.linalg.vector_norm(out, dim=1, keepdim=True)
    X = X.clone()
    opt = RiemannianAdam(X)
    eps_now = eps_start
    for step in range(steps):
        q = p_at(step, steps, settings.p_start, settings.p_end)
        if method == "smooth-max":
            value, grad, eps_now = smooth_max_objective(X, max(eps_now, 1e-12) / q)
        else:
            value, grad = log_power_objective(X, q, backend, precision)
            value = reported(value, X, q, step)
        opt.step(grad, lr_at(step, steps, lr))
        check_rows_alive(X, step)
        on_step(step, value)
    return X


# ------------------------------------------------------------------------------ the polish


def _pairs_above(X: torch.Tensor, threshold: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, ĝ_ij) of the pairs i < j with |ĝ_ij| ≥ threshold, streamed in row blocks."""
    k = X.shape[0]
    rows = _block_rows(k)
    found_i: List[torch.Tensor] = []
    found_j: List[torch.Tensor] = []
    found_g: List[torch.Tensor] = []
    for r0 in range(0, k, rows):
        r1 = min(k, r0 + rows)
        g = X[r0:r1] @ X.T
        g = torch.triu(g, diagonal=r0 + 1)  # keeps j ≥ i + 1 for the block's rows i = r0 + row
        i, j = torch.nonzero(g.abs() >= threshold, as_tuple=True)
        found_i.append(i + r0)
        found_j.append(j)
        found_g.append(g[i, j])
    return (torch.cat(found_i).numpy(), torch.cat(found_j).numpy(), torch.cat(found_g).numpy())


# The pairs a polish step linearizes: those of the band, at most this many (the largest |ĝ|). HiGHS
# took 0.1 s for 100 pairs, 0.6 s for 300, 10 s for 1000 and over 30 s for 3000 (k = 200, d = 16,
# a degenerate LP: many pairs sit at nearly the same |ĝ|), so the polish is a tool for the last
# digits of small and medium packings; a step that lets a pair outside rise above ε* is refused.
MAX_POLISH_PAIRS = 300
_LP_SECONDS = 10.0  # a linear program not solved in this time counts as failed (the radius shrinks)


def polish(X: torch.Tensor, steps: int, on_step: Optional[Callable[[int, float], None]] = None) -> torch.Tensor:
    """The active-set polish (module docstring) for `steps` linear programs on the unit rows X.

    Computed in float64 on the CPU. Returns rows whose ε* is at most that of X.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    steps = val.check_int(steps, "polish_steps", 0)
    X = X.detach().to("cpu", torch.float64)
    X = X / torch.linalg.vector_norm(X, dim=1, keepdim=True)
    k, d = X.shape
    eps = gram_offdiag_max(X, normalize=False)
    radius = 0.25 * eps / math.sqrt(d)
    for step in range(steps):
        band = 2.0 * radius * math.sqrt(d) + d * radius**2
        while band > 0.5 * eps:  # the band reaches down to 0 or below: far too many pairs
            radius *= 0.5
            band = 2.0 * radius * math.sqrt(d) + d * radius**2
        pi, pj, pg = _pairs_above(X, eps - band)
        if len(pi) > MAX_POLISH_PAIRS:  # the largest |ĝ| only; the true ε* decides whether a step is kept
            top = np.argsort(-np.abs(pg), kind="stable")[:MAX_POLISH_PAIRS]
            pi, pj, pg = pi[top], pj[top], pg[top]
        rows = np.unique(np.concatenate([pi, pj]))
        slot = np.full(k, -1, dtype=np.int64)
        slot[rows] = np.arange(len(rows))
        n_var = len(rows) * d + 1  # δ of the rows in the band, then t
        x = X.numpy()
        sign = np.sign(pg)
        n = len(pi)
        cols_i = slot[pi][:, None] * d + np.arange(d)[None, :]
        cols_j = slot[pj][:, None] * d + np.arange(d)[None, :]
        # sign·(ĝ + x̂_j·δ_i + x̂_i·δ_j) − t ≤ 0
        a_rows = np.concatenate([np.repeat(np.arange(n), d), np.repeat(np.arange(n), d), np.arange(n)])
        a_cols = np.concatenate([cols_i.ravel(), cols_j.ravel(), np.full(n, n_var - 1)])
        a_vals = np.concatenate([(sign[:, None] * x[pj]).ravel(), (sign[:, None] * x[pi]).ravel(), -np.ones(n)])
        a_ub = coo_matrix((a_vals, (a_rows, a_cols)), shape=(n, n_var)).tocsr()
        b_ub = -sign * pg
        eq_rows = np.repeat(np.arange(len(rows)), d)
        eq_cols = np.arange(len(rows) * d)
        a_eq = coo_matrix((x[rows].ravel(), (eq_rows, eq_cols)), shape=(len(rows), n_var)).tocsr()
        cost = np.zeros(n_var)
        cost[-1] = 1.0
        bounds = np.empty((n_var, 2))
        bounds[:-1] = (-radius, radius)
        bounds[-1] = (-np.inf, np.inf)
        res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(len(rows)), bounds=bounds,
                      method="highs", options={"time_limit": _LP_SECONDS})
        if res.status != 0 or res.x is None:
            radius *= 0.5
        else:
            predicted = eps - float(res.x[-1])
            if predicted <= 1e-13 * eps:  # no descent within the trust region: a local minimax point
                if on_step is not None:
                    on_step(step, eps)
                break
            Y = X.clone()
            delta = torch.from_numpy(res.x[:-1].reshape(len(rows), d))
            Y[torch.from_numpy(rows)] += delta
            Y = Y / torch.linalg.vector_norm(Y, dim=1, keepdim=True)
            new_eps = gram_offdiag_max(Y, normalize=False)
            if new_eps < eps:
                ratio = (eps - new_eps) / predicted if predicted > 0 else 0.0
                X, eps = Y, new_eps
                radius *= 2.0 if ratio > 0.75 else (1.0 if ratio > 0.25 else 0.5)
            else:
                radius *= 0.25
        if on_step is not None:
            on_step(step, eps)
        if radius < 1e-12 * eps:
            break
    return X
