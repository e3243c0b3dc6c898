"""The cells of a packing sweep: which finished cells a resume keeps, and the loop that runs the rest.

The loop writes each cell at once (one process, or the ranks of a process group with their part
files). ``repcap_fast.packing.sweep`` checks its arguments, takes the lock and calls ``run_sweep``.
"""

from __future__ import annotations

import os
from typing import Callable, List

from . import _validation as val
from . import distributed
from . import packing_methods as methods
from ._backends import resolve_backend
from ._progress import progress_bar
from .packing_memory import check_memory
from .packing_result import PackingResult, default_lr, default_p
from .sweep_file import (
    CELL_FIELDS,
    SETTING_KEYS,
    grid_order,
    is_sweep_file,
    merge_cells,
    part_file,
    part_files,
    read_cells,
    remove_part_files,
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
