"""Running the ops across processes with torch.distributed (torchrun; NCCL on GPUs, gloo on CPUs).

An op runs distributed when a process group is initialized (or one is passed as `group=`).
- pairwise_cosine_stats and subspace_pga: every rank holds the same inputs, the op's fixed list of
  work units is split across ranks, each rank computes its own units, and the per-unit partials
  are summed across ranks. A unit's partial comes from exactly one rank and is zero elsewhere, so
  the sum is exact, and every rank merges the units in the order a single process does: the result
  is bitwise the single-process result.
- pairwise_cosine_stats_sharded (each rank holds a block of rows) and packing (each rank owns a
  block of rows and its optimizer state) agree with one process to rounding, as their docstrings
  say.
Before the first collective every rank validates its input and the ranks compare what they were
given, so that a failure or a mismatch on one rank raises on all of them. Progress is shown by
rank 0 only.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist

_LOCAL = contextvars.ContextVar("repcap_fast_local", default=False)


@contextlib.contextmanager
def local():
    """A context in which the ops run in this process alone, even under torchrun.

    For work that differs from rank to rank (a sweep's cells), which must not meet the other
    ranks in a collective. An explicit group= still distributes.
    """
    token = _LOCAL.set(True)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def resolve_group(group=None):
    """The process group to use (None: run in this process alone).

    `group` if given, else the default group when torch.distributed is initialized with more
    than one rank, else None.
    """
    if group is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("group= was given but torch.distributed is not initialized (call "
                               "torch.distributed.init_process_group first, or run under torchrun)")
        return group
    if not _LOCAL.get() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def rank_and_world(group) -> Tuple[int, int]:
    """(this process's rank in `group`, the group's size)."""
    return dist.get_rank(group), dist.get_world_size(group)


def is_main(group=None) -> bool:
    """True on rank 0 of the group, and when not distributed."""
    group = resolve_group(group)
    return group is None or rank_and_world(group)[0] == 0


def tensor_digest(x: Optional[torch.Tensor]) -> Optional[str]:
    """A short digest of a tensor's shape, dtype and bytes (to check that ranks hold the same input)."""
    if x is None:
        return None
    h = hashlib.sha256(f"{tuple(x.shape)}|{x.dtype}".encode())
    flat = x.detach().reshape(-1)
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    step = max(1, (64 << 20) // max(1, flat.element_size()))  # 64 MiB at a time: no full copy
    for start in range(0, flat.numel(), step):
        h.update(flat[start : start + step].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _gather(value: Any, group) -> List[Any]:
    """Every rank's `value`, in rank order (a picklable object)."""
    gathered: List[Any] = [None] * rank_and_world(group)[1]
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _first_failure(statuses: Sequence[Optional[str]]) -> Optional[Tuple[str, str]]:
    """The first failed rank and its error, or None when no rank failed.

    Returns ("rank r of W", "<its error> (and on ranks [...])") for the first rank whose status is
    an error.
    """
    failed = [(r, s) for r, s in enumerate(statuses) if s is not None]
    if not failed:
        return None
    first_rank, first = failed[0]
    return (f"rank {first_rank} of {len(statuses)}",
            first + (f" (and on ranks {[r for r, _ in failed[1:]]})" if len(failed) > 1 else ""))


def _raise_if_different(op: str, signatures: Sequence[Dict[str, Any]]) -> None:
    """A ValueError naming each field that differs between the ranks' signatures, if one does."""
    diffs = [f"{key}: " + ", ".join(f"rank {r} {sig.get(key)!r}" for r, sig in enumerate(signatures))
             for key in signatures[0] if any(sig.get(key) != signatures[0].get(key) for sig in signatures)]
    if diffs:
        raise ValueError(f"{op}: the ranks were given different inputs or settings; every rank must pass the "
                         f"same ones ({'; '.join(diffs)})")


def check_same_on_all_ranks(op: str, signature: Dict[str, Any], group) -> None:
    """Raises the same ValueError on every rank when the ranks' signatures differ.

    Signatures hold shapes, seeds, settings and input digests; the error names each field that
    differs and its value per rank.
    """
    _raise_if_different(op, _gather(signature, group))


def assign_units(weights: Sequence[int], world: int) -> List[int]:
    """The rank of each work unit, balancing the ranks' loads.

    Largest units first, each to the least-loaded rank (ties to the lower rank), so the
    assignment is the same on every rank.
    """
    load = [0] * world
    owner = [0] * len(weights)
    for unit in sorted(range(len(weights)), key=lambda u: (-weights[u], u)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[unit] = rank
        load[rank] += weights[unit]
    return owner


def comm_device(group) -> torch.device:
    """The device a collective's tensors must live on.

    This rank's current GPU for NCCL (whatever device the op's inputs are on), the CPU otherwise.
    """
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_rank(group, group_rank: int) -> int:
    """The global rank of `group_rank` in `group` (point-to-point calls take global ranks)."""
    return dist.get_global_rank(group, group_rank) if group is not dist.group.WORLD else group_rank


def sum_across_ranks(tensors: Sequence[torch.Tensor], group) -> List[torch.Tensor]:
    """The all_reduce(SUM) of each tensor, as CPU tensors.

    Each is reduced on the group's communication device (`comm_device`).
    """
    where = comm_device(group)
    out = []
    for t in tensors:
        t = t.to(where)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        out.append(t.cpu())
    return out


class RankFailure(RuntimeError):
    """An op failed on some rank; every rank raises this, naming the rank and its error."""


def run_on_every_rank(op: str, fn, group):
    """Runs fn() on this rank; if it fails on any rank, every rank raises the same RankFailure.

    Every rank learns whether any rank failed, and all raise the same RuntimeError naming the
    rank and its error (a failure on one rank never leaves the others waiting in a collective).
    """
    try:
        result, status = fn(), None
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
        result, status = None, f"{type(exc).__name__}: {exc}"
    failure = _first_failure(_gather(status, group))
    if failure is not None:
        raise RankFailure(f"{op} failed on {failure[0]}: {failure[1]}")
    return result


def contiguous_share(n: int, rank: int, world: int) -> range:
    """Rank `rank`'s block of n equal work units (blocks differ in size by at most one)."""
    return range(rank * n // world, (rank + 1) * n // world)


def init_from_torchrun(device: str = "cpu") -> bool:
    """Initializes the default process group under torchrun; returns whether it did.

    Under torchrun (WORLD_SIZE > 1 in the environment): NCCL for a CUDA device (each rank on
    cuda:LOCAL_RANK), gloo otherwise. Multi-node runs work the same way: torchrun --nnodes N
    --node-rank R --rdzv-endpoint HOST:PORT.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: this torch has no CUDA device ({torch.__version__})")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return True


class Prepared(Protocol):
    """What an op's validation returns: its checked inputs and settings, and a signature.

    The ranks compare the signature (shapes, input digests, settings).
    """

    def signature(self) -> Dict[str, Any]:
        """The fields every rank must agree on."""
        ...


P = TypeVar("P", bound=Prepared)


def prepare_on_every_rank(op: str, group, prepare: Callable[..., P], *args, **kwargs) -> P:
    """Runs prepare(*args, **kwargs), an op's validation and setup, before its first collective.

    With a group, the ranks then compare the result's signature(): a rank whose input fails
    validation, or differs from the others, makes every rank raise the same ValueError instead of
    leaving the others waiting in a collective. Without a group, prepare() alone.
    """
    if group is None:
        return prepare(*args, **kwargs)
    try:
        prepared, failure = prepare(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported on every rank below
        prepared, failure = None, f"{type(exc).__name__}: {exc}"
    gathered = _gather((failure, None if failure else prepared.signature()), group)  # one collective
    failed = _first_failure([f for f, _ in gathered])
    if failed is not None:  # the same error on every rank
        raise ValueError(f"{op}: the input on {failed[0]} is invalid: {failed[1]}")
    _raise_if_different(op, [signature for _, signature in gathered])
    return prepared
