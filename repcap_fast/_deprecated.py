"""Names that moved in the one-module-per-op layout, served for one more release (PEP 562
module ``__getattr__``) with a DeprecationWarning that names the new home."""

import importlib
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
