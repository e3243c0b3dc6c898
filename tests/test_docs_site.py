"""The documentation site: every public name is in the generated API reference, every page is in
the navigation, the generated pages (CLI, benchmarks, notebook) render, and the README stays the
short front door. `mkdocs build --strict` itself runs in CI (.ci/run)."""

import importlib
import pathlib
import re
import sys
import types

import pytest

import repcap_fast

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
hooks = importlib.import_module("hooks")
sys.path.remove(str(DOCS))

SUBMODULES = [n for n in repcap_fast.__all__ if isinstance(getattr(repcap_fast, n), types.ModuleType)]


def _rendered_api() -> str:
    return "\n".join(hooks.render(p.read_text(encoding="utf-8")) for p in sorted((DOCS / "api").glob("*.md")))


def _public_names():
    names = [f"repcap_fast.{n}" for n in repcap_fast.__all__ if n not in SUBMODULES]
    for sub in SUBMODULES:
        mod = importlib.import_module(f"repcap_fast.{sub}")
        names += [f"repcap_fast.{sub}.{n}" for n in getattr(mod, "__all__", [])
                  if not isinstance(getattr(mod, n), types.ModuleType)]
    return names


def _entry(qualified: str) -> str:
    modname, _, name = qualified.rpartition(".")
    return hooks.api_entry(modname, name)


def test_every_public_name_is_in_the_api_reference():
    found = re.findall(r"^::: (\S+)$", _rendered_api(), flags=re.M)
    entries = set(found)
    names = [_entry(n) for n in _public_names()]
    assert len(names) > 100
    missing = [n for n in names if n not in entries]
    assert not missing, f"public names without an API entry: {missing}"
    extra = sorted(entries - set(names))
    assert not extra, f"API entries that are not public names: {extra}"


@pytest.mark.parametrize("sub", SUBMODULES)
def test_every_public_module_has_an_api_page_in_the_navigation(sub):
    page = DOCS / "api" / f"{sub}.md"
    assert page.exists(), f"docs/api/{sub}.md is missing"
    assert re.search(rf"<!-- generated: api repcap_fast\.{sub}( topic:\w+)? -->", page.read_text(encoding="utf-8"))
    assert f"api/{sub}.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_the_split_modules_list_every_public_name_once_and_every_topic_has_a_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    for modname, topics in hooks.API_TOPICS.items():
        hooks.api_topics(modname)  # raises when a public name is missing, unknown or listed twice
        for topic in topics:
            assert f"<!-- generated: api {modname} topic:{topic} -->" in pages
    with pytest.raises(ValueError, match="split by topic"):
        hooks.api_markdown("repcap_fast")


def test_a_name_shadowed_by_a_submodule_points_at_the_object():
    # repcap_fast.models.hidden_states is a function and a submodule: the entry must be the function
    assert hooks.api_entry("repcap_fast.models", "hidden_states") == "repcap_fast.models.hidden_states.hidden_states"
    assert hooks.api_entry("repcap_fast", "hidden_states") == "repcap_fast.hidden_states"


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    missing = [p for p in pages if f": {p}" not in nav]
    assert not missing, f"pages outside the navigation: {missing}"


def test_the_cli_reference_covers_every_subcommand():
    from repcap_fast.cli import build_parser

    text = hooks.cli_markdown()
    subcommands = re.search(r"\{([a-z,-]+)\}", build_parser().format_usage()).group(1).split(",")
    assert len(subcommands) >= 6
    for name in subcommands:
        assert f"## repcap {name}\n" in text
        assert f"usage: repcap {name}" in text


def test_the_benchmark_pages_have_a_section_for_every_result_file():
    cpu, gpu = hooks.benchmarks_markdown("cpu"), hooks.benchmarks_markdown("gpu")
    for f in sorted((ROOT / "bench" / "results").glob("*.json")):
        assert f"### {f.stem}\n" in cpu
        assert f"`bench/results/{f.name}`" in cpu
    runs = sorted(p for p in (ROOT / "bench" / "results").glob("gpu_*") if p.is_dir())
    assert runs
    for run in runs:
        assert f"## {run.name}\n" in gpu
        for f in run.glob("*.json"):
            assert f"`bench/results/{run.name}/{f.name}`" in gpu
    # kept apart: no GPU run's file on the CPU page, no CPU file on the GPU page
    assert "bench/results/gpu_" not in cpu and "gpu_NVIDIA" not in cpu
    for f in (ROOT / "bench" / "results").glob("*.json"):
        assert f"`bench/results/{f.name}`" not in gpu


def test_the_notebook_page_shows_the_cells_and_the_plot():
    text = hooks.notebook_markdown("examples/quickstart.ipynb")
    assert "run_report" in text and "gram_offdiag_penalty" in text
    assert "data:image/png;base64," in text


def test_the_readme_is_the_short_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "<!-- ci-test-command -->" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), f"README links to a missing page: {link}"
