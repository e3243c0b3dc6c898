"""The JSONL file of a RepresentationMonitor's measurements, read back (`read_metrics`)."""

from __future__ import annotations

import math
import os
from typing import Dict, List

from ._jsonl import jsonl_objects


def read_metrics(path) -> List[Dict[str, float]]:
    """The measurements in a monitor's JSONL file, one dict per line, in the order of their steps.

    A null (a NaN when written) reads as NaN. A step measured twice (a resumed run that measured
    it again) keeps its last line.

    Args:
        path (str | os.PathLike): the file ``RepresentationMonitor(output=...)`` appends to.

    Returns:
        list[dict]: {"step": int, "eps/input": float, ...} per measured step, by step.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object with an integer "step", or a file without
            any measurement.

    Examples:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
        >>> _ = open(path, "w").write('{"step": 50, "eps/input": 0.2}\\n{"step": 0, "eps/input": null}\\n')
        >>> rf.monitor.read_metrics(path)
        [{'step': 0, 'eps/input': nan}, {'step': 50, 'eps/input': 0.2}]
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"metrics file {path!r} does not exist")
    by_step: Dict[int, Dict[str, float]] = {}
    for i, obj in jsonl_objects(path):
        step = obj.get("step") if isinstance(obj, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f"{path}:{i}: expected a JSON object with an integer 'step'")
        by_step[step] = {k: (math.nan if v is None else v) for k, v in obj.items()}
    if not by_step:
        raise ValueError(f"{path}: no measurements in it")
    return [by_step[s] for s in sorted(by_step)]
