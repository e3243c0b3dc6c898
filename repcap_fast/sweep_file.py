"""Sweep files of the packing simulation: one record per (k, d) cell, as JSON (with a format tag)
or CSV, rewritten atomically after each cell; the part files of a sweep across ranks.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from typing import List

SWEEP_FORMAT = "repcap_fast.packing.sweep/1"
CELL_FIELDS = ("k", "d", "steps", "p", "lr", "seed", "dtype", "eps_star", "eps_star_init",
               "mean", "std", "mu_plus_2sigma", "welch", "eps_over_welch", "eps_minus_welch",
               "loss_init", "loss_final")
# A cell is reused on resume only when these match the sweep's settings.
SETTING_KEYS = ("steps", "seed", "dtype", "p", "lr")


def read_cells(path: str) -> List[dict]:
    """The cells of the sweep file at `path` ([] when there is none); a file that is not a
    sweep file is an error (it is never overwritten)."""
    if not os.path.exists(path):
        return []
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != CELL_FIELDS:
                raise ValueError(f"out={path!r} exists and is not a repcap_fast sweep file; pick another path")
            rows = list(reader)
        cells = []
        for row in rows:
            cell = {}
            for key in CELL_FIELDS:
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


def write_cells(path: str, cells: List[dict]) -> None:
    """Atomically (write a temporary file, then rename): a kill never leaves a torn file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        if path.endswith(".csv"):
            writer = csv.DictWriter(f, fieldnames=CELL_FIELDS, lineterminator="\n")
            writer.writeheader()
            for cell in cells:
                writer.writerow({k: ("" if cell[k] is None else repr(cell[k]) if isinstance(cell[k], float)
                                     else cell[k])
                                 for k in CELL_FIELDS})
        else:
            json.dump({"format": SWEEP_FORMAT, "cells": cells}, f, indent=1)
            f.write("\n")
    os.replace(tmp, path)


def part_file(out: str, rank: int) -> str:
    return f"{out}.part{rank}"


def part_files(out: str) -> List[str]:
    """The part files of a distributed sweep into `out`, from any earlier number of ranks."""
    return sorted(p for p in glob.glob(glob.escape(out) + ".part*") if p[len(out) + 5 :].isdigit())


def load_cells(path: str) -> List[dict]:
    """The cells of a sweep file (JSON or CSV)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no sweep results at {path!r}")
    return read_cells(path)
