"""The parts of repcap_fast.monitor.RepresentationMonitor: the model as found (unwrapped, its kind,
its embeddings), the probe batch chosen once, the hidden states of a model of the user's own
(forward hooks on the submodules named in ``layers=``), and the state that a measurement must
leave as it found it (RNG, autocast, grad mode, training flags)."""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from . import _validation as val
from .models import read_texts
from .models.runner import eval_mode


def unwrap(model):
    """The module that holds the weights: through torch.compile's OptimizedModule (`_orig_mod`)
    and DataParallel / DistributedDataParallel (`module`)."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
    return model


def check_not_meta(model: torch.nn.Module) -> None:
    """Refuses a model whose weights are on the meta device (shapes without values)."""
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_meta:
            raise ValueError(f"model: {name} is on the meta device (shapes without values); load or materialize the "
                             "weights (e.g. model.to_empty(device=...) and load a state dict) before building the "
                             "monitor")


# ---------------------------------------------------------------------------------- user's own model


def _resolve_module(model: torch.nn.Module, label, where) -> Tuple[str, torch.nn.Module]:
    """(the submodule's qualified name, the submodule) for a name or a module of `model`."""
    if isinstance(where, str):
        try:
            return where, model.get_submodule(where)
        except AttributeError:
            raise ValueError(f"layers[{label!r}]: the model has no submodule {where!r}") from None
    if isinstance(where, torch.nn.Module):
        for name, mod in model.named_modules():
            if mod is where:
                return name, mod
        raise ValueError(f"layers[{label!r}]: the {type(where).__name__} given is not a submodule of the model")
    raise val.ArgumentTypeError(f"layers[{label!r}] must be a submodule of the model or its name (a str), got "
                                f"{type(where).__name__}")


def resolve_layers(model: torch.nn.Module, layers: Mapping) -> Dict[str, str]:
    """layers= of a model of the user's own, checked: {label: qualified submodule name}."""
    if not layers:
        raise ValueError("layers must name at least one submodule")
    out = {}
    for label, where in layers.items():
        if not isinstance(label, (str, int)) or isinstance(label, bool):
            raise val.ArgumentTypeError(f"layers: each label must be a str or an int, got {type(label).__name__}")
        out[str(label)] = _resolve_module(model, label, where)[0]
    return out


def resolve_embeddings(model: torch.nn.Module, embeddings) -> Dict[str, Optional[str]]:
    """embeddings= of a model of the user's own, checked: {"input": parameter name or None, "output": ...}.

    Each value is a parameter of the model or its qualified name; without embeddings=, the model's
    get_input_embeddings() / get_output_embeddings() when it has them.
    """
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    if embeddings is None:
        embeddings = {}
        for key, getter in (("input", "get_input_embeddings"), ("output", "get_output_embeddings")):
            mod = getattr(model, getter, lambda: None)()
            if mod is not None and isinstance(getattr(mod, "weight", None), torch.Tensor):
                embeddings[key] = mod.weight
    elif not isinstance(embeddings, Mapping):
        raise val.ArgumentTypeError(f"embeddings must be a mapping {{'input': ..., 'output': ...}} of parameters of "
                                    f"the model or their names, got {type(embeddings).__name__}")
    unknown = set(embeddings) - {"input", "output"}
    if unknown:
        raise ValueError(f"embeddings: unknown keys {sorted(map(str, unknown))}; the keys are 'input' and 'output'")
    out: Dict[str, Optional[str]] = {"input": None, "output": None}
    for key, value in embeddings.items():
        if value is None:
            continue
        if isinstance(value, str):
            try:
                model.get_parameter(value)
            except AttributeError:
                raise ValueError(f"embeddings[{key!r}]: the model has no parameter {value!r}") from None
            out[key] = value
        elif isinstance(value, torch.Tensor):
            if id(value) not in names:
                raise ValueError(f"embeddings[{key!r}]: the tensor given is not a parameter of the model; pass one of "
                                 f"its parameters or the parameter's name")
            out[key] = names[id(value)]
        else:
            raise val.ArgumentTypeError(f"embeddings[{key!r}] must be a parameter of the model or its name, got "
                                        f"{type(value).__name__}")
        shape = tuple(model.get_parameter(out[key]).shape)
        if len(shape) != 2:
            raise ValueError(f"embeddings[{key!r}] ({out[key]}) must be a V×d matrix, got shape {shape}")
    return out


def own_hidden_states(model: torch.nn.Module, modules: Dict[str, str], probe: torch.Tensor, rows: torch.Tensor,
                      cols: torch.Tensor, batch_size: int, device: torch.device) -> Dict[str, torch.Tensor]:
    """{label: N×d float32} of a model of the user's own: the outputs of the submodules in `modules`
    (the first element of a tuple output) at the sampled (row, col) positions of the probe, by
    forward hooks, the model called on batches of token ids as model(ids)."""
    kept: Dict[str, List[torch.Tensor]] = {label: [] for label in modules}
    current: Dict[str, torch.Tensor] = {}

    def keeper(label):
        def keep(_module, _args, output):
            current[label] = output[0] if isinstance(output, (tuple, list)) else output
        return keep

    hooks = [model.get_submodule(name).register_forward_hook(keeper(label)) for label, name in modules.items()]
    try:
        for b0 in range(0, probe.shape[0], batch_size):
            b1 = min(b0 + batch_size, probe.shape[0])
            sel = (rows >= b0) & (rows < b1)
            current.clear()
            with torch.inference_mode():
                model(probe[b0:b1].to(device))
            for label in modules:
                h = current.get(label)
                if not isinstance(h, torch.Tensor) or h.dim() != 3 or h.shape[:2] != (b1 - b0, probe.shape[1]):
                    got = "nothing (it did not run)" if h is None else (
                        f"shape {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__)
                    raise ValueError(f"layers[{label!r}] ({modules[label]}): expected its output to be batch × "
                                     f"tokens × d = ({b1 - b0}, {probe.shape[1]}, d), got {got}")
                kept[label].append(h[(rows[sel] - b0).to(h.device), cols[sel].to(h.device)].float())
    finally:
        for hook in hooks:
            hook.remove()
    return {label: torch.cat(parts) for label, parts in kept.items()}  # outside inference mode: plain tensors


# ---------------------------------------------------------------------------------------- the probe


def check_token_ids(ids, vocab: Optional[int], name: str = "probe") -> torch.Tensor:
    """Token ids as a CPU int64 tensor (1-D stream or 2-D batch), each in [0, vocab)."""
    if isinstance(ids, (list, tuple)):
        try:
            ids = torch.tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise val.ArgumentTypeError(f"{name} must be token ids (a 1-D stream or a 2-D batch of ints)") from None
    elif isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids)
    if not isinstance(ids, torch.Tensor):
        raise val.ArgumentTypeError(f"{name} must be token ids (a tensor, array or list of ints), got "
                                    f"{type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise val.ArgumentTypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    if ids.dim() not in (1, 2) or ids.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D stream or 2-D batch of token ids, got shape "
                         f"{tuple(ids.shape)}")
    ids = ids.detach().to("cpu", torch.int64)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or (vocab is not None and hi >= vocab):
        raise ValueError(f"{name}: token ids must be in [0, {vocab if vocab is not None else 'V'}), got ids from {lo} "
                         f"to {hi}" + (" (beyond the model's vocabulary)" if vocab is not None and hi >= vocab else ""))
    return ids


def tokenize(texts, tokenizer) -> torch.Tensor:
    """One stream of token ids of the texts (a string, a list of strings, or a path to a text or
    .jsonl file), without special tokens."""
    if isinstance(texts, os.PathLike):
        texts = read_texts(os.fspath(texts))
    paragraphs = [texts] if isinstance(texts, str) else list(texts)
    if not paragraphs or not all(isinstance(p, str) for p in paragraphs):
        raise ValueError("texts must be a string, a non-empty list of strings, or a path (os.PathLike) to a text file")
    parts = [tokenizer(p, add_special_tokens=False, verbose=False)["input_ids"] for p in paragraphs]
    return torch.tensor([t for part in parts for t in part], dtype=torch.int64)


def choose_windows(stream: torch.Tensor, seq_len: int, n_windows: int, seed: int) -> torch.Tensor:
    """n_windows windows of seq_len tokens of a 1-D stream, in a seeded random order (numpy
    default_rng(seed)), sorted by position; a stream shorter than seq_len is one window; a last
    partial window is never chosen."""
    if stream.numel() <= seq_len:
        return stream[None, :]
    starts = np.arange(0, stream.numel() - seq_len + 1, seq_len)
    pick = np.sort(np.random.default_rng(seed).permutation(len(starts))[:n_windows])
    return torch.stack([stream[int(s) : int(s) + seq_len] for s in starts[pick]])


def sample_positions(shape: Tuple[int, int], n_tokens: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """n_tokens distinct (row, col) positions of a probe batch, uniformly at random (numpy
    default_rng(seed)), in row-major order."""
    flat = np.sort(np.random.default_rng(seed).choice(shape[0] * shape[1], size=n_tokens, replace=False))
    return torch.from_numpy(flat // shape[1]), torch.from_numpy(flat % shape[1])


def windows_needed(n_tokens: int, tokens_per_window: int, seq_len: int) -> int:
    """How many windows of seq_len tokens the probe keeps: about tokens_per_window sampled from
    each, and at least n_tokens tokens in all (``hidden_states``' rule)."""
    return max(math.ceil(n_tokens / tokens_per_window), math.ceil(n_tokens / seq_len))


def choose_rows(batch: torch.Tensor, n_windows: int, seed: int) -> torch.Tensor:
    """n_windows rows of a 2-D probe batch (all of them when it has no more), chosen in a seeded
    random order (numpy default_rng(seed)), kept in their order."""
    if batch.shape[0] <= n_windows:
        return batch
    keep = np.sort(np.random.default_rng(seed).permutation(batch.shape[0])[:n_windows])
    return batch[torch.from_numpy(keep)]


# ----------------------------------------------------------------------------- the state left alone


@contextlib.contextmanager
def untouched(model: torch.nn.Module) -> Iterator[None]:
    """Runs the body in eval mode, without grad and with autocast off (the model itself runs under
    torch.inference_mode, in the readers of the hidden states), then puts back what it may have
    changed: every submodule's training flag, the RNG states of torch (CPU and every initialized
    CUDA device), Python's random and numpy's global generator; grad mode and autocast come back
    with their context managers."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    py, npy = random.getstate(), np.random.get_state()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(eval_mode(model))
            stack.enter_context(torch.no_grad())
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        np.random.set_state(npy)
