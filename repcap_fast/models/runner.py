"""Running a model on token ids: the residual stream at every layer (`Runner`), in eval mode."""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Tuple

import torch

from .in_memory import LAST_LAYER_POINTS, InMemorySource, _text_config


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise the same values, NaN included (an overflowed float16 run has NaN states)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


@contextlib.contextmanager
def eval_mode(*modules: torch.nn.Module):
    """Run `modules` in eval mode (dropout off, batch norm on its running statistics).

    Then put back every submodule's own `training` flag as it was (a model left partly in training
    keeps exactly that state), also when the body raises. The flags are set directly, without
    calling any module's `train()` override.
    """
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
    """Runs a model on batches of token ids and returns the residual stream at every layer.

    Entry 0 is the embedding output, entry l the output of block l, and entry L (the last) is read
    at the point `last_layer` names:

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
    also when the forward raises.
    """

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
        """The device the model runs on (its inputs go there)."""
        return self.src.device

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> List[torch.Tensor]:
        """The residual stream at every layer (n_layers + 1 tensors, batch × tokens × d), in eval mode.

        Args:
            input_ids (torch.Tensor): batch × tokens token ids, on the model's device.
            attention_mask (torch.Tensor): 1 on tokens, 0 on padding, the same shape.

        Returns:
            list[torch.Tensor]: entry 0 the embedding output, entry l the output of block l, the last
            at the point `last_layer` names.
        """
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
