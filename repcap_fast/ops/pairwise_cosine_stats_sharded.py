"""pairwise_cosine_stats_sharded: the statistics of a matrix whose rows are spread over the ranks.

Each rank of a process group holds one block of rows (for matrices that one device cannot hold).

Each rank computes its block's own pairs; the cross pairs A_r × A_s (r < s) follow a ring: in
round t = 1 … ⌊W/2⌋ rank r receives block (r+t) mod W and computes A_r × A_(r+t) (at t = W/2
for even W only the lower half of the ranks, so no pair is counted twice). Every piece is one
``pairwise_cosine_stats`` call on this rank alone; the pieces' partials are merged by
``pairwise_cosine_stats.merge_partials`` in one fixed order (round, rank) on every rank.
"""

from __future__ import annotations

from builtins import range as _range  # the public function takes an argument named range
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from .. import _validation as val
from .. import distributed
from .._backends import check_precision, eager_only, kernel_limits, resolve_backend
from .pairwise_cosine_stats import CosineStats, merge_partials, pairwise_cosine_stats


@dataclass(frozen=True)
class _Block:
    """This rank's validated block of rows (zero rows dropped once) and the settings.

    The backend is resolved.
    """

    rows: torch.Tensor
    dropped: int
    bins: int
    lo: float
    hi: float
    zero_rows: str
    backend: str
    precision: str

    def signature(self) -> Dict[str, object]:
        """The settings every rank must share (not the block)."""
        return {"bins": self.bins, "range": (self.lo, self.hi), "zero_rows": self.zero_rows,
                "backend": self.backend, "precision": self.precision}


def _check_block(A_local, bins, value_range, zero_rows, backend, precision) -> _Block:
    """This rank's block and the settings, checked."""
    check_precision(precision)
    val.check_choice(zero_rows, "zero_rows", ("error", "drop"))  # here too: an empty block is not checked below
    x = torch.as_tensor(A_local)
    val.check_dense(x, "A_local")
    if x.dim() != 2:
        raise ValueError(f"A_local must be a 2-D block of rows, got shape {tuple(x.shape)}")
    name = resolve_backend(backend, x.device, "pairwise_cosine_stats")  # an unknown or unbuilt backend fails here
    bins, lo, hi = val.check_histogram(bins, value_range, None if name == "torch" else kernel_limits().histogram_bins)
    if x.shape[0] == 0:  # a rank may hold no rows (fewer rows than ranks)
        return _Block(x if x.dtype.is_floating_point else x.to(torch.float32), 0, bins, lo, hi, zero_rows, name,
                      precision)
    x = val.as_matrix(x, "A_local")
    x, _, dropped = val.drop_zero_rows(x, val.row_norms(x, "A_local"), zero_rows, "A_local")
    return _Block(x, dropped, bins, lo, hi, zero_rows, name, precision)


@eager_only
def pairwise_cosine_stats_sharded(
    A_local,
    *,
    group=None,
    bins: int = 4096,
    range: Sequence[float] = (-1.0, 1.0),
    zero_rows: str = "error",
    backend: str = "auto",
    precision: str = "highest",
    progress: Optional[bool] = None,
) -> CosineStats:
    """`pairwise_cosine_stats` of a matrix whose rows are spread over the ranks of a process group.

    Rank r passes its own block A_r, and the full matrix is the blocks stacked in rank order; the
    statistics are those of its pairs i<j. No rank holds more than its block and one other at a
    time. Without a process group it is ``pairwise_cosine_stats(A_local)``.

    Every rank returns the same result, and the counts equal the single-process counts. The
    tiles differ from one process's, so a pair's float32 dot product may differ in its last bits:
    μ and σ agree with the single-process values to float64 summation rounding, min and max to
    float32 rounding, and a pair within rounding of a bin edge may fall in the neighbouring bin.

    Args:
        A_local (torch.Tensor or numpy.ndarray): this rank's (n_r, d) block of rows (a tensor or
            numpy array; a rank may hold no rows); every block has the same d and dtype.
        group (torch.distributed.ProcessGroup, optional): a process group
            (default: the default group when it has more than one rank, else none).
        bins: the histogram's number of bins (default 4096; at most
            ``info()["limits"]["histogram_bins"]`` on the kernel backends).
        range: the histogram's (lo, hi) (default (-1, 1)).
        zero_rows: "error" (default) refuses zero-norm rows; "drop" drops and counts them.
        backend: "auto", "cuda", "triton", "cpu" or "torch", as in ``pairwise_cosine_stats``.
        precision: "highest" or "tf32", as in ``pairwise_cosine_stats``.
        progress: show a progress bar on rank 0 (default: on for large inputs).

    Returns:
        CosineStats: the statistics of the full matrix, on every rank (``shape_a`` the full
        matrix's shape, ``dropped_rows_a`` summed over the ranks).

    Raises:
        ValueError: a block that is not 2-D, blocks of different d or dtype, fewer than 2 rows in
            all, an invalid setting (bins, range, zero_rows, backend, precision), zero rows with
            zero_rows="error", NaN/Inf values, or an input that fails on another rank (the same
            error on every rank).
        repcap_fast.distributed.RankFailure: the computation failed on some rank.
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.

    Examples:
        Without a process group it is ``pairwise_cosine_stats``:

        >>> s = rf.pairwise_cosine_stats_sharded(torch.eye(3), bins=4)
        >>> s.count, s.mean, s.max
        (3, 0.0, 0.0)
    """
    group = distributed.resolve_group(group)
    if group is None:
        return pairwise_cosine_stats(A_local, bins=bins, range=range, zero_rows=zero_rows, backend=backend,
                                     precision=precision, progress=progress)
    rank, world = distributed.rank_and_world(group)
    block = distributed.prepare_on_every_rank("pairwise_cosine_stats_sharded", group, _check_block, A_local, bins,
                                              range, zero_rows, backend, precision)
    infos = [None] * world  # (shape, dtype, dropped) of every block
    torch.distributed.all_gather_object(infos, (tuple(block.rows.shape), str(block.rows.dtype), block.dropped),
                                        group=group)
    nonempty = [info for info in infos if info[0][0] > 0]
    if not nonempty or len({info[0][1] for info in infos}) != 1 or len({info[1] for info in nonempty}) != 1:
        raise ValueError("pairwise_cosine_stats_sharded: every rank's block must have the same d and dtype and at "
                         "least one rank must hold rows, got "
                         + ", ".join(f"rank {r} {info[0]} {info[1]}" for r, info in enumerate(infos)))
    rows_of = [info[0][0] for info in infos]
    if sum(rows_of) < 2:
        raise ValueError(f"pairwise_cosine_stats_sharded: the blocks hold {sum(rows_of)} rows in all; at least 2 "
                         f"are needed")
    dtype = getattr(torch, nonempty[0][1].replace("torch.", ""))
    A = block.rows.to(dtype)
    comm = distributed.comm_device(group)
    rounds = world // 2 + 1
    # One partial slot per piece (round t, rank r), filled by the rank that computes it.
    moments = torch.zeros(rounds * world, 4, dtype=torch.float64)
    counts = torch.zeros(rounds * world, 3 + block.bins, dtype=torch.int64)
    used = _pieces(rows_of)

    def piece(t: int, a, b=None) -> None:
        """Piece (t, rank): the statistics of a (pairs i<j) or of a × b, in this process alone."""
        with distributed.local():
            s = pairwise_cosine_stats(a, b, bins=block.bins, range=(block.lo, block.hi), zero_rows="error",
                                      backend=block.backend, precision=block.precision,
                                      progress=progress if rank == 0 else False)
        slot = t * world + rank
        moments[slot] = torch.tensor([s.sum, s.sum_sq, s.min, s.max], dtype=torch.float64)
        counts[slot, :3] = torch.tensor([s.count, s.below, s.above])
        counts[slot, 3:] = s.hist

    distributed.run_on_every_rank("pairwise_cosine_stats_sharded", lambda: piece(0, A) if used[rank] else None,
                                  group)
    for t in _rounds(world):
        src, dst = (rank + t) % world, (rank - t) % world
        exchange = []
        if rows_of[rank] > 0:
            exchange.append(torch.distributed.P2POp(torch.distributed.isend, A.to(comm).contiguous(),
                                                    distributed.global_rank(group, dst), group=group))
        other = torch.empty(rows_of[src], A.shape[1], dtype=dtype, device=comm)
        if rows_of[src] > 0:
            exchange.append(torch.distributed.P2POp(torch.distributed.irecv, other,
                                                    distributed.global_rank(group, src), group=group))
        if exchange:
            for request in torch.distributed.batch_isend_irecv(exchange):
                request.wait()
        distributed.run_on_every_rank(
            "pairwise_cosine_stats_sharded",
            lambda: piece(t, A, other.to(A.device)) if used[t * world + rank] else None, group)
    moments, counts = distributed.sum_across_ranks([moments, counts], group)
    raw = merge_partials(moments, counts, used)
    return CosineStats(
        **raw, edges=torch.linspace(block.lo, block.hi, block.bins + 1, dtype=torch.float64),
        backend=block.backend,
        shape_a=(sum(rows_of), int(A.shape[1])), dropped_rows_a=sum(info[2] for info in infos),
        settings={"bins": block.bins, "range": [block.lo, block.hi], "zero_rows": zero_rows, "precision": precision,
                  "sharded": f"{world} ranks, ring of row blocks"})


def _rounds(world: int):
    """The ring's rounds t = 1 … ⌊W/2⌋."""
    return _range(1, world // 2 + 1)


def _pieces(rows_of: List[int]) -> List[bool]:
    """Whether piece (t, r) exists, at slot t·W + r.

    Round 0 is block r's own pairs (2 rows or more); round t ≥ 1 is A_r × A_(r+t), except the
    upper half of the ranks at t = W/2 for even W (those pairs are the lower half's), and only
    when both blocks hold rows.
    """
    world = len(rows_of)
    used = [rows >= 2 for rows in rows_of]
    for t in _rounds(world):
        for r in _range(world):
            used.append(not (world % 2 == 0 and t == world // 2 and r >= world // 2)
                        and rows_of[r] > 0 and rows_of[(r + t) % world] > 0)
    return used
