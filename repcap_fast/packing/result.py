"""The result of a packing run (``PackingResult``) and the paper's defaults it is made with.

All three are served as ``repcap_fast.packing.PackingResult``, ``repcap_fast.packing.default_lr``
and ``repcap_fast.packing.default_p``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List

from .. import _validation as val


def default_lr(d: int) -> float:
    r"""The paper's Adam learning rate for vectors in $\mathbb{R}^d$.

    lr = 0.005 for d ≤ 1024, else 0.0025 (Guha 2026, §1.3). ``optimize`` uses it when `lr` is
    None for method="paper"; the continuation methods start from twice it.

    Args:
        d: the dimension, an int ≥ 1.

    Returns:
        float: the learning rate.

    Raises:
        ValueError: d is not an int ≥ 1 (an ``ArgumentTypeError``, also a TypeError, for a
            non-integer).

    Examples:
        >>> rf.packing.default_lr(768), rf.packing.default_lr(4096)
        (0.005, 0.0025)
    """
    return 0.005 if val.check_int(d, "d", 1) <= 1024 else 0.0025


def default_p(k: int, d: int) -> int:
    r"""The paper's exponent p of the penalty $\sum_{i \ne j} |\hat g_{ij}|^p$ for k vectors in $\mathbb{R}^d$.

    p = min(int(m / ln d), 20), with m = 40 if k ≤ 4000, else 50 if d ≥ 3072, else 60; d = 1
    gives 20, and p is at least 1.

    Args:
        k: the number of vectors, an int ≥ 1.
        d: the dimension, an int ≥ 1.

    Returns:
        int: p, in [1, 20].

    Raises:
        ValueError: k or d is not an int ≥ 1 (an ``ArgumentTypeError``, also a TypeError, for a
            non-integer).

    Examples:
        >>> rf.packing.default_p(1000, 64), rf.packing.default_p(8000, 4096)
        (9, 6)
    """
    k, d = val.check_int(k, "k", 1), val.check_int(d, "d", 1)
    m = 40 if k <= 4000 else (50 if d >= 3072 else 60)
    if d <= 1:
        return 20
    return max(1, min(int(m / math.log(d)), 20))


@dataclass
class PackingResult:
    r"""One packing run of ``repcap_fast.packing.optimize``: its settings, ε* and the statistics.

    $\varepsilon^* = \max_{i \ne j} |\hat g_{ij}|$ of the final vectors (after the last step and the
    polish), with $\hat g_{ij} = \hat x_i \cdot \hat x_j$ the cosines of the row-normalized vectors.

    Attributes:
        k (int): the number of vectors.
        d (int): their dimension.
        steps (int): optimizer steps run (for "equiangular-search" its budget: it stops at the
            first frame, after len(loss_history) steps).
        p (int): the fixed p of "paper"; the last p (or sharpness) of the continuation methods;
            1 for "alternating-projection" (no exponent).
        lr (float): the (first) learning rate (0 for "alternating-projection").
        seed (int): the seed of the random start (of the first start, with restarts).
        dtype (str): the vectors' dtype, e.g. "float32".
        device (str): where the run ran.
        backend (str): the penalty kernel's backend that ran ("cpu", "cuda", "triton", "torch").
        eps_star (float): ε* of the final vectors.
        eps_star_init (float): ε* of the random start.
        mean (float): the mean of the final off-diagonal ĝ_ij (pairs i < j).
        std (float): their standard deviation.
        mu_plus_2sigma (float): mean + 2·std.
        welch (float): the Welch lower bound $\sqrt{(k - d)/(d(k - 1))}$ on ε* (0 for k ≤ d).
        bound (float): the certificate: the best lower bound on ε* that applies
            (``capacity.coherence_bound``: Welch of orders 1–4, orthoplex, Levenstein); ε* − bound
            (``eps_minus_bound``) is how far from optimal the packing can be at most.
        bound_name (str): which bound that is ("welch", "welch-2", …, "orthoplex", "levenstein").
        loss_init (float): the objective of the first step, from the exact kernel ("highest"; for
            the two matrix methods, their own float64 value).
        loss_final (float): the objective of the last step, likewise.
        loss_history (List[float]): the objective each step evaluated (before its update):
            Σ|ĝ|^p for "paper", (1/p)·ln Σ|ĝ|^p at that step's p for "p-continuation",
            "riemannian" and "minimax", the log-sum-exp for "smooth-max", ε* of the step's
            packing for "alternating-projection" (after the step; the result keeps the best one),
            the integer F = ‖S² − aS − bI‖²_F of the step's sign matrix for "equiangular-search";
            at the steps' `precision`, except the first and last entries (``loss_init``,
            ``loss_final``).
        seconds (float): the run's wall time.
        precision (str): the operand precision of the penalty steps.
        method (str): the optimizer, one of ``repcap_fast.packing.METHODS``.
        p_start (int): the first p of a continuation method (p for "paper", 1 for
            "alternating-projection").
        polish_steps (int): active-set polish steps run after the optimizer.
        polish_history (List[float]): ε* after each polish step.
        projection_steps (int): alternating-projection polish steps run after the optimizer (before
            the active-set polish).
        projection_history (List[float]): ε* of each of those steps' packings (the result keeps
            the best packing seen, the start included).
        restarts (int): the seeded starts run (``optimize(restarts=R)``: seeds seed … seed + R − 1);
            the result is the one of least ε*.
        best_seed (int): the seed of that start (``optimize(..., seed=best_seed)`` runs it alone).
        restart_eps_stars (List[float]): ε* of every start, in seed order.

    Examples:
        >>> res = rf.packing.optimize(8, 3, steps=50, progress=False)
        >>> res.k, res.d, res.p, res.method
        (8, 3, 20, 'paper')
        >>> res.eps_star < res.eps_star_init, round(res.welch, 4)
        (True, 0.488)
    """

    k: int
    d: int
    steps: int
    p: int
    lr: float
    seed: int
    dtype: str
    device: str
    backend: str
    eps_star: float
    eps_star_init: float
    mean: float
    std: float
    mu_plus_2sigma: float
    welch: float
    bound: float
    bound_name: str
    loss_init: float
    loss_final: float
    loss_history: List[float] = field(repr=False, default_factory=list)
    seconds: float = float("nan")
    precision: str = "highest"
    method: str = "paper"
    p_start: int = 0
    polish_steps: int = 0
    polish_history: List[float] = field(repr=False, default_factory=list)
    projection_steps: int = 0
    projection_history: List[float] = field(repr=False, default_factory=list)
    restarts: int = 1
    best_seed: int = 0
    restart_eps_stars: List[float] = field(default_factory=list)

    @property
    def eps_over_welch(self) -> float:
        """ε* / Welch bound (≥ 1 for any packing; inf when the bound is 0, i.e. k ≤ d)."""
        return self.eps_star / self.welch if self.welch > 0 else math.inf

    @property
    def eps_minus_bound(self) -> float:
        """ε* − bound: the certified gap to the optimum (≥ 0 up to rounding; 0 at a packing that meets it)."""
        return self.eps_star - self.bound

    def to_dict(self, history: bool = True, timing: bool = True) -> dict:
        """The result as a JSON-ready dict, with ``eps_over_welch`` (None when inf) and the two gaps.

        The gaps are ``eps_minus_welch`` and ``eps_minus_bound`` (ε* minus the certificate).

        Args:
            history: keep ``loss_history``, ``polish_history`` and ``projection_history``.
                Defaults to True.
            timing: keep ``seconds``. Defaults to True.

        Returns:
            dict: every field, and the three derived values.
        """
        out = asdict(self)
        out["eps_over_welch"] = self.eps_over_welch if math.isfinite(self.eps_over_welch) else None
        out["eps_minus_welch"] = self.eps_star - self.welch
        out["eps_minus_bound"] = self.eps_minus_bound
        if not history:
            out.pop("loss_history")
            out.pop("polish_history")
            out.pop("projection_history")
        if not timing:
            out.pop("seconds")
        return out
