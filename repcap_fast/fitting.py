"""The fit of the capacity constants (Guha 2026, §1.3) to measured packings ε(k, d).

The JL, adjusted and fully parameterized forms of repcap_fast.capacity, fitted with SciPy's
curve_fit, with R², MAPE and NRMSE.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import _validation as val
from . import plotting
from .packing.sweep_file import load_cells

__all__ = ["AT_BOUND_RTOL", "FIT_FORMS", "MAX_EVALUATIONS", "FitAtBoundWarning", "FitResult", "fit"]


def _eps_jl(kd, C):
    """The JL form, ε = sqrt(C ln k / d)."""
    k, d = kd
    return np.sqrt(C * np.log(k) / d)


def _eps_adjusted(kd, C):
    """The adjusted form, ε = sqrt(C ln(k/d) / d)."""
    k, d = kd
    return np.sqrt(C * np.log(k / d) / d)


def _eps_full(kd, C, a, b, c):
    """The full form, ε = sqrt(C ln(k^a/d)^b / d^c)."""
    k, d = kd
    # ln(k^a/d) in log form (k^a overflows for large k); held above 0 while the fit explores a.
    log_ratio = np.maximum(a * np.log(k) - np.log(d), 1e-12)
    return np.sqrt(C * log_ratio**b / d**c)


FIT_FORMS = {
    "jl": (_eps_jl, ("C",), (1.0,), ((1e-9,), (100.0,)), False),
    "adjusted": (_eps_adjusted, ("C",), (1.0,), ((1e-9,), (100.0,)), True),
    "full": (_eps_full, ("C", "a", "b", "c"), (0.5, 1.0, 1.4, 1.0),
             ((1e-9, 0.1, 0.1, 0.1), (10.0, 10.0, 10.0, 10.0)), True),
}
"""The fitted forms: name → (model ε(k, d; constants), the constants' names, the start, the
bounds (lower, upper), whether the form needs k > d)."""


MAX_EVALUATIONS = 50000
"""curve_fit's maxfev: a fit that needs more evaluations did not converge."""
AT_BOUND_RTOL = 1e-6
"""A constant this close to a bound of its fit (relative to the bounds' width) is at that bound."""


class FitAtBoundWarning(UserWarning):
    """A fitted constant sits at a bound of its fit, so it is the bound's value, not the data's.

    The form does not describe the cells well there.
    """


class FitResult:
    """The constants of one capacity form fitted to measured ε(k, d), with the fit's metrics.

    Made by ``fit``; the arguments of its constructor are the attributes of the same names.

    Attributes:
        form (str): "jl", "adjusted" or "full".
        params (dict): the fitted constants by name (C; or C, a, b, c), floats.
        k (numpy.ndarray): the fitted cells' k (float64; the excluded cells are not in it).
        d (numpy.ndarray): the fitted cells' d.
        eps (numpy.ndarray): the fitted cells' measured ε.
        predicted (numpy.ndarray): the form's ε at the fitted cells.
        excluded (list): (k, d, why) of each cell left out of the fit.
        eps_key (str): the key of the cells' ε that was fitted (e.g. "eps_star").
        method (str or None): the packing method the cells were made with (the constants assume
            it); None when the cells do not record it.
        at_bounds (list): the names of the constants that ended at a bound of the fit
            (``FIT_FORMS``), held there rather than fitted (empty for a clean fit).
        r2 (float): the coefficient of determination R² (NaN for constant data).
        rmse (float): the root-mean-square error.
        nrmse (float): the RMSE in percent of the data's range (NaN for constant data).
        mape (float): the mean absolute percentage error (over the cells with ε ≠ 0).
        max_error (float): the largest absolute error.

    Examples:
        >>> cells = [(k, d, (3 * np.log(k) / d) ** 0.5) for k in (100, 1000) for d in (32, 64)]
        >>> result = rf.fitting.fit(cells, "jl")
        >>> round(result.params["C"], 6), round(result.r2, 6)
        (3.0, 1.0)
    """

    def __init__(self, form, params, k, d, eps, excluded, eps_key, method=None, at_bounds=()):
        self.form = form
        self.at_bounds = list(at_bounds)
        self.method = method  # the packing method of the cells (None: not recorded, e.g. (k, d, ε) triples)
        self.params = params
        self.k, self.d, self.eps = k, d, eps
        self.excluded = excluded
        self.eps_key = eps_key
        pred = self.predict(k, d)
        resid = eps - pred
        self.predicted = pred
        total = float(np.sum((eps - eps.mean()) ** 2))
        self.r2 = float(1.0 - np.sum(resid**2) / total) if total > 0 else float("nan")
        self.rmse = float(np.sqrt(np.mean(resid**2)))
        spread = float(eps.max() - eps.min())
        self.nrmse = float(100.0 * self.rmse / spread) if spread > 0 else float("nan")
        nonzero = eps != 0
        self.mape = float(100.0 * np.mean(np.abs(resid[nonzero] / eps[nonzero]))) if nonzero.any() else float("nan")
        self.max_error = float(np.max(np.abs(resid)))

    def predict(self, k, d):
        """The fitted form's ε at k vectors in d dimensions (arrays broadcast)."""
        model = FIT_FORMS[self.form][0]
        k = np.asarray(k, dtype=np.float64)
        d = np.asarray(d, dtype=np.float64)
        return model((k, d), *self.params.values())

    def to_dict(self) -> dict:
        """The result as a JSON-ready dict; an undefined metric (R² of constant data, say) is None."""
        def num(v):
            return float(v) if np.isfinite(v) else None

        return {
            "form": self.form,
            "params": {k: float(v) for k, v in self.params.items()},
            "r2": num(self.r2), "rmse": num(self.rmse), "nrmse_percent": num(self.nrmse),
            "mape_percent": num(self.mape), "max_error": num(self.max_error),
            "n_cells": int(len(self.eps)), "eps_key": self.eps_key, "packing_method": self.method,
            "at_bounds": list(self.at_bounds),
            "excluded_cells": [{"k": int(k), "d": int(d), "why": why} for k, d, why in self.excluded],
        }

    def plot(self, path: str) -> None:
        """Plots measured against fitted ε (left) and ε against k per d, data and fit (right), to `path`."""
        plotting.plot_fit(self, path)


def _cells_arrays(cells, eps_key):
    """(k, d, ε, cells without ε, packing method) of the cells, checked."""
    if isinstance(cells, (str, bytes)) or hasattr(cells, "__fspath__"):
        cells = load_cells(cells)
    if isinstance(cells, dict) and "cells" in cells:
        cells = cells["cells"]
    ks, ds, eps, missing, methods = [], [], [], [], set()
    for i, cell in enumerate(cells):
        if isinstance(cell, dict):
            try:
                k, d, e = cell["k"], cell["d"], cell[eps_key]
            except KeyError as exc:
                raise ValueError(f"cells[{i}] has no {exc.args[0]!r} (keys: {sorted(cell)})") from None
            if "method" in cell:
                methods.add(str(cell["method"]))
        else:  # (k, d, eps), the paper's JSON layout
            try:
                k, d, e = cell
            except (TypeError, ValueError):
                raise ValueError(f"cells[{i}] must be a dict with k, d, {eps_key} or a (k, d, eps) triple") from None
        if e is None:  # e.g. eps_over_welch of a cell with k <= d
            missing.append((k, d, f"{eps_key} is None"))
            continue
        # numpy and torch scalars are numbers; bools, strings, NaN and inf are named, not read as numbers
        ks.append(val.as_real(k, f"cells[{i}]: k"))
        ds.append(val.as_real(d, f"cells[{i}]: d"))
        eps.append(val.as_real(e, f"cells[{i}]: {eps_key}"))
    k, d, e = (np.asarray(v, dtype=np.float64) for v in (ks, ds, eps))
    if len(k) == 0:
        raise ValueError("cells is empty" if not missing else f"no cell has a value for {eps_key!r}")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(d)) and np.all(np.isfinite(e))):
        raise ValueError("cells hold non-finite k, d or eps")
    if np.any(k < 2) or np.any(d < 1) or np.any(e < 0):
        raise ValueError("cells need k >= 2, d >= 1 and eps >= 0")
    if len(methods) > 1:
        raise ValueError(f"cells come from several packing methods ({', '.join(sorted(methods))}); the constants "
                         "belong to one method's packings: fit each method's cells apart")
    return k, d, e, missing, (methods.pop() if methods else None)


def fit(cells, form: str = "full", *, eps_key: str = "eps_star", p0=None) -> FitResult:
    r"""Fits the constants of a capacity form to measured ε(k, d) with SciPy's curve_fit.

    The forms, ε as a function of k vectors in d dimensions:

    * "jl": ε = sqrt(C ln k / d)
    * "adjusted": ε = sqrt(C ln(k/d) / d)
    * "full": $\varepsilon = \sqrt{C \left(\ln(k^a/d)\right)^b / d^c}$ (fits C, a, b, c)

    The adjusted and full forms need k > d: other cells are excluded and listed in the result
    (never silently), as are cells without a value for `eps_key`. A constant that ends at a bound
    of the fit (within ``AT_BOUND_RTOL``) is listed in ``FitResult.at_bounds`` (and
    ``to_dict()``), with a ``FitAtBoundWarning``.

    Args:
        cells (list or dict or str or os.PathLike): sweep records (dicts with k, d and `eps_key`; a
            dict with a "cells" list), (k, d, ε) triples, or the path of a sweep file. The cells
            must come from one packing method.
        form: "jl", "adjusted" or "full" (default).
        eps_key: the key of the records' ε (default "eps_star", the packing's ε*).
        p0 (sequence of float, optional): the start, one number per constant within its bounds
            (default: ``FIT_FORMS``'s).

    Returns:
        FitResult: the constants, the fit's metrics (R², RMSE, NRMSE, MAPE, max error), the
        excluded cells, and ``plot(path)``.

    Raises:
        ValueError: an unknown form; empty or malformed cells (a record without k, d or
            `eps_key`, non-finite values, k < 2, d < 1, ε < 0); cells from several packing
            methods; fewer usable cells than constants; p0 of the wrong length or outside the
            bounds; a fit that does not converge in ``MAX_EVALUATIONS`` evaluations.
        TypeError: a cell value or p0 of the wrong type (a bool, a string);
            ``repcap_fast._validation.ArgumentTypeError``, also a ValueError.

    Examples:
        >>> cells = [{"k": k, "d": d, "eps_star": rf.capacity.full_epsilon(k, d)}
        ...          for k in (100, 1000, 10000) for d in (16, 32, 64)]
        >>> result = rf.fitting.fit(cells, "full")
        >>> {name: round(v, 3) for name, v in result.params.items()}
        {'C': 0.458, 'a': 1.067, 'b': 1.447, 'c': 0.972}
    """
    val.check_choice(form, "form", tuple(FIT_FORMS))
    from scipy.optimize import curve_fit  # SciPy's optimizers: imported when a fit runs

    model, names, start, bounds, needs_k_gt_d = FIT_FORMS[form]
    k, d, eps, missing, method = _cells_arrays(cells, eps_key)
    excluded = list(missing)
    keep = np.ones_like(k, dtype=bool)
    if needs_k_gt_d:
        keep = k > d
        excluded += [(kk, dd, f"k <= d has no {form} capacity (ln(k/d) <= 0)") for kk, dd in zip(k[~keep], d[~keep])]
    k, d, eps = k[keep], d[keep], eps[keep]
    if len(k) < len(names):
        raise ValueError(f"the {form} form has {len(names)} parameters but only {len(k)} usable cells")
    p0 = start if p0 is None else _check_p0(p0, form, names, bounds)
    try:
        popt, _ = curve_fit(model, (k, d), eps, p0=p0, bounds=bounds, maxfev=MAX_EVALUATIONS)
    except (RuntimeError, ValueError) as exc:  # SciPy's "Optimal parameters not found", non-finite residuals
        raise ValueError(f"the {form} fit did not converge on the {len(k)} cells ({str(exc).strip()[:200]}); try "
                         f"another start (p0, {len(names)} numbers for {', '.join(names)}), another form ('jl' or "
                         "'adjusted' have one constant), or more cells over a wider range of k and d") from None
    params = dict(zip(names, (float(v) for v in popt)))
    at_bounds = [name for (name, v), lo, hi in zip(params.items(), *bounds)
                 if min(v - lo, hi - v) <= AT_BOUND_RTOL * (hi - lo)]
    if at_bounds:
        warnings.warn(f"the {form} fit has {', '.join(at_bounds)} at its bound "
                      f"({', '.join(f'{n}={params[n]:.6g} in {_bounds_of(n, names, bounds)}' for n in at_bounds)}): "
                      "the constant is held by the bound, not fitted; the form may not describe these cells",
                      FitAtBoundWarning, stacklevel=2)
    return FitResult(form, params, k, d, eps, excluded, eps_key, method, at_bounds)


def _bounds_of(name, names, bounds) -> str:
    """The bounds of constant `name` as "[lo, hi]"."""
    i = names.index(name)
    return f"[{bounds[0][i]:g}, {bounds[1][i]:g}]"


def _check_p0(p0, form, names, bounds) -> tuple:
    """The start p0 checked: one finite number per constant of the form, within its bounds."""
    if isinstance(p0, (str, bytes)) or not hasattr(p0, "__len__") or getattr(p0, "ndim", 1) != 1:
        raise val.ArgumentTypeError(f"p0 must be a sequence of {len(names)} numbers ({', '.join(names)}) for the "
                                    f"{form} form, got {type(p0).__name__} {p0!r}")
    if len(p0) != len(names):
        raise ValueError(f"p0 must have {len(names)} numbers ({', '.join(names)}) for the {form} form, got {len(p0)}")
    out = tuple(val.as_real(v, f"p0[{i}] ({name})") for i, (v, name) in enumerate(zip(p0, names)))
    for i, (v, name) in enumerate(zip(out, names)):
        if not bounds[0][i] <= v <= bounds[1][i]:
            raise ValueError(f"p0[{i}] ({name}) = {v:g} is outside the bounds of the {form} fit, "
                             f"{_bounds_of(name, names, bounds)}")
    return out
