"""``optimize``: one packing run (Guha 2026, §1.3) from k random unit vectors.

The paper's method minimizes L = Σ_{i≠j}|ĝ_ij|^p with Adam through the streaming penalty kernel
(``gram_offdiag_penalty``, never k×k); the other methods are in ``methods``, the polishes after
them in ``polish``. Vectors are the rows of a k×d matrix here; the paper's code stores them as
the columns of d×k.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import List, Optional

import torch

from .. import _validation as val
from .. import capacity, distributed
from .._backends import PENALTY_PRECISIONS, check_precision, resolve_backend
from .._progress import progress_bar
from ..ops.gram_offdiag_penalty import (
    check_penalty_p,
    gram_offdiag_max,
    gram_offdiag_penalty,
    gram_offdiag_penalty_block,
)
from ..ops.pairwise_cosine_stats import pairwise_cosine_stats
from . import methods
from .memory import check_memory
from .methods import MethodSettings, PackingDiverged
from .polish import polishes
from .result import PackingResult, default_lr, default_p

_PROGRESS_FLOPS = 2e11  # show a progress bar above about this much work (a few CPU seconds)


def _eps_stats(x: torch.Tensor, backend: str):
    """(ε* = max|ĝ|, mean, std) of the off-diagonal ĝ_ij (pairs i<j), at precision "highest".

    Streamed by kernel 1 (whatever precision the steps used). For float64 vectors ε* is then
    measured again in float64 (row blocks of b×k), since kernel 1 forms float32 dot products: a
    packing at an optimum known to 1e-15 would read 1e-8 off.
    """
    stats = pairwise_cosine_stats(x, bins=1, backend=backend, progress=False)
    eps = max(abs(stats.min), abs(stats.max))
    if x.dtype == torch.float64:
        eps = gram_offdiag_max(x / torch.linalg.vector_norm(x, dim=1, keepdim=True), normalize=False)
    return eps, stats.mean, stats.std


def optimize(
    k: int,
    d: int,
    *,
    steps: Optional[int] = None,
    p: Optional[int] = None,
    lr: Optional[float] = None,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    backend: str = "auto",
    precision: str = "highest",
    progress: Optional[bool] = None,
    group=None,
    method: str = "paper",
    p_start: Optional[int] = None,
    polish_steps: Optional[int] = None,
    restarts: int = 1,
    projection_steps: int = 0,
) -> PackingResult:
    r"""Packs k unit vectors in d dimensions: minimizes their coherence ε* from a random start.

    $\varepsilon^* = \max_{i \ne j} |\hat g_{ij}|$ of the vectors in $\mathbb{R}^d$.

    With method="paper" (default), the paper's setup bit for bit: the vectors are the rows of a k×d
    parameter X drawn from a seeded standard normal (on the CPU, so the start does not depend on the
    device), and Adam minimizes $L = \sum_{i \ne j} |\hat g_{ij}|^p$,
    $\hat g_{ij} = \hat x_i \cdot \hat x_j$ the cosines of the row-normalized X, through the
    streaming penalty kernel (``gram_offdiag_penalty``, never k×k); the raw parameters are never
    projected back. The other methods of ``METHODS`` ("p-continuation", "smooth-max", "riemannian",
    "minimax", "alternating-projection", "equiangular-search"; see ``repcap_fast.packing.methods``)
    drive ε* lower. k ≤ d is allowed: the optimum is then exact orthogonality (ε* → 0). ε* is read
    after all `steps` updates (the paper's script reads it in the forward pass of its last step,
    after steps − 1).

    Args:
        k: the number of vectors, an int ≥ 2.
        d: their dimension, an int ≥ 1.
        steps: optimizer steps, ≥ 1. Defaults to 5000 (the paper's); for "equiangular-search" sign
            matrices evaluated, at most (it stops at the first frame), by default
            ``packing.search.default_steps(k)``: 100,000 up to 64 lines, fewer as k³ grows.
        p: for "paper" the fixed exponent (default ``default_p(k, d)``); for the other methods the
            last p of the continuation (default ``packing.methods.DEFAULT_P_END``, 1024). At most
            the kernels' limit on a kernel backend.
        lr: the learning rate, > 0. For "paper" default ``default_lr(d)``; for the other methods
            the first of a schedule that decays geometrically to 1% of it (default
            2·``default_lr(d)``).
        seed: the seed of the random start, in [0, 2^63 − 1]. Defaults to 0.
        device (str | torch.device): where the vectors live. Defaults to "cpu".
        dtype (torch.dtype | str): float32 (default), bfloat16 or float64; float16 is refused.
            The continuation methods run bfloat16 in float32 and round the result to it.
        backend: the penalty kernel: "auto" (default), "cpu", "cuda", "triton" or "torch".
        precision: the operands of the penalty steps' float32 GEMMs, one of
            ``PENALTY_PRECISIONS``: "highest" (IEEE float32, default), "tf32" or "bf16" (GPU
            tensor cores; the cpu backend emulates them by rounding the operands). ε*, the
            statistics, ``loss_init`` and ``loss_final`` are always measured at "highest";
            float64 runs in float64 at any precision; "smooth-max" takes "highest" only.
        progress: a progress bar over the steps; None (default) shows one above a few CPU seconds
            of work.
        group (torch.distributed.ProcessGroup): the process group to split the run across
            (default None: torchrun's default group when it has more than one rank, else this
            process alone). Each rank owns a contiguous block of rows and their
            Adam state; every step the ranks all-gather the rows and each computes its rows' loss
            and gradient against all k rows (``gram_offdiag_penalty_block``); the trajectory is
            the single-process one up to float rounding. Only method="paper" without a polish
            runs across ranks.
        method: the optimizer, one of ``METHODS``. Defaults to "paper".
        p_start: the first p of a continuation method (default 4, at most p); not for "paper".
        polish_steps: active-set polish steps (linear programs, float64 on the CPU) after the
            optimizer, ≥ 0 (default 40 for "minimax", else 0; any method may be polished).
        restarts: seeded starts, ≥ 1 (default 1): the whole run from the seeds seed, seed + 1, …,
            seed + restarts − 1, one after the other (each already uses every core, or the GPU),
            keeping the one of least ε*; the result records every start's ε* and the best seed.
        projection_steps: alternating-projection polish steps after the optimizer and before the
            active-set polish, ≥ 0 (default 0): ``packing.projection.alternating_projection`` from
            the optimizer's packing, μ annealed from its ε* down to the certificate; it keeps the
            best packing seen, so it never raises ε*. k ≤ ``packing.projection.MAX_K``; not for
            method="alternating-projection" itself.

    Returns:
        PackingResult: ε* after the last step and the polish, ε* of the random start, the mean,
        std and μ + 2σ of the final ĝ_ij, the Welch bound and the certificate (the best lower
        bound) for (k, d), every start's ε* with restarts, the objective of every step
        (``loss_history[s]``, evaluated by step s before its update), and the settings and the
        backend that ran.

    Raises:
        ValueError: an argument out of range, or of the wrong type (an ``ArgumentTypeError``,
            also a TypeError): k < 2, d < 1, steps < 1, an unknown device, backend, dtype,
            method or precision, dtype float16, p beyond the backend's limit, p_start given for
            "paper" or above p, lr ≤ 0, restarts < 1 (or seed + restarts − 1 past 2^63 − 1), a
            precision other than "highest" for "smooth-max", a
            method other than "paper" (or a polish) across ranks, projection_steps < 0, given with
            method="alternating-projection" or with k > ``packing.projection.MAX_K``, method="equiangular-search"
            where no real equiangular tight frame can exist or k > ``packing.search.MAX_K``, or a k×d run
            that does not fit in the memory of the host or the device.
        PackingDiverged: the vectors became NaN/Inf or collapsed to zero (an lr too large for the
            dtype); a RuntimeError.
        RuntimeError: `group` given while torch.distributed is not initialized; across ranks,
            ``distributed.RankFailure`` on every rank when one fails.

    Examples:
        >>> res = rf.packing.optimize(6, 3, steps=20, method="minimax", polish_steps=20, progress=False)
        >>> round(res.eps_star, 4), round(res.welch, 4)  # the 6 axes of the icosahedron meet the bound
        (0.4472, 0.4472)
    """
    restarts = _check_restarts(seed, restarts)
    if restarts > 1:
        return _best_of_starts(restarts, dict(k=k, d=d, steps=steps, p=p, lr=lr, seed=seed, device=device,
                                              dtype=dtype, backend=backend, precision=precision, progress=progress,
                                              group=group, method=method, p_start=p_start,
                                              polish_steps=polish_steps, projection_steps=projection_steps))
    group = distributed.resolve_group(group)
    run = distributed.prepare_on_every_rank("optimize", group, _check_run, k, d, steps, p, lr, seed, device, dtype,
                                            backend, precision, method, p_start, polish_steps, projection_steps)
    if group is not None:
        if run.settings.method != "paper" or run.settings.polish_steps or run.projection_steps:
            raise ValueError(f"method={run.settings.method!r} (and the polish) run in one process; only "
                             "method='paper' splits a run across ranks")
        return _optimize_across_ranks(run, progress, group)
    if run.settings.method != "paper":
        return _optimize_with_method(run, progress)
    X = _initial_vectors(run.k, run.d, run.seed).to(device=run.device, dtype=run.dtype).requires_grad_(True)
    eps_init, _, _ = _eps_stats(X.detach(), run.backend)
    opt = torch.optim.Adam([X], lr=run.lr)
    losses = torch.empty(run.steps, dtype=torch.float64, device=run.device)
    start = time.perf_counter()
    with progress_bar(progress, total=run.steps, desc=f"pack k={run.k} d={run.d} p={run.p}", unit="step",
                      work=4.0 * run.k * run.k * run.d * run.steps, auto_above=_PROGRESS_FLOPS) as bar:
        for step in range(run.steps):
            opt.zero_grad(set_to_none=True)
            loss = _step_loss(X, run, step)
            loss.backward()
            losses[step] = _exact_loss(X.detach(), run) if _reports_exact(run, step) else loss.detach()
            opt.step()
            bar.update(1)
    X, histories = polishes(run, X.detach(), progress, _PROGRESS_FLOPS)
    return _packing_result(run, eps_init, X, losses.cpu().tolist(), start, *histories)


def _check_restarts(seed, restarts) -> int:
    """Restarts (an int ≥ 1), checked with the seed: the last start's seed must be a seed too."""
    restarts = val.check_int(restarts, "restarts", 1)
    if restarts > 1:
        seed = val.check_seed(seed)
        val.check_seed(seed + restarts - 1, name=f"seed + restarts - 1 (the last start's seed, restarts={restarts})")
    return restarts


def _best_of_starts(restarts: int, args: dict) -> PackingResult:
    """`restarts` runs of optimize from the seeds seed, seed + 1, …: the one of least ε*, with every start's ε*.

    The starts run one after the other: each already uses the machine's cores (the kernels are
    multithreaded on the CPU and fill a GPU), so running them side by side would not finish sooner.
    """
    seed = args["seed"]
    start = time.perf_counter()
    results = [optimize(**dict(args, seed=seed + r)) for r in range(restarts)]
    best = min(results, key=lambda res: (res.eps_star, res.best_seed))  # the first of equal ε*
    return dataclasses.replace(best, seed=seed, restarts=restarts,
                               restart_eps_stars=[res.eps_star for res in results],
                               seconds=time.perf_counter() - start)


def _optimize_with_method(run: _Run, progress) -> PackingResult:
    """A continuation method (methods.run_optimizer), then its polish."""
    compute = val.compute_dtype(run.dtype)
    X = _initial_vectors(run.k, run.d, run.seed).to(device=run.device, dtype=compute)
    eps_init, _, _ = _eps_stats(X.to(run.dtype), run.backend)
    history: List[float] = []
    start = time.perf_counter()
    per_step = 2.0 * run.k ** 5 if run.settings.method == "equiangular-search" else 4.0 * run.k * run.k * run.d
    with progress_bar(progress, total=run.steps, desc=f"pack k={run.k} d={run.d} {run.settings.method}", unit="step",
                      work=per_step * run.steps, auto_above=_PROGRESS_FLOPS) as bar:
        def on_step(step, value):
            if math.isnan(value) or value == math.inf:  # −inf: every pair exactly orthogonal (k ≤ d), converged
                raise PackingDiverged(f"packing diverged at step {step}: the objective is {value} ({run.dtype}, "
                                      f"lr={run.lr}, method={run.settings.method}); try a smaller lr or float64")
            history.append(value)
            bar.update(1)

        try:
            X = methods.run_optimizer(run.settings, X, run.steps, run.lr, run.backend, run.precision, eps_init,
                                      on_step, seed=run.seed)
        except methods.RowsCollapsed as exc:
            default = methods.default_lr(run.settings.method, default_lr(run.d))
            raise PackingDiverged(f"{exc} ({run.dtype}, method={run.settings.method}); lr={run.lr:g} is too large: "
                                  f"try a smaller lr (the default is {default:g}) or float64") from None
        except ValueError as exc:
            if "NaN/Inf" not in str(exc):
                raise
            raise PackingDiverged(f"packing diverged at step {len(history)}: the vectors became NaN/Inf "
                                  f"({run.dtype}, lr={run.lr}, method={run.settings.method}); try a smaller lr or "
                                  "float64") from exc
    X, histories = polishes(run, X, progress, _PROGRESS_FLOPS)
    return _packing_result(run, eps_init, X.to(run.dtype), history, start, *histories)


@dataclass(frozen=True)
class _Run:
    """The validated settings of one packing run."""

    k: int
    d: int
    steps: int
    p: int
    lr: float
    seed: int
    device: torch.device
    dtype: torch.dtype
    backend: str
    precision: str
    settings: MethodSettings
    projection_steps: int = 0

    def signature(self) -> dict:
        return {"k": self.k, "d": self.d, "steps": self.steps, "p": self.p, "lr": self.lr, "seed": self.seed,
                "dtype": str(self.dtype), "backend": self.backend, "precision": self.precision,
                **self.settings.to_dict()}


def _check_run(k, d, steps, p, lr, seed, device, dtype, backend, precision, method="paper", p_start=None,
               polish_steps=None, projection_steps=0) -> _Run:
    k = val.check_int(k, "k", 2)
    d = val.check_int(d, "d", 1)
    device = val.check_device(device)
    backend = resolve_backend(backend, device, "gram_offdiag_penalty")
    dtype = val.check_dtype(dtype)
    if dtype == torch.float16:
        raise ValueError("dtype float16 cannot run the packing optimizer: Adam's ε (1e-8) and the squared "
                         "gradients underflow to 0 in float16, so its first step divides 0 by 0; use float32 "
                         "(default), bfloat16 or float64")
    settings = methods.check_method(method, p, p_start, polish_steps, default_p(k, d),
                                    lambda value: check_penalty_p(value, backend))
    if settings.method in methods.NO_P and lr is not None:
        raise ValueError(f"lr does not apply to method={settings.method!r} (it takes no gradient steps)")
    lr = methods.default_lr(settings.method, default_lr(d)) if lr is None else val.check_positive_float(lr, "lr")
    precision = check_precision(precision, PENALTY_PRECISIONS)
    if settings.method in methods.NO_P:
        if precision != "highest":
            raise ValueError(f"precision={precision!r} does not apply to method={settings.method!r} (it works on "
                             "float64 Gram or sign matrices, not the penalty kernel); use precision='highest'")
    projection_steps = val.check_int(projection_steps, "projection_steps", 0)
    if projection_steps and settings.method == "alternating-projection":
        raise ValueError("projection_steps is the alternating-projection polish after the other methods; "
                         "method='alternating-projection' already is that iteration (give it more steps)")
    methods.check_sizes(settings.method, k, d, projection_steps)
    check_memory(k, d, dtype, device, backend)  # before any allocation
    if settings.method == "smooth-max" and precision != "highest":
        raise ValueError(f"precision={precision!r} does not apply to method='smooth-max' (its objective is streamed "
                         "by PyTorch in float32, not by the penalty kernel); use precision='highest'")
    steps = methods.default_steps(settings.method, k) if steps is None else val.check_int(steps, "steps", 1)
    return _Run(k, d, steps, settings.p_end, lr, val.check_seed(seed),
                device, dtype, backend, precision, settings, projection_steps)


def _step_loss(X: torch.Tensor, run: _Run, step: int) -> torch.Tensor:
    """The penalty of one step.

    Vectors that became NaN/Inf are reported as the optimizer's divergence (with the step and the
    settings), not as a bad input.
    """
    try:
        return gram_offdiag_penalty(X, run.p, normalize=True, reduction="sum", backend=run.backend,
                                    precision=run.precision)
    except ValueError as exc:
        if "NaN/Inf" not in str(exc) or step == 0:
            raise
        raise PackingDiverged(f"packing diverged at step {step}: the vectors became NaN/Inf ({run.dtype}, lr={run.lr}, "
                           f"p={run.p}); try a smaller lr or float32/float64") from exc


def _reports_exact(run: _Run, step: int) -> bool:
    """Whether the loss recorded for `step` is evaluated again by the exact kernel.

    So it is for the first and the last step of a run whose steps use a reduced precision
    (loss_init and loss_final).
    """
    return run.precision != "highest" and step in (0, run.steps - 1)


def _exact_loss(X: torch.Tensor, run: _Run) -> torch.Tensor:
    """The paper's loss Σ|ĝ|^p of the rows X at precision "highest", without gradient."""
    with torch.no_grad():
        return gram_offdiag_penalty(X, run.p, normalize=True, reduction="sum", backend=run.backend,
                                    precision="highest")


def _initial_vectors(k: int, d: int, seed: int) -> torch.Tensor:
    """The seeded random start: k unit rows in R^d, drawn in float64 on the CPU."""
    x0 = torch.randn(k, d, generator=torch.Generator(device="cpu").manual_seed(seed), dtype=torch.float64)
    return x0 / torch.linalg.vector_norm(x0, dim=1, keepdim=True)


def _packing_result(run: _Run, eps_init, X, history, start, polish_history=(), projection_history=()) -> PackingResult:
    """ε* and the statistics of the final vectors X (all k rows, on this process alone)."""
    with distributed.local():
        eps_star, mean, std = _eps_stats(X, run.backend)
    return PackingResult(
        k=run.k, d=run.d, steps=run.steps, p=run.p, lr=run.lr, seed=run.seed,
        dtype=str(run.dtype).replace("torch.", ""), device=str(run.device), backend=run.backend,
        precision=run.precision,
        eps_star=float(eps_star), eps_star_init=float(eps_init), mean=float(mean), std=float(std),
        mu_plus_2sigma=float(mean + 2.0 * std), welch=float(capacity.welch_bound(run.k, run.d)),
        **dict(zip(("bound", "bound_name"), capacity.coherence_bound(run.k, run.d))),
        loss_init=float(history[0]), loss_final=float(history[-1]), loss_history=history,
        seconds=time.perf_counter() - start, method=run.settings.method, p_start=run.settings.p_start,
        polish_steps=run.settings.polish_steps, polish_history=list(polish_history),
        projection_steps=run.projection_steps, projection_history=list(projection_history),
        best_seed=run.seed, restart_eps_stars=[float(eps_star)],
    )


def _optimize_across_ranks(run: _Run, progress, group) -> PackingResult:
    rank, world = distributed.rank_and_world(group)
    full = _initial_vectors(run.k, run.d, run.seed).to(device=run.device, dtype=run.dtype)
    own = distributed.contiguous_share(run.k, rank, world)
    block = -(-run.k // world)  # all_gather takes equal sizes: blocks are padded to this many rows
    X = full[own.start : own.stop].clone().requires_grad_(True)
    with distributed.local():  # every rank holds all rows: the statistics need no other rank (and no subgroup)
        eps_init, _, _ = _eps_stats(full, run.backend)
    opt = torch.optim.Adam([X], lr=run.lr)  # the Adam state of this rank's rows only
    comm = distributed.comm_device(group)
    losses = torch.empty(run.steps, dtype=torch.float64)
    shares = [distributed.contiguous_share(run.k, r, world) for r in range(world)]

    def gather_rows() -> torch.Tensor:
        padded = torch.zeros(block, run.d, dtype=run.dtype, device=comm)
        padded[: len(own)] = X.detach().to(comm)
        pieces = [torch.empty_like(padded) for _ in range(world)]
        torch.distributed.all_gather(pieces, padded, group=group)
        return torch.cat([piece[: len(sh)] for piece, sh in zip(pieces, shares)]).to(full.device)

    def block_step(rows: torch.Tensor, exact: bool):
        """This rank's part of the loss and its rows' gradient at the steps' precision.

        With `exact`, the part comes from the exact kernel instead (loss_init and loss_final).
        """
        if not len(own):
            return torch.zeros((), dtype=torch.float64), None
        part, grad = gram_offdiag_penalty_block(rows, own.start, own.stop, run.p, run.backend, run.precision)
        if exact:
            part = gram_offdiag_penalty_block(rows, own.start, own.stop, run.p, run.backend, "highest")[0]
        return part, grad

    start = time.perf_counter()
    with progress_bar(progress if rank == 0 else False, total=run.steps,
                      desc=f"pack k={run.k} d={run.d} p={run.p}, {world} ranks", unit="step",
                      work=4.0 * run.k * run.k * run.d * run.steps / world, auto_above=_PROGRESS_FLOPS) as bar:
        for step in range(run.steps):
            rows = gather_rows()
            exact = _reports_exact(run, step)
            part, grad = distributed.run_on_every_rank("optimize", lambda: block_step(rows, exact), group)
            total = part.detach().to(torch.float64).reshape(1).to(comm)
            torch.distributed.all_reduce(total, group=group)
            if grad is not None:
                X.grad = grad.to(X.dtype)
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses[step] = float(total.to(val.compute_dtype(run.dtype)))
            bar.update(1)
    return _packing_result(run, eps_init, gather_rows(), losses.tolist(), start)
