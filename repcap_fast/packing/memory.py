"""The memory a packing run needs, checked before any allocation.

`repcap pack --k 1000000000000` is refused at once, with the memory it would need, instead of
failing inside the allocator (or being killed by the OOM killer) after minutes of work.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .. import _validation as val

# Copies of the k×d vectors a run holds at once, in the compute dtype: the parameters, their
# gradient, Adam's two moments, the normalized rows, the kernel's gradient and a spare.
_COPIES = 7


def _host_bytes() -> Optional[int]:
    """This machine's physical memory in bytes (None where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _device_bytes(device: torch.device) -> Optional[int]:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_memory(k: int, d: int, dtype: torch.dtype, device: torch.device, backend: str) -> None:
    """Raises ValueError naming k and d when a packing of k vectors in R^d cannot fit in memory.

    Counted: the float64 start (k×d, on the CPU), the run's copies of the vectors in its compute
    dtype and, for the torch backend, its k×k float64 Gram matrices, against the physical memory
    of the host and the total memory of the device.
    """
    itemsize = torch.empty((), dtype=val.compute_dtype(dtype)).element_size()
    start = 8 * k * d
    run = _COPIES * itemsize * k * d + (3 * 8 * k * k if backend == "torch" else 0)
    host, dev = _host_bytes(), _device_bytes(device)
    needs = [(start + (run if dev is None else 0), host, "this machine's memory"), (run, dev, f"{device}'s memory")]
    for need, have, where in needs:
        if have is not None and need > have:
            raise ValueError(
                f"k={k}, d={d} needs about {_gib(need)} (the k×d vectors in float64 and "
                f"{_COPIES} copies in {str(val.compute_dtype(dtype)).replace('torch.', '')}"
                f"{', and k×k Gram matrices for the torch backend' if backend == 'torch' else ''}), more than "
                f"{where} ({_gib(have)}); pick a smaller k or d")
