"""Packing simulation (Guha 2026, §1.3): how closely can k unit vectors in R^d avoid each other?

``optimize`` starts from k random unit vectors and minimizes L = Σ_{i≠j}|ĝ_ij|^p with Adam,
through the streaming penalty kernel (``gram_offdiag_penalty``, never k×k). ``sweep`` runs a
(k, d) grid and writes every finished cell at once, so an interrupted sweep resumes where it
stopped. ``capacity.fit`` then fits the constants of the capacity formulas to ε*.

Vectors are the rows of a k×d matrix here; the paper's code stores them as the columns of d×k.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence

import torch

from . import capacity
from .penalty import check_p, gram_offdiag_penalty

SWEEP_FORMAT = "repcap_fast.packing.sweep/1"
_PROGRESS_FLOPS = 2e11  # show a progress bar above about this much work (a few CPU seconds)
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_lr(d: int) -> float:
    """The paper's learning rate: 0.005 for d ≤ 1024, else 0.0025."""
    return 0.005 if d <= 1024 else 0.0025


def default_p(k: int, d: int) -> int:
    """The paper's exponent p = min(int(m / ln d), 20), with m = 40 if k ≤ 4000, else 50 if
    d ≥ 3072, else 60 (d = 1 gives 20; p is at least 1)."""
    m = 40 if k <= 4000 else (50 if d >= 3072 else 60)
    if d <= 1:
        return 20
    return max(1, min(int(m / math.log(d)), 20))


@dataclass
class PackingResult:
    """One packing run. ``eps_star`` = max_{i≠j}|ĝ_ij| after the last Adam step;
    ``loss_history[s]`` is the loss step s evaluated (before its update)."""

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
        if not timing:
            out.pop("seconds")
        return out


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (hasattr(value, "__index__")):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_lr(lr) -> float:
    lr = float(lr)
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    return lr


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {dtype!r}")
        return _DTYPES[dtype]
    if dtype not in _DTYPES.values():
        raise TypeError(f"dtype must be a float dtype, got {dtype!r}")
    return dtype


def _eps_stats(x: torch.Tensor, backend: str):
    """(ε* = max|ĝ|, mean, std) of the off-diagonal ĝ_ij (pairs i<j), streamed by kernel 1."""
    from .cosine_stats import pairwise_cosine_stats

    stats = pairwise_cosine_stats(x, bins=1, backend=backend, progress=False)
    return max(abs(stats.min), abs(stats.max)), stats.mean, stats.std


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
    progress: Optional[bool] = None,
    group=None,
) -> PackingResult:
    """Packs k unit vectors in R^d by minimizing Σ_{i≠j}|ĝ_ij|^p with Adam (the paper's setup).

    The vectors are the rows of a k×d parameter initialized from a seeded standard normal (drawn
    on the CPU, so the start does not depend on the device) and row-normalized; the loss is
    computed on the row-normalized vectors every step and the raw parameters are never
    projected back. Defaults follow the paper: lr = ``default_lr(d)``, p = ``default_p(k, d)``.
    k ≤ d is allowed: the optimum is then exact orthogonality (ε* → 0).

    Returns ε* = max|ĝ| after the last step, μ + 2σ of the final off-diagonal ĝ, ε* of the
    random start, the Welch lower bound for (k, d), the loss of every step (``loss_history[s]``
    is the loss evaluated by step s, before its update) and the backend that ran.
    (The paper's script reads ε* in the forward pass of its last step, i.e. after steps − 1
    updates; here it is read after all `steps` updates.)

    Across ranks (`group=`, or torchrun's default group; backends cpu and cuda): each rank owns a
    contiguous block of rows and the Adam state of those rows only. Every step the ranks
    all-gather the rows, each computes its rows' loss and gradient with the fused kernel run on
    its block against all k rows (`penalty.rows_loss_and_grad`), and the losses are summed. The
    trajectory is the single-process one up to float rounding (the kernel's tiles start at other
    rows).
    """
    from ._backends import resolve_backend
    from .distributed import prepare_on_every_rank, resolve_group

    group = resolve_group(group)

    def prepare():  # every check before the first collective, so that a failure reaches every rank
        k_ = _check_int(k, "k", 2)
        d_ = _check_int(d, "d", 1)
        p_ = default_p(k_, d_) if p is None else check_p(p)
        lr_ = default_lr(d_) if lr is None else _check_lr(lr)
        device_ = torch.device(device)
        backend_ = resolve_backend(backend, device_, "gram_offdiag_penalty")
        if group is not None and backend_ not in ("cpu", "cuda"):
            raise ValueError(f"packing across ranks runs on the cpu and cuda backends, not {backend_!r}")
        return (k_, d_, _check_int(steps, "steps", 1), p_, lr_, _check_int(seed, "seed", 0), _dtype(dtype), device_,
                backend_)

    k, d, steps, p, lr, seed, dtype, device, used_backend = prepare_on_every_rank(
        "optimize", prepare, lambda prep: {"k": prep[0], "d": prep[1], "steps": prep[2], "p": prep[3], "lr": prep[4],
                                           "seed": prep[5], "dtype": str(prep[6]), "backend": prep[8]}, group)
    if group is not None:
        return _optimize_across_ranks(k, d, steps, p, lr, seed, device, dtype, used_backend, progress, group)
    X = _initial_vectors(k, d, seed).to(device=device, dtype=dtype).requires_grad_(True)
    eps_init, _, _ = _eps_stats(X.detach(), used_backend)
    opt = torch.optim.Adam([X], lr=lr)
    losses = torch.empty(steps, dtype=torch.float64, device=device)
    bar = _step_bar(progress, 4.0 * k * k * d * steps, steps, f"pack k={k} d={d} p={p}")
    start = time.perf_counter()
    try:
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = gram_offdiag_penalty(X, p, normalize=True, reduction="sum", backend=used_backend)
            loss.backward()
            opt.step()
            losses[step] = loss.detach()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return _packing_result(k, d, steps, p, lr, seed, dtype, device, used_backend, eps_init, X.detach(),
                           losses.cpu().tolist(), start)


def _initial_vectors(k: int, d: int, seed: int) -> torch.Tensor:
    """The seeded random start: k unit rows in R^d, drawn in float64 on the CPU."""
    x0 = torch.randn(k, d, generator=torch.Generator(device="cpu").manual_seed(seed), dtype=torch.float64)
    return x0 / torch.linalg.vector_norm(x0, dim=1, keepdim=True)


def _step_bar(progress, flops: float, steps: int, desc: str):
    if not (progress if progress is not None else flops >= _PROGRESS_FLOPS):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=steps, desc=desc, unit=" step", leave=False)


def _packing_result(k, d, steps, p, lr, seed, dtype, device, backend, eps_init, X, history, start) -> PackingResult:
    """ε* and the statistics of the final vectors X (all k rows, on this process alone)."""
    from .distributed import local

    with local():
        eps_star, mean, std = _eps_stats(X, backend)
    return PackingResult(
        k=k, d=d, steps=steps, p=p, lr=lr, seed=seed,
        dtype=str(dtype).replace("torch.", ""), device=str(device), backend=backend,
        eps_star=float(eps_star), eps_star_init=float(eps_init), mean=float(mean), std=float(std),
        mu_plus_2sigma=float(mean + 2.0 * std), welch=float(capacity.welch_bound(k, d)),
        loss_init=float(history[0]), loss_final=float(history[-1]), loss_history=history,
        seconds=time.perf_counter() - start,
    )


def _optimize_across_ranks(k, d, steps, p, lr, seed, device, dtype, used_backend, progress, group) -> PackingResult:
    import torch.distributed as dist

    from ._validation import compute_dtype
    from .distributed import comm_device, contiguous_share, local, rank_and_world, run_on_every_rank
    from .penalty import rows_loss_and_grad

    rank, world = rank_and_world(group)
    full = _initial_vectors(k, d, seed).to(device=device, dtype=dtype)
    own = contiguous_share(k, rank, world)
    block = -(-k // world)  # all_gather takes equal sizes: blocks are padded to this many rows
    X = full[own.start : own.stop].clone().requires_grad_(True)
    with local():  # every rank holds all rows: the statistics need no other rank (and no subgroup)
        eps_init, _, _ = _eps_stats(full, used_backend)
    opt = torch.optim.Adam([X], lr=lr)  # the Adam state of this rank's rows only
    comm = comm_device(group)
    losses = torch.empty(steps, dtype=torch.float64)
    shares = [contiguous_share(k, r, world) for r in range(world)]

    def gather_rows() -> torch.Tensor:
        padded = torch.zeros(block, d, dtype=dtype, device=comm)
        padded[: len(own)] = X.detach().to(comm)
        pieces = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(pieces, padded, group=group)
        return torch.cat([piece[: len(sh)] for piece, sh in zip(pieces, shares)]).to(full.device)

    bar = _step_bar(progress, 4.0 * k * k * d * steps / world, steps, f"pack k={k} d={d} p={p}, {world} ranks") \
        if rank == 0 else None
    start = time.perf_counter()
    try:
        for step in range(steps):
            rows = gather_rows()
            if len(own):
                part, grad = run_on_every_rank("optimize", lambda: rows_loss_and_grad(rows, own.start, own.stop, p,
                                                                                       used_backend), group)
            else:
                part, grad = torch.zeros((), dtype=torch.float64), None
                run_on_every_rank("optimize", lambda: None, group)
            total = part.detach().to(torch.float64).reshape(1).to(comm)
            dist.all_reduce(total, group=group)
            if grad is not None:
                X.grad = grad.to(X.dtype)
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses[step] = float(total.to(compute_dtype(dtype)))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return _packing_result(k, d, steps, p, lr, seed, dtype, device, used_backend, eps_init, gather_rows(),
                           losses.tolist(), start)


# ----------------------------------------------------------------------------------- sweep

_CSV_FIELDS = ("k", "d", "steps", "p", "lr", "seed", "dtype", "eps_star", "eps_star_init",
               "mean", "std", "mu_plus_2sigma", "welch", "eps_over_welch", "eps_minus_welch",
               "loss_init", "loss_final")
# A cell is reused on resume only when these match the sweep's settings.
_SETTING_KEYS = ("steps", "seed", "dtype", "p", "lr")


def _cell_record(result: PackingResult) -> dict:
    # Timings and the device are left out so that a resumed sweep writes the same file as an
    # uninterrupted one; the loss history is left out to keep the file small.
    rec = result.to_dict(history=False, timing=False)
    rec.pop("device")
    rec.pop("backend")
    return {key: rec[key] for key in _CSV_FIELDS}


def _read_cells(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != _CSV_FIELDS:
                raise ValueError(f"out={path!r} exists and is not a repcap_fast sweep file; pick another path")
            rows = list(reader)
        cells = []
        for row in rows:
            cell = {}
            for key in _CSV_FIELDS:
                value = row.get(key, "")
                if key in ("k", "d", "steps", "p", "seed"):
                    cell[key] = int(value)
                elif key == "dtype":
                    cell[key] = value
                else:
                    cell[key] = float(value) if value not in ("", "None") else None
            cells.append(cell)
        return cells
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != SWEEP_FORMAT:
        raise ValueError(f"out={path!r} exists and is not a repcap_fast sweep file; pick another path")
    return list(data["cells"])


def _write_cells(path: str, cells: List[dict]) -> None:
    """Atomically (write a temporary file, then rename): a kill never leaves a torn file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        if path.endswith(".csv"):
            writer = csv.DictWriter(f, fieldnames=_CSV_FIELDS, lineterminator="\n")
            writer.writeheader()
            for cell in cells:
                writer.writerow({k: ("" if cell[k] is None else repr(cell[k]) if isinstance(cell[k], float) else cell[k])
                                 for k in _CSV_FIELDS})
        else:
            json.dump({"format": SWEEP_FORMAT, "cells": cells}, f, indent=1)
            f.write("\n")
    os.replace(tmp, path)


def _matches(cell: dict, want: dict) -> bool:
    """Whether a finished cell was made with the sweep's settings (p and lr: the given ones, or
    the paper's defaults for the cell's (k, d) when not given)."""
    p = want["p"] if want["p"] is not None else default_p(cell["k"], cell["d"])
    lr = want["lr"] if want["lr"] is not None else default_lr(cell["d"])
    return (cell["steps"] == want["steps"] and cell["seed"] == want["seed"]
            and cell["dtype"] == want["dtype"] and cell["p"] == p and cell["lr"] == lr)


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
) -> List[dict]:
    """Runs ``optimize`` on every (k, d) of the grid (d outer, k inner) and rewrites `out` after
    each finished cell (JSON, or CSV when `out` ends in .csv), atomically.

    With resume=True (default) the cells already in `out` with the same settings (steps, seed,
    dtype, p and lr, where p and lr left as None mean the paper's defaults for each cell) are kept
    and skipped, so a killed sweep loses at most the cell in flight. resume=False starts the
    sweep file anew (a file that is not a sweep file is never overwritten). A cell of `out` with
    other settings is an error (use another file). Repeated values in ks or ds run once.
    `on_cell(record)` is called after each cell is written.
    Shows the cells done and an ETA. Returns the records in grid order.

    Across ranks (a process group given as `group=`, or torchrun's default group): the cells left
    to do are split by their cost (k²·d·steps), each rank runs its own and writes each finished
    cell at once to its part file `out.partR` (R its rank); at the end rank 0 merges the part files
    into `out` and removes them. A resume (with any number of ranks) reads `out` and every part
    file, so a killed rank loses at most its cell in flight. Rank 0 shows the progress and ETA of
    its own cells. Every rank returns the same records.
    """
    ks = list(dict.fromkeys(_check_int(k, "ks", 2) for k in ks))  # order kept, repeats dropped
    ds = list(dict.fromkeys(_check_int(d, "ds", 1) for d in ds))
    if not ks or not ds:
        raise ValueError("ks and ds must each name at least one value")
    steps = _check_int(steps, "steps", 1)
    p = None if p is None else check_p(p)
    lr = None if lr is None else _check_lr(lr)
    dtype = _dtype(dtype)
    want = {"steps": steps, "seed": seed, "dtype": str(dtype).replace("torch.", ""), "p": p, "lr": lr}
    out = os.fspath(out)
    from .distributed import assign_units, check_same_on_all_ranks, rank_and_world, resolve_group, run_on_every_rank

    group = resolve_group(group)
    rank, world = (0, 1) if group is None else rank_and_world(group)
    existing = _read_cells(out)  # also when not resuming: never overwrite a foreign file
    parts = _part_files(out)
    if not resume:
        existing = []
        if group is None or rank == 0:
            for path in parts:
                os.remove(path)
        parts = []
    for path in parts:
        existing += _read_cells(path)
    for cell in existing:
        if not _matches(cell, want):
            raise ValueError(
                f"out={out!r} holds a cell (k={cell['k']}, d={cell['d']}) with other settings "
                f"({ {key: cell[key] for key in _SETTING_KEYS} }; this sweep: {want}, None = the "
                "paper's default); use another file or "
                "resume=False"
            )
    done = {(c["k"], c["d"]): c for c in existing}
    grid = [(k, d) for d in ds for k in ks]
    todo = [cell for cell in grid if cell not in done]
    if group is None and parts:  # a distributed sweep was cut short: its part files join `out` now
        ordered = [done[c] for c in grid if c in done]
        ordered += [c for key, c in done.items() if key not in set(grid)]
        _write_cells(out, ordered)
        for path in parts:
            os.remove(path)
    if group is not None:
        check_same_on_all_ranks("sweep", {"grid": grid, "settings": want, "out": os.path.abspath(out),
                                          "todo": todo}, group)
        owner = assign_units([k * k * d * steps for k, d in todo], world)
        todo = [cell for cell, o in zip(todo, owner) if o == rank]
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="sweep" if group is None else f"sweep, rank 0 of {world}", unit=" cell")
    mine = _read_cells(_part_file(out, rank)) if group is not None and resume else []

    def run_mine():
        try:
            for k, d in todo:
                if bar is not None:
                    bar.set_postfix_str(f"k={k} d={d}")
                result = optimize(k, d, steps=steps, p=p, lr=lr, seed=seed, device=device,
                                  dtype=dtype, backend=backend, progress=False)
                done[(k, d)] = _cell_record(result)
                if group is None:
                    ordered = [done[c] for c in grid if c in done]
                    ordered += [c for key, c in done.items() if key not in set(grid)]  # cells of other grids
                    _write_cells(out, ordered)
                else:
                    mine.append(done[(k, d)])
                    _write_cells(_part_file(out, rank), mine)
                if bar is not None:
                    bar.update(1)
                if on_cell is not None:
                    on_cell(done[(k, d)])
        finally:
            if bar is not None:
                bar.close()

    if group is None:
        run_mine()
        return [done[c] for c in grid]

    def run_mine_locally():
        from .distributed import local

        with local():  # each rank's cells are its own: no op inside may meet the other ranks
            run_mine()

    run_on_every_rank("sweep", run_mine_locally, group)  # every rank has finished (or all raise)
    if rank == 0:  # merge the part files into out, then remove them
        merged = {(c["k"], c["d"]): c for c in (existing if resume else [])}
        for path in _part_files(out):
            merged.update({(c["k"], c["d"]): c for c in _read_cells(path)})
        ordered = [merged[c] for c in grid if c in merged]
        ordered += [c for key, c in merged.items() if key not in set(grid)]
        _write_cells(out, ordered)
        for path in _part_files(out):
            os.remove(path)
    run_on_every_rank("sweep (merge)", lambda: None, group)
    final = {(c["k"], c["d"]): c for c in _read_cells(out)}
    return [final[c] for c in grid]


def _part_file(out: str, rank: int) -> str:
    return f"{out}.part{rank}"


def _part_files(out: str) -> List[str]:
    """The part files of a distributed sweep into `out`, from any earlier number of ranks."""
    import glob

    return sorted(p for p in glob.glob(glob.escape(out) + ".part*") if p[len(out) + 5 :].isdigit())


def load_cells(path: str) -> List[dict]:
    """The cells of a sweep file (JSON or CSV)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no sweep results at {path!r}")
    return _read_cells(path)


__all__ = ["PackingResult", "default_lr", "default_p", "load_cells", "optimize", "sweep"]
