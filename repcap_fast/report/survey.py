"""Several models side by side (`repcap survey`).

ε, class and capacity of each embedding matrix (`run_survey`), or each model's whole report with
Subspace PGA across the models and their cross-model agreement (`run_pga_survey`, `repcap survey
--pga`). Every source is checked before the first one's work, and survey.json is rewritten as each
model finishes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional, Sequence

from .. import _validation as val
from .. import plotting
from .._outputs import check_no_clobber, remove_stale, write_json_atomic
from ..models import check_embeddings, in_memory_source, is_in_memory, load_embeddings, resolve_source
from ..ops.pairwise_cosine_stats import check_settings as check_stats_settings
from ..pga import cross_model_agreement
from ..probes import check_probe_file
from ._common import _clean, _log_to, _provenance, _report_inputs, _source_label, _stage
from .analyses import epsilon_analysis
from .pipeline import run_report
from .settings import REPORT_FILES, ReportSettings
from .writers import _fmt

SURVEY_FILES = ("survey.json", "survey.md", "epsilon_vs_d.png", "pga_heatmap.png", "pga_depth.png")


def run_survey(sources: Sequence, out: str = "repcap_survey", *, bins: int = 4096, k_sigma: float = 2.0,
               backend: str = "auto", device="cpu", n_rows=None, zero_rows: str = "error", progress: bool = True,
               log=None, command: Optional[List[str]] = None) -> Dict:
    """ε, class and capacity of several embedding matrices side by side, like the papers' table.

    For each source, `epsilon_analysis` of its input embedding (ε = μ + k_sigma·σ of the pair
    cosines, with the full-form capacity); written as OUT/survey.json, OUT/survey.md and
    OUT/epsilon_vs_d.png (ε against d_model). Every source's header and tensor names are checked
    before the first ε pass; an earlier survey's files are removed at the start, and survey.json is
    rewritten as each model finishes ("complete": false with the models done and those "pending",
    then "complete": true).

    Args:
        sources (Sequence): paths, repo ids or aliases, or models in memory (their input embedding;
            an SAE's W_dec).
        out (str): the output folder. Default "repcap_survey".
        bins (int): histogram bins of the pair cosines. Default 4096.
        k_sigma (float): ε = μ + k_sigma·σ. Default 2.0.
        backend (str): the ops' backend. Default "auto".
        device (str | torch.device): where the matrices go and the passes run. Default "cpu".
        n_rows (int | str | None): the rows used (`load_embeddings`). Default None.
        zero_rows (str): a zero row is an "error", or "drop". Default "error".
        progress (bool): show progress bars. Default True.
        log (Callable[[str], None] | None): receives one line per model. Default None: the lines go to the
            ``repcap_fast.report`` logger at INFO (``repcap`` prints them; configure ``logging`` to see them).
        command (list[str] | None): the command line, recorded in the provenance. Default None.

    Returns:
        dict: the survey (as survey.json holds it): provenance, complete, models (one row each:
        source, d_model, ε streamed and exact, class, full-form capacity, ...).

    Raises:
        ValueError: no source, a setting out of range, a source without an embedding tensor, a zero
            row with zero_rows="error", or an output that is an input.
        TypeError: k_sigma is not a real number.
        FileNotFoundError: a source is not on this machine.

    Examples:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> paths = [os.path.join(folder, f"E{d}.npy") for d in (8, 32)]
        >>> for path, d in zip(paths, (8, 32)):
        ...     np.save(path, np.random.default_rng(d).standard_normal((300, d)).astype(np.float32))
        >>> doc = rf.report.run_survey(paths, os.path.join(folder, "survey"), bins=64, progress=False,
        ...                            log=lambda line: None)
        >>> [(m["d_model"], m["class"]) for m in doc["models"]]
        [(8, 1), (32, 1)]
    """
    if not sources:
        raise ValueError("survey needs at least one SOURCE")
    # every argument and every source checked before the first model loads
    check_stats_settings(val.check_device(device), bins, zero_rows=zero_rows, backend=backend)
    log = _log_to(log)
    k_sigma = val.as_real(k_sigma, "k_sigma")
    sources = [in_memory_source(source) if is_in_memory(source) else source for source in sources]
    for source in sources:  # every source's header and tensor names, before the first ε pass
        if not is_in_memory(source):
            check_embeddings(source, which="input", n_rows=n_rows)
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in SURVEY_FILES],
                     [(f"source {s!r}", s if isinstance(s, (str, os.PathLike)) else None) for s in sources])
    remove_stale(out, SURVEY_FILES)  # survey.json is rewritten as each model finishes
    settings_doc = {"sources": [_source_label(s) for s in sources], "bins": bins, "k_sigma": k_sigma,
                    "n_rows": n_rows, "zero_rows": zero_rows}
    rows = []
    for i, source in enumerate(sources):
        try:
            t0 = _stage(_source_label(source), log)
            emb = load_embeddings(source, which="input", n_rows=n_rows, device=device)
            eps, _ = epsilon_analysis(emb.input, bins=bins, k_sigma=k_sigma, backend=backend, zero_rows=zero_rows,
                                      progress=progress)
            full = eps["capacity"]["formulas"]["full"]
            rows.append({"source": _source_label(source), "architecture": emb.architecture,
                         "vocab_rows": emb.rows_kept,
                         "rows_used": eps["rows_used"], "zero_rows_dropped": eps["zero_rows_dropped"],
                         "d_model": emb.d_model, "tied": emb.tied, "epsilon": eps["epsilon"],
                         "epsilon_exact": eps["exact"]["epsilon"], "mean": eps["stream"]["mean"],
                         "std": eps["stream"]["std"],
                         "class": eps["class"], "class_description": eps["class_description"],
                         "capacity_full": None if full is None else full["capacity"],
                         "log10_capacity_full": None if full is None else full["log10_capacity"],
                         "welch_floor_vocab": eps["capacity"].get("welch_floor_vocab"),
                         "model": emb.to_dict(), "seconds": time.perf_counter() - t0})
            log(f"   d={emb.d_model} ε={eps['epsilon']:.4f} {eps['class_description']}")
            if i + 1 < len(sources):  # partial results, marked as such, as each model finishes
                write_json_atomic(os.path.join(out, "survey.json"), _clean({
                    "provenance": _provenance(command, settings_doc), "complete": False,
                    "pending": [_source_label(s) for s in sources[i + 1:]], "models": rows}), indent=1,
                    allow_nan=False)
        except Exception as exc:  # the file says which source failed, and why
            _write_failed(out, {"provenance": _provenance(command, settings_doc), "complete": False,
                                "pending": [_source_label(s) for s in sources[i:]], "models": rows},
                          _source_label(source), exc)
            raise
    doc = _clean({"provenance": _provenance(command, settings_doc), "complete": True, "models": rows})
    write_json_atomic(os.path.join(out, "survey.json"), doc, indent=1, allow_nan=False)
    md = ["# repcap survey", "", "| model | d_model | V | ε | class | capacity (full form) |",
          "|---|---|---|---|---|---|"]
    for r in doc["models"]:
        cap = "indeterminate" if r["class"] == 1 else _fmt(r["capacity_full"], ".3g")
        md.append(f"| {r['source']} | {r['d_model']} | {r['rows_used']} | {_fmt(r['epsilon'])} | "
                  f"{r['class_description']} | "
                  f"{cap} |")
    md += ["", "![epsilon vs d](epsilon_vs_d.png)", ""]
    with open(os.path.join(out, "survey.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    plotting.plot_survey(doc["models"], os.path.join(out, "epsilon_vs_d.png"))
    log(f"== wrote {out}/survey.json, survey.md and epsilon_vs_d.png")
    return doc


def _write_failed(out: str, doc: dict, label, exc: BaseException) -> None:
    """Writes survey.json of a survey stopped by a source's error, before the error propagates.

    It holds the models done, the pending ones, and "failed": the source and the error (its type
    and message).
    """
    doc["failed"] = {"source": label, "error": f"{type(exc).__name__}: {exc}"}
    write_json_atomic(os.path.join(out, "survey.json"), _clean(doc), indent=1, allow_nan=False)


AGREEMENT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in text.strip("/").split("/")[-1])
    return keep[:60] or "model"


def run_pga_survey(sources: Sequence, out: str = "repcap_survey", settings: Optional[ReportSettings] = None, *,
                   texts: Optional[Sequence[str]] = None, text_name: Optional[str] = None, token_ids=None,
                   agreement_null: int = 10, progress: bool = True, log=None,
                   command: Optional[List[str]] = None) -> Dict:
    """Subspace PGA across models or training checkpoints, side by side (`repcap survey --pga`).

    The whole report of each source (`run_report`, in OUT/NN_name/, all with the same settings),
    then z per (layer, model) for every CCR variant with the top-PC readout mass, as a table
    (survey.md), a heatmap (pga_heatmap.png: models × layers) and trajectories against relative
    depth (pga_depth.png). For every two models that ran on the same tokens (a shared tokenizer,
    text and seed), their cross-model agreement (`pga.cross_model_agreement`: Spearman of their pair
    distances in their readout subspaces, in the full spaces and in random subspaces, after CCR with
    the first of settings.ccrs) at the relative depths AGREEMENT_DEPTHS, matching each model's layer
    nearest to depth·L. The hidden states of every model are kept until the agreement is computed
    (N × d × (L+1) float32 numbers per model).

    Args:
        sources (Sequence): paths, repo ids or aliases, or models in memory.
        out (str): the output folder. Default "repcap_survey".
        settings (ReportSettings | None): what each report computes; None: the papers' settings.
        texts (Sequence[str] | None): texts to sample tokens from instead of the bundled corpus.
            Default None.
        text_name (str | None): the texts' name in the reports. Default None.
        token_ids (object): token ids instead of a text. Default None.
        agreement_null (int): random subspaces drawn for the agreement's null. Default 10.
        progress (bool): show progress bars. Default True.
        log (Callable[[str], None] | None): receives one line per stage. Default None: the lines go to the
            ``repcap_fast.report`` logger at INFO (``repcap`` prints them; configure ``logging`` to see them).
        command (list[str] | None): the command line, recorded in the provenance. Default None.

    Returns:
        dict: the survey (as survey.json holds it): provenance, complete, models (z per CCR and
        layer, top-PC readout mass, relative depth, report path), agreement, agreement_depths, seconds.

    Raises:
        ValueError: no source, texts and token_ids both given (or with settings.text_file), a source
            without an embedding tensor or config, a probe file that cannot be cross-validated, an
            output that is an input, or what `run_report` raises.
        FileNotFoundError: a source is not on this machine.

    Examples:
        >>> doc = rf.report.run_pga_survey(["minilm", "smollm2"], "pga_survey")  # doctest: +SKIP
        >>> doc["agreement"][0]["layers"][-1]["readout"]  # doctest: +SKIP
        0.4...

        Skipped: it runs the whole report of each model (minutes).
    """
    if not sources:
        raise ValueError("survey needs at least one SOURCE")
    log = _log_to(log)
    settings = settings or ReportSettings()
    agreement_null = val.check_n_null(agreement_null)
    sources = [in_memory_source(source) if is_in_memory(source) else source for source in sources]
    for source in sources:  # every source's header and tensor names checked before the first model loads
        if not is_in_memory(source):
            if settings.init == "trained":
                check_embeddings(source, which="input", n_rows=settings.n_rows)
            else:  # a random init needs only the config and a tokenizer: no weights to check
                resolve_source(source)
    if settings.probe_file is not None:
        check_probe_file(settings.probe_file, settings.probe_folds)
    if texts is not None and token_ids is not None:
        raise ValueError("pass texts or token_ids, not both")
    if (texts is not None or token_ids is not None) and settings.text_file is not None:
        raise ValueError(f"pass {'texts' if texts is not None else 'token_ids'} or settings.text_file "
                         f"({settings.text_file!r}), not both: the reports would sample only one of them")
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in SURVEY_FILES],
                     [(f"source {s!r}", s if isinstance(s, (str, os.PathLike)) else None) for s in sources]
                     + _report_inputs(None, settings))
    folders = [f"{i:02d}_{_slug(_source_label(source) or 'default')}" for i, source in enumerate(sources)]
    _remove_earlier_survey_reports(out, folders)
    remove_stale(out, SURVEY_FILES)  # survey.json is rewritten as each model finishes
    t_all = time.perf_counter()
    runs = []
    for i, source in enumerate(sources):
        label, folder = _source_label(source) or "default", folders[i]
        log(f"=== {i + 1}/{len(sources)}: {label}")
        keep: Dict = {}
        try:
            rep = run_report(source, os.path.join(out, folder), settings, texts=texts, text_name=text_name,
                             token_ids=token_ids, progress=progress, log=log, command=command, _keep=keep)
        except Exception as exc:  # the file says which source failed, and why
            _write_failed(out, {
                "provenance": _provenance(command, {"sources": [_source_label(s) or "default" for s in sources],
                                                    **settings.to_dict(), "agreement_null": agreement_null}),
                "complete": False, "pending": [_source_label(s) or "default" for s in sources[i:]],
                "models": [_survey_row(lab, fol, r) for lab, fol, r, _ in runs]}, label, exc)
            raise
        runs.append((label, folder, rep, keep))
        if i + 1 < len(sources):  # partial results, marked as such, as each model finishes
            write_json_atomic(os.path.join(out, "survey.json"), _clean({
                "provenance": _provenance(command, {"sources": [_source_label(s) or "default" for s in sources],
                                                    **settings.to_dict(), "agreement_null": agreement_null}),
                "complete": False, "pending": [_source_label(s) or "default" for s in sources[i + 1:]],
                "models": [_survey_row(lab, fol, r) for lab, fol, r, _ in runs]}), indent=1, allow_nan=False)
    models = [_survey_row(label, folder, rep) for label, folder, rep, _ in runs]
    agreement = []
    with_states = [(i, label, rep, keep) for i, (label, _, rep, keep) in enumerate(runs) if "states" in keep]
    pairs = [(a, b) for i, a in enumerate(with_states) for b in with_states[i + 1:]]
    ccr = settings.ccrs[0]
    for (ia, la, ra, ka), (ib, lb, rb, kb) in pairs:
        names = {"a": la, "b": lb, "a_index": ia, "b_index": ib}
        if ra["hidden_states"]["token_ids"] != rb["hidden_states"]["token_ids"]:
            agreement.append({**names, "skipped": "the two models ran on different tokens (another tokenizer, text "
                              "or seed): their pair distances cannot be compared"})
            continue
        na, nb = ka["states"].layers[-1], kb["states"].layers[-1]
        rows = []
        for depth in AGREEMENT_DEPTHS:
            layer_a, layer_b = _nearest(ka["states"].layers, depth * na), _nearest(kb["states"].layers, depth * nb)
            if rows and rows[-1]["layer_a"] == layer_a and rows[-1]["layer_b"] == layer_b:
                continue
            log(f"   agreement {la} layer {layer_a} vs {lb} layer {layer_b}")
            res = cross_model_agreement(ka["states"][layer_a], kb["states"][layer_b], ka["basis"], kb["basis"],
                                        n_null=agreement_null, ccr=ccr, seed=settings.seed)
            rows.append({"depth": depth, "layer_a": layer_a, "layer_b": layer_b,
                         **{k: res[k] for k in ("readout", "full", "random_mean", "random_std", "ccr")}})
        agreement.append({**names, "n_tokens": len(ra["hidden_states"]["token_ids"]), "layers": rows})
    doc = _clean({"provenance": _provenance(command, {"sources": [m["source"] for m in models],
                                                       **settings.to_dict(), "agreement_null": agreement_null}),
                  "complete": True, "models": models, "agreement": agreement,
                  "agreement_depths": list(AGREEMENT_DEPTHS), "seconds": time.perf_counter() - t_all})
    write_json_atomic(os.path.join(out, "survey.json"), doc, indent=1, allow_nan=False)
    with_pga = [m for m in doc["models"] if m["z"]]
    if with_pga:
        plotting.plot_pga_survey(with_pga, os.path.join(out, "pga_heatmap.png"), os.path.join(out, "pga_depth.png"))
    with open(os.path.join(out, "survey.md"), "w", encoding="utf-8") as fh:
        fh.write(pga_survey_markdown(doc))
    log(f"== wrote {out}/survey.json, survey.md" + (", pga_heatmap.png and pga_depth.png" if with_pga else "")
        + f" (each model's report in {out}/NN_name/)")
    return doc


def _remove_earlier_survey_reports(out: str, folders: Sequence[str]) -> None:
    """Removes the report files of an earlier PGA survey in OUT that this survey will not rewrite.

    The folders its survey.json lists: so no model of an earlier survey looks like one of this
    one. Other files there are never touched.
    """
    try:
        with open(os.path.join(out, "survey.json"), encoding="utf-8") as fh:
            earlier = [m.get("report", "") for m in json.load(fh).get("models", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return  # no earlier survey here (or not one of ours)
    for path in earlier:
        folder = os.path.dirname(path) if isinstance(path, str) else ""
        if folder and folder not in folders and os.path.basename(folder) == folder and \
                os.path.isdir(os.path.join(out, folder)):
            remove_stale(os.path.join(out, folder), REPORT_FILES)


def _nearest(layers: Sequence[int], target: float) -> int:
    return min(layers, key=lambda layer: (abs(layer - target), layer))


def _survey_row(label: str, folder: str, rep: Dict) -> Dict:
    e = rep["epsilon"]["input"]
    row = {"source": label, "report": f"{folder}/report.json", "d_model": e["shape"][1], "vocab_rows": e["shape"][0],
           "epsilon": e["epsilon"], "epsilon_exact": e["exact"]["epsilon"], "class": e["class"], "z": {},
           "layers": [], "top_pc_readout_mass": [], "relative_depth": []}
    if "profile" in rep.get("pga", {}):
        prof = rep["pga"]["profile"]
        row["layers"] = [r["layer"] for r in next(iter(prof.values()))]
        last = max(row["layers"][-1], 1)
        row["relative_depth"] = [layer / last for layer in row["layers"]]
        row["z"] = {ccr: [r["z"] for r in rows] for ccr, rows in prof.items()}
        row["top_pc_readout_mass"] = [r["readout_alignment_top"][0] for r in rep["spectral"]["layers"]]
        row["last_layer"] = rep["pga"]["last_layer"]["point"]
        if rep.get("probe") and "layers" in rep["probe"]:
            row["probe_accuracy"] = [r["accuracy"] for r in rep["probe"]["layers"]]
    else:
        row["skipped"] = rep.get("pga", {}).get("skipped")
    return row


def pga_survey_markdown(doc: Dict) -> str:
    """The readable summary of a PGA survey (survey.md of `run_pga_survey`).

    A table of the models with links to their reports, z per layer and model for every CCR
    variant, the top principal direction's readout mass, and the cross-model agreement.

    Args:
        doc (dict): a survey as `run_pga_survey` returns it.

    Returns:
        str: the markdown text.

    Raises:
        KeyError: the dict is not a PGA survey ("provenance", "models", "agreement").

    Examples:
        >>> doc = rf.report.run_pga_survey(["minilm", "smollm2"], "pga_survey")  # doctest: +SKIP
        >>> print(rf.report.pga_survey_markdown(doc).splitlines()[0])  # doctest: +SKIP
        # repcap survey: Subspace PGA across models

        Skipped: the survey runs the whole report of each model (minutes).
    """
    s = doc["provenance"]["settings"]
    lines = ["# repcap survey: Subspace PGA across models", "",
             f"k = {s['k']}, {s['n_null']} null subspaces, {s['n_tokens']} tokens, seed {s['seed']}, CCR "
             f"{', '.join(map(str, s['ccrs']))}; the last layer at `{s['last_layer']}`. Each model's full report is "
             f"linked below.", "",
             "| model | d_model | V | ε | layers | report |", "|---|---|---|---|---|---|"]
    for m in doc["models"]:
        lines.append(f"| {m['source']} | {m['d_model']} | {m['vocab_rows']} | {_fmt(m['epsilon'])} | "
                     f"{len(m['layers']) or 'n/a'} | [{m['report']}]({m['report']}) |")
    for ccr in s["ccrs"]:
        with_z = [m for m in doc["models"] if str(ccr) in m["z"]]
        if not with_z:
            continue
        depth = max(len(m["layers"]) for m in with_z)
        lines += ["", f"## z per layer, CCR-{ccr}", "", "| layer | " + " | ".join(m["source"] for m in with_z) + " |",
                  "|---|" + "---|" * len(with_z)]
        for i in range(depth):
            lines.append(f"| {i} | " + " | ".join(_fmt(m["z"][str(ccr)][i], ".2f") if i < len(m["layers"]) else ""
                                                  for m in with_z) + " |")
    with_mass = [m for m in doc["models"] if m["top_pc_readout_mass"]]
    if with_mass:
        depth = max(len(m["layers"]) for m in with_mass)
        lines += ["", "## Top principal direction's mass in the readout subspace", "",
                  "| layer | " + " | ".join(m["source"] for m in with_mass) + " |", "|---|" + "---|" * len(with_mass)]
        for i in range(depth):
            lines.append(f"| {i} | " + " | ".join(_fmt(m["top_pc_readout_mass"][i], ".3f") if i < len(m["layers"])
                                                  else "" for m in with_mass) + " |")
    for m in doc["models"]:
        if m.get("skipped"):
            lines.append(f"\n{m['source']}: no Subspace PGA ({m['skipped']}).")
    if doc["agreement"]:
        lines += ["", "## Cross-model agreement", "",
                  "Spearman of the two models' pair distances on the same tokens: in their readout subspaces, in the "
                  "full spaces, and in random subspaces of the same dimension (mean ± std).", "",
                  "| models | depth | layers | readout | full | random |", "|---|---|---|---|---|---|"]
        for a in doc["agreement"]:
            if "skipped" in a:
                lines.append(f"| {a['a']} vs {a['b']} | | | {a['skipped']} | | |")
                continue
            for r in a["layers"]:
                lines.append(f"| {a['a']} vs {a['b']} | {r['depth']:.2f} | {r['layer_a']} / {r['layer_b']} | "
                             f"{_fmt(r['readout'])} | {_fmt(r['full'])} | {_fmt(r['random_mean'])} ± "
                             f"{_fmt(r['random_std'])} |")
    if any(m["z"] for m in doc["models"]):
        lines += ["", "![z heatmap](pga_heatmap.png)", "", "![z against relative depth](pga_depth.png)"]
    return "\n".join(lines + [""])
