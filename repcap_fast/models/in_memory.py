"""Models the user already holds in memory, and models built from a config at initialization.

A SOURCE may be an object instead of a path:
- a `transformers` `PreTrainedModel` (its tokenizer passed as `tokenizer=`, or found from
  `model.name_or_path` in a local directory or the local Hugging Face cache);
- a TransformerLens `HookedTransformer` (`W_E`, `W_U` stored d×V, the residual stream read from
  `run_with_cache`; its own `tokenizer`, or `tokenizer=`);
- a TransformerLens 3 `TransformerBridge` (the `transformers` model it wraps, `original_model`,
  and its tokenizer);
- an nnsight `LanguageModel` (its underlying `transformers` model and its tokenizer);
- an SAE-Lens `SAE` (its decoder dictionary `W_dec`, features × d: the matrix whose ε and capacity
  are measured; it has no unembedding and runs no text);
- a `transformers` `PretrainedConfig`, which is built at initialization (`init="random"`).

None of these packages is a dependency: they are recognised by duck typing, and nothing here
imports TransformerLens, nnsight or SAE-Lens. Nothing is moved or cast: an in-memory model runs on
its own device in its own dtype, and its weights are read as they are.

`random_init(source, seed)` builds the architecture of a SOURCE from its config alone (a model
directory or config.json, a GGUF file's metadata, a `PretrainedConfig`, or an in-memory model's
config), with the framework's own initializer under a seeded generator: the control the geometry
papers compare trained weights against.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from .casting import check_loaded

FRAMEWORKS = ("transformers", "transformer_lens", "transformer_lens_bridge", "nnsight", "sae_lens")
LAST_LAYER_POINTS = ("final_norm", "resid_post")
_KINDS_HELP = ("a path, a Hugging Face repo id or an alias, or an in-memory model: a transformers PreTrainedModel "
               "(or PretrainedConfig, with init='random'), a TransformerLens HookedTransformer or "
               "TransformerBridge, an nnsight LanguageModel or an SAE-Lens SAE")


@dataclass
class InMemorySource:
    """A model object given as SOURCE, with what the readers need from it.

    framework: one of FRAMEWORKS; model: the torch module that runs (for nnsight, the
    `transformers` model it wraps; for an SAE, the SAE); tokenizer: the tokenizer, or None;
    label: a short name for reports; init: "trained" (the user's weights) or "random" (built by
    `random_init`, with `seed`)."""

    given: Any
    framework: str
    model: torch.nn.Module
    tokenizer: Any
    label: str
    init: str = "trained"
    seed: Optional[int] = None
    notes: List[str] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return _module_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        for p in self.model.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    @property
    def path(self) -> str:
        cls = type(self.given)
        return f"in memory: {cls.__module__}.{cls.__qualname__}" + (
            f", initialized with seed {self.seed}" if self.init == "random" else "")

    def config(self) -> Dict:
        """The model's settings as a dict (the keys `layer_count` and the reports read)."""
        if self.framework == "transformer_lens":
            cfg = self.model.cfg
            return {"model_type": "transformer_lens", "num_hidden_layers": int(cfg.n_layers),
                    "hidden_size": int(cfg.d_model), "vocab_size": int(cfg.d_vocab),
                    "original_architecture": getattr(cfg, "original_architecture", None),
                    "normalization_type": getattr(cfg, "normalization_type", None)}
        if self.framework == "sae_lens":
            w = self.model.W_dec
            return {"model_type": "sae", "d_sae": int(w.shape[0]), "d_in": int(w.shape[1])}
        return _text_config(self.model.config).to_dict()

    def describe(self) -> Dict:
        return {"framework": self.framework, "class": f"{type(self.given).__module__}.{type(self.given).__qualname__}",
                "runs": f"{type(self.model).__module__}.{type(self.model).__qualname__}", "init": self.init,
                "seed": self.seed, "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "tokenizer": None if self.tokenizer is None else type(self.tokenizer).__name__, "notes": self.notes}


def _module_device(module: torch.nn.Module) -> torch.device:
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def is_in_memory(source) -> bool:
    """Whether SOURCE is an object rather than a path, repo id or alias."""
    return source is not None and not isinstance(source, (str, os.PathLike))


def _is_sae(obj) -> bool:
    w = getattr(obj, "W_dec", None)
    return isinstance(obj, torch.nn.Module) and isinstance(w, torch.Tensor) and not hasattr(obj, "W_E") \
        and not hasattr(obj, "get_input_embeddings")


def _is_lens(obj) -> bool:
    return isinstance(obj, torch.nn.Module) and all(hasattr(obj, a) for a in ("W_E", "W_U", "run_with_cache", "cfg"))


def _nnsight_inner(obj) -> Optional[torch.nn.Module]:
    if not type(obj).__module__.startswith("nnsight"):
        return None
    inner = vars(obj).get("_module") if hasattr(obj, "__dict__") else None
    return inner if isinstance(inner, torch.nn.Module) else None


def _is_transformers(obj) -> bool:
    return isinstance(obj, torch.nn.Module) and callable(getattr(obj, "get_input_embeddings", None)) \
        and hasattr(obj, "config")


def _is_config(obj) -> bool:
    return type(obj).__module__.startswith("transformers") and callable(getattr(obj, "to_dict", None)) \
        and hasattr(obj, "model_type")


def _name_or_path(model) -> str:
    """The name or path a transformers model was loaded from ("" when built from a config)."""
    cfg = getattr(model, "config", None)
    return "" if cfg is None else str(getattr(cfg, "name_or_path", "") or getattr(cfg, "_name_or_path", "") or "")


def _label(obj, model) -> str:
    name = _name_or_path(model)
    if not name and hasattr(model, "cfg"):
        name = str(getattr(model.cfg, "model_name", "") or "")
    return name or type(obj).__name__


def _find_tokenizer(model) -> Tuple[Any, Optional[str]]:
    """The tokenizer of a transformers model from its name_or_path (a local directory, or the
    local Hugging Face cache; never the network), or (None, why not)."""
    name = _name_or_path(model)
    if not name:
        return None, "the model has no name_or_path to find its tokenizer from"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, local_files_only=True), None
    except Exception as exc:  # noqa: BLE001 - any miss is the same answer: pass tokenizer=
        return None, f"no tokenizer found for {name!r} on this machine ({type(exc).__name__})"


def in_memory_source(source, tokenizer=None) -> InMemorySource:
    """An in-memory SOURCE recognised, or a ValueError naming what is accepted."""
    if isinstance(source, InMemorySource):
        if tokenizer is not None and tokenizer is not source.tokenizer:
            return InMemorySource(source.given, source.framework, source.model, tokenizer, source.label,
                                  source.init, source.seed, list(source.notes))
        return source
    if _is_config(source):
        raise ValueError(f"source is a {type(source).__name__} (a config, no weights): pass init='random' "
                         f"(--init random) to build the model from it at initialization")
    inner = _nnsight_inner(source)
    if inner is not None:
        if not _is_transformers(inner):
            raise ValueError(f"source is an nnsight {type(source).__name__} around a {type(inner).__name__}, "
                             f"not a transformers model")
        tok = tokenizer if tokenizer is not None else getattr(source, "tokenizer", None)
        return InMemorySource(source, "nnsight", inner, tok, _label(source, inner))
    bridged = getattr(source, "original_model", None) if type(source).__module__.startswith("transformer_lens") \
        else None
    if bridged is not None and _is_transformers(bridged):
        tok = tokenizer if tokenizer is not None else getattr(source, "tokenizer", None)
        return InMemorySource(source, "transformer_lens_bridge", bridged, tok, _label(source, bridged))
    if _is_lens(source):
        tok = tokenizer if tokenizer is not None else getattr(source, "tokenizer", None)
        return InMemorySource(source, "transformer_lens", source, tok, _label(source, source))
    if _is_sae(source):
        if tokenizer is not None:
            raise ValueError("tokenizer= does not apply to an SAE-Lens SAE: it is a dictionary and runs no text")
        return InMemorySource(source, "sae_lens", source, None, type(source).__name__)
    if _is_transformers(source):
        notes = []
        tok = tokenizer
        if tok is None:
            tok, why = _find_tokenizer(source)
            if why:
                notes.append(why)
        return InMemorySource(source, "transformers", source, tok, _label(source, source), notes=notes)
    raise ValueError(f"source must be {_KINDS_HELP}; got a {type(source).__module__}.{type(source).__qualname__}")


# --- random initialization ------------------------------------------------------------------------

def _config_of(source) -> Tuple[Any, Any, str]:
    """(transformers config, tokenizer or None, label) of SOURCE, without reading any weights."""
    from transformers import AutoConfig, AutoTokenizer

    if _is_config(source):
        return source, None, f"{source.model_type} config"
    if is_in_memory(source):
        src = in_memory_source(source)
        if src.framework in ("transformers", "nnsight", "transformer_lens_bridge"):
            return src.model.config, src.tokenizer, src.label
        raise ValueError(f"init='random': a {src.framework} model has no transformers config to build from; "
                         f"pass its transformers model, config.json or model directory")
    from .hidden_states import _gguf_in  # the GGUF layout is the hidden-state reader's
    from .sources import resolve_source

    resolved = resolve_source(source) if not str(source).endswith("config.json") else None
    if resolved is None:  # a config.json on its own: the tokenizer, if any, sits next to it
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SOURCE {path!r} does not exist")
        directory, gguf = os.path.dirname(os.path.abspath(path)), None
    else:
        gguf = _gguf_in(resolved)
        directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    kw = {"local_files_only": True}
    if gguf is not None:
        directory, name = gguf
        kw["gguf_file"] = name
    elif not os.path.exists(os.path.join(directory, "config.json")):
        raise ValueError(f"init='random' needs the model's config: {directory} has no config.json"
                         + ("" if resolved is None else f" (SOURCE {resolved.source!r} is a {resolved.kind} file)"))
    cfg = AutoConfig.from_pretrained(directory, **kw)
    try:
        tok = AutoTokenizer.from_pretrained(directory, **kw)
    except Exception:  # noqa: BLE001 - a config without a tokenizer still builds; hidden states then need one
        tok = None
    return cfg, tok, os.path.basename(os.path.normpath(directory if gguf is None else os.path.join(*gguf)))


def random_init(source, seed: int = 0, device=None, dtype: Optional[torch.dtype] = None,
                tokenizer=None) -> InMemorySource:
    """The architecture of SOURCE built from its config alone, at initialization.

    The model is the config's causal-LM class when it has one (so an untied unembedding exists
    and is initialized), else its base model; it is built by transformers' own `from_config`, with
    its own initializer (`_init_weights`), under `torch.manual_seed(seed)` in a forked RNG (the
    caller's global RNG state is unchanged). Built directly on `device` (default CPU) in `dtype`
    (default float32): values are deterministic for a given (seed, device), and differ between
    devices because their generators differ. Another `dtype` rounds the float32 initialization."""
    from transformers import AutoModel, AutoModelForCausalLM

    from .. import _validation as val

    seed = val.check_seed(seed)
    dev = torch.device("cpu") if device is None else val.check_device(device)
    cfg, found_tok, label = _config_of(source)
    tok = tokenizer if tokenizer is not None else found_tok
    devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with dev:  # parameters are created and initialized on the device (no host copy)
            try:
                model = AutoModelForCausalLM.from_config(cfg)
            except ValueError:  # no causal-LM class (BERT): the base model
                model = AutoModel.from_config(cfg)
    if dtype is not None and dtype != torch.float32:  # initialized in float32, then rounded
        model = model.to(dtype)
        check_loaded(model, dtype, f"{label} initialized with seed {seed}")
    model.eval()
    notes = [f"built from the config of {label} by {type(model).__name__}.from_config, seed {seed}, on {dev}"]
    return InMemorySource(model, "transformers", model, tok, f"{label} (random init, seed {seed})", "random", seed,
                          notes)


# --- embeddings -----------------------------------------------------------------------------------

def embedding_tensors(src: InMemorySource) -> Dict:
    """The input embedding and the unembedding of an in-memory model (V×d each, detached views of
    its parameters), with their names and how they relate: {input, output, tied, tied_reason,
    input_name, output_name, architecture}. output is None when the model has none; tied is None
    then, unless its config ties them."""
    m = src.model
    if src.framework == "sae_lens":
        w = m.W_dec.detach()
        if w.dim() != 2:
            raise ValueError(f"the SAE's W_dec should be features × d, got shape {tuple(w.shape)}")
        return {"input": w, "output": None, "tied": None, "input_name": "W_dec", "output_name": None,
                "tied_reason": "a single matrix (an SAE decoder, W_dec): no unembedding", "architecture": "sae"}
    if src.framework == "transformer_lens":
        w_e, w_u = m.W_E.detach(), m.W_U.detach().T  # TransformerLens stores W_U as d × V
        same = w_e.shape == w_u.shape and torch.equal(w_e, w_u)
        arch = getattr(m.cfg, "original_architecture", None) or "HookedTransformer"
        return {"input": w_e, "output": w_e if same else w_u, "tied": same, "input_name": "W_E",
                "output_name": "W_U (transposed: TransformerLens stores it d × V)", "architecture": f"{arch} "
                "(TransformerLens)", "tied_reason": "W_U.T holds the same values as W_E" if same else
                "W_U.T and W_E hold different values"}
    inp_mod, out_mod = m.get_input_embeddings(), m.get_output_embeddings()
    cfg = _text_config(m.config)
    arch = getattr(cfg, "model_type", None)
    w_in = inp_mod.weight.detach()
    names = {id(p): n for n, p in m.named_parameters(remove_duplicate=False)}
    in_name = names.get(id(inp_mod.weight), "get_input_embeddings().weight")
    flag = getattr(cfg, "tie_word_embeddings", None)
    if out_mod is None or getattr(out_mod, "weight", None) is None:
        if flag:
            return {"input": w_in, "output": w_in, "tied": True, "input_name": in_name, "output_name": None,
                    "architecture": arch, "tied_reason": f"a {type(m).__name__} without an output head, and "
                    f"config.tie_word_embeddings = true"}
        return {"input": w_in, "output": None, "tied": None, "input_name": in_name, "output_name": None,
                "architecture": arch, "tied_reason": f"a {type(m).__name__} without an output head, and "
                f"config.tie_word_embeddings = {flag}: this model object has no unembedding"}
    out_name = names.get(id(out_mod.weight), "get_output_embeddings().weight")
    if out_mod.weight is inp_mod.weight:
        return {"input": w_in, "output": w_in, "tied": True, "input_name": in_name, "output_name": out_name,
                "architecture": arch, "tied_reason": f"{out_name!r} is {in_name!r} (the same parameter)"}
    w_out = out_mod.weight.detach()
    same = w_out.shape == w_in.shape and w_out.dtype == w_in.dtype and torch.equal(w_out, w_in)
    return {"input": w_in, "output": w_in if same else w_out, "tied": same, "input_name": in_name,
            "output_name": out_name, "architecture": arch,
            "tied_reason": (f"{out_name!r} holds the same values as {in_name!r}" if same else
                            f"the model stores {out_name!r} separately, with other values")}


# --- running the model ----------------------------------------------------------------------------

def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same values, NaN included (an overflowed float16 run has NaN states)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


@contextlib.contextmanager
def eval_mode(*modules: torch.nn.Module):
    """Run `modules` in eval mode (dropout off, batch norm on its running statistics), then put
    back every submodule's own `training` flag as it was (a model left partly in training keeps
    exactly that state), also when the body raises. The flags are set directly, without calling
    any module's `train()` override."""
    seen, flags = set(), []
    for module in modules:
        for m in module.modules():
            if id(m) not in seen:
                seen.add(id(m))
                flags.append((m, m.training))
    try:
        for m, _ in flags:
            m.training = False
        yield
    finally:
        for m, training in flags:
            m.training = training


class Runner:
    """Runs a model on batches of token ids and returns the residual stream at every layer:
    entry 0 the embedding output, entry l the output of block l, and entry L (the last) at the
    point `last_layer` names:
    - "final_norm": the framework's last hidden state, after the model's final norm when it has
      one (transformers' `hidden_states[-1]`: after `norm` in Llama/Qwen/Mistral, `ln_f` in
      GPT-2; BERT has no final norm, so there it is the last block's output); for TransformerLens,
      `ln_final` applied to the last `hook_resid_post`;
    - "resid_post": the last block's output before any final norm (TransformerLens's
      `blocks.{L-1}.hook_resid_post`; in transformers, the last block's output, read by a hook).
    `last_layer_is_normed` says, after the first batch, whether the two points differ for this
    model.

    Every forward pass runs in eval mode (`eval_mode`): a model left in training mode gives its
    eval-mode states (no dropout), and every submodule's `training` flag is restored afterwards,
    also when the forward raises."""

    def __init__(self, src: InMemorySource, last_layer: str = "final_norm"):
        if last_layer not in LAST_LAYER_POINTS:
            raise ValueError(f"last_layer must be one of {LAST_LAYER_POINTS}, got {last_layer!r}")
        if src.framework == "sae_lens":
            raise ValueError("an SAE-Lens SAE runs no text: it has a dictionary (W_dec), not hidden states")
        self.src, self.last_layer = src, last_layer
        self.last_layer_is_normed: Optional[bool] = None
        if src.framework == "transformer_lens":
            cfg = src.model.cfg
            self.n_layers, self.max_positions = int(cfg.n_layers), int(cfg.n_ctx)
            self.vocab_size: Optional[int] = int(cfg.d_vocab)
            self._final_norm = getattr(src.model, "ln_final", None)
        else:
            self.base = getattr(src.model, "base_model", src.model)
            cfg = _text_config(src.model.config)
            self.n_layers = int(cfg.num_hidden_layers)
            self.max_positions = getattr(cfg, "max_position_embeddings", None)
            self.vocab_size = getattr(cfg, "vocab_size", None)
            self._candidates = self._block_lists()
            self._blocks: Optional[torch.nn.ModuleList] = None  # chosen on the first batch

    def _block_lists(self) -> List[torch.nn.ModuleList]:
        """Every list of n_layers modules in the model (a multimodal model may hold more than one)."""
        lists = [mod for _, mod in self.base.named_modules()
                 if isinstance(mod, torch.nn.ModuleList) and len(mod) == self.n_layers]
        if not lists:
            raise ValueError(f"{type(self.base).__name__}: no list of {self.n_layers} blocks found to read the "
                             f"last block's output from")
        return lists

    @property
    def device(self) -> torch.device:
        return self.src.device

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> List[torch.Tensor]:
        given = self.src.given  # a TransformerBridge is a module around the model it runs
        also = [given] if isinstance(given, torch.nn.Module) and given is not self.src.model else []
        with eval_mode(self.src.model, *also):
            return self._run(input_ids, attention_mask)

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> List[torch.Tensor]:
        if self.src.framework == "transformer_lens":
            return self._run_lens(input_ids, attention_mask)
        if self.last_layer == "final_norm" and self._blocks is not None:  # the model's own outputs: no hook
            hs = list(self.base(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
                      .hidden_states)
            if len(hs) != self.n_layers + 1:
                raise RuntimeError(f"the model returned {len(hs)} hidden states, expected {self.n_layers + 1}")
            return hs
        # the first batch (and every batch for resid_post): the last block's output read by a hook
        lists = [self._blocks] if self._blocks is not None else self._candidates
        captured: Dict[Tuple[int, str], torch.Tensor] = {}

        def keeper(i, where):
            def keep(_module, _args, output):
                captured[(i, where)] = output[0] if isinstance(output, tuple) else output
            return keep

        hooks = [blocks[-1].register_forward_hook(keeper(i, "last")) for i, blocks in enumerate(lists)]
        if self._blocks is None:
            hooks += [blocks[0].register_forward_hook(keeper(i, "first")) for i, blocks in enumerate(lists)]
        try:
            out = self.base(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        finally:
            for hook in hooks:
                hook.remove()
        hs = list(out.hidden_states)
        if len(hs) != self.n_layers + 1:
            raise RuntimeError(f"the model returned {len(hs)} hidden states, expected {self.n_layers + 1}")
        if self._blocks is None:  # the blocks whose first output is hidden state 1 (their last one's, if L = 1)
            first = "first" if self.n_layers > 1 else "last"
            match = [i for i in range(len(lists)) if (i, first) in captured
                     and captured[(i, first)].shape == hs[1].shape
                     and (self.n_layers == 1 or _same(captured[(i, first)], hs[1]))]
            if not match:
                raise RuntimeError(f"{type(self.base).__name__}: none of its lists of {self.n_layers} blocks produced "
                                   f"hidden state 1; the last block's output cannot be read")
            self._blocks = lists[match[0]]
            captured = {(0, "last"): captured[(match[0], "last")]}
        resid = captured.get((0, "last"))
        if resid is None or resid.shape != hs[-1].shape:
            raise RuntimeError(f"{type(self.base).__name__}: the last block's output could not be read by a hook")
        if self.last_layer_is_normed is None:
            self.last_layer_is_normed = not _same(resid, hs[-1])
        if self.last_layer == "resid_post":
            hs[-1] = resid
        return hs

    def _run_lens(self, input_ids, attention_mask):
        model, n = self.src.model, self.n_layers
        names = {"blocks.0.hook_resid_pre"} | {f"blocks.{i}.hook_resid_post" for i in range(n)}
        _, cache = model.run_with_cache(input_ids, attention_mask=attention_mask, return_type=None,
                                        names_filter=lambda name: name in names)
        hs = [cache["blocks.0.hook_resid_pre"]] + [cache[f"blocks.{i}.hook_resid_post"] for i in range(n)]
        norm = self._final_norm
        has_norm = norm is not None and not isinstance(norm, torch.nn.Identity)
        self.last_layer_is_normed = has_norm
        if self.last_layer == "final_norm" and has_norm:
            hs[-1] = norm(hs[-1])
        return hs
