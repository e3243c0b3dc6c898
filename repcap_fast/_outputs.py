"""Output files and folders that never clobber what a run reads, and reports that never mix with a
previous run's files: checked paths (inputs against outputs, outputs against each other, plot
formats) and a staging folder that a run writes into and that replaces the previous outputs at
the end, whether the run finished or failed."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterable, List, Optional, Sequence, Tuple

# Files that model readers read inside a model directory: an output there with one of these
# names (or suffixes) would replace a part of the model.
_MODEL_FILE_NAMES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                     "tokenizer.model", "spiece.model", "cfg.json"}
_MODEL_FILE_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth",
                        ".gguf", ".npy", ".npz", ".ckpt")


def _identity(path: str):
    """(realpath, (device, inode) when the file exists): two paths name one file when either agrees
    (a symlink, '..', or a hard link)."""
    real = os.path.realpath(os.path.abspath(path))
    try:
        st = os.stat(real)
        return real, (st.st_dev, st.st_ino)
    except OSError:
        return real, None


def _same(a: str, b: str) -> bool:
    ra, ia = _identity(a)
    rb, ib = _identity(b)
    return ra == rb or (ia is not None and ia == ib)


def _inside(path: str, folder: str) -> bool:
    real, folder = _identity(path)[0], _identity(folder)[0]
    return os.path.commonpath([real, folder]) == folder


def _is_model_file(path: str) -> bool:
    name = os.path.basename(path)
    return name in _MODEL_FILE_NAMES or name.endswith(_MODEL_FILE_SUFFIXES)


def check_no_clobber(outputs: Sequence[Tuple[str, str]], inputs: Sequence[Tuple[str, Optional[str]]] = ()) -> None:
    """Refuses, before any work, an output path that is one of the run's inputs or another of its
    outputs: the same path, a link to it or a hard link (compared as resolved paths and inodes).
    An input that is a folder (a model directory) refuses outputs inside it that carry a model
    file's name (config.json, *.safetensors, ...). outputs, inputs: (argument name, path) pairs;
    inputs may hold None (absent) and names that are not paths (aliases, repo ids: skipped)."""
    outs = [(name, os.fspath(path)) for name, path in outputs if path is not None]
    for i, (name, path) in enumerate(outs):
        for other, other_path in outs[:i]:
            if _same(path, other_path):
                raise ValueError(f"{name} {path!r} is the same file as {other} {other_path!r}: one would overwrite "
                                 "the other; give two different paths")
    for in_name, in_path in inputs:
        if in_path is None or not isinstance(in_path, (str, os.PathLike)) or not os.path.exists(in_path):
            continue
        in_path = os.fspath(in_path)
        for name, path in outs:
            if os.path.isdir(in_path):
                if _inside(path, in_path) and _is_model_file(path) and os.path.exists(path):
                    raise ValueError(f"{name} {path!r} would overwrite a file of {in_name} {in_path!r} (the model "
                                     "directory that is read); write it elsewhere")
            elif _same(path, in_path):
                raise ValueError(f"{name} {path!r} is {in_name}, which this run reads: writing it would destroy the "
                                 "input; give another path")


def check_plot_suffix(path: str, name: str = "--plot") -> str:
    """A plot path whose suffix matplotlib can write (png, pdf, svg, ...), checked before any
    work. Returns the path."""
    from matplotlib.backend_bases import FigureCanvasBase  # no backend is chosen: the caller's stays

    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise ValueError(f"{name} {path!r}: matplotlib cannot write .{suffix} files; use one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    return path


class StagedFolder:
    """A run's outputs, written into a hidden staging folder inside `out` and moved into place by
    `publish()`: then `out` holds exactly this run's files among `names` (a previous run's files
    of those names that this run did not write are removed, so nothing stale sits beside a new
    report.json). A run that fails publishes too (its report.json records the error); a run that
    is killed leaves the previous outputs as they were and the staging folder behind (named
    .repcap-partial-*). Only the files named in `names` are ever removed from `out`."""

    def __init__(self, out: str, names: Iterable[str]):
        self.out = out
        self.names = tuple(names)
        _remove_abandoned_staging(out)
        self.staging = tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{os.getpid()}-", dir=out)

    def path(self, name: str) -> str:
        """Where to write the output `name` (one of `names`) during the run."""
        if name not in self.names:
            raise RuntimeError(f"{name!r} is not an output of this run ({self.names})")
        return os.path.join(self.staging, name)

    def publish(self) -> List[str]:
        """Moves the staged files into `out`, removes the stale ones, and returns the names
        published."""
        written = [n for n in self.names if os.path.exists(os.path.join(self.staging, n))]
        for name in written:
            os.replace(os.path.join(self.staging, name), os.path.join(self.out, name))
        for name in self.names:
            target = os.path.join(self.out, name)
            if name not in written and os.path.isfile(target):
                os.remove(target)
        shutil.rmtree(self.staging, ignore_errors=True)
        return written

    def discard(self) -> None:
        """Removes the staging folder and what it holds (the previous outputs stay as they were)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> "StagedFolder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """The files written in the block are published; if the block raised, none of them is
        (nothing half-written reaches OUT) and the staging folder is removed."""
        if exc_type is None:
            self.publish()
        else:
            self.discard()


_STAGING_PREFIX = ".repcap-partial-"


def _remove_abandoned_staging(out: str) -> None:
    """Removes the staging folders in `out` of runs that were killed (their process is gone); a
    folder of a run still going (another process writing into the same OUT) is left alone."""
    try:
        entries = os.listdir(out)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(_STAGING_PREFIX):
            continue
        pid = entry[len(_STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(out, entry), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def remove_stale(out: str, names: Iterable[str]) -> None:
    """Removes the files `names` of an earlier run from `out` (only those), before a run that
    writes its results there as it goes."""
    for name in names:
        path = os.path.join(out, name)
        if os.path.isfile(path):
            os.remove(path)


def write_json_atomic(path: str, doc, **dump_kw) -> None:
    """Writes `doc` as JSON to `path` through a temporary file in the same folder and os.replace:
    a reader (or a crash) sees the old file or the new one, never half of one."""
    import json

    fd, tmp = tempfile.mkstemp(prefix=".repcap-", suffix=".json.tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would create it (mkstemp makes 0600 files)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, **dump_kw)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
