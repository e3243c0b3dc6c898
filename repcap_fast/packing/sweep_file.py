"""Sweep files of the packing simulation: one record per (k, d) cell, as JSON or CSV.

A JSON sweep file carries a format tag; either form is rewritten atomically after each cell. Also
here: the part files of a sweep across ranks, and the lock that keeps two sweeps from writing one
file at once.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import math
import os
import re
import warnings
from typing import Iterator, List, Sequence, Tuple

try:
    import fcntl
except ImportError:  # not on Windows: sweeps there take no lock
    fcntl = None

from .._backends import PENALTY_PRECISIONS
from .._validation import ArgumentTypeError, check_int
from ..capacity import coherence_bound
from .methods import METHODS

SWEEP_FORMAT = "repcap_fast.packing.sweep/5"
CELL_FIELDS = ("k", "d", "method", "steps", "p_start", "p", "polish_steps", "projection_steps", "lr", "seed",
               "restarts", "best_seed", "dtype", "precision", "eps_star", "eps_star_init", "mean", "std",
               "mu_plus_2sigma", "welch", "eps_over_welch", "eps_minus_welch", "bound", "bound_name",
               "eps_minus_bound", "loss_init", "loss_final")
# A cell is reused on resume only when these match the sweep's settings.
SETTING_KEYS = ("method", "steps", "p_start", "p", "polish_steps", "projection_steps", "seed", "restarts", "dtype",
                "precision", "lr")
_CERTIFICATE_FIELDS = ("bound", "bound_name", "eps_minus_bound")
# Version 4 had no alternating-projection polish: its cells are read with projection_steps 0.
SWEEP_FORMAT_V4 = "repcap_fast.packing.sweep/4"
_V4_FIELDS = tuple(f for f in CELL_FIELDS if f != "projection_steps")
_NEW_IN_V4 = ("restarts", "best_seed") + _CERTIFICATE_FIELDS
# Version 3 had no restarts (one start: restarts 1, best_seed its seed) and no certificate
# (capacity.coherence_bound of its k and d): they are filled in on reading.
SWEEP_FORMAT_V3 = "repcap_fast.packing.sweep/3"
_V3_FIELDS = tuple(f for f in _V4_FIELDS if f not in _NEW_IN_V4)
# Version 2 had no precision: its steps all ran at "highest", and its cells are read as such.
SWEEP_FORMAT_V2 = "repcap_fast.packing.sweep/2"
_V2_FIELDS = tuple(f for f in _V3_FIELDS if f != "precision")
# Version 1 (before the packing methods) had no method, p_start or polish_steps either: its cells
# were all made by the paper's method, and are read as such.
SWEEP_FORMAT_V1 = "repcap_fast.packing.sweep/1"
_V1_FIELDS = ("k", "d", "steps", "p", "lr", "seed", "dtype", "eps_star", "eps_star_init",
              "mean", "std", "mu_plus_2sigma", "welch", "eps_over_welch", "eps_minus_welch",
              "loss_init", "loss_final")
_OLD_FORMATS = (SWEEP_FORMAT_V4, SWEEP_FORMAT_V3, SWEEP_FORMAT_V2, SWEEP_FORMAT_V1)


def _certificate(k, d, eps_star) -> dict:
    """The certificate fields of a cell (k, d) of ε* eps_star (None or NaN: the gap is None)."""
    bound, name = coherence_bound(k, d)
    finite = isinstance(eps_star, (int, float)) and not isinstance(eps_star, bool) and math.isfinite(eps_star)
    return {"bound": bound, "bound_name": name, "eps_minus_bound": eps_star - bound if finite else None}


def _upgrade(cell):
    """A version-1 to -4 record as a version-5 one.

    Version 1's cells get method "paper", p_start = p and no polish; versions 1 and 2 get
    precision "highest"; versions 1 to 3 get restarts 1, best_seed their seed and the certificate
    of their k and d; all get projection_steps 0. (A record that is not a dict,
    already has the fields, or whose k or d is not a valid int is returned as it is, or without
    the certificate, for _check_cell to judge.)
    """
    if not isinstance(cell, dict) or all(key in cell for key in ("method", "precision", "projection_steps",
                                                                  *_NEW_IN_V4)):
        return cell
    out = dict(cell)
    out.setdefault("projection_steps", 0)
    if "method" not in cell:
        out.update(method="paper", p_start=cell.get("p"), polish_steps=0)
    out.setdefault("precision", "highest")
    if "restarts" not in cell and "best_seed" not in cell:
        out.update(restarts=1, best_seed=cell.get("seed"))
    k, d = cell.get("k"), cell.get("d")
    if not any(key in cell for key in _CERTIFICATE_FIELDS) and all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= _MAX_INT for v in (k, d)) and k >= 2:
        out.update(_certificate(k, d, cell.get("eps_star")))
    return out


_INT_FIELDS = {"k": 1, "d": 1, "steps": 1, "p_start": 1, "p": 1, "polish_steps": 0, "projection_steps": 0, "seed": 0,
               "restarts": 1, "best_seed": 0}  # least values
_STR_FIELDS = ("method", "dtype", "precision", "bound_name")
_FLOAT_FIELDS = tuple(f for f in CELL_FIELDS if f not in _INT_FIELDS and f not in _STR_FIELDS)  # or None
# Maxima of |cosines|, in [0, 1] (up to the float32 rounding of a cosine: a few ulps above 1), or NaN/null.
_UNIT_FIELDS = ("eps_star", "eps_star_init", "welch", "bound")
_UNIT_SLACK = 1e-5
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, as some editors save: read past, never written


_MAX_INT = 2**63 - 1  # seeds reach it; k, d, steps and p far below (floats hold them for the fit)


# a CSV sweep file's header row names its version
_CSV_HEADERS = (CELL_FIELDS, _V4_FIELDS, _V3_FIELDS, _V2_FIELDS, _V1_FIELDS)
# A CSV sweep file written now opens with this line (before its header) and ends with an end line
# that counts its cells: a file cut anywhere, even between two rows, is refused when read. Files
# written before these lines were introduced are read when they end with a newline (a cut inside
# a row is refused; a cut between rows cannot be seen in them).
_CSV_TAG = f"# {SWEEP_FORMAT} CSV (this line; the header; one row per cell; an end line with their count)"
_CSV_END = re.compile(r"# end: ([0-9]+) cells?\Z", re.ASCII)
# What a CSV field of an int holds: ASCII digits with an optional sign (no 6_0, no non-ASCII digits)
_CSV_INT = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)
_CSV_FLOAT = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|nan|inf|infinity)\Z",
                        re.ASCII | re.IGNORECASE)


def is_csv(path: str) -> bool:
    """Whether a sweep file at `path` is CSV (its suffix, in any case: .csv or .CSV), else JSON."""
    return os.fspath(path).lower().endswith(".csv")


def _not_sweep(path: str, why: str) -> ValueError:
    return ValueError(f"{path}: exists and is not a repcap_fast sweep file ({why}); pick another path")


def _check_cell(path: str, label: str, cell) -> dict:
    """One record of a sweep file, checked; `label` says where ("cells[3]", "line 4").

    Ints where ints belong, a dtype string, and numbers (or null) everywhere else; a ValueError
    naming the file and the cell otherwise.
    """
    if not isinstance(cell, dict):
        raise ValueError(f"{path}: {label} is a {type(cell).__name__}, not a record with {', '.join(CELL_FIELDS)}")
    missing = [key for key in CELL_FIELDS if key not in cell]
    if missing:
        raise ValueError(f"{path}: {label} has no {', '.join(missing)}")
    where = f"{path}: {label} (k={str(cell['k'])[:20]}, d={str(cell['d'])[:20]})"
    for key, least in _INT_FIELDS.items():
        value = cell[key]
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= _MAX_INT:
            raise ValueError(f"{where}: {key} is {str(value)[:40]!r}, not an int in [{least}, 2^63 - 1]")
    for key in _STR_FIELDS:
        if not isinstance(cell[key], str):
            raise ValueError(f"{where}: {key} is {str(cell[key])[:40]!r}, not a string")
    if cell["method"] not in METHODS:
        raise ValueError(f"{where}: method is {cell['method'][:40]!r}, not one of {', '.join(METHODS)}")
    if cell["precision"] not in PENALTY_PRECISIONS:
        raise ValueError(f"{where}: precision is {cell['precision'][:40]!r}, not one of "
                         f"{', '.join(PENALTY_PRECISIONS)}")
    if not cell["seed"] <= cell["best_seed"] <= cell["seed"] + cell["restarts"] - 1:
        raise ValueError(f"{where}: best_seed is {cell['best_seed']}, not one of the starts' seeds seed … seed + "
                         f"restarts - 1 ({cell['seed']} … {cell['seed'] + cell['restarts'] - 1})")
    name = cell["bound_name"]
    if name not in ("welch", "orthoplex", "levenstein") and not (name.startswith("welch-") and name[6:].isdigit()):
        raise ValueError(f"{where}: bound_name is {name[:40]!r}, not welch, welch-<order>, orthoplex or levenstein")
    for key in _FLOAT_FIELDS:
        value = cell[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{where}: {key} is {str(value)[:40]!r}, not a number")
        if isinstance(value, int) and value.bit_length() > 1024:  # a JSON integer literal beyond float64
            raise ValueError(f"{where}: {key} is an integer of {value.bit_length()} bits, beyond float64's range "
                             "(not a number a sweep writes); remove the cell or correct it")
    for key in _UNIT_FIELDS:  # a hand-edited 1.5 would be kept on resume and fitted
        value = cell[key]
        if value is not None and not math.isnan(value) and not 0.0 <= value <= 1.0 + _UNIT_SLACK:
            raise ValueError(f"{where}: {key} is {value!r}, not in [0, 1] (a maximum of |cosines|); remove the cell "
                             "or correct it")
    if cell["k"] >= 2:
        _check_certificate(where, cell)
    return cell


_CERTIFICATE_TOLERANCE = 1e-12  # the bounds' float64 rounding, across versions of their formulas


def _check_certificate(where: str, cell: dict) -> None:
    """The certificate fields (bound, bound_name, eps_minus_bound) agree with the cell's k, d and ε*.

    A hand-edited bound would be kept on resume and reported as the packing's gap to optimal.
    """
    bound, name = coherence_bound(cell["k"], cell["d"])
    if cell["bound_name"] != name:
        raise ValueError(f"{where}: bound_name is {cell['bound_name'][:40]!r}, but the best bound of k={cell['k']}, "
                         f"d={cell['d']} is {name!r}; remove the cell or correct it")
    if cell["bound"] is None or not abs(float(cell["bound"]) - bound) <= _CERTIFICATE_TOLERANCE:
        raise ValueError(f"{where}: bound is {cell['bound']!r}, but the {name} bound of k={cell['k']}, d={cell['d']} "
                         f"is {bound!r}; remove the cell or correct it")
    eps, gap = cell["eps_star"], cell["eps_minus_bound"]
    want = eps - bound if eps is not None and math.isfinite(eps) else None
    if (want is None) != (gap is None or (isinstance(gap, float) and math.isnan(gap))) or (
            want is not None and not abs(gap - want) <= _CERTIFICATE_TOLERANCE):
        raise ValueError(f"{where}: eps_minus_bound is {gap!r}, but eps_star − bound is {want!r}; remove the cell or "
                         "correct it")


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (a repeated record of a cell whose ε is NaN is the same record)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _differences(a: dict, b: dict) -> str:
    differ = [f for f in CELL_FIELDS if not _same(a[f], b[f])]
    return ", ".join(f"{f}: {a[f]!r} vs {b[f]!r}" for f in differ[:4])


def _dedupe(path: str, cells: List[dict]) -> List[dict]:
    """The cells with exact repeats of a (k, d) record dropped.

    Repeats that disagree are an error naming the cell and the fields that differ.
    """
    seen = {}
    out = []
    for i, cell in enumerate(cells):
        key = (cell["k"], cell["d"])
        if key not in seen:
            seen[key] = i
            out.append(cell)
            continue
        differ = _differences(cells[seen[key]], cell)
        if differ:
            raise ValueError(
                f"{path}: records {seen[key] + 1} and {i + 1} are both the cell (k={key[0]}, d={key[1]}), with "
                f"different values ({differ}); remove one of them from the file")
    return out


def merge_cells(sources: Sequence[Tuple[str, List[dict]]]) -> List[dict]:
    """The cells of several sweep files, each given as (path, its read_cells), in order.

    Exact repeats of a (k, d) record are dropped; a cell whose records disagree between files is a
    ValueError naming both files and the fields that differ (a resume never keeps two ε for one
    cell).
    """
    seen = {}
    out = []
    for path, cells in sources:
        for cell in cells:
            key = (cell["k"], cell["d"])
            if key not in seen:
                seen[key] = (path, cell)
                out.append(cell)
                continue
            first_path, first = seen[key]
            differ = _differences(first, cell)
            if differ:
                raise ValueError(f"the cell (k={key[0]}, d={key[1]}) is in {first_path} and in {path} with different "
                                 f"values ({differ}); remove one of them")
    return out


def is_sweep_file(path: str) -> bool:
    """Whether the file at `path` was written by write_cells, judged by its first bytes only.

    The first bytes hold the format tag of a JSON sweep file, the header row of a CSV one: a
    truncated or corrupt sweep file still is one, which a restart may overwrite; a foreign file
    is not.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head.startswith(_BOM):
        head = head[len(_BOM) :]
    if is_csv(path):
        lines = head.split(b"\n", 2)
        first = lines[0].rstrip(b"\r")
        if first.startswith(b"# repcap_fast.packing.sweep/") and len(lines) > 1:
            first = lines[1].rstrip(b"\r")
        return first in tuple(",".join(fields).encode() for fields in _CSV_HEADERS)
    return head.lstrip().startswith(b"{") and any(f'"format": "{tag}"'.encode() in head
                                                  for tag in (SWEEP_FORMAT,) + _OLD_FORMATS)


def _parse_csv_value(path: str, line: int, key: str, value):
    if value is None:  # a short row: csv.DictReader fills the missing fields with None
        raise ValueError(f"{path}: line {line} has no {key} (too few fields)")
    if key in _STR_FIELDS:
        return value
    if key in _INT_FIELDS and _CSV_INT.match(value) and len(value) <= 24:  # ASCII digits only: int() takes 6_0, ٦٠
        return int(value)  # (an int64 has at most 19 digits; longer ones are refused before int() sees them)
    if key not in _INT_FIELDS and value in ("", "None"):
        return None
    if key not in _INT_FIELDS and _CSV_FLOAT.match(value):
        return float(value)
    want = "an int (ASCII digits)" if key in _INT_FIELDS else "a number"
    raise ValueError(f"{path}: line {line}: {key} is {value[:40]!r}, not {want}")


def _csv_body(path: str) -> Tuple[str, int, int]:
    """(the header and rows of a CSV sweep file, the file line of its header, its end line's count or -1).

    A tagged file (written with _CSV_TAG) must end with its end line and a newline; an untagged
    one (written before the tag) with a newline: anything else is a file cut short.
    """
    with open(path, newline="", encoding="utf-8-sig") as f:  # a BOM is read past
        text = f.read()

    def cut(what):
        return ValueError(f"{path}: cut short (it does not end with {what}): a truncated sweep file? Remove it, or "
                          "restore it from a copy")

    if not text.startswith("# repcap_fast.packing.sweep/"):
        if text and not text.endswith("\n"):
            raise cut("a newline")
        return text, 1, -1
    _, _, rest = text.partition("\n")
    body, _, end = rest.rstrip("\r\n").rpartition("\n")
    match = _CSV_END.match(end.rstrip("\r"))
    if not text.endswith("\n") or not match:
        raise cut("its end line '# end: N cells'")
    return body + "\n", 2, int(match.group(1))


def _read_csv(path: str) -> List[dict]:
    try:
        text, first_line, count = _csv_body(path)
        reader = csv.DictReader(io.StringIO(text, newline=""))
        fields = tuple(reader.fieldnames or ())
        if fields not in _CSV_HEADERS:
            raise _not_sweep(path, f"its CSV header is not {','.join(CELL_FIELDS)}")
        cells = []
        for row in reader:
            line = reader.line_num + first_line - 1
            if None in row:  # more fields than the header
                raise ValueError(f"{path}: line {line} has {len(fields) + len(row[None])} fields, the "
                                 f"header {len(fields)}")
            cell = {key: _parse_csv_value(path, line, key, row.get(key)) for key in fields}
            cells.append(_check_cell(path, f"line {line}", _upgrade(cell)))
        if count >= 0 and count != len(cells):
            raise ValueError(f"{path}: its end line counts {count} cells, but it holds {len(cells)}: a damaged sweep "
                             "file? Remove it, or restore it from a copy")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}): not a sweep file") from exc
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV sweep file ({exc})") from exc
    return cells


def _read_json(path: str) -> List[dict]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8-sig"))  # a BOM is read past
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}): not a sweep file") from exc
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError; too deeply nested
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not valid JSON ({first[:200]}): a truncated or corrupt sweep file? (remove "
                         f"it or pick another path)") from exc
    if not isinstance(data, dict) or data.get("format") not in (SWEEP_FORMAT,) + _OLD_FORMATS:
        raise _not_sweep(path, f"no \"format\": \"{SWEEP_FORMAT}\"")
    if "cells" not in data:
        raise ValueError(f"{path}: a sweep file without \"cells\" (keys: {', '.join(sorted(map(str, data)))})")
    cells = data["cells"]
    if not isinstance(cells, list):
        raise ValueError(f"{path}: \"cells\" is a {type(cells).__name__}, not a list of records")
    upgrade = _upgrade if data["format"] in _OLD_FORMATS else (lambda cell: cell)
    return [_check_cell(path, f"cells[{i}]", upgrade(cell)) for i, cell in enumerate(cells)]


def read_cells(path: str) -> List[dict]:
    """The cells of the sweep file at `path` ([] when there is none).

    A file that is not a sweep file is an error (it is never overwritten). Every record is checked
    when read (ints for k, d, steps, p, seed; numbers or null for ε and the statistics), and
    repeated (k, d) records must agree (exact repeats are dropped): a ValueError names the file
    and the cell.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return []
    if os.path.isdir(path):
        raise ValueError(f"{path}: a directory, not a sweep file")
    cells = _read_csv(path) if is_csv(path) else _read_json(path)
    return _dedupe(path, cells)


def write_cells(path: str, cells: List[dict]) -> None:
    """Writes `cells` to the sweep file `path` atomically (a temporary file, renamed): a kill never tears it.

    A symlink at `path` is followed: the file it points to is written (the link stays), the same
    file whose lock the sweep holds (lock_file).
    """
    csv_file = is_csv(path)
    path = os.path.realpath(os.fspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        if csv_file:
            f.write(_CSV_TAG + "\n")
            writer = csv.DictWriter(f, fieldnames=CELL_FIELDS, lineterminator="\n")
            writer.writeheader()
            for cell in cells:
                writer.writerow({k: ("" if cell[k] is None else repr(cell[k]) if isinstance(cell[k], float)
                                     else cell[k])
                                 for k in CELL_FIELDS})
            f.write(f"# end: {len(cells)} cells\n")
        else:
            json.dump({"format": SWEEP_FORMAT, "cells": cells}, f, indent=1)
            f.write("\n")
    os.replace(tmp, path)


def lock_file(out: str) -> str:
    """The lock file of the sweep file `out`, next to the file itself.

    It is the same whatever path names the file (a symlinked folder, '..'), so that every sweep
    writing it takes the same lock.
    """
    return f"{os.path.realpath(out)}.lock"


@contextlib.contextmanager
def sweep_lock(out: str) -> Iterator[None]:
    """Holds an exclusive lock on the sweep file `out` for the body.

    The lock is a flock on `out.lock`, created here and removed on exit; a ValueError is raised at
    once when another process holds it: two sweeps writing one file would each rewrite it from
    their own cells, and lose the other's. The lock dies with its process (a killed sweep leaves
    none behind). Where flock is unavailable (Windows, some network file systems) the sweep runs
    without it, with a warning for the latter.
    """
    out = os.fspath(out)
    path = lock_file(out)
    if fcntl is None:
        yield
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"{out}: another sweep is writing it (it holds {path}); two sweeps on one file would "
                             "lose each other's cells: wait for that sweep to finish (then resume), or pick another "
                             "file") from None
        except OSError as exc:  # ENOLCK, EOPNOTSUPP: a file system without locks
            os.close(fd)
            warnings.warn(f"{out}: cannot lock {path} ({exc.strerror}); running without the lock: do not run another "
                          "sweep on this file at the same time", RuntimeWarning, stacklevel=3)
            fd = None
            break
        try:  # the holder before us may have removed the file we opened: lock the one at `path`
            here, there = os.fstat(fd), os.stat(path)
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    if fd is None:
        yield
        return
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person who finds the file
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # while still holding the lock: a waiter that opened it sees another inode, retries
        os.close(fd)


MAX_GRID_VALUES = 100_000
"""The most values of ks or of ds in one sweep (each cell is an optimization: seconds to hours)."""


def grid_values(values, name: str, least: int) -> List[int]:
    """The values of ks or ds: ints (Python, numpy or torch) >= least, order kept, repeats dropped."""
    if isinstance(values, (str, bytes)) or (getattr(values, "ndim", None) == 0):
        raise ArgumentTypeError(f"{name} must be a list of ints, got {type(values).__name__} {values!r}")
    if hasattr(values, "__len__") and len(values) > MAX_GRID_VALUES:  # a huge range is refused before listing it
        raise ValueError(f"{name} has {len(values)} values; a sweep takes at most {MAX_GRID_VALUES} per axis")
    try:
        items = list(values)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a list of ints, got {type(values).__name__} {values!r}") from None
    return list(dict.fromkeys(check_int(v, name, least) for v in items))


def grid_order(cells: dict, grid: List) -> List[dict]:
    """The cells {(k, d): record} in grid order, then those of other grids (kept, never dropped)."""
    keys = set(grid)
    return [cells[c] for c in grid if c in cells] + [c for key, c in cells.items() if key not in keys]


def part_file(out: str, rank: int) -> str:
    """The part file of `rank` in a distributed sweep into `out`: `out.partR`."""
    return f"{out}.part{rank}"


def part_files(out: str) -> List[str]:
    """The part files of a distributed sweep into `out`, from any earlier number of ranks."""
    return sorted(p for p in glob.glob(glob.escape(out) + ".part*") if p[len(out) + 5 :].isdigit())


def remove_part_files(out: str, paths: Sequence[str]) -> None:
    """Removes merged part files of a sweep into `out`, and the temporary files ranks left behind.

    The temporary files (`out.partR.tmp-PID`) are those of a rank killed in the middle of a
    write: once the part files are merged (or dropped by a restart), no rank is writing them.
    """
    out = os.fspath(out)
    leftovers = [p for p in glob.glob(glob.escape(out) + ".part*.tmp-*")
                 if p[len(out) + 5 :].split(".tmp-")[0].isdigit()]
    for path in list(paths) + leftovers:
        if os.path.exists(path):
            os.remove(path)


def load_cells(path: str) -> List[dict]:
    """The cells of a sweep file (JSON or CSV) that ``repcap_fast.packing.sweep`` wrote.

    Every record is checked when read (ints for k, d, steps, p, seed; numbers or null for ε and
    the statistics); files of the earlier sweep formats are read as the current one.

    Args:
        path (str | os.PathLike): the sweep file.

    Returns:
        List[dict]: one record per cell (k, d), with the fields of ``CELL_FIELDS``, in the file's
        order.

    Raises:
        FileNotFoundError: there is no file at `path`.
        ValueError: `path` is a folder, a file that is not a sweep file, or a sweep file with a
            malformed record or two records of one cell that disagree.

    Examples:
        >>> import os, shutil, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> out = os.path.join(folder, "cells.csv")
        >>> _ = rf.packing.sweep([4], [3], out, steps=5, progress=False)
        >>> cell = rf.packing.load_cells(out)[0]
        >>> cell["k"], cell["d"], cell["steps"], cell["method"]
        (4, 3, 5, 'paper')
        >>> shutil.rmtree(folder)
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no sweep results at {path!r}")
    return read_cells(path)
