"""Kernel 1: statistics of all pairwise cosine similarities, never materializing V×V.

Public functions: ``pairwise_cosine_stats`` (streaming: count, mean, std, min, max, histogram),
``cosine_moments`` (exact mean and std through d×d Grams) and ``epsilon``.
Layers: pairwise_cosine_stats → _dispatch → _pairwise_cosine_stats_{cpu,cuda,triton,torch}
→ kernel (torch.ops.repcap_fast.pairwise_cosine_stats / _pairwise_cosine_stats_kernel).
"""

from __future__ import annotations

import math
from builtins import range as _builtin_range  # the public functions take an argument named range
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from . import _validation as val
from ._backends import resolve_backend
from .reference import cosine_moments_reference, pairwise_cosine_stats_reference

PRECISIONS = {"highest": 0, "tf32": 1}
# Above this much work (pairs × d multiply-adds, about a second on a 2-core CPU) a progress bar
# is shown when progress=None.
_PROGRESS_WORK = 80_000_000_000
# The upper triangle is cut into row groups; each job (a diagonal block or a rectangle of
# two groups) is one kernel call, merged in job order: progress between calls, and a fixed
# decomposition (so results do not depend on anything but V and the device type). GPU jobs are
# larger: each call costs a launch and a host synchronization.
_JOB_ROWS = {"cpu": 8192, "cuda": 65536}
_MAX_GROUPS = 16


@dataclass(frozen=True, eq=False)
class CosineStats:
    """Statistics of the pairwise cosines c_ij = x̂_i·x̂_j.

    Over the unordered pairs i<j of A, or all pairs (i in A, j in B). ``hist`` counts pairs in
    ``bins`` equal bins over ``range`` (edges in ``edges``; the last bin includes its right edge);
    pairs outside ``range`` are counted in ``below`` and ``above``, never dropped, so
    ``hist.sum() + below + above == count``.
    """

    count: int
    mean: float
    std: float
    min: float
    max: float
    hist: torch.Tensor
    edges: torch.Tensor
    below: int
    above: int
    sum: float
    sum_sq: float
    backend: str
    shape_a: Tuple[int, int]
    shape_b: Optional[Tuple[int, int]] = None
    dropped_rows_a: int = 0
    dropped_rows_b: int = 0
    settings: dict = field(default_factory=dict)

    def epsilon(self, k_sigma: float = 2.0) -> float:
        """ε = μ + k_sigma·σ (the paper's accepted deviation, k_sigma = 2)."""
        return self.mean + float(k_sigma) * self.std

    @property
    def bin_width(self) -> float:
        return float(self.edges[1] - self.edges[0])

    def quantile(self, q):
        """Quantile(s) of the cosines from the histogram, linear within a bin.

        Within one bin width (``bin_width``) of the exact quantile, and clipped to [min, max].
        Raises if the quantile falls outside
        ``range`` (in ``below``/``above``).
        """
        qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
        if np.any((qs < 0) | (qs > 1)) or not np.all(np.isfinite(qs)):
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        cum = np.concatenate([[0], np.cumsum(self.hist.numpy())]).astype(np.float64) + self.below
        edges = self.edges.numpy()
        out = np.empty_like(qs)
        for k, qk in enumerate(qs):
            target = qk * self.count
            if target < self.below or target > cum[-1]:
                raise ValueError(
                    f"quantile {qk} lies outside the histogram range {tuple(edges[[0, -1]])} "
                    f"({self.below} pairs below, {self.above} above); widen range="
                )
            i = int(np.searchsorted(cum, target, side="left"))
            i = min(max(i, 1), len(cum) - 1)
            in_bin = cum[i] - cum[i - 1]
            frac = 0.0 if in_bin == 0 else (target - cum[i - 1]) / in_bin
            out[k] = edges[i - 1] + frac * (edges[i] - edges[i - 1])
        out = np.clip(out, self.min, self.max)  # q = 0 and q = 1 are the exact min and max
        return float(out[0]) if np.ndim(q) == 0 else out

    def tail_count(self, t: float) -> int:
        """Number of pairs in the bin that holds t and every bin above it, plus ``above``: the
        pairs with c ≥ t', t' the left edge of t's bin. Exact for c ≥ t when t is a bin edge below
        ``hi``, otherwise an upper bound within one bin; ``tail_count(hi)`` is the last bin (which
        holds c == hi, e.g. duplicate rows) plus ``above``. t must lie within ``range``.
        """
        edges = self.edges.numpy()
        if not edges[0] <= float(t) <= edges[-1]:
            raise ValueError(f"t must lie in the histogram range {tuple(edges[[0, -1]])}, got {t}")
        first = min(int(np.searchsorted(edges, float(t), side="right")) - 1, len(edges) - 2)
        return int(self.hist[first:].sum()) + int(self.above)

    def to_dict(self, include_hist: bool = True) -> dict:
        out = {
            "count": int(self.count),
            "mean": self.mean,
            "std": self.std,
            "epsilon": self.epsilon(),
            "min": self.min,
            "max": self.max,
            "below": int(self.below),
            "above": int(self.above),
            "sum": self.sum,
            "sum_sq": self.sum_sq,
            "backend": self.backend,
            "shape_a": list(self.shape_a),
            "shape_b": list(self.shape_b) if self.shape_b else None,
            "dropped_rows_a": self.dropped_rows_a,
            "dropped_rows_b": self.dropped_rows_b,
            "settings": dict(self.settings),
        }
        if include_hist:
            out["hist"] = self.hist.tolist()
            out["edges"] = self.edges.tolist()
        return out


@dataclass(frozen=True)
class CosineMoments:
    """Exact mean and population std of the pairwise cosines from the d×d Gram identity."""

    count: int
    mean: float
    std: float
    sum: float
    sum_sq: float
    shape_a: Tuple[int, int]
    shape_b: Optional[Tuple[int, int]] = None
    dropped_rows_a: int = 0
    dropped_rows_b: int = 0

    def epsilon(self, k_sigma: float = 2.0) -> float:
        return self.mean + float(k_sigma) * self.std

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["epsilon"] = self.epsilon()
        d["shape_a"] = list(self.shape_a)
        d["shape_b"] = list(self.shape_b) if self.shape_b else None
        return d


def _mean_std(count: int, total: float, total_sq: float) -> Tuple[float, float]:
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    return mean, math.sqrt(var)


def _split_n_rows(n_rows, has_b):
    """n_rows -> (rows of A, rows of B): an int applies to both (a padded vocabulary on both
    sides), a pair (n_a, n_b) to each; None keeps all rows."""
    if isinstance(n_rows, (tuple, list)):
        if len(n_rows) != 2 or not has_b:
            raise ValueError(f"n_rows as a pair (n_a, n_b) needs B and two entries, got {n_rows!r}")
        return n_rows[0], n_rows[1]
    return n_rows, (n_rows if has_b else None)


def _prepare(a, b, zero_rows, n_rows):
    """Validated operands with their float64 row norms and dropped-row counts."""
    n_rows_a, n_rows_b = _split_n_rows(n_rows, b is not None)
    a = val.restrict_rows(val.as_matrix(a, "A"), n_rows_a, "A")
    norms_a = val.row_norms(a, "A")
    a, norms_a, dropped_a = val.drop_zero_rows(a, norms_a, zero_rows, "A")
    norms_b, dropped_b = None, 0
    if b is not None:
        b = val.restrict_rows(val.as_matrix(b, "B"), n_rows_b, "B")
        val.check_pair(a, b)
        norms_b = val.row_norms(b, "B")
        b, norms_b, dropped_b = val.drop_zero_rows(b, norms_b, zero_rows, "B")
        if b.shape[0] == 0:
            raise ValueError("B has no rows left after dropping zero-norm rows")
        if a.shape[0] == 0:
            raise ValueError("A has no rows left after dropping zero-norm rows")
    elif a.shape[0] < 2:
        raise ValueError(
            f"A needs at least 2 rows to form a pair, got {a.shape[0]}"
            + (f" after dropping {dropped_a} zero-norm rows" if dropped_a else "")
        )
    return a, norms_a, dropped_a, b, norms_b, dropped_b


def _kernel_operand(x: torch.Tensor, norms: torch.Tensor, name: str):
    """(operand in a kernel dtype, float32 inverse of the float64 norms). Kernels form dot
    products of the raw rows and scale them in the epilogue; rows with extreme norms (or float64
    values beyond float32) are pre-normalized in float64 first, so float32 cannot overflow."""
    if float(norms.max()) > 1e15 or float(norms.min()) < 1e-15:
        x = (x.to(torch.float64) / norms[:, None]).to(torch.float32)
        norms = val.row_norms(x, name)
    elif x.dtype == torch.float64:
        x = x.to(torch.float32)
    return x.contiguous(), (1.0 / norms).to(torch.float32)


def _job_plan(m: int, device: torch.device):
    """Row groups and the fixed job order (i, j) over the upper triangle of group blocks."""
    rows = _JOB_ROWS["cuda" if device.type == "cuda" else "cpu"]
    groups = min(_MAX_GROUPS, max(1, -(-m // rows)))
    bounds = [round(k * m / groups) for k in range(groups + 1)]
    jobs = [(i, j) for i in range(groups) for j in range(i, groups)]
    return bounds, jobs


def _run_jobs(kernel, a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress, group=None):
    """Cuts the work into jobs, runs `kernel` on each, merges the partials in job order.

    With a process group, each rank runs the jobs `assign_units` gives it, the per-job partials
    are summed across ranks (each job's row is nonzero on exactly one rank, so the sum is exact),
    and every rank merges them in the same job order: the single-process result, bitwise."""
    if b is None:
        bounds, jobs = _job_plan(a.shape[0], a.device)
        work = []
        for i, j in jobs:
            ra = slice(bounds[i], bounds[i + 1])
            rb = slice(bounds[j], bounds[j + 1])
            if i == j:
                work.append((a[ra], inv_a[ra], None, None))
            else:
                work.append((a[ra], inv_a[ra], a[rb], inv_a[rb]))
    else:
        bounds, _ = _job_plan(a.shape[0], a.device)
        work = [(a[s:e], inv_a[s:e], b, inv_b) for s, e in zip(bounds[:-1], bounds[1:])]

    def pairs(job):
        m = job[0].shape[0]
        return m * (m - 1) // 2 if job[2] is None else m * job[2].shape[0]

    weights = [pairs(job) for job in work]
    if group is None:
        owner, rank = [0] * len(work), 0
    else:
        from .distributed import assign_units, rank_and_world

        rank, world = rank_and_world(group)
        owner = assign_units(weights, world)
    mine = sum(w for w, o in zip(weights, owner) if o == rank)
    bar = _progress_bar(progress if rank == 0 else False, mine, mine * a.shape[1], "cosine pairs")
    moments = torch.zeros(len(work), 4, dtype=torch.float64)  # Σc, Σc², min, max per job
    counts = torch.zeros(len(work), 3 + bins, dtype=torch.int64)  # pairs, below, above, hist per job

    def run_mine():
        try:
            for u, job in enumerate(work):
                if weights[u] == 0 or owner[u] != rank:
                    continue
                mom, cnt, h = kernel(job[0], job[1], job[2], job[3], bins, lo, hi, math_mode)
                moments[u] = mom.cpu()
                counts[u, :3] = cnt.cpu()
                counts[u, 3:] = h.cpu()
                if bar is not None:
                    bar.update(int(cnt[0]))
        finally:
            if bar is not None:
                bar.close()

    if group is None:
        run_mine()
    else:
        from .distributed import run_on_every_rank, sum_across_ranks

        run_on_every_rank("pairwise_cosine_stats", run_mine, group)
        moments, counts = sum_across_ranks([moments, counts], group, a.device)
    total = total_sq = 0.0
    cmin, cmax = math.inf, -math.inf
    count = below = above = 0
    hist = torch.zeros(bins, dtype=torch.int64)
    for u, (mom, cnt) in enumerate(zip(moments.tolist(), counts[:, :3].tolist())):
        if weights[u] == 0:
            continue
        total += mom[0]
        total_sq += mom[1]
        cmin = min(cmin, mom[2])
        cmax = max(cmax, mom[3])
        count += cnt[0]
        below += cnt[1]
        above += cnt[2]
    hist += counts[:, 3:].sum(0)
    return dict(count=count, sum=total, sum_sq=total_sq, min=cmin, max=cmax, below=below, above=above, hist=hist)


def _progress_bar(progress, total, work, unit):
    show = progress if progress is not None else work >= _PROGRESS_WORK
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=" pairs", unit_scale=True, desc=unit, leave=False)


def _pairwise_cosine_stats_cpu(a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress, group=None):
    return _run_jobs(torch.ops.repcap_fast.pairwise_cosine_stats, a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress,
                     group)


def _pairwise_cosine_stats_cuda(a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress, group=None):
    # The same registered op as the CPU backend: the dispatcher routes CUDA tensors to csrc/cuda.
    return _run_jobs(torch.ops.repcap_fast.pairwise_cosine_stats, a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress,
                     group)


def _pairwise_cosine_stats_triton(a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress, group=None):
    from .triton_kernels import pairwise_cosine_stats_triton

    return _run_jobs(pairwise_cosine_stats_triton, a, inv_a, b, inv_b, bins, lo, hi, math_mode, progress, group)


def _pairwise_cosine_stats_torch(a, b, bins, lo, hi, progress):
    bar = None
    if progress or (progress is None and a.shape[0] * (b if b is not None else a).shape[0] // 2 * a.shape[1] >= _PROGRESS_WORK):
        from tqdm.auto import tqdm

        bar = lambda it: tqdm(it, desc="cosine rows (reference)", leave=False)  # noqa: E731
    return pairwise_cosine_stats_reference(a, b, bins=bins, lo=lo, hi=hi, dtype=torch.float64, progress=bar)


def pairwise_cosine_stats(
    A,
    B=None,
    *,
    bins: int = 4096,
    range: Sequence[float] = (-1.0, 1.0),
    zero_rows: str = "error",
    n_rows: Optional[int] = None,
    backend: str = "auto",
    precision: str = "highest",
    progress: Optional[bool] = None,
    group=None,
) -> CosineStats:
    """Statistics of all pairwise cosine similarities of the rows of A (pairs i<j), or of all
    pairs (i in A, j in B), streamed tile by tile: O(V·d) memory, never V×V.

    Args:
        A: (V, d) float16/bfloat16/float32/float64 tensor or numpy array, rows are vectors.
        B: optional (n, d) matrix on A's device; then all V·n pairs are used.
        bins, range: the fixed-bin histogram (default 4096 bins over [-1, 1]).
        zero_rows: "error" (default) refuses zero-norm rows; "drop" drops and counts them.
        n_rows: use only the first n_rows rows (padded vocabularies): of A, and of B too when B
            is given; a pair (n_a, n_b) sets them apart (None keeps all rows).
        backend: "auto", "cuda", "triton", "cpu" or "torch" (float64 reference).
        precision: for float32 inputs on GPU, "highest" (float32 FMA dot products) or "tf32"
            (tensor cores). bf16/fp16 inputs always use exact products with float32
            accumulation. The C++ CPU kernel always works in float32.
        progress: show a progress bar (default: on when pairs × d ≥ 8e10, about a second of CPU).
        group: a torch.distributed process group. When one is given, or the default group is
            initialized with more than one rank (torchrun), the jobs are split across the ranks,
            which must all pass the same A, B and settings (checked); every rank returns the
            single-process result, bitwise (the torch backend computes everything on every rank).

    Dot products are accumulated in float32 (float64 on the torch backend) and scaled by the
    inverse float64 row norms; per-row/tile sums are merged in float64 in a fixed order, so a
    result is bitwise repeatable on the same backend and machine.
    """
    from .distributed import prepare_on_every_rank, resolve_group, tensor_digest

    group = resolve_group(group)

    def prepare():  # every check before the first collective, so that a failure reaches every rank
        bins_, lo_, hi_ = val.check_histogram(bins, range)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
        A_ = val.as_matrix(A, "A")  # once: a non-contiguous numpy array is copied here
        name_ = resolve_backend(backend, A_.device, "pairwise_cosine_stats")
        return (bins_, lo_, hi_, name_, *_prepare(A_, B, zero_rows, n_rows))

    bins, lo, hi, name, a, norms_a, dropped_a, b, norms_b, dropped_b = prepare_on_every_rank(
        "pairwise_cosine_stats", prepare,
        lambda prep: {"A": tensor_digest(prep[4]), "B": tensor_digest(prep[7]), "shape_a": tuple(prep[4].shape),
                      "shape_b": None if prep[7] is None else tuple(prep[7].shape), "bins": prep[0],
                      "range": (prep[1], prep[2]), "backend": prep[3], "precision": precision, "zero_rows": zero_rows},
        group)
    if name == "torch":
        raw = _pairwise_cosine_stats_torch(a, b, bins, lo, hi, progress)
    else:
        ka, inv_a = _kernel_operand(a, norms_a, "A")
        kb, inv_b = (None, None) if b is None else _kernel_operand(b, norms_b, "B")
        if kb is not None and kb.dtype != ka.dtype:  # mixed dtypes meet in float32, never lower
            ka, kb = ka.to(torch.float32), kb.to(torch.float32)
        launcher = {
            "cpu": _pairwise_cosine_stats_cpu,
            "cuda": _pairwise_cosine_stats_cuda,
            "triton": _pairwise_cosine_stats_triton,
        }[name]
        raw = launcher(ka, inv_a, kb, inv_b, bins, lo, hi, PRECISIONS[precision], progress, group)
    mean, std = _mean_std(raw["count"], raw["sum"], raw["sum_sq"])
    return CosineStats(
        count=raw["count"],
        mean=mean,
        std=std,
        min=float(raw["min"]),
        max=float(raw["max"]),
        hist=raw["hist"],
        edges=torch.linspace(lo, hi, bins + 1, dtype=torch.float64),
        below=raw["below"],
        above=raw["above"],
        sum=raw["sum"],
        sum_sq=raw["sum_sq"],
        backend=name,
        shape_a=tuple(a.shape),
        shape_b=tuple(b.shape) if b is not None else None,
        dropped_rows_a=dropped_a,
        dropped_rows_b=dropped_b,
        settings={"bins": bins, "range": [lo, hi], "zero_rows": zero_rows,
                  "n_rows": list(n_rows) if isinstance(n_rows, (tuple, list)) else n_rows,
                  "precision": precision, "dtype": str(a.dtype).replace("torch.", ""),
                  "compute": "float64" if name == "torch" else "float32 dot products, float64 sums"},
    )


def cosine_moments(A, B=None, *, zero_rows: str = "error", n_rows: Optional[int] = None) -> CosineMoments:
    """Exact mean and std of the pairwise cosines through the d×d Gram identity, in float64.

    O(V·d²) time, O(d²) extra memory, no pairs at all (DESIGN 1.1). Runs on A's device.
    """
    a, _, dropped_a, b, _, dropped_b = _prepare(A, B, zero_rows, n_rows)
    raw = cosine_moments_reference(a, b)
    mean, std = _mean_std(raw["count"], raw["sum"], raw["sum_sq"])
    return CosineMoments(
        count=raw["count"], mean=mean, std=std, sum=raw["sum"], sum_sq=raw["sum_sq"],
        shape_a=tuple(a.shape), shape_b=tuple(b.shape) if b is not None else None,
        dropped_rows_a=dropped_a, dropped_rows_b=dropped_b,
    )


def epsilon(A, B=None, *, method: str = "gram", k_sigma: float = 2.0, **kwargs) -> float:
    """ε = μ + k_sigma·σ of the pairwise cosines; method "gram" (exact, O(V·d²)) or "stream"."""
    if method == "gram":
        return cosine_moments(A, B, **kwargs).epsilon(k_sigma)
    if method == "stream":
        return pairwise_cosine_stats(A, B, **kwargs).epsilon(k_sigma)
    raise ValueError(f"method must be 'gram' or 'stream', got {method!r}")


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
    """`pairwise_cosine_stats` of a matrix whose rows are spread over the ranks: rank r passes its
    own block A_r, and the full matrix is the blocks stacked in rank order. No rank holds more
    than its block and one other at a time.

    Each rank computes its block's own pairs; the cross pairs A_r × A_s (r < s) follow a ring: in
    round t = 1 … ⌊W/2⌋ rank r receives block (r+t) mod W and computes A_r × A_(r+t) (at t = W/2
    for even W only the lower half of the ranks, so no pair is counted twice). The pieces'
    partials are merged in one fixed order on every rank, so every rank returns the same result.
    Counts equal the single-process count. The tiles differ from one process's, so a pair's
    float32 dot product may differ in its last bits: μ and σ agree with the single-process values
    to about 1e-11 (5e-12 in μ at V = 1001, d = 24), min and max to float32 rounding, and a pair
    within rounding of a bin edge may fall in the neighbouring bin.
    """
    import torch.distributed as dist

    from .distributed import comm_device, global_rank, local, rank_and_world, resolve_group, run_on_every_rank

    group = resolve_group(group)
    if group is None:
        return pairwise_cosine_stats(A_local, bins=bins, range=range, zero_rows=zero_rows, backend=backend,
                                     precision=precision, progress=progress)
    rank, world = rank_and_world(group)

    def prepare():  # checks, and zero rows dropped once per block, before the first collective
        bins_, lo_, hi_ = val.check_histogram(bins, range)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
        if zero_rows not in ("error", "drop"):
            raise ValueError(f"zero_rows must be 'error' or 'drop', got {zero_rows!r}")
        x = torch.as_tensor(A_local)
        if x.dim() != 2:
            raise ValueError(f"A_local must be a 2-D block of rows, got shape {tuple(x.shape)}")
        if x.shape[0] == 0:  # a rank may hold no rows (fewer rows than ranks)
            x = x.to(torch.float32) if not x.dtype.is_floating_point else x
            return bins_, lo_, hi_, x, 0
        x = val.as_matrix(x, "A_local")
        norms = torch.linalg.vector_norm(x.to(torch.float64), dim=1)
        zero = norms == 0
        if bool(zero.any()):
            if zero_rows == "error":
                raise ValueError(f"A_local has {int(zero.sum())} zero-norm rows; pass zero_rows='drop' to drop them")
            x = x[~zero]
        resolve_backend(backend, x.device, "pairwise_cosine_stats")  # an unknown or unbuilt backend fails here
        return bins_, lo_, hi_, x, int(zero.sum())

    try:
        prepared, failure = prepare(), None
    except Exception as exc:  # noqa: BLE001 - reported on every rank
        prepared, failure = None, f"{type(exc).__name__}: {exc}"
    settings = {"bins": bins if failure else prepared[0], "range": None if failure else (prepared[1], prepared[2]),
                "zero_rows": zero_rows, "backend": backend, "precision": precision}
    info = (None, None, None, failure, settings) if failure else (
        tuple(prepared[3].shape), str(prepared[3].dtype), prepared[4], None, settings)
    infos = [None] * world
    dist.all_gather_object(infos, info, group=group)
    failed = [(r, i[3]) for r, i in enumerate(infos) if i[3]]
    if failed:
        raise ValueError(f"pairwise_cosine_stats_sharded: rank {failed[0][0]}'s block is invalid: {failed[0][1]}")
    if any(i[4] != infos[0][4] for i in infos):
        raise ValueError("pairwise_cosine_stats_sharded: the ranks were given different settings; every rank must "
                         "pass the same ones (" + ", ".join(f"rank {r} {i[4]}" for r, i in enumerate(infos)) + ")")
    nonempty = [i for i in infos if i[0][0] > 0]
    if not nonempty or len({i[0][1] for i in infos}) != 1 or len({i[1] for i in nonempty}) != 1:
        raise ValueError("pairwise_cosine_stats_sharded: every rank's block must have the same d and dtype and at "
                         "least one rank must hold rows, got " + ", ".join(f"rank {r} {i[0]} {i[1]}" for r, i in
                                                                           enumerate(infos)))
    bins, lo, hi, A = prepared[0], prepared[1], prepared[2], prepared[3]
    dtype = getattr(torch, nonempty[0][1].replace("torch.", ""))
    A = A.to(dtype)
    rows_of = [i[0][0] for i in infos]
    comm = comm_device(group)
    kw = dict(bins=bins, range=(lo, hi), zero_rows="error", backend=backend, precision=precision,
              progress=progress if rank == 0 else False)
    pieces = []  # (round, rank, stats)

    def stats_of(a, b=None):
        with local():
            return pairwise_cosine_stats(a, b, **kw)

    own = run_on_every_rank("pairwise_cosine_stats_sharded",
                            lambda: stats_of(A) if A.shape[0] >= 2 else None, group)
    if own is not None:
        pieces.append((0, rank, own))
    for t in _builtin_range(1, world // 2 + 1):
        src, dst = (rank + t) % world, (rank - t) % world
        ops = []
        if rows_of[rank] > 0:
            ops.append(dist.P2POp(dist.isend, A.to(comm).contiguous(), global_rank(group, dst), group=group))
        other = torch.empty(rows_of[src], A.shape[1], dtype=dtype, device=comm)
        if rows_of[src] > 0:
            ops.append(dist.P2POp(dist.irecv, other, global_rank(group, src), group=group))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        compute = not (world % 2 == 0 and t == world // 2 and rank >= world // 2)
        if compute and rows_of[rank] > 0 and rows_of[src] > 0:
            piece = run_on_every_rank("pairwise_cosine_stats_sharded", lambda: stats_of(A, other.to(A.device)), group)
            pieces.append((t, rank, piece))
        else:
            run_on_every_rank("pairwise_cosine_stats_sharded", lambda: None, group)
    gathered = [None] * world
    mine = [(t, r, s.count, s.sum, s.sum_sq, s.min, s.max, s.below, s.above, s.hist.tolist(), s.dropped_rows_a)
            for t, r, s in pieces]
    dist.all_gather_object(gathered, mine, group=group)
    parts = sorted((p for ps in gathered for p in ps), key=lambda p: (p[0], p[1]))
    count = below = above = 0
    total = total_sq = 0.0
    cmin, cmax = math.inf, -math.inf
    hist = torch.zeros(bins, dtype=torch.int64)
    for _, _, c, s1, s2, mn, mx, bl, ab, h, _ in parts:
        count += c
        total += s1
        total_sq += s2
        cmin, cmax = min(cmin, mn), max(cmax, mx)
        below += bl
        above += ab
        hist += torch.tensor(h, dtype=torch.int64)
    rows = sum(rows_of)
    dropped = sum(i[2] for i in infos)
    if not parts:
        raise ValueError(f"pairwise_cosine_stats_sharded: the blocks hold {rows} rows in all; at least 2 are needed")
    backend_used = resolve_backend(backend, A.device, "pairwise_cosine_stats")
    mean, std = _mean_std(count, total, total_sq)
    return CosineStats(count=count, mean=mean, std=std, min=float(cmin), max=float(cmax), hist=hist,
                       edges=torch.linspace(lo, hi, bins + 1, dtype=torch.float64), below=below, above=above,
                       sum=total, sum_sq=total_sq, backend=backend_used,
                       shape_a=(rows, int(A.shape[1])), dropped_rows_a=dropped,
                       settings={"bins": bins, "range": [lo, hi], "zero_rows": zero_rows, "precision": precision,
                                 "sharded": f"{world} ranks, ring of row blocks"})
