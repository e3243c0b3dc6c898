"""Token representations of a model at every requested layer, offline (`hidden_states`).

The model is read from disk or held in memory; the tokens are a seeded sample of a text (by
default the bundled public-domain corpus, `default_corpus`) or of given token ids.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import re
from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _validation as val
from .._jsonl import jsonl_objects  # noqa: F401  served here too (repcap_fast.probes reads it from here)
from .._progress import progress_bar
from .loading import open_model
from .runner import Runner

DEFAULT_CORPUS = "sherlock_holmes"
LAST_LAYER_MEANING = {
    "final_norm": "the last layer is the framework's last hidden state: after the model's final norm when it has "
                  "one (transformers' hidden_states[-1]; TransformerLens: ln_final of the last hook_resid_post)",
    "resid_post": "the last layer is the last block's output before any final norm (TransformerLens's last "
                  "hook_resid_post)",
}


def default_corpus() -> Tuple[str, List[str]]:
    """The bundled corpus as (name, paragraphs): The Adventures of Sherlock Holmes (public domain).

    The paragraphs are whitespace-normalised; repcap_fast/data/README.md says where the text is from.

    Returns:
        tuple[str, list[str]]: "sherlock_holmes" and its paragraphs.

    Examples:
        >>> name, paragraphs = rf.models.default_corpus()
        >>> name, len(paragraphs) > 1000, paragraphs[0][:24]
        ('sherlock_holmes', True, '...')
    """
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sherlock_holmes.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return DEFAULT_CORPUS, [p for p in paragraphs if p]


def padded_batch(seqs: Sequence[Sequence[int]], pad: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pads token sequences on the right to the longest: (input ids, attention mask).

    Args:
        seqs (Sequence[Sequence[int]]): the token ids of each sequence.
        pad (int): the id padding fills with.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: int64 ids and mask (1 on tokens, 0 on padding), both
        len(seqs) × the longest length.
    """
    width = max(len(seq) for seq in seqs)
    input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return input_ids, mask


def read_texts(path: str, jsonl_key: str = "text") -> List[str]:
    r"""Reads the texts of a file: the field of each line of a .jsonl, or the paragraphs of plain text.

    Plain text is split into paragraphs at blank lines, each whitespace-normalised.

    Args:
        path (str): a .jsonl file (one JSON object per line) or a plain-text file.
        jsonl_key (str): the string field of each .jsonl object. Default "text".

    Returns:
        list[str]: the texts.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a .jsonl line that is not JSON, or not an object with a string field `jsonl_key`.

    Examples:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "text.txt")
        >>> _ = open(path, "w").write("First  paragraph.\n\nSecond\nparagraph.\n")
        >>> rf.models.read_texts(path)
        ['First paragraph.', 'Second paragraph.']
    """
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
    """Token representations at every kept layer: a mapping layer → N×d float32 tensor.

    The same N sampled tokens at every layer; layer 0 is the embedding output, layer l the output
    of block l, and the last layer is read at the point ``meta["last_layer"]`` names. Made by
    `hidden_states`.

    Attributes:
        token_ids (torch.Tensor): the N token ids, in the order of the rows.
        windows (torch.Tensor): the window each token sat in.
        offsets (torch.Tensor): its position in that window.
        meta (dict): provenance: source, seed, n_tokens, seq_len, tokens_per_window, text (name,
            sha256, paragraphs, tokens available), model, last_layer, tokenizer, sampling.
        layers (list[int]): the layers kept.

    Examples:
        >>> states = rf.hidden_states("minilm", texts=["The cat sat on the mat. " * 20], n_tokens=64,
        ...                           layers=[0, 6], progress=False)
        >>> states.layers, tuple(states[6].shape), len(states.token_ids), states.meta["seed"]
        ([0, 6], (64, 384), 64, 0)
    """

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
        """The layers kept, in increasing order."""
        return list(self._states)

    def to_dict(self) -> Dict:
        """Provenance, without the tensors (token ids included, so the sample can be rebuilt)."""
        return {**self.meta, "layers": self.layers, "token_ids": self.token_ids.tolist(),
                "windows": self.windows.tolist(), "offsets": self.offsets.tolist()}


def _specials(tok) -> Tuple[List[int], List[int]]:
    """The special tokens the tokenizer puts before and after a sequence ([CLS] … [SEP], <bos> …)."""
    bare = list(tok("the", add_special_tokens=False)["input_ids"])
    wrapped = list(tok("the", add_special_tokens=True)["input_ids"])
    for at in range(len(wrapped) - len(bare) + 1):
        if wrapped[at : at + len(bare)] == bare:
            return wrapped[:at], wrapped[at + len(bare):]
    raise RuntimeError(f"cannot tell the tokenizer's special tokens apart: {wrapped} around {bare}")


def layer_count(config: Dict) -> Optional[int]:
    """The number of transformer blocks a config dict names (num_hidden_layers, n_layer or num_layers).

    Args:
        config (dict): a model config as a dict (as `Embeddings.config` holds it).

    Returns:
        int | None: the number of blocks, or None when the config does not say.

    Raises:
        AttributeError: config is not a mapping (it has no ``get``).

    Examples:
        >>> rf.models.layer_count({"num_hidden_layers": 6}), rf.models.layer_count({"n_layer": 12})
        (6, 12)
        >>> rf.models.layer_count({}) is None
        True
    """
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_layers(layers, n_layers: int) -> List[int]:
    """Checks a layer selection against a model with n_layers blocks, as sorted indices.

    The model has n_layers + 1 hidden states: 0 (the embedding output) to n_layers (the last
    block); negative indices count from the end, repeats are merged.

    Args:
        layers (str | int | Sequence[int] | None): "all" (or None), an integer, or a sequence of
            them (Python, numpy or torch integers; a 1-D integer array or tensor).
        n_layers (int): the number of blocks.

    Returns:
        list[int]: the layers, sorted, each in 0..n_layers.

    Raises:
        ValueError: a string other than "all", an empty list, or a layer out of range (the message
            gives the valid range).
        TypeError: a layer that is not an integer (1.0, True, "3").

    Examples:
        >>> rf.models.check_layers("all", 3)
        [0, 1, 2, 3]
        >>> rf.models.check_layers([-1, 0, 0], 6)
        [0, 6]
        >>> rf.models.check_layers(7, 6)
        Traceback (most recent call last):
        ...
        ValueError: layers: 7 is out of range; this model has layers 0..6 (0 = the embedding output, ...
    """
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

    The model runs in eval mode, under torch.inference_mode: a model in memory left in training
    mode gives its eval-mode states (no dropout; the same states on every call), and every one of
    its submodules gets its own `training` flag back afterwards, also when the run raises.

    The text is tokenized into one stream and cut into windows of `seq_len` tokens (the
    tokenizer's special tokens added around each). A seeded sample picks windows, then `n_tokens`
    positions uniformly among those windows' tokens (about `tokens_per_window` per window); only
    those windows are run, in batches, and only the sampled positions of the requested layers are
    kept (moved to `states_device` batch by batch).

    Args:
        source (str | os.PathLike | object | None): a path, repo id or alias (a Hugging Face model
            directory or GGUF file), or a model in memory (`in_memory_source`: a transformers model,
            a TransformerLens HookedTransformer, an nnsight LanguageModel). None: MiniLM.
        texts (str | Sequence[str] | None): a string or a list of strings; None: the bundled corpus
            (`default_corpus`). Default None.
        token_ids (object): a 1-D stream of ids, or a 2-D batch of windows used as they are (no
            special tokens added); needs no tokenizer. At most one of texts and token_ids. Default None.
        layers (str | int | Sequence[int]): "all", an int or a list (0 = the embedding output;
            negative counts from the end). Default "all".
        n_tokens (int): tokens to sample (at least 3, at most what the text provides). Default 2048.
        batch_size (int): windows per forward pass. Default 8.
        dtype (torch.dtype | None): the model's dtype; None: float32 for a model read from disk, a
            model in memory's own (it is never cast: another explicit value is an error). Default None.
        device (str | torch.device | None): the model's device; None: the CPU for a model read from
            disk, a model in memory's own (never moved). Default None.
        seed (int): seeds the sample (numpy default_rng), in [0, 2^63 - 1]. Default 0.
        seq_len (int): tokens per window, special tokens included. Default 128.
        tokens_per_window (int): about how many tokens are sampled from each window run. Default 32.
        text_name (str | None): the name of the texts in the provenance. Default None.
        progress (bool): show a progress bar. Default True.
        tokenizer (object): an in-memory model's tokenizer (default: its own, or found from its
            name_or_path on this machine). Default None.
        init (str): "trained" (the weights as they are) or "random": the same architecture at
            initialization (`random_init`, seeded with `seed`). Default "trained".
        last_layer (str): where the last layer is read: "final_norm" (the framework's last hidden
            state, after the final norm when there is one) or "resid_post" (the last block's output
            before it). Default "final_norm".
        states_device (str | torch.device): where the returned float32 states go. Default "cpu".

    Returns:
        HiddenStates: layer → N×d float32 states, with the token ids and the provenance.

    Raises:
        ValueError: texts and token_ids both given, n_tokens < 3 or more than the text provides, a
            tokenizer that does not fit the model (or none for texts), token ids out of the
            vocabulary, seq_len beyond the model's positions, a layer out of range, a device or
            dtype other than a model in memory's own, or float16 weights or activations beyond its
            range.
        TypeError: an integer argument that is not an integer (a float, bool or string).
        FileNotFoundError: the source is not on this machine.
        ImportError: transformers is not installed (needed for a model read from disk).

    Examples:
        >>> states = rf.hidden_states("minilm", texts=["The cat sat on the mat. " * 20], n_tokens=64,
        ...                           layers=[0, -1], progress=False)
        >>> states.layers, tuple(states[6].shape), states.meta["last_layer"]["point"]
        ([0, 6], (64, 384), 'final_norm')
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
