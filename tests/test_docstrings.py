"""The docstrings are the API reference (docs/api/): every public name says what it computes, its
arguments, what it returns, the errors it raises and one example, and every example runs.

Public names: `repcap_fast.__all__` and the `__all__` of each public submodule that it lists.
Sections are Google style (ruff's pydocstyle rules, convention "google", check their form):

- functions: ``Args:`` with one entry per parameter, ``name (type): ...`` or ``name: ...`` when
  the signature annotates it (mkdocstrings renders the type either way), ``Returns:`` (or ``Yields:``),
  ``Raises:`` (when it takes arguments) and ``Examples:`` (the section griffe parses) with a ``>>>`` example;
- classes: ``Attributes:`` or ``Args:``, and an example; exceptions and warnings only a summary;
- public methods and properties of public classes: a summary line.

The ``>>>`` examples are run with doctest (ELLIPSIS, NORMALIZE_WHITESPACE), with ``rf``
(repcap_fast), ``torch`` and ``np`` already imported; an example that cannot run here is marked
``# doctest: +SKIP`` and its docstring says why.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
import types

import numpy as np
import pytest
import torch

import repcap_fast

PUBLIC_MODULES = ["repcap_fast"] + [
    f"repcap_fast.{n}" for n in repcap_fast.__all__ if isinstance(getattr(repcap_fast, n), types.ModuleType)
]


def _public_objects():
    """(qualified name, object) of each public function and class, each object once."""
    seen: dict[int, tuple[str, object]] = {}
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for n in getattr(mod, "__all__", []):  # test_public_modules_define_all fails without one
            obj = getattr(mod, n)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                seen.setdefault(id(obj), (f"{modname}.{n}", obj))
    return sorted(seen.values(), key=lambda t: t[0])


OBJECTS = _public_objects()
IDS = [name for name, _ in OBJECTS]


def _is_exception(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def _sections(doc: str) -> set[str]:
    return set(re.findall(r"^\s*(Args|Returns|Yields|Raises|Attributes|Examples?):\s*$", doc, flags=re.M))


def _params(obj) -> list[str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values() if p.name not in ("self", "cls")]


@pytest.mark.parametrize("modname", PUBLIC_MODULES)
def test_public_modules_define_all(modname):
    names = getattr(importlib.import_module(modname), "__all__", None)
    assert names, f"{modname} has no __all__: its public names (the API reference's entries) are not defined"


@pytest.mark.parametrize("name,obj", OBJECTS, ids=IDS)
def test_public_docstring_has_every_section(name, obj):
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    summary = doc.splitlines()[0]
    assert summary.strip().endswith((".", "!", "?")), f"{name}: the summary line must be one sentence: {summary!r}"
    if _is_exception(obj):
        return
    found = _sections(doc)
    missing = []
    if "Examples" not in found:
        missing.append("Examples:")
    elif ">>>" not in doc:
        missing.append("a >>> line in Examples:")
    if inspect.isclass(obj):
        if not found & {"Attributes", "Args"}:
            missing.append("Attributes: or Args:")
    else:
        params = [p for p in _params(obj) if not p.startswith("_")]
        if params:
            if "Args" not in found:
                missing.append("Args:")
            else:
                args_block = re.search(r"^\s*Args:\s*$(.*?)(?=^\s*(Returns|Yields|Raises|Examples?|Note|Notes|"
                                       r"Warnings?|See Also):\s*$|\Z)", doc, flags=re.M | re.S).group(1)
                sig = inspect.signature(obj)
                for p in params:
                    entry = re.search(rf"^\s+\*{{0,2}}{re.escape(p)}( \(([^)]*)\))?:", args_block, flags=re.M)
                    if not entry:
                        missing.append(f"Args: entry 'name (type): ...' for {p!r}")
                    elif not entry.group(2) and sig.parameters[p].annotation is inspect.Parameter.empty:
                        missing.append(f"a type for {p!r} (in the signature, or 'name (type): ...')")
            if "Raises" not in found:
                missing.append("Raises:")
        if not found & {"Returns", "Yields"}:
            missing.append("Returns:")
    assert not missing, f"{name} docstring lacks: {', '.join(missing)}"


def _public_members():
    out = []
    for name, obj in OBJECTS:
        if not inspect.isclass(obj) or _is_exception(obj):
            continue
        for attr, member in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                out.append((f"{name}.{attr}", member))
    return out


MEMBERS = _public_members()


@pytest.mark.parametrize("name,member", MEMBERS, ids=[n for n, _ in MEMBERS])
def test_public_methods_have_a_summary(name, member):
    doc = inspect.getdoc(member)
    assert doc and doc.splitlines()[0].strip(), f"{name} has no docstring"


@pytest.mark.parametrize("name,obj", OBJECTS, ids=IDS)
def test_docstring_example_runs(name, obj):
    globs = {"rf": repcap_fast, "torch": torch, "np": np}
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs=globs)
    examples = [t for t in tests if t.examples]
    if not examples:
        pytest.skip(f"{name} has no >>> example")  # test_public_docstring_has_every_section fails for it
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    torch.manual_seed(0)
    for t in examples:
        runner.run(t, out=lambda s: print(s, end=""))
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{name}: {res.failed} of {res.attempted} example lines failed (output above)"
