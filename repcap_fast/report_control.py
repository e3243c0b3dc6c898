"""A model beside its random-init control (`repcap report --control random`): both whole reports
and their comparison (`run_control_report`)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Dict, List, Optional

from . import _validation as val
from . import plotting
from ._outputs import StagedFolder, check_no_clobber, remove_stale
from .report import REPORT_FILES, ReportSettings, _clean, _provenance, _report_inputs, _source_label, run_report
from .report_markdown import _fmt


def run_control_report(source=None, out: str = "repcap_report", settings: Optional[ReportSettings] = None, *,
                       progress: bool = True, log=print, command: Optional[List[str]] = None, **kwargs) -> Dict:
    """A model and its random-init control, side by side: the whole report of the weights in
    OUT/trained, of the same architecture at initialization (settings.seed) in OUT/random_init,
    and OUT/report.json, OUT/report.md and OUT/pga_control.png comparing them: ε of both, and z per
    layer of both in one plot. Both analyses use the same settings, the same token sample and the
    same null subspaces (the same seed), so they differ only in the weights. kwargs: as for
    `run_report` (texts, text_name, token_ids, tokenizer). Returns the comparison dict, with the
    two reports under "trained" and "random_init"."""
    settings = settings or ReportSettings()
    if settings.init != "trained":
        raise ValueError(f"a control report analyses the weights and a random init of them: settings.init must be "
                         f"'trained', got {settings.init!r}")
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in REPORT_FILES],
                     _report_inputs(source, settings))
    t0 = time.perf_counter()
    reports = {}
    provenance = _provenance(command, {"source": _source_label(source), **settings.to_dict(), "control": "random"})
    staged = StagedFolder(out, REPORT_FILES)  # the comparison replaces every file of an earlier run in out
    names, started = ("trained", "random_init"), []
    try:
        for name, init in zip(names, ("trained", "random")):
            log(f"=== {name.replace('_', ' ')}")
            started.append(name)
            reports[name] = run_report(source, os.path.join(out, name), dataclasses.replace(settings, init=init),
                                       progress=progress, log=log, command=command, **kwargs)
    except BaseException as exc:  # out/report.json says which analysis failed; no earlier comparison stays
        for name in names:  # an analysis not reached: an earlier run's report there would look like this one's
            if name not in started and os.path.isdir(os.path.join(out, name)):
                remove_stale(os.path.join(out, name), REPORT_FILES)
        provenance["seconds"] = {"total": time.perf_counter() - t0}
        with staged, open(staged.path("report.json"), "w", encoding="utf-8") as fh:
            json.dump(_clean({"provenance": provenance, "complete": False, "error": f"{type(exc).__name__}: {exc}",
                              "failed": started[-1], "reports": {name: f"{name}/report.json" for name in started},
                              **reports}), fh, indent=1, allow_nan=False)
        raise
    doc = {"provenance": provenance, "complete": True, "reports": {name: f"{name}/report.json" for name in reports},
           **reports}
    doc["comparison"] = _control_comparison(reports["trained"], reports["random_init"])
    doc["provenance"]["seconds"] = {"total": time.perf_counter() - t0}
    doc = _clean(doc)
    with staged:  # published into OUT at the end of the block, or discarded if a write fails
        with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, allow_nan=False)
        if doc["comparison"]["pga"]:
            plotting.plot_pga_control({"trained": reports["trained"]["pga"]["profile"],
                                       f"random init (seed {settings.seed})": reports["random_init"]["pga"]["profile"]},
                                      staged.path("pga_control.png"),
                                      f"{doc['trained']['model']['source']}: trained vs random init, Subspace PGA")
        with open(staged.path("report.md"), "w", encoding="utf-8") as fh:
            fh.write(control_markdown(doc))
    log(f"== wrote {out}/report.json, report.md and pga_control.png (each analysis in {out}/trained and "
        f"{out}/random_init)")
    return doc


def _control_comparison(trained: Dict, random: Dict) -> Dict:
    """ε of both (streamed and exact, input and output) and z per (CCR, layer) of both."""
    eps = {}
    for key in ("input", "output"):
        a, b = trained["epsilon"].get(key), random["epsilon"].get(key)
        if a and b:
            eps[key] = {name: {"epsilon": r["epsilon"], "exact": r["exact"]["epsilon"], "mean": r["stream"]["mean"],
                               "std": r["stream"]["std"], "class": r["class"]}
                        for name, r in (("trained", a), ("random_init", b))}
    pga = {}
    if "profile" in trained.get("pga", {}) and "profile" in random.get("pga", {}):
        for ccr, rows in trained["pga"]["profile"].items():
            other = {r["layer"]: r for r in random["pga"]["profile"][ccr]}
            pga[ccr] = [{"layer": r["layer"], "z_trained": r["z"], "z_random_init": other[r["layer"]]["z"],
                         "rho_trained": r["rho_readout"], "rho_random_init": other[r["layer"]]["rho_readout"]}
                        for r in rows]
    return {"epsilon": eps, "pga": pga}


def control_markdown(doc: Dict) -> str:
    """A readable summary of a control report (`run_control_report`)."""
    t = doc["trained"]
    c = doc["comparison"]
    lines = [f"# repcap report: {t['model']['source']}, trained and at random initialization", "",
             f"- the weights: [trained/report.md](trained/report.md); the same architecture at initialization "
             f"(seed {doc['provenance']['settings']['seed']}): [random_init/report.md](random_init/report.md)",
             f"- {doc['provenance']['time_utc']}, repcap_fast {doc['provenance']['versions']['repcap_fast']}", "",
             "## ε", "", "| matrix | ε trained | ε random init | exact trained | exact random init | class trained | "
             "class random init |", "|---|---|---|---|---|---|---|"]
    for key, row in c["epsilon"].items():
        a, b = row["trained"], row["random_init"]
        lines.append(f"| {key} | {_fmt(a['epsilon'], '.6f')} | {_fmt(b['epsilon'], '.6f')} | "
                     f"{_fmt(a['exact'], '.6f')} | {_fmt(b['exact'], '.6f')} | {a['class']} | {b['class']} |")
    if c["pga"]:
        ccrs = list(c["pga"])
        lines += ["", "## Subspace PGA: z per layer", "",
                  "| layer | " + " | ".join(f"CCR-{k} trained | CCR-{k} random init" for k in ccrs) + " |",
                  "|---|" + "---|---|" * len(ccrs)]
        for i, row in enumerate(c["pga"][ccrs[0]]):
            cells = " | ".join(f"{_fmt(c['pga'][k][i]['z_trained'], '.2f')} | "
                               f"{_fmt(c['pga'][k][i]['z_random_init'], '.2f')}" for k in ccrs)
            lines.append(f"| {row['layer']} | {cells} |")
        lines += ["", "![z trained vs random init](pga_control.png)"]
    else:
        lines += ["", "No Subspace PGA: " + str(doc["trained"].get("pga", {}).get("skipped", "not run")) + "."]
    return "\n".join(lines + [""])
