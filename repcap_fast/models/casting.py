"""Casts to a dtype the user asked for, with an overflow named at the cast.

A value beyond the target's range (65504 for float16) would silently become ±inf, and the error
would come later as "NaN/Inf" with no word of the cast.
"""

from __future__ import annotations

from typing import Optional

import torch

_WIDER = (torch.float32, torch.bfloat16, torch.float64)  # what to suggest, narrowest first


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _alternatives(largest: float, dtype: torch.dtype) -> str:
    fits = [_name(d) for d in _WIDER if d != dtype and torch.finfo(d).max >= largest]
    fits = [f for f in fits if f != "float64"] or ["float64"]
    return " or ".join(fits)


def overflow_error(dtype: torch.dtype, what: str, largest: Optional[float]) -> ValueError:
    """The ValueError for values of `what` beyond `dtype`'s range (`largest`: their largest magnitude, or None)."""
    name, top = _name(dtype), torch.finfo(dtype).max
    values = f"values up to {largest:g} in magnitude" if largest is not None else "values"
    return ValueError(f"dtype={name}: {what} has {values}, beyond {name}'s range (±{top:g}): the cast to {name} "
                      f"turns them into inf; use dtype={_alternatives(largest or top, dtype)}")


def cast(t: torch.Tensor, dtype: Optional[torch.dtype], what: str) -> torch.Tensor:
    """`t.to(dtype)` (t itself when dtype is None or already t's).

    Refused with `overflow_error` when a finite value of t becomes ±inf. Values that were already
    ±inf stay so (the checks of the ops that use them name those).
    """
    if dtype is None or t.dtype == dtype:
        return t
    out = t.to(dtype)
    if not out.is_floating_point():
        return out
    narrower = not t.is_floating_point() or torch.finfo(dtype).max < torch.finfo(t.dtype).max
    if narrower and out.numel() and bool(torch.isinf(out).any()):
        new = torch.isinf(out) & ~torch.isinf(t) if t.is_floating_point() else torch.isinf(out)
        if bool(new.any()):
            largest = float(t[new].abs().max().double()) if t.is_floating_point() else float(t[new].abs().max())
            raise overflow_error(dtype, what, largest)
    return out


def check_loaded(model: torch.nn.Module, dtype: Optional[torch.dtype], what: str) -> None:
    """After a model was loaded (or built) and cast to a 16-bit dtype.

    A parameter that holds ±inf is a value the cast put out of range; ValueError naming the
    parameter.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        return
    for pname, p in model.named_parameters():
        if p.is_floating_point() and p.dtype == dtype and p.numel() and bool(torch.isinf(p).any()):
            raise overflow_error(dtype, f"parameter {pname!r} of {what} (±inf once loaded in {_name(dtype)})", None)
