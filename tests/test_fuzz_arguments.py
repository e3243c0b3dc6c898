"""Fuzzing of argument classes (issue 33): numbers of every Python, numpy and torch type for the
numeric arguments of the public functions, and output paths that alias an input (symlinks, hard
links, '.', '..', doubled slashes, relative and absolute spellings). Derandomized in CI like
test_properties.py (REPCAP_HYPOTHESIS_SCALE=10 runs ten times the examples)."""

import math
import os
import re

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import pga, spectral
from repcap_fast._outputs import check_no_clobber
from repcap_fast.ops.grassmann_normals import grassmann_normals

from _helpers import examples

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _as_tensor_of(dtype):
    return lambda v: torch.tensor(v, dtype=dtype)


# The types a number can come in: each turns a Python number into that type (or raises, or
# changes the value: such draws are skipped)
KINDS = {
    "int": int, "float": float, "bool": bool,
    **{name: getattr(np, name) for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                            "float16", "float32", "float64", "longdouble", "bool_")},
    **{f"torch.{name}": _as_tensor_of(getattr(torch, name))
       for name in ("int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64", "bool")},
    "np.array0d": np.array, "torch.1elem": lambda v: torch.tensor([v]),
}
BOOL_KINDS = {"bool", "bool_", "torch.bool"}
INT_KINDS = {"int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "torch.int8",
             "torch.int16", "torch.int32", "torch.int64", "torch.uint8"}

H = torch.randn(20, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
W = torch.randn(40, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
X = torch.randn(12, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
BASIS = pga.readout_basis(W, 3).basis


def _typed(kind, value):
    """value as `kind`, or None where that type cannot hold it exactly (skipped)."""
    try:
        with np.errstate(all="ignore"):
            out = KINDS[kind](value)
    except (OverflowError, ValueError, TypeError, RuntimeError):
        return None
    seen = out.item() if isinstance(out, (torch.Tensor, np.ndarray, np.generic)) else out
    if isinstance(value, float) and math.isnan(value):
        return out if isinstance(seen, float) and math.isnan(seen) else None
    return out if seen == value or (kind in BOOL_KINDS and bool(seen) == bool(value)) else None


# (name as the error names it, the call, the valid integers [lo, hi], whether integral reals count
# as integers, and the largest value worth running: larger valid ones are skipped as too slow)
BIG = 2**63
INT_ARGS = {
    "subspace_pga.k": ("k", lambda v: pga.subspace_pga(H, W, k=v, n_null=3).z, 1, 7, False, BIG),
    "subspace_pga.n_null": ("n_null", lambda v: pga.subspace_pga(H, W, k=2, n_null=v).z, 2, BIG, False, 12),
    "subspace_pga.ccr": ("ccr", lambda v: pga.subspace_pga(H, W, k=2, n_null=3, ccr=v).z, 0, 7, False, BIG),
    "subspace_pga.seed": ("seed", lambda v: pga.subspace_pga(H, W, k=2, n_null=3, seed=v).z, 0, BIG - 1, False, BIG),
    "pairwise_cosine_stats.bins": ("bins", lambda v: rf.pairwise_cosine_stats(H, bins=v).hist.tolist(), 1, 65536,
                                   False, BIG),
    "pairwise_cosine_stats.n_rows": ("n_rows", lambda v: rf.pairwise_cosine_stats(H, n_rows=v).count, 1, 20, False,
                                     BIG),
    "grassmann_normals.n": ("n", lambda v: grassmann_normals(v, 4, 2).tolist(), 1, BIG - 1, False, 100),
    "direction_alignment.m": ("m", lambda v: spectral.direction_alignment(H, BASIS, m=v).tolist(), 1, 8, False, BIG),
    "gram_offdiag_penalty.p": ("p", lambda v: float(rf.gram_offdiag_penalty(X, p=v)), 1, 2**30, True, BIG),
    "packing.default_p.k": ("k", lambda v: rf.packing.default_p(v, 16), 1, BIG, False, BIG),
}
REAL_ARGS = {
    "epsilon.k_sigma": ("k_sigma", lambda v: rf.epsilon(H, k_sigma=v)),
    "rankme.eps": ("eps", lambda v: spectral.rankme(H, eps=v)),
    # the capacity formulas are vectorized: a one-element tensor gives a one-element array
    "full_capacity.eps": ("eps", lambda v: float(np.asarray(rf.capacity.full_capacity(64, v)).reshape(-1)[0])),
    "welch_bound.k": ("k", lambda v: float(np.asarray(rf.capacity.welch_bound(v, 8)).reshape(-1)[0])),
}

NUMBERS = st.one_of(st.integers(-3, 70000), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.5, 2.5, -1.0, 1e30, 2.0**63, float("nan"), float("inf")]))


def _refused_by_name(fn, name):
    with pytest.raises(ValueError) as info:  # ArgumentTypeError is a ValueError too
        fn()
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", str(info.value)), (name, str(info.value))


@settings(max_examples=examples(300))
@given(arg=st.sampled_from(sorted(INT_ARGS)), kind=st.sampled_from(sorted(KINDS)), value=NUMBERS)
def test_integer_arguments_take_every_integer_type_and_refuse_everything_else(arg, kind, value):
    name, call, lo, hi, integral_reals, cap = INT_ARGS[arg]
    typed = _typed(kind, value)
    assume(typed is not None)
    integral = isinstance(value, (int, float)) and math.isfinite(value) and float(value).is_integer()
    is_int = (kind in INT_KINDS or (kind in ("np.array0d", "torch.1elem") and isinstance(value, int))
              or (integral_reals and kind not in BOOL_KINDS and integral))
    if is_int and lo <= int(value) <= hi:
        assume(int(value) <= cap)
        assert call(typed) == call(int(value))  # the result of the same Python int
    else:
        _refused_by_name(lambda: call(typed), name)


@settings(max_examples=examples(200))
@given(arg=st.sampled_from(sorted(REAL_ARGS)), kind=st.sampled_from(sorted(KINDS)), value=NUMBERS)
def test_real_arguments_take_every_number_type_and_refuse_nan_inf_bools(arg, kind, value):
    name, call = REAL_ARGS[arg]
    typed = _typed(kind, value)
    assume(typed is not None)
    finite = isinstance(value, (int, float)) and math.isfinite(value)
    if kind in BOOL_KINDS or not finite:
        _refused_by_name(lambda: call(typed), name)
        return
    try:
        want = call(float(typed.item() if hasattr(typed, "item") else typed))
    except ValueError:  # out of the argument's range: the typed value is refused the same way
        _refused_by_name(lambda: call(typed), name)
        return
    got = call(typed)
    assert got == want or (math.isnan(got) and math.isnan(want))


ALIASES = st.lists(st.sampled_from(["symlink", "hardlink", "dot", "dotdot", "slashes", "relative"]), min_size=1,
                   max_size=4)


@settings(max_examples=examples(100), deadline=None)
@given(steps=ALIASES)
def test_an_output_that_aliases_an_input_by_any_spelling_is_refused(steps, tmp_path_factory):
    root = tmp_path_factory.mktemp("alias")
    (root / "sub").mkdir()
    source = root / "X.npy"
    np.save(source, np.ones((3, 2), np.float32))
    path = str(source)
    for i, step in enumerate(steps):  # each step: another spelling of the same file
        if step == "symlink":
            link = root / f"link{i}"
            os.symlink(os.path.abspath(path), link)
            path = str(link)
        elif step == "hardlink":
            link = root / f"hard{i}"
            os.link(path, link)
            path = str(link)
        elif step == "dot":
            path = os.path.join(os.path.dirname(path), ".", os.path.basename(path))
        elif step == "dotdot":
            path = os.path.join(os.path.dirname(path), "sub", "..", os.path.basename(path))
        elif step == "slashes":
            path = path[:1] + path[1:].replace(os.sep, os.sep * 2)  # (a leading // is another root in POSIX)
        elif step == "relative":
            path = os.path.relpath(path)
    with pytest.raises(ValueError, match="--json"):
        check_no_clobber([("--json", path)], [("the source", str(source))])
    with pytest.raises(ValueError, match="same file"):
        check_no_clobber([("--json", str(source)), ("--plot", path)])  # two outputs, one file
    check_no_clobber([("--json", str(root / "other.json"))], [("the source", path)])  # another file: fine
