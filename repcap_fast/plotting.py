"""Every plot repcap_fast writes, as PNG files (matplotlib, Agg backend).

Cosine histograms, the Subspace-PGA profile (and a model against its random-init control), spectra
per layer, a packing loss curve, a capacity fit, a survey, and ε and z over training.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ._metrics import read_metrics


def _color(i: int) -> str:
    """Matplotlib's default color cycle (tab:blue, tab:orange, ...), repeating after ten."""
    return f"C{i % 10}"


@contextlib.contextmanager
def _figure(path: str, *args, dpi: int = 130, **kwargs) -> Iterator[Tuple]:
    """(fig, axes) of a new figure, laid out and saved to `path` (its folder created) on exit."""
    from matplotlib.figure import Figure

    # A Figure outside pyplot, drawn by the Agg canvas when saved: the caller's backend (a
    # notebook's inline plots) and its pyplot figures are left alone.
    fig = Figure(figsize=kwargs.pop("figsize", None))
    axes = fig.subplots(*args, **kwargs)
    yield fig, axes
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)


def _nan(x) -> float:
    return np.nan if x is None else x


def plot_cosine_histograms(curves: Sequence, path: str, title: str, k_sigma: float = 2.0,
                           quantiles: Sequence[float] = (0.5, 0.99, 0.999)) -> None:
    """Density of the pairwise cosines, one curve per (label, CosineStats).

    With μ (dotted) and ε = μ + k_sigma·σ (solid) marked; with a single curve also its `quantiles`
    (those inside the histogram's range).
    """
    with _figure(path, figsize=(8, 4.5)) as (fig, ax):
        lo, hi = 1.0, -1.0
        for i, (label, stats) in enumerate(curves):
            color = _color(i)
            edges = stats.edges.numpy()
            centers = 0.5 * (edges[:-1] + edges[1:])
            density = stats.hist.numpy() / (stats.count * stats.bin_width)
            ax.plot(centers, density, drawstyle="steps-mid", lw=0.9, color=color, label=label)
            ax.fill_between(centers, density, step="mid", alpha=0.2, color=color)
            eps = stats.epsilon(k_sigma)
            ax.axvline(stats.mean, color=color, ls=":", lw=1.0, label=f"{label}: μ = {stats.mean:.4f}")
            ax.axvline(eps, color=color, ls="-", lw=1.2, label=f"{label}: ε = μ+{k_sigma:g}σ = {eps:.4f}")
            lo, hi = min(lo, stats.min), max(hi, stats.max)
            if len(curves) == 1:
                for q, style in zip(quantiles, (":", "--", "-.", (0, (1, 3)))):
                    try:
                        value = stats.quantile(q)
                    except ValueError:  # outside the histogram's range
                        continue
                    ax.axvline(value, color="tab:green", ls=style, lw=1.0, label=f"q{q:g} = {value:.4f}")
        edges = curves[0][1].edges
        ax.set_xlim(max(float(edges[0]), lo - 0.05), min(float(edges[-1]), hi + 0.05))
        ax.set_xlabel("cosine similarity of token pairs")
        ax.set_ylabel("density")
        ax.set_title(title)
        ax.legend(fontsize=8)


def plot_pga_profile(profile: Dict, path: str, title: str) -> None:
    """Plots z per layer for each CCR variant, with the null band |z| ≤ 2.

    Args:
        profile (dict): {ccr: [row per layer]}, rows with layer, z, rho_readout, null_mean, null_std
            (the "profile" of a report's "pga" section).
        path (str): the PNG written.
        title (str): the plot's title.

    Returns:
        None
    """
    with _figure(path, 1, 2, figsize=(12, 4.5)) as (fig, (ax_z, ax_r)):
        for i, (ccr, rows) in enumerate(profile.items()):
            color = _color(i)
            layers = [r["layer"] for r in rows]
            ax_z.plot(layers, [_nan(r["z"]) for r in rows], "o-", ms=3, color=color, label=f"CCR-{ccr}")
            mean = np.array([_nan(r["null_mean"]) for r in rows], dtype=float)
            std = np.array([_nan(r["null_std"]) for r in rows], dtype=float)
            ax_r.plot(layers, [_nan(r["rho_readout"]) for r in rows], "o-", ms=3, color=color,
                      label=f"ρ readout, CCR-{ccr}")
            ax_r.fill_between(layers, mean - 2 * std, mean + 2 * std, color=color, alpha=0.15)
        ax_z.axhspan(-2, 2, color="grey", alpha=0.2, label="null band |z| ≤ 2")
        ax_z.axhline(0, color="grey", lw=0.8)
        ax_z.set_xlabel("layer")
        ax_z.set_ylabel("z = (ρ_readout − mean ρ_null) / std ρ_null")
        ax_z.legend(fontsize=8)
        ax_r.set_xlabel("layer")
        ax_r.set_ylabel("Spearman ρ (full vs subspace distances)")
        ax_r.set_title("shaded: null mean ± 2 std", fontsize=9)
        ax_r.legend(fontsize=8)
        fig.suptitle(title)


def plot_pga_control(profiles: Dict[str, Dict], path: str, title: str) -> None:
    """Plots z per layer of several analyses of one architecture: one panel per CCR variant.

    One line per analysis (trained weights and their random-init control), with the null band
    |z| ≤ 2.

    Args:
        profiles (dict[str, dict]): {name: profile}, each profile {ccr: [row per layer]} as in
            `plot_pga_profile`.
        path (str): the PNG written.
        title (str): the plot's title.

    Returns:
        None
    """
    ccrs = list(next(iter(profiles.values())))
    with _figure(path, 1, len(ccrs), figsize=(5 * len(ccrs), 4.2), squeeze=False) as (fig, axes):
        for ax, ccr in zip(axes[0], ccrs):
            for i, (name, profile) in enumerate(profiles.items()):
                rows = profile[ccr]
                ax.plot([r["layer"] for r in rows], [_nan(r["z"]) for r in rows], "o-" if i == 0 else "s--", ms=3,
                        color=_color(i), label=name)
            ax.axhspan(-2, 2, color="grey", alpha=0.2, label="null band |z| ≤ 2")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_title(f"CCR-{ccr}", fontsize=10)
            ax.set_xlabel("layer")
            ax.set_ylabel("z")
            ax.legend(fontsize=8)
        fig.suptitle(title)


def plot_pga_survey(models: Sequence[Dict], heatmap_path: str, depth_path: str) -> None:
    """Plots z per (model, layer) across models or checkpoints: a heatmap and trajectories.

    The heatmap has one panel per CCR variant (models × layer index, diverging around 0, blank past
    a model's last layer); the trajectories plot z against relative depth l/L, one line per model,
    with the null band |z| ≤ 2.

    Args:
        models (Sequence[dict]): rows of a PGA survey (source, layers, relative_depth, z {ccr: [per
            layer]}).
        heatmap_path (str): the heatmap's PNG.
        depth_path (str): the trajectories' PNG.

    Returns:
        None
    """
    ccrs = list(models[0]["z"])
    depth = max(len(m["layers"]) for m in models)
    with _figure(heatmap_path, len(ccrs), 1, figsize=(max(6.0, 0.35 * depth + 3), 0.5 * len(models) * len(ccrs) + 1.5),
                 squeeze=False) as (fig, axes):
        for ax, ccr in zip(axes[:, 0], ccrs):
            grid = np.full((len(models), depth), np.nan)
            for i, m in enumerate(models):
                grid[i, : len(m["layers"])] = [_nan(z) for z in m["z"][ccr]]
            lim = max(2.0, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 2.0)
            im = ax.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
            ax.set_yticks(range(len(models)))
            ax.set_yticklabels([m["source"][-40:] for m in models], fontsize=7)
            ax.set_xlabel("layer")
            ax.set_title(f"z, CCR-{ccr}", fontsize=10)
            fig.colorbar(im, ax=ax, fraction=0.03)
    with _figure(depth_path, 1, len(ccrs), figsize=(5 * len(ccrs), 4.2), squeeze=False) as (fig, axes):
        for ax, ccr in zip(axes[0], ccrs):
            for i, m in enumerate(models):
                ax.plot(m["relative_depth"], [_nan(z) for z in m["z"][ccr]], "o-", ms=2.5, color=_color(i),
                        label=m["source"][-40:])
            ax.axhspan(-2, 2, color="grey", alpha=0.2)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("relative depth l / L")
            ax.set_ylabel("z")
            ax.set_title(f"CCR-{ccr}", fontsize=10)
            ax.legend(fontsize=7)


def plot_probe(probe: Dict, profile: Dict, path: str, title: str) -> None:
    """Plots linear-probe accuracy per layer next to z of each CCR variant (on a second axis).

    Accuracy is the mean ± std over folds, with the chance level.

    Args:
        probe (dict): a report's "probe" section.
        profile (dict): a report's ``["pga"]["profile"]``.
        path (str): the PNG written.
        title (str): the plot's title.

    Returns:
        None
    """
    rows = probe["layers"]
    layers = [r["layer"] for r in rows]
    with _figure(path, 1, 1, figsize=(7.5, 4.2)) as (fig, ax):
        acc = np.array([_nan(r["accuracy"]) for r in rows])
        std = np.array([_nan(r["std"]) for r in rows])
        ax.plot(layers, acc, "o-", ms=3, color="black", label="probe accuracy")
        ax.fill_between(layers, acc - std, acc + std, color="black", alpha=0.12)
        ax.axhline(rows[0]["chance"], color="black", ls=":", lw=1, label="chance")
        ax.set_xlabel("layer")
        ax.set_ylabel("probe accuracy (k-fold)")
        twin = ax.twinx()
        for i, (ccr, prof) in enumerate(profile.items()):
            twin.plot([r["layer"] for r in prof], [_nan(r["z"]) for r in prof], "s--", ms=2.5, color=_color(i),
                      label=f"z CCR-{ccr}")
        twin.set_ylabel("Subspace-PGA z")
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
        fig.suptitle(title)


def _missing_note(layers, values, key: str) -> str:
    """Which layers a panel leaves out, and why (a value that is missing, NaN or infinite).

    A condition number is finite or ∞ (never NaN), and report.json stores ∞ as null: both read as
    rank-deficient.
    """
    why = {"condition_number": "∞, rank-deficient", "alpha_req": "undefined"}
    gone = [layer for layer, v in zip(layers, values) if v is None or not np.isfinite(v)]
    if not gone:
        return ""
    reason = why.get(key, "undefined")
    return f"(layer{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} not plotted: {reason})"


def plot_spectral(rows: List[Dict], path: str, title: str) -> None:
    """RankMe, α-ReQ, isotropy and condition number per layer.

    And the mass of the top principal directions in the readout subspace (rows of
    `report.spectral_profile`), on two rows of panels; a panel that leaves a layer out (a value
    that is missing, NaN or infinite) says which and why.
    """
    from matplotlib.ticker import MaxNLocator

    layers = [r["layer"] for r in rows]
    with _figure(path, 2, 3, figsize=(10.5, 6.6), dpi=100) as (fig, axes):
        flat = list(axes.flat)
        for ax, key, label in zip(flat, ("rankme", "alpha_req", "isotropy", "condition_number"),
                                  ("RankMe (singular values)", "α-ReQ", "isotropy (partition fn.)",
                                   "condition number")):
            values = [r[key] for r in rows]
            shown = [np.nan if v is None or not np.isfinite(v) else v for v in values]
            ax.plot(layers, shown, "o-", ms=4)
            note = _missing_note(layers, values, key)
            ax.set_title(f"{label}\n{note}" if note else label, fontsize=10)
            ax.set_xlabel("layer")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if key == "condition_number" and any(v > 0 for v in shown if np.isfinite(v)):
                ax.set_yscale("log")
        ax = flat[4]
        ax.plot(layers, [r["readout_alignment_mean"] for r in rows], "o-", ms=4, label="top PCs, mean")
        ax.plot(layers, [r["readout_alignment_top"][0] for r in rows], "s--", ms=4, label="top PC")
        ax.axhline(rows[0]["random_direction_expectation"], color="grey", ls=":", label="random direction (k/d)")
        ax.set_ylim(0, 1.02)
        ax.set_title("PC mass in the readout subspace", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        flat[5].set_axis_off()
        fig.suptitle(title)


def plot_loss(history: Sequence[float], path: str, title: str, ylabel: str = "Σ|ĝ|^p", log_scale: bool = True) -> None:
    """The packing objective per optimizer step (the paper's loss Σ|ĝ|^p on a log scale)."""
    with _figure(path, figsize=(6, 4), dpi=120) as (fig, ax):
        (ax.semilogy if log_scale else ax.plot)(np.arange(1, len(history) + 1), history)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)


def plot_fit(fit, path: str) -> None:
    """A capacity fit (fitting.FitResult).

    Measured against fitted ε (left), and ε against k per d, data and fit (right).
    """
    with _figure(path, 1, 2, figsize=(11, 4.5), dpi=120) as (fig, (ax1, ax2)):
        ax1.scatter(fit.predicted, fit.eps, s=14)
        lo, hi = float(min(fit.eps.min(), fit.predicted.min())), float(max(fit.eps.max(), fit.predicted.max()))
        ax1.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax1.set_xlabel("fitted ε")
        ax1.set_ylabel(f"measured ε ({fit.eps_key})")
        params = ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items())
        ax1.set_title(f"{fit.form}: {params}\nR²={fit.r2:.4f}  MAPE={fit.mape:.2f}%  NRMSE={fit.nrmse:.2f}%",
                      fontsize=9)
        for d in np.unique(fit.d):
            sel = fit.d == d
            order = np.argsort(fit.k[sel])
            line = ax2.plot(fit.k[sel][order], fit.eps[sel][order], "o", ms=3)[0]
            kk = np.linspace(fit.k[sel].min(), fit.k[sel].max(), 100)
            ax2.plot(kk, fit.predict(kk, np.full_like(kk, d)), "-", color=line.get_color(), lw=1, label=f"d={int(d)}")
        ax2.set_xscale("log")
        ax2.set_xlabel("k")
        ax2.set_ylabel("ε")
        ax2.legend(fontsize=7, ncol=2)


def plot_survey(models: Sequence[Dict], path: str) -> None:
    """ε against d_model, one point per surveyed model (rows of survey.json).

    With the borderline band 0.1 ≤ ε ≤ 0.2 shaded.
    """
    with _figure(path, figsize=(6.5, 4.5)) as (fig, ax):
        for r in models:
            ax.scatter(r["d_model"], r["epsilon"], s=30)
            ax.annotate(os.path.basename(r["source"].rstrip("/")), (r["d_model"], r["epsilon"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        ax.axhspan(0.1, 0.2, color="grey", alpha=0.15, label="borderline (0.1 < ε < 0.2)")
        ax.set_xscale("log")
        ax.set_xlabel("d_model")
        ax.set_ylabel("ε = μ + 2σ")
        ax.legend(fontsize=8)


_Z_KEY = re.compile(r"^pga_z/ccr(\d+)/(.+)$")


def _edges(steps: np.ndarray) -> np.ndarray:
    """Cell edges around each step: midway between neighbours, half a gap past the ends."""
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mid = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[steps[0] - (mid[0] - steps[0])], mid, [steps[-1] + (steps[-1] - mid[-1])]])


def _training_series(records: Sequence[Dict]) -> Tuple[np.ndarray, Dict, Dict, Dict]:
    """(steps, {which: ε per step}, {ccr: {layer: z per step}}, {layer: RankMe per step}) of the records."""
    steps = np.array([r["step"] for r in records], dtype=float)
    keys: List[str] = []
    for r in records:
        keys += [k for k in r if k not in keys]

    def series(key):
        return np.array([_nan(r.get(key, np.nan)) for r in records], dtype=float)

    eps = {k.split("/", 1)[1]: series(k) for k in keys if k.startswith("eps/")}
    z: Dict[int, Dict[str, np.ndarray]] = {}
    for k in keys:
        m = _Z_KEY.match(k)
        if m:
            z.setdefault(int(m.group(1)), {})[m.group(2)] = series(k)
    rankme = {k.split("/", 1)[1]: series(k) for k in keys if k.startswith("rankme/")}
    return steps, eps, z, rankme


def _colorbar_space(fig, ax) -> None:
    """The room a heatmap's colorbar takes, left empty, so that a line panel lines up with the heatmaps."""
    from matplotlib.cm import ScalarMappable

    fig.colorbar(ScalarMappable(), ax=ax, pad=0.01, fraction=0.04).ax.set_visible(False)


def training_plot(metrics, path: str, title: str = "") -> None:
    """ε and the Subspace-PGA z per layer over training, from a monitor's measurements.

    The top panel draws ε = μ + k·σ of the input embedding and of the unembedding over steps (one
    line when they are tied). Below, one heatmap per CCR variant: z of each layer (rows) at each
    measured step (columns), on a diverging scale centred on 0; cells with |z| ≤ 2 (chance level,
    the Subspace-PGA paper's null band) are greyed out, cells without a value left blank. With
    the spectral metrics, a last panel draws RankMe per layer.

    Args:
        metrics (str | os.PathLike | Sequence[dict]): a monitor's JSONL file, or its records as
            ``monitor.read_metrics`` returns them (each with "step").
        path (str): the image written (its folder is created; any suffix matplotlib writes).
        title (str): the figure's title. Default "": the file's name, or none.

    Returns:
        None

    Raises:
        ValueError: no records, a record without an integer "step", or records with neither ε nor
            z values.
        FileNotFoundError: a metrics file that does not exist.

    Examples:
        >>> import os, tempfile
        >>> records = [{"step": s, "eps/input": 0.2 + s / 1e4, "pga_z/ccr1/layer0": -3.0 + s / 50,
        ...             "pga_z/ccr1/layer1": 1.0} for s in (0, 50, 100, 150)]
        >>> path = os.path.join(tempfile.mkdtemp(), "training.png")
        >>> rf.plotting.training_plot(records, path)
        >>> os.path.getsize(path) > 0
        True
    """
    from matplotlib.colors import ListedColormap, TwoSlopeNorm
    from matplotlib.patches import Patch

    if isinstance(metrics, (str, os.PathLike)):
        title = title or os.path.basename(os.fspath(metrics))
        metrics = read_metrics(metrics)
    records = list(metrics)
    if not records:
        raise ValueError("metrics: no measurements to plot")
    for i, r in enumerate(records):
        step = r.get("step") if isinstance(r, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"metrics[{i}]: expected a dict with an integer 'step', got {r!r:.80}")
    steps, eps, z, rankme = _training_series(records)
    if not eps and not z:
        raise ValueError("metrics: the records hold neither ε ('eps/...') nor Subspace-PGA z ('pga_z/...') values")
    panels = (["eps"] if eps else []) + [("z", c) for c in sorted(z)] + (["rankme"] if rankme else [])
    heights = [1.0 if p == "eps" or p == "rankme" else max(1.0, 0.22 * len(z[p[1]]) + 0.6) for p in panels]
    with _figure(path, len(panels), 1, figsize=(9, 0.6 + 2.4 * sum(heights)), squeeze=False,
                 gridspec_kw={"height_ratios": heights}, sharex=True) as (fig, axes):
        edges = _edges(steps)
        for ax, panel in zip(axes[:, 0], panels):
            if panel == "eps":
                tied = "output" in eps and "input" in eps and np.array_equal(eps["input"], eps["output"],
                                                                              equal_nan=True)
                for i, (which, values) in enumerate(eps.items()):
                    if tied and which == "output":
                        continue
                    label = "input = output (tied)" if tied else f"{which} embedding"
                    ax.plot(steps, values, "o-", ms=3, color=_color(i), label=label)
                ax.set_ylabel("ε = μ + kσ")
                ax.legend(fontsize=8)
                ax.grid(alpha=0.3)
                _colorbar_space(fig, ax)
            elif panel == "rankme":
                for i, (layer, values) in enumerate(rankme.items()):
                    ax.plot(steps, values, "-", lw=1, color=_color(i), label=layer)
                ax.set_ylabel("RankMe")
                ax.legend(fontsize=7, ncol=min(6, len(rankme)))
                ax.grid(alpha=0.3)
                _colorbar_space(fig, ax)
            else:
                layers = list(z[panel[1]])
                grid = np.vstack([z[panel[1]][layer] for layer in layers])
                finite = np.abs(grid[np.isfinite(grid)])
                limit = max(3.0, float(finite.max()) if finite.size else 3.0)
                mesh = ax.pcolormesh(edges, np.arange(len(layers) + 1), np.ma.masked_invalid(grid), cmap="RdBu_r",
                                     norm=TwoSlopeNorm(0.0, -limit, limit))
                chance = np.ma.masked_where(~(np.abs(grid) <= 2), np.ones_like(grid))
                ax.pcolormesh(edges, np.arange(len(layers) + 1), chance, cmap=ListedColormap(["#d9d9d9"]))
                ax.set_yticks(np.arange(len(layers)) + 0.5, layers, fontsize=7 if len(layers) > 12 else 8)
                ax.set_ylabel(f"z, CCR-{panel[1]}")
                bar = fig.colorbar(mesh, ax=ax, pad=0.01, fraction=0.04)
                bar.set_label("z", fontsize=8)
                for level in (-2, 2):
                    bar.ax.axhline(level, color="black", lw=0.8)
                handles = [Patch(color="#d9d9d9", label="|z| ≤ 2 (chance)")]
                if np.isnan(grid).any():
                    handles.append(Patch(facecolor="white", edgecolor="grey", label="blank: no value"))
                ax.legend(handles=handles, fontsize=7, loc="upper right", framealpha=0.9)
        axes[-1, 0].set_xlabel("training step")
        if title:
            fig.suptitle(title)
