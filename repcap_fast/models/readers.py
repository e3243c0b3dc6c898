"""Checkpoint readers: tensor names and shapes first, data only for the tensor asked for
(safetensors, sharded safetensors, .pt/.bin state dicts, .npy, GGUF)."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .sources import ResolvedSource


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


class _SafetensorsReader(_Reader):
    kind = "safetensors"

    def __init__(self, path: str):
        super().__init__()
        from safetensors import safe_open

        self.path = path
        self._file = safe_open(path, framework="pt")
        self._opened(path)

    def names(self):
        return list(self._file.keys())

    def shape(self, name):
        return tuple(self._file.get_slice(name).get_shape())

    def read(self, name, n_rows=None):
        if n_rows is None:
            return self._file.get_tensor(name)
        return self._file.get_slice(name)[:n_rows]


class _ShardedSafetensorsReader(_Reader):
    """model.safetensors.index.json: the names come from the index; a shard is opened only when a
    tensor in it is read."""

    kind = "sharded-safetensors"

    def __init__(self, index_path: str):
        super().__init__()
        with open(index_path, encoding="utf-8") as fh:
            self.weight_map = json.load(fh)["weight_map"]
        self._opened(index_path)
        self.directory = os.path.dirname(index_path)
        self._shards: Dict[str, _SafetensorsReader] = {}

    def _shard(self, name):
        path = os.path.join(self.directory, self.weight_map[name])
        if path not in self._shards:
            self._shards[path] = _SafetensorsReader(path)
            self._opened(path)
        return self._shards[path]

    def names(self):
        return list(self.weight_map)

    def shape(self, name):
        return self._shard(name).shape(name)

    def read(self, name, n_rows=None):
        return self._shard(name).read(name, n_rows)


class _TorchReader(_Reader):
    """A .pt/.bin state dict (or a bare tensor), memory-mapped, weights only."""

    kind = "pt"

    def __init__(self, path: str):
        super().__init__()
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zipfile checkpoint: no mmap
            obj = torch.load(path, map_location="cpu", weights_only=True)
        self._opened(path)
        if isinstance(obj, torch.Tensor):
            obj = {"": obj}
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a tensor or a state dict of tensors")
        self.tensors = obj

    def names(self):
        return list(self.tensors)

    def shape(self, name):
        return tuple(self.tensors[name].shape)

    def read(self, name, n_rows=None):
        t = self.tensors[name]
        return t if n_rows is None else t[:n_rows]


class _NpyReader(_Reader):
    kind = "npy"

    def __init__(self, path: str):
        super().__init__()
        self.array = np.load(path, mmap_mode="r")
        self._opened(path)

    def names(self):
        return [""]

    def shape(self, name):
        return tuple(self.array.shape)

    def read(self, name, n_rows=None):
        a = self.array if n_rows is None else self.array[:n_rows]
        return torch.from_numpy(np.array(a, copy=True))  # out of the read-only memory map


class _GGUFReader(_Reader):
    """A GGUF file through the `gguf` package: metadata and tensor headers are parsed, and only the
    tensor asked for is dequantized."""

    kind = "gguf"

    def __init__(self, path: str):
        super().__init__()
        try:
            import gguf
        except ImportError:
            raise ImportError("reading GGUF files needs the `gguf` package: `pip install gguf`") from None
        self._gguf = gguf
        self.reader = gguf.GGUFReader(path)
        self._opened(path)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        if hasattr(f, "contents"):
            return f.contents()
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i] for i in f.data]

    def field_length(self, key) -> Optional[int]:
        f = self.reader.fields.get(key)
        return None if f is None else len(f.data)

    def names(self):
        return list(self.tensors)

    def shape(self, name):
        # GGUF lists ne0 (the row length) first
        return tuple(int(s) for s in reversed(self.tensors[name].shape.tolist()))

    def read(self, name, n_rows=None):
        t = self.tensors[name]
        qtype = self._gguf.GGMLQuantizationType(int(t.tensor_type))
        Q = self._gguf.GGMLQuantizationType
        if qtype in (Q.F32, Q.F16, Q.BF16, Q.F64):  # stored as plain floats: keep the type, no dequantization
            flat = np.frombuffer(np.ascontiguousarray(t.data).tobytes(),
                                 dtype={Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.int16,
                                        Q.F64: np.float64}[qtype])
            rows = flat.reshape(self.shape(name))
            rows = np.array(rows if n_rows is None else rows[:n_rows], copy=True)
            out = torch.from_numpy(rows)
            return out.view(torch.bfloat16) if qtype == Q.BF16 else out
        try:
            values = self._gguf.quants.dequantize(t.data, qtype)
        except (NotImplementedError, KeyError, ValueError) as exc:
            from importlib.metadata import version

            raise NotImplementedError(
                f"GGUF tensor {name!r} is stored as {qtype.name}, which the installed gguf {version('gguf')} cannot "
                f"dequantize ({exc}); convert the file to another type (for example Q8_0, F16 or F32) with "
                f"llama.cpp, or load the original safetensors checkpoint"
            ) from None
        values = np.asarray(values).reshape(self.shape(name))
        if n_rows is not None:
            values = values[:n_rows]
        values = np.ascontiguousarray(values) if values.flags.writeable else np.array(values, copy=True)
        out = torch.from_numpy(values)
        return out.to(torch.float32) if out.dtype == torch.float64 else out


def _directory_reader(path: str) -> _Reader:
    candidates = [("model.safetensors.index.json", _ShardedSafetensorsReader),
                  ("model.safetensors", _SafetensorsReader),
                  ("pytorch_model.bin", _TorchReader)]
    for name, cls in candidates:
        if os.path.exists(os.path.join(path, name)):
            return cls(os.path.join(path, name))
    if os.path.exists(os.path.join(path, "pytorch_model.bin.index.json")):
        raise NotImplementedError(f"{path} holds a sharded pytorch_model.bin checkpoint; convert it to safetensors "
                                  f"(transformers: model.save_pretrained(dir, safe_serialization=True))")
    single = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    ggufs = [f for f in sorted(os.listdir(path)) if f.endswith(".gguf")]
    if len(single) == 1:
        return _SafetensorsReader(os.path.join(path, single[0]))
    if len(ggufs) == 1 and not single:
        return _GGUFReader(os.path.join(path, ggufs[0]))
    raise FileNotFoundError(
        f"{path} has no model.safetensors, model.safetensors.index.json, pytorch_model.bin or single "
        f".gguf/.safetensors "
        f"file (found: {sorted(os.listdir(path))[:20]}); pass the weights file itself")


def open_reader(resolved: ResolvedSource) -> _Reader:
    if resolved.kind == "directory":
        return _directory_reader(resolved.path)
    return {"safetensors": _SafetensorsReader, "gguf": _GGUFReader, "npy": _NpyReader, "pt": _TorchReader,
            "sharded-index": _ShardedSafetensorsReader}[resolved.kind](resolved.path)
