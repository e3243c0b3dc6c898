"""`RepcapCallback`: the representation monitor in a Hugging Face Trainer.

Importing this module imports transformers (the callback subclasses its ``TrainerCallback``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import warnings
from typing import Dict, Optional

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from .. import _validation as val
from ..monitor import RepresentationMonitor

logger = logging.getLogger(__name__)


def _calling_handler() -> Optional[CallbackHandler]:
    """The Trainer's CallbackHandler that is calling this callback's event, or None.

    It is found two frames up (CallbackHandler.call_event calls the event), or a few more.
    """
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler):
            return handler
        frame = frame.f_back
    return None


class RepcapCallback(TrainerCallback):
    """Measures a `RepresentationMonitor` every `every_n_steps` optimizer steps of a Trainer, and logs it.

    At each measured step the monitor's values (``monitor.measure(state.global_step)``) go into
    the Trainer's logs, as ``Trainer.log`` puts them: appended to ``state.log_history`` (with
    "step" and "epoch") and passed to every callback's ``on_log``, so the reporters set with
    ``report_to=`` (TensorBoard, W&B, …) and the progress bar receive them; and into the
    monitor's JSONL file when it has one. The steps are optimizer steps (``state.global_step``),
    so gradient accumulation counts as the Trainer does. With `at_start`, the model is measured
    before the first step (step 0, or the step a resumed run starts from); with `at_end`, at the
    last step when it is not a multiple of `every_n_steps` (and at train end if training stopped
    early). Under distributed training only the main process (``state.is_world_process_zero``)
    measures; the others do nothing. The monitor runs the model it was built with, eagerly: a
    model the Trainer compiles (``torch_compile=True``) or wraps (DDP) is the same module.

    Args:
        monitor (RepresentationMonitor): what to measure and where to write it.
        every_n_steps (int): measure every this many optimizer steps, ≥ 1. Default 500.
        at_start (bool): also measure before the first step. Default True.
        at_end (bool): also measure at the last step. Default True.

    Raises:
        ValueError: every_n_steps < 1 or not an int (``ArgumentTypeError``, also a TypeError, for
            a wrong type); monitor not a RepresentationMonitor; at_start or at_end not a bool.

    Examples:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> from repcap_fast.integrations.transformers import RepcapCallback
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
        ...                                    bos_token_id=0, eos_token_id=0))
        >>> ids = torch.randint(0, 100, (4, 32), generator=torch.Generator().manual_seed(0))
        >>> callback = RepcapCallback(rf.RepresentationMonitor(model, ids, n_tokens=64, k=8, n_null=10),
        ...                           every_n_steps=50)
        >>> callback.every_n_steps
        50
    """

    def __init__(self, monitor: RepresentationMonitor, every_n_steps: int = 500, *, at_start: bool = True,
                 at_end: bool = True):
        if not isinstance(monitor, RepresentationMonitor):
            raise val.ArgumentTypeError(f"monitor must be a repcap_fast.RepresentationMonitor, got "
                                        f"{type(monitor).__name__}")
        self.monitor = monitor
        self.every_n_steps = val.check_int(every_n_steps, "every_n_steps", 1)
        self.at_start, self.at_end = val.check_bool(at_start, "at_start"), val.check_bool(at_end, "at_end")
        self._last_step: Optional[int] = None
        self._pending: Optional[Dict[str, float]] = None  # only without a handler (see _log)
        self._handler: Optional[CallbackHandler] = None
        self._warned = False

    def _measure(self, args, state, control, found: Optional[CallbackHandler]):
        handler = found or self._handler
        if not state.is_world_process_zero or self._last_step == state.global_step:
            return control
        self._last_step = state.global_step
        values = self.monitor.measure(state.global_step)
        logs = {k: v for k, v in values.items() if k != "step"}
        if state.epoch is not None:
            logs["epoch"] = state.epoch
        if handler is not None:  # as Trainer.log does: the history, then every callback's on_log
            state.log_history.append({**logs, "step": state.global_step})
            flags = dataclasses.asdict(control)
            handler.on_log(args, state, control, logs)
            for name, value in flags.items():  # on_log resets should_log: the Trainer's own log of this
                setattr(control, name, value)  # step (the loss) must still happen
            return control
        # No handler found (a transformers whose internals differ): ask the Trainer to log at this
        # step and add the values to its logs in on_log; reporters called before this callback miss them.
        if not self._warned:
            warnings.warn("RepcapCallback could not find the Trainer's callback handler: its values go into "
                          "state.log_history and to the callbacks after it, not to the reporters before it",
                          RuntimeWarning, stacklevel=2)
            self._warned = True
        self._pending = logs
        control.should_log = True
        return control

    def on_train_begin(self, args, state, control, **kwargs):
        """Finds the Trainer's callback handler; measures before the first step with `at_start`."""
        self._handler = _calling_handler()
        self._last_step = None
        if self.at_start:
            return self._measure(args, state, control, None)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        """Measures at every `every_n_steps`-th optimizer step, and at the last with `at_end`."""
        last = self.at_end and state.max_steps and state.global_step >= state.max_steps
        if state.global_step % self.every_n_steps == 0 or last:
            return self._measure(args, state, control, _calling_handler())
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Adds the values to the Trainer's logs, where no handler was found to log them itself."""
        if self._pending is not None and logs is not None:
            logs.update(self._pending)
            if state.log_history:
                state.log_history[-1].update(self._pending)
            self._pending = None
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """With `at_end`, measures the final model when its step was not measured yet."""
        if self.at_end and self._last_step != state.global_step:  # training stopped before max_steps
            self._pending = None
            return self._measure(args, state, control, _calling_handler())
        return control
