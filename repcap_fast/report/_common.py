"""What the report, the control report and the surveys share: JSON-safe values, provenance,
stage logging, source labels and the files a run reads."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import platform
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .._backends import info


def _finite(x):
    """JSON-safe float: None for NaN and ±inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clean(obj):
    """`obj` with every value JSON can hold: str keys, lists, finite floats (None for NaN/inf)."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return _finite(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, torch.Tensor):
        return _clean(obj.tolist())
    return obj


_LOGGER = logging.getLogger("repcap_fast.report")


def _log_to(log) -> Callable[[str], None]:
    """The line sink of a report function: `log` when one is given, else the logger at INFO."""
    return _LOGGER.info if log is None else log


def _stage(name: str, log) -> float:
    log(f"== {name}")
    return time.perf_counter()


def _provenance(command: Optional[List[str]], settings: Dict) -> Dict:
    versions = {k: info()[k] for k in ("repcap_fast", "torch", "triton", "python")}
    for module in ("transformers", "numpy", "scipy", "gguf", "safetensors"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or without a version
            versions[module] = None
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            "settings": settings, "versions": versions,
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _source_label(source) -> Optional[str]:
    if source is None or isinstance(source, (str, os.PathLike)):
        return None if source is None else str(source)
    return getattr(source, "label", None) or type(source).__name__


def _report_inputs(source, settings) -> List[Tuple[str, Optional[str]]]:
    """The files a report reads, for `check_no_clobber`: the source (when it is a path), the text
    file and the probe file."""
    return [("the source", source if isinstance(source, (str, os.PathLike)) else None),
            ("text_file", settings.text_file), ("probe_file", settings.probe_file)]
