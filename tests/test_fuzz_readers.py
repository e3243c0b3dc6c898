"""Fuzz targets for every file reader: safetensors, a sharded index, GGUF, .npy, .pt (zip and
legacy), config.json, tokenizer.json and sweep files (JSON and CSV).

Each target writes a small valid file, corrupts it at random and reads it back through the reader
(every name, shape and tensor) and through load_embeddings / load_cells. Corruptions: bytes (bit
flips, random bytes over a range, a range cut out or repeated, a truncation), boundary integers
such as 2**63 written over the format's own length, count and offset fields (found by walking the
valid file: the GGUF header, the zip records and pickle opcodes of a .pt, the safetensors and
.npy header lengths), and, for the JSON and CSV formats and the safetensors and .npy headers,
edits of the parsed structure (a value of another type, a key dropped, added or renamed, nesting
too deep to parse). The reader must either return (a flip inside float data is legitimate) or
raise ValueError (or FileNotFoundError) whose one-line message names the file; any other
exception fails the target. The randomness is hypothesis's (derandomized in CI by the "repcap"
profile; REPCAP_HYPOTHESIS_SCALE=10 runs ten times the examples).

Hangs and huge allocations are ruled out by the readers' checks of every claimed size against the
file's size, before the underlying library parses anything: the explicit tests below check that
those checks refuse first (the library replaced by a function that fails the test), and every
target checks that the process's peak memory did not jump.

Then plain regression tests of the file bugs the issue "Reliability" lists (each failed before
the fix), and the CLI's one-line error for a bad file.
"""
import copy
import csv
import io
import json
import os
import pickletools
import struct
import zipfile

import numpy as np
import pytest
import torch

from repcap_fast import cli
from repcap_fast.models import embeddings as embeddings_module
from repcap_fast.models import load_embeddings, readers
from repcap_fast.models.readers import open_reader
from repcap_fast.models.sources import resolve_source
from repcap_fast.packing.sweep_file import (
    CELL_FIELDS,
    _certificate,
    is_sweep_file,
    load_cells,
    merge_cells,
    write_cells,
)

from _helpers import examples

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

try:
    import resource
except ImportError:  # not on Windows: the peak-memory check is skipped there
    resource = None

# Integers written over length, count and offset fields (little-endian, cut to the field's width).
BOUNDARY = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 2**31 - 1, 2**32 - 1, 2**32, 10**12, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
MAX_RSS_GROWTH = 512 * 2**20  # bytes: a reader that allocated what a corrupt header claims would exceed it
RANDOMS = st.randoms(use_true_random=True)  # seeded by hypothesis: derandomized in CI, replayable from its blob


@pytest.fixture(autouse=True)
def _no_transformers(monkeypatch):
    """load_embeddings asks transformers for a model type's default tie only when a checkpoint has
    no output tensor: a corrupt name can get there; keep transformers (seconds, hundreds of MB)
    out of the fuzzing."""
    monkeypatch.setattr(embeddings_module, "_tie_default", lambda model_type: None)


def _peak_rss() -> int:
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# --- corruption ----------------------------------------------------------------------------------------

def _int_value(rnd, width: int) -> bytes:
    value = rnd.choice(BOUNDARY + (rnd.getrandbits(8 * width),)) % 2 ** (8 * width)
    return value.to_bytes(width, "little")


def corrupt(rnd, content: bytes, *, header: int, fields=(), min_edits: int = 1, truncate: float = 0.3) -> bytes:
    """`content` with min_edits..4 byte-level edits (a bit flip, random bytes over a range, an
    integer over 1-8 bytes, a range cut out or repeated, or an integer over one of `fields`, the
    (offset, width) of the format's length/count/offset fields), 60% of them in the first `header`
    bytes, then a truncation at a random offset with probability `truncate` (always when nothing
    else changed)."""
    buf = bytearray(content)
    for _ in range(rnd.randint(min_edits, 4)):
        if not buf:
            break
        kind = rnd.choice(("flip", "flip", "bytes", "int", "cut", "repeat") + ("field",) * (3 if fields else 0))
        at = rnd.randrange(len(buf) if rnd.random() < 0.4 else max(1, min(header, len(buf))))
        n = rnd.randint(1, 16)
        if kind == "flip":
            buf[at] ^= 1 << rnd.randrange(8)
        elif kind == "bytes":
            buf[at:at + n] = rnd.randbytes(n)
        elif kind == "int":
            width = rnd.choice((1, 2, 4, 8))
            buf[at:at + width] = _int_value(rnd, width)
        elif kind == "cut":
            del buf[at:at + n]
        elif kind == "repeat":
            buf[at:at] = buf[at:at + n]
        else:
            offset, width = rnd.choice(fields)
            buf[offset:offset + width] = _int_value(rnd, width)
    if rnd.random() < truncate or bytes(buf) == content:
        buf = buf[:rnd.randrange(len(buf))] if buf else buf
    return bytes(buf)


# JSON values put in place of others: wrong types, boundary numbers, NaN, nesting too deep to parse.
JSON_POOL = (None, True, False, 0, -1, 1, 7, 2**31, 2**63, 2**64 + 1, 10**30, 1.5, -0.0, float("nan"), float("inf"),
             "", "x", "F32", "BF16", "llama", "float32", [], [0], [[]], {}, {"a": 1}, [-1, 5], [5, 1], [0, 2**63],
             [10**6, 10**6], [8, 4], "__DEEP__")
JSON_KEYS = ("weight_map", "cells", "format", "model", "vocab", "added_tokens", "id", "dtype", "shape", "data_offsets",
             "__metadata__", "text_config", "model_type", "tie_word_embeddings", "k", "d", "eps_star", "x")
DEEP = "[" * 5000 + "]" * 5000


def _slots(obj, out):
    """Every (container, key) of a JSON tree."""
    if isinstance(obj, dict):
        for key in list(obj):
            out.append((obj, key))
            _slots(obj[key], out)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.append((obj, i))
            _slots(value, out)
    return out


def mutate_json(rnd, obj, n_edits: int):
    """A copy of a JSON tree with n_edits edits: a value replaced (from JSON_POOL or a random int),
    a key or element deleted, added, renamed or repeated."""
    obj = copy.deepcopy(obj)
    for _ in range(n_edits):
        slots = _slots(obj, [])
        if not slots or rnd.random() < 0.03:
            obj = copy.deepcopy(rnd.choice(JSON_POOL))
            continue
        container, key = rnd.choice(slots)
        value = copy.deepcopy(rnd.choice(JSON_POOL + (rnd.randint(-2**70, 2**70), container[key])))
        op = rnd.choice(("replace", "replace", "replace", "delete", "add", "rename"))
        if op == "replace":
            container[key] = value
        elif op == "delete":
            del container[key]
        elif isinstance(container, dict):
            new_key = rnd.choice(JSON_KEYS) if op == "add" else key + rnd.choice(("x", "_", " ", "\u00e9"))
            container[new_key] = value if op == "add" else container.pop(key)
        else:
            container.insert(rnd.randrange(len(container) + 1), value)
    return obj


def dump_json(obj) -> bytes:
    return json.dumps(obj).replace('"__DEEP__"', DEEP).encode()


def fuzzed_json(rnd, original: bytes) -> bytes:
    """A JSON file mutated as a tree (70%), then perhaps at the byte level."""
    content = original
    if rnd.random() < 0.7:
        content = dump_json(mutate_json(rnd, json.loads(original), rnd.randint(1, 3)))
        if rnd.random() < 0.7:
            return content
    return corrupt(rnd, content, header=len(content), min_edits=0)


def write_bytes(path, content: bytes) -> str:
    """A fresh file (a new inode: a memory map of the previous example's file stays valid)."""
    path = str(path)
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as fh:
        fh.write(content)
    return path


def expect_clean(call, path, *, also=()):
    """call() returns, or raises ValueError / FileNotFoundError (or one of `also`) with a one-line
    message naming the file; anything else propagates and fails the target."""
    name = os.path.basename(str(path))
    try:
        call()
    except (ValueError, FileNotFoundError, *also) as exc:
        msg = str(exc)
        assert name in msg, f"{type(exc).__name__} does not name {name}: {msg}"
        assert "\n" not in msg, f"{type(exc).__name__} spans lines: {msg}"


def read_everything(path):
    """The reader's whole surface: names, shapes, every tensor, and its first rows."""
    reader = open_reader(resolve_source(str(path)))
    for name in reader.names():
        shape = reader.shape(name)
        reader.read(name)
        if len(shape) >= 1:
            reader.read(name, 1)


def check_file(path, content: bytes, readers, also=()):
    """Write `content` at `path` and read it with each reader: a result or a clean error; and the
    process's peak memory did not jump."""
    before = _peak_rss()
    write_bytes(path, content)
    for read in readers:
        expect_clean(lambda: read(str(path)), path, also=also)
    assert _peak_rss() - before < MAX_RSS_GROWTH


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def both(path):
    return load_embeddings(path, which="both")


# --- valid files, and where their length fields are ----------------------------------------------------

def valid_safetensors(path):
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": _randn(8, 4), "lm_head.weight": _randn(8, 4, seed=1).bfloat16(),
               "model.norm.weight": torch.ones(4, dtype=torch.float16)}, str(path))
    return str(path)


def valid_gguf(path):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(32)
    w.add_token_list([f"tok{i}" for i in range(8)])
    w.add_tensor("token_embd.weight", np.asarray(_randn(8, 32)))
    q8 = gguf.GGMLQuantizationType.Q8_0
    data = gguf.quants.quantize(np.asarray(_randn(8, 32, seed=1)), q8)
    w.add_tensor("output.weight", data, raw_shape=data.shape, raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def gguf_fields(path):
    """(offset, width) of every integer in a GGUF header (counts, lengths, types, dims, offsets),
    found by the reader's own walk over it; and where the header ends."""
    import gguf

    fields = []

    class Recorder(readers._GGUFLayout):
        def uint(self, fmt, what):
            fields.append((self.pos, struct.calcsize(fmt)))
            return super().uint(fmt, what)

    walk = Recorder(str(path), open(path, "rb").read(), gguf)
    walk.walk()
    return fields, walk.pos


# pickle opcodes followed by an integer argument (a value, a length, a memo index), and its width
_PICKLE_ARGS = {"BININT1": 1, "BININT2": 2, "BININT": 4, "BINPUT": 1, "LONG_BINPUT": 4, "BINGET": 1,
                "LONG_BINGET": 4, "SHORT_BINUNICODE": 1, "BINUNICODE": 4, "SHORT_BINBYTES": 1, "BINBYTES": 4,
                "LONG1": 1, "PROTO": 1, "FRAME": 8, "SHORT_BINSTRING": 1, "BINSTRING": 4}


def pickle_fields(blob: bytes, base: int = 0, pickles: int = 1):
    fields, f = [], io.BytesIO(blob)
    for _ in range(pickles):
        for op, _arg, pos in pickletools.genops(f):
            if op.name in _PICKLE_ARGS:
                fields.append((base + pos + 1, _PICKLE_ARGS[op.name]))
            if op.name == "STOP":
                break
    return fields, f.tell()


def zip_fields(content: bytes):
    """(offset, width) of the size, count and offset fields of a zip archive's records, and of the
    integers in its data.pkl."""
    layout = {b"PK\x03\x04": ((14, 4), (18, 4), (22, 4), (26, 2), (28, 2)),
              b"PK\x01\x02": ((20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (42, 4)),
              b"PK\x05\x06": ((8, 2), (10, 2), (12, 4), (16, 4), (20, 2)),
              b"PK\x06\x06": ((24, 8), (32, 8), (40, 8), (48, 8)),
              b"PK\x06\x07": ((8, 8),)}
    fields = []
    for sig, offsets in layout.items():
        at = content.find(sig)
        while at >= 0:
            fields += [(at + o, w) for o, w in offsets]
            at = content.find(sig, at + 1)
    with zipfile.ZipFile(io.BytesIO(content)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("data.pkl"))
        name_len, extra_len = struct.unpack_from("<HH", content, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        fields += pickle_fields(content[start:start + info.compress_size], base=start)[0]
    return fields


def npy_header(descr, fortran, shape, extra="") -> bytes:
    """A version-1.0 .npy header from the repr of each value (any values, even invalid ones)."""
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, {extra}}}"
    text += " " * ((-(len(text) + 11)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


NPY_DESCR = ("<f4", ">f4", "<f8", "<f2", "|b1", "<i8", "|u1", "|O", "<U3", "<c8", "|V8", "<f16", [("a", "<f4")],
             "float32", "x", 5, None)
NPY_SHAPE = ((8, 4), (4, 8), (32,), (), (0, 4), (10**6, 10**6), (-1, 4), (2**62, 2**62), (8, 4, 1), (2**64,), [8, 4],
             (8.0, 4), None, "8,4", (8, 4) * 40)


def model_dir(directory):
    """A llama checkpoint directory: model.safetensors (input and output embeddings), config.json,
    tokenizer.json."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file({"model.embed_tokens.weight": _randn(10, 4), "lm_head.weight": _randn(10, 4, seed=1)},
              os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump({"model_type": "llama", "tie_word_embeddings": False, "num_hidden_layers": 2,
                   "text_config": {"hidden_size": 4}}, fh)
    with open(os.path.join(directory, "tokenizer.json"), "w") as fh:
        json.dump({"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(8)}},
                   "added_tokens": [{"id": 8, "content": "<s>"}, {"id": 9, "content": "</s>"}]}, fh)
    return str(directory)


def sharded_dir(directory):
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"model.embed_tokens.weight": _randn(10, 4), "model.norm.weight": torch.ones(4)},
              os.path.join(directory, s1))
    save_file({"lm_head.weight": _randn(10, 4, seed=1)}, os.path.join(directory, s2))
    index = os.path.join(directory, "model.safetensors.index.json")
    with open(index, "w") as fh:
        json.dump({"metadata": {"total_size": 0},
                   "weight_map": {"model.embed_tokens.weight": s1, "model.norm.weight": s1, "lm_head.weight": s2}},
                  fh)
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump({"model_type": "llama"}, fh)
    return index


def cell(k, d, eps=0.25):
    rec = {key: 0.5 for key in CELL_FIELDS}
    rec.update(k=k, d=d, method="paper", steps=10, p_start=3, p=3, polish_steps=0, projection_steps=0, seed=0,
               dtype="float32", precision="highest", lr=0.005, eps_star=eps, eps_over_welch=None,
               restarts=1, best_seed=0)
    rec.update(_certificate(k, d, eps))  # bound, bound_name, eps_minus_bound as the cell's k, d and ε* give them
    return rec


def valid_sweep(path):
    write_cells(str(path), [cell(20, 4), cell(30, 4, 0.3), cell(20, 8, float("nan"))])
    return str(path)


CSV_POOL = ("", "None", "nan", "inf", "1e999", "x", "-1", "0", "2.5", "9" * 30, "9" * 5000, "True", "\x00", '"',
            "a,b", "\n", "20", "4", "float32", " 7 ")


def fuzzed_csv(rnd, original: bytes) -> bytes:
    """A CSV sweep file mutated by rows and fields (70%), then perhaps at the byte level."""
    content = original
    if rnd.random() < 0.7:
        rows = list(csv.reader(io.StringIO(original.decode())))
        for _ in range(rnd.randint(1, 3)):
            row = rnd.choice(rows)
            op = rnd.choice(("set", "set", "set", "drop_field", "add_field", "repeat_row", "drop_row"))
            if op == "set" and row:
                row[rnd.randrange(len(row))] = rnd.choice(CSV_POOL)
            elif op == "drop_field" and row:
                del row[rnd.randrange(len(row))]
            elif op == "add_field":
                row.insert(rnd.randrange(len(row) + 1), rnd.choice(CSV_POOL))
            elif op == "repeat_row":
                rows.append(list(row))
            elif op == "drop_row" and len(rows) > 1:
                rows.remove(row)
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        content = out.getvalue().encode()
        if rnd.random() < 0.7:
            return content
    return corrupt(rnd, content, header=len(content), min_edits=0)


# --- fuzz targets -------------------------------------------------------------------------------------

@settings(max_examples=examples(360))
@given(rnd=RANDOMS)
def test_fuzz_safetensors(tmp_path, rnd):
    original = open(valid_safetensors(tmp_path / "valid.safetensors"), "rb").read()
    n = int.from_bytes(original[:8], "little")
    content = original
    if rnd.random() < 0.5:  # the JSON header mutated as a tree, its length kept right (mostly)
        header = dump_json(mutate_json(rnd, json.loads(original[8:8 + n]), rnd.randint(1, 3)))
        if rnd.random() < 0.5:
            header += b" " * rnd.randrange(8)  # the format allows padding with spaces
        length = len(header) if rnd.random() < 0.9 else rnd.choice((n, len(header) + 1, len(header) - 1))
        content = struct.pack("<Q", max(length, 0)) + header + original[8 + n:]
        if rnd.random() < 0.6:
            return check_file(tmp_path / "x.safetensors", content, (read_everything, both))
    content = corrupt(rnd, content, header=8 + n, fields=((0, 8),), min_edits=0 if content != original else 1)
    check_file(tmp_path / "x.safetensors", content, (read_everything, both))


@settings(max_examples=examples(240))
@given(rnd=RANDOMS)
def test_fuzz_sharded_index(tmp_path, rnd):
    index = sharded_dir(tmp_path / "ckpt")
    check_file(index, fuzzed_json(rnd, open(index, "rb").read()), (read_everything, both))


@settings(max_examples=examples(360))
@given(rnd=RANDOMS)
def test_fuzz_gguf(tmp_path, rnd):
    path = valid_gguf(tmp_path / "valid.gguf")
    fields, header = gguf_fields(path)
    content = corrupt(rnd, open(path, "rb").read(), header=header, fields=fields)
    # a (corrupt) tensor type that the installed gguf cannot dequantize is a NotImplementedError naming the file
    check_file(tmp_path / "x.gguf", content, (read_everything, both), also=(NotImplementedError,))


@settings(max_examples=examples(300))
@given(rnd=RANDOMS)
def test_fuzz_npy(tmp_path, rnd):
    np.save(tmp_path / "valid.npy", np.asarray(_randn(8, 4)))
    original = (tmp_path / "valid.npy").read_bytes()
    header_len = 10 + struct.unpack_from("<H", original, 8)[0]
    content = original
    if rnd.random() < 0.5:  # the header's dict with other values (a valid header layout)
        values = ["<f4", False, (8, 4)]
        for i, pool in enumerate((NPY_DESCR, (False, True, 0, None, "no"), NPY_SHAPE)):
            if rnd.random() < 0.5:
                values[i] = rnd.choice(pool)
        extra = rnd.choice(("", "", "'x': 1, ", "'descr': '<f8', "))
        content = npy_header(*values, extra=extra) + original[header_len:][:rnd.choice((128, 128, 64, 256, 0))]
        if rnd.random() < 0.6:
            return check_file(tmp_path / "x.npy", content, (read_everything, load_embeddings))
    content = corrupt(rnd, content, header=header_len, fields=((8, 2),), min_edits=0 if content != original else 1)
    check_file(tmp_path / "x.npy", content, (read_everything, load_embeddings))


@settings(max_examples=examples(300))
@given(rnd=RANDOMS)
def test_fuzz_pt(tmp_path, rnd):
    torch.save({"model.embed_tokens.weight": _randn(8, 4), "lm_head.weight": _randn(8, 4, seed=1)},
               tmp_path / "valid.pt")
    original = (tmp_path / "valid.pt").read_bytes()
    content = corrupt(rnd, original, header=len(original), fields=zip_fields(original))
    check_file(tmp_path / "x.pt", content, (read_everything, both))


@settings(max_examples=examples(180))
@given(rnd=RANDOMS)
def test_fuzz_pt_legacy_format(tmp_path, rnd):
    torch.save({"model.embed_tokens.weight": _randn(8, 4)}, tmp_path / "valid.pt",
               _use_new_zipfile_serialization=False)
    original = (tmp_path / "valid.pt").read_bytes()
    fields, header = pickle_fields(original, pickles=5)
    content = corrupt(rnd, original, header=header, fields=fields)
    check_file(tmp_path / "x.pt", content, (read_everything, load_embeddings))


@settings(max_examples=examples(240))
@given(rnd=RANDOMS)
def test_fuzz_config_json(tmp_path, rnd):
    directory = model_dir(tmp_path / "m")
    path = os.path.join(directory, "config.json")
    check_file(path, fuzzed_json(rnd, open(path, "rb").read()), (lambda _: load_embeddings(directory, which="both"),))


@settings(max_examples=examples(240))
@given(rnd=RANDOMS)
def test_fuzz_tokenizer_json(tmp_path, rnd):
    directory = model_dir(tmp_path / "m")
    path = os.path.join(directory, "tokenizer.json")
    check_file(path, fuzzed_json(rnd, open(path, "rb").read()),
               (lambda _: load_embeddings(directory, n_rows="tokenizer"),))


@settings(max_examples=examples(300))
@given(rnd=RANDOMS)
def test_fuzz_sweep_json(tmp_path, rnd):
    original = open(valid_sweep(tmp_path / "valid.json"), "rb").read()
    check_file(tmp_path / "x.json", fuzzed_json(rnd, original), (load_cells,))


@settings(max_examples=examples(300))
@given(rnd=RANDOMS)
def test_fuzz_sweep_csv(tmp_path, rnd):
    original = open(valid_sweep(tmp_path / "valid.csv"), "rb").read()
    check_file(tmp_path / "x.csv", fuzzed_csv(rnd, original), (load_cells,))


# --- sizes are checked before anything is allocated or parsed ----------------------------------------

def _refused_before(monkeypatch, module, attr):
    """Replace module.attr by a function that fails the test if called."""
    def never(*args, **kwargs):
        raise AssertionError(f"{module.__name__}.{attr} was called on a file whose sizes do not add up")

    monkeypatch.setattr(module, attr, never)


def _safetensors_bytes(header: dict, data: bytes = b"", header_len=None) -> bytes:
    raw = json.dumps(header).encode()
    return (len(raw) if header_len is None else header_len).to_bytes(8, "little") + raw + data


def test_safetensors_header_claiming_a_huge_tensor_is_refused_first(tmp_path, monkeypatch):
    import safetensors

    _refused_before(monkeypatch, safetensors, "safe_open")
    path = write_bytes(tmp_path / "huge.safetensors", _safetensors_bytes(
        {"W_dec": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}}, b"\0" * 64))
    with pytest.raises(ValueError, match=r"huge\.safetensors: truncated: the header says 4000000000000 bytes of "
                                         r"tensor data, the file has 64"):
        load_embeddings(path)


@pytest.mark.parametrize("header_len", [2**63, 2**64 - 1, 10**6])
def test_safetensors_header_length_beyond_the_file_is_refused_first(tmp_path, monkeypatch, header_len):
    import safetensors

    _refused_before(monkeypatch, safetensors, "safe_open")
    path = write_bytes(tmp_path / "long.safetensors", _safetensors_bytes({}, b"", header_len=header_len))
    with pytest.raises(ValueError, match=rf"long\.safetensors: .*header length says {header_len} bytes"):
        load_embeddings(path)


def test_safetensors_shape_that_does_not_match_its_bytes(tmp_path, monkeypatch):
    import safetensors

    _refused_before(monkeypatch, safetensors, "safe_open")
    path = write_bytes(tmp_path / "odd.safetensors", _safetensors_bytes(
        {"W_dec": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 32]}}, b"\0" * 32))
    with pytest.raises(ValueError, match=r"odd\.safetensors: tensor 'W_dec': F32 of shape \[1000, 1000\] needs "
                                         r"4e\+06 bytes, but its data_offsets span 32"):
        load_embeddings(path)


def _gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _gguf_bytes(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, tail: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors + tail


@pytest.mark.parametrize("what", ["array_past_the_end", "string_length", "kv_count", "tensor_count", "tensor_size"])
def test_gguf_header_claims_beyond_the_file_are_refused_first(tmp_path, monkeypatch, what):
    """Before the check, an array running past the end of the file made the gguf package loop
    for each of the 2**40 elements it claims (a hang, and a list of 2**40 arrays)."""
    gguf = pytest.importorskip("gguf")
    _refused_before(monkeypatch, gguf, "GGUFReader")
    name = _gguf_string(b"general.name")
    if what == "array_past_the_end":  # an array of 2**40 uint8
        content = _gguf_bytes(name + struct.pack("<IIQ", 9, 0, 2**40) + b"\0" * 16, 1)
        expected = "the value of 'general.name' .*needs 1099511627776 bytes"
    elif what == "string_length":
        content = _gguf_bytes(name + struct.pack("<IQ", 8, 2**63) + b"abc", 1)
        expected = "the value of 'general.name' at byte .* needs 9223372036854775808 bytes"
    elif what == "kv_count":
        content = _gguf_bytes(name + struct.pack("<II", 4, 7), 2**62)
        expected = "claims 4611686018427387904 metadata entries"
    elif what == "tensor_count":
        content = _gguf_bytes(b"", 0, _gguf_string(b"t") + struct.pack("<IQIQ", 1, 4, 0, 0), 2**63)
        expected = "claims 9223372036854775808 tensors"
    else:  # a 10**12-element F32 tensor in a file of a few bytes
        content = _gguf_bytes(b"", 0, _gguf_string(b"token_embd.weight") + struct.pack("<IQQIQ", 2, 10**6, 10**6, 0, 0),
                              1, tail=b"\0" * 64)
        expected = r"truncated: tensor 'token_embd.weight' \(F32, shape \[1000000, 1000000\]\) claims bytes"
    path = write_bytes(tmp_path / "claims.gguf", content)
    with pytest.raises(ValueError, match=rf"claims\.gguf: .*{expected}"):
        read_everything(path)


def test_npy_header_claiming_a_huge_array(tmp_path):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)})
    path = write_bytes(tmp_path / "huge.npy", buf.getvalue() + b"\0" * 64)
    with pytest.raises(ValueError, match=r"huge\.npy: truncated: the header says shape \(1000000, 1000000\) of "
                                         r"float32 \(4000000000000 bytes of data\), the file has 64"):
        load_embeddings(path)


def test_legacy_pt_claiming_a_huge_storage(tmp_path):
    """torch's legacy format allocates each storage at the size its pickle claims, before reading."""
    torch.save({"x": torch.zeros(8, 4)}, tmp_path / "ok.pt", _use_new_zipfile_serialization=False)
    content = (tmp_path / "ok.pt").read_bytes()
    numel_op = b"K\x20"  # BININT1 32: the storage's element count
    assert content.count(numel_op) == 1
    content = content.replace(numel_op, b"\x8a\x06" + (10**12).to_bytes(6, "little"))  # LONG1 10**12
    path = write_bytes(tmp_path / "huge.pt", content)
    with pytest.raises(ValueError, match=r"huge\.pt: .*a storage claims 1000000000000 elements"):
        load_embeddings(path)


# --- regression tests of the file bugs (each failed before the fix) ----------------------------

@pytest.mark.parametrize("suffix", [".safetensors", ".npy", ".pt"])
@pytest.mark.parametrize("how", ["empty", "truncated"])
def test_empty_or_truncated_checkpoint(tmp_path, suffix, how):
    path = tmp_path / f"ok{suffix}"
    if suffix == ".safetensors":
        valid_safetensors(path)
    elif suffix == ".npy":
        np.save(path, np.asarray(_randn(8, 4)))
    else:
        torch.save({"x": _randn(8, 4)}, path)
    content = path.read_bytes()
    bad = write_bytes(tmp_path / f"bad{suffix}", b"" if how == "empty" else content[:len(content) // 2])
    with pytest.raises(ValueError, match=rf"bad\{suffix}: .*{'empty' if how == 'empty' else 'truncated|corrupt'}"):
        load_embeddings(bad)


class _Pickled:  # any class: a checkpoint holding one needs arbitrary pickle globals
    pass


def test_pickled_pt_is_refused(tmp_path):
    torch.save({"model": _Pickled(), "x": torch.zeros(2, 2)}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match=r"pickled\.pt: refused: this checkpoint holds pickled Python objects.*"
                                         r"_Pickled was not an allowed global"):
        load_embeddings(str(tmp_path / "pickled.pt"))


def test_npy_of_python_objects_is_refused(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([[1, "a"], [2, "b"]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"objects\.npy: refused: the array holds Python objects"):
        load_embeddings(str(tmp_path / "objects.npy"))


@pytest.mark.parametrize("content, expected", [
    (b'{"model_type": "llama",', "not valid JSON"),
    (b"[1, 2]", "a JSON list, expected a model config"),
    (b'{"model_type": 7}', '"model_type" is 7, not a string'),
    (b'{"tie_word_embeddings": "yes"}', '"tie_word_embeddings" is "yes", not true or false'),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_bad_config_json_names_the_file(tmp_path, content, expected):
    directory = model_dir(tmp_path / "m")
    write_bytes(os.path.join(directory, "config.json"), content)
    with pytest.raises(ValueError) as info:
        load_embeddings(directory)
    assert os.path.join(directory, "config.json") in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("content, expected", [
    (b'{"model": {"vocab": {"a": 0', "not valid JSON"),
    (b'{"model": [1]}', '"model" is a JSON list, not an object'),
    (b'{"model": {"vocab": {"a": [0]}}}', "model.vocab['a'] is [0], not a token id"),
    (b'{"model": {"vocab": ["a"]}, "added_tokens": [5]}', "added_tokens[0] is 5, not an object"),
    (b'{"model": {"vocab": ["a"]}, "added_tokens": [{"id": "x"}]}', 'added_tokens[0].id is "x", not a token id'),
])
def test_bad_tokenizer_json_names_the_file(tmp_path, content, expected):
    directory = model_dir(tmp_path / "m")
    write_bytes(os.path.join(directory, "tokenizer.json"), content)
    with pytest.raises(ValueError) as info:
        load_embeddings(directory)
    assert os.path.join(directory, "tokenizer.json") in str(info.value) and expected in str(info.value)


def test_sharded_index_without_weight_map(tmp_path):
    index = sharded_dir(tmp_path / "ckpt")
    write_bytes(index, b'{"metadata": {"total_size": 0}}')
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json: no \"weight_map\" in this sharded "
                                         r"safetensors index \(keys: metadata\)"):
        load_embeddings(str(tmp_path / "ckpt"))


def test_sharded_index_naming_a_missing_shard_or_tensor(tmp_path):
    index = sharded_dir(tmp_path / "ckpt")
    weight_map = {"model.embed_tokens.weight": "nowhere.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    write_bytes(index, json.dumps({"weight_map": weight_map}).encode())
    with pytest.raises(FileNotFoundError, match=r"index\.json: weight_map puts 'model\.embed_tokens\.weight' in "
                                                r"'nowhere\.safetensors', but .*nowhere\.safetensors does not exist"):
        load_embeddings(str(tmp_path / "ckpt"))
    weight_map["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors"
    write_bytes(index, json.dumps({"weight_map": weight_map}).encode())
    with pytest.raises(ValueError, match=r"index\.json: weight_map puts 'model\.embed_tokens\.weight' in "
                                         r".*model-00002-of-00002\.safetensors, which has no such tensor"):
        load_embeddings(str(tmp_path / "ckpt"))


def test_sweep_without_cells(tmp_path):
    path = write_bytes(tmp_path / "s.json", json.dumps({"format": "repcap_fast.packing.sweep/1"}).encode())
    with pytest.raises(ValueError, match=r"s\.json: a sweep file without \"cells\" \(keys: format\)"):
        load_cells(path)


@pytest.mark.parametrize("field, value, expected", [
    ("eps_star", "0.25", r"eps_star is '0\.25', not a number"),
    ("k", 2.5, r"k is '2\.5', not an int in \[1, 2\^63 - 1\]"),
    ("d", "4", r"d is '4', not an int in \[1, 2\^63 - 1\]"),
    ("k", True, r"k is 'True', not an int in \[1, 2\^63 - 1\]"),
    ("dtype", 32, r"dtype is '32', not a string"),
    ("precision", 3, r"precision is '3', not a string"),
    ("precision", "fp8", r"precision is 'fp8', not one of highest, tf32, bf16"),
])
def test_sweep_cell_of_the_wrong_type_is_refused_when_read(tmp_path, field, value, expected):
    cells = [cell(20, 4), cell(30, 4)]
    cells[1][field] = value
    path = write_bytes(tmp_path / "s.json", json.dumps({"format": "repcap_fast.packing.sweep/1",
                                                         "cells": cells}).encode())
    with pytest.raises(ValueError, match=rf"s\.json: cells\[1\] \(k=.*, d=.*\): {expected}"):
        load_cells(path)


def test_sweep_csv_cell_that_is_not_a_number(tmp_path):
    path = valid_sweep(tmp_path / "s.csv")
    rows = list(csv.reader(open(path, newline="")))  # the tag line, the header, three cells, the end line
    rows[3][CELL_FIELDS.index("k")] = "thirty"
    rows[4][CELL_FIELDS.index("eps_star")] = "big"
    with open(path, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    with pytest.raises(ValueError, match=r"s\.csv: line 4: k is 'thirty', not an int"):
        load_cells(path)
    rows[3][CELL_FIELDS.index("k")] = "30"
    with open(path, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    with pytest.raises(ValueError, match=r"s\.csv: line 5: eps_star is 'big', not a number"):
        load_cells(path)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_sweep_duplicate_cells(tmp_path, suffix):
    path = str(tmp_path / f"s{suffix}")
    write_cells(path, [cell(20, 4), cell(30, 4), cell(20, 4)])  # an exact repeat: read once
    assert [(c["k"], c["d"]) for c in load_cells(path)] == [(20, 4), (30, 4)]
    write_cells(path, [cell(20, 4, 0.25), cell(30, 4), cell(20, 4, 0.5)])  # a conflicting repeat: refused
    with pytest.raises(ValueError, match=rf"s\{suffix}: records 1 and 3 are both the cell \(k=20, d=4\), with "
                                         r"different values \(eps_star: 0\.25 vs 0\.5, eps_minus_bound: "):
        load_cells(path)


def test_merge_cells_of_several_files(tmp_path):
    """For a resume that reads `out` and its part files: one record per cell, and a cell whose
    records disagree between files is refused, naming both files."""
    a, b = str(tmp_path / "s.json"), str(tmp_path / "s.json.part0")
    write_cells(a, [cell(20, 4), cell(30, 4)])
    write_cells(b, [cell(30, 4), cell(40, 4)])
    merged = merge_cells([(a, load_cells(a)), (b, load_cells(b))])
    assert [(c["k"], c["d"]) for c in merged] == [(20, 4), (30, 4), (40, 4)]
    write_cells(b, [cell(30, 4, eps=0.9)])
    with pytest.raises(ValueError, match=r"the cell \(k=30, d=4\) is in .*s\.json and in .*s\.json\.part0 with "
                                         r"different values \(eps_star: 0\.25 vs 0\.9, eps_minus_bound: "):
        merge_cells([(a, load_cells(a)), (b, load_cells(b))])


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_is_sweep_file_even_when_corrupt(tmp_path, suffix):
    """What a restart may overwrite: a sweep file, even truncated; never a foreign file."""
    path = valid_sweep(tmp_path / f"s{suffix}")
    assert is_sweep_file(path)
    content = open(path, "rb").read()
    write_bytes(path, content[:len(content) // 2])
    assert is_sweep_file(path)
    with pytest.raises(ValueError, match=rf"s\{suffix}: "):
        load_cells(path)
    write_bytes(path, b'{"format": "something else", "cells": []}' if suffix == ".json" else b"a,b\n1,2\n")
    assert not is_sweep_file(path)
    assert not is_sweep_file(str(tmp_path / "missing.json"))


# --- the CLI: one line, exit code 2 -------------------------------------------------------------------

@pytest.mark.parametrize("argv, name", [
    (["epsilon", "{dir}/corrupt.safetensors"], "corrupt.safetensors"),
    (["epsilon", "{dir}/empty.npy"], "empty.npy"),
    (["epsilon", "{dir}/pickled.pt"], "pickled.pt"),
    (["fit", "{dir}/nocells.json"], "nocells.json"),
])
def test_cli_reports_a_bad_file_in_one_line(tmp_path, capsys, argv, name):
    valid_safetensors(tmp_path / "ok.safetensors")
    write_bytes(tmp_path / "corrupt.safetensors", (tmp_path / "ok.safetensors").read_bytes()[:100])
    write_bytes(tmp_path / "empty.npy", b"")
    torch.save({"model": _Pickled()}, tmp_path / "pickled.pt")
    write_bytes(tmp_path / "nocells.json", json.dumps({"format": "repcap_fast.packing.sweep/1"}).encode())
    rc = cli.main([a.format(dir=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("repcap: error: ") and name in lines[0], err
