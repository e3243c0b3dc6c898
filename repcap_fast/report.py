"""`repcap report` and `repcap survey`: the paper-grade analysis of real models, written as
report.json (full provenance), report.md (a readable summary) and PNG plots.

A report on one model has four parts:
1. ε of the embedding matrix, streamed over all pairs and exact through the Gram identity, with
   its class, the capacity table with the Welch floor, a histogram plot, and the
   embedding-vs-unembedding statistics when the two are untied;
2. the Subspace-PGA profile: z per layer for CCR-1, 5 and 10 with the null band;
3. spectral metrics per layer (RankMe, α-ReQ, isotropy, condition number) and the alignment of the
   top principal directions with the readout subspace;
4. where everything came from: source, files, tensor names, ties, text, token sample, seeds,
   versions, and the time of each stage.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from . import capacity, pga
from ._backends import info
from .cosine_stats import cosine_moments, pairwise_cosine_stats
from .models import HiddenStates, NoUnembeddingError, check_layers, hidden_states, layer_count, load_embeddings, runnable

REPORT_SECTIONS = ("provenance", "model", "epsilon", "hidden_states", "pga", "spectral")


def _finite(x):
    """JSON-safe float: None for NaN and ±inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return _finite(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, torch.Tensor):
        return _clean(obj.tolist())
    return obj


def _stage(name: str, log) -> float:
    log(f"== {name}")
    return time.perf_counter()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- ε --------------------------------------------------------------------------------------------

def epsilon_analysis(matrix: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0, backend: str = "auto",
                     zero_rows: str = "error", progress: bool = True):
    """Streamed statistics (kernel 1) and exact moments (Gram identity) of one V×d matrix, with its
    class and capacity table. zero_rows: "error", or "drop" (counted in the result). Returns
    (dict, CosineStats)."""
    t0 = time.perf_counter()
    stats = pairwise_cosine_stats(matrix, bins=bins, backend=backend, zero_rows=zero_rows,
                                  progress=None if progress else False)
    t_stream = time.perf_counter() - t0
    t0 = time.perf_counter()
    moments = cosine_moments(matrix, zero_rows=zero_rows)
    t_gram = time.perf_counter() - t0
    v, d = stats.shape_a
    eps = stats.epsilon(k_sigma)
    out = {
        "shape": [int(matrix.shape[0]), d], "rows_used": v, "zero_rows_dropped": stats.dropped_rows_a,
        "dtype": str(matrix.dtype).replace("torch.", ""), "pairs": stats.count,
        "backend": stats.backend,
        "stream": {"mean": stats.mean, "std": stats.std, "epsilon": eps, "min": stats.min, "max": stats.max,
                   "quantiles": {str(q): stats.quantile(q) for q in (0.01, 0.5, 0.9, 0.99, 0.999)}},
        "exact": {"mean": moments.mean, "std": moments.std, "epsilon": moments.epsilon(k_sigma)},
        "epsilon": eps, "k_sigma": k_sigma,
        "class": capacity.model_class(eps), "class_description": capacity.describe_class(eps),
        "capacity": capacity.capacity_table(d, eps, vocab=v),
        "seconds": {"stream": t_stream, "gram": t_gram},
    }
    return out, stats


def embedding_vs_unembedding(E: torch.Tensor, U: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0,
                             backend: str = "auto", zero_rows: str = "error", progress: bool = True) -> Dict:
    """For untied models: cos(E_i, U_i) of each token's own two rows, and all V×V pairs cos(E_i, U_j).
    Tokens with a zero row in E or U have no cosine: an error, or with zero_rows="drop" left out."""
    e64, u64 = E.double(), U.double()
    nonzero = (e64.norm(dim=1) > 0) & (u64.norm(dim=1) > 0)
    if not bool(nonzero.all()) and zero_rows != "drop":
        raise ValueError(f"{int((~nonzero).sum())} tokens have a zero row in the embedding or the unembedding; "
                         f"pass zero_rows='drop' (--zero-rows drop) to leave them out")
    e = torch.nn.functional.normalize(e64[nonzero], dim=1)
    u = torch.nn.functional.normalize(u64[nonzero], dim=1)
    same = (e * u).sum(dim=1)
    cross = pairwise_cosine_stats(E, U, bins=bins, backend=backend, zero_rows=zero_rows,
                                  progress=None if progress else False)
    return {
        "tokens_left_out": int((~nonzero).sum()),
        "same_token": {"mean": float(same.mean()), "std": float(same.std(unbiased=False)),
                       "min": float(same.min()), "max": float(same.max()),
                       "quantiles": {str(q): float(torch.quantile(same, q)) for q in (0.01, 0.5, 0.99)}},
        "all_pairs": {"pairs": cross.count, "mean": cross.mean, "std": cross.std, "epsilon": cross.epsilon(k_sigma),
                      "min": cross.min, "max": cross.max, "backend": cross.backend},
    }


def plot_cosine_histograms(curves: Sequence, path: str, title: str, k_sigma: float = 2.0) -> None:
    """Density of pairwise cosines, one curve per (label, CosineStats), with μ and ε marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lo, hi = 1.0, -1.0
    for (label, stats), color in zip(curves, ("tab:blue", "tab:orange", "tab:green")):
        edges = stats.edges.numpy()
        centers = 0.5 * (edges[:-1] + edges[1:])
        density = stats.hist.numpy() / (stats.count * stats.bin_width)
        ax.plot(centers, density, drawstyle="steps-mid", lw=0.9, color=color, label=label)
        ax.fill_between(centers, density, step="mid", alpha=0.2, color=color)
        eps = stats.epsilon(k_sigma)
        ax.axvline(stats.mean, color=color, ls=":", lw=1.0)
        ax.axvline(eps, color=color, ls="-", lw=1.2, label=f"{label}: ε = μ+{k_sigma:g}σ = {eps:.4f}")
        lo, hi = min(lo, stats.min), max(hi, stats.max)
    ax.set_xlim(max(-1.0, lo - 0.05), min(1.0, hi + 0.05))
    ax.set_xlabel("cosine similarity of token pairs")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --- PGA and spectra ------------------------------------------------------------------------------

def plot_pga_profile(profile: Dict, path: str, title: str) -> None:
    """z per layer for each CCR variant, with the null band |z| ≤ 2; ρ_readout against the null mean
    ± 2 sample std of the null ρ's."""
    plt = _plt()
    fig, (ax_z, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for (ccr, rows), color in zip(profile.items(), colors):
        layers = [r["layer"] for r in rows]
        z = [np.nan if r["z"] is None else r["z"] for r in rows]
        ax_z.plot(layers, z, "o-", ms=3, color=color, label=f"CCR-{ccr}")
        rho = [np.nan if r["rho_readout"] is None else r["rho_readout"] for r in rows]
        mean = np.array([np.nan if r["null_mean"] is None else r["null_mean"] for r in rows])
        std = np.array([np.nan if r["null_std"] is None else r["null_std"] for r in rows])
        ax_r.plot(layers, rho, "o-", ms=3, color=color, label=f"ρ readout, CCR-{ccr}")
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
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def spectral_profile(states: HiddenStates, basis: torch.Tensor, m: int = 10) -> List[Dict]:
    """Per layer: RankMe (singular values of H), α-ReQ, isotropy, condition number, and the fraction
    of each of the top m principal directions that lies in the readout subspace
    (`pga.spectral_metrics`: two SVDs per layer)."""
    rows = []
    for layer in states.layers:
        metrics = pga.spectral_metrics(states[layer], basis, m)
        align = metrics.pop("readout_alignment_top")
        rows.append({"layer": layer, **metrics, "readout_alignment_top": align.tolist(),
                     "readout_alignment_mean": float(align.mean()),
                     "random_direction_expectation": basis.shape[1] / basis.shape[0]})
    return rows


def plot_spectral(rows: List[Dict], path: str, title: str) -> None:
    plt = _plt()
    layers = [r["layer"] for r in rows]
    fig, axes = plt.subplots(1, 5, figsize=(17, 3.6))
    for ax, key, label in zip(axes, ("rankme", "alpha_req", "isotropy", "condition_number"),
                              ("RankMe (singular values)", "α-ReQ", "isotropy (partition fn.)", "condition number")):
        ax.plot(layers, [np.nan if r[key] is None else r[key] for r in rows], "o-", ms=3)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("layer")
        if key == "condition_number":
            ax.set_yscale("log")
    ax = axes[4]
    ax.plot(layers, [r["readout_alignment_mean"] for r in rows], "o-", ms=3, label="top PCs, mean")
    ax.plot(layers, [r["readout_alignment_top"][0] for r in rows], "s--", ms=3, label="top PC")
    ax.axhline(rows[0]["random_direction_expectation"], color="grey", ls=":", label="random direction (k/d)")
    ax.set_ylim(0, 1.02)
    ax.set_title("PC mass in the readout subspace", fontsize=9)
    ax.set_xlabel("layer")
    ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --- the report -----------------------------------------------------------------------------------

def _provenance(command: Optional[List[str]], settings: Dict) -> Dict:
    versions = {k: info()[k] for k in ("repcap_fast", "torch", "triton", "python")}
    for module in ("transformers", "numpy", "scipy", "gguf", "safetensors"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or without a version
            versions[module] = None
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            "settings": settings, "versions": versions,
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_for_report(source, n_rows, device):
    """Both matrices when the source has an unembedding, else the input alone (and why)."""
    try:
        return load_embeddings(source, which="both", n_rows=n_rows, device=device), None
    except NoUnembeddingError as exc:
        return load_embeddings(source, which="input", n_rows=n_rows, device=device), str(exc)


def run_report(source=None, out: str = "repcap_report", *, texts=None, text_name: Optional[str] = None,
               text_file: Optional[str] = None, jsonl_key: Optional[str] = None,
               n_tokens: int = 2048, layers="all", k: int = 100, n_null: int = 100, ccrs: Sequence[int] = (1, 5, 10),
               seed: int = 0, device="cpu", dtype: torch.dtype = torch.float32, backend: str = "auto",
               bins: int = 4096, k_sigma: float = 2.0, n_rows=None, zero_rows: str = "error", batch_size: int = 8,
               progress: bool = True, log=print, command: Optional[List[str]] = None) -> Dict:
    """Runs the whole analysis of one model and writes OUT/report.json, OUT/report.md and the PNGs.
    Returns the report dict. See the module docstring for what it contains.

    Arguments are checked against the model's config before any heavy work; the hidden states
    (where a text that is too short shows) run before the V² pass of ε. If a stage fails, report.json
    is still written with the stages that finished and the error, and the error is raised."""
    os.makedirs(out, exist_ok=True)
    settings = {"source": None if source is None else str(source), "n_tokens": n_tokens, "layers": layers, "k": k,
                "n_null": n_null, "ccrs": list(ccrs), "seed": seed, "device": str(device),
                "dtype": str(dtype).replace("torch.", ""), "backend": backend, "bins": bins, "k_sigma": k_sigma,
                "n_rows": n_rows, "zero_rows": zero_rows, "batch_size": batch_size,
                "text": text_name or ("default corpus" if texts is None else "texts"),
                "text_file": None if text_file is None else os.path.abspath(text_file),
                "text_file_sha256": None if text_file is None else _file_sha256(text_file), "jsonl_key": jsonl_key}
    report: Dict = {"provenance": _provenance(command, settings)}
    seconds: Dict[str, float] = {}
    plots: Dict[str, str] = {}
    t_all = time.perf_counter()

    def finish(error: Optional[BaseException] = None) -> Dict:
        seconds["total"] = time.perf_counter() - t_all
        report["provenance"]["seconds"] = seconds
        report["provenance"]["plots"] = plots
        if error is not None:
            report["error"] = f"{type(error).__name__}: {error}"
        cleaned = _clean(report)
        with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as fh:
            json.dump(cleaned, fh, indent=1, allow_nan=False)
        if error is None:
            with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as fh:
                fh.write(report_markdown(cleaned))
        return cleaned

    try:
        t0 = _stage("loading the embedding matrices", log)
        emb, no_unembedding = _load_for_report(source, n_rows, device)
        report["model"] = emb.to_dict()
        seconds["load"] = time.perf_counter() - t0
        log(f"   {emb.kind} · {emb.architecture} · {emb.rows_kept}×{emb.d_model} · tied={emb.tied} ({emb.tied_reason})")

        # What can run, and are the arguments valid for this model? Checked before any heavy work.
        can_run, why = runnable(source)
        skip = None
        if no_unembedding is not None:
            skip = f"no unembedding: {no_unembedding}"
        elif not can_run:
            skip = why
        keep_layers = None
        if skip is None:
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < emb.d_model:
                raise ValueError(f"k must be an int in [1, d) = [1, {emb.d_model}), got {k!r}")
            n_layers = layer_count(emb.config)
            if n_layers is not None:
                keep_layers = check_layers(layers, n_layers)

        if skip is None:
            t0 = _stage(f"hidden states ({n_tokens} tokens, seed {seed})", log)
            states = hidden_states(source, texts=texts, layers=layers, n_tokens=n_tokens, batch_size=batch_size,
                                   dtype=dtype, device=device, seed=seed, text_name=text_name, progress=progress)
            report["hidden_states"] = states.to_dict()
            seconds["hidden_states"] = time.perf_counter() - t0
            if keep_layers is not None and states.layers != keep_layers:
                raise RuntimeError(f"the model ran layers {states.layers}, its config says {keep_layers}")

        t0 = _stage("ε of the embedding matrix (streamed over all pairs, and exact)", log)
        matrix = emb.input if emb.input is not None else emb.output
        eps_in, stats_in = epsilon_analysis(matrix, bins=bins, k_sigma=k_sigma, backend=backend, zero_rows=zero_rows,
                                            progress=progress)
        eps_section = {"input": eps_in}
        curves = [("input embedding", stats_in)]
        if emb.tied is False and emb.output is not None:
            eps_out, stats_out = epsilon_analysis(emb.output, bins=bins, k_sigma=k_sigma, backend=backend,
                                                  zero_rows=zero_rows, progress=progress)
            eps_section["output"] = eps_out
            curves.append(("unembedding", stats_out))
            eps_section["input_vs_output"] = embedding_vs_unembedding(emb.input, emb.output, bins=bins, k_sigma=k_sigma,
                                                                      backend=backend, zero_rows=zero_rows,
                                                                      progress=progress)
        else:
            eps_section["output"] = None
            eps_section["note"] = ("tied: the unembedding is the input embedding" if emb.tied
                                   else "no unembedding in this source")
        report["epsilon"] = eps_section
        plots["cosine_histogram"] = "cosine_histogram.png"
        plot_cosine_histograms(curves, os.path.join(out, plots["cosine_histogram"]),
                               f"{emb.source}: {emb.rows_kept}×{emb.d_model}", k_sigma)
        seconds["epsilon"] = time.perf_counter() - t0
        log(f"   ε = {eps_in['epsilon']:.6f} (exact {eps_in['exact']['epsilon']:.6f}) · {eps_in['class_description']}")

        if skip is not None:
            report["hidden_states"] = report["pga"] = report["spectral"] = {"skipped": skip}
            log(f"   no hidden states, PGA or spectra: {skip}")
        else:
            t0 = _stage(f"Subspace PGA: {len(states)} layers × CCR {list(ccrs)}, k={k}, {n_null} null subspaces", log)
            w_u = emb.output.to(torch.float64)
            layer_list = states.layers
            results = pga.pga_profile([states[layer].to(device) for layer in layer_list], W_U=w_u, k=k,
                                      n_null=n_null, ccrs=ccrs, seed=seed, backend=backend, progress=progress)
            profile = {}
            for ccr, per_layer in results.items():
                profile[str(ccr)] = [{"layer": layer, **{key: _finite(getattr(r, key)) for key in
                                                         ("z", "rho_readout", "null_mean", "null_std")},
                                      "null_rhos": [_finite(x) for x in r.null_rhos], "n_pairs": r.n_pairs,
                                      "backend": r.backend}
                                     for layer, r in zip(layer_list, per_layer)]
            report["pga"] = {"k": k, "n_null": n_null, "seed": seed, "ccrs": list(ccrs),
                             "readout": "top-k right singular vectors of W_U (the unembedding"
                                        + (", tied to the input embedding)" if emb.tied else ")"),
                             "profile": profile}
            plots["pga_profile"] = "pga_profile.png"
            plot_pga_profile(profile, os.path.join(out, plots["pga_profile"]),
                             f"{emb.source}: Subspace PGA, k={k}, {n_null} nulls, {n_tokens} tokens")
            seconds["pga"] = time.perf_counter() - t0

            t0 = _stage("spectral metrics and readout alignment per layer", log)
            basis = pga.readout_basis(w_u, k).basis.cpu()
            spectral = spectral_profile(states, basis)
            report["spectral"] = {"m_directions": 10, "k": k, "layers": spectral}
            plots["spectral"] = "spectral.png"
            plot_spectral(spectral, os.path.join(out, plots["spectral"]), f"{emb.source}: spectra per layer")
            seconds["spectral"] = time.perf_counter() - t0
    except BaseException as exc:
        finish(exc)
        log(f"== failed: {type(exc).__name__}: {exc} (what finished is in {out}/report.json)")
        raise
    report = finish()
    log(f"== wrote {out}/report.json, report.md and {len(plots)} plots in {seconds['total']:.1f} s")
    return report


def _fmt(x, spec=".4f"):
    return "n/a" if x is None else format(x, spec)


def report_markdown(report: Dict) -> str:
    """A readable summary of a report dict."""
    m, e = report["model"], report["epsilon"]
    inp = e["input"]
    lines = [f"# repcap report: {m['source']}", "",
             f"- weights: `{m['path']}` ({m['kind']}, architecture {m['architecture']})",
             f"- input embedding `{m['input_name']}`: {m['vocab_rows']} rows × {inp['shape'][1]}, {inp['dtype']}; "
             f"{inp['rows_used']} rows analysed"
             + (f" ({inp['zero_rows_dropped']} zero rows dropped)" if inp.get("zero_rows_dropped") else "")
             + (f"; the tokenizer has {m['tokenizer_size']} tokens, so {m['padded_rows']} rows are padding"
                + (" (dropped)" if m["padded_rows"] and m["rows_kept"] <= m["tokenizer_size"] else
                   " (kept; --n-rows tokenizer drops them)" if m["padded_rows"] else "")
                if m["tokenizer_size"] else ""),
             f"- tied: {m['tied']} ({m['tied_reason']})",
             f"- {report['provenance']['time_utc']}, repcap_fast {report['provenance']['versions']['repcap_fast']}, "
             f"torch {report['provenance']['versions']['torch']}", "",
             "## ε of the embedding matrix", "",
             "| matrix | pairs | μ | σ | ε streamed | ε exact (Gram) | class |", "|---|---|---|---|---|---|---|"]
    for key in ("input", "output"):
        s = e.get(key)
        if s:
            lines.append(f"| {key} | {s['pairs']:,} | {_fmt(s['stream']['mean'], '.6f')} | {_fmt(s['stream']['std'], '.6f')} | "
                         f"{_fmt(s['epsilon'], '.6f')} | {_fmt(s['exact']['epsilon'], '.6f')} | {s['class_description']} |")
    lines += ["", "Capacity (the most features a d-dimensional space holds at this ε) and the Welch/orthoplex floor "
              "on max|c| for that many vectors:", "", "| formula | capacity k | log10 k | floor on max \\|c\\| |", "|---|---|---|---|"]
    for name, row in inp["capacity"]["formulas"].items():
        lines.append(f"| {name} | " + ("n/a | n/a | n/a |" if row is None else
                                      f"{_fmt(row['capacity'], '.4g')} | {_fmt(row['log10_capacity'], '.2f')} | {_fmt(row['welch_floor'], '.5f')} |"))
    if inp["class"] == 1:
        lines.append("\n**Class 1 (ε > 0.2): there is no near-orthogonal structure, and these capacities are "
                     "indeterminate.**")
    if "welch_floor_vocab" in inp["capacity"]:
        lines.append(f"\nNo {inp['capacity']['vocab']} unit vectors in R^{inp['capacity']['d']} have max|c| below "
                     f"{inp['capacity']['welch_floor_vocab']:.6f}.")
    if e.get("input_vs_output"):
        x = e["input_vs_output"]
        lines.append(f"\nEmbedding vs unembedding: cos(E_i, U_i) of the same token has mean {x['same_token']['mean']:.4f} "
                     f"(std {x['same_token']['std']:.4f}); over all pairs, mean {x['all_pairs']['mean']:.4f}, "
                     f"ε {x['all_pairs']['epsilon']:.4f}.")
    elif e.get("note"):
        lines.append(f"\n({e['note']}.)")
    lines.append("\n![cosines](cosine_histogram.png)\n")
    if "skipped" in report.get("pga", {}):
        lines += ["## Subspace PGA and spectra", "", f"Not run: {report['pga']['skipped']}."]
    if "profile" in report.get("pga", {}):
        p = report["pga"]
        hs = report["hidden_states"]
        lines += ["## Subspace PGA", "",
                  f"{hs['n_tokens']} tokens of {hs['text']['name']} (seed {hs['seed']}, {hs['windows_run']} windows of "
                  f"{hs['seq_len']}), readout: {p['readout']}, k = {p['k']}, {p['n_null']} null subspaces.", "",
                  "| layer | " + " | ".join(f"z CCR-{c}" for c in p["profile"]) + " |",
                  "|---|" + "---|" * len(p["profile"])]
        for i, layer in enumerate(r["layer"] for r in next(iter(p["profile"].values()))):
            lines.append(f"| {layer} | " + " | ".join(_fmt(rows[i]["z"], ".2f") for rows in p["profile"].values()) + " |")
        lines += ["", "![pga](pga_profile.png)", "", "## Spectra per layer", "",
                  "| layer | RankMe | α-ReQ | isotropy | condition | top-PC mass in readout |", "|---|---|---|---|---|---|"]
        for r in report["spectral"]["layers"]:
            lines.append(f"| {r['layer']} | {_fmt(r['rankme'], '.1f')} | {_fmt(r['alpha_req'], '.3f')} | "
                         f"{_fmt(r['isotropy'], '.3g')} | {_fmt(r['condition_number'], '.3g')} | "
                         f"{_fmt(r['readout_alignment_top'][0], '.3f')} |")
        lines += ["", "![spectra](spectral.png)"]
    secs = report["provenance"]["seconds"]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.1f} s" for k, v in secs.items()), ""]
    return "\n".join(lines)


# --- survey ---------------------------------------------------------------------------------------

def run_survey(sources: Sequence, out: str = "repcap_survey", *, bins: int = 4096, k_sigma: float = 2.0,
               backend: str = "auto", device="cpu", n_rows=None, zero_rows: str = "error", progress: bool = True,
               log=print, command: Optional[List[str]] = None) -> Dict:
    """Several models side by side, like the paper's table: d_model, ε, class, capacity; and the
    plot of ε against d_model. Writes OUT/survey.json, OUT/survey.md and OUT/epsilon_vs_d.png."""
    if not sources:
        raise ValueError("survey needs at least one SOURCE")
    os.makedirs(out, exist_ok=True)
    rows = []
    for source in sources:
        t0 = _stage(f"{source}", log)
        emb = load_embeddings(source, which="input", n_rows=n_rows, device=device)
        eps, _ = epsilon_analysis(emb.input, bins=bins, k_sigma=k_sigma, backend=backend, zero_rows=zero_rows,
                                  progress=progress)
        full = eps["capacity"]["formulas"]["full"]
        rows.append({"source": str(source), "architecture": emb.architecture, "vocab_rows": emb.rows_kept,
                     "rows_used": eps["rows_used"], "zero_rows_dropped": eps["zero_rows_dropped"],
                     "d_model": emb.d_model, "tied": emb.tied, "epsilon": eps["epsilon"],
                     "epsilon_exact": eps["exact"]["epsilon"], "mean": eps["stream"]["mean"], "std": eps["stream"]["std"],
                     "class": eps["class"], "class_description": eps["class_description"],
                     "capacity_full": None if full is None else full["capacity"],
                     "log10_capacity_full": None if full is None else full["log10_capacity"],
                     "welch_floor_vocab": eps["capacity"].get("welch_floor_vocab"),
                     "model": emb.to_dict(), "seconds": time.perf_counter() - t0})
        log(f"   d={emb.d_model} ε={eps['epsilon']:.4f} {eps['class_description']}")
    doc = _clean({"provenance": _provenance(command, {"sources": [str(s) for s in sources], "bins": bins,
                                                       "k_sigma": k_sigma, "n_rows": n_rows,
                                                       "zero_rows": zero_rows}), "models": rows})
    with open(os.path.join(out, "survey.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, allow_nan=False)
    md = ["# repcap survey", "", "| model | d_model | V | ε | class | capacity (full form) |", "|---|---|---|---|---|---|"]
    for r in doc["models"]:
        cap = "indeterminate" if r["class"] == 1 else _fmt(r["capacity_full"], ".3g")
        md.append(f"| {r['source']} | {r['d_model']} | {r['rows_used']} | {_fmt(r['epsilon'])} | {r['class_description']} | "
                  f"{cap} |")
    md += ["", "![epsilon vs d](epsilon_vs_d.png)", ""]
    with open(os.path.join(out, "survey.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in doc["models"]:
        ax.scatter(r["d_model"], r["epsilon"], s=30)
        ax.annotate(os.path.basename(r["source"].rstrip("/")), (r["d_model"], r["epsilon"]), fontsize=7,
                    xytext=(4, 3), textcoords="offset points")
    ax.axhspan(0.1, 0.2, color="grey", alpha=0.15, label="borderline (0.1 < ε < 0.2)")
    ax.set_xscale("log")
    ax.set_xlabel("d_model")
    ax.set_ylabel("ε = μ + 2σ")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "epsilon_vs_d.png"), dpi=130)
    plt.close(fig)
    log(f"== wrote {out}/survey.json, survey.md and epsilon_vs_d.png")
    return doc
