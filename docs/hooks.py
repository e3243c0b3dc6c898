"""mkdocs hooks: the pages that are generated at build time, never copied by hand.

A page asks for generated content with a marker line:

    <!-- generated: api repcap_fast.pga -->   one mkdocstrings entry per name in the module's __all__
    <!-- generated: cli -->                   `repcap --help` and the help of every subcommand
    <!-- generated: benchmarks cpu -->        the tables of bench/results/*.json
    <!-- generated: benchmarks gpu -->        the tables of bench/results/gpu_*/*.json, one run each
    <!-- generated: notebook examples/x.ipynb --> the notebook's cells and saved outputs (plots inline)

The functions are plain Python so that the tests can check the generated pages (every public
name in the API reference) without building the site.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import logging
import pathlib
import re
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MARKER = re.compile(r"^<!-- generated: (\w+)\s*(.*?)\s*-->\s*$", re.M)


# ---------------------------------------------------------------- API reference


def public_names(modname: str) -> list[str]:
    """The module's public names, as its __all__ lists them (modules excluded: they have pages)."""
    mod = importlib.import_module(modname)
    names = getattr(mod, "__all__", None)
    if names is None:
        raise RuntimeError(f"{modname} has no __all__: the API reference cannot list its public names")
    return [n for n in names if not isinstance(getattr(mod, n), types.ModuleType)]


def api_markdown(modname: str) -> str:
    """One mkdocstrings entry per public name of `modname`, grouped: functions, classes, constants."""
    mod = importlib.import_module(modname)
    groups: dict[str, list[str]] = {"Functions": [], "Classes": [], "Constants": []}
    for n in public_names(modname):
        obj = getattr(mod, n)
        if inspect.isclass(obj):
            groups["Classes"].append(n)
        elif callable(obj):
            groups["Functions"].append(n)
        else:
            groups["Constants"].append(n)
    out = []
    for title, names in groups.items():
        if not names:
            continue
        out.append(f"## {title}\n")
        for n in names:
            out.append(f"::: {modname}.{n}\n    options:\n      heading_level: 3\n")
    return "\n".join(out)


# ---------------------------------------------------------------- command line


def cli_markdown() -> str:
    """`repcap --help` and `repcap <subcommand> --help`, generated from the parser itself."""
    import argparse

    from repcap_fast.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = ["## repcap\n", "```text", parser.format_help().rstrip(), "```\n"]
    for name, p in sub.choices.items():
        out += [f"## repcap {name}\n", "```text", p.format_help().rstrip(), "```\n"]
    return "\n".join(out)


# ---------------------------------------------------------------- benchmarks


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _flatten(d: dict, left: set, prefix: str = "", depth: int = 0) -> dict:
    """The scalar fields of a record, nested records one level deep as `outer.inner` columns.
    The names of what is not tabulated (lists, deeper records) go into `left`."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if _scalar(v):
            out[key] = v
        elif isinstance(v, dict) and depth < 1:
            out.update(_flatten(v, left, f"{key}.", depth + 1))
        else:
            left.add(key)
    return out


def _table(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    return lines + [""]


def _machine(doc: dict) -> str:
    m = doc.get("machine") or doc.get("meta") or {}
    parts = []
    for key in ("date_utc", "date"):
        if key in m or key in doc:
            parts.append(str(m.get(key, doc.get(key))))
            break
    for key in ("gpu", "device", "processor"):
        val = m.get(key, doc.get(key))
        if val:
            parts.append(str(val))
            break
    if m.get("cpu_count"):
        parts.append(f"{m['cpu_count']} CPUs")
    torch_v = m.get("torch", doc.get("torch"))
    if torch_v:
        parts.append(f"torch {torch_v}")
    return ", ".join(parts) if parts else "machine not recorded in the file"


def bench_file_markdown(path: pathlib.Path) -> str:
    """The tables of one bench result file, generated from its JSON."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT).as_posix()
    title = doc.get("op") or doc.get("what") or doc.get("command") or path.stem
    out = [f"### {path.stem}\n", f"`{rel}`: {_fmt(title)}. Machine: {_machine(doc)}.\n"]
    if isinstance(doc.get("table"), list) and all(isinstance(t, str) for t in doc["table"]):
        out += ["```text", *doc["table"], "```\n"]
    tabulated = {"table", "machine", "meta", "op", "what", "command", "date", "device", "torch"}
    left: set = set()
    for key in ("ratios", "fits", "overall", "results", "cells", "rows", "frames"):
        val = doc.get(key)
        if isinstance(val, dict) and val:
            if all(_scalar(v) for v in val.values()):
                out += [f"**{key}**\n", *_table([val])]
                tabulated.add(key)
            elif all(isinstance(v, dict) for v in val.values()):
                out += [f"**{key}**\n", *_table([{"": k, **_flatten(v, left, f"{k}: ")} for k, v in val.items()])]
                tabulated.add(key)
        elif isinstance(val, list) and val and all(isinstance(v, dict) for v in val):
            out += [f"**{key}**\n", *_table([_flatten(v, left) for v in val])]
            tabulated.add(key)
    left |= {k for k in doc if k not in tabulated and not _scalar(doc[k])}
    scalars = {k: v for k, v in doc.items() if k not in tabulated and _scalar(v)}
    if scalars:
        out += ["**settings**\n", *_table([scalars])]
    if left:
        out.append(f"Not tabulated here (lists or nested records; they are in the JSON file): "
                   f"{', '.join(f'`{k}`' for k in sorted(left))}.\n")
    return "\n".join(out)


def _gpu_dirs() -> list[pathlib.Path]:
    return sorted(p for p in RESULTS.glob("gpu_*") if p.is_dir())


def benchmarks_markdown(which: str) -> str:
    """Every bench result of the CPU (`which="cpu"`) or of each GPU run (`"gpu"`), as tables."""
    if which == "cpu":
        files = sorted(RESULTS.glob("*.json"))
        return "\n".join(bench_file_markdown(f) for f in files)
    if which == "gpu":
        out = []
        for run in _gpu_dirs():
            out.append(f"## {run.name}\n")
            out += [bench_file_markdown(f) for f in sorted(run.glob("*.json"))]
        return "\n".join(out)
    raise ValueError(f"benchmarks: expected cpu or gpu, got {which!r}")


# ---------------------------------------------------------------- notebooks


def notebook_markdown(relpath: str) -> str:
    """A notebook's cells as markdown: its text, its code (as ```py blocks, which the docs
    example test does not run again: the notebook test runs the notebook) and its saved outputs."""
    nb = json.loads((ROOT / relpath).read_text(encoding="utf-8"))
    out = [f"The notebook `{relpath}` of the repository, with the outputs of its last run.\n"]
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            out.append(re.sub(r"^# ", "## ", src, flags=re.M) + "\n")
            continue
        out += ["```py", src, "```\n"]
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                out += ["```text", "".join(o["text"]).rstrip(), "```\n"]
            elif "image/png" in data:
                png = "".join(data["image/png"]).replace("\n", "")
                out.append(f"![output](data:image/png;base64,{png})\n")
            elif "text/plain" in data:
                out += ["```text", "".join(data["text/plain"]).rstrip(), "```\n"]
    return "\n".join(out)


# ---------------------------------------------------------------- log filters


class _NotAReference(logging.Filter):
    """Drops two warnings that are not about the docs' content, so that --strict keeps the rest.

    - autorefs reads an index in a docstring (`doc["pairs"]`, `z[0]`, `cells[(8, 1)]`) as a
      reference link and warns that no such page exists: only targets that are not dotted
      identifiers are dropped, so a broken reference to a real name still fails the build;
    - griffe asks for a type on a returned value: the return types are in the signatures where
      they are annotated, and each Returns section says what is returned (tests/test_docstrings.py).
    """

    TARGET = re.compile(r"Could not find cross-reference target '(.*)'$")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        m = self.TARGET.search(msg)
        if m:
            return bool(re.fullmatch(r"[A-Za-z_][\w.]*", m.group(1)))
        return "No type or annotation for returned value" not in msg


def on_pre_build(config):  # noqa: ARG001  (mkdocs hook signature; the strict counter exists by now)
    # on the handlers (the strict-mode counter among them): the plugins log on loggers of their own
    for handler in logging.getLogger("mkdocs").handlers:
        handler.addFilter(_NotAReference())


# ---------------------------------------------------------------- the hook


def generate(kind: str, arg: str) -> str:
    """The markdown that replaces the marker `<!-- generated: kind arg -->`."""
    if kind == "api":
        return api_markdown(arg)
    if kind == "cli":
        return cli_markdown()
    if kind == "benchmarks":
        return benchmarks_markdown(arg)
    if kind == "notebook":
        return notebook_markdown(arg)
    raise ValueError(f"unknown generated block {kind!r}")


def render(markdown: str) -> str:
    """The page with every marker replaced by its generated content."""
    with contextlib.redirect_stdout(io.StringIO()):
        return MARKER.sub(lambda m: generate(m.group(1), m.group(2)), markdown)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001  (mkdocs hook signature)
    return render(markdown)
