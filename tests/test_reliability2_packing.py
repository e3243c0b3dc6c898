"""Regression tests for the reliability probe, round 2 (issue 33), of the packing side: the penalty
kernel's arguments, packing.optimize and sweep, the sweep files, the capacity formulas and the fit.
Every test here failed before its fix (items 2, 7, 14 and 16 of the issue; the two lock tests that
check a killed sweep and sweeps of other files are guards of the fix), and the scalar-kind
matrices below stand for CI's fuzzing of "numpy and torch scalars of every dtype for every
numeric argument"."""

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch

from repcap_fast import capacity as cap
from repcap_fast import fitting, packing
from repcap_fast.cli import main
from repcap_fast.ops.gram_offdiag_penalty import gram_offdiag_penalty, gram_offdiag_penalty_block
from repcap_fast.packing.sweep_file import read_cells, write_cells

# ---------------------------------------------------------------- scalar kinds of every dtype

NP_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
NP_FLOATS = (np.float16, np.float32, np.float64, np.longdouble)
TORCH_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
TORCH_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


INT_KINDS = ([int] + list(NP_INTS) + [lambda v, t=t: torch.tensor(v, dtype=t) for t in TORCH_INTS])
FLOAT_KINDS = ([float] + list(NP_FLOATS) + [lambda v, t=t: torch.tensor(v, dtype=t) for t in TORCH_FLOATS])
ids = (["int"] + [t.__name__ for t in NP_INTS] + [str(t) for t in TORCH_INTS],
       ["float"] + [t.__name__ for t in NP_FLOATS] + [str(t) for t in TORCH_FLOATS])
# Never a number: bools of every kind, strings, None, complex; never finite: NaN and ±inf of every kind.
NOT_NUMBERS = [True, np.bool_(False), torch.tensor(True), "8", None, 2 + 0j, [8]]
NOT_FINITE = ([float("nan"), float("inf"), -float("inf")] + [t(v) for t in NP_FLOATS for v in ("nan", "-inf")]
              + [torch.tensor(v, dtype=t) for t in TORCH_FLOATS for v in (float("nan"), float("inf"))])
NOT_FINITE_IDS = [f"{type(v).__name__}:{v}" if not isinstance(v, torch.Tensor) else f"{v.dtype}:{v.item()}"
                  for v in NOT_FINITE]


def _refused(fn, name):
    """fn() raises a ValueError (ArgumentTypeError is one) whose message names `name`."""
    with pytest.raises(ValueError) as info:
        fn()
    # the name as a word ("d", not the d of "must be"): a one-letter name must stand on its own
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", str(info.value)), (name, str(info.value))


X = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))

# ------------------------------------------------ 2. integer arguments: every integer kind, never truncated

# (argument, valid value, call): each integer argument of the packing side, at tiny sizes.
INT_ARGS = {
    "penalty.p": (8, lambda v: gram_offdiag_penalty(X, v)),
    "block.p": (8, lambda v: gram_offdiag_penalty_block(X, 2, 7, v)),
    "block.row_start": (2, lambda v: gram_offdiag_penalty_block(X, v, 7, 8)),
    "block.row_stop": (7, lambda v: gram_offdiag_penalty_block(X, 2, v, 8)),
    "optimize.k": (6, lambda v: packing.optimize(v, 3, steps=1, progress=False)),
    "optimize.d": (3, lambda v: packing.optimize(6, v, steps=1, progress=False)),
    "optimize.steps": (2, lambda v: packing.optimize(6, 3, steps=v, progress=False)),
    "optimize.p": (5, lambda v: packing.optimize(6, 3, steps=1, p=v, progress=False)),
    "optimize.seed": (3, lambda v: packing.optimize(6, 3, steps=1, seed=v, progress=False)),
    "optimize.p_start": (2, lambda v: packing.optimize(6, 3, steps=2, p=8, p_start=v, method="p-continuation",
                                                       progress=False)),
    "optimize.polish_steps": (1, lambda v: packing.optimize(6, 3, steps=1, polish_steps=v, progress=False)),
    "default_p.k": (50, lambda v: packing.default_p(v, 8)),
    "default_p.d": (8, lambda v: packing.default_p(50, v)),
    "default_lr.d": (8, lambda v: packing.default_lr(v)),
    "coherence_floor.max_order": (2, lambda v: cap.coherence_floor(100, 8, max_order=v)),
    "capacity_table.vocab": (100, lambda v: cap.capacity_table(64, 0.1, vocab=v)),
    "capacity_table.d": (64, lambda v: cap.capacity_table(v, 0.1)),
}
P_ARGS = {"penalty.p", "block.p", "optimize.p"}  # p also takes integral reals (8.0), as check_p does
REAL_INTS = P_ARGS | {"capacity_table.d", "capacity_table.vocab"}
NONE_MEANS_DEFAULT = {"capacity_table.vocab", "optimize.p", "optimize.p_start", "optimize.polish_steps", "optimize.lr",
                      "optimize.steps"}


def _result(out):
    """A comparable form of a call's result (bitwise: floats compared as they are)."""
    if isinstance(out, packing.PackingResult):
        return json.dumps(out.to_dict(timing=True) | {"seconds": 0}, sort_keys=True)
    if isinstance(out, tuple):
        return tuple(_result(o) for o in out)
    if isinstance(out, torch.Tensor):
        return (out.dtype, out.detach().numpy().tobytes())
    return json.dumps(out, sort_keys=True, default=str)


@pytest.fixture(scope="module")
def int_baselines():
    return {}


def _baseline(cache, arg):
    if arg not in cache:
        value, call = INT_ARGS[arg]
        cache[arg] = _result(call(value))
    return cache[arg]


@pytest.mark.parametrize("arg", sorted(INT_ARGS))
@pytest.mark.parametrize("make", INT_KINDS, ids=ids[0])
def test_every_integer_kind_gives_the_python_int_result(arg, make, int_baselines):
    """np.int64(0) as row_start was refused; numpy and torch integers of every dtype are the int."""
    value, call = INT_ARGS[arg]
    assert _result(call(make(value))) == _baseline(int_baselines, arg)


@pytest.mark.parametrize("arg", sorted(INT_ARGS))
@pytest.mark.parametrize("make", FLOAT_KINDS, ids=ids[1])
def test_reals_are_integers_only_where_integral_and_allowed(arg, make, int_baselines):
    """p=np.float32(8.5) or torch.tensor(8.5) ran at p = 8; a Python 8.5 was refused."""
    value, call = INT_ARGS[arg]
    name = arg.split(".")[1]
    _refused(lambda: call(make(value + 0.5)), name)  # never truncated
    if arg in REAL_INTS:
        assert _result(call(make(value))) == _baseline(int_baselines, arg)
    else:
        _refused(lambda: call(make(value)), name)


@pytest.mark.parametrize("arg", sorted(INT_ARGS))
@pytest.mark.parametrize("bad", NOT_NUMBERS + NOT_FINITE, ids=[repr(v) for v in NOT_NUMBERS] + NOT_FINITE_IDS)
def test_integer_arguments_refuse_what_is_not_an_integer_by_name(arg, bad):
    """np.float32('inf') as p raised a raw OverflowError; bools and strings were taken as numbers."""
    if arg in NONE_MEANS_DEFAULT and bad is None:
        return
    _refused(lambda: INT_ARGS[arg][1](bad), arg.split(".")[1])


def test_sweep_takes_integer_kinds_and_refuses_the_rest_by_name(tmp_path):
    want = packing.sweep([6], [3], tmp_path / "a.json", steps=1, progress=False)
    got = packing.sweep(np.array([6], dtype=np.uint16), torch.tensor([3]), tmp_path / "b.json",
                        steps=torch.tensor(1), seed=np.int8(0), progress=False)
    assert got == want
    for kwargs, name in [({"ks": [6.5]}, "ks"), ({"ks": [np.float32("inf")]}, "ks"), ({"ds": [True]}, "ds"),
                         ({"ks": 6}, "ks"), ({"ds": "3"}, "ds"), ({"steps": np.float64(1.5)}, "steps"),
                         ({"p": torch.tensor(8.5)}, "p"), ({"p": np.float32("inf")}, "p"), ({"seed": "0"}, "seed"),
                         ({"lr": np.float32("nan")}, "lr"), ({"lr": "0.1"}, "lr"),
                         ({"polish_steps": np.float16(1.5)}, "polish_steps")]:
        args = {"ks": [6], "ds": [3], "out": tmp_path / "c.json", "steps": 1, "progress": False} | kwargs
        _refused(lambda: packing.sweep(**args), name)
    assert not (tmp_path / "c.json").exists()


# --------------------------------------------------------------- 2. real arguments by name

REAL_ARGS = {  # (argument, valid value, call)
    "optimize.lr": (0.01, lambda v: packing.optimize(6, 3, steps=1, lr=v, progress=False)),
    "jl_capacity.d": (64, lambda v: cap.jl_capacity(v, 0.1)),
    "jl_capacity.eps": (0.25, lambda v: cap.jl_capacity(64, v)),
    "jl_capacity.C": (3.0, lambda v: cap.jl_capacity(64, 0.1, C=v)),
    "log_jl_capacity.C": (3.0, lambda v: cap.log_jl_capacity(64, 0.1, C=v)),
    "adjusted_capacity.d": (64, lambda v: cap.adjusted_capacity(v, 0.1)),
    "adjusted_capacity.eps": (0.25, lambda v: cap.adjusted_capacity(64, v)),
    "adjusted_capacity.C": (2.0, lambda v: cap.adjusted_capacity(64, 0.1, C=v)),
    "full_capacity.d": (64, lambda v: cap.full_capacity(v, 0.1)),
    "full_capacity.eps": (0.25, lambda v: cap.full_capacity(64, v)),
    "full_capacity.C": (0.5, lambda v: cap.full_capacity(64, 0.1, C=v)),
    "full_capacity.a": (1.0, lambda v: cap.full_capacity(64, 0.1, a=v)),
    "full_capacity.b": (1.5, lambda v: cap.full_capacity(64, 0.1, b=v)),
    "full_capacity.c": (1.0, lambda v: cap.full_capacity(64, 0.1, c=v)),
    "log_full_capacity.c": (1.0, lambda v: cap.log_full_capacity(64, 0.1, c=v)),
    "full_epsilon.k": (1000, lambda v: cap.full_epsilon(v, 64)),
    "full_epsilon.d": (64, lambda v: cap.full_epsilon(1000, v)),
    "full_epsilon.C": (0.5, lambda v: cap.full_epsilon(1000, 64, C=v)),
    "full_epsilon.a": (1.0, lambda v: cap.full_epsilon(1000, 64, a=v)),
    "full_epsilon.b": (1.5, lambda v: cap.full_epsilon(1000, 64, b=v)),
    "full_epsilon.c": (1.0, lambda v: cap.full_epsilon(1000, 64, c=v)),
    "welch_bound.k": (100, lambda v: cap.welch_bound(v, 8)),
    "welch_bound.d": (8, lambda v: cap.welch_bound(100, v)),
    "welch_bound.order": (2, lambda v: cap.welch_bound(100, 8, order=v)),
    "orthoplex_bound.k": (100, lambda v: cap.orthoplex_bound(v, 8)),
    "orthoplex_bound.d": (8, lambda v: cap.orthoplex_bound(100, v)),
    "coherence_floor.k": (100, lambda v: cap.coherence_floor(v, 8)),
    "coherence_floor.d": (8, lambda v: cap.coherence_floor(100, v)),
    "model_class.eps": (0.25, lambda v: cap.model_class(v)),
    "describe_class.eps": (0.25, lambda v: cap.describe_class(v)),
    "capacity_table.eps": (0.25, lambda v: cap.capacity_table(64, v)),
    "fit.p0": (0.5, lambda v: fitting.fit(FIT_CELLS, "jl", p0=[v]).params),
    "fit.cells": (8, lambda v: fitting.fit([(v, 4, 0.5)] + FIT_CELLS, "jl").params),
}
SCALAR_ONLY = {"optimize", "fit", "describe_class", "capacity_table"}
# Cells of the jl form with C = 1.1: an interior fit.
FIT_CELLS = [(k, d, math.sqrt(1.1 * math.log(k) / d)) for k in (20, 40, 80) for d in (4, 8)]


@pytest.fixture(scope="module")
def real_baselines():
    return {}


@pytest.mark.parametrize("arg", sorted(REAL_ARGS))
@pytest.mark.parametrize("make", INT_KINDS + FLOAT_KINDS, ids=ids[0] + ids[1])
def test_every_real_kind_gives_the_python_float_result(arg, make, real_baselines):
    """Numpy and torch scalars of every dtype are the number they hold (the result bitwise)."""
    value, call = REAL_ARGS[arg]
    try:
        kind = make(value)
    except (OverflowError, RuntimeError, ValueError):
        return  # 1000 is no int8
    if float(kind.item() if isinstance(kind, torch.Tensor) else kind) != value and make in INT_KINDS:
        return  # 0.25 is no integer, 1000 no uint8
    exact = float(kind.item() if isinstance(kind, torch.Tensor) else kind)
    key = (arg, exact)
    if key not in real_baselines:
        real_baselines[key] = _result(call(exact))
    assert _result(call(kind)) == real_baselines[key]


@pytest.mark.parametrize("arg", sorted(REAL_ARGS))
@pytest.mark.parametrize("bad", NOT_NUMBERS + NOT_FINITE, ids=[repr(v) for v in NOT_NUMBERS] + NOT_FINITE_IDS)
def test_real_arguments_refuse_what_is_not_a_finite_number_by_name(arg, bad):
    """full_capacity(c=nan) and welch_bound(nan) gave nan; welch_bound("10", 10) and jl_capacity("10", …) ran."""
    if arg in NONE_MEANS_DEFAULT and bad is None:
        return
    if isinstance(bad, list) and (arg == "fit.p0" or arg.split(".")[0] not in SCALAR_ONLY):
        bad = ["8"]  # the capacity formulas are vectorized: [8] is an array of one d
    _refused(lambda: REAL_ARGS[arg][1](bad), arg.split(".")[1])


def test_capacity_arrays_refuse_bools_strings_and_non_finite_entries_by_name():
    assert cap.welch_bound(np.array([100, 200]), torch.tensor([8, 8])).tolist() == [
        cap.welch_bound(100, 8), cap.welch_bound(200, 8)]
    _refused(lambda: cap.welch_bound(np.array([100.0, np.nan]), 8), "k")
    _refused(lambda: cap.full_capacity([64, 128], [0.1, "0.2"]), "eps")
    _refused(lambda: cap.jl_capacity(np.array([True, False]), 0.1), "d")
    _refused(lambda: cap.orthoplex_bound(torch.tensor([100.0, float("inf")]), 8), "k")
    _refused(lambda: cap.full_epsilon(np.array([10, 0]), 8), "k")


# ------------------------------------------------ 14. one clear error: memory, divergence, the fit


@pytest.mark.parametrize("k, d", [(10**12, 8), (10**9, 10**6), (2**40, 1)])
def test_a_packing_beyond_memory_is_refused_before_any_allocation(k, d, tmp_path, capsys):
    """`repcap pack --k 1000000000000` tried to allocate k×d float64 (a raw RuntimeError, or the OOM killer)."""
    with pytest.raises(ValueError, match=rf"k={k}, d={d} needs about .* GiB .*more than"):
        packing.optimize(k, d, steps=1, progress=False)
    with pytest.raises(ValueError, match=rf"k={k}"):
        packing.sweep([6, k], [d], tmp_path / "s.json", steps=1, progress=False)
    assert not (tmp_path / "s.json").exists()
    assert main(["pack", "--k", str(k), "--d", str(d), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repcap: error: ") and f"k={k}" in err[0], err


@pytest.mark.parametrize("method", ["p-continuation", "riemannian", "smooth-max", "minimax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_continuation_method_at_a_huge_lr_says_it_diverged(method, dtype):
    """lr=1e30 said "A has 20 zero-norm rows ... Pass zero_rows='drop'": the rows had collapsed."""
    lr = 1e30 if dtype != torch.float64 else 1e300
    with pytest.raises(packing.PackingDiverged, match=r"packing diverged at step \d+.*lr=1e\+(30|300) is too large"):
        packing.optimize(20, 4, steps=5, lr=lr, method=method, dtype=dtype, progress=False)


def test_a_huge_lr_is_one_error_line_in_the_cli(capsys):
    assert main(["pack", "--k", "20", "--d", "4", "--steps", "3", "--lr", "1e30", "--method", "riemannian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diverged" in err[0] and "lr" in err[0] and "zero_rows" not in err[0], err


def _sweep_cells(tmp_path):
    out = tmp_path / "s.json"
    packing.sweep([12, 16, 24, 32], [3, 4], out, steps=20, progress=False)
    return out


@pytest.mark.parametrize("form", ["jl", "adjusted", "full"])
def test_a_fit_that_does_not_converge_names_the_form(form, tmp_path, monkeypatch, capsys):
    """A curve_fit out of evaluations raised SciPy's RuntimeError (a traceback in `repcap fit`)."""
    out = _sweep_cells(tmp_path)
    monkeypatch.setattr(fitting, "MAX_EVALUATIONS", 1)
    with pytest.raises(ValueError, match=rf"the {form} fit did not converge.*"):
        fitting.fit(str(out), form)
    assert main(["fit", str(out), "--form", form]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"repcap: error: the {form} fit did not converge"), err


def test_p0_outside_the_bounds_or_of_the_wrong_length_is_named(tmp_path):
    out = _sweep_cells(tmp_path)
    _refused(lambda: fitting.fit(str(out), "full", p0=[0.5, 1.0, 1.4]), "p0")
    _refused(lambda: fitting.fit(str(out), "jl", p0=[1000.0]), "p0")
    _refused(lambda: fitting.fit(str(out), "jl", p0=0.5), "p0")


# ------------------------------------------------ 16. sweep files: ε out of range, a BOM, fits at a bound


@pytest.mark.parametrize("suffix", [".json", ".csv"])
@pytest.mark.parametrize("field, value", [("eps_star", 1.5), ("eps_star", -0.2), ("eps_star", float("inf")),
                                          ("eps_star_init", 2.0), ("welch", -1.0)])
def test_a_cell_with_eps_outside_0_1_is_refused_naming_the_file_and_cell(suffix, field, value, tmp_path):
    """A hand-edited cell with eps_star = 1.5 was kept on resume (and fitted)."""
    out = tmp_path / f"s{suffix}"
    cells = packing.sweep([6, 8], [3], out, steps=2, progress=False)
    write_cells(str(out), [cells[0], dict(cells[1], **{field: value})])
    with pytest.raises(ValueError, match=rf"s\{suffix}: .*\(k=8, d=3\): {field} is .*not in \[0, 1\]"):
        packing.sweep([6, 8], [3], out, steps=2, progress=False)
    with pytest.raises(ValueError, match=rf"{field} is"):
        fitting.fit(str(out), "jl")


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_sweep_file_saved_with_a_bom_is_read(suffix, tmp_path):
    """An editor's UTF-8 BOM made the file "not a repcap_fast sweep file"."""
    out = tmp_path / f"s{suffix}"
    cells = packing.sweep([6, 8], [3], out, steps=2, progress=False)
    out.write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
    assert read_cells(str(out)) == cells
    assert packing.sweep([6, 8, 10], [3], out, steps=2, progress=False)[:2] == cells  # resumed, not refused
    assert packing.load_cells(out)[:2] == cells


def test_a_full_fit_at_a_bound_is_flagged(tmp_path):
    """The full fit reported c at its bound 10 (or a at 0.1) with no word about it."""
    for C, c, name in [(0.5, 12.0, "c"), (50.0, 1.0, "C")]:  # ε ∝ d^-6 needs c = 12 > 10; C = 50 > 10
        cells = [(k, d, math.sqrt(C * math.log(k / d) ** 1.4 / d**c)) for k in (40, 80, 160, 320) for d in (2, 3, 4)]
        with pytest.warns(fitting.FitAtBoundWarning, match=rf"the full fit has {name} at its bound"):
            res = fitting.fit(cells, "full")
        assert res.at_bounds == [name] and res.to_dict()["at_bounds"] == [name]
        assert res.params[name] == pytest.approx(10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interior = fitting.fit(FIT_CELLS, "jl")
    assert interior.at_bounds == [] and interior.to_dict()["at_bounds"] == []


# ----------------------------------------------------------- 7. concurrent sweeps on one file

_HOLDER = textwrap.dedent("""
    import os, sys, time
    from repcap_fast import packing
    out, started, release = sys.argv[1:4]

    def on_cell(cell):
        if cell["k"] == 6:
            open(started, "w").close()
            deadline = time.time() + 120
            while not os.path.exists(release) and time.time() < deadline:
                time.sleep(0.05)

    packing.sweep([6, 8], [3], out, steps=2, progress=False, on_cell=on_cell)
""")


def _start_holder(tmp_path, out):
    started, release = tmp_path / "started", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(started), str(release)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not started.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.05)
    return proc, release


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_second_sweep_on_a_file_in_use_is_refused_and_no_cell_is_lost(suffix, tmp_path, capsys):
    """Two sweeps on one file each rewrote it from their own cells: a cell was lost, and both exited 0."""
    out = tmp_path / f"s{suffix}"
    proc, release = _start_holder(tmp_path, out)
    try:
        with pytest.raises(ValueError, match=rf"s\{suffix}: another sweep is writing it"):
            packing.sweep([10], [3], out, steps=2, progress=False)
        with pytest.raises(ValueError, match="another sweep"):
            packing.sweep([10], [3], out, steps=2, resume=False, progress=False)
        assert main(["sweep", "--ks", "10", "--ds", "3", "--steps", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "another sweep is writing it" in err[0] and str(out) in err[0], err
    finally:
        release.touch()
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    # the holder's cells are all there, and the lock is gone with it: a later sweep resumes them
    assert [(c["k"], c["d"]) for c in read_cells(str(out))] == [(6, 3), (8, 3)]
    cells = packing.sweep([6, 8, 10], [3], out, steps=2, progress=False)
    assert [(c["k"], c["d"]) for c in read_cells(str(out))] == [(6, 3), (8, 3), (10, 3)] == \
        [(c["k"], c["d"]) for c in cells]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["started", "release", out.name])


def test_a_killed_sweep_leaves_no_lock_behind(tmp_path):
    out = tmp_path / "s.json"
    proc, release = _start_holder(tmp_path, out)
    proc.kill()
    proc.communicate(timeout=60)
    assert [c["k"] for c in packing.sweep([6, 8], [3], out, steps=2, progress=False)] == [6, 8]
    assert not os.path.exists(f"{out}.lock")


def test_concurrent_sweeps_of_other_files_run_side_by_side(tmp_path):
    proc, release = _start_holder(tmp_path, tmp_path / "a.json")
    try:
        assert len(packing.sweep([6], [3], tmp_path / "b.json", steps=2, progress=False)) == 1
    finally:
        release.touch()
        proc.communicate(timeout=120)
    assert proc.returncode == 0


def _locked_sweep_rank(rank, world, store, out, result_dir):
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # a hang fails instead of waiting
    try:
        try:
            got = [c["k"] for c in packing.sweep([6, 8, 10], [3], out, steps=2, progress=False)]
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            got = f"{type(exc).__name__}: {exc}"
        with open(os.path.join(result_dir, f"{rank}.json"), "w") as f:
            json.dump(got, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_a_sweep_across_ranks_on_a_file_in_use_is_refused_on_every_rank(tmp_path):
    """Only rank 0 (the writer of `out`) takes the lock; when it cannot, every rank raises (no hang)."""
    import torch.multiprocessing as mp

    from repcap_fast.packing.sweep_file import sweep_lock

    out = str(tmp_path / "s.json")
    for attempt, held in enumerate((True, False)):
        results = tmp_path / f"results{attempt}"
        results.mkdir()
        with sweep_lock(out) if held else contextlib.nullcontext():
            mp.spawn(_locked_sweep_rank, args=(2, str(tmp_path / f"store{attempt}"), out, str(results)), nprocs=2,
                     join=True)
        got = [json.loads((results / f"{rank}.json").read_text()) for rank in range(2)]
        if held:
            assert all(isinstance(g, str) and g.startswith("RankFailure") and "another sweep is writing it" in g
                       for g in got), got
            assert not os.path.exists(out)
        else:
            assert got == [[6, 8, 10]] * 2
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(("results", "store"))) == ["s.json"]


def test_the_lock_is_the_files_whatever_path_names_it(tmp_path):
    """Review finding: the lock was keyed on the path as written, so a sweep through a symlinked
    folder took another lock and both wrote the file."""
    from repcap_fast.packing.sweep_file import sweep_lock

    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "cells.json"
    packing.sweep([6], [3], str(real), steps=1, progress=False)
    os.symlink(tmp_path / "real", tmp_path / "alias")  # a symlinked folder, and a symlink to the file itself
    os.symlink(real, tmp_path / "cells_link.json")
    spellings = [tmp_path / "alias" / "cells.json", tmp_path / "cells_link.json"]
    with sweep_lock(str(real)):
        for other in spellings:
            _refused(lambda: packing.sweep([6], [3], str(other), steps=1, progress=False), "another sweep")


def test_a_resume_checks_the_memory_of_the_cells_left_only(tmp_path, monkeypatch):
    """Review finding: the memory check ran on every cell of the grid, so a sweep whose large cells
    were done on a bigger machine could not be resumed on a smaller one."""
    from repcap_fast.packing import memory as packing_memory

    out = str(tmp_path / "cells.json")
    done = packing.sweep([6, 8], [3], out, steps=1, progress=False)
    need = packing_memory._COPIES * 4 * 8 * 3 + 8 * 8 * 3  # what k=8, d=3 needs
    monkeypatch.setattr(packing_memory, "_host_bytes", lambda: need - 1)  # a machine too small for k=8
    assert packing.sweep([6, 8], [3], out, steps=1, progress=False) == done  # nothing left to run: no check
    _refused(lambda: packing.sweep([6, 8, 10], [3], out, steps=1, progress=False), "k")  # k=10 is left to run
