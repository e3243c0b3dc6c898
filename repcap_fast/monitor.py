"""Capacity and Subspace PGA while a model trains: `RepresentationMonitor`, for any training loop.

Built once from the model and a probe batch of token ids chosen once; each ``measure(step)``
returns a flat dict of floats (ε, μ, σ of the embeddings; the Subspace-PGA z of every layer and
CCR variant; optionally the spectral metrics), appends it to a JSONL file, and leaves the model as
it found it. The Hugging Face Trainer callback over it is
``repcap_fast.integrations.transformers.RepcapCallback``; the plot is
``repcap_fast.plotting.training_plot`` (``repcap plot-training``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Dict, List, Optional, Sequence

import torch

from . import _monitor_parts as parts
from . import _validation as val
from . import distributed
from ._backends import BACKENDS, PRECISIONS, resolve_backend
from ._metrics import read_metrics
from ._outputs import check_no_clobber
from .models import check_layers, default_corpus, hidden_states, in_memory_source
from .models.in_memory import LAST_LAYER_POINTS, embedding_tensors
from .models.runner import Runner
from .ops.pairwise_cosine_stats import cosine_moments
from .pga import pga_profile, spectral_metrics
from .plotting import training_plot

logger = logging.getLogger(__name__)

__all__ = ["MEASURES", "RepresentationMonitor", "read_metrics", "training_plot"]

MEASURES = ("epsilon", "pga", "spectral")
SPECTRAL_KEYS = ("rankme", "alpha_req", "isotropy", "condition_number")


class RepresentationMonitor:
    """ε of the embeddings and the Subspace-PGA profile of a model, measured during training.

    Built once: the model (kept by reference, so each measurement reads its current weights on
    its current device), a fixed probe batch of token ids chosen once with `seed`, and the measures
    wanted. Every argument is checked here, so a bad one fails when the monitor is built, never at
    step 5,000. Each ``measure(step)`` then:

    - runs the model on the probe batch in eval mode, under ``torch.inference_mode``, with autocast
      off, on the model's own device, and reads the hidden states of the layers at `n_tokens`
      sampled positions (``repcap_fast.models.hidden_states`` with the probe as ``token_ids``, or
      forward hooks on the submodules of ``layers=`` for a model of your own);
    - "epsilon": μ, σ and ε = μ + k_sigma·σ of the pairwise cosines of the input embedding and of
      the unembedding (``cosine_moments``: exact, float64; equal to ``pairwise_cosine_stats``'s);
      a tied unembedding is measured once;
    - "pga": ``pga.pga_profile`` of the layers against the unembedding (k, n_null, ccrs, pga_seed),
      in this process alone (``distributed.local``), with the `backend` and `precision` given;
    - "spectral": ``pga.spectral_metrics`` of every layer (RankMe, α-ReQ, isotropy, condition number);
    - puts back every submodule's training flag, the RNG states of torch (CPU and CUDA), Python and
      numpy, grad mode and autocast: the training after it runs bit for bit as without it.

    The values go out as a flat dict of floats, with "step" and "monitor/seconds" (the wall time of
    the measurement): "eps/input", "mu/input", "sigma/input" (and "/output"); "pga_z/ccr{c}/{layer}";
    "rankme/{layer}", "alpha_req/{layer}", "isotropy/{layer}", "condition_number/{layer}", where
    {layer} is "layer3" for layer 3 of a transformers or TransformerLens model and the label of
    ``layers=`` for a model of your own. With
    `output`, each is appended to that JSONL file as one line (NaN written as null).
    ``timings`` holds the seconds of each part of the last measurement, ``last`` its full results
    (CosineMoments, PGAResult lists, spectral dicts).

    Args:
        model (torch.nn.Module): a transformers model, a TransformerLens HookedTransformer, an
            nnsight LanguageModel, or a module of your own (then pass ``layers=`` as a mapping).
            Wrappers are looked through: torch.compile's, DataParallel, DistributedDataParallel.
        probe (object): the probe's token ids: a 1-D stream (cut into windows of `seq_len`) or a
            2-D batch of windows used as they are (no special tokens added); the probe keeps
            max(ceil(n_tokens / tokens_per_window), ceil(n_tokens / window length)) windows,
            chosen with `seed` (``probe_ids``). Default None: the `texts` with `tokenizer`.
        texts (str | Sequence[str] | os.PathLike | None): text for the probe when `probe` is None:
            a string, a list of strings or a path to a text or .jsonl file, tokenized without
            special tokens into one stream. Default None: the bundled corpus
            (``models.default_corpus``).
        tokenizer (object): the tokenizer of `texts` (default: the model's own, when it carries or
            finds one).
        layers (str | int | Sequence[int] | Mapping): the layers: "all", an index or a list of
            indices (0 = the embedding output, as in ``hidden_states``); for a model of your own, a
            mapping label → submodule (or its name) whose outputs (batch × tokens × d, or a tuple
            whose first element is) are the hidden states. Default "all".
        embeddings (Mapping | None): for a model of your own, {"input": ..., "output": ...}, each a
            parameter of the model (V×d) or its name; default: its get_input_embeddings() and
            get_output_embeddings() when it has them.
        measures (Sequence[str]): any of "epsilon", "pga", "spectral". Default ("epsilon", "pga").
        n_tokens (int): tokens sampled from the probe, at least 3. Default 512.
        seq_len (int): tokens per window of a 1-D probe or of the texts. Default 128.
        tokens_per_window (int): about how many tokens are sampled per window (see `probe`).
            Default 32.
        seed (int): chooses the windows and the positions, in [0, 2^63 − 1]. Default 0.
        k (int | None): the readout dimension, 1 ≤ k < d. Default None: min(100, d // 2).
        n_null (int): random subspaces per layer and CCR variant, ≥ 2. Default 100.
        ccrs (int | Sequence[int]): the CCR variants. Default (1,).
        pga_seed (int): the seed of the null subspaces. Default 0.
        k_sigma (float): ε = μ + k_sigma·σ. Default 2.0.
        last_layer (str): "final_norm" or "resid_post", as ``hidden_states`` (models of transformers
            and TransformerLens; a model of your own takes only the default). Default "final_norm".
        batch_size (int): probe windows per forward pass. Default 8.
        output (str | os.PathLike | None): a JSONL file to append each measurement to (its folder
            is created; an existing file must be a JSONL file of measurements). Default None.
        backend (str): "auto" (default), "cpu", "cuda", "triton" or "torch", for the ops.
        precision (str): "highest" (default) or "tf32", for the ops.

    Raises:
        ValueError: a model on the meta device, of a kind not recognised without ``layers=``, or
            without an unembedding while "pga" is asked; layers the model does not have (an index
            out of range, a name it has no submodule of); probe ids outside the vocabulary, or a
            probe or text too short for n_tokens; seq_len beyond the model's positions; an unknown
            measure; k outside [1, d); an output path that is a folder, an input of the run, or a
            file that is not a JSONL file of measurements; an invalid setting of the ops.
        TypeError: an argument of the wrong type (``ArgumentTypeError``, also a ValueError).

    Examples:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
        ...                                    bos_token_id=0, eos_token_id=0))
        >>> ids = torch.randint(0, 100, (8, 32), generator=torch.Generator().manual_seed(0))
        >>> monitor = rf.RepresentationMonitor(model, ids, n_tokens=64, k=8, n_null=10)
        >>> values = monitor.measure(step=0)
        >>> sorted(key for key in values if key.startswith("pga_z"))
        ['pga_z/ccr1/layer0', 'pga_z/ccr1/layer1', 'pga_z/ccr1/layer2']
        >>> values["eps/input"] == rf.pairwise_cosine_stats(model.transformer.wte.weight, progress=False).epsilon()
        True
    """

    def __init__(self, model, probe=None, *, texts=None, tokenizer=None, layers="all", embeddings=None,
                 measures: Sequence[str] = ("epsilon", "pga"), n_tokens: int = 512, seq_len: int = 128,
                 tokens_per_window: int = 32, seed: int = 0, k: Optional[int] = None, n_null: int = 100,
                 ccrs=(1,), pga_seed: int = 0, k_sigma: float = 2.0, last_layer: str = "final_norm",
                 batch_size: int = 8, output=None, backend: str = "auto", precision: str = "highest"):
        if not isinstance(model, torch.nn.Module) and not hasattr(model, "_model"):  # nnsight wraps its model
            raise val.ArgumentTypeError(f"model must be a torch.nn.Module (a transformers, TransformerLens or nnsight "
                                        f"model, or your own), got {type(model).__name__}")
        self.measures = self._check_measures(measures)
        self.n_tokens = val.check_int(n_tokens, "n_tokens", 3)
        self.seq_len = val.check_int(seq_len, "seq_len", 1)
        self.tokens_per_window = val.check_int(tokens_per_window, "tokens_per_window", 1)
        self.batch_size = val.check_int(batch_size, "batch_size", 1)
        self.seed, self.pga_seed = val.check_seed(seed), val.check_seed(pga_seed, "pga_seed")
        self.n_null = val.check_n_null(n_null)
        self.k_sigma = val.as_real(k_sigma, "k_sigma")
        self.ccrs = self._check_ccrs(ccrs)
        self.backend, self.precision, self.last_layer = backend, precision, last_layer
        self.model = parts.unwrap(model)
        self._own = isinstance(layers, Mapping)
        val.check_choice(last_layer, "last_layer", LAST_LAYER_POINTS)
        if self._own and last_layer != "final_norm":
            raise ValueError("last_layer applies to transformers and TransformerLens models; for a model of your own, "
                             "layers= names the modules whose outputs are read")
        if self._own:
            if not isinstance(self.model, torch.nn.Module):
                raise val.ArgumentTypeError("layers= as a mapping needs the model as a torch.nn.Module")
            self._module = self.model
            parts.check_not_meta(self._module)
            self._modules = parts.resolve_layers(self.model, layers)
            self._embedding_names = parts.resolve_embeddings(self.model, embeddings)
            self.layers: List = list(self._modules)
            self._src, vocab, max_positions = None, self._own_vocab(), None
            tokenizer = tokenizer if tokenizer is not None else getattr(self.model, "tokenizer", None)
        else:
            if embeddings is not None:
                raise ValueError("embeddings= is for a model of your own (with layers= as a mapping); a transformers "
                                 "or TransformerLens model's embeddings are found from the model")
            try:
                self._src = in_memory_source(self.model, tokenizer=tokenizer)
            except ValueError as exc:
                raise ValueError(f"model: {exc}; for a model of your own, pass layers= as a mapping label → "
                                 f"submodule (and embeddings=)") from None
            self._module = self._src.model  # the module that runs (nnsight: the model it wraps)
            parts.check_not_meta(self._module)
            runner = Runner(self._src, last_layer)  # refuses an SAE and an unknown last_layer
            self.layers = check_layers(layers, runner.n_layers)
            vocab, max_positions = runner.vocab_size, runner.max_positions
            tokenizer = self._src.tokenizer
        self.probe_ids = self._probe(probe, texts, tokenizer, vocab)
        if max_positions and self.probe_ids.shape[1] > max_positions:
            raise ValueError(f"seq_len: the probe's windows have {self.probe_ids.shape[1]} tokens; the model takes at "
                             f"most {max_positions}")
        held = self.probe_ids.numel()
        if self.n_tokens > held:
            raise ValueError(f"n_tokens={self.n_tokens} but the probe holds {held} tokens "
                             f"({tuple(self.probe_ids.shape)}); pass a longer probe or a smaller n_tokens")
        self._rows = self._cols = None
        if self._own:
            self._rows, self._cols = parts.sample_positions(tuple(self.probe_ids.shape), self.n_tokens, self.seed)
        self._d = self._check_embeddings()
        self.k = self._check_k(k)
        self._check_op_settings()
        self.output = self._check_output(output, texts)
        self.timings: Dict[str, float] = {}
        self.last: Dict[str, object] = {}

    # ------------------------------------------------------------------------------------ checks

    @staticmethod
    def _check_measures(measures) -> tuple:
        if isinstance(measures, str):
            measures = (measures,)
        measures = tuple(measures)
        if not measures:
            raise ValueError(f"measures must name at least one of {MEASURES}")
        for m in measures:
            val.check_choice(m, "measures", MEASURES)
        return tuple(m for m in MEASURES if m in measures)

    @staticmethod
    def _check_ccrs(ccrs) -> List[int]:
        ccrs = [ccrs] if not isinstance(ccrs, (list, tuple, range)) else list(ccrs)
        out = [val.check_int(c, "ccrs", 0) for c in ccrs]
        if not out or len(set(out)) != len(out):
            raise ValueError(f"ccrs must be distinct ints >= 0, at least one, got {ccrs!r}")
        return out

    def _own_vocab(self) -> Optional[int]:
        name = self._embedding_names["input"]
        return int(self.model.get_parameter(name).shape[0]) if name else None

    def _probe(self, probe, texts, tokenizer, vocab) -> torch.Tensor:
        """The probe batch (windows × window length, CPU int64), chosen once."""
        if probe is not None and texts is not None:
            raise ValueError("pass probe (token ids) or texts, not both")
        if probe is None:
            if tokenizer is None:
                raise ValueError("probe: pass the probe's token ids, or texts with a tokenizer (this model carries "
                                 "none)")
            stream = parts.tokenize(default_corpus()[1] if texts is None else texts, tokenizer)
            ids = parts.check_token_ids(stream, vocab, "texts (tokenized)")
        else:
            ids = parts.check_token_ids(probe, vocab, "probe")
        width = int(ids.shape[1]) if ids.dim() == 2 else self.seq_len
        n_windows = parts.windows_needed(self.n_tokens, self.tokens_per_window, width)
        if ids.dim() == 2:
            return parts.choose_rows(ids, n_windows, self.seed)
        return parts.choose_windows(ids, self.seq_len, n_windows, self.seed)

    def _embeddings(self) -> Dict[str, object]:
        """{"input", "output": V×d detached or None, "tied": bool}, as the model holds them now."""
        if self._own:
            names = self._embedding_names
            found = {which: None if names[which] is None else self.model.get_parameter(names[which]).detach()
                     for which in ("input", "output")}
            return {**found, "tied": names["input"] == names["output"] is not None}
        found = embedding_tensors(self._src)
        return {"input": found["input"], "output": found["output"], "tied": bool(found["tied"])}

    def _check_embeddings(self) -> Optional[int]:
        """Checks the embeddings the measures need; returns their d (None without embeddings)."""
        found = self._embeddings()
        inp, out = found["input"], found["output"]
        if "epsilon" in self.measures and inp is None and out is None:
            raise ValueError("measures: 'epsilon' needs the model's embeddings; pass embeddings={'input': ..., "
                             "'output': ...} (parameters of the model or their names)")
        if "pga" in self.measures and out is None:
            raise ValueError("measures: 'pga' needs the model's unembedding (the readout subspace is its top "
                             "singular directions); pass embeddings={'output': ...} or leave 'pga' out")
        if inp is not None and out is not None and inp.shape[1] != out.shape[1]:
            raise ValueError(f"embeddings: the input embedding is {tuple(inp.shape)} and the unembedding "
                             f"{tuple(out.shape)}: they need one d (the unembedding V×d)")
        known = out if out is not None else inp
        return None if known is None else int(known.shape[1])

    def _check_k(self, k) -> Optional[int]:
        d = self._d
        if "pga" not in self.measures or d is None:
            return None if k is None else val.as_int(k, "k")
        if k is None:
            if d < 2:
                raise ValueError(f"k: the model's d = {d} leaves no readout subspace (1 ≤ k < d)")
            return min(100, max(1, d // 2))
        return val.check_k(k, d)

    def _check_op_settings(self) -> None:
        val.check_choice(self.backend, "backend", ("auto", *BACKENDS))
        val.check_choice(self.precision, "precision", PRECISIONS)
        device = self._device()
        if "pga" in self.measures:
            resolve_backend(self.backend, device, "subspace_pga")
            limit = min(self.n_tokens, self._d)
            for c in self.ccrs:
                if c >= limit:
                    raise ValueError(f"ccrs: {c} must be < min(n_tokens, d) = {limit}")

    def _check_output(self, output, texts) -> Optional[str]:
        if output is None:
            return None
        path = val.check_output_file(output, "output")  # not a folder; its folder created and writable
        inputs = [("texts", os.fspath(texts)) if isinstance(texts, os.PathLike) else ("texts", None)]
        name_or_path = getattr(getattr(self._module, "config", None), "name_or_path", None)
        if isinstance(name_or_path, str) and os.path.exists(name_or_path):
            inputs.append(("model", name_or_path))
        check_no_clobber([("output", path)], inputs)
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            try:
                read_metrics(path)
            except ValueError as exc:
                raise ValueError(f"output {path!r} exists and is not a JSONL file of measurements ({exc}): it would "
                                 f"be appended to; give another path") from None
        return path

    def _device(self) -> torch.device:
        for t in self._module.parameters():
            return t.device
        return torch.device("cpu")

    # ---------------------------------------------------------------------------------- measuring

    def _states(self) -> Dict:
        device = self._device()
        if self._own:
            return parts.own_hidden_states(self.model, self._modules, self.probe_ids, self._rows, self._cols,
                                           self.batch_size, device)
        hs = hidden_states(self._src, token_ids=self.probe_ids, layers=self.layers, n_tokens=self.n_tokens,
                           seed=self.seed, tokens_per_window=self.tokens_per_window, batch_size=self.batch_size,
                           seq_len=int(self.probe_ids.shape[1]),
                           progress=False, last_layer=self.last_layer, states_device=device)
        self._rows, self._cols = hs.windows, hs.offsets  # the windows are used as they are
        return {layer: hs[layer] for layer in hs.layers}

    def _label(self, layer) -> str:
        """The layer's name in the keys: "layer3" (a transformers model's layer 3), or the label given."""
        return str(layer) if self._own else f"layer{layer}"

    def _epsilon(self, values: Dict[str, float], embeddings: Dict[str, object]) -> None:
        found = {}
        tied = embeddings["tied"]
        for which in ("input", "output"):
            w = embeddings[which]
            if w is None:
                continue
            m = found["input"] if which == "output" and tied and "input" in found else cosine_moments(w)
            found[which] = m
            values[f"eps/{which}"] = m.epsilon(self.k_sigma)
            values[f"mu/{which}"], values[f"sigma/{which}"] = m.mean, m.std
        self.last["epsilon"] = found

    def measure(self, step: int) -> Dict[str, float]:
        """Measures the model as it is now: {"step": step, "monitor/seconds": ..., "eps/input": ..., ...}.

        Args:
            step (int): the training step, ≥ 0 (the key "step" of the values and of the JSONL line).

        Returns:
            Dict[str, float]: the values (see the class), also appended to `output` when given.

        Raises:
            ValueError: step not an int ≥ 0; what the ops raise for the states (such as NaN
                weights after a diverged step).
        """
        step = val.check_int(step, "step", 0)
        t0 = time.perf_counter()
        values: Dict[str, float] = {}
        timings: Dict[str, float] = {}
        with parts.untouched(self._module), distributed.local():
            t = time.perf_counter()
            states = self._states() if ("pga" in self.measures or "spectral" in self.measures) else {}
            timings["hidden_states"] = time.perf_counter() - t
            embeddings = self._embeddings()
            if "epsilon" in self.measures:
                t = time.perf_counter()
                self._epsilon(values, embeddings)
                timings["epsilon"] = time.perf_counter() - t
            if "pga" in self.measures:
                t = time.perf_counter()
                profile = pga_profile([states[layer] for layer in self.layers], embeddings["output"], k=self.k,
                                      n_null=self.n_null, ccrs=self.ccrs, seed=self.pga_seed, backend=self.backend,
                                      precision=self.precision, progress=False)
                for c, results in profile.items():
                    for layer, r in zip(self.layers, results):
                        values[f"pga_z/ccr{c}/{self._label(layer)}"] = float(r.z)
                self.last["pga"] = profile
                timings["pga"] = time.perf_counter() - t
            if "spectral" in self.measures:
                t = time.perf_counter()
                self.last["spectral"] = {}
                for layer in self.layers:
                    metrics = spectral_metrics(states[layer])
                    self.last["spectral"][layer] = metrics
                    for key in SPECTRAL_KEYS:
                        values[f"{key}/{self._label(layer)}"] = float(metrics[key])
                timings["spectral"] = time.perf_counter() - t
        seconds = time.perf_counter() - t0
        timings["total"] = seconds
        self.timings = timings
        out = {"step": step, "monitor/seconds": seconds, **values}
        if self.output is not None:
            self._append(out)
        logger.info("monitor: step %d measured in %.2f s", step, seconds)
        return out

    def _append(self, values: Dict[str, float]) -> None:
        line = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in values.items()}
        with open(self.output, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    @property
    def probe_positions(self):
        """(rows, cols): the positions in `probe_ids` of the n_tokens measured tokens, or None.

        Two int64 tensors, the same at every measurement. For a transformers or TransformerLens
        model ``hidden_states`` samples them (from `seed`): they are known after the first
        measurement (None before).
        """
        return None if self._rows is None else (self._rows.clone(), self._cols.clone())

    @property
    def settings(self) -> Dict[str, object]:
        """The monitor's settings as a dict (for a run's records)."""
        return {"measures": list(self.measures), "layers": [str(layer) for layer in self.layers],
                "n_tokens": self.n_tokens, "probe_shape": list(self.probe_ids.shape), "seed": self.seed, "k": self.k,
                "n_null": self.n_null, "ccrs": list(self.ccrs), "pga_seed": self.pga_seed, "k_sigma": self.k_sigma,
                "last_layer": self.last_layer, "backend": self.backend, "precision": self.precision,
                "output": self.output}

    def __repr__(self) -> str:
        return (f"RepresentationMonitor(measures={list(self.measures)}, layers={len(self.layers)}, "
                f"probe={tuple(self.probe_ids.shape)}, n_tokens={self.n_tokens}, k={self.k}, n_null={self.n_null}, "
                f"ccrs={self.ccrs})")
