"""The files of a report.

Its readable summary (`report_markdown`) and report.json with it (`write_report`); `_fmt`, the
number format the summaries of control reports and surveys share.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional


def _fmt(x, spec=".4f"):
    """`x` formatted with `spec`, or "n/a" for None."""
    return "n/a" if x is None else format(x, spec)


def _layer_points(last: Optional[Dict]) -> str:
    """Which point of the residual stream each layer is, in words."""
    text = "Layer 0 is the embedding output and layer l the output of block l."
    if not last:
        return text
    differs = last.get("differs_from_other_point")
    other = "resid_post" if last["point"] == "final_norm" else "final_norm"
    return (f"{text} The last layer is read at `{last['point']}`: {last['meaning']}"
            + ("" if differs is None else f"; for this model the other point (`{other}`, --last-layer {other}) is "
               + ("a different one" if differs else "the same one (no final norm)")) + ".")


def report_markdown(report: Dict) -> str:
    """The readable summary of a report (report.md) from its dict.

    Tables of ε (streamed and exact) with the class, the capacity table with the Welch floor, z per
    layer and CCR variant (with the probe accuracy when probes ran), the spectra per layer, links
    to the plots, and the time of each stage.

    Args:
        report (dict): a report as `run_report` returns it (or report.json holds it).

    Returns:
        str: the markdown text.

    Raises:
        KeyError: the dict lacks a section every report has ("model", "epsilon", "provenance").

    Examples:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "E.npy")
        >>> np.save(path, np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32))
        >>> doc = rf.report.run_report(path, os.path.join(folder, "out"), rf.report.ReportSettings(bins=64),
        ...                            progress=False, log=lambda line: None)
        >>> print(rf.report.report_markdown(doc).splitlines()[0])
        # repcap report: .../E.npy
    """
    m, e = report["model"], report["epsilon"]
    inp = e["input"]
    lines = [f"# repcap report: {m['source']}", "",
             f"- weights: `{m['path']}` ({m['kind']}, architecture {m['architecture']})",
             f"- input embedding `{m['input_name']}`: {m['vocab_rows']} rows × {inp['shape'][1]}, {inp['dtype']}; "
             f"{inp['rows_used']} rows analysed"
             + (f" ({inp['zero_rows_dropped']} zero rows dropped)" if inp.get("zero_rows_dropped") else "")
             + (f"; the tokenizer's ids fill {m['tokenizer_size']} rows, so {m['padded_rows']} rows are padding"
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
            lines.append(f"| {key} | {s['pairs']:,} | {_fmt(s['stream']['mean'], '.6f')} | "
                         f"{_fmt(s['stream']['std'], '.6f')} | "
                         f"{_fmt(s['epsilon'], '.6f')} | {_fmt(s['exact']['epsilon'], '.6f')} | "
                         f"{s['class_description']} |")
    lines += ["", "Capacity (the most features a d-dimensional space holds at this ε) and the Welch/orthoplex floor "
              "on max|c| for that many vectors:", "", "| formula | capacity k | log10 k | floor on max \\|c\\| |",
              "|---|---|---|---|"]
    for name, row in inp["capacity"]["formulas"].items():
        lines.append(f"| {name} | " + ("n/a | n/a | n/a |" if row is None else
                                      f"{_fmt(row['capacity'], '.4g')} | {_fmt(row['log10_capacity'], '.2f')} | "
                                      f"{_fmt(row['welch_floor'], '.5f')} |"))
    if inp["class"] == 1:
        lines.append("\n**Class 1 (ε > 0.2): there is no near-orthogonal structure, and these capacities are "
                     "indeterminate.**")
    if "welch_floor_vocab" in inp["capacity"]:
        lines.append(f"\nNo {inp['capacity']['vocab']} unit vectors in R^{inp['capacity']['d']} have max|c| below "
                     f"{inp['capacity']['welch_floor_vocab']:.6f}.")
    if e.get("input_vs_output"):
        x = e["input_vs_output"]
        lines.append(f"\nEmbedding vs unembedding: cos(E_i, U_i) of the same token has mean "
                     f"{x['same_token']['mean']:.4f} "
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
                  _layer_points(p.get("last_layer")), "",
                  "| layer | " + " | ".join(f"z CCR-{c}" for c in p["profile"]) + " |",
                  "|---|" + "---|" * len(p["profile"])]
        probe = {r["layer"]: r for r in report["probe"]["layers"]} if report.get("probe") else None
        if probe is not None:
            lines[-2] += " probe accuracy |"
            lines[-1] += "---|"
        for i, layer in enumerate(r["layer"] for r in next(iter(p["profile"].values()))):
            zs = " | ".join(_fmt(rows[i]["z"], ".2f") + (" ⚠" if rows[i].get("warnings") else "")
                            for rows in p["profile"].values())
            acc = "" if probe is None else (f" {_fmt(probe[layer]['accuracy'], '.3f')} ± "
                                            f"{_fmt(probe[layer]['std'], '.3f')} |" if layer in probe else " |")
            lines.append(f"| {layer} | {zs} |{acc}")
        if probe is not None:
            pr = report["probe"]
            lines += ["", f"Probe accuracy: {pr['n_texts']} labelled texts of {os.path.basename(pr['file'])} "
                          f"({', '.join(f'{k}: {v}' for k, v in pr['labels'].items())}; chance "
                          f"{pr['layers'][0]['chance']:.3f}), {pr['pooling']}-pooled per layer, {pr['classifier']}, "
                          f"{pr['folds']} folds (mean ± std). ![probe](probe.png)"]
        flagged = [(ccr, row) for ccr, rows in p["profile"].items() for row in rows if row.get("warnings")]
        if flagged:
            lines += ["", "**Degenerate inputs (⚠):**", ""]
            lines += [f"- layer {row['layer']}, CCR-{ccr}: {note}" for ccr, row in flagged for note in row["warnings"]]
        lines += ["", "![pga](pga_profile.png)", "", "## Spectra per layer", "",
                  "| layer | RankMe | α-ReQ | isotropy | condition | top-PC mass in readout |",
                  "|---|---|---|---|---|---|"]
        for r in report["spectral"]["layers"]:
            lines.append(f"| {r['layer']} | {_fmt(r['rankme'], '.1f')} | {_fmt(r['alpha_req'], '.3f')} | "
                         f"{_fmt(r['isotropy'], '.3g')} | {_fmt(r['condition_number'], '.3g')} | "
                         f"{_fmt(r['readout_alignment_top'][0], '.3f')} |")
        lines += ["", "![spectra](spectral.png)"]
    secs = report["provenance"]["seconds"]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.1f} s" for k, v in secs.items()), ""]
    return "\n".join(lines)


def write_report(report: Dict, folder: str, *, markdown: bool = True) -> None:
    """Writes report.json of a report dict into a folder, and report.md beside it.

    Args:
        report (dict): a report with JSON values only (`_clean` of what the stages made).
        folder (str): the folder written into (it exists).
        markdown (bool): also write report.md (`report_markdown`); a failed run writes report.json
            alone. Default True.

    Returns:
        None

    Raises:
        ValueError: a value JSON cannot hold (NaN or inf).
        OSError: the folder cannot be written.

    Examples:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "E.npy")
        >>> np.save(path, np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32))
        >>> doc = rf.report.run_report(path, os.path.join(folder, "out"), rf.report.ReportSettings(bins=64),
        ...                            progress=False, log=lambda line: None)
        >>> rf.report.write_report(doc, folder)
        >>> sorted(name for name in os.listdir(folder) if name.startswith("report"))
        ['report.json', 'report.md']
    """
    with open(os.path.join(folder, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, allow_nan=False)
    if markdown:
        with open(os.path.join(folder, "report.md"), "w", encoding="utf-8") as fh:
            fh.write(report_markdown(report))
