"""Packing simulation (Guha 2026, §1.3): how closely can k unit vectors in R^d avoid each other?

``optimize`` starts from k random unit vectors and drives their coherence ε* = max_{i≠j}|ĝ_ij|
down, by the paper's method (Adam on L = Σ_{i≠j}|ĝ_ij|^p through the streaming penalty kernel) or
the others of ``METHODS``. ``sweep`` runs a (k, d) grid and writes every finished cell at once, so
an interrupted sweep resumes where it stopped; ``fitting.fit`` then fits the constants of the
capacity formulas to ε*.

The modules, each importing only those above it in this list:

- ``result`` (``PackingResult``, ``default_lr``, ``default_p``), ``memory`` (the memory check) and
  ``ansatz`` (the symmetry ansätze of the equiangular-frame search);
- ``projection`` (alternating projection) and ``search`` (the equiangular-frame search);
- ``methods`` (the optimizers and their settings);
- ``polish`` (the polishes after a method);
- ``optimizer`` (``optimize``);
- ``sweep_file`` (the sweep file format) and ``sweeps`` (``sweep`` and its loop).

Vectors are the rows of a k×d matrix here; the paper's code stores them as the columns of d×k.
"""

from .._backends import PENALTY_PRECISIONS
from .methods import METHODS, NO_P, MethodSettings, PackingDiverged  # noqa: F401  method= names; optimize raises
from .optimizer import optimize
from .result import PackingResult, default_lr, default_p
from .sweep_file import (  # noqa: F401  the sweep file's names, also served from here (packing.SWEEP_FORMAT, ...)
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
from .sweeps import sweep

__all__ = ["PENALTY_PRECISIONS", "PackingResult", "default_lr", "default_p", "load_cells", "optimize", "sweep"]
