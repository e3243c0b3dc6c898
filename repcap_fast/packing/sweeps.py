"""Packing sweeps: ``sweep`` and its loop ``run_sweep``.

``sweep`` runs ``optimize`` over a (k, d) grid and writes every finished cell at once, so an
interrupted sweep resumes where it stopped; ``run_sweep`` is its loop (which finished cells a
resume keeps, one process or the ranks of a process group with their part files).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterable, List, Optional

import torch

from .. import _validation as val
from .. import distributed
from .._backends import PENALTY_PRECISIONS, check_precision, resolve_backend
from .._progress import progress_bar
from ..ops.gram_offdiag_penalty import check_penalty_p
from . import methods
from .memory import check_memory
from .optimizer import _check_restarts, _check_run
from .result import PackingResult, default_lr, default_p
from .sweep_file import (
    CELL_FIELDS,
    SETTING_KEYS,
    grid_order,
    grid_values,
    is_sweep_file,
    merge_cells,
    part_file,
    part_files,
    read_cells,
    remove_part_files,
    sweep_lock,
)


def _cell_record(result: PackingResult) -> dict:
    """The sweep file's record of one cell: the fields of CELL_FIELDS of the result.

    Timings and the device are left out so that a resumed sweep writes the same file as an
    uninterrupted one; the loss history is left out to keep the file small.
    """
    rec = result.to_dict(history=False, timing=False)
    rec.pop("device")
    rec.pop("backend")
    return {key: rec[key] for key in CELL_FIELDS}


def _cell_settings(k: int, d: int, want: dict) -> dict:
    """The settings a cell (k, d) of a sweep with settings `want` is made with.

    p, p_start, polish_steps and lr left as None are resolved to the method's defaults for that
    cell.
    """
    settings = methods.check_method(want["method"], want["p"], want["p_start"], want["polish_steps"],
                                    default_p(k, d), int)
    return {"steps": want["steps"], "seed": want["seed"], "dtype": want["dtype"], "precision": want["precision"],
            "restarts": want["restarts"], "projection_steps": want["projection_steps"],
            "lr": want["lr"] if want["lr"] is not None else methods.default_lr(want["method"], default_lr(d)),
            **settings.to_dict()}


def _matches(cell: dict, want: dict) -> bool:
    """Whether a finished cell was made with the sweep's settings.

    The settings compared: the method and its settings, steps, projection_steps, seed, restarts,
    dtype, precision and lr (those not given resolved to their defaults for the cell's (k, d)).
    """
    expected = _cell_settings(cell["k"], cell["d"], want)
    return all(cell[key] == expected[key] for key in SETTING_KEYS)


def run_sweep(ks, ds, out, want, run, resume, progress, on_cell, group, rank, world, optimize: Callable,
              write_cells: Callable) -> List[dict]:
    """The sweep of ``packing.sweep``, its arguments checked and `out` locked.

    `optimize` and `write_cells` are the ones ``packing.sweep`` found in ``repcap_fast.packing``
    when it was called: each cell runs ``optimize(k, d, progress=False, **run)`` and every write
    of `out` (and of a rank's part file) goes through ``write_cells``.
    """
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
    for k, d in todo:  # every cell left to run fits in memory and its method, before the first runs
        check_memory(k, d, run["dtype"], device, resolve_backend(run["backend"], device, "gram_offdiag_penalty"))
        methods.check_sizes(want["method"], k, d, want["projection_steps"])
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
    restarts: int = 1,
    projection_steps: int = 0,
) -> List[dict]:
    """Runs ``optimize`` on every cell (k, d) of a grid and writes each finished cell to `out` at once.

    The cells run d outer, k inner; `out` (JSON, or CSV when it ends in .csv in any case) is
    rewritten atomically after each, so a killed sweep loses at most the cell in flight and a
    resume runs only the cells not on disk. A CSV file opens with a tag line and ends with a line
    counting its cells (`# end: N cells`), so a file cut anywhere is refused when read; a symlink
    at `out` is written through. Every cell records its method and the method's settings
    (``method``, ``p_start``, ``p``, ``polish_steps``), ``projection_steps``, steps, seed, dtype,
    precision and lr, and ε*, the statistics and the losses of its ``PackingResult``
    (``repcap_fast.packing.sweep_file.CELL_FIELDS``).
    One file holds one method and its settings. One sweep at a time writes `out`: it holds an
    exclusive lock (``out.lock``, removed at the end, released if the process dies).

    Args:
        ks: the numbers of vectors, ints ≥ 2; repeats run once.
        ds: the dimensions, ints ≥ 1; repeats run once.
        out: the sweep file; its folder is created.
        steps: optimizer steps per cell. Defaults to 5000.
        p: the exponent, as in ``optimize`` (None: its default for each cell).
        lr: the learning rate, as in ``optimize`` (None: its default for each cell).
        seed: the seed of every cell's random start. Defaults to 0.
        device (str | torch.device): where the cells run. Defaults to "cpu".
        dtype (torch.dtype | str): the vectors' dtype, as in ``optimize``. Defaults to float32.
        backend: the penalty kernel, as in ``optimize``. Defaults to "auto".
        resume: keep and skip the cells already in `out` (and in the part files of a sweep across
            ranks) made with the same settings, where settings left as None mean their defaults
            for each cell. False starts the file anew (a file that is not a sweep file is never
            overwritten). Defaults to True.
        progress: show the cells done and an ETA. Defaults to True.
        on_cell: called with each cell's record after it is written. Defaults to None.
        group (torch.distributed.ProcessGroup): the process group to split the cells across
            (default None: torchrun's default group when it has more than one rank, else this
            process alone). The cells left to do are split by their cost
            (k²·d·steps); each rank writes its finished cells at once to its part file
            ``out.partR`` (R its rank), and at the end rank 0 merges the part files into `out`
            and removes them. A resume, with any number of ranks, reads `out` and every part
            file. Every rank returns the same records.
        method: the optimizer, one of ``METHODS``. Defaults to "paper".
        p_start: the first p of a continuation method, as in ``optimize``.
        polish_steps: active-set polish steps, as in ``optimize``.
        precision: the operands of the penalty steps, as in ``optimize`` (ε*, μ + 2σ and the
            recorded losses are the exact kernel's at any precision). Defaults to "highest".
        restarts: seeded starts per cell, as in ``optimize`` (each cell records ``restarts`` and
            its ``best_seed``). Defaults to 1.
        projection_steps: alternating-projection polish steps per cell, as in ``optimize``.
            Defaults to 0.

    Returns:
        List[dict]: the records of the grid's cells, in grid order (d outer, k inner).

    Raises:
        ValueError: an argument as ``optimize`` refuses it (an ``ArgumentTypeError``, also a
            TypeError, for a wrong type), ks or ds empty or with more than 100,000 values
            (``packing.sweep_file.MAX_GRID_VALUES``, counted before any list is built), `out` a
            folder, not writable, or an existing file that is not a sweep file, a torn or corrupt
            sweep file on resume, a cell of `out` made with other settings, another sweep writing
            `out`, or a cell left to run that does not fit in memory.
        PackingDiverged: a cell's vectors became NaN/Inf (see ``optimize``); the cells written
            before it stay in `out`.
        RuntimeError: `group` given while torch.distributed is not initialized; across ranks,
            ``distributed.RankFailure`` on every rank when one fails.

    Examples:
        >>> import os, shutil, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> out = os.path.join(folder, "sweep.json")
        >>> cells = rf.packing.sweep([4, 6], [3], out, steps=20, progress=False)
        >>> [(c["k"], c["d"], c["method"]) for c in cells]
        [(4, 3, 'paper'), (6, 3, 'paper')]
        >>> len(rf.packing.load_cells(out))  # a second call with these settings would run nothing
        2
        >>> shutil.rmtree(folder)
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
    restarts = _check_restarts(seed, restarts)
    projection_steps = val.check_int(projection_steps, "projection_steps", 0)
    want = {"method": method, "projection_steps": projection_steps, "steps": steps, "seed": seed,
            "dtype": str(dtype).replace("torch.", ""), "precision": precision, "restarts": restarts, "p": p,
            "p_start": p_start if p_start is None else check.p_start,
            "polish_steps": polish_steps if polish_steps is None else check.polish_steps, "lr": lr}
    if dtype == torch.float16 or (method == "smooth-max" and precision != "highest") or (
            projection_steps and method == "alternating-projection"):
        _check_run(ks[0], ds[0], steps, p, lr, seed, device, dtype, backend, precision, method, p_start,
                   polish_steps, projection_steps)  # its error
    out = val.check_output_file(out, "out")  # its folder created and writable before any work
    group = distributed.resolve_group(group)
    rank, world = (0, 1) if group is None else distributed.rank_and_world(group)
    run = {"steps": steps, "p": p, "lr": lr, "seed": seed, "device": device, "dtype": dtype, "backend": backend,
           "precision": precision, "method": method, "p_start": p_start, "polish_steps": polish_steps,
           "restarts": restarts, "projection_steps": projection_steps}
    with contextlib.ExitStack() as held:
        # One sweep at a time writes `out` (two would each rewrite it from their own cells): its writer,
        # the process or rank 0, holds its lock throughout; a second sweep is refused at once, on every rank.
        def lock():
            return held.enter_context(sweep_lock(out)) if rank == 0 else None

        if group is None:
            lock()
        else:  # rank 0 takes it; all raise if it cannot
            distributed.run_on_every_rank("sweep (lock)", lock, group)
        # optimize and write_cells as repcap_fast.packing serves them now (a test may have replaced them)
        package = sys.modules[__package__]
        return run_sweep(ks, ds, out, want, run, resume, progress, on_cell, group, rank, world,
                         optimize=package.optimize, write_cells=package.write_cells)
