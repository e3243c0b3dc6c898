"""What every checkpoint reader shares: the reader interface, the error for a missing tensor, and
the helpers that turn a bad file into one ValueError naming it."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import torch


class MissingTensorError(KeyError, ValueError):
    """The checkpoint lacks the tensor asked for (or any embedding tensor this table knows). A
    KeyError as before, and a ValueError like every other bad-input error of the readers."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _why(exc: BaseException, limit: int = 240) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    line = text[0].strip() if text else ""
    if len(line) > limit:
        line = line[:limit] + " …"
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _unreadable(path: str, what: str, exc: BaseException) -> ValueError:
    """The ValueError for a file a library could not parse, naming the file (raise it `from exc`)."""
    return ValueError(f"{path}: {what} ({_why(exc)})")


def _file_size(path: str) -> int:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: a directory, not a file")
    return os.path.getsize(path)


def _too_short(path: str, size: int, what: str) -> ValueError:
    return ValueError(f"{path}: {'empty file (0 bytes)' if size == 0 else f'only {size} bytes'}: "
                      f"too short to be {what}")


_HUGE = 2**64  # more elements than any file holds


def _bounded_prod(shape: Sequence[int], cap: int = _HUGE) -> Optional[int]:
    """The product of shape, or None when it exceeds cap (computed without building huge ints)."""
    n = 1
    for s in shape:
        if s == 0:
            return 0
    for s in shape:
        n *= s
        if n > cap:
            return None
    return n


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class _Reader:
    kind = "?"

    def __init__(self):
        self.files_opened: List[str] = []

    def names(self) -> List[str]:
        raise NotImplementedError

    def shape(self, name: str) -> Tuple[int, ...]:
        raise NotImplementedError

    def read(self, name: str, n_rows: Optional[int] = None) -> torch.Tensor:
        raise NotImplementedError

    def _opened(self, path: str) -> None:
        if path not in self.files_opened:
            self.files_opened.append(path)
