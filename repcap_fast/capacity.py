"""Capacity formulas of Guha (2026), vectorized over arrays of d and ε, in float64/log space.
(The fit of their constants to packings is repcap_fast.fitting; sweep files, sweep_file.)

* JL:        k ≤ exp(d ε²/C), C = 8 (proven) or 3.029 (fitted to random vectors).
* Adjusted:  k ≤ d·exp(d ε²/C), C = 1.293.
* Full:      ε = sqrt(C·ln(k^a/d)^b / d^c)  ⇒  k ≤ (d·exp((d^c ε²/C)^(1/b)))^(1/a),
             C=0.45809143, a=1.0668005, b=1.44738666, c=0.97197234 (the paper's ``max_k``).
* Lower bounds no packing beats: Welch (orders t ≥ 1) and orthoplex (1/√d when k > d(d+1)/2).

Capacities pass 1e15 quickly; every ``*_capacity`` has a ``log_*`` twin (natural log) that never
overflows, and the plain forms return inf where float64 overflows.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _validation as val
from ._deprecated import moved_names

JL_C_PROVEN = 8.0
JL_C_FITTED = 3.029
ADJUSTED_C = 1.293
FULL_PARAMS = {"C": 0.45809143, "a": 1.0668005, "b": 1.44738666, "c": 0.97197234}
CLASS1_ABOVE = 0.2
CLASS2_BELOW = 0.1


def _reals(x, name: str) -> np.ndarray:
    """x as a float64 array of finite reals (a scalar as a 0-d array): a Python, numpy or torch
    number, or an array-like of them. Bools, strings, None, complex numbers, NaN and ±inf are
    refused with an error that names the argument (they were read as numbers, or gave NaN)."""
    if isinstance(x, torch.Tensor) and x.dim() == 0 or x is None or isinstance(x, (bool, int, float, complex, str,
                                                                                   bytes, np.generic)):
        return np.asarray(val.as_real(x, name), dtype=np.float64)
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise val.ArgumentTypeError(f"{name} must hold real numbers, got {x.dtype} values")
        arr = x.detach().cpu().to(torch.float64).numpy()
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:  # ragged nesting
            raise val.ArgumentTypeError(f"{name} must be a number or an array of numbers: {exc}") from None
        if arr.dtype.kind not in "iuf":
            raise val.ArgumentTypeError(f"{name} must hold real numbers, got {arr.dtype} values")
        arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return arr


def _d_eps(d, eps):
    d = _reals(d, "d")
    eps = _reals(eps, "eps")
    if np.any(d < 1):
        raise ValueError(f"d must be finite and >= 1, got {d}")
    if np.any(eps < 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return d, eps


def _positive(C, name="C"):
    C = _reals(C, name)
    if np.any(C <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {C}")
    return C


def _out(x):
    return float(x) if np.ndim(x) == 0 else x


def log_jl_capacity(d, eps, C=JL_C_PROVEN):
    """ln k of the JL bound: d ε²/C."""
    d, eps = _d_eps(d, eps)
    return _out(d * eps**2 / _positive(C))


def jl_capacity(d, eps, C=JL_C_PROVEN):
    """JL capacity k = exp(d ε²/C). C=8 (proven) or 3.029 (fitted)."""
    with np.errstate(over="ignore"):
        return _out(np.exp(log_jl_capacity(d, eps, C)))


def log_adjusted_capacity(d, eps, C=ADJUSTED_C):
    """ln k of the one-parameter adjusted bound: ln d + d ε²/C."""
    d, eps = _d_eps(d, eps)
    return _out(np.log(d) + d * eps**2 / _positive(C))


def adjusted_capacity(d, eps, C=ADJUSTED_C):
    """Adjusted capacity k = d·exp(d ε²/C), C = 1.293."""
    with np.errstate(over="ignore"):
        return _out(np.exp(log_adjusted_capacity(d, eps, C)))


def log_full_capacity(d, eps, C=FULL_PARAMS["C"], a=FULL_PARAMS["a"], b=FULL_PARAMS["b"], c=FULL_PARAMS["c"]):
    """ln k of the fully parameterized form: (ln d + (d^c ε²/C)^(1/b)) / a."""
    d, eps = _d_eps(d, eps)
    C, a, b, c = _positive(C), _positive(a, "a"), _positive(b, "b"), _reals(c, "c")
    return _out((np.log(d) + (d**c * eps**2 / C) ** (1.0 / b)) / a)


def full_capacity(d, eps, **params):
    """Full-form capacity k = (d·exp((d^c ε²/C)^(1/b)))^(1/a) (the paper's ``max_k``).

    d=4096, ε=0.0645 gives about 3.99e7 (Llama-2-7B).
    """
    with np.errstate(over="ignore"):
        return _out(np.exp(log_full_capacity(d, eps, **params)))


def full_epsilon(k, d, C=FULL_PARAMS["C"], a=FULL_PARAMS["a"], b=FULL_PARAMS["b"], c=FULL_PARAMS["c"]):
    """Inverse of the full form: ε = sqrt(C·ln(k^a/d)^b / d^c); 0 where k^a ≤ d."""
    k, d = _k_d(k, d, 0.0)
    C, a, b, c = _positive(C), _positive(a, "a"), _positive(b, "b"), _reals(c, "c")
    inner = np.maximum(a * np.log(k) - np.log(d), 0.0)
    return _out(np.sqrt(C * inner**b / d**c))


def model_class(eps):
    """1 if ε > 0.2 (no near-orthogonal structure; capacity indeterminate), 2 if ε < 0.1,
    else "borderline". Vectorized inputs give an object array."""
    e = _reals(eps, "eps")
    out = np.where(e > CLASS1_ABOVE, 1, np.where(e < CLASS2_BELOW, 2, 0)).astype(object)
    out[out == 0] = "borderline"
    return out.item() if out.ndim == 0 else out


def describe_class(eps) -> str:
    cls = model_class(val.as_real(eps, "eps"))
    if cls == 1:
        return "class 1 (ε > 0.2: no near-orthogonal structure; capacity indeterminate)"
    if cls == 2:
        return "class 2 (ε < 0.1: near-orthogonal)"
    return "borderline (0.1 ≤ ε ≤ 0.2)"


def _k_d(k, d, least_k: float):
    """k (> 0, or >= least_k when that is > 0) and d (>= 1) as finite float64 arrays."""
    k, d = _reals(k, "k"), _reals(d, "d")
    if np.any(k < least_k) or (least_k == 0 and np.any(k <= 0)):
        raise ValueError(f"k must be {'> 0' if least_k == 0 else f'>= {least_k:g}'}, got {k}")
    if np.any(d < 1):
        raise ValueError(f"d must be >= 1, got {d}")
    return k, d


def _log_binom(n, r):
    from scipy.special import gammaln

    return gammaln(n + 1.0) - gammaln(r + 1.0) - gammaln(n - r + 1.0)


def welch_bound(k, d, order=1):
    """Welch lower bound on max_{i≠j}|c_ij| for k unit vectors in R^d, order t ≥ 1:

    max|c|^(2t) ≥ (k / binom(d+t-1, t) − 1) / (k − 1)   (0 when the right side is ≤ 0).
    Order 1 is sqrt((k−d)/(d(k−1))).
    """
    k, d = _k_d(k, d, 2.0)
    t = _reals(order, "order")
    if np.any(t < 1) or np.any(t != np.floor(t)):
        raise ValueError(f"welch_bound needs an integer order >= 1, got order={order!r}")
    from scipy.special import comb

    with np.errstate(over="ignore"):
        binom = comb(d + t - 1.0, t)  # exact-ish in float64; log form where it overflows
    ratio = np.where(np.isfinite(binom), k / binom, np.exp(np.log(k) - _log_binom(d + t - 1.0, t)))
    rhs = np.maximum((ratio - 1.0) / (k - 1.0), 0.0)
    return _out(rhs ** (1.0 / (2.0 * t)))


def orthoplex_bound(k, d):
    """1/√d when k > d(d+1)/2 (real case), else 0: no packing of k lines beats it."""
    k, d = _k_d(k, d, 0.0)
    return _out(np.where(k > d * (d + 1) / 2.0, 1.0 / np.sqrt(d), 0.0))


def coherence_floor(k, d, max_order=4):
    """The best of the Welch bounds of orders 1..max_order and the orthoplex bound."""
    max_order = val.check_int(max_order, "max_order", 1)
    bounds = [np.asarray(welch_bound(k, d, t)) for t in range(1, max_order + 1)]
    bounds.append(np.asarray(orthoplex_bound(k, d)))
    return _out(np.max(np.stack(np.broadcast_arrays(*bounds)), axis=0))


def capacity_table(d: int, eps: float, vocab: int | None = None) -> dict:
    """All capacity formulas for one (d, ε), with the Welch/orthoplex floor beside each.

    ε < 0 (possible for A×B statistics or tiny V) has no capacity: the formulas are reported as
    None."""
    d = val.check_int(d, "d", 1, integral_real=True)
    eps = val.as_real(eps, "eps")
    vocab = None if vocab is None else val.check_int(vocab, "vocab", integral_real=True)
    rows = {}
    forms = {
        "jl_C8": lambda: log_jl_capacity(d, eps, JL_C_PROVEN),
        "jl_C3.029": lambda: log_jl_capacity(d, eps, JL_C_FITTED),
        "adjusted_C1.293": lambda: log_adjusted_capacity(d, eps),
        "full": lambda: log_full_capacity(d, eps),
    }
    for name, form in forms.items():
        if eps < 0:
            rows[name] = None
            continue
        log_k = form()
        k = float(np.exp(log_k)) if log_k < 700 else float("inf")
        rows[name] = {
            "capacity": k,
            "log10_capacity": float(log_k / np.log(10.0)),
            "welch_floor": float(coherence_floor(max(k, 2.0), d)) if np.isfinite(k) else 1.0 / np.sqrt(d),
        }
    out = {"d": int(d), "epsilon": float(eps), "class": model_class(float(eps)), "formulas": rows}
    if vocab is not None and vocab >= 2:
        out["vocab"] = int(vocab)
        out["welch_floor_vocab"] = float(coherence_floor(vocab, d))
    return out


# The fit lives apart from the formulas (repcap_fast.fitting); its old names here are deprecated.
__getattr__ = moved_names(__name__, {name: ("repcap_fast.fitting", name) for name in ("fit", "FIT_FORMS", "FitResult")})
