"""Capacity formulas of Guha (2026), vectorized over arrays of d and ε, in float64/log space.

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


# ------------------------------------------------------------------------------ fit of C

def _eps_jl(kd, C):
    k, d = kd
    return np.sqrt(C * np.log(k) / d)


def _eps_adjusted(kd, C):
    k, d = kd
    return np.sqrt(C * np.log(k / d) / d)


def _eps_full(kd, C, a, b, c):
    k, d = kd
    # ln(k^a/d) in log form (k^a overflows for large k); held above 0 while the fit explores a.
    log_ratio = np.maximum(a * np.log(k) - np.log(d), 1e-12)
    return np.sqrt(C * log_ratio**b / d**c)


# form -> (model ε(k, d; params), parameter names, start, bounds, needs k > d)
FIT_FORMS = {
    "jl": (_eps_jl, ("C",), (1.0,), ((1e-9,), (100.0,)), False),
    "adjusted": (_eps_adjusted, ("C",), (1.0,), ((1e-9,), (100.0,)), True),
    "full": (_eps_full, ("C", "a", "b", "c"), (0.5, 1.0, 1.4, 1.0),
             ((1e-9, 0.1, 0.1, 0.1), (10.0, 10.0, 10.0, 10.0)), True),
}


class FitResult:
    """Constants of one capacity form fitted to measured ε(k, d), with the fit metrics:
    R², RMSE, NRMSE (percent of the data's range), MAPE (percent) and the max absolute error."""

    def __init__(self, form, params, k, d, eps, excluded, eps_key):
        self.form = form
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
        model = FIT_FORMS[self.form][0]
        k = np.asarray(k, dtype=np.float64)
        d = np.asarray(d, dtype=np.float64)
        return model((k, d), *self.params.values())

    def to_dict(self) -> dict:
        """JSON-ready; an undefined metric (R² of constant data, say) is None."""
        def num(v):
            return float(v) if np.isfinite(v) else None

        return {
            "form": self.form,
            "params": {k: float(v) for k, v in self.params.items()},
            "r2": num(self.r2), "rmse": num(self.rmse), "nrmse_percent": num(self.nrmse),
            "mape_percent": num(self.mape), "max_error": num(self.max_error),
            "n_cells": int(len(self.eps)), "eps_key": self.eps_key,
            "excluded_cells": [{"k": int(k), "d": int(d), "why": why} for k, d, why in self.excluded],
        }

    def plot(self, path: str) -> None:
        """Measured against fitted ε (left) and ε against k per d, data and fit (right)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
        ax1.scatter(self.predicted, self.eps, s=14)
        lo, hi = float(min(self.eps.min(), self.predicted.min())), float(max(self.eps.max(), self.predicted.max()))
        ax1.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax1.set_xlabel("fitted ε")
        ax1.set_ylabel(f"measured ε ({self.eps_key})")
        params = ", ".join(f"{k}={v:.4g}" for k, v in self.params.items())
        ax1.set_title(f"{self.form}: {params}\nR²={self.r2:.4f}  MAPE={self.mape:.2f}%  NRMSE={self.nrmse:.2f}%",
                      fontsize=9)
        for d in np.unique(self.d):
            sel = self.d == d
            order = np.argsort(self.k[sel])
            line = ax2.plot(self.k[sel][order], self.eps[sel][order], "o", ms=3)[0]
            kk = np.linspace(self.k[sel].min(), self.k[sel].max(), 100)
            ax2.plot(kk, self.predict(kk, np.full_like(kk, d)), "-", color=line.get_color(), lw=1,
                     label=f"d={int(d)}")
        ax2.set_xscale("log")
        ax2.set_xlabel("k")
        ax2.set_ylabel("ε")
        ax2.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def _cells_arrays(cells, eps_key):
    if isinstance(cells, (str, bytes)) or hasattr(cells, "__fspath__"):
        from .packing import load_cells

        cells = load_cells(cells)
    if isinstance(cells, dict) and "cells" in cells:
        cells = cells["cells"]
    ks, ds, eps, missing = [], [], [], []
    for i, cell in enumerate(cells):
        if isinstance(cell, dict):
            try:
                k, d, e = cell["k"], cell["d"], cell[eps_key]
            except KeyError as exc:
                raise ValueError(f"cells[{i}] has no {exc.args[0]!r} (keys: {sorted(cell)})") from None
        else:  # (k, d, eps), the paper's JSON layout
            try:
                k, d, e = cell
            except (TypeError, ValueError):
                raise ValueError(f"cells[{i}] must be a dict with k, d, {eps_key} or a (k, d, eps) triple") from None
        if e is None:  # e.g. eps_over_welch of a cell with k <= d
            missing.append((k, d, f"{eps_key} is None"))
            continue
        ks.append(k)
        ds.append(d)
        eps.append(e)
    k, d, e = (np.asarray(v, dtype=np.float64) for v in (ks, ds, eps))
    if len(k) == 0:
        raise ValueError("cells is empty" if not missing else f"no cell has a value for {eps_key!r}")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(d)) and np.all(np.isfinite(e))):
        raise ValueError("cells hold non-finite k, d or eps")
    if np.any(k < 2) or np.any(d < 1) or np.any(e < 0):
        raise ValueError("cells need k >= 2, d >= 1 and eps >= 0")
    return k, d, e, missing


def fit(cells, form: str = "full", *, eps_key: str = "eps_star", p0=None) -> FitResult:
    """Fits the constants of a capacity form to measured ε(k, d) with scipy's curve_fit.

    Forms (ε as a function of k vectors in d dimensions):
      * "jl":       ε = sqrt(C ln k / d)
      * "adjusted": ε = sqrt(C ln(k/d) / d)
      * "full":     ε = sqrt(C ln(k^a/d)^b / d^c)   (fits C, a, b, c)
    `cells`: sweep records (dicts with k, d and `eps_key`, default the packing's ε*), (k, d, ε)
    triples, or the path of a sweep file. The adjusted and full forms need k > d: other cells
    are excluded and listed in the result (never silently), as are cells without a value for
    `eps_key`. Returns a FitResult with R², MAPE,
    NRMSE, RMSE, the max error, and ``plot(path)``.
    """
    if form not in FIT_FORMS:
        raise ValueError(f"form must be one of {tuple(FIT_FORMS)}, got {form!r}")
    from scipy.optimize import curve_fit

    model, names, start, bounds, needs_k_gt_d = FIT_FORMS[form]
    k, d, eps, missing = _cells_arrays(cells, eps_key)
    excluded = list(missing)
    keep = np.ones_like(k, dtype=bool)
    if needs_k_gt_d:
        keep = k > d
        excluded += [(kk, dd, f"k <= d has no {form} capacity (ln(k/d) <= 0)") for kk, dd in zip(k[~keep], d[~keep])]
    k, d, eps = k[keep], d[keep], eps[keep]
    if len(k) < len(names):
        raise ValueError(f"the {form} form has {len(names)} parameters but only {len(k)} usable cells")
    p0 = start if p0 is None else tuple(float(v) for v in p0)
    popt, _ = curve_fit(model, (k, d), eps, p0=p0, bounds=bounds, maxfev=50000)
    return FitResult(form, dict(zip(names, (float(v) for v in popt))), k, d, eps, excluded, eps_key)
