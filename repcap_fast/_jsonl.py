"""Reading JSON-lines files: the one reader of the texts (.jsonl), the probe labels and the
monitor's measurements."""

from __future__ import annotations

import json
from typing import Iterator, Tuple


def jsonl_objects(path: str) -> Iterator[Tuple[int, object]]:
    """Yields (line number, parsed JSON) of each non-blank line of a JSON-lines file.

    Args:
        path (str): the .jsonl file.

    Yields:
        tuple[int, object]: the 1-based line number and the value on it.

    Raises:
        ValueError: a line is not JSON (the message names the file and the line).
    """
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
