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

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import _validation as val
from .casting import check_loaded
from .sources import gguf_in, resolve_source

FRAMEWORKS = ("transformers", "transformer_lens", "transformer_lens_bridge", "nnsight", "sae_lens")
LAST_LAYER_POINTS = ("final_norm", "resid_post")
_KINDS_HELP = ("a path, a Hugging Face repo id or an alias, or an in-memory model: a transformers PreTrainedModel "
               "(or PretrainedConfig, with init='random'), a TransformerLens HookedTransformer or "
               "TransformerBridge, an nnsight LanguageModel or an SAE-Lens SAE")


@dataclass
class InMemorySource:
    """A model object given as a source, with what the readers need from it.

    Made by `in_memory_source` (a model the user holds) or `random_init` (built from a config).

    Attributes:
        given (object): the object as the user gave it.
        framework (str): one of FRAMEWORKS.
        model (torch.nn.Module): the module that runs (for nnsight, the transformers model it wraps;
            for an SAE, the SAE).
        tokenizer (object): the tokenizer, or None.
        label (str): a short name for reports.
        init (str): "trained" (the user's weights) or "random" (built by `random_init`).
        seed (int | None): the seed of a random init.
        notes (list[str]): how the tokenizer was found (or why not), how the model was built.

    Examples:
        >>> sae = torch.nn.Module()
        >>> sae.W_dec = torch.nn.Parameter(torch.randn(50, 8))
        >>> src = rf.models.in_memory_source(sae)
        >>> src.framework, src.tokenizer, src.dtype, src.config()
        ('sae_lens', None, torch.float32, {'model_type': 'sae', 'd_sae': 50, 'd_in': 8})
    """

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
        """The device of the model's first parameter (or buffer; the CPU when it has none)."""
        return _module_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's first floating-point parameter (float32 when it has none)."""
        for p in self.model.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    @property
    def path(self) -> str:
        """Where the model came from, in words (its class; the seed of a random init)."""
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
        """The model as a dict for report.json: framework, classes, init, seed, device, dtype, tokenizer, notes."""
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
    """Whether a source is an object (a model in memory) rather than a path, repo id or alias.

    Args:
        source (object): the source.

    Returns:
        bool: True for anything but None, a string or an os.PathLike.

    Raises:
        None: any object is an answer.

    Examples:
        >>> rf.models.is_in_memory("minilm"), rf.models.is_in_memory(torch.nn.Linear(2, 2))
        (False, True)
    """
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
    """The tokenizer of a transformers model from its name_or_path, or (None, why not).

    Looked for in a local directory or the local Hugging Face cache; never on the network.
    """
    name = _name_or_path(model)
    if not name:
        return None, "the model has no name_or_path to find its tokenizer from"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, local_files_only=True), None
    except Exception as exc:  # noqa: BLE001 - any miss is the same answer: pass tokenizer=
        return None, f"no tokenizer found for {name!r} on this machine ({type(exc).__name__})"


def in_memory_source(source, tokenizer=None) -> InMemorySource:
    """Recognises a model in memory by duck typing, and wraps it with its tokenizer.

    Accepted: a transformers PreTrainedModel (its tokenizer found from its name_or_path on this
    machine when not given), a TransformerLens HookedTransformer or TransformerBridge, an nnsight
    LanguageModel, an SAE-Lens SAE (its W_dec). None of these packages is imported here.

    Args:
        source (object): the model, or an InMemorySource (returned as it is, or with `tokenizer`).
        tokenizer (object): its tokenizer, when it does not carry one. Default None.

    Returns:
        InMemorySource: the model with its framework, tokenizer and label.

    Raises:
        ValueError: the object is none of the above (the message lists what is accepted), a config
            without weights (pass init="random"), or a tokenizer given for an SAE.

    Examples:
        >>> sae = torch.nn.Module()
        >>> sae.W_dec = torch.nn.Parameter(torch.randn(50, 8))
        >>> rf.models.in_memory_source(sae).framework
        'sae_lens'
        >>> rf.models.in_memory_source(torch.nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: source must be a path, a Hugging Face repo id or an alias, or an in-memory model: ...
    """
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
    resolved = resolve_source(source) if not str(source).endswith("config.json") else None
    if resolved is None:  # a config.json on its own: the tokenizer, if any, sits next to it
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SOURCE {path!r} does not exist")
        directory, gguf = os.path.dirname(os.path.abspath(path)), None
    else:
        gguf = gguf_in(resolved)
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
    """Builds the architecture of a source from its config alone, at initialization.

    The model is the config's causal-LM class when it has one (so an untied unembedding exists and
    is initialized), else its base model, built by transformers' `from_config` with its own
    initializer under `torch.manual_seed(seed)` in a forked RNG (the caller's RNG state is
    unchanged). It is built directly on `device`, in float32, then rounded to `dtype`: values are
    deterministic for a given (seed, device), and differ between devices.

    Args:
        source (str | os.PathLike | object): a model directory or config.json, a GGUF file, a
            transformers PretrainedConfig, or an in-memory transformers model (its config).
        seed (int): the seed, in [0, 2^63 - 1]. Default 0.
        device (str | torch.device | None): where it is built (None: the CPU). Default None.
        dtype (torch.dtype | None): the dtype after initialization (None: float32). Default None.
        tokenizer (object): its tokenizer (default: the one beside the config, if any). Default None.

    Returns:
        InMemorySource: the model, with init="random" and its seed.

    Raises:
        ValueError: no config.json at the source, a model in memory without a transformers config,
            or initial values beyond `dtype`'s range.
        TypeError: a seed that is not an integer.
        FileNotFoundError: the source is not on this machine.
        ImportError: transformers is not installed.

    Examples:
        >>> src = rf.models.random_init("minilm", seed=0)
        >>> src.init, src.seed, src.framework, src.label
        ('random', 0, 'transformers', 'model (random init, seed 0)')
    """
    from transformers import AutoModel, AutoModelForCausalLM


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
    """The input embedding and the unembedding of an in-memory model (V×d each, detached views of its parameters).

    With their names and how they relate: {input, output, tied, tied_reason, input_name,
    output_name, architecture}. output is None when the model has none; tied is None then, unless
    its config ties them.
    """
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
