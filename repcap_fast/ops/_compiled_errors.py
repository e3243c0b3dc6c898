"""Argument errors that keep their type and message under torch.compile (repcap_fast.ops).

In eager mode a public op function raises its argument error at once. While torch.compile
traces it (``fullgraph=True`` included) the same check runs on the traced values, and an error
it raises becomes a node of the graph instead: the op ``torch.ops.repcap_fast.argument_error``,
which raises the same exception type with the same message when the compiled code runs. Dynamo
would otherwise report ``torch._dynamo.exc.Unsupported`` ("Observed exception") with our message
only in a debug line. The node is marked side-effectful, so it is kept even when the caller
discards the result. Checks of the values (NaN/Inf, zero rows) run inside the ops themselves,
and the ops' fake kernels never raise, so these errors too keep their type in compiled code.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch
from torch.fx.node import has_side_effect

from .. import _validation as val
from .._backends import BackendUnavailableError, custom_op

# The exception types a check raises, by name (the op's schema carries a string).
_KINDS = {cls.__name__: cls for cls in (ValueError, TypeError, RuntimeError, val.ArgumentTypeError,
                                        BackendUnavailableError)}


@custom_op("repcap_fast::argument_error", mutates_args=())
def _argument_error(kind: str, message: str) -> torch.Tensor:
    """Raises the exception named `kind` (ValueError, TypeError, ...) with `message`."""
    raise _KINDS.get(kind, ValueError)(message)


@_argument_error.register_fake
def _(kind, message):
    """A float32 0-d tensor: the op raises before it would return one."""
    return torch.empty(())


has_side_effect(torch.ops.repcap_fast.argument_error.default)


def deferred_error(exc: BaseException) -> torch.Tensor:
    """The graph node that raises `exc` (its type and message) when compiled code runs."""
    kind = type(exc).__name__ if type(exc).__name__ in _KINDS else "ValueError"
    return torch.ops.repcap_fast.argument_error(kind, str(exc))


def checked(checks: Callable[[], Tuple], on_error: Callable[[torch.Tensor], object]):
    """(checks(), None), or, while torch.compile traces and checks() raised, (None, on_error(node)).

    node is the graph's ``argument_error`` node, and on_error forms the op's outputs from it (so
    the caller's graph still traces). Outside tracing the error propagates.
    """
    try:
        return checks(), None
    except (ValueError, TypeError, RuntimeError) as exc:
        if not torch.compiler.is_compiling():
            raise
        return None, on_error(deferred_error(exc))
