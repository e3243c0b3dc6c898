"""Names that moved in the one-module-per-op layout, served for one more release (PEP 562
module ``__getattr__``) with a DeprecationWarning that names the new home."""

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Callable, Dict, Tuple


def moved_names(module: str, moved: Dict[str, Tuple[str, str]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for `module` that serves each old name in `moved` from its new
    home (new module, new name), with a warning at each access; any other name is an
    AttributeError."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target_module, target_name = moved[name]
        warnings.warn(f"{module}.{name} is deprecated; use {target_module}.{target_name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(target_module), target_name)

    return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module that now holds its code (``repcap_fast.packing_result``
    is ``repcap_fast.packing.result``), with a DeprecationWarning; pickles that name the old path load."""

    def __init__(self, moved: Dict[str, str]):
        self.moved = moved
        self.own_specs: Dict[str, importlib.machinery.ModuleSpec] = {}  # new name → its own spec

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        warnings.warn(f"the module {spec.name} is deprecated; use {self.moved[spec.name]}", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(self.moved[spec.name])
        self.own_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # already executed under its new name; the import system has just set its __spec__ to the old
        # path's spec: give it back its own (importlib.reload and inspect read it)
        module.__spec__ = self.own_specs[module.__name__]


def moved_modules(moved: Dict[str, str]) -> None:
    """Lets each old module path in `moved` (old → new) be imported, for one more release."""
    if not any(isinstance(f, _MovedModules) and f.moved == moved for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(moved))
