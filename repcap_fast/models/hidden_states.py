"""hidden_states: token representations of a model (read from disk, or in memory) at every
requested layer, offline, from a seeded token sample of a text (by default the bundled
public-domain corpus) or of given token ids."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _validation as val
from .._progress import progress_bar
from .casting import check_loaded
from .in_memory import InMemorySource, Runner, in_memory_source, is_in_memory, random_init
from .sources import ResolvedSource, resolve_source

DEFAULT_CORPUS = "sherlock_holmes"
INITS = ("trained", "random")
LAST_LAYER_MEANING = {
    "final_norm": "the last layer is the framework's last hidden state: after the model's final norm when it has "
                  "one (transformers' hidden_states[-1]; TransformerLens: ln_final of the last hook_resid_post)",
    "resid_post": "the last layer is the last block's output before any final norm (TransformerLens's last "
                  "hook_resid_post)",
}


def default_corpus() -> Tuple[str, List[str]]:
    """(name, paragraphs) of the bundled corpus: The Adventures of Sherlock Holmes (public domain;
    repcap_fast/data/README.md)."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sherlock_holmes.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return DEFAULT_CORPUS, [p for p in paragraphs if p]


def jsonl_objects(path: str) -> Iterator[Tuple[int, object]]:
    """(line number, parsed JSON) of each non-blank line of a JSON-lines file; a line that is not
    JSON is a ValueError naming the file and the line."""
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None


def padded_batch(seqs: Sequence[Sequence[int]], pad: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of token sequences padded on the right to the longest."""
    width = max(len(seq) for seq in seqs)
    input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return input_ids, mask


def read_texts(path: str, jsonl_key: str = "text") -> List[str]:
    """Texts from a file: .jsonl (one JSON object per line, its `jsonl_key` field) or plain text
    (paragraphs separated by blank lines)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"text file {path!r} does not exist")
    if path.endswith(".jsonl"):
        out = []
        for i, obj in jsonl_objects(path):
            if not isinstance(obj, dict) or not isinstance(obj.get(jsonl_key), str):
                raise ValueError(f"{path}:{i}: expected an object with a string field {jsonl_key!r}")
            out.append(obj[jsonl_key])
        return out
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


class HiddenStates(Mapping):
    """layer → N×d token representations (float32, on `states_device`), for the same N sampled
    tokens at every layer. Layer 0 is the embedding output, layer l the output of block l, and the
    last layer is read at the point `meta["last_layer"]` names.

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
    if is_in_memory(source) and not isinstance(source, ResolvedSource):
        src = in_memory_source(source) if not isinstance(source, InMemorySource) else source
        if src.framework == "sae_lens":
            return False, "an SAE-Lens SAE is a dictionary (W_dec): it runs no text"
        return True, f"a {src.framework} model in memory"
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


def open_model(source=None, *, tokenizer=None, init: str = "trained", seed: int = 0,
               dtype: Optional[torch.dtype] = None, device=None) -> Tuple[InMemorySource, Optional[ResolvedSource]]:
    """The model of SOURCE, ready to run: (the model with its tokenizer, where it was read from or
    None for a model in memory). init="random" builds the architecture from its config
    (`random_init`); a model read from disk loads in `dtype` (default float32) on `device`
    (default CPU); a model in memory stays where it is, and a `device` or `dtype` that differs
    from its own is an error (it is never moved or cast behind the user's back). A checkpoint
    with values beyond `dtype`'s range (65504 for float16) is an error naming the parameter, not
    a model with ±inf weights. seed: an integer in [0, 2^63 - 1], checked whatever init is."""
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
    """`layers` ("all", an integer or a sequence of them: Python, numpy or torch integers, a 1-D
    integer array or tensor; negative counts from the end) as sorted indices into the
    n_layers + 1 hidden states, or an error naming `layers`: a non-integer (1.0, True) says so, an
    integer out of range gives the valid range."""
    total = n_layers + 1
    if layers is None or (isinstance(layers, str) and layers == "all"):
        return list(range(total))
    if isinstance(layers, str):
        raise ValueError(f"layers must be 'all', an int or a list of ints, got {layers!r}")
    if isinstance(layers, (torch.Tensor, np.ndarray)) and layers.ndim == 1:
        layers = list(layers)
    elif not isinstance(layers, (list, tuple, range)):
        layers = [val.as_int(layers, "layers")]
    if not layers:
        raise ValueError(f"layers must be 'all', an int or a non-empty list of ints, got {layers!r}")
    out = []
    for layer in layers:
        index = val.as_int(layer, f"layers: {layer!r}")
        if not -total <= index < total:
            raise ValueError(f"layers: {layer!r} is out of range; this model has layers 0..{n_layers} "
                             f"(0 = the embedding output, {n_layers} = the last block), or -{total}..-1")
        out.append(index % total)
    return sorted(set(out))


def hidden_states(source=None, texts: Optional[Union[str, Sequence[str]]] = None, token_ids=None, layers="all",
                  n_tokens: int = 2048, batch_size: int = 8, dtype: Optional[torch.dtype] = None, device=None,
                  seed: int = 0, seq_len: int = 128, tokens_per_window: int = 32, text_name: Optional[str] = None,
                  progress: bool = True, *, tokenizer=None, init: str = "trained", last_layer: str = "final_norm",
                  states_device="cpu") -> HiddenStates:
    """Token representations of a model at every requested layer, offline.

    SOURCE is a path, repo id or alias (a Hugging Face model directory or GGUF file), or a model
    in memory (`in_memory.in_memory_source`: a transformers model, a TransformerLens
    HookedTransformer, an nnsight LanguageModel).

    The model runs in eval mode, under torch.inference_mode: a model in memory left in training
    mode gives its eval-mode states (no dropout; the same states on every call), and every one of
    its submodules gets its own `training` flag back afterwards, also when the run raises.

    The text (default: the bundled public-domain corpus, `default_corpus()`) is tokenized into one
    stream and cut into windows of `seq_len` tokens (the tokenizer's special tokens added around
    each). A seeded sample picks windows, then `n_tokens` positions uniformly among those windows'
    tokens (about `tokens_per_window` per window); only those windows are run, in batches, and only
    the sampled positions of the requested layers are kept (moved to `states_device` batch by batch).

    Args:
        texts: a string or a list of strings; token_ids: a 1-D stream of ids, or a 2-D batch of
            windows used as they are (no special tokens added). At most one of the two. Token ids
            need no tokenizer (a 1-D stream then gets no special tokens); texts do.
        layers: "all", an int or a list (0 = the embedding output; negative counts from the end).
        n_tokens: tokens to sample; more than the text provides is an error. It, batch_size,
            seq_len, tokens_per_window and seed are integers (Python, numpy or torch; not bools,
            floats or strings).
        dtype, device: the model's dtype and device. None: float32 on the CPU for a model read
            from disk, and an in-memory model's own (it is never moved or cast: a different
            explicit value is an error). In float16, weights (at the cast) or activations beyond
            its range (±65504) are an error that says so, not inf states.
        tokenizer: the tokenizer of an in-memory model (default: its own, or found from its
            name_or_path on this machine).
        init: "trained" (the weights as they are) or "random": the same architecture built from
            its config at initialization (`in_memory.random_init`, seeded with `seed`).
        last_layer: the point of the residual stream the last layer is read at, "final_norm" (the
            framework's last hidden state, after the model's final norm when it has one) or
            "resid_post" (the last block's output before it); see `in_memory.Runner`.
        states_device: where the returned float32 states go (default the CPU).
    """
    if texts is not None and token_ids is not None:
        raise ValueError("pass texts or token_ids, not both")
    n_tokens, batch_size, seq_len, tokens_per_window = (
        val.check_int(value, name, 1) for name, value in (
            ("n_tokens", n_tokens), ("batch_size", batch_size), ("seq_len", seq_len),
            ("tokens_per_window", tokens_per_window)))
    if n_tokens < 3:
        raise ValueError(f"n_tokens must be at least 3 (pairs of tokens are compared), got {n_tokens}")
    seed = val.check_seed(seed)
    ids = None if token_ids is None else torch.as_tensor(token_ids)
    if ids is not None and (ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool
                            or ids.dim() not in (1, 2) or ids.numel() == 0):
        raise ValueError(f"token_ids must be a non-empty 1-D stream or 2-D batch of integer ids, got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    batch_ids = ids is not None and ids.dim() == 2
    out_device = val.check_device(states_device, "states_device")
    src, resolved = open_model(source, tokenizer=tokenizer, init=init, seed=seed, dtype=dtype, device=device)
    runner = Runner(src, last_layer)
    tok, device = src.tokenizer, src.device
    if tok is None and ids is None:
        raise ValueError(f"hidden states of {src.label}: texts need a tokenizer, and this model has none "
                         f"({'; '.join(src.notes) or 'none was given'}): pass tokenizer=, or token_ids=")
    n_layers = runner.n_layers
    keep_layers = check_layers(layers, n_layers)
    vocab = runner.vocab_size
    if tok is not None and vocab and len(tok) < vocab // 2:
        raise ValueError(f"the tokenizer has {len(tok)} tokens but {src.label}'s vocabulary has {vocab}: it is not "
                         f"this model's tokenizer")
    if ids is not None and vocab and (int(ids.max()) >= vocab or int(ids.min()) < 0):
        raise ValueError(f"token_ids must be in [0, {vocab}) for {src.label}, got ids from {int(ids.min())} to "
                         f"{int(ids.max())}")

    max_len = runner.max_positions
    if batch_ids and max_len and ids.shape[1] > max_len:
        raise ValueError(f"token_ids rows have {ids.shape[1]} tokens; the model takes at most {max_len}")
    if max_len and seq_len > max_len:
        raise ValueError(f"seq_len={seq_len} is longer than the model's maximum of {max_len} positions")
    prefix, suffix = ([], []) if batch_ids or tok is None else _specials(tok)
    content_len = seq_len - len(prefix) - len(suffix)
    if content_len < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for text between the special tokens {prefix} … {suffix}")
    if ids is not None:
        arr = ids.to("cpu", torch.int64).numpy()  # token ids are indexed on the host (_residency.py)
        if batch_ids:
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
        parts = [np.asarray(tok(p, add_special_tokens=False, verbose=False)["input_ids"], dtype=np.int32)
                 for p in paragraphs]
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
                             f"tokenizer of {src.path if resolved is None else resolved.path} does not fit this "
                             f"text (or is not this model's)")
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

    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0
    kept: Dict[int, List[torch.Tensor]] = {layer: [] for layer in keep_layers}
    run_windows = sorted(by_window)
    with torch.inference_mode(), progress_bar(bool(progress), total=len(run_windows), desc="hidden states",
                                              unit="window", leave=True) as bar:
        for b0 in range(0, len(run_windows), batch_size):
            batch = run_windows[b0 : b0 + batch_size]
            input_ids, mask = padded_batch([prefix + windows_ids[w].tolist() + suffix for w in batch], pad)
            hs = runner(input_ids.to(device), mask.to(device))
            rows = torch.tensor([i for i, w in enumerate(batch) for _ in by_window[w]], device=device)
            cols = torch.tensor([len(prefix) + o for w in batch for o in by_window[w]], device=device)
            for layer in keep_layers:
                h = hs[layer][rows, cols]
                if h.dtype == torch.float16 and not bool(torch.isfinite(h).all()):
                    raise ValueError(f"dtype=float16: the hidden states of {src.label} at layer {layer} hold inf or "
                                     f"NaN: its activations exceed float16's range (±65504) in the float16 run; "
                                     f"run it in float32 or bfloat16")
                kept[layer].append(h.float().to(out_device))
            del hs
            bar.update(len(batch))
    states = {layer: torch.cat(parts) for layer, parts in kept.items()}
    ordered = [(w, o) for w in run_windows for o in by_window[w]]
    meta = {
        "token_ids": torch.tensor([int(windows_ids[w][o]) for w, o in ordered], dtype=torch.long),
        "windows": torch.tensor([w for w, _ in ordered]),
        "offsets": torch.tensor([o for _, o in ordered]),
        "source": src.label if resolved is None else resolved.source,
        "path": src.path if resolved is None else resolved.path, "n_tokens": n_tokens, "seed": seed,
        "seq_len": seq_len, "tokens_per_window": tokens_per_window, "windows_run": len(run_windows),
        "n_layers": n_layers, "model_class": type(src.model).__name__,
        "model_dtype": str(src.dtype).replace("torch.", ""), "device": str(device), "states_device": str(out_device),
        "model": src.describe(), "init": src.init,
        "last_layer": {"point": last_layer, "differs_from_other_point": runner.last_layer_is_normed,
                       "meaning": LAST_LAYER_MEANING[last_layer]},
        "special_tokens": {"before": prefix, "after": suffix}, "text": text_meta,
        "tokenizer": None if tok is None else {"class": type(tok).__name__, "size": len(tok),
                                               "name_or_path": str(getattr(tok, "name_or_path", ""))},
        "sampling": "windows in a seeded random order until they hold enough tokens, then n_tokens positions "
                    "uniformly among their tokens (numpy default_rng(seed))",
    }
    return HiddenStates(states, meta)
