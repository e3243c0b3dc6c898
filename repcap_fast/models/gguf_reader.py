"""The GGUF reader.

A file's header walked with every size it claims checked against the file, then its metadata and
tensors through the `gguf` package; only the tensor asked for is read, and of it only the rows asked
for are dequantized (GGUF quantizes each row on its own, in blocks along the row).
"""

from __future__ import annotations

import mmap
import struct
from typing import Optional

import numpy as np
import torch

from ._reader_base import _bounded_prod, _file_size, _Reader, _too_short, _unreadable

# GGUF metadata value types (gguf.GGUFValueType): the fixed sizes of the scalar ones.
_GGUF_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4
_GGUF_MAX_DIMS = 4  # GGML_MAX_DIMS
_GGUF_MAX_NESTING = 8


class _GGUFLayout:
    """A walk over a GGUF file's header (metadata and tensor infos) with every length.

    Count and offset checked against the file's size before it is used: the `gguf` package trusts
    them (an array that runs past the end of the file loops for as many elements as it claims).
    """

    def __init__(self, path: str, buf, gguf):
        self.path, self.buf, self.size, self.pos, self.gguf = path, buf, len(buf), 0, gguf
        self.order = "<"

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def take(self, n: int, what: str) -> int:
        left = self.size - self.pos
        if n > left:
            raise self.fail(f"truncated or corrupt: {what} at byte {self.pos} needs {n} bytes, the file has {left} "
                            f"left")
        start = self.pos
        self.pos += n
        return start

    def uint(self, fmt: str, what: str) -> int:
        return struct.unpack_from(self.order + fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, decode: bool = False) -> Optional[str]:
        n = self.uint("Q", f"the length of {what}")
        start = self.take(n, what)
        if not decode:
            return None
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"corrupt: {what} at byte {start} is not UTF-8 text") from None

    def strings(self, n: int, what: str) -> None:
        """Skip n strings (a tokenizer's vocabulary: tens of thousands), each length checked."""
        length, buf, size, pos = struct.Struct(self.order + "Q"), self.buf, self.size, self.pos
        for i in range(n):
            end = pos + 8 + (length.unpack_from(buf, pos)[0] if pos + 8 <= size else 0)
            if pos + 8 > size or end > size:
                self.pos = pos
                raise self.fail(f"truncated or corrupt: {what}[{i}] at byte {pos} runs past the end of the file "
                                f"({size} bytes)")
            pos = end
        self.pos = pos

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _GGUF_SCALAR_SIZE:
            self.take(_GGUF_SCALAR_SIZE[vtype], what)
        elif vtype == _GGUF_STRING:
            self.string(what)
        elif vtype == _GGUF_ARRAY:
            if depth >= _GGUF_MAX_NESTING:
                raise self.fail(f"corrupt: {what} nests arrays more than {_GGUF_MAX_NESTING} deep")
            itype = self.uint("I", f"the element type of {what}")
            n = self.uint("Q", f"the length of {what}")
            left = self.size - self.pos
            if itype in _GGUF_SCALAR_SIZE:
                self.take(n * _GGUF_SCALAR_SIZE[itype], f"{what} ({n} elements)")
            elif itype in (_GGUF_STRING, _GGUF_ARRAY):
                least = 8 if itype == _GGUF_STRING else 12  # a string's length; an array's type and length
                if n * least > left:
                    raise self.fail(f"truncated or corrupt: {what} claims {n} elements (at least {n * least} bytes) "
                                    f"at byte {self.pos}, the file has {left} left")
                if itype == _GGUF_STRING:
                    self.strings(n, what)
                else:
                    for i in range(n):
                        self.value(itype, f"{what}[{i}]", depth + 1)
            else:
                raise self.fail(f"corrupt: {what} has an unknown element type {itype}")
        else:
            raise self.fail(f"corrupt: {what} has an unknown value type {vtype}")

    def walk(self) -> None:
        if bytes(self.buf[:4]) != b"GGUF":
            raise self.fail(f"not a GGUF file (it starts with {bytes(self.buf[:4])!r}, not b'GGUF')")
        self.take(4, "the magic")
        version = self.uint("I", "the version")
        if version & 0xFFFF == 0:  # written on a big-endian machine
            self.order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in (2, 3):
            raise self.fail(f"GGUF version {version}: only versions 2 and 3 are read")
        n_tensors = self.uint("Q", "the tensor count")
        n_kv = self.uint("Q", "the metadata count")
        left = self.size - self.pos
        if n_kv * 13 > left:  # a key's length (8), a value type (4), at least one byte of value
            raise self.fail(f"truncated or corrupt: the header claims {n_kv} metadata entries, which need at least "
                            f"{n_kv * 13} bytes; the file has {left} left")
        alignment = 32
        keys = set()
        for i in range(n_kv):
            key = self.string(f"the key of metadata entry {i}", decode=True)
            if key in keys:
                raise self.fail(f"corrupt: metadata key {key!r} appears twice")
            keys.add(key)
            vtype = self.uint("I", f"the value type of {key!r}")
            if key != "general.alignment":
                self.value(vtype, f"the value of {key!r}")
                continue
            if vtype != _GGUF_UINT32:
                raise self.fail(f"corrupt: general.alignment has value type {vtype}, not uint32")
            alignment = self.uint("I", "the value of 'general.alignment'")
            if alignment == 0 or alignment & (alignment - 1):
                raise self.fail(f"corrupt: general.alignment is {alignment}, not a power of two")
        left = self.size - self.pos
        if n_tensors * 32 > left:  # a name's length (8), n_dims (4), a dimension (8), the type (4), the offset (8)
            raise self.fail(f"truncated or corrupt: the header claims {n_tensors} tensors, which need at least "
                            f"{n_tensors * 32} bytes; the file has {left} left")
        Q = self.gguf.GGMLQuantizationType
        infos, names = [], set()
        for i in range(n_tensors):
            name = self.string(f"the name of tensor {i}", decode=True)
            if name in names:
                raise self.fail(f"corrupt: tensor {name!r} appears twice")
            names.add(name)
            n_dims = self.uint("I", f"the number of dimensions of {name!r}")
            if not 1 <= n_dims <= _GGUF_MAX_DIMS:
                raise self.fail(f"corrupt: tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to "
                                f"{_GGUF_MAX_DIMS})")
            dims = [self.uint("Q", f"dimension {j} of {name!r}") for j in range(n_dims)]
            raw_type = self.uint("I", f"the type of {name!r}")
            offset = self.uint("Q", f"the data offset of {name!r}")
            try:
                qtype = Q(raw_type)
                block, type_size = self.gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise self.fail(f"corrupt: tensor {name!r} has an unknown type {raw_type}") from None
            if dims[0] % block:
                raise self.fail(f"corrupt: tensor {name!r} is {qtype.name}, stored in blocks of {block}, but its "
                                f"rows have {dims[0]} values")
            numel = _bounded_prod(dims)
            n_bytes = None if numel is None else numel * type_size // block
            infos.append((name, dims, qtype, offset, n_bytes))
        data_start = self.pos + (-self.pos) % alignment
        for name, dims, qtype, offset, n_bytes in infos:
            if n_bytes is None or data_start + offset + n_bytes > self.size:
                claim = "over 2**64 bytes" if n_bytes is None else \
                    f"bytes {data_start + offset}..{data_start + offset + n_bytes}"
                raise self.fail(f"truncated: tensor {name!r} ({qtype.name}, shape {list(reversed(dims))}) claims "
                                f"{claim}, the file has {self.size}")


def check_gguf(path: str, gguf=None) -> None:
    """Check a GGUF file's header against its size (see _GGUFLayout).

    ValueError naming the file when it is truncated, corrupt or not GGUF.
    """
    if gguf is None:
        import gguf
    size = _file_size(path)
    if size < 24:
        raise _too_short(path, size, "a GGUF file")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        _GGUFLayout(path, buf, gguf).walk()


class _GGUFReader(_Reader):
    """A GGUF file through the `gguf` package.

    Metadata and tensor headers are parsed (after a check of every size they claim against the
    file's), and only the tensor asked for is dequantized.
    """

    kind = "gguf"

    def __init__(self, path: str):
        super().__init__()
        try:
            import gguf
        except ImportError:
            raise ImportError("reading GGUF files needs the `gguf` package: `pip install gguf`") from None
        self._gguf = gguf
        self.path = path
        check_gguf(path, gguf)
        try:
            self.reader = gguf.GGUFReader(path)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - the package raises ValueError, KeyError, IndexError, ...
            raise _unreadable(path, "corrupt GGUF file", exc) from exc
        self._opened(path)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            if hasattr(f, "contents"):
                return f.contents()
            return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i] for i in f.data]
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - UnicodeDecodeError, IndexError, ... of a corrupt value
            raise _unreadable(self.path, f"corrupt GGUF metadata value {key!r}", exc) from exc

    def field_length(self, key) -> Optional[int]:
        f = self.reader.fields.get(key)
        return None if f is None else len(f.data)

    def names(self):
        return list(self.tensors)

    def shape(self, name):
        # GGUF lists ne0 (the row length) first
        return tuple(int(s) for s in reversed(self.tensors[name].shape.tolist()))

    def read(self, name, n_rows=None):
        try:
            return self._read(name, n_rows)
        except (NotImplementedError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise _unreadable(self.path, f"cannot read tensor {name!r}", exc) from exc

    def _read(self, name, n_rows=None):
        t = self.tensors[name]
        qtype = self._gguf.GGMLQuantizationType(int(t.tensor_type))
        Q = self._gguf.GGMLQuantizationType
        plain = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.int16, Q.F64: np.float64, Q.I8: np.int8,
                 Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}
        shape = self.shape(name)
        # The stored bytes, a view of the memory map (nothing read yet). Rows are independent (a
        # quantized row is whole blocks along it), so only the rows asked for are cut out, read and
        # dequantized: the same values as dequantizing all and then cutting.
        raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
        if n_rows is not None and shape and 0 < n_rows < shape[0]:
            raw = raw[: n_rows * (raw.size // shape[0])]
            shape = (n_rows,) + shape[1:]
        if qtype in plain:  # stored as plain numbers: keep the type, no dequantization
            rows = np.frombuffer(raw, dtype=plain[qtype]).reshape(shape).copy()
            out = torch.from_numpy(rows)
            return out.view(torch.bfloat16) if qtype == Q.BF16 else out
        block, type_size = self._gguf.GGML_QUANT_SIZES[qtype]
        data = raw.reshape(shape[:-1] + (shape[-1] // block * type_size,))  # each row: its blocks' bytes
        try:
            with np.errstate(all="ignore"):  # corrupt blocks dequantize to inf/NaN: the values say so
                values = self._gguf.quants.dequantize(data, qtype)
        except (NotImplementedError, KeyError, ValueError) as exc:
            from importlib.metadata import version

            raise NotImplementedError(
                f"{self.path}: GGUF tensor {name!r} is stored as {qtype.name}, which the installed gguf "
                f"{version('gguf')} cannot dequantize ({exc}); convert the file to another type (for example Q8_0, "
                f"F16 or F32) with llama.cpp, or load the original safetensors checkpoint"
            ) from None
        values = np.asarray(values).reshape(shape)
        values = np.ascontiguousarray(values) if values.flags.writeable else np.array(values, copy=True)
        out = torch.from_numpy(values)
        return out.to(torch.float32) if out.dtype == torch.float64 else out
