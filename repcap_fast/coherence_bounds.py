"""Lower bounds on the coherence max_{i≠j} |c_ij| of k unit vectors in R^d: the certificates of a packing.

Welch (orders t ≥ 1), orthoplex and Levenstein, their best (``coherence_bound``, with its name)
and the floor the capacity tables report (``coherence_floor``). Every one is finite for every
finite k and d it accepts (float64 up to 1.8e308, in forms that never overflow), and the best
over the Welch orders stops at the first order whose binomial reaches k (every higher order gives
0). Served as ``repcap_fast.capacity.<name>``, where users import them.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _validation as val

__all__ = ["MAX_WELCH_ORDERS", "coherence_bound", "coherence_floor", "levenstein_bound", "orthoplex_bound",
           "welch_bound"]


def _reals(x, name: str) -> np.ndarray:
    """X as a float64 array of finite reals (a scalar as a 0-d array).

    A Python, numpy or torch number, or an array-like of them. Bools, strings, None, complex
    numbers, NaN and ±inf are refused with an error that names the argument (they were read as
    numbers, or gave NaN).
    """
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


def _out(x):
    """A Python float for a 0-d result, else the array."""
    return float(x) if np.ndim(x) == 0 else x


def _k_d(k, d, least_k: float):
    """K (> 0, or >= least_k when that is > 0) and d (>= 1) as finite float64 arrays."""
    k, d = _reals(k, "k"), _reals(d, "d")
    if np.any(k < least_k) or (least_k == 0 and np.any(k <= 0)):
        raise ValueError(f"k must be {'> 0' if least_k == 0 else f'>= {least_k:g}'}, got {k}")
    if np.any(d < 1):
        raise ValueError(f"d must be >= 1, got {d}")
    return k, d


def _orders(order) -> np.ndarray:
    """Welch orders as a float64 array of integers >= 1, each checked for integrality in its own type.

    A numpy long double such as 8 + 2^-60 is refused, not rounded to 8 by a float64 conversion.
    """
    t = _reals(order, "order")  # refuses what is not real numbers
    if isinstance(order, torch.Tensor):  # in the tensor's own dtype (numpy has no bfloat16)
        integral = not order.is_floating_point() or bool((order == order.floor()).all())
    else:
        raw = np.asarray(order)
        integral = raw.dtype.kind in "iu" or bool(np.all(raw == np.floor(raw)))  # in raw's own precision
    if np.any(t < 1) or not integral:
        raise ValueError(f"welch_bound needs an integer order >= 1, got order={order!r}")
    return t


def welch_bound(k, d, order=1):
    r"""The Welch lower bound of order t on $\max_{i \ne j} |c_{ij}|$ for k unit vectors in $\mathbb{R}^d$.

    $\max |c|^{2t} \ge \left(k / \binom{d+t-1}{t} - 1\right) / (k - 1)$, and the bound is 0 where the
    right side is ≤ 0. Order 1 is $\sqrt{(k-d)/(d(k-1))}$.

    Args:
        k (float or array_like): the number of vectors, ≥ 2: a number or an array of them.
        d (float or array_like): the dimension d ≥ 1: a number or an array, broadcast against k.
        order (int): the order t, an integer ≥ 1 (default 1).

    Returns:
        float or numpy.ndarray: the bound, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: k < 2, d < 1, or a value that is NaN or ±inf, or an order that is not an integer ≥ 1.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.welch_bound(100, 10), 4)
        0.3015
        >>> round(rf.capacity.welch_bound(1000, 10, order=2), 4)
        0.3621
    """
    k, d = _k_d(k, d, 2.0)
    t = _orders(order)
    from scipy.special import comb

    with np.errstate(over="ignore"):
        binom = comb(d + t - 1.0, t)  # float64; inf only beyond 1.8e308 > k, where the bound is 0
    rhs = np.maximum((k / binom - 1.0) / (k - 1.0), 0.0)
    return _out(rhs ** (1.0 / (2.0 * t)))


def orthoplex_bound(k, d):
    r"""The orthoplex lower bound on $\max_{i \ne j} |c_{ij}|$: $1/\sqrt{d}$ when $k > d(d+1)/2$, else 0.

    No packing of k lines in $\mathbb{R}^d$ beats it (the real case).

    Args:
        k (float or array_like): the number of vectors, > 0: a number or an array of them.
        d (float or array_like): the dimension d ≥ 1: a number or an array, broadcast against k.

    Returns:
        float or numpy.ndarray: the bound, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: k ≤ 0, d < 1, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.orthoplex_bound(100, 10), 4)
        0.3162
    """
    k, d = _k_d(k, d, 0.0)
    with np.errstate(over="ignore"):  # d(d+1)/2 = inf beyond d ≈ 1.9e154: the bound is 0 there
        return _out(np.where(k > d * (d + 1) / 2.0, 1.0 / np.sqrt(d), 0.0))


def levenstein_bound(k, d):
    r"""The Levenstein lower bound on $\max_{i \ne j} |c_{ij}|$ of k lines in $\mathbb{R}^d$ (0 unless $k > d(d+1)/2$).

    Where $k > d(d+1)/2$ it is $\sqrt{(3k - d^2 - 2d)/((d + 2)(k - d))}$.

    No packing of k lines in $\mathbb{R}^d$ beats it (the real case; Levenstein 1982, as stated by Haas,
    Hammen and Mixon 2017). Where it applies it can exceed the orthoplex bound $1/\sqrt{d}$ (it tends to
    $\sqrt{3/(d + 2)}$ as k grows); 4 lines in the plane meet it, at cos(π/4).

    Args:
        k (float or array_like): the number of vectors, > 0: a number or an array of them.
        d (float or array_like): the dimension d ≥ 1: a number or an array, broadcast against k.

    Returns:
        float or numpy.ndarray: the bound, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: k ≤ 0, d < 1, or a value that is NaN or ±inf.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.levenstein_bound(4, 2), 4), round(rf.capacity.levenstein_bound(100, 3), 4)
        (0.7071, 0.7666)
    """
    k, d = _k_d(k, d, 0.0)
    with np.errstate(over="ignore"):
        applies = k > d * (d + 1) / 2.0  # d(d+1)/2 = inf beyond d ≈ 1.9e154: never applies there
    # (3k − d² − 2d)/((d + 2)(k − d)) divided through by k, so that no term overflows where it applies
    # (3k alone passes 1.8e308 for k > 6e307); where it does not apply the value is not used.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        square = (3.0 - d * ((d + 2.0) / k)) / ((d + 2.0) * (1.0 - d / k))
    return _out(np.where(applies, np.sqrt(np.maximum(np.where(applies, square, 0.0), 0.0)), 0.0))


def coherence_bound(k, d, max_order=4) -> tuple:
    r"""The best lower bound on the coherence of k unit vectors in d dimensions, with its name.

    A packing's certificate: no k unit vectors in $\mathbb{R}^d$ have a smaller
    $\max_{i \ne j} |c_{ij}|$. The largest of the Welch bounds of orders 1 … max_order ("welch" for
    order 1, "welch-t" for order t), the orthoplex bound and the Levenstein bound
    (``coherence_floor`` without Levenstein, as the capacity tables report it). A packing's ε* minus
    it is how far the packing can be from optimal at most; 0 where the bound is met (an equiangular
    tight frame meets Welch).

    Args:
        k (int): the number of vectors, ≥ 2.
        d (int): the dimension, ≥ 1.
        max_order (int): the highest Welch order, an integer ≥ 1 (default 4).

    Returns:
        tuple: (bound, name), a float and one of "welch", "welch-2" … "welch-<max_order>",
        "orthoplex", "levenstein" (the first of equal ones in that order; "welch" when every
        bound is 0, k ≤ d).

    Raises:
        ValueError: k < 2, d < 1, or a value that is NaN or ±inf, or max_order < 1.
        TypeError: an argument that is not a real number (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> rf.capacity.coherence_bound(16, 6)
        (0.3333333333333333, 'welch')
        >>> bound, name = rf.capacity.coherence_bound(100, 3); round(bound, 4), name
        (0.7666, 'levenstein')
    """
    for value, what in ((k, "k"), (d, "d")):
        if np.ndim(_reals(value, what)) != 0:
            raise ValueError(f"coherence_bound takes one k and one d, got {what} with shape {np.shape(value)}")
    welch = _welch_orders(k, d, max_order)
    order = int(np.argmax(welch))  # the first of equal maxima
    named = [(float(welch[order]), "welch" if order == 0 else f"welch-{order + 1}"),
             (float(orthoplex_bound(k, d)), "orthoplex"), (float(levenstein_bound(k, d)), "levenstein")]
    _check_finite([value for value, _ in named], k, d)
    best = max(value for value, _ in named)
    return best, next(name for value, name in named if value == best)


MAX_WELCH_ORDERS = 1_000_000
"""The most Welch orders that ``coherence_bound`` and ``coherence_floor`` evaluate for one (k, d)."""


def _welch_orders(k, d, max_order) -> np.ndarray:
    """The Welch bounds of orders 1 … T, stacked on a new first axis, with T ≤ max_order.

    binom(d+t−1, t) grows with t for d > 1, and from the first order t* where it reaches k every
    higher order's bound is 0: T = min(max_order, t* − 1) (at least 1), t* found by bisection, so
    a huge max_order costs nothing where the orders run out. For d = 1 every order gives 1, the
    largest value a bound can take, so order 1 suffices. A (k, d) that would need more than
    MAX_WELCH_ORDERS orders is refused, naming max_order.
    """
    max_order = val.check_int(max_order, "max_order", 1)
    k, d = _k_d(k, d, 2.0)
    k, d = np.broadcast_arrays(k, d)
    from scipy.special import binom

    def reaches_k(t):  # binom(d+t−1, t) ≥ k, with the smaller of t and d − 1 below (exact for huge t)
        with np.errstate(over="ignore"):
            return binom(d + t - 1.0, np.minimum(t, d - 1.0)) >= k

    lo, hi = np.ones(k.shape), np.full(k.shape, float(max_order))  # t* in (lo, hi], or hi when no order reaches k
    lo = np.where(reaches_k(lo), 0.0, lo)
    for _ in range(70):  # float64 bisection over integers up to 2^63
        mid = np.floor((lo + hi) / 2.0)
        step = hi - lo > 1
        if not np.any(step):
            break
        hit = reaches_k(np.maximum(mid, 1.0))
        hi = np.where(step & hit, mid, hi)
        lo = np.where(step & ~hit, mid, lo)
    needed = np.where(d == 1.0, 1.0, np.where(reaches_k(hi), hi - 1.0, hi))
    count = int(max(1.0, float(np.max(needed))))
    if count > MAX_WELCH_ORDERS:
        raise ValueError(f"max_order={max_order} would need the Welch bounds of {count} orders for k={k.max():g}, "
                         f"d={d.min():g} (each order below that can still raise the bound); at most "
                         f"{MAX_WELCH_ORDERS} are evaluated: pass max_order <= {MAX_WELCH_ORDERS}")
    if k.ndim == 0:  # one (k, d): each order as welch_bound computes it for one (k, d) (an array's power may
        # round its last bit otherwise, and the floor must be at least every bound it combines, as given)
        return np.array([welch_bound(float(k), float(d), t) for t in range(1, count + 1)])
    orders = np.arange(1.0, count + 1.0).reshape((count,) + (1,) * k.ndim)
    return np.asarray(welch_bound(k, d, orders))


def _check_finite(values, k, d) -> None:
    """Refuses a NaN or infinite bound, so that no bound is ever chosen over one (a bug if it happens)."""
    if not np.all(np.isfinite(np.asarray(values, dtype=np.float64))):
        raise FloatingPointError(f"a coherence bound of k={k!r}, d={d!r} is not finite: {values!r}; please report it")


def coherence_floor(k, d, max_order=4):
    r"""The largest of the Welch bounds of orders 1 … max_order and the orthoplex bound.

    No set of k unit vectors in $\mathbb{R}^d$ has a smaller $\max_{i \ne j} |c_{ij}|$.

    Args:
        k (float or array_like): the number of vectors, ≥ 2: a number or an array of them.
        d (float or array_like): the dimension d ≥ 1: a number or an array, broadcast against k.
        max_order (int): the highest Welch order, an integer ≥ 1 (default 4).

    Returns:
        float or numpy.ndarray: the floor, a float for scalar inputs, else a float64 array.

    Raises:
        ValueError: k < 2, d < 1, or a value that is NaN or ±inf, or max_order < 1.
        TypeError: an argument that is not real numbers (a bool, a string, None, complex);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> round(rf.capacity.coherence_floor(100, 10), 4)
        0.3162
    """
    welch = _welch_orders(k, d, max_order)
    floor = np.maximum(np.max(welch, axis=0), orthoplex_bound(k, d))
    _check_finite(floor, k, d)
    return _out(floor)
