"""Capacity formulas of Guha (2026), vectorized over arrays of d and ε, in float64/log space.

The fit of their constants to packings is repcap_fast.fitting; sweep files, repcap_fast.packing.sweep_file.

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

from . import _validation as val
from ._deprecated import moved_names
from .coherence_bounds import (  # noqa: F401  the bounds are served here too, where users import them
    MAX_WELCH_ORDERS,
    _k_d,
    _out,
    _reals,
    coherence_bound,
    coherence_floor,
    levenstein_bound,
    orthoplex_bound,
    welch_bound,
)

__all__ = [
    "ADJUSTED_C",
    "CLASS1_ABOVE",
    "CLASS2_BELOW",
    "FULL_PARAMS",
    "JL_C_FITTED",
    "JL_C_PROVEN",
    "adjusted_capacity",
    "capacity_table",
    "coherence_bound",
    "coherence_floor",
    "describe_class",
    "full_capacity",
    "full_epsilon",
    "jl_capacity",
    "levenstein_bound",
    "log_adjusted_capacity",
    "log_full_capacity",
    "log_jl_capacity",
    "model_class",
    "orthoplex_bound",
    "welch_bound",
]

JL_C_PROVEN = 8.0
"""The constant C of the JL bound k ≤ exp(d ε²/C) as proven."""
JL_C_FITTED = 3.029
"""The constant C of the JL bound fitted to random vectors."""
ADJUSTED_C = 1.293
"""The constant C of the adjusted bound k ≤ d·exp(d ε²/C)."""
FULL_PARAMS = {"C": 0.45809143, "a": 1.0668005, "b": 1.44738666, "c": 0.97197234}
"""The constants C, a, b, c of the full form ε = sqrt(C·ln(k^a/d)^b / d^c) (the paper's ``max_k``)."""
CLASS1_ABOVE = 0.2
"""ε above this is class 1: no near-orthogonal structure, capacity indeterminate."""
CLASS2_BELOW = 0.1
"""ε below this is class 2: near-orthogonal."""


def _d_eps(d, eps):
    """D (>= 1) and eps (>= 0) as finite float64 arrays."""
    d = _reals(d, "d")
    eps = _reals(eps, "eps")
    if np.any(d < 1):
        raise ValueError(f"d must be finite and >= 1, got {d}")
    if np.any(eps < 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return d, eps


def _positive(C, name="C"):
    """A constant as a finite float64 array > 0."""
    C = _reals(C, name)
    if np.any(C <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {C}")
    return C


def log_jl_capacity(d, eps, C=JL_C_PROVEN):
    """The natural log of the JL capacity, ln k = d ε²/C (never overflows).

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        C (float): the constant, > 0 (default ``JL_C_PROVEN`` = 8; ``JL_C_FITTED`` = 3.029).

    Returns:
        float or numpy.ndarray: ln k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.log_jl_capacity(4096, 0.0645), 4)
        2.13
    """
    d, eps = _d_eps(d, eps)
    return _out(d * eps**2 / _positive(C))


def jl_capacity(d, eps, C=JL_C_PROVEN):
    """The JL capacity k = exp(d ε²/C), inf where it overflows float64.

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        C (float): the constant, > 0 (default ``JL_C_PROVEN`` = 8 (proven); ``JL_C_FITTED`` = 3.029,
            fitted to random vectors).

    Returns:
        float or numpy.ndarray: k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.jl_capacity(4096, 0.0645, C=rf.capacity.JL_C_FITTED), 1)
        277.5
    """
    with np.errstate(over="ignore"):
        return _out(np.exp(log_jl_capacity(d, eps, C)))


def log_adjusted_capacity(d, eps, C=ADJUSTED_C):
    """The natural log of the adjusted capacity, ln k = ln d + d ε²/C (never overflows).

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        C (float): the constant, > 0 (default ``ADJUSTED_C`` = 1.293).

    Returns:
        float or numpy.ndarray: ln k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.log_adjusted_capacity(4096, 0.0645), 3)
        21.497
    """
    d, eps = _d_eps(d, eps)
    return _out(np.log(d) + d * eps**2 / _positive(C))


def adjusted_capacity(d, eps, C=ADJUSTED_C):
    """The adjusted capacity k = d·exp(d ε²/C), inf where it overflows float64.

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        C (float): the constant, > 0 (default ``ADJUSTED_C`` = 1.293).

    Returns:
        float or numpy.ndarray: k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> f"{rf.capacity.adjusted_capacity(4096, 0.0645):.3g}"
        '2.17e+09'
    """
    with np.errstate(over="ignore"):
        return _out(np.exp(log_adjusted_capacity(d, eps, C)))


def log_full_capacity(d, eps, C=FULL_PARAMS["C"], a=FULL_PARAMS["a"], b=FULL_PARAMS["b"], c=FULL_PARAMS["c"]):
    r"""The natural log of the full-form capacity, $\ln k = (\ln d + (d^c \varepsilon^2/C)^{1/b}) / a$.

    Never overflows; ``full_capacity`` is its exponential.

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        C (float): the constant C, > 0 (default ``FULL_PARAMS["C"]``).
        a (float): the exponent a, > 0 (default ``FULL_PARAMS["a"]``).
        b (float): the exponent b, > 0 (default ``FULL_PARAMS["b"]``).
        c (float): the exponent c, a finite real (default ``FULL_PARAMS["c"]``).

    Returns:
        float or numpy.ndarray: ln k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C, a or b ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.log_full_capacity(4096, 0.0645), 3)
        17.503
    """
    d, eps = _d_eps(d, eps)
    C, a, b, c = _positive(C), _positive(a, "a"), _positive(b, "b"), _reals(c, "c")
    return _out((np.log(d) + (d**c * eps**2 / C) ** (1.0 / b)) / a)


def full_capacity(d, eps, **params):
    r"""The full-form capacity of d dimensions at ε (the paper's ``max_k``).

    $k = \left(d \exp\left((d^c \varepsilon^2/C)^{1/b}\right)\right)^{1/a}$, the inverse of
    ``full_epsilon``; inf where k overflows float64 (``log_full_capacity`` does not). d = 4096, ε =
    0.0645 (Llama-2-7B) gives about 3.99e7.

    Args:
        d (float or array_like): the dimension d ≥ 1: a number or an array of them (Python, numpy or torch).
        eps (float or array_like): the accepted deviation ε ≥ 0: a number or an array, broadcast against d.
        **params (float): C, a, b and c to override ``FULL_PARAMS`` (as in ``log_full_capacity``).

    Returns:
        float or numpy.ndarray: k, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: d < 1, ε < 0, C, a or b ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers, or a keyword other than C, a, b, c.

    Examples:
        >>> f"{rf.capacity.full_capacity(4096, 0.0645):.3g}"
        '3.99e+07'
        >>> rf.capacity.full_capacity([384, 768], 0.1).round(-1)
        array([  9970., 164160.])
    """
    with np.errstate(over="ignore"):
        return _out(np.exp(log_full_capacity(d, eps, **params)))


def full_epsilon(k, d, C=FULL_PARAMS["C"], a=FULL_PARAMS["a"], b=FULL_PARAMS["b"], c=FULL_PARAMS["c"]):
    r"""The ε of k vectors in d dimensions by the full form, $\varepsilon = \sqrt{C \left(\ln(k^a/d)\right)^b / d^c}$.

    The inverse of ``full_capacity``; 0 where $k^a \le d$.

    Args:
        k (float or array_like): the number of vectors, > 0: a number or an array of them.
        d (float or array_like): the dimension d ≥ 1: a number or an array, broadcast against k.
        C (float): the constant C, > 0 (default ``FULL_PARAMS["C"]``).
        a (float): the exponent a, > 0 (default ``FULL_PARAMS["a"]``).
        b (float): the exponent b, > 0 (default ``FULL_PARAMS["b"]``).
        c (float): the exponent c, a finite real (default ``FULL_PARAMS["c"]``).

    Returns:
        float or numpy.ndarray: ε, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: k ≤ 0, d < 1, C, a or b ≤ 0, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.full_epsilon(3.99e7, 4096), 4)
        0.0645
    """
    k, d = _k_d(k, d, 0.0)
    C, a, b, c = _positive(C), _positive(a, "a"), _positive(b, "b"), _reals(c, "c")
    inner = np.maximum(a * np.log(k) - np.log(d), 0.0)
    return _out(np.sqrt(C * inner**b / d**c))


def model_class(eps):
    """The class of a model by its ε: 1 if ε > 0.2, 2 if ε < 0.1, else "borderline".

    Class 1 (ε > ``CLASS1_ABOVE``) has no near-orthogonal structure and its capacity is
    indeterminate; class 2 (ε < ``CLASS2_BELOW``) is near-orthogonal.

    Args:
        eps (float or array_like): ε, a finite real or an array of them.

    Returns:
        int or str or numpy.ndarray: 1, 2 or "borderline" for a scalar; an object array of them
        for an array.

    Raises:
        ValueError: ε is NaN or ±inf.
        TypeError: ε is not real numbers (a bool, a string, None, complex).

    Examples:
        >>> rf.capacity.model_class(0.0645)
        2
        >>> rf.capacity.model_class([0.05, 0.15, 0.3])
        array([2, 'borderline', 1], dtype=object)
    """
    e = _reals(eps, "eps")
    out = np.where(e > CLASS1_ABOVE, 1, np.where(e < CLASS2_BELOW, 2, 0)).astype(object)
    out[out == 0] = "borderline"
    return out.item() if out.ndim == 0 else out


def describe_class(eps) -> str:
    """The class of ``model_class`` in words, with its ε range.

    Args:
        eps (float): ε, one finite real.

    Returns:
        str: e.g. "class 2 (ε < 0.1: near-orthogonal)".

    Raises:
        ValueError: ε is NaN or ±inf.
        TypeError: ε is not one real number (a bool, a string, None, an array).

    Examples:
        >>> rf.capacity.describe_class(0.15)
        'borderline (0.1 ≤ ε ≤ 0.2)'
    """
    cls = model_class(val.as_real(eps, "eps"))
    if cls == 1:
        return "class 1 (ε > 0.2: no near-orthogonal structure; capacity indeterminate)"
    if cls == 2:
        return "class 2 (ε < 0.1: near-orthogonal)"
    return "borderline (0.1 ≤ ε ≤ 0.2)"


def capacity_table(d: int, eps: float, vocab: int | None = None) -> dict:
    """Every capacity formula for one (d, ε), with the Welch/orthoplex floor beside each.

    The formulas: JL with C = 8 and C = 3.029, adjusted, full form. ε < 0 (possible for A×B
    statistics or tiny V) has no capacity: the formulas are reported as None.

    Args:
        d: the dimension, an integer ≥ 1 (an integral float such as 384.0 is accepted).
        eps: ε, a finite real.
        vocab: the number of vectors V (optional); when given and ≥ 2, the coherence floor of V
            vectors in d dimensions is added.

    Returns:
        dict: ``d``, ``epsilon``, ``class`` (``model_class``) and ``formulas``: per formula
        (``jl_C8``, ``jl_C3.029``, ``adjusted_C1.293``, ``full``) None or a dict of
        ``capacity`` (inf beyond float64), ``log10_capacity`` and ``welch_floor`` (the
        ``coherence_floor`` of that many vectors); with vocab also ``vocab`` and
        ``welch_floor_vocab``.

    Raises:
        ValueError: d < 1 or not integral, ε NaN or ±inf, or vocab not integral.
        TypeError: d, ε or vocab of the wrong type (a bool, a string, None for d or ε);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> table = rf.capacity.capacity_table(4096, 0.0645)
        >>> table["class"], f"{table['formulas']['full']['capacity']:.3g}"
        (2, '3.99e+07')
    """
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
