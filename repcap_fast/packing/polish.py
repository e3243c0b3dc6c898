"""The polishes after a packing method (``packing.optimize(..., projection_steps=, polish_steps=)``).

First the alternating-projection polish (``repcap_fast.packing.projection``), then the active-set
polish (``packing.methods.polish``), each when asked for; each with its progress bar.
"""

from __future__ import annotations

from typing import List

import torch

from .. import capacity
from .._progress import progress_bar
from . import methods
from .projection import alternating_projection, coherence


def polishes(run, X: torch.Tensor, progress, auto_above: float):
    """The alternating-projection polish, then the active-set polish, each when `run` asks for it.

    `run` is ``packing``'s validated run (k, d, projection_steps, settings.polish_steps); a bar
    shows above `auto_above` flops of work when `progress` is None. Returns the polished rows (X's
    device and dtype) and the two histories (ε* after each step): (polish, projection).
    """
    projection_history: List[float] = []
    polish_history: List[float] = []
    if run.projection_steps:
        X = _projection_polish(run, X, progress, auto_above, projection_history)
    if run.settings.polish_steps:
        X = _active_set_polish(run, X, progress, auto_above, polish_history)
    return X, (polish_history, projection_history)


def _projection_polish(run, X: torch.Tensor, progress, auto_above: float, history: List[float]) -> torch.Tensor:
    """The alternating-projection polish (float64, on X's device) from the rows X, μ annealed from their ε*."""
    with progress_bar(progress, total=run.projection_steps, desc=f"projection polish k={run.k} d={run.d}",
                      unit="step", work=float(run.k) ** 3 * run.projection_steps, auto_above=auto_above) as bar:
        def on_step(step, eps):
            history.append(eps)
            bar.update(1)

        x = X.detach().to(torch.float64)
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
        polished = alternating_projection(x, run.projection_steps, capacity.coherence_bound(run.k, run.d)[0],
                                          on_step, mu_start=coherence(x))
    return polished.to(device=X.device, dtype=X.dtype)


def _active_set_polish(run, X: torch.Tensor, progress, auto_above: float, history: List[float]) -> torch.Tensor:
    """The active-set polish of packing.methods (float64, CPU), returned on X's device and dtype."""
    with progress_bar(progress, total=run.settings.polish_steps, desc=f"polish k={run.k} d={run.d}", unit="LP",
                      work=4.0 * run.k * run.k * run.d * run.settings.polish_steps, auto_above=auto_above) as bar:
        def on_step(step, eps):
            history.append(eps)
            bar.update(1)

        polished = methods.polish(X, run.settings.polish_steps, on_step)
    return polished.to(device=X.device, dtype=X.dtype)
