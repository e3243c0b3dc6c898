"""repcap_fast: fast, exact representation geometry of transformer language models.

Representational capacity (ε = μ + 2σ of the pairwise cosines, capacity formulas), the packing
simulation and Subspace PGA on C++ CPU, Triton and CUDA kernels; real models offline
(`load_embeddings`, `hidden_states`) and the full report (`report.run_report`, `repcap report`).
See README.md and DESIGN.md.
"""

__version__ = "0.1.0"

from . import _ops  # noqa: F401,E402  registers torch.ops.repcap_fast.* when _C is built
from . import capacity, models, pga, report  # noqa: E402
from ._backends import info  # noqa: E402
from .penalty import gram_offdiag_max, gram_offdiag_penalty, gram_offdiag_rows  # noqa: E402
from .models import hidden_states, load_embeddings  # noqa: E402
from .cosine_stats import (  # noqa: E402
    CosineMoments,
    CosineStats,
    cosine_moments,
    epsilon,
    pairwise_cosine_stats,
    pairwise_cosine_stats_sharded,
)

__all__ = [
    "CosineMoments",
    "CosineStats",
    "capacity",
    "cosine_moments",
    "epsilon",
    "gram_offdiag_max",
    "gram_offdiag_penalty",
    "gram_offdiag_rows",
    "hidden_states",
    "info",
    "load_embeddings",
    "models",
    "pga",
    "report",
    "pairwise_cosine_stats",
    "pairwise_cosine_stats_sharded",
]
