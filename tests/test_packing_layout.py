"""repcap_fast/packing/ is a layered package: every import at module top, each module importing only
the ones below it, no file over 600 lines; the modules' old top-level paths still import (with a
DeprecationWarning), so code and pickles that name them keep working."""

import ast
import pathlib
import pickle
import warnings

import pytest

from repcap_fast import packing

FOLDER = pathlib.Path(packing.__file__).parent
# bottom to top: a module may import the modules of the layers before its own
LAYERS = [{"result", "memory", "ansatz"}, {"projection", "search"}, {"methods"}, {"polish"}, {"optimizer"},
          {"sweep_file"}, {"sweeps"}, {"__init__"}]
MODULES = sorted(p.stem for p in FOLDER.glob("*.py"))
MOVED = {"packing_methods": "methods", "packing_result": "result", "packing_memory": "memory",
         "packing_projection": "projection", "packing_search": "search", "packing_polish": "polish",
         "packing_sweep": "sweeps", "sweep_file": "sweep_file"}


def _tree(name):
    return ast.parse((FOLDER / f"{name}.py").read_text(encoding="utf-8"))


def _layer(name):
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def test_every_module_has_a_layer():
    assert set(MODULES) == set().union(*LAYERS)


def _ours(node) -> bool:
    """An import of this package (relative, or by its name); third-party imports may stay lazy (scipy)."""
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").startswith("repcap_fast")
    return isinstance(node, ast.Import) and any(a.name.startswith("repcap_fast") for a in node.names)


@pytest.mark.parametrize("name", MODULES)
def test_no_import_of_the_package_inside_a_function(name):
    inside = []
    for fn in ast.walk(_tree(name)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside += [f"{fn.name}:{n.lineno}" for n in ast.walk(fn) if _ours(n)]
    assert not inside, f"repcap_fast/packing/{name}.py imports inside functions: {inside}"


def test_the_inside_check_sees_a_relative_import():
    tree = ast.parse("def f():\n    from .search import check_size\n    import scipy\n")
    assert [_ours(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] == [True, False]


def _siblings(name):
    """The modules of repcap_fast/packing/ that `name` imports."""
    out = set()
    for node in _tree(name).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return out


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_only_the_layers_below(name):
    above = {s for s in _siblings(name) if _layer(s) >= _layer(name)}
    assert not above, f"repcap_fast/packing/{name}.py imports {above}, which are not below it"


def test_the_layer_check_sees_imports():
    assert _siblings("sweeps") >= {"methods", "optimizer", "sweep_file", "result", "memory"}
    assert _siblings("methods") == {"projection", "search"}


@pytest.mark.parametrize("name", MODULES)
def test_no_file_over_600_lines(name):
    assert len((FOLDER / f"{name}.py").read_text(encoding="utf-8").splitlines()) <= 600


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_the_old_module_paths_still_import(old, new):
    import importlib
    import sys

    sys.modules.pop(f"repcap_fast.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"repcap_fast.{old} is deprecated; use repcap_fast.packing.{new}"):
        module = importlib.import_module(f"repcap_fast.{old}")
    assert module is importlib.import_module(f"repcap_fast.packing.{new}")
    assert module.__name__ == module.__spec__.name == f"repcap_fast.packing.{new}"  # its own spec, kept


def test_a_pickle_that_names_the_old_module_loads():
    res = packing.optimize(8, 3, steps=3, progress=False)
    data = pickle.dumps(res)
    assert b"repcap_fast.packing.result" in data
    old = data.replace(b"repcap_fast.packing.result", b"repcap_fast.packing_result")  # the same length
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        back = pickle.loads(old)
    assert isinstance(back, packing.PackingResult) and back.eps_star == res.eps_star and back.k == 8


def test_the_public_names_are_where_they_were():
    for name in ("optimize", "sweep", "METHODS", "NO_P", "PackingResult", "PackingDiverged", "MethodSettings",
                 "default_lr", "default_p", "load_cells", "write_cells", "SWEEP_FORMAT", "CELL_FIELDS"):
        assert hasattr(packing, name), name
    assert packing.__all__ == ["PENALTY_PRECISIONS", "PackingResult", "default_lr", "default_p", "load_cells",
                               "optimize", "sweep"]
