"""Packing simulation (Guha 2026, §1.3): how closely can k unit vectors in R^d avoid each other?

``optimize`` starts from k random unit vectors and minimizes L = Σ_{i≠j}|ĝ_ij|^p with Adam,
through the streaming penalty kernel (``gram_offdiag_penalty``, never k×k). ``sweep`` runs a
(k, d) grid and writes every finished cell at once, so an interrupted sweep resumes where it
stopped. ``fitting.fit`` then fits the constants of the capacity formulas to ε*; sweep files are
repcap_fast.sweep_file.

Vectors are the rows of a k×d matrix here; the paper's code stores them as the columns of d×k.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, List, Optional

import torch

from . import _validation as val
from . import capacity, distributed
from . import packing_methods as methods
from ._backends import PENALTY_PRECISIONS, check_precision, resolve_backend
from ._progress import progress_bar
from .ops.gram_offdiag_penalty import (
    check_penalty_p,
    gram_offdiag_max,
    gram_offdiag_penalty,
    gram_offdiag_penalty_block,
)
from .ops.pairwise_cosine_stats import pairwise_cosine_stats
from .packing_memory import check_memory
from .packing_methods import METHODS, MethodSettings, PackingDiverged  # noqa: F401  method= names; optimize raises
from .sweep_file import (  # noqa: F401  SWEEP_FORMAT: the format tag of sweep files, also read from here
    CELL_FIELDS,
    SETTING_KEYS,
    SWEEP_FORMAT,
    grid_order,
    grid_values,
    is_sweep_file,
    load_cells,
    merge_cells,
    part_file,
    part_files,
    read_cells,
    remove_part_files,
    sweep_lock,
    write_cells,
)

_PROGRESS_FLOPS = 2e11  # show a progress bar above about this much work (a few CPU seconds)


def default_lr(d: int) -> float:
    """The paper's learning rate: 0.005 for d ≤ 1024, else 0.0025."""
    return 0.005 if val.check_int(d, "d", 1) <= 1024 else 0.0025


def default_p(k: int, d: int) -> int:
    """The paper's exponent p = min(int(m / ln d), 20), with m = 40 if k ≤ 4000, else 50 if
    d ≥ 3072, else 60 (d = 1 gives 20; p is at least 1)."""
    k, d = val.check_int(k, "k", 1), val.check_int(d, "d", 1)
    m = 40 if k <= 4000 else (50 if d >= 3072 else 60)
    if d <= 1:
        return 20
    return max(1, min(int(m / math.log(d)), 20))


@dataclass
class PackingResult:
    """One packing run. ``eps_star`` = max_{i≠j}|ĝ_ij| of the final vectors (after the last step
    and the polish); ``loss_history[s]`` is the objective step s evaluated (before its update):
    Σ|ĝ|^p for "paper", (1/p)·ln Σ|ĝ|^p at that step's p for "p-continuation", "riemannian" and
    "minimax", the log-sum-exp for "smooth-max", at the steps' ``precision``, except the first and
    the last entries, which are always the exact kernel's ("highest"): ``loss_init`` and
    ``loss_final``; ``polish_history[s]`` is ε* after polish step s.
    ``p`` is the fixed p of "paper" and the last p (or sharpness) of the continuation methods."""

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
    loss_init: float
    loss_final: float
    loss_history: List[float] = field(repr=False, default_factory=list)
    seconds: float = float("nan")
    precision: str = "highest"
    method: str = "paper"
    p_start: int = 0
    polish_steps: int = 0
    polish_history: List[float] = field(repr=False, default_factory=list)

    @property
    def eps_over_welch(self) -> float:
        """ε* / Welch bound (≥ 1 for any packing; inf when the bound is 0, i.e. k ≤ d)."""
        return self.eps_star / self.welch if self.welch > 0 else math.inf

    def to_dict(self, history: bool = True, timing: bool = True) -> dict:
        out = asdict(self)
        out["eps_over_welch"] = self.eps_over_welch if math.isfinite(self.eps_over_welch) else None
        out["eps_minus_welch"] = self.eps_star - self.welch
        if not history:
            out.pop("loss_history")
            out.pop("polish_history")
        if not timing:
            out.pop("seconds")
        return out


def _eps_stats(x: torch.Tensor, backend: str):
    """(ε* = max|ĝ|, mean, std) of the off-diagonal ĝ_ij (pairs i<j), streamed by kernel 1 at
    precision "highest" (whatever the steps used). For float64 vectors ε* is then measured again
    in float64 (row blocks of b×k), since kernel 1 forms float32 dot products: a packing at an
    optimum known to 1e-15 would read 1e-8 off."""
    stats = pairwise_cosine_stats(x, bins=1, backend=backend, progress=False)
    eps = max(abs(stats.min), abs(stats.max))
    if x.dtype == torch.float64:
        eps = gram_offdiag_max(x / torch.linalg.vector_norm(x, dim=1, keepdim=True), normalize=False)
    return eps, stats.mean, stats.std


def optimize(
    k: int,
    d: int,
    *,
    steps: int = 5000,
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
) -> PackingResult:
    """Packs k unit vectors in R^d: with method="paper" (default) by minimizing Σ_{i≠j}|ĝ_ij|^p
    with Adam, the paper's setup, bit for bit; the other methods of ``packing_methods.METHODS``
    drive ε* lower ("minimax" lowest, measured in the README's "Packing methods").
    ``PENALTY_PRECISIONS``: the values of `precision`.

    The vectors are the rows of a k×d parameter initialized from a seeded standard normal (drawn
    on the CPU, so the start does not depend on the device) and row-normalized; the loss is
    computed on the row-normalized vectors every step and the raw parameters are never
    projected back. Defaults follow the paper: lr = ``default_lr(d)``, p = ``default_p(k, d)``.
    k ≤ d is allowed: the optimum is then exact orthogonality (ε* → 0). precision: the operands
    of the penalty steps' float32 GEMMs: "highest" (IEEE float32), "tf32" or "bf16" (GPU tensor
    cores; the cpu backend emulates them by rounding the operands, csrc/operand_rounding.h). ε*,
    μ + 2σ and the statistics of the result are always measured at "highest", and so are the
    reported first and last losses (``loss_init``, ``loss_final``: the exact kernel evaluates the
    same vectors again). float64 runs in float64 at any precision; "smooth-max" takes "highest"
    only (its objective is streamed by PyTorch, not by the penalty kernel).

    Returns ε* = max|ĝ| after the last step, μ + 2σ of the final off-diagonal ĝ, ε* of the
    random start, the Welch lower bound for (k, d), the loss of every step (``loss_history[s]``
    is the loss evaluated by step s, before its update) and the backend that ran.
    (The paper's script reads ε* in the forward pass of its last step, i.e. after steps − 1
    updates; here it is read after all `steps` updates.)

    Across ranks (`group=`, or torchrun's default group): each rank owns a contiguous block of
    rows and the Adam state of those rows only. Every step the ranks all-gather the rows, each
    computes its rows' loss and gradient with the fused kernel run on its block against all k rows
    (`gram_offdiag_penalty_block`), and the losses are summed. The trajectory is the
    single-process one up to float rounding (the kernel's tiles start at other rows). Only
    method="paper" runs across ranks.

    The other methods (see ``repcap_fast.packing_methods``): p is the last p of the continuation
    (default ``packing_methods.DEFAULT_P_END``, 1024), `p_start` its first (default 4), lr the
    first learning rate (default 2·``default_lr(d)``, decayed geometrically to 1% of it), and
    `polish_steps` the active-set polish steps after the optimizer (default 40 for "minimax",
    else 0; any method may be polished). They run in float32 for bfloat16 (the result is rounded
    to bfloat16 at the end), float64 for float64.
    """
    group = distributed.resolve_group(group)
    run = distributed.prepare_on_every_rank("optimize", group, _check_run, k, d, steps, p, lr, seed, device, dtype,
                                            backend, precision, method, p_start, polish_steps)
    if group is not None:
        if run.settings.method != "paper" or run.settings.polish_steps:
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
    X = X.detach()
    polish_history: List[float] = []
    if run.settings.polish_steps:
        X = _polish(run, X, progress, polish_history)
    return _packing_result(run, eps_init, X, losses.cpu().tolist(), start, polish_history)


def _optimize_with_method(run: _Run, progress) -> PackingResult:
    """A continuation method (packing_methods.run_optimizer), then its polish."""
    compute = val.compute_dtype(run.dtype)
    X = _initial_vectors(run.k, run.d, run.seed).to(device=run.device, dtype=compute)
    eps_init, _, _ = _eps_stats(X.to(run.dtype), run.backend)
    history: List[float] = []
    start = time.perf_counter()
    with progress_bar(progress, total=run.steps, desc=f"pack k={run.k} d={run.d} {run.settings.method}", unit="step",
                      work=4.0 * run.k * run.k * run.d * run.steps, auto_above=_PROGRESS_FLOPS) as bar:
        def on_step(step, value):
            if math.isnan(value) or value == math.inf:  # −inf: every pair exactly orthogonal (k ≤ d), converged
                raise PackingDiverged(f"packing diverged at step {step}: the objective is {value} ({run.dtype}, "
                                      f"lr={run.lr}, method={run.settings.method}); try a smaller lr or float64")
            history.append(value)
            bar.update(1)

        try:
            X = methods.run_optimizer(run.settings, X, run.steps, run.lr, run.backend, run.precision, eps_init,
                                      on_step)
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
    polish_history: List[float] = []
    if run.settings.polish_steps:
        X = _polish(run, X, progress, polish_history)
    return _packing_result(run, eps_init, X.to(run.dtype), history, start, polish_history)


def _polish(run: _Run, X: torch.Tensor, progress, polish_history: List[float]) -> torch.Tensor:
    """The active-set polish of packing_methods (float64, CPU), returned on X's device and dtype."""
    with progress_bar(progress, total=run.settings.polish_steps, desc=f"polish k={run.k} d={run.d}", unit="LP",
                      work=4.0 * run.k * run.k * run.d * run.settings.polish_steps,
                      auto_above=_PROGRESS_FLOPS) as bar:
        def on_step(step, eps):
            polish_history.append(eps)
            bar.update(1)

        polished = methods.polish(X, run.settings.polish_steps, on_step)
    return polished.to(device=X.device, dtype=X.dtype)


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

    def signature(self) -> dict:
        return {"k": self.k, "d": self.d, "steps": self.steps, "p": self.p, "lr": self.lr, "seed": self.seed,
                "dtype": str(self.dtype), "backend": self.backend, "precision": self.precision,
                **self.settings.to_dict()}


def _check_run(k, d, steps, p, lr, seed, device, dtype, backend, precision, method="paper", p_start=None,
               polish_steps=None) -> _Run:
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
    lr = methods.default_lr(settings.method, default_lr(d)) if lr is None else val.check_positive_float(lr, "lr")
    precision = check_precision(precision, PENALTY_PRECISIONS)
    check_memory(k, d, dtype, device, backend)  # before any allocation
    if settings.method == "smooth-max" and precision != "highest":
        raise ValueError(f"precision={precision!r} does not apply to method='smooth-max' (its objective is streamed "
                         "by PyTorch in float32, not by the penalty kernel); use precision='highest'")
    return _Run(k, d, val.check_int(steps, "steps", 1), settings.p_end, lr, val.check_seed(seed),
                device, dtype, backend, precision, settings)


def _step_loss(X: torch.Tensor, run: _Run, step: int) -> torch.Tensor:
    """The penalty of one step; vectors that became NaN/Inf are reported as the optimizer's
    divergence (with the step and the settings), not as a bad input."""
    try:
        return gram_offdiag_penalty(X, run.p, normalize=True, reduction="sum", backend=run.backend,
                                    precision=run.precision)
    except ValueError as exc:
        if "NaN/Inf" not in str(exc) or step == 0:
            raise
        raise PackingDiverged(f"packing diverged at step {step}: the vectors became NaN/Inf ({run.dtype}, lr={run.lr}, "
                           f"p={run.p}); try a smaller lr or float32/float64") from exc


def _reports_exact(run: _Run, step: int) -> bool:
    """Whether the loss recorded for `step` is evaluated again by the exact kernel: the first and
    the last step of a run whose steps use a reduced precision (loss_init and loss_final)."""
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


def _packing_result(run: _Run, eps_init, X, history, start, polish_history=()) -> PackingResult:
    """ε* and the statistics of the final vectors X (all k rows, on this process alone)."""
    with distributed.local():
        eps_star, mean, std = _eps_stats(X, run.backend)
    return PackingResult(
        k=run.k, d=run.d, steps=run.steps, p=run.p, lr=run.lr, seed=run.seed,
        dtype=str(run.dtype).replace("torch.", ""), device=str(run.device), backend=run.backend,
        precision=run.precision,
        eps_star=float(eps_star), eps_star_init=float(eps_init), mean=float(mean), std=float(std),
        mu_plus_2sigma=float(mean + 2.0 * std), welch=float(capacity.welch_bound(run.k, run.d)),
        loss_init=float(history[0]), loss_final=float(history[-1]), loss_history=history,
        seconds=time.perf_counter() - start, method=run.settings.method, p_start=run.settings.p_start,
        polish_steps=run.settings.polish_steps, polish_history=list(polish_history),
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
        """This rank's part of the loss and its rows' gradient at the steps' precision; with
        `exact`, the part from the exact kernel instead (loss_init and loss_final)."""
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


# ----------------------------------------------------------------------------------- sweep

def _cell_record(result: PackingResult) -> dict:
    # Timings and the device are left out so that a resumed sweep writes the same file as an
    # uninterrupted one; the loss history is left out to keep the file small.
    rec = result.to_dict(history=False, timing=False)
    rec.pop("device")
    rec.pop("backend")
    return {key: rec[key] for key in CELL_FIELDS}


def _cell_settings(k: int, d: int, want: dict) -> dict:
    """The settings a cell (k, d) of a sweep with settings `want` is made with (p, p_start,
    polish_steps and lr left as None resolved to the method's defaults for that cell)."""
    settings = methods.check_method(want["method"], want["p"], want["p_start"], want["polish_steps"],
                                    default_p(k, d), int)
    return {"steps": want["steps"], "seed": want["seed"], "dtype": want["dtype"], "precision": want["precision"],
            "lr": want["lr"] if want["lr"] is not None else methods.default_lr(want["method"], default_lr(d)),
            **settings.to_dict()}


def _matches(cell: dict, want: dict) -> bool:
    """Whether a finished cell was made with the sweep's settings (the method and its settings,
    steps, seed, dtype, precision and lr; those not given resolved to their defaults for the
    cell's (k, d))."""
    expected = _cell_settings(cell["k"], cell["d"], want)
    return all(cell[key] == expected[key] for key in SETTING_KEYS)


def sweep(
    ks: Iterable[int],
    ds: Iterable[int],
    out: str,
    *,
    steps: int = 5000,
    p: Optional[int] = None,
    lr: Optional[float] = None,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    backend: str = "auto",
    resume: bool = True,
    progress: bool = True,
    on_cell: Optional[Callable[[dict], None]] = None,
    group=None,
    method: str = "paper",
    p_start: Optional[int] = None,
    polish_steps: Optional[int] = None,
    precision: str = "highest",
) -> List[dict]:
    """Runs ``optimize`` on every (k, d) of the grid (d outer, k inner) and rewrites `out` after
    each finished cell (JSON, or CSV when `out` ends in .csv), atomically.

    Every cell records its method and the method's settings (``method``, ``p_start``, ``p``,
    ``polish_steps``; see ``optimize``) and the precision of its steps. With resume=True (default)
    the cells already in `out` with the same settings (method and its settings, steps, seed,
    dtype, precision and lr, where those left as None mean their defaults for each cell) are kept
    and skipped, so a killed sweep loses at most the cell in flight; a cell made by another method
    (or other settings, or another precision) is an error, so one file never mixes methods or
    precisions. resume=False starts the
    sweep file anew (a file that is not a sweep file is never overwritten). A cell of `out` with
    other settings is an error (use another file). Repeated values in ks or ds run once.
    `on_cell(record)` is called after each cell is written. precision: of the penalty steps, as in
    ``optimize`` (ε*, μ + 2σ and the recorded losses are the exact kernel's at any precision).
    Shows the cells done and an ETA. Returns the records in grid order.

    Across ranks (a process group given as `group=`, or torchrun's default group): the cells left
    to do are split by their cost (k²·d·steps), each rank runs its own and writes each finished
    cell at once to its part file `out.partR` (R its rank); at the end rank 0 merges the part files
    into `out` and removes them. A resume (with any number of ranks) reads `out` and every part
    file, so a killed rank loses at most its cell in flight. Rank 0 shows the progress and ETA of
    its own cells. Every rank returns the same records.

    One sweep at a time writes `out`: the sweep (rank 0 across ranks) holds an exclusive lock on it
    (``out.lock``, removed at the end, released if the process dies), and a second sweep on the same
    file is refused at once with a ValueError (across ranks: on every rank).
    """
    ks, ds = grid_values(ks, "ks", 2), grid_values(ds, "ds", 1)
    if not ks or not ds:
        raise ValueError("ks and ds must each name at least one value")
    steps = val.check_int(steps, "steps", 1)
    seed = val.check_seed(seed)
    name = resolve_backend(backend, val.check_device(device), "gram_offdiag_penalty")  # before any file work
    p = None if p is None else check_penalty_p(p, name)
    lr = None if lr is None else val.check_positive_float(lr, "lr")
    dtype = val.check_dtype(dtype)
    check = methods.check_method(method, p, p_start, polish_steps, 1, lambda value: check_penalty_p(value, name))
    precision = check_precision(precision, PENALTY_PRECISIONS)
    want = {"method": method, "steps": steps, "seed": seed, "dtype": str(dtype).replace("torch.", ""),
            "precision": precision, "p": p,
            "p_start": p_start if p_start is None else check.p_start,
            "polish_steps": polish_steps if polish_steps is None else check.polish_steps, "lr": lr}
    if dtype == torch.float16 or (method == "smooth-max" and precision != "highest"):
        _check_run(ks[0], ds[0], steps, p, lr, seed, device, dtype, backend, precision, method, p_start,
                   polish_steps)  # its error
    out = val.check_output_file(out, "out")  # its folder created and writable before any work
    group = distributed.resolve_group(group)
    rank, world = (0, 1) if group is None else distributed.rank_and_world(group)
    run = {"steps": steps, "p": p, "lr": lr, "seed": seed, "device": device, "dtype": dtype, "backend": backend,
           "precision": precision, "method": method, "p_start": p_start, "polish_steps": polish_steps}
    with contextlib.ExitStack() as held:
        # One sweep at a time writes `out` (two would each rewrite it from their own cells): its writer,
        # the process or rank 0, holds its lock throughout; a second sweep is refused at once, on every rank.
        def lock():
            return held.enter_context(sweep_lock(out)) if rank == 0 else None

        if group is None:
            lock()
        else:  # rank 0 takes it; all raise if it cannot
            distributed.run_on_every_rank("sweep (lock)", lock, group)
        return _sweep_locked(ks, ds, out, want, run, resume, progress, on_cell, group, rank, world)


def _sweep_locked(ks, ds, out, want, run, resume, progress, on_cell, group, rank, world) -> List[dict]:
    """The sweep of `sweep`, its arguments checked and `out` locked."""
    steps = want["steps"]
    if resume:
        try:
            existing = read_cells(out)
        except ValueError as exc:
            if is_sweep_file(out):  # a torn or corrupted sweep file: say how to start over
                raise ValueError(f"{exc}; resume=False (repcap sweep --restart) starts {out!r} anew") from None
            raise
    elif not is_sweep_file(out):
        read_cells(out)  # never overwrite a foreign file, even when starting anew ([] when there is none)
    parts = part_files(out)
    if not resume:
        existing = []
        if group is None or rank == 0:
            remove_part_files(out, parts)
        parts = []
    # One record per cell: exact repeats across out and the part files are dropped, conflicts refused.
    existing = merge_cells([(out, existing)] + [(path, read_cells(path)) for path in parts])
    for cell in existing:
        if not _matches(cell, want):
            raise ValueError(
                f"out={out!r} holds a cell (k={cell['k']}, d={cell['d']}) made with other settings "
                f"({ {key: cell[key] for key in SETTING_KEYS} }; this sweep would make it with "
                f"{ {key: _cell_settings(cell['k'], cell['d'], want)[key] for key in SETTING_KEYS} }); one file "
                "holds one method and its settings: use another file or resume=False"
            )
    done = {(c["k"], c["d"]): c for c in existing}
    grid = [(k, d) for d in ds for k in ks]
    todo = [cell for cell in grid if cell not in done]
    device = val.check_device(run["device"])
    for k, d in todo:  # every cell left to run fits in memory, before the first runs (done cells need none)
        check_memory(k, d, run["dtype"], device, resolve_backend(run["backend"], device, "gram_offdiag_penalty"))
    if group is None and parts:  # a distributed sweep was cut short: its part files join `out` now
        write_cells(out, grid_order(done, grid))
    if group is None:  # (also the temporary file of a rank killed in its first write, with no part file)
        remove_part_files(out, parts)
    if group is not None:
        distributed.check_same_on_all_ranks("sweep", {"grid": grid, "settings": want, "out": os.path.abspath(out),
                                                      "todo": todo}, group)
        owner = distributed.assign_units([k * k * d * steps for k, d in todo], world)
        todo = [cell for cell, o in zip(todo, owner) if o == rank]
    mine = read_cells(part_file(out, rank)) if group is not None and resume else []

    def run_mine():
        with distributed.local(), \
                progress_bar(progress and rank == 0, total=len(todo), unit="cell", leave=True,
                             desc="sweep" if group is None else f"sweep, rank 0 of {world}") as bar:
            for k, d in todo:  # each rank's cells are its own: no op inside may meet the other ranks
                bar.set_postfix_str(f"k={k} d={d}")
                result = optimize(k, d, progress=False, **run)
                done[(k, d)] = _cell_record(result)
                if group is None:
                    write_cells(out, grid_order(done, grid))
                else:
                    mine.append(done[(k, d)])
                    write_cells(part_file(out, rank), mine)
                bar.update(1)
                if on_cell is not None:
                    on_cell(done[(k, d)])

    if group is None:
        run_mine()
        return [done[c] for c in grid]
    distributed.run_on_every_rank("sweep", run_mine, group)  # every rank has finished (or all raise)
    if rank == 0:  # merge the part files into out, then remove them
        merged = {(c["k"], c["d"]): c for c in merge_cells([(out, existing if resume else [])] +
                                                          [(path, read_cells(path)) for path in part_files(out)])}
        write_cells(out, grid_order(merged, grid))
        remove_part_files(out, part_files(out))
    distributed.run_on_every_rank("sweep (merge)", lambda: None, group)
    final = {(c["k"], c["d"]): c for c in read_cells(out)}
    return [final[c] for c in grid]


__all__ = ["PENALTY_PRECISIONS", "PackingResult", "default_lr", "default_p", "load_cells", "optimize", "sweep"]
