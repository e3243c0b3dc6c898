"""The benchmark pages, generated from bench/results/ at build time (docs/hooks.py calls these).

- `overview_markdown()`: one section per op, led by a plot of seconds and peak memory against
  problem size (the fast paths against the naive torch baseline, one column of panels per machine
  kind), then a compact long-format table and the raw fields in a collapsed block.
- `machine_markdown("cpu" | "gpu")`: one section per result file of that machine kind: what it
  measured, on which machine and when, the benchmark script's own summary, its plots, and the raw
  fields collapsed.
- `plots()`: the PNGs those pages show, by file name, rendered with matplotlib (Agg).

The op records are read by one small reader per file layout (`_READERS`); `records()` is what the
plots and tables are drawn from, and what the tests check.
"""

from __future__ import annotations

import functools
import io
import json
import math
import pathlib
import re
from dataclasses import dataclass
from typing import Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PLOT_DIR = "plots"  # under benchmarks/ in the site
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|usr|opt|var|mnt|check|private|Users)/[^\s\"'`)]*")


@dataclass
class Record:
    """One timing: an op's variant at one problem size on one machine."""

    op: str
    kind: str  # "CPU" or "GPU"
    machine: str
    date: str
    variant: str
    size: float
    size_label: str
    dtype: str
    seconds: float
    peak_bytes: Optional[float]
    baseline: bool
    source: str


# ---------------------------------------------------------------- reading the files


@functools.lru_cache(maxsize=None)
def _load(path: pathlib.Path) -> dict:
    """A result file's JSON, read once per build (the overview, the plots and the file pages all
    read it; docs/hooks.py clears the cache before each build, so `mkdocs serve` sees new results)."""
    return json.loads(path.read_text(encoding="utf-8"))


def _meta(doc: dict) -> dict:
    return doc.get("machine") or doc.get("meta") or {}


def machine_of(doc: dict) -> str:
    """The machine a result file records, in words: the GPU, or the CPU and its cores; torch."""
    m = _meta(doc)
    parts = []
    gpu = m.get("gpu") or m.get("device") or (doc.get("device") if doc.get("device") not in (None, "cpu") else None)
    if gpu:
        parts.append(str(gpu))
    else:
        arch = next((a for a in ("x86_64", "aarch64", "arm64") if a in str(m.get("platform", ""))), "")
        cpu = m.get("processor") or (f"{arch} CPU" if arch else "CPU")
        parts.append(f"{cpu}, {m['cpu_count']} cores" if m.get("cpu_count") else cpu)
    if m.get("torch") or doc.get("torch"):
        parts.append(f"torch {m.get('torch') or doc.get('torch')}")
    return ", ".join(parts) if m or doc.get("torch") else "machine not recorded"


def date_of(doc: dict) -> str:
    m = _meta(doc)
    for value in (m.get("date_utc"), m.get("date"), doc.get("date")):
        if value:
            return str(value)[:10]
    return "date not recorded"


def _pairs_to_rows(pairs: int) -> int:
    return int(round((1 + math.sqrt(1 + 8 * pairs)) / 2))


def _cosine_cpu(doc, src):
    res = doc["results"]
    v_main = _pairs_to_rows(res["cpu"]["pairs"])
    for name, r in res.items():
        size = r.get("v", v_main)
        variant = "cpu" if name.startswith("scaling_V") else name
        yield dict(variant=variant, size=size, size_label="V (rows), d = 384", dtype="float32",
                   seconds=r["seconds"], peak_bytes=r.get("peak_extra_bytes"),
                   baseline=name.startswith("naive"))


def _cosine_gpu(doc, src):
    for r in doc["results"].values():
        if not isinstance(r, dict) or "d" not in r:
            continue
        for variant, value in r.items():
            if variant in ("v", "d", "dtype") or variant.endswith(("_peak_extra_bytes", "_note")):
                continue
            if isinstance(value, (int, float)):
                yield dict(variant=variant, size=r["d"], size_label=f"d (V = {r['v']:,})", dtype=r["dtype"],
                           seconds=value, peak_bytes=r.get(f"{variant}_peak_extra_bytes"),
                           baseline=variant.startswith("naive"))


def _by_variant(size_key: str, size_label: str, baseline: str):
    def read(doc, src):
        for variant, r in doc["results"].items():
            if not isinstance(r, dict) or "seconds" not in r:
                continue
            size = r.get(size_key, doc.get(size_key))
            dtype = "float32" + (f" ({variant.split(':')[1]})" if ":" in variant else "")
            label = size_label.format(**{**doc, **r})
            yield dict(variant=variant, size=size, size_label=label, dtype=dtype, seconds=r["seconds"],
                       peak_bytes=r.get("peak_extra_bytes"), baseline=variant == baseline)
    return read


def _training_step(doc, src):
    for r in doc["results"]:
        if r.get("seconds") is None:
            continue
        yield dict(variant=r["form"], size=r["k"], size_label=f"k (rows of the batch), d = {r['d']}",
                   dtype="float32", seconds=r["seconds"], peak_bytes=r.get("peak_extra_bytes"),
                   baseline=r["form"] == "naive")


# op -> (title, what a size is, the readers of its files by name pattern)
OPS: dict[str, tuple[str, str, list[tuple[str, Callable]]]] = {
    "pairwise_cosine_stats": (
        "Pairwise cosine statistics", "all V(V−1)/2 pairs of a V×d matrix",
        [("cosine_stats_cpu.json", _cosine_cpu), ("cosine_stats_gpu.json", _cosine_gpu)]),
    "gram_offdiag_penalty": (
        "Gram off-diagonal penalty, forward + backward", "k×d, p = 8",
        [("penalty_cpu.json", _by_variant("k", "k (rows), d = {d}", "torch_autograd")),
         ("penalty_gpu.json", _by_variant("k", "k (rows), d = {d}", "torch_autograd"))]),
    "subspace_pga": (
        "Subspace PGA, readout + null subspaces", "N tokens, d, k, 100 nulls",
        [("pga_cpu.json", _by_variant("N", "N (tokens), d = {d}, k = {k}", "naive_torch")),
         ("pga_gpu.json", _by_variant("N", "N (tokens), d = {d}, k = {k}", "naive_torch"))]),
    "training_step": (
        "The penalty in a compiled training step", "a batch of k rows",
        [("training_step_cpu.json", _training_step)]),
}


# The variants each plot draws (every variant is in the table): the fast paths, the floor and the
# baseline, by op and machine kind; None draws all.
PLOTTED: dict[tuple[str, str], Optional[dict[str, str]]] = {
    ("pairwise_cosine_stats", "CPU"): {"cpu": "cpu (C++ kernel)", "cosine_moments": "cosine_moments (Gram identity)",
                                       "matmul_upper_triangle": "GEMM of the pairs (floor)",
                                       "naive_torch_fp32": "naive torch"},
    ("pairwise_cosine_stats", "GPU"): {"cuda": "cuda (tiles)", "cuda_panels": "cuda (panels)",
                                       "triton_grouped_tma": "triton (grouped, TMA)", "gemm_floor": "GEMM (floor)",
                                       "naive_torch": "naive torch"},
}


def gpu_runs() -> list[pathlib.Path]:
    """The folders of the GPU runs, oldest first."""
    return sorted(p for p in RESULTS.glob("gpu_*") if p.is_dir())


def _files(kind: str) -> list[pathlib.Path]:
    if kind == "CPU":
        return sorted(RESULTS.glob("*.json"))
    runs = gpu_runs()
    return sorted(runs[-1].glob("*.json")) if runs else []  # the plots show the newest GPU run


def records(op: str) -> list[Record]:
    """Every timing of `op` in the CPU results and the newest GPU run."""
    out = []
    for kind in ("CPU", "GPU"):
        for path in _files(kind):
            for name, reader in OPS[op][2]:
                if path.name != name:
                    continue
                doc = _load(path)
                for r in reader(doc, path):
                    out.append(Record(op=op, kind=kind, machine=machine_of(doc), date=date_of(doc),
                                      source=path.relative_to(ROOT).as_posix(), **r))
    return out


# ---------------------------------------------------------------- plots


def _mib(b) -> str:
    return "–" if b is None else f"{b / 2**20:,.1f} MiB" if b < 2**30 else f"{b / 2**30:,.2f} GiB"


def _label(r: Record) -> str:
    names = PLOTTED.get((r.op, r.kind))
    return names[r.variant] if names else r.variant


def _panel(ax, recs: list[Record], field: str, ylabel: str) -> None:
    scale = 2**20 if field == "peak_bytes" else 1
    data = [r for r in recs if getattr(r, field) is not None and getattr(r, field) > 0]
    variants = list(dict.fromkeys(r.variant for r in data))
    sizes = sorted({r.size for r in data})
    if len(sizes) > 1:
        for v in variants:
            pts = sorted((r.size, getattr(r, field) / scale) for r in data if r.variant == v)
            rv = next(r for r in data if r.variant == v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=2.4 if rv.baseline else 1.6,
                    ls="--" if rv.baseline else "-", label=_label(rv), color="black" if rv.baseline else None)
        ax.set_xscale("log" if sizes[-1] / sizes[0] >= 10 else "linear")
        ax.set_xlabel(recs[0].size_label)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7.5)
    else:
        data = sorted(data, key=lambda r: getattr(r, field))
        values = [getattr(r, field) / scale for r in data]
        ys = list(range(len(data)))
        log = max(values) / min(values) >= 20
        left = min(values) / 4 if log else 0
        ax.barh(ys, [v - left for v in values], left=left, color=["black" if r.baseline else "tab:blue" for r in data])
        ax.set_yticks(ys, [_label(r) for r in data], fontsize=9)
        unit = " MiB" if scale > 1 else " s"
        for y, v in zip(ys, values):
            ax.text(v, y, f" {v:,.0f}{unit}" if v >= 1000 else f" {v:.3g}{unit}", va="center", fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.set_xlim(left, max(values) * (3 if log else 1.25))
        what = recs[0].size_label.split(" (")[0].split(",")[0]
        axis = f"{ylabel}{', log scale' if log else ''}"
        ax.set_xlabel(f"{axis} ({what} = {int(sizes[0]):,})" if sizes else axis)
    ax.grid(True, which="both", alpha=0.3)


def _groups(recs: list[Record]) -> list[tuple[str, Optional[str]]]:
    """The panel columns: one per machine kind, split by dtype where a kind has several (and sizes)."""
    out = []
    for kind in ("CPU", "GPU"):
        rk = [r for r in recs if r.kind == kind]
        dtypes = list(dict.fromkeys(r.dtype for r in rk))
        if len(dtypes) > 1 and len({r.size for r in rk}) > 1:
            out += [(kind, dt) for dt in dtypes]
        elif rk:
            out.append((kind, None))
    return out


def op_plot(op: str) -> bytes:
    """The PNG of `op`: seconds (left) and peak memory (right), a row per machine kind (and dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records(op) if PLOTTED.get((op, r.kind)) is None or r.variant in PLOTTED[(op, r.kind)]]
    groups = _groups(recs)
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3.9 * len(groups)), squeeze=False)
    for row, (kind, dtype) in enumerate(groups):
        rk = [r for r in recs if r.kind == kind and (dtype is None or r.dtype == dtype)]
        title = f"{kind}{', ' + dtype if dtype else ''}: {rk[0].machine}, {rk[0].date}"
        _panel(axes[row][0], rk, "seconds", "seconds")
        axes[row][0].set_title(title, fontsize=9)
        if any(r.peak_bytes for r in rk):
            _panel(axes[row][1], rk, "peak_bytes", "peak extra memory (MiB)")
            axes[row][1].set_title(title, fontsize=9)
        else:
            axes[row][1].set_axis_off()
            axes[row][1].text(0.5, 0.5, "peak memory not recorded in this run", ha="center", va="center")
    fig.suptitle(f"{OPS[op][0]}: lower is better; the naive torch baseline in black", fontsize=12)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def plots() -> dict[str, bytes]:
    """Every PNG the benchmark pages show, by its file name under benchmarks/plots/."""
    out = {f"{op}.png": op_plot(op) for op in OPS if records(op)}
    for png in sorted(RESULTS.rglob("*.png")):  # the plots the benchmark scripts wrote
        out[_png_name(png)] = png.read_bytes()
    return out


def _png_name(png: pathlib.Path) -> str:
    return png.relative_to(RESULTS).as_posix().replace("/", "__")


# ---------------------------------------------------------------- tables


def _fmt_seconds(s: float) -> str:
    return f"{s:.3g}" if s < 100 else f"{s:,.0f}"


def long_table(recs: list[Record]) -> list[str]:
    """variant | size | dtype | seconds | × naive | peak memory: one row per timing, a table per
    machine kind, under a line that names the machine and the date."""
    lines = []
    for kind in dict.fromkeys(r.kind for r in recs):
        rk = [r for r in recs if r.kind == kind]
        lines += [f"**{kind}**: {rk[0].machine}, {rk[0].date}; size is {rk[0].size_label}.", "",
                  '<div class="bench-table" markdown>', "",
                  "| variant | size | dtype | seconds | × naive | peak memory |", "|---|---:|---|---:|---:|---:|"]
        for r in rk:
            base = [b for b in rk if b.baseline and b.size == r.size and b.dtype.split()[0] == r.dtype.split()[0]]
            ratio = f"{base[0].seconds / r.seconds:.2f}×" if base else "–"
            lines.append(f"| {r.variant} | {int(r.size):,} | {r.dtype} | {_fmt_seconds(r.seconds)} | {ratio} | "
                         f"{_mib(r.peak_bytes)} |")
        lines += ["", "</div>", ""]
    return lines


def _raw_block(path: pathlib.Path, indent: str = "") -> list[str]:
    """The file's fields, pretty-printed, in a collapsed block."""
    text = json.dumps(_load(path), indent=1, ensure_ascii=False)
    rel = path.relative_to(ROOT).as_posix()
    body = [f'??? note "Raw fields of {rel}"', "", "    ```json", *("    " + line for line in text.splitlines()),
            "    ```", ""]
    return [indent + line if line else line for line in body]


def overview_markdown() -> str:
    """One section per op: the plot, the long table, the raw fields."""
    out = []
    for op, (title, size_words, _readers) in OPS.items():
        recs = records(op)
        if not recs:
            continue
        caption = "; ".join(dict.fromkeys(f"{r.kind}: {r.machine}, {r.date}" for r in recs))
        out += [f"## {title} {{#{op}}}\n", f"`{op}`, {size_words}.\n",
                f"![{title}: seconds and peak memory against size]({PLOT_DIR}/{op}.png)\n",
                f'<p class="bench-caption">{caption}. Files: '
                + ", ".join(dict.fromkeys(f"<code>{r.source}</code>" for r in recs)) + ".</p>\n"]
        sources = list(dict.fromkeys(r.source for r in recs))
        out += [note for src in sources for note in _notes(_load(ROOT / src))]
        out += long_table(recs)
        for src in sources:
            out += _raw_block(ROOT / src)
    return "\n".join(out)


def _notes(doc: dict) -> list[str]:
    """What a reader must know to read a file's timings, from the file itself."""
    out = []
    oom = {form: k for form, k in (doc.get("first_k_out_of_memory") or {}).items() if k}
    for form, k in oom.items():
        out.append(f"The {form} step ran out of memory at k = {k:,}: its curve stops there.\n")
    results = doc.get("results")
    rows = results.values() if isinstance(results, dict) else results or []
    notes = {r.get("naive_note") for r in rows if isinstance(r, dict)} - {None}
    for note in sorted(notes):
        out.append(f"GPU naive baseline: {note}.\n")
    return out


def _summary_lines(doc: dict) -> list[str]:
    table = doc.get("table")
    if isinstance(table, list) and all(isinstance(t, str) for t in table):
        return ["```text", *(t.rstrip() for t in table), "```", ""]
    return []


def _pngs_of(path: pathlib.Path) -> list[pathlib.Path]:
    """The plots a result file's script wrote beside it: `stem.png` and `stem_*.png`, less those of a
    sibling file whose stem is longer (packing_fit_cpu_small_minimax_jl.png is not packing_fit_cpu_small's)."""
    siblings = [j.stem for j in path.parent.glob("*.json") if j.stem != path.stem and j.stem.startswith(path.stem)]
    return [png for png in sorted(path.parent.glob(f"{path.stem}*.png"))
            if (png.stem == path.stem or png.stem.startswith(path.stem + "_"))
            and not any(png.stem == s or png.stem.startswith(s + "_") for s in siblings)]


def file_section(path: pathlib.Path, level: str = "###") -> str:
    """The section of one result file: what, where, when; its summary, its plots, its raw fields."""
    doc = _load(path)
    rel = path.relative_to(ROOT).as_posix()
    what = doc.get("op") or doc.get("what") or doc.get("command") or path.stem.replace("_", " ")
    if isinstance(what, list):
        what = " ".join(map(str, what))
    out = [f"{level} {path.stem}\n", f"`{rel}`: {what}. Machine: {machine_of(doc)}; {date_of(doc)}.\n"]
    op = next((o for o, spec in OPS.items() for name, _ in spec[2] if name == path.name), None)
    if op:
        out.append(f"Plotted with the other machine kinds in [the overview](index.md#{op}).\n")
    out += _summary_lines(doc)
    for png in _pngs_of(path):
        out.append(f"![{png.stem}]({PLOT_DIR}/{_png_name(png)})\n")
    out += _raw_block(path)
    return "\n".join(out)


def machine_markdown(which: str) -> str:
    """Every result file of the CPU (`which="cpu"`) or of each GPU run (`"gpu"`)."""
    if which == "cpu":
        return "\n".join(file_section(f) for f in sorted(RESULTS.glob("*.json")))
    if which == "gpu":
        out = []
        for run in reversed(gpu_runs()):  # newest first
            out.append(f"## {run.name}\n")
            out += [file_section(f) for f in sorted(run.glob("*.json"))]
        return "\n".join(out)
    raise ValueError(f"benchmarks: expected cpu or gpu, got {which!r}")


def machine_paths(text: str) -> list[str]:
    """The absolute paths of a machine found in `text` (what no page may show)."""
    return MACHINE_PATH.findall(text)
