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

from ._deprecated import moved_names

JL_C_PROVEN = 8.0
JL_C_FITTED = 3.029
ADJUSTED_C = 1.293
FULL_PARAMS = {"C": 0.45809143, "a": 1.0668005, "b": 1.44738666, "c": 0.97197234}
CLASS1_ABOVE = 0.2
CLASS2_BELOW = 0.1


def _d_eps(d, eps):
    d = np.asarray(d, dtype=np.float64)
    eps = np.asarray(eps, dtype=np.float64)
    if np.any(~np.isfinite(d)) or np.any(d < 1):
        raise ValueError(f"d must be finite and >= 1, got {d}")
    if np.any(~np.isfinite(eps)) or np.any(eps < 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return d, eps


def _positive(C, name="C"):
    C = np.asarray(C, dtype=np.float64)
    if np.any(~np.isfinite(C)) or np.any(C <= 0):
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
    C, a, b = _positive(C), _positive(a, "a"), _positive(b, "b")
    return _out((np.log(d) + (d**c * eps**2 / C) ** (1.0 / b)) / a)


def full_capacity(d, eps, **params):
    """Full-form capacity k = (d·exp((d^c ε²/C)^(1/b)))^(1/a) (the paper's ``max_k``).

    d=4096, ε=0.0645 gives about 3.99e7 (Llama-2-7B).
    """
    with np.errstate(over="ignore"):
        return _out(np.exp(log_full_capacity(d, eps, **params)))


def full_epsilon(k, d, C=FULL_PARAMS["C"], a=FULL_PARAMS["a"], b=FULL_PARAMS["b"], c=FULL_PARAMS["c"]):
    """Inverse of the full form: ε = sqrt(C·ln(k^a/d)^b / d^c); 0 where k^a ≤ d."""
    k = np.asarray(k, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    inner = np.maximum(a * np.log(k) - np.log(d), 0.0)
    return _out(np.sqrt(C * inner**b / d**c))


def model_class(eps):
    """1 if ε > 0.2 (no near-orthogonal structure; capacity indeterminate), 2 if ε < 0.1,
    else "borderline". Vectorized inputs give an object array."""
    e = np.asarray(eps, dtype=np.float64)
    if np.any(~np.isfinite(e)):
        raise ValueError(f"eps must be finite, got {eps}")
    out = np.where(e > CLASS1_ABOVE, 1, np.where(e < CLASS2_BELOW, 2, 0)).astype(object)
    out[out == 0] = "borderline"
    return out.item() if out.ndim == 0 else out


def describe_class(eps) -> str:
    cls = model_class(float(eps))
    if cls == 1:
        return "class 1 (ε > 0.2: no near-orthogonal structure; capacity indeterminate)"
    if cls == 2:
        return "class 2 (ε < 0.1: near-orthogonal)"
    return "borderline (0.1 ≤ ε ≤ 0.2)"


def _log_binom(n, r):
    from scipy.special import gammaln

    return gammaln(n + 1.0) - gammaln(r + 1.0) - gammaln(n - r + 1.0)


def welch_bound(k, d, order=1):
    """Welch lower bound on max_{i≠j}|c_ij| for k unit vectors in R^d, order t ≥ 1:

    max|c|^(2t) ≥ (k / binom(d+t-1, t) − 1) / (k − 1)   (0 when the right side is ≤ 0).
    Order 1 is sqrt((k−d)/(d(k−1))).
    """
    k = np.asarray(k, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    t = np.asarray(order, dtype=np.float64)
    if np.any(k < 2) or np.any(d < 1) or np.any(t < 1) or np.any(t != np.floor(t)):
        raise ValueError("welch_bound needs k >= 2, d >= 1 and an integer order >= 1")
    from scipy.special import comb

    with np.errstate(over="ignore"):
        binom = comb(d + t - 1.0, t)  # exact-ish in float64; log form where it overflows
    ratio = np.where(np.isfinite(binom), k / binom, np.exp(np.log(k) - _log_binom(d + t - 1.0, t)))
    rhs = np.maximum((ratio - 1.0) / (k - 1.0), 0.0)
    return _out(rhs ** (1.0 / (2.0 * t)))


def orthoplex_bound(k, d):
    """1/√d when k > d(d+1)/2 (real case), else 0: no packing of k lines beats it."""
    k = np.asarray(k, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    return _out(np.where(k > d * (d + 1) / 2.0, 1.0 / np.sqrt(d), 0.0))


def coherence_floor(k, d, max_order=4):
    """The best of the Welch bounds of orders 1..max_order and the orthoplex bound."""
    bounds = [np.asarray(welch_bound(k, d, t)) for t in range(1, max_order + 1)]
    bounds.append(np.asarray(orthoplex_bound(k, d)))
    return _out(np.max(np.stack(np.broadcast_arrays(*bounds)), axis=0))


def capacity_table(d: int, eps: float, vocab: int | None = None) -> dict:
    """All capacity formulas for one (d, ε), with the Welch/orthoplex floor beside each.

    ε < 0 (possible for A×B statistics or tiny V) has no capacity: the formulas are reported as
    None."""
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
