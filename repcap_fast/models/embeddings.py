"""The embedding matrices of a model, offline (`load_embeddings`).

The input embedding and the unembedding, found by the architecture's tensor names, with ties
reported with their reason, and padded vocabularies.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import _validation as val
from ._tokenizers import _in_memory_tokenizer_size, _no_tokenizer_why, _tokenizer_size
from .casting import cast
from .in_memory import InMemorySource, embedding_tensors, is_in_memory
from .loading import INITS, open_model
from .readers import MissingTensorError, _GGUFReader, _NpyReader, _Reader, _TorchReader, open_reader, read_json
from .sources import ResolvedSource, resolve_source


@dataclass(frozen=True)
class TensorNames:
    """Where an architecture keeps its input embedding and its unembedding, most likely name first.

    Attributes:
        input (tuple[str, ...]): the names of the input embedding tensor.
        output (tuple[str, ...]): the names of the unembedding tensor.

    Examples:
        >>> rf.models.ARCHITECTURES["gpt2"]
        TensorNames(input=('transformer.wte.weight', 'wte.weight'), output=('lm_head.weight',))
    """

    input: Tuple[str, ...]
    output: Tuple[str, ...]


_DECODER = TensorNames(("model.embed_tokens.weight", "embed_tokens.weight"), ("lm_head.weight",))
ARCHITECTURES: Dict[str, TensorNames] = {
    **{t: _DECODER for t in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                             "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2", "granite", "stablelm")},
    "gemma3": TensorNames(("model.language_model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
                           "model.embed_tokens.weight"), ("lm_head.weight", "language_model.lm_head.weight")),
    "phi": TensorNames(("model.embed_tokens.weight", "transformer.embd.wte.weight"),
                       ("lm_head.weight", "lm_head.linear.weight")),
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
    """The source has an input embedding but no unembedding.

    A single matrix, an SAE decoder, or an untied checkpoint saved without its output head.
    """

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _read_config(resolved: ResolvedSource, reader: _Reader) -> Dict:
    if isinstance(reader, _GGUFReader):
        arch = reader.field("general.architecture")
        arch = arch if isinstance(arch, str) else None
        return {"model_type": "gguf", "gguf_architecture": arch,
                "num_hidden_layers": reader.field(f"{arch}.block_count") if arch else None,
                "hidden_size": reader.field(f"{arch}.embedding_length") if arch else None}
    directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        return {}
    cfg = read_json(path, "a model config")
    text_cfg = cfg.get("text_config")  # multimodal wrappers (Gemma 3) keep the language model's settings here
    if text_cfg is not None and not isinstance(text_cfg, dict):
        raise ValueError(f"{path}: \"text_config\" is {str(text_cfg)[:60]!r}, not an object")
    if isinstance(text_cfg, dict):
        cfg = {**text_cfg, **{k: v for k, v in cfg.items() if k != "text_config"}}
    for key, types, want in (("model_type", (str,), "a string"), ("tie_word_embeddings", (bool,), "true or false")):
        value = cfg.get(key)
        if value is not None and not isinstance(value, types):
            raise ValueError(f"{path}: \"{key}\" is {json.dumps(value)[:60]}, not {want}")
    return cfg


def _tie_default(model_type: Optional[str]) -> Optional[bool]:
    if not model_type or model_type == "gguf":
        return None
    try:
        from transformers import AutoConfig

        return bool(AutoConfig.for_model(model_type).tie_word_embeddings)
    except Exception:  # noqa: BLE001 - no transformers, or a model type it does not know
        return _TIE_DEFAULTS.get(model_type)


@dataclass
class Embeddings:
    """An embedding matrix and/or unembedding, with where they came from and how they relate.

    Made by `load_embeddings`. When the two are tied, `output` is `input` (the same tensor).

    Attributes:
        input (torch.Tensor | None): the V×d token embedding (or an SAE's W_dec).
        output (torch.Tensor | None): the V×d unembedding W_U, in Hugging Face layout.
        tied (bool | None): whether they are the same; None when there is no unembedding.
        tied_reason (str): why, in words.
        source (str): the source as given (or a model in memory's label).
        path (str): where it was read from.
        kind (str): the reader ("safetensors", "gguf", "npy", "pt", "sae", or the in-memory framework).
        architecture (str | None): the architecture whose tensor names were used.
        input_name (str | None): the input tensor's name.
        output_name (str | None): the unembedding tensor's name.
        files_opened (list[str]): the files read.
        vocab_rows (int): rows of the stored matrix.
        tokenizer_size (int | None): rows the tokenizer's ids index (its highest id + 1), holes included.
        rows_kept (int): rows returned (`n_rows`).
        config (dict): the model's config.
        tokenizer_tokens (int | None): distinct token ids (smaller than tokenizer_size when ids leave holes).

    Examples:
        >>> emb = rf.load_embeddings("minilm", n_rows=1000)
        >>> tuple(emb.input.shape), emb.d_model, emb.vocab_rows, emb.padded_rows
        ((1000, 384), 384, 30522, 0)
    """

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
    tokenizer_tokens: Optional[int] = None

    @property
    def padded_rows(self) -> Optional[int]:
        """Matrix rows beyond the tokenizer's highest token id (padding), when the tokenizer is known."""
        return None if self.tokenizer_size is None else max(0, self.vocab_rows - self.tokenizer_size)

    @property
    def d_model(self) -> int:
        """The width d of the matrices."""
        return int((self.input if self.input is not None else self.output).shape[1])

    def to_dict(self) -> Dict:
        """Everything but the tensors, as JSON values (for report.json)."""
        def desc(t):
            return None if t is None else {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                                           "device": str(t.device)}
        return {"source": self.source, "path": self.path, "kind": self.kind, "architecture": self.architecture,
                "input": desc(self.input), "output": desc(self.output), "input_name": self.input_name,
                "output_name": self.output_name, "tied": self.tied, "tied_reason": self.tied_reason,
                "files_opened": self.files_opened, "vocab_rows": self.vocab_rows,
                "tokenizer_size": self.tokenizer_size, "tokenizer_tokens": self.tokenizer_tokens,
                "padded_rows": self.padded_rows, "rows_kept": self.rows_kept}


def _first_present(candidates: Sequence[str], names: Sequence[str]) -> Optional[str]:
    present = set(names)
    return next((c for c in candidates if c in present), None)


def _names_listing(names: Sequence[str], limit: int = 40) -> str:
    names = sorted(names)
    more = f" … and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _find_embedding_names(cfg: Dict, names: Sequence[str], where: str) -> Tuple[str, Optional[str], str]:
    """(architecture, input name, output name or None) from the config's model_type.

    Else from the tensor names alone.
    """
    model_type = cfg.get("model_type")
    if model_type in ARCHITECTURES:
        arch = ARCHITECTURES[model_type]
        inp = _first_present(arch.input, names)
        if inp is None:
            raise MissingTensorError(f"{where}: a {model_type!r} model, but none of its embedding tensors "
                                     f"{list(arch.input)} is there. Tensors found: {_names_listing(names)}. "
                                     f"Pass tensor=NAME (--tensor NAME) to choose one.")
        return model_type, inp, _first_present(arch.output, names)
    for arch_name, arch in ARCHITECTURES.items():
        inp = _first_present(arch.input, names)
        if inp is not None:
            label = f"{arch_name} (from tensor names" + (
                f"; config model_type {model_type!r} is not in the table)" if model_type else ")")
            return label, inp, _first_present(arch.output, names)
    known = ", ".join(sorted(ARCHITECTURES))
    raise MissingTensorError(f"{where}: no known embedding tensor (architectures known: {known}"
                             + (f"; config model_type is {model_type!r}" if model_type else "")
                             + f"). Tensors found: {_names_listing(names)}. Pass tensor=NAME (--tensor NAME) to "
                               f"choose one.")


def _check_n_rows(n_rows, vocab_rows: int, tokenizer_size: Optional[int], no_tokenizer_why: str = "",
                  tokenizer_where: str = "") -> int:
    """The rows to keep: all (None), the first N (an integer of any kind: Python, numpy, torch), or "tokenizer".

    The rows the tokenizer's ids index (its highest id + 1; holes below it stay).
    """
    if n_rows is None:
        return vocab_rows
    if isinstance(n_rows, str):
        if n_rows not in ("tokenizer", "vocab"):
            raise ValueError(f"n_rows must be an int, 'tokenizer' or None, got {n_rows!r}")
        if tokenizer_size is None:
            raise ValueError("n_rows='tokenizer': this source has no tokenizer to say how many tokens are real"
                             + (f" ({no_tokenizer_why})" if no_tokenizer_why else "") + "; pass n_rows=N")
        if tokenizer_size > vocab_rows:
            raise ValueError(f"n_rows='tokenizer': the tokenizer{f' ({tokenizer_where})' if tokenizer_where else ''} "
                             f"has token ids up to {tokenizer_size - 1}, but the matrix has only {vocab_rows} rows: "
                             f"it is not this matrix's tokenizer (or the model was not resized to it); pass "
                             f"n_rows=N")
        return tokenizer_size
    n = val.as_int(n_rows, "n_rows")
    if not 2 <= n <= vocab_rows:
        raise ValueError(f"n_rows must be an int in [2, {vocab_rows}] (the matrix has {vocab_rows} rows), "
                         f"got {n_rows!r}")
    return n


def check_embeddings(source=None, which: str = "input", n_rows: Union[int, str, None] = None,
                     tensor: Optional[str] = None) -> None:
    """Checks everything `load_embeddings` checks before it reads a value; no matrix is read.

    The source resolves, its files' headers parse, the embedding tensors are found by name (or
    `tensor` is there) with 2-D shapes, n_rows fits, and an unembedding exists when `which` asks for
    one. For a survey or a batch of sources, checked before the first one's work. A model in memory
    is not checked (it is already loaded).

    Args:
        source (str | os.PathLike | object | None): as for `load_embeddings`. None: MiniLM.
        which (str): "input", "output" or "both". Default "input".
        n_rows (int | str | None): as for `load_embeddings`. Default None.
        tensor (str | None): the input tensor's name. Default None.

    Returns:
        None

    Raises:
        ValueError: what `load_embeddings` raises before reading values: a bad `which` or n_rows, a
            tensor that is not 2-D, a malformed header (a MissingTensorError, KeyError and ValueError,
            when no embedding tensor is found; NoUnembeddingError when `which` needs an unembedding
            that is not there).
        FileNotFoundError: the source is not on this machine.

    Examples:
        >>> rf.models.check_embeddings("minilm", which="both") is None
        True
        >>> rf.models.check_embeddings("minilm", n_rows=10**6)
        Traceback (most recent call last):
        ...
        ValueError: n_rows must be an int in [2, 30522] (the matrix has 30522 rows), got 1000000
    """
    if is_in_memory(source):
        return
    _embeddings(source, which, None, None, n_rows, tensor, None, "trained", 0, read=False)


def load_embeddings(source=None, which: str = "input", dtype: Optional[torch.dtype] = None, device=None,
                    n_rows: Union[int, str, None] = None, tensor: Optional[str] = None, *, tokenizer=None,
                    init: str = "trained", seed: int = 0) -> Embeddings:
    """Reads only the embedding matrices of a model, offline.

    Tied embeddings (the same tensor, no output tensor, or config.tie_word_embeddings) are detected
    and reported in `tied` and `tied_reason`; then `output` is `input`. Only the rows kept are read
    (and dequantized, for GGUF).

    Args:
        source (str | os.PathLike | object | None): a path (model directory, .safetensors, .gguf,
            .npy, .pt), a Hugging Face repo id in the local cache, or an alias ("minilm", the default;
            "smollm2"); or a model in memory (`in_memory_source`): a transformers model, a
            TransformerLens HookedTransformer, an nnsight LanguageModel or an SAE-Lens SAE (its W_dec).
        which (str): "input" (token embedding), "output" (unembedding W_U, V×d) or "both".
            Default "input".
        dtype (torch.dtype | None): convert to this dtype; None keeps the stored one (GGUF quantized
            tensors are dequantized to float32). Default None.
        device (str | torch.device | None): where the tensors go; None: the CPU for a file, a model in
            memory's own device (its parameters as detached views, not copies). Default None.
        n_rows (int | str | None): keep the first n_rows rows; "tokenizer": the rows the tokenizer's
            ids index, up to its highest id, which drops a padded vocabulary's extra rows
            (`Embeddings.padded_rows`); None: all. Default None.
        tensor (str | None): the input tensor's name, for layouts the architecture table does not
            know (for a model in memory, one of its parameters). Default None.
        tokenizer (object): a model in memory's tokenizer (its size is the number of real tokens).
            Default None.
        init (str): "trained", or "random": the same architecture at initialization with `seed`
            (`random_init`; no weights are read). Default "trained".
        seed (int): the seed of a random init, in [0, 2^63 - 1] (checked whatever init is). Default 0.

    Returns:
        Embeddings: the matrices, with their names, tie, tokenizer size and provenance.

    Raises:
        ValueError: a bad `which`, dtype, init or n_rows; a tensor that is not 2-D; a malformed file;
            a value beyond `dtype`'s range (65504 for float16); no known embedding tensor
            (MissingTensorError, also a KeyError); no unembedding when `which` asks for one
            (NoUnembeddingError, also a KeyError).
        TypeError: an integer argument that is not an integer.
        FileNotFoundError: the source is not on this machine.

    Examples:
        >>> emb = rf.load_embeddings("minilm", which="both", n_rows="tokenizer")
        >>> tuple(emb.input.shape), emb.tied, emb.output is emb.input
        ((30522, 384), True, True)
    """
    return _embeddings(source, which, dtype, device, n_rows, tensor, tokenizer, init, seed, read=True)


def _embeddings(source, which, dtype, device, n_rows, tensor, tokenizer, init, seed, read: bool):
    """load_embeddings; with read=False only its checks (`check_embeddings`): None, no value read."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if which not in ("input", "output", "both"):
        raise ValueError(f"which must be 'input', 'output' or 'both', got {which!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    seed = val.check_seed(seed)
    if device is not None:
        val.check_device(device)
    if init == "random" or is_in_memory(source):
        src, _ = open_model(source, tokenizer=tokenizer, init=init, seed=seed)
        return _in_memory_embeddings(src, which, dtype, device, n_rows, tensor)
    if tokenizer is not None:
        raise ValueError("tokenizer= is for a model in memory; a model read from disk uses its own tokenizer")
    if device is None:
        device = "cpu"
    resolved = resolve_source(source)
    reader = open_reader(resolved)
    names = reader.names()
    cfg = _read_config(resolved, reader)
    where = resolved.path

    single_matrix = isinstance(reader, _NpyReader) or (isinstance(reader, _TorchReader) and len(names) == 1)
    if single_matrix and tensor is None:
        only = names[0]
        if len(reader.shape(only)) != 2:
            raise ValueError(f"{where}: expected a 2-D matrix, got shape {reader.shape(only)}")
        arch, inp, out = None, only, None
        kind = reader.kind
    elif "W_dec" in names and tensor is None and not any(n in names for a in ARCHITECTURES.values() for n in a.input):
        arch, inp, out, kind = "sae", "W_dec", None, "sae"
    elif tensor is not None:
        if tensor not in names:
            raise MissingTensorError(f"tensor {tensor!r} is not in {where}. Tensors found: {_names_listing(names)}")
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
    read_out = out is not None and which != "input" and cfg.get("tie_word_embeddings") is not True
    for name in (inp, out) if read_out else (inp,):
        if len(reader.shape(name)) != 2:
            raise ValueError(f"{where}: {name!r} should be a 2-D matrix (vocabulary × d), got shape "
                             f"{tuple(reader.shape(name))}")

    # Ties: never guessed silently. Values are compared on the stored tensors, before any row
    # selection or dtype conversion, and only when both are read (which != "input").
    vocab_rows = int(reader.shape(inp)[0])
    sizes, tokenizer_where = _tokenizer_size(resolved, reader) if kind not in ("sae", "npy") else (None, "")
    tokenizer_size, tokenizer_tokens = sizes if sizes is not None else (None, None)
    why = _no_tokenizer_why(resolved, kind) if tokenizer_size is None and isinstance(n_rows, str) else ""
    rows = _check_n_rows(n_rows, vocab_rows, tokenizer_size, why, tokenizer_where)
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
        elif not read:  # a check only: the values are not compared
            tied, reason = False, "not compared (check_embeddings reads no values)"
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
    if not read:
        return None

    def fetch(name, raw):
        t = reader.read(name, keep) if raw is None else (raw if keep is None else raw[:keep])
        return cast(t, dtype, f"{name!r} in {where}").to(device)

    in_t = fetch(inp, raw_in) if which in ("input", "both") or (tied and which == "output") else None
    out_t = None
    if which in ("output", "both"):
        out_t = in_t if tied else fetch(out, raw_out)
    if which == "output":
        in_t = None
    return Embeddings(input=in_t, output=out_t, tied=tied, tied_reason=reason, source=resolved.source,
                      path=resolved.path, kind=kind, architecture=arch, input_name=inp, output_name=out,
                      files_opened=list(reader.files_opened), vocab_rows=vocab_rows,
                      tokenizer_size=tokenizer_size, rows_kept=rows, config=cfg, tokenizer_tokens=tokenizer_tokens)


def _in_memory_embeddings(src: InMemorySource, which: str, dtype, device, n_rows, tensor) -> Embeddings:
    """load_embeddings for a model in memory.

    Its parameters as detached views (copied only by a dtype, device or row selection), with the
    same tie rules as for files.
    """
    found = embedding_tensors(src)
    if tensor is not None:
        params = dict(src.model.named_parameters())
        if tensor not in params:
            raise MissingTensorError(f"tensor {tensor!r} is not a parameter of {src.label}. Parameters: "
                                     f"{_names_listing(list(params))}")
        if params[tensor].dim() != 2:
            raise ValueError(f"{src.label}: {tensor!r} should be a 2-D matrix, got shape {tuple(params[tensor].shape)}")
        chosen, out = params[tensor].detach(), found["output"]
        same = out is not None and out.shape == chosen.shape and out.data_ptr() == chosen.data_ptr()
        found.update(input=chosen, input_name=tensor, tied=None if out is None else same,
                     tied_reason=(f"tensor={tensor!r} is the unembedding itself" if same else
                                  f"tensor={tensor!r} chosen as the input; the unembedding is the model's own"
                                  if out is not None else found["tied_reason"]))
    inp, out, tied, reason = found["input"], found["output"], found["tied"], found["tied_reason"]
    if which != "input" and out is None:
        raise NoUnembeddingError(f"which={which!r}: {src.label} has {reason}; use which='input'")
    vocab_rows = int(inp.shape[0])
    sizes = None if src.framework == "sae_lens" else _in_memory_tokenizer_size(src.tokenizer)
    tokenizer_size, tokenizer_tokens = sizes if sizes is not None else (None, None)
    why = ("this model in memory was given no tokenizer" if tokenizer_size is None else "")
    rows = _check_n_rows(n_rows, vocab_rows, tokenizer_size, why,
                         "" if src.tokenizer is None else f"a {type(src.tokenizer).__name__}")
    keep = None if rows == vocab_rows else rows

    def take(t, name):
        t = cast(t if keep is None else t[:keep], dtype, f"{name!r} of {src.label}")
        return t if device is None else t.to(device)

    in_t = take(inp, found["input_name"]) if which in ("input", "both") or (tied and which == "output") else None
    out_t = None
    if which in ("output", "both"):
        out_t = in_t if tied else take(out, found["output_name"])
    if which == "output":
        in_t = None
    return Embeddings(input=in_t, output=out_t, tied=tied, tied_reason=reason, source=src.label, path=src.path,
                      kind=src.framework, architecture=found["architecture"], input_name=found["input_name"],
                      output_name=found["output_name"], files_opened=[], vocab_rows=vocab_rows,
                      tokenizer_size=tokenizer_size, rows_kept=rows, config=src.config(),
                      tokenizer_tokens=tokenizer_tokens)
