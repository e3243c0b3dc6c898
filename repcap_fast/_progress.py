"""The one progress helper: a tqdm bar when progress is wanted, a no-op bar otherwise, so callers
never test for None."""

from __future__ import annotations

from typing import Optional


class _NoBar:
    """Stands in for a tqdm bar when no progress is shown."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(show: Optional[bool], *, total: int, desc: str, unit: str, work: float = 0.0,
                 auto_above: float = float("inf"), leave: bool = False, unit_scale: bool = False):
    """A bar over `total` units, used as a context manager (closed on exit, also on error).

    show: True or False; None decides from the amount of work: shown when work ≥ auto_above
    (a few seconds of the op, as each caller estimates it)."""
    if not (show if show is not None else work >= auto_above):
        return _NoBar()
    from tqdm.auto import tqdm  # only when a bar is shown: tqdm.auto probes for notebooks

    return tqdm(total=total, desc=desc, unit=f" {unit}", leave=leave, unit_scale=unit_scale)
