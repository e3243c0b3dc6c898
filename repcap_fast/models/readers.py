"""Checkpoint readers.

Tensor names and shapes first, data only for the tensor asked for (safetensors, sharded safetensors,
.pt/.bin state dicts, .npy, GGUF: repcap_fast.models.gguf_reader).

A file that is not what it claims to be (empty, truncated, corrupt, garbage) raises a ValueError
whose message starts with the file's path and says what is wrong; a missing file stays a
FileNotFoundError. Every size a header claims is checked against the file's size before
anything is allocated or read, and every loop over a header's entries is bounded by the file's
size.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import warnings
import zipfile
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .._validation import layout_problem
from ._reader_base import (  # noqa: F401 - re-exported: the readers' interface and helpers
    _HUGE,
    MissingTensorError,
    _bounded_prod,
    _file_size,
    _is_count,
    _Reader,
    _too_short,
    _unreadable,
    _why,
)
from .gguf_reader import _GGUFLayout, _GGUFReader, check_gguf  # noqa: F401 - re-exported
from .sources import ResolvedSource

# Bits per element of the safetensors dtypes (others are left to the safetensors package to judge).
_SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                     "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
                     "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
_SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors package's own limit


def check_safetensors(path: str) -> Dict[str, dict]:
    """The header of a safetensors file {name: {dtype, shape, data_offsets}}, checked against the file's size.

    ValueError naming the file when it is truncated, corrupt or not safetensors.
    """
    size = _file_size(path)
    if size < 8:
        raise _too_short(path, size, "a safetensors file (an 8-byte header length, then a JSON header)")
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n > size - 8:
            raise ValueError(f"{path}: truncated or not a safetensors file: the header length says {n} bytes, "
                             f"the file has {size - 8} after it")
        if n > _SAFETENSORS_MAX_HEADER:
            raise ValueError(f"{path}: not a safetensors file: a header of {n} bytes is over the format's limit "
                             f"({_SAFETENSORS_MAX_HEADER})")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _unreadable(path, "not a safetensors file: its header is not JSON", exc) from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file: its header is a JSON {type(header).__name__}, "
                         f"not an object")
    data_size = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: its header entry is a {type(info).__name__}, not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise ValueError(f"{where}: dtype is {dtype!r}, not a string")
        if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
            raise ValueError(f"{where}: shape is {str(shape)[:80]}, not a list of non-negative ints")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
                or offsets[0] > offsets[1]):
            raise ValueError(f"{where}: data_offsets is {str(offsets)[:80]}, not [begin, end] with 0 <= begin <= end")
        spans.append((offsets[0], offsets[1], name, dtype, shape))
    claimed = max((end for _, end, *_ in spans), default=0)
    if claimed > data_size:
        raise ValueError(f"{path}: truncated: the header says {claimed} bytes of tensor data, the file has "
                         f"{data_size}")
    for begin, end, name, dtype, shape in spans:
        bits = _SAFETENSORS_BITS.get(dtype)
        if bits is None:
            continue  # a dtype this table does not know: the safetensors package judges it
        numel = _bounded_prod(shape)
        if numel is None or numel * bits != (end - begin) * 8:
            raise ValueError(f"{path}: tensor {name!r}: {dtype} of shape {str(shape)[:80]} needs "
                             f"{'over 2**64 bytes' if numel is None else f'{numel * bits / 8:g} bytes'}, "
                             f"but its data_offsets span {end - begin}")
    at = 0
    for begin, end, name, *_ in sorted(spans):
        if begin != at:
            raise ValueError(f"{path}: corrupt: tensor {name!r} starts at byte {begin} of the data, expected {at} "
                             f"(tensors must cover the data without gaps or overlaps)")
        at = end
    if at != data_size:
        raise ValueError(f"{path}: corrupt: the tensors cover {at} bytes of data, the file has {data_size}")
    return {name: info for name, info in header.items() if name != "__metadata__"}


class _SafetensorsReader(_Reader):
    kind = "safetensors"

    def __init__(self, path: str):
        super().__init__()
        from safetensors import safe_open

        self.path = path
        self.header = check_safetensors(path)  # sizes checked before anything is mapped or read
        try:
            self._file = safe_open(path, framework="pt")
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - the package's own error class (SafetensorError), or any other
            raise _unreadable(path, "not a readable safetensors file", exc) from exc
        self._opened(path)

    def names(self):
        return list(self._file.keys())

    def _check_name(self, name):
        if name not in self.header:
            raise MissingTensorError(f"{self.path} has no tensor {name!r}")

    def shape(self, name):
        self._check_name(name)
        return tuple(self.header[name]["shape"])

    def read(self, name, n_rows=None):
        self._check_name(name)
        try:
            if n_rows is None or not self.header[name]["shape"]:
                return self._file.get_tensor(name)
            return self._file.get_slice(name)[:n_rows]
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(self.path, f"cannot read tensor {name!r}", exc) from exc


class _ShardedSafetensorsReader(_Reader):
    """model.safetensors.index.json.

    The names come from the index; a shard is opened only when a tensor in it is read.
    """

    kind = "sharded-safetensors"

    def __init__(self, index_path: str):
        super().__init__()
        self.index_path = index_path
        index = read_json(index_path, "a sharded safetensors index")
        weight_map = index.get("weight_map")
        if weight_map is None:
            raise ValueError(f"{index_path}: no \"weight_map\" in this sharded safetensors index (keys: "
                             f"{_keys_listing(index)}); it should map each tensor name to its shard file")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path}: \"weight_map\" is a {_json_type(weight_map)}, not an object mapping "
                             f"tensor names to shard files")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or os.path.isabs(shard):
                raise ValueError(f"{index_path}: weight_map[{name!r}] is {str(shard)[:80]!r}, not the file name of "
                                 f"a shard next to the index")
        self.weight_map = weight_map
        self._opened(index_path)
        self.directory = os.path.dirname(index_path)
        self._shards: Dict[str, _SafetensorsReader] = {}

    def _shard(self, name):
        path = os.path.join(self.directory, self.weight_map[name])
        if path not in self._shards:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{self.index_path}: weight_map puts {name!r} in {self.weight_map[name]!r}, "
                                        f"but {path} does not exist")
            self._shards[path] = _SafetensorsReader(path)
            self._opened(path)
        shard = self._shards[path]
        if name not in shard.header:
            raise ValueError(f"{self.index_path}: weight_map puts {name!r} in {path}, which has no such tensor "
                             f"(it has: {_keys_listing(shard.header)})")
        return shard

    def names(self):
        return list(self.weight_map)

    def shape(self, name):
        return self._shard(name).shape(name)

    def read(self, name, n_rows=None):
        return self._shard(name).read(name, n_rows)


def _json_type(x) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(x), "number")


def _keys_listing(d: dict, limit: int = 12) -> str:
    keys = [str(k)[:60] for k in d][:limit]
    return ", ".join(keys) + (f" … ({len(d)} in all)" if len(d) > limit else "") if keys else "none"


def read_json(path: str, what: str) -> dict:
    """A JSON object from `path` (a config.json, tokenizer.json, index).

    ValueError naming the file when it is not UTF-8, not JSON, or not an object.
    """
    size = _file_size(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    if size == 0 or not raw.strip():
        raise ValueError(f"{path}: empty file: expected {what} (a JSON object)")
    try:
        obj = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}): expected {what} (a JSON object)") from exc
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError; RecursionError: nested too deep
        raise _unreadable(path, f"not valid JSON: expected {what}", exc) from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: a JSON {_json_type(obj)}, expected {what} (a JSON object)")
    return obj


_ZIP_MAGIC = b"PK\x03\x04"


def _check_torch_zip(path: str, size: int) -> None:
    """A zip checkpoint (torch.save's format since 1.6).

    Its directory parsed, and every record's bytes inside the file.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (MemoryError, FileNotFoundError):
        raise
    except Exception as exc:  # noqa: BLE001 - BadZipFile, struct.error, UnicodeDecodeError, ... on a corrupt directory
        raise _unreadable(path, "truncated or corrupt PyTorch checkpoint (not a readable zip archive)", exc) from exc
    if not any(i.filename.endswith("/data.pkl") or i.filename == "data.pkl" for i in infos):
        raise ValueError(f"{path}: a zip archive without data.pkl, not a PyTorch checkpoint")
    for info in infos:
        end = info.header_offset + 30 + info.compress_size  # at least: a local header is 30 bytes and a name
        if end > size:
            raise ValueError(f"{path}: truncated or corrupt PyTorch checkpoint: record {info.filename!r} claims "
                             f"{info.compress_size} bytes at offset {info.header_offset}, past the end of the "
                             f"file ({size} bytes)")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise ValueError(f"{path}: corrupt PyTorch checkpoint: record {info.filename!r} is stored uncompressed "
                             f"but claims {info.file_size} bytes for {info.compress_size} on disk")
        if info.file_size > 1100 * info.compress_size + 1024:  # beyond any deflate ratio: a corrupt size field
            raise ValueError(f"{path}: corrupt PyTorch checkpoint: record {info.filename!r} claims "
                             f"{info.file_size} bytes unpacked from {info.compress_size}")


_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER: the first pickle of the format
_PICKLE_INTS = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4")  # opcodes that push an int


class _Capped:
    """A binary file whose read(n) never asks for more than what is left.

    pickletools would otherwise allocate the n a corrupt length field claims.
    """

    def __init__(self, fh, size: int):
        self.fh, self.size = fh, size

    def read(self, n: int = -1) -> bytes:
        left = max(0, self.size - self.fh.tell())
        return self.fh.read(left if n is None or n < 0 else min(n, left))

    def readline(self) -> bytes:
        return self.fh.readline()

    def tell(self) -> int:
        return self.fh.tell()


def _check_torch_legacy(path: str, size: int) -> None:
    """A checkpoint in torch.save's legacy format (before 1.6: a few pickles, then the storages).

    The pickles are walked without running them, and no storage may claim more elements than the
    file has bytes (torch would allocate it before reading). A pickle that does not start with
    torch.save's magic number is a plain Python pickle, refused as one.
    """
    last_int = None
    with open(path, "rb") as raw:
        fh = _Capped(raw, size)
        for i in range(4):  # magic number, protocol version, system info, the object (storages are persistent ids)
            if fh.tell() >= size:
                raise ValueError(f"{path}: truncated PyTorch checkpoint (legacy format): it ends after "
                                 f"{size} bytes, inside its pickled header")
            ops = set()
            try:
                for op, arg, _pos in pickletools.genops(fh):
                    ops.add(op.name)
                    if op.name in _PICKLE_INTS and isinstance(arg, int) and not isinstance(arg, bool):
                        last_int = arg
                    elif op.name in ("BINPERSID", "PERSID") and last_int is not None and last_int > size:
                        raise ValueError(f"{path}: corrupt PyTorch checkpoint (legacy format): a storage claims "
                                         f"{last_int} elements, the file has {size} bytes")
                    if op.name == "STOP":
                        break
            except ValueError as exc:
                if str(exc).startswith(f"{path}: "):
                    raise
                raise _unreadable(path, "not a PyTorch checkpoint (neither a zip archive nor a readable pickle)",
                                  exc) from exc
            except Exception as exc:  # noqa: BLE001 - pickletools raises assorted errors on garbage
                raise _unreadable(path, "not a PyTorch checkpoint (neither a zip archive nor a readable pickle)",
                                  exc) from exc
            if i == 0 and (last_int != _TORCH_LEGACY_MAGIC or len(ops - {"PROTO", "FRAME", "STOP"}) != 1):
                raise ValueError(
                    f"{path}: a plain Python pickle, not a PyTorch checkpoint (torch.save writes a zip archive, or "
                    f"in its legacy format a pickle of its magic number first): refused, since only weights are "
                    f"loaded and unpickling it could run code. Save the tensors with torch.save(state_dict, path) "
                    f"or as safetensors")


class _TorchReader(_Reader):
    """A .pt/.bin state dict (or a bare tensor), memory-mapped.

    Weights only (a checkpoint that needs any Python object beyond tensors and containers is
    refused: unpickling it could run code).
    """

    kind = "pt"

    def __init__(self, path: str):
        super().__init__()
        size = _file_size(path)
        if size < 4:
            raise _too_short(path, size, "a PyTorch checkpoint")
        with open(path, "rb") as fh:
            is_zip = fh.read(4) == _ZIP_MAGIC
        (_check_torch_zip if is_zip else _check_torch_legacy)(path, size)
        try:
            with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: noise beside the error
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")  # refused on read
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
        except pickle.UnpicklingError as exc:
            # torch wraps the weights-only unpickler's own error in a long message; that error says what is wrong
            inner = exc.__context__ if exc.__context__ is not None else exc
            detail = " ".join(str(inner).split()) or type(inner).__name__
            if "WeightsUnpickler error:" in detail:
                detail = detail.split("WeightsUnpickler error:", 1)[1].strip()
            detail = detail.split(". Please use", 1)[0].split(" Check the documentation", 1)[0].rstrip(".")
            if "Unsupported global" in detail or "allowed global" in detail or "unsupported GLOBAL" in detail:
                raise ValueError(
                    f"{path}: refused: this checkpoint holds pickled Python objects, not only tensors (loading it "
                    f"could run code; only weights are read): {detail[:160]}. If you trust the file, load it "
                    f"yourself and save the tensors with torch.save(model.state_dict(), ...) or as safetensors"
                ) from exc
            raise ValueError(f"{path}: corrupt PyTorch checkpoint ({detail[:240]})") from exc
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, KeyError, ... on bad files
            raise _unreadable(path, "truncated or corrupt PyTorch checkpoint", exc) from exc
        self._opened(path)
        if isinstance(obj, torch.Tensor):
            obj = {"": obj}
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ValueError(f"{path}: holds a {type(obj).__name__}, not a tensor or a state dict of tensors")
        if not all(isinstance(k, str) for k in obj):
            raise ValueError(f"{path}: holds a dict whose keys are not all strings, not a state dict of tensors")
        self.path = path
        self.tensors = obj

    def names(self):
        return list(self.tensors)

    def _tensor(self, name):
        """The tensor `name`, refused with the file and its layout when it is not dense (sparse, nested)."""
        t = self.tensors[name]
        problem = layout_problem(t)
        if problem is not None:
            which = f"the tensor {name!r}" if name else "its tensor"
            raise ValueError(f"{self.path}: {which} is {problem.split(':')[0]}; save it dense (t.to_dense()) to "
                             "read it")
        return t

    def shape(self, name):
        return tuple(self._tensor(name).shape)

    def read(self, name, n_rows=None):
        t = self._tensor(name)
        if n_rows is None or t.dim() == 0:
            return t
        return t[:n_rows]


_NPY_KINDS = "biuf"  # bool, signed and unsigned ints, floats: the dtypes torch.from_numpy takes


def _npy_dtype_problem(path: str, dtype: np.dtype) -> Optional[str]:
    """Why torch cannot hold an array of this dtype (None when it can).

    Not real numbers, or a float wider than float64 (np.longdouble: float128 on most machines).
    """
    if dtype.kind not in _NPY_KINDS or dtype.subdtype is not None or dtype.fields is not None:
        return (f"{path}: the array's dtype {dtype} is not a real numeric dtype (bool, int or float); save it as "
                f"float64 or float32")
    if dtype.itemsize > 8:
        return (f"{path}: the array's dtype {dtype} ({dtype.itemsize * 8}-bit np.longdouble) is wider than any "
                f"dtype torch holds; save it as float64 or float32 (np.save(path, a.astype(np.float64)))")
    return None


def check_npy(path: str) -> Optional[Tuple[Tuple[int, ...], np.dtype]]:
    """(shape, dtype) from the header of a .npy file, checked against the file's size.

    ValueError naming the file when it is truncated, corrupt, not .npy, or holds Python objects
    (None for a format-3.0 header, left to np.load).
    """
    from numpy.lib import format as npy_format

    size = _file_size(path)
    if size < 10:
        raise _too_short(path, size, "a .npy file")
    with open(path, "rb") as fh:
        try:
            version = npy_format.read_magic(fh)
        except ValueError as exc:
            raise _unreadable(path, "not a .npy file", exc) from exc
        read_header = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}.get(version)
        if read_header is None:
            return None  # format 3.0 (UTF-8 field names): np.load judges it, mapped (never allocated)
        try:
            shape, _fortran, dtype = read_header(fh)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - ValueError mostly; the header is a Python literal
            raise _unreadable(path, "corrupt .npy header", exc) from exc
        offset = fh.tell()
    if not all(_is_count(s) for s in shape):
        raise ValueError(f"{path}: corrupt .npy header: shape {shape} is not a tuple of non-negative ints")
    if dtype.hasobject:
        raise ValueError(f"{path}: refused: the array holds Python objects (dtype {dtype}), which only pickle can "
                         f"read (and unpickling could run code); save a numeric array")
    problem = _npy_dtype_problem(path, dtype)
    if problem:
        raise ValueError(problem)
    numel = _bounded_prod(shape)
    need = None if numel is None else numel * dtype.itemsize
    if need is None or offset + need > size:
        raise ValueError(f"{path}: truncated: the header says shape {str(shape)[:80]} of {dtype} "
                         f"({'over 2**64 bytes' if need is None else f'{need} bytes'} of data), "
                         f"the file has {size - offset}")
    return shape, dtype


class _NpyReader(_Reader):
    kind = "npy"

    def __init__(self, path: str):
        super().__init__()
        check_npy(path)  # sizes checked before anything is mapped
        try:
            self.array = np.load(path, mmap_mode="r", allow_pickle=False)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(path, "not a readable .npy file", exc) from exc
        if not isinstance(self.array, np.ndarray):
            raise ValueError(f"{path}: not a .npy array of a real numeric dtype")
        problem = _npy_dtype_problem(path, self.array.dtype)
        if problem:
            raise ValueError(problem)
        self.path = path
        self._opened(path)

    def names(self):
        return [""]

    def shape(self, name):
        return tuple(self.array.shape)

    def read(self, name, n_rows=None):
        a = self.array if n_rows is None or self.array.ndim == 0 else self.array[:n_rows]
        # out of the read-only memory map, in the machine's byte order (torch takes no other)
        return torch.from_numpy(np.array(a, dtype=a.dtype.newbyteorder("="), copy=True))


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
    """The reader of a resolved source's tensors (safetensors, sharded safetensors, GGUF, .npy, .pt).

    Args:
        resolved (ResolvedSource): the source (`resolve_source`); a directory is searched for its
            weights file.

    Returns:
        _Reader: a reader with names(), shape(name) and read(name, rows).

    Raises:
        ValueError: a file whose header does not parse, or a directory without weights.
    """
    if resolved.kind == "directory":
        return _directory_reader(resolved.path)
    return {"safetensors": _SafetensorsReader, "gguf": _GGUFReader, "npy": _NpyReader, "pt": _TorchReader,
            "sharded-index": _ShardedSafetensorsReader}[resolved.kind](resolved.path)
