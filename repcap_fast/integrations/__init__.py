"""Integrations with training frameworks: `RepcapCallback`, a Hugging Face ``TrainerCallback`` over
``repcap_fast.monitor.RepresentationMonitor`` (its home: ``repcap_fast.integrations.transformers``).

Each integration imports its framework when it is first used, never before: importing this
package imports nothing.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

if _TYPE_CHECKING:  # for type checkers and the API reference; loaded on first use
    from .transformers import RepcapCallback

__all__ = ["RepcapCallback"]


def __getattr__(name: str):
    if name == "RepcapCallback":
        return _importlib.import_module(f"{__name__}.transformers").RepcapCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
