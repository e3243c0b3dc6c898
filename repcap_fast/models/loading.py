"""Models read from disk, ready to run: `open_model` (and `runnable`, whether one can run)."""

from __future__ import annotations

import importlib.util
import os
from typing import Optional, Tuple

import torch

from .. import _validation as val
from .casting import check_loaded
from .in_memory import InMemorySource, in_memory_source, is_in_memory, random_init
from .sources import ResolvedSource, gguf_in, resolve_source

INITS = ("trained", "random")


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


def runnable(source) -> Tuple[bool, str]:
    """Whether `hidden_states` can run the model at a source, and if not, why; nothing is loaded.

    A model in memory runs (an SAE-Lens SAE does not: it is a dictionary); from disk, a GGUF model
    or a model directory with config.json and tokenizer files runs, a single weights file does not.

    Args:
        source (str | os.PathLike | ResolvedSource | object | None): a path, repo id or alias, a
            resolved source, or a model in memory. None: MiniLM.

    Returns:
        tuple[bool, str]: whether it runs, and the reason in words.

    Raises:
        FileNotFoundError: the source is not on this machine.
        ValueError: the source is an unsupported file type, or an object that is not a model.

    Examples:
        >>> rf.models.runnable("minilm")
        (True, 'a model directory with config.json and a tokenizer')
    """
    if is_in_memory(source) and not isinstance(source, ResolvedSource):
        src = in_memory_source(source) if not isinstance(source, InMemorySource) else source
        if src.framework == "sae_lens":
            return False, "an SAE-Lens SAE is a dictionary (W_dec): it runs no text"
        return True, f"a {src.framework} model in memory"
    resolved = source if isinstance(source, ResolvedSource) else resolve_source(source)
    if gguf_in(resolved) is not None:
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


def open_model(source=None, *, tokenizer=None, init: str = "trained", seed: int = 0,
               dtype: Optional[torch.dtype] = None, device=None) -> Tuple[InMemorySource, Optional[ResolvedSource]]:
    """Opens the model of a source, ready to run: (the model with its tokenizer, where it was read from).

    A model read from disk loads with transformers (local files only) in `dtype` on `device`; a
    model in memory stays where it is, and a `device` or `dtype` that differs from its own is an
    error (it is never moved or cast behind the user's back); init="random" builds the
    architecture from its config (`random_init`).

    Args:
        source (str | os.PathLike | object | None): a path, repo id or alias, or a model in memory.
            None: MiniLM.
        tokenizer (object): a model in memory's tokenizer, when it does not carry one. Default None.
        init (str): "trained", or "random" (built at initialization). Default "trained".
        seed (int): the seed of a random init, in [0, 2^63 - 1] (checked whatever init is). Default 0.
        dtype (torch.dtype | None): the dtype a model from disk loads in (None: float32). Default None.
        device (str | torch.device | None): the device a model from disk loads on (None: the CPU).
            Default None.

    Returns:
        tuple[InMemorySource, ResolvedSource | None]: the model with its tokenizer, and where it was
        read from (None for a model in memory or built at initialization).

    Raises:
        ValueError: an unknown init, a device or dtype other than a model in memory's own, a
            tokenizer given for a model read from disk, a source that cannot run (`runnable`), a
            tokenizer that is not the model's, or weights beyond `dtype`'s range (65504 for float16).
        TypeError: a seed that is not an integer.
        FileNotFoundError: the source is not on this machine.
        ImportError: transformers (or, for GGUF, gguf and accelerate) is not installed.

    Examples:
        >>> model, where = rf.models.open_model("minilm")
        >>> model.framework, model.init, str(model.device), where.kind
        ('transformers', 'trained', 'cpu', 'directory')
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    seed = val.check_seed(seed)
    if dtype is not None:
        dtype = val.check_dtype(dtype)
    if init == "random":
        if isinstance(source, InMemorySource) and source.init == "random":
            return source, None
        return random_init(source, seed, device=device, dtype=dtype, tokenizer=tokenizer), None
    if is_in_memory(source):
        src = in_memory_source(source, tokenizer)
        if device is not None and torch.device(device) != src.device and not (
                torch.device(device).type == src.device.type and torch.device(device).index is None):
            raise ValueError(f"device={str(device)!r}, but the model is on {src.device}: a model in memory is not "
                             f"moved; pass device=None (or {str(src.device)!r}), or move the model first")
        if dtype is not None and dtype != src.dtype:
            raise ValueError(f"dtype={dtype}, but the model is {src.dtype}: a model in memory is not cast; pass "
                             f"dtype=None, or cast the model first")
        return src, None
    resolved = resolve_source(source)
    if tokenizer is not None:
        raise ValueError("tokenizer= is for a model in memory; a model read from disk uses its own tokenizer")
    tok, model = _load_hf(resolved, dtype or torch.float32, "cpu" if device is None else device)
    check_loaded(model, dtype, resolved.path)
    return InMemorySource(model, "transformers", model, tok, resolved.source), resolved


def _load_hf_quiet(resolved, dtype, device, AutoModel, AutoModelForCausalLM, AutoTokenizer):
    ok, why = runnable(resolved)
    if not ok:
        raise ValueError(f"hidden states: {why}")
    gguf_file = gguf_in(resolved)
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
