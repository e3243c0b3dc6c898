"""mkdocs hooks: the pages that are generated at build time, never copied by hand.

A page asks for generated content with a marker line:

    <!-- generated: api repcap_fast.pga -->   one mkdocstrings entry per name in the module's __all__
    <!-- generated: api repcap_fast topic:cosine -->  the names of one topic (API_TOPICS)
    <!-- generated: cli -->                   `repcap --help` and the help of every subcommand
    <!-- generated: benchmarks overview -->   per op: a plot against size, a long table (bench_pages.py)
    <!-- generated: benchmarks cpu -->        each file of bench/results/*.json: summary, plots, raw fields
    <!-- generated: benchmarks gpu -->        each file of bench/results/gpu_*/*.json, one run each
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
import sys
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_pages  # noqa: E402  (docs/bench_pages.py, beside this file; mkdocs loads hooks by path)

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: (\w+)\s*(.*?)\s*-->\s*$", re.M)


# ---------------------------------------------------------------- API reference


def public_names(modname: str) -> list[str]:
    """The module's public names, as its __all__ lists them (modules excluded: they have pages)."""
    mod = importlib.import_module(modname)
    names = getattr(mod, "__all__", None)
    if names is None:
        raise RuntimeError(f"{modname} has no __all__: the API reference cannot list its public names")
    return [n for n in names if not isinstance(getattr(mod, n), types.ModuleType)]


# Modules whose reference is split over pages by topic, so that no page holds more than about 40
# objects: {module: {topic: names}}. Every public name of such a module is in exactly one topic
# (api_topics() raises otherwise), so a new name cannot fall out of the reference.
API_TOPICS: dict[str, dict[str, list[str]]] = {
    "repcap_fast": {
        "cosine": ["pairwise_cosine_stats", "cosine_moments", "epsilon", "pairwise_cosine_stats_sharded",
                   "CosineStats", "CosineMoments"],
        "pga": ["subspace_pga", "PGAResult"],
        "penalty": ["gram_offdiag_penalty", "gram_offdiag_log_penalty", "gram_offdiag_max",
                    "gram_offdiag_row_stats", "gram_offdiag_penalty_block"],
        "models": ["load_embeddings", "hidden_states", "info", "__version__"],
        "monitor": ["RepresentationMonitor"],
    },
    "repcap_fast.models": {
        "reading": ["load_embeddings", "hidden_states", "Embeddings", "HiddenStates", "check_embeddings",
                    "check_layers", "layer_count", "read_texts", "default_corpus"],
        "sources": ["open_model", "resolve_source", "runnable", "in_memory_source", "is_in_memory", "random_init",
                    "InMemorySource", "ResolvedSource", "TensorNames", "NoUnembeddingError", "ALIASES",
                    "ARCHITECTURES", "DEFAULT_CORPUS", "DEFAULT_MODEL", "FRAMEWORKS", "INITS",
                    "LAST_LAYER_MEANING", "LAST_LAYER_POINTS", "MINILM", "SMOLLM2"],
    },
}


def api_topics(modname: str) -> dict[str, list[str]]:
    """The topics of a split module, checked against its __all__: each public name in one topic."""
    topics = API_TOPICS[modname]
    listed = [n for names in topics.values() for n in names]
    public = public_names(modname)
    missing = sorted(set(public) - set(listed))
    unknown = sorted(set(listed) - set(public))
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if missing or unknown or twice:
        raise RuntimeError(f"docs/hooks.py API_TOPICS[{modname!r}] is out of date: not listed {missing}, "
                           f"not public {unknown}, listed twice {twice}")
    return topics


def api_entry(modname: str, name: str) -> str:
    """The mkdocstrings identifier of a public name: `module.name`, or the object's own path where
    the module also has a submodule of that name (griffe would document the submodule instead)."""
    mod = importlib.import_module(modname)
    obj = getattr(mod, name)
    folder = pathlib.Path(mod.__file__).parent
    shadowed = hasattr(mod, "__path__") and ((folder / f"{name}.py").exists()
                                             or (folder / name / "__init__.py").exists())
    if shadowed and getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
        return f"{obj.__module__}.{obj.__qualname__}"
    return f"{modname}.{name}"


def api_markdown(arg: str) -> str:
    """One mkdocstrings entry per public name of a module (`arg` = "repcap_fast.pga"), or of one
    topic of a split module (`arg` = "repcap_fast topic:cosine"), grouped: functions, classes, constants."""
    modname, _, topic = arg.partition(" topic:")
    if topic:
        names = api_topics(modname)[topic]
    elif modname in API_TOPICS:
        raise ValueError(f"{modname} is split by topic: name one of {sorted(API_TOPICS[modname])}")
    else:
        names = public_names(modname)
    mod = importlib.import_module(modname)
    groups: dict[str, list[str]] = {"Functions": [], "Classes": [], "Constants": []}
    for n in names:
        obj = getattr(mod, n)
        if inspect.isclass(obj):
            groups["Classes"].append(n)
        elif callable(obj):
            groups["Functions"].append(n)
        else:
            groups["Constants"].append(n)
    out = []
    for title, group in groups.items():
        if not group:
            continue
        out.append(f"## {title}\n")
        for n in group:
            out.append(f"::: {api_entry(modname, n)}\n    options:\n      heading_level: 3\n")
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


def benchmarks_markdown(which: str) -> str:
    """The overview (`which="overview"`: per op, plots and a long table) or every result file of
    the CPU (`"cpu"`) or of each GPU run (`"gpu"`); see docs/bench_pages.py."""
    if which == "overview":
        return bench_pages.overview_markdown()
    return bench_pages.machine_markdown(which)


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
    bench_pages._load.cache_clear()  # a rebuild under `mkdocs serve` reads the results again
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


def on_files(files, config):
    """Adds the benchmark plots (drawn from bench/results/ now) to the site, as benchmarks/plots/*.png."""
    from mkdocs.structure.files import File

    for name, png in bench_pages.plots().items():
        files.append(File.generated(config, f"benchmarks/{bench_pages.PLOT_DIR}/{name}", content=png))
    return files
