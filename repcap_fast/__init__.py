"""repcap_fast: fast, exact representation geometry of transformer language models.

Representational capacity (ε = μ + 2σ of the pairwise cosines, capacity formulas), the packing
simulation and Subspace PGA on C++ CPU, Triton and CUDA kernels; real models offline
(`load_embeddings`, `hidden_states`) and the full report (`report.run_report`, `repcap report`).
The three ops are in repcap_fast.ops, one module each. See README.md and DESIGN.md.
"""

import importlib as _importlib
import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import _ops  # noqa: F401  loads repcap_fast._C (the ops) and registers their fake kernels
from ._backends import info
from ._deprecated import moved_modules as _moved_modules
from ._deprecated import moved_names as _moved_names
from ._version import __version__
from .ops.gram_offdiag_penalty import (
    gram_offdiag_log_penalty,
    gram_offdiag_max,
    gram_offdiag_penalty,
    gram_offdiag_penalty_block,
    gram_offdiag_row_stats,
)
from .ops.pairwise_cosine_stats import CosineMoments, CosineStats, cosine_moments, epsilon, pairwise_cosine_stats
from .ops.pairwise_cosine_stats_sharded import pairwise_cosine_stats_sharded
from .ops.subspace_pga import PGAResult, subspace_pga

# Imported on first use (PEP 562), so that `import repcap_fast` costs little more than `import torch`:
# the submodules below pull in numpy-heavy analyses, the model readers (transformers), plotting
# (matplotlib) and the report. tests/test_startup.py lists what the import must not load.
_LAZY_SUBMODULES = ("capacity", "fitting", "integrations", "models", "monitor", "packing", "pga", "plotting",
                    "report")
_LAZY_NAMES = {"hidden_states": "models", "load_embeddings": "models", "RepresentationMonitor": "monitor"}
if _TYPE_CHECKING:  # what the lazy names are, for type checkers and the API reference's static analysis
    from . import capacity, fitting, integrations, models, monitor, packing, pga, report
    from . import plotting as plotting
    from .models import hidden_states, load_embeddings
    from .monitor import RepresentationMonitor

# Renamed: gram_offdiag_rows -> gram_offdiag_row_stats (deprecated, removed in the next release).
_deprecated_getattr = _moved_names(__name__, {"gram_offdiag_rows": ("repcap_fast", "gram_offdiag_row_stats")})


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # the import binds it in globals()
    if name in _LAZY_NAMES:
        value = getattr(_importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
        globals()[name] = value
        return value
    return _deprecated_getattr(name)


def __dir__():
    return sorted(set(globals()) | set(__all__))


# Library code never prints: it logs on the "repcap_fast" logger (and its children) and warns.
# Without a handler configured by the application, INFO lines go nowhere; `repcap` prints them.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

# The packing modules moved into repcap_fast/packing/ (2026-12-07): their old paths still import,
# with a DeprecationWarning, so code and pickles that name them keep working for one more release.
_moved_modules({
    "repcap_fast.packing_methods": "repcap_fast.packing.methods",
    "repcap_fast.packing_result": "repcap_fast.packing.result",
    "repcap_fast.packing_memory": "repcap_fast.packing.memory",
    "repcap_fast.packing_projection": "repcap_fast.packing.projection",
    "repcap_fast.packing_search": "repcap_fast.packing.search",
    "repcap_fast.packing_polish": "repcap_fast.packing.polish",
    "repcap_fast.packing_sweep": "repcap_fast.packing.sweeps",
    "repcap_fast.sweep_file": "repcap_fast.packing.sweep_file",
})


__all__ = [
    "__version__",
    "CosineMoments",
    "CosineStats",
    "PGAResult",
    "RepresentationMonitor",
    "capacity",
    "cosine_moments",
    "epsilon",
    "fitting",
    "gram_offdiag_log_penalty",
    "gram_offdiag_max",
    "gram_offdiag_penalty",
    "gram_offdiag_penalty_block",
    "gram_offdiag_row_stats",
    "hidden_states",
    "info",
    "integrations",
    "load_embeddings",
    "models",
    "monitor",
    "packing",
    "pairwise_cosine_stats",
    "pairwise_cosine_stats_sharded",
    "pga",
    "report",
    "subspace_pga",
]
