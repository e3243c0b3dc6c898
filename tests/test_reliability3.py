"""Regression tests for the third reliability probe (issue 47), the parts in the ops and the
capacity bounds: higher-order gradients of the penalty, bounds that never go NaN or hang,
integral checks in the argument's own type, and argument errors that keep their type and
message under torch.compile. Each test failed before its fix. The sweep-file, command-line and
tensor-layout parts are in test_reliability3_files.py."""

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import capacity, coherence_bounds
from repcap_fast._backends import build_info
from repcap_fast.reference import gram_offdiag_penalty_reference

from _helpers import raised

needs_c = pytest.mark.skipif(not build_info(), reason="repcap_fast._C is not built")


def _x(k, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype)


# ------------------------------------------------------- item 1: second-order gradients


def _gradient_penalty_grad(loss_fn, X):
    """d/dX of L + ‖∂L/∂X‖², the gradient penalty of the issue."""
    X = X.detach().clone().requires_grad_()
    loss = loss_fn(X)
    (g,) = torch.autograd.grad(loss, X, create_graph=True)
    (loss + (g**2).sum()).backward()
    return X.grad




@needs_c
@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("normalize, reduction, p", [(True, "sum", 8), (True, "mean", 3), (False, "sum", 2),
                                                     (False, "mean", 5), (True, "sum", 1), (True, "sum", 2)])
def test_a_gradient_penalty_gets_the_second_order_term_of_the_reference(backend, normalize, reduction, p):
    if backend == "triton":
        pytest.importorskip("triton")
    X = _x(13, 5)
    got = _gradient_penalty_grad(
        lambda X: rf.gram_offdiag_penalty(X, p=p, normalize=normalize, reduction=reduction, backend=backend), X)
    want = _gradient_penalty_grad(
        lambda X: gram_offdiag_penalty_reference(X, p=p, normalize=normalize, reduction=reduction), X)
    first = _x(13, 5).requires_grad_()
    gram_offdiag_penalty_reference(first, p=p, normalize=normalize, reduction=reduction).backward()
    assert not torch.allclose(want, first.grad)  # the second-order term is not negligible here
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * float(want.abs().max()))


@needs_c
@pytest.mark.parametrize("normalize", [True, False])
def test_gradgradcheck_in_float64(normalize):
    X = _x(7, 3).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda X: rf.gram_offdiag_penalty(X, p=4, normalize=normalize), (X,))
    op = torch.ops.repcap_fast.gram_offdiag_penalty  # the op itself, through its registered formula
    assert torch.autograd.gradgradcheck(lambda X: op(X, 3, normalize, "mean", "cpu", "highest", True)[0], (X,))


@needs_c
def test_the_float32_gradient_penalty_is_within_float32_rounding_of_the_float64_reference():
    X = _x(60, 8, torch.float32)
    got = _gradient_penalty_grad(lambda X: rf.gram_offdiag_penalty(X, p=8), X)
    want = _gradient_penalty_grad(lambda X: gram_offdiag_penalty_reference(X, p=8), X.double())
    assert got.dtype == torch.float32
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5


@needs_c
def test_the_first_order_gradient_keeps_the_kernels_value_under_create_graph():
    X = _x(40, 6, torch.float32).requires_grad_()
    (plain,) = torch.autograd.grad(rf.gram_offdiag_penalty(X, p=6), X)
    (graphed,) = torch.autograd.grad(rf.gram_offdiag_penalty(X, p=6), X, create_graph=True)
    assert graphed.requires_grad and torch.equal(graphed.detach(), plain)


@needs_c
def test_a_learnable_weight_on_the_loss_gets_its_gradient_through_the_gradient():
    X = _x(10, 4).requires_grad_()
    lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(lam * rf.gram_offdiag_penalty(X, p=4), X, create_graph=True)
    (dlam,) = torch.autograd.grad((g**2).sum(), lam)
    (g1,) = torch.autograd.grad(rf.gram_offdiag_penalty(X, p=4), X)
    torch.testing.assert_close(dlam, 2 * lam.detach() * (g1**2).sum())


@needs_c
def test_a_third_derivative_is_refused_not_dropped():
    X = _x(9, 3).requires_grad_()
    (g,) = torch.autograd.grad(rf.gram_offdiag_penalty(X, p=4), X, create_graph=True)
    (h,) = torch.autograd.grad((g**2).sum(), X, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        h.sum().backward()


# ------------------------------------------- items 2 and 7: bounds, finite and bounded in time

HUGE = [2.0, 3.0, 1e3, 1e18, 2.0**62, 1e154, 1e200, 1e307, 1e308, 1.7976931348623157e308]


@pytest.mark.parametrize("k", HUGE)
@pytest.mark.parametrize("d", [1.0, 2.0, 3.0, 21.0, 4096.0, 1e9, 1e154, 1e300])
def test_every_bound_is_finite_and_in_0_1_for_every_finite_k(k, d):
    values = [capacity.welch_bound(k, d), capacity.welch_bound(k, d, 3), capacity.orthoplex_bound(k, d),
              capacity.levenstein_bound(k, d), capacity.coherence_floor(k, d)]
    name_value = capacity.coherence_bound(k, d)
    for v in values + [name_value[0]]:
        assert math.isfinite(v) and 0.0 <= v <= 1.0 + 1e-15, (k, d, values, name_value)


def _exact_levenstein(k: int, d: int) -> float:
    if 2 * k <= d * (d + 1):
        return 0.0
    return math.sqrt(Fraction(3 * k - d * d - 2 * d, (d + 2) * (k - d)))


def _exact_welch(k: int, d: int, t: int) -> float:
    rhs = max(Fraction(k, math.comb(d + t - 1, t)) - 1, 0) / (k - 1)
    return float(rhs) ** (1.0 / (2 * t))


@pytest.mark.parametrize("k, d", [(10**308, 2), (10**300, 7), (6 * 10**307, 3), (10**20, 100), (4, 2), (100, 3),
                                  (2**62, 2**31)])
def test_levenstein_and_welch_match_exact_integer_arithmetic(k, d):
    assert capacity.levenstein_bound(float(k), d) == pytest.approx(_exact_levenstein(k, d), rel=1e-14)
    for t in (1, 2, 4):
        assert capacity.welch_bound(float(k), d, t) == pytest.approx(_exact_welch(k, d, t), rel=1e-12, abs=1e-300)


def test_coherence_bound_is_not_weakened_by_a_nan_for_large_k():
    bound, name = capacity.coherence_bound(1e308, 2)
    assert name == "levenstein" and bound == pytest.approx(math.sqrt(3 / 4), rel=1e-14)


@pytest.mark.parametrize("max_order", [10**5, 2**62])
def test_a_huge_max_order_returns_at_once_where_the_orders_run_out(max_order):
    start = time.perf_counter()
    assert capacity.coherence_bound(1000, 10, max_order=max_order) == capacity.coherence_bound(1000, 10, max_order=9)
    assert capacity.coherence_floor(1000, 10, max_order=max_order) == capacity.coherence_floor(1000, 10, max_order=9)
    assert time.perf_counter() - start < 2.0


def test_the_orders_past_the_first_zero_cannot_raise_the_bound():
    # k = 1000 in R^10: binom(10 + t − 1, t) = 715 at t = 4 and 2002 at t = 5, so orders ≥ 5 give 0
    assert capacity.welch_bound(1000, 10, 4) > 0.0
    assert [capacity.welch_bound(1000, 10, t) for t in range(5, 40)] == [0.0] * 35
    for max_order in (4, 10**6):
        assert coherence_bounds._welch_orders(1000, 10, max_order).shape == (4,)
    assert capacity.coherence_floor(1000, 10, max_order=4) == capacity.coherence_floor(1000, 10, max_order=10**6)


def test_a_max_order_that_would_need_too_many_orders_is_refused_by_name():
    with pytest.raises(ValueError, match="max_order"):
        capacity.coherence_bound(1e18, 2, max_order=2**62)
    with pytest.raises(ValueError, match="max_order"):
        capacity.coherence_floor([1e3, 1e18], 2, max_order=2**40)
    bound, name = capacity.coherence_bound(10**4, 2, max_order=2**62)  # 9999 orders: evaluated
    assert name.startswith("welch-") and bound <= math.cos(math.pi / 10**4)


# --------------------------------------------------- item 5: integral checks in their own type

NEAR_INTEGERS = [np.longdouble(8) + np.longdouble(2) ** -60, np.longdouble(2) ** 60 + np.longdouble(0.5)]


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="numpy's long double is float64 here")
@pytest.mark.parametrize("value", NEAR_INTEGERS, ids=["8+2^-60", "2^60+0.5"])
def test_a_long_double_that_is_not_an_integer_is_refused(value):
    with pytest.raises(ValueError, match="p must be an integer"):
        rf.gram_offdiag_penalty(_x(5, 3), p=value)
    with pytest.raises(ValueError, match="order"):
        capacity.welch_bound(100, 10, order=value)
    with pytest.raises(ValueError, match="n_rows"):
        rf.pairwise_cosine_stats(_x(5, 3), n_rows=value, progress=False)


def test_integral_long_doubles_and_floats_are_exact():
    from repcap_fast import _validation as val

    assert val.as_int(np.longdouble(2) ** 70, "n", integral_real=True) == 2**70
    assert val.as_int(8.0, "p", integral_real=True) == 8
    with pytest.raises(ValueError, match="never truncated"):
        val.as_int(np.float16(2.5), "p", integral_real=True)


# ------------------------------- item 9: argument errors keep their type under torch.compile

_R = torch.ops.repcap_fast
# Each op as a function of X and keyword overrides, through the public function or the raw op.
OPS = {
    "penalty": lambda x, p=8, backend="auto", precision="highest", reduction="sum", **_: rf.gram_offdiag_penalty(
        x, p=p, reduction=reduction, backend=backend, precision=precision),
    "block": lambda x, p=8, backend="auto", precision="highest", row_start=0, row_stop=2, **_:
        rf.gram_offdiag_penalty_block(x, row_start, row_stop, p, backend=backend, precision=precision)[1],
    "log_penalty": lambda x, p=8, backend="auto", precision="highest", **_: rf.gram_offdiag_log_penalty(
        x, p, backend=backend, precision=precision)[1],
    "row_stats": lambda x, p=8, backend="auto", precision="highest", **_: rf.gram_offdiag_row_stats(
        x, p, backend=backend, precision=precision)[1],
    "max": lambda x, backend="auto", precision="highest", **_: torch.tensor(rf.gram_offdiag_max(
        x, backend=backend, precision=precision)),
    "op:penalty": lambda x, p=8, backend="auto", precision="highest", reduction="sum", **_: _R.gram_offdiag_penalty(
        x, p, True, reduction, backend, precision, False)[0],
    "op:block": lambda x, p=8, backend="auto", precision="highest", row_start=0, row_stop=2, **_:
        _R.gram_offdiag_penalty_block(x, row_start, row_stop, p, backend, precision)[1],
    "op:log_penalty": lambda x, p=8, backend="auto", precision="highest", **_: _R.gram_offdiag_log_penalty(
        x, p, backend, precision)[1],
    "op:row_stats": lambda x, p=8, backend="auto", precision="highest", **_: _R.gram_offdiag_row_stats(
        x, p, True, backend, precision)[1],
    "op:max": lambda x, backend="auto", precision="highest", **_: _R.gram_offdiag_max(x, True, backend, precision),
}
_GOOD = _x(6, 4, torch.float32)
# Every argument check, as (X, overrides, the ops it applies to: None for all).
CHECKS = {
    "one row": (_x(1, 4, torch.float32), {}, None),
    "no rows": (torch.zeros(0, 4), {}, None),
    "int64 X": (torch.ones(5, 4, dtype=torch.int64), {}, None),
    "1-D X": (torch.ones(5), {}, None),
    "3-D X": (torch.ones(2, 5, 4), {}, None),
    "no columns": (torch.zeros(5, 0), {}, None),
    "p = 0": (_GOOD, {"p": 0}, "p"),
    "p too large": (_GOOD, {"p": 2**40}, "p"),
    "p = 2.5": (_GOOD, {"p": 2.5}, "public p"),
    "p beyond int64": (_GOOD, {"p": 2**70}, "public p"),
    "unknown backend": (_GOOD, {"backend": "nope"}, None),
    "backend not a string": (_GOOD, {"backend": 3}, "public"),
    "unknown precision": (_GOOD, {"precision": "fp8"}, None),
    "unknown reduction": (_GOOD, {"reduction": "max"}, "reduction"),
    "row_start > row_stop": (_GOOD, {"row_start": 3, "row_stop": 2}, "block"),
    "row_stop > k": (_GOOD, {"row_start": 0, "row_stop": 9}, "block"),
    "negative row_start": (_GOOD, {"row_start": -1, "row_stop": 2}, "block"),
    "NaN value": (torch.tensor([[1.0, 0.0], [math.nan, 1.0], [0.0, 1.0]]), {}, None),
    "zero row": (torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]), {}, None),
}


def _applies(op, scope):
    if scope is None:
        return True
    has_p = op not in ("max", "op:max")
    public = not op.startswith("op:")
    return {"p": has_p, "public p": has_p and public, "public": public,
            "reduction": op in ("penalty", "op:penalty"), "block": op in ("block", "op:block")}[scope]


MATRIX = [(op, check) for op in OPS for check, (_, _, scope) in CHECKS.items() if _applies(op, scope)]


@needs_c
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("op, check", MATRIX, ids=[f"{op}-{check}" for op, check in MATRIX])
def test_every_argument_check_raises_the_eager_error_in_fullgraph_compiled_code(op, check, compiler, caplog):
    x, overrides, _ = CHECKS[check]
    fn = OPS[op]
    eager = raised(lambda x: fn(x, **overrides), x)
    assert eager is not None and issubclass(eager[0], ValueError)  # every check's error is a ValueError
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: fn(x, **overrides), fullgraph=True, backend=compiler)
    with caplog.at_level("ERROR"):
        assert raised(compiled, x) == eager
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no logged tracebacks either


@needs_c
@pytest.mark.parametrize("check", ["one row", "int64 X", "p = 2.5", "unknown precision"])
def test_the_error_is_raised_even_where_the_compiled_code_discards_the_result(check):
    x, overrides, _ = CHECKS[check]

    def step(x):
        rf.gram_offdiag_penalty(x, **{k: v for k, v in overrides.items() if k in ("p", "precision")})
        return x.sum() if x.dtype.is_floating_point else x.double().sum()

    with pytest.raises(ValueError) as eager:
        step(x)
    torch._dynamo.reset()
    with pytest.raises(type(eager.value), match=re_escape(str(eager.value))):
        torch.compile(step, fullgraph=True, backend="aot_eager")(x)


def re_escape(text):
    import re

    return "^" + re.escape(text) + "$"


@needs_c
def test_dynamic_shapes_keep_the_error_and_the_good_calls_still_compile_once():
    counter = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    step = torch.compile(lambda x, a, b: rf.gram_offdiag_penalty_block(x, a, b, 8)[0], fullgraph=True, dynamic=True,
                         backend=counter)
    good = [float(step(_x(k, 4, torch.float32), 0, 2)) for k in (6, 9, 13)]
    assert good == [float(rf.gram_offdiag_penalty_block(_x(k, 4, torch.float32), 0, 2, 8)[0]) for k in (6, 9, 13)]
    with pytest.raises(ValueError, match=re_escape("rows must satisfy 0 <= row_start < row_stop <= k = 7, got [0, 9)")):
        step(_x(7, 4, torch.float32), 0, 9)


@pytest.mark.parametrize("fn", [lambda x: rf.pairwise_cosine_stats(x, progress=False).mean,
                                lambda x: rf.epsilon(x), lambda x: rf.cosine_moments(x).mean],
                         ids=["pairwise_cosine_stats", "epsilon", "cosine_moments"])
@pytest.mark.parametrize("check", ["one row", "int64 X", "1-D X", "NaN value", "zero row"])
def test_the_analysis_ops_run_eagerly_in_compiled_code_with_the_eager_errors(fn, check):
    x = CHECKS[check][0]
    eager = raised(fn, x)
    assert eager is not None
    torch._dynamo.reset()
    assert raised(torch.compile(fn, backend="aot_eager"), x) == eager
