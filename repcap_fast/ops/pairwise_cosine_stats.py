"""pairwise_cosine_stats: statistics of all pairwise cosine similarities, never materializing V×V;
``cosine_moments`` (the exact mean and std through d×d Grams) and ``epsilon``.

Layers: ``pairwise_cosine_stats`` (validates) → ``_pairwise_cosine_stats`` (cuts the pairs into
jobs, runs them on the dispatched backend, merges) → ``KERNELS["pairwise_cosine_stats"][backend]``
(``_pairwise_cosine_stats_compiled`` for cpu and cuda, ``_pairwise_cosine_stats_triton``,
``_pairwise_cosine_stats_torch``) → the kernels (torch.ops.repcap_fast.pairwise_cosine_stats,
triton_kernels.pairwise_cosine_stats, reference.pairwise_cosine_stats_reference).

Every launcher takes (a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision) for one job (b and
b_inv_norm None for the pairs i<j of a; precision as in the public function) and returns
(moments float64[4] = Σc, Σc², min, max; counts int64[3] = pairs, below, above;
hist int64[bins]).
"""

from __future__ import annotations

import contextlib
import math
import os
from builtins import range as _range  # the public functions take an argument named range
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _validation as val
from .. import distributed
from .._backends import (
    check_precision,
    cublas_precision,
    eager_only,
    kernel_limits,
    launcher,
    precision_code,
    register_kernel,
    resolve_backend,
    triton_kernels,
)
from .._kernel_choices import choose
from .._ops import pairwise_cosine_stats_fake
from .._progress import progress_bar
from ..reference import cosine_moments_reference, pairwise_cosine_stats_reference

# Above this much work (pairs × d multiply-adds, about a second on a 2-core CPU) a progress bar
# is shown when progress=None.
_PROGRESS_WORK = 80_000_000_000
# The upper triangle is cut into row groups; each job (a diagonal block or a rectangle of
# two groups) is one launcher call, merged in job order: progress between calls, and a fixed
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
        """ε = μ + k_sigma·σ (the paper's accepted deviation, k_sigma = 2); k_sigma a finite real."""
        return self.mean + val.as_real(k_sigma, "k_sigma") * self.std

    @property
    def bin_width(self) -> float:
        return float(self.edges[1] - self.edges[0])

    def quantile(self, q):
        """Quantile(s) of the cosines from the histogram, linear within a bin.

        Within one bin width (``bin_width``) of the exact quantile, and clipped to [min, max].
        Raises if the quantile falls outside ``range`` (in ``below``/``above``).
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
            "count": int(self.count), "mean": self.mean, "std": self.std, "epsilon": self.epsilon(),
            "min": self.min, "max": self.max, "below": int(self.below), "above": int(self.above),
            "sum": self.sum, "sum_sq": self.sum_sq, "backend": self.backend, "shape_a": list(self.shape_a),
            "shape_b": list(self.shape_b) if self.shape_b else None, "dropped_rows_a": self.dropped_rows_a,
            "dropped_rows_b": self.dropped_rows_b, "settings": dict(self.settings),
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
        """ε = μ + k_sigma·σ; k_sigma a finite real."""
        return self.mean + val.as_real(k_sigma, "k_sigma") * self.std

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["epsilon"] = self.epsilon()
        d["shape_a"] = list(self.shape_a)
        d["shape_b"] = list(self.shape_b) if self.shape_b else None
        return d


def mean_std(count: int, total: float, total_sq: float, lowest: Optional[float] = None,
             highest: Optional[float] = None) -> Tuple[float, float]:
    """(μ, population σ) from the count, Σc and Σc² (float64 power sums). σ² = Σc²/n − μ² cancels
    when σ ≪ rms(c): σ below about 1e-7·rms(c) is good to about 6e-8·rms(c) absolute. With the
    smallest and largest value known, μ is kept within [lowest, highest] (rounding could put it an
    ulp outside), σ within (highest − lowest)/2, and equal values give σ = 0 exactly."""
    mean = total / count
    std = math.sqrt(max(total_sq / count - mean * mean, 0.0))
    if lowest is not None and highest is not None and lowest <= highest:
        mean = min(max(mean, lowest), highest)
        std = min(std, (highest - lowest) / 2)
    return mean, std


# ------------------------------------------------------------------------------ validation


@dataclass(frozen=True)
class Operands:
    """Rows of A (and B) with their float64 row norms, zero rows dropped per the policy."""

    a: torch.Tensor
    norms_a: torch.Tensor
    dropped_a: int
    b: Optional[torch.Tensor]
    norms_b: Optional[torch.Tensor]
    dropped_b: int


def _split_n_rows(n_rows, has_b):
    """n_rows -> (rows of A, rows of B): an int applies to both (a padded vocabulary on both
    sides), a pair (n_a, n_b) to each; None keeps all rows."""
    if isinstance(n_rows, (tuple, list)):
        if len(n_rows) != 2 or not has_b:
            raise ValueError(f"n_rows as a pair (n_a, n_b) needs B and two entries, got {n_rows!r}")
        return n_rows[0], n_rows[1]
    return n_rows, (n_rows if has_b else None)


def check_operands(A, B, zero_rows: str, n_rows) -> Operands:
    """A (and B) validated: 2-D float matrices on one device with the same d, first n_rows rows,
    finite, zero rows refused or dropped; A needs two rows when alone."""
    n_rows_a, n_rows_b = _split_n_rows(n_rows, B is not None)
    a = val.restrict_rows(val.as_matrix(A, "A"), n_rows_a, "A")
    norms_a = val.row_norms(a, "A")
    a, norms_a, dropped_a = val.drop_zero_rows(a, norms_a, zero_rows, "A")
    norms_b, dropped_b, b = None, 0, None
    if B is not None:
        b = val.restrict_rows(val.as_matrix(B, "B"), n_rows_b, "B")
        val.check_pair(a, b)
        norms_b = val.row_norms(b, "B")
        b, norms_b, dropped_b = val.drop_zero_rows(b, norms_b, zero_rows, "B")
        if b.shape[0] == 0:
            raise ValueError("B has no rows left after dropping zero-norm rows")
        if a.shape[0] == 0:
            raise ValueError("A has no rows left after dropping zero-norm rows")
    elif a.shape[0] < 2:
        raise ValueError(f"A needs at least 2 rows to form a pair, got {a.shape[0]}"
                         + (f" after dropping {dropped_a} zero-norm rows" if dropped_a else ""))
    return Operands(a, norms_a, dropped_a, b, norms_b, dropped_b)


@dataclass(frozen=True)
class _Inputs:
    """The validated arguments of one pairwise_cosine_stats call."""

    ops: Operands
    bins: int
    lo: float
    hi: float
    backend: str
    precision: str
    zero_rows: str

    def signature(self) -> Dict[str, object]:
        b = self.ops.b
        return {"A": distributed.tensor_digest(self.ops.a), "B": distributed.tensor_digest(b),
                "shape_a": tuple(self.ops.a.shape), "shape_b": None if b is None else tuple(b.shape),
                "bins": self.bins, "range": (self.lo, self.hi), "backend": self.backend,
                "precision": self.precision, "zero_rows": self.zero_rows}


def check_settings(device, bins, value_range=(-1.0, 1.0), zero_rows: str = "error", backend="auto",
                   precision: str = "highest") -> Tuple[str, int, float, float]:
    """Everything about a call on tensors on `device` that needs no pass over the matrices: the
    precision, the backend (resolved), bins against its limit, the range, the zero-rows policy.
    Returns (backend, bins, lo, hi). Callers that load the matrices first (the CLI, reports)
    run it before loading."""
    check_precision(precision)
    val.check_choice(zero_rows, "zero_rows", ("error", "drop"))
    name = resolve_backend(backend, torch.device(device), "pairwise_cosine_stats")
    max_bins = None if name == "torch" else kernel_limits().histogram_bins
    bins, lo, hi = val.check_histogram(bins, value_range, max_bins)
    return name, bins, lo, hi


def _check_inputs(A, B, bins, value_range, zero_rows, n_rows, backend, precision) -> _Inputs:
    a = val.as_matrix(A, "A")  # once: a non-contiguous numpy array is copied here
    name, bins, lo, hi = check_settings(a.device, bins, value_range, zero_rows, backend, precision)
    return _Inputs(check_operands(a, B, zero_rows, n_rows), bins, lo, hi, name, precision, zero_rows)


# ------------------------------------------------------------------------- public function


@eager_only
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
        bins, range: the fixed-bin histogram (default 4096 bins over [-1, 1]; the kernels allow
            up to ``info()["limits"]["histogram_bins"]``).
        zero_rows: "error" (default) refuses zero-norm rows; "drop" drops and counts them.
        n_rows: use only the first n_rows rows (padded vocabularies): of A, and of B too when B
            is given; a pair (n_a, n_b) sets them apart (None keeps all rows).
        backend: "auto", "cuda", "triton", "cpu" or "torch" (the float64 reference).
        precision: "highest" (float32 inputs: cosines to float32's error, about 2e-7) or "tf32"
            (float32 inputs on GPU tensor cores, rows rounded to TF32 to nearest first: about 1e-4
            per cosine, unbiased; the CPU ignores it). At "highest" the triton backend splits each
            float32 unit row into two float16 parts and forms each dot product from three exact
            tensor-core products with float32 sums (REPCAP_TRITON_STATS_FP32_PASS = "ieee" runs
            float32 FMA instead). 16-bit inputs always use exact products with
            float32 sums; the CPU kernel always works in float32.
        progress: show a progress bar (default: on when pairs × d ≥ 8e10, about a second of CPU).
        group: a torch.distributed process group. When one is given, or the default group is
            initialized with more than one rank (torchrun), the jobs are split across the ranks,
            which must all pass the same A, B and settings (checked); every rank returns the
            single-process result, bitwise.

    Dot products are accumulated in float32 (float64 on the torch backend) and scaled by the
    inverse float64 row norms; per-job sums are merged in float64 in a fixed order, so a result
    is bitwise repeatable on the same backend and machine. For float32 (and float64) inputs at
    precision "highest", μ, σ, ``sum`` and ``sum_sq`` come from the float64 Gram identity of
    ``cosine_moments`` (exact to float64 rounding, O(V·d²) more work), and min, max and the
    histogram from the pairwise pass.
    """
    group = distributed.resolve_group(group)
    inputs = distributed.prepare_on_every_rank("pairwise_cosine_stats", group, _check_inputs, A, B, bins, range,
                                               zero_rows, n_rows, backend, precision)
    raw = _pairwise_cosine_stats(inputs, progress, group)
    exact_moments = _moments_from_gram_identity(inputs)
    if exact_moments:
        raw = _with_gram_moments(raw, inputs.ops)
    ops = inputs.ops
    return CosineStats(
        **raw, edges=torch.linspace(inputs.lo, inputs.hi, inputs.bins + 1, dtype=torch.float64),
        backend=inputs.backend, shape_a=tuple(ops.a.shape), shape_b=None if ops.b is None else tuple(ops.b.shape),
        dropped_rows_a=ops.dropped_a, dropped_rows_b=ops.dropped_b,
        settings={"bins": inputs.bins, "range": [inputs.lo, inputs.hi], "zero_rows": zero_rows,
                  "n_rows": list(n_rows) if isinstance(n_rows, (tuple, list)) else n_rows,
                  "precision": precision, "dtype": str(ops.a.dtype).replace("torch.", ""),
                  "compute": _compute_description(inputs, exact_moments)},
    )


def _compute_description(inputs: _Inputs, exact_moments: bool) -> str:
    """How the statistics were formed, for ``settings["compute"]``."""
    if inputs.backend == "torch":
        return "float64"
    a, b = inputs.ops.a, inputs.ops.b
    float32_operands = a.dtype in (torch.float32, torch.float64) or (b is not None and b.dtype != a.dtype)
    dots = "float32 dot products"
    if (inputs.backend == "triton" and inputs.precision == "highest" and float32_operands
            and triton_kernels().pairwise_cosine_stats_fp32_pass() == "split"):
        dots = "float32 dot products of split float16 parts (three tensor-core products per pair)"
    if inputs.backend in ("cuda", "triton") and inputs.precision == "tf32" and float32_operands:
        dots = "TF32 tensor-core dot products of the rows rounded to TF32 to nearest"
    if exact_moments:
        return f"mean and std from the float64 Gram identity; min, max and histogram from {dots}"
    return f"{dots}, float64 sums"


def _moments_from_gram_identity(inputs: _Inputs) -> bool:
    """Whether μ, σ, sum and sum_sq come from the float64 Gram identity (``cosine_moments``,
    O(V·d²)) rather than from the kernel's float32 cosines: float32 and float64 inputs at precision
    "highest" on a kernel backend (the torch backend is float64 throughout; "tf32" and 16-bit inputs
    keep the pass's own sums)."""
    exact = (torch.float32, torch.float64)
    ops = inputs.ops
    return (inputs.backend != "torch" and inputs.precision == "highest" and ops.a.dtype in exact
            and (ops.b is None or ops.b.dtype in exact))


def _with_gram_moments(raw: dict, ops: Operands) -> dict:
    """The kernel's statistics with Σc and Σc² from the float64 Gram identity, and μ, σ from them
    (kept within the pass's [min, max])."""
    exact = cosine_moments_reference(ops.a, ops.b)
    mean, std = mean_std(raw["count"], exact["sum"], exact["sum_sq"], raw["min"], raw["max"])
    return dict(raw, sum=exact["sum"], sum_sq=exact["sum_sq"], mean=mean, std=std)


@eager_only
def cosine_moments(A, B=None, *, zero_rows: str = "error", n_rows: Optional[int] = None) -> CosineMoments:
    """Exact mean and std of the pairwise cosines through the d×d Gram identity, in float64.

    O(V·d²) time, O(d²) extra memory, no pairs at all (DESIGN 1.1). Runs on A's device.
    """
    ops = check_operands(A, B, zero_rows, n_rows)
    raw = cosine_moments_reference(ops.a, ops.b)
    mean, std = mean_std(raw["count"], raw["sum"], raw["sum_sq"])
    return CosineMoments(
        count=raw["count"], mean=mean, std=std, sum=raw["sum"], sum_sq=raw["sum_sq"],
        shape_a=tuple(ops.a.shape), shape_b=None if ops.b is None else tuple(ops.b.shape),
        dropped_rows_a=ops.dropped_a, dropped_rows_b=ops.dropped_b,
    )


@eager_only
def epsilon(A, B=None, *, method: str = "gram", k_sigma: float = 2.0, **kwargs) -> float:
    """ε = μ + k_sigma·σ of the pairwise cosines; method "gram" (exact, O(V·d²)) or "stream"."""
    val.as_real(k_sigma, "k_sigma")  # before the pass
    val.check_choice(method, "method", ("gram", "stream"))
    if method == "gram":
        return cosine_moments(A, B, **kwargs).epsilon(k_sigma)
    if method == "stream":
        return pairwise_cosine_stats(A, B, **kwargs).epsilon(k_sigma)
    raise ValueError(f"method must be 'gram' or 'stream', got {method!r}")


# -------------------------------------------------------------------------------- dispatch


def kernel_operand(x: torch.Tensor, norms: torch.Tensor, name: str):
    """(operand in a kernel dtype, float32 inverse of the float64 norms). Kernels form dot
    products of the raw rows and scale them in the epilogue; rows with extreme norms (or float64
    values beyond float32) are pre-normalized in float64 first, so float32 cannot overflow."""
    smallest, largest = torch.stack(torch.aminmax(norms)).tolist()  # one pass, one synchronization
    if largest > 1e15 or smallest < 1e-15:
        x = val.unit_rows(x, torch.float32, norms, name)
        norms = val.row_norms(x, name)
    elif x.dtype == torch.float64:
        x = x.to(torch.float32)
    return x.contiguous(), (1.0 / norms).to(torch.float32)


def _job_plan(m: int, device: torch.device):
    """Row groups and the fixed job order (i, j) over the upper triangle of group blocks."""
    rows = _JOB_ROWS["cuda" if device.type == "cuda" else "cpu"]
    groups = min(_MAX_GROUPS, max(1, -(-m // rows)))
    bounds = [round(k * m / groups) for k in _range(groups + 1)]
    jobs = [(i, j) for i in _range(groups) for j in _range(i, groups)]
    return bounds, jobs


def merge_partials(moments: torch.Tensor, counts: torch.Tensor, used: Sequence[bool]) -> dict:
    """The statistics from per-unit partials, merged in unit order: moments (units, 4) float64
    = Σc, Σc², min, max; counts (units, 3 + bins) int64 = pairs, below, above, histogram. Units
    that are not `used` (no pairs) are skipped."""
    total = total_sq = 0.0
    cmin, cmax = math.inf, -math.inf
    count = below = above = 0
    for mom, cnt, keep in zip(moments.tolist(), counts[:, :3].tolist(), used):
        if not keep:
            continue
        total += mom[0]
        total_sq += mom[1]
        cmin = min(cmin, mom[2])
        cmax = max(cmax, mom[3])
        count += cnt[0]
        below += cnt[1]
        above += cnt[2]
    mean, std = mean_std(count, total, total_sq, cmin, cmax)
    return dict(count=count, mean=mean, std=std, sum=total, sum_sq=total_sq, min=float(cmin), max=float(cmax),
                below=below, above=above, hist=counts[:, 3:].sum(0))


def _pairwise_cosine_stats(inputs: _Inputs, progress: Optional[bool], group) -> dict:
    """Cuts the pairs into jobs, runs each on the backend's launcher, merges the partials in job
    order. With a process group, each rank runs the jobs `assign_units` gives it, the per-job
    partials are summed across ranks (each job's partial is nonzero on exactly one rank, so the
    sum is exact), and every rank merges them in the same job order: the single-process result,
    bitwise."""
    ops = inputs.ops
    name, run = inputs.backend, launcher("pairwise_cosine_stats", inputs.backend)
    if name == "torch":  # the reference normalizes the raw rows itself, in float64
        a, inv_a, b, inv_b = ops.a, None, ops.b, None
    else:
        a, inv_a = kernel_operand(ops.a, ops.norms_a, "A")
        b, inv_b = (None, None) if ops.b is None else kernel_operand(ops.b, ops.norms_b, "B")
        if b is not None and b.dtype != a.dtype:  # mixed dtypes meet in float32, never lower
            a, b = a.to(torch.float32), b.to(torch.float32)
    bounds, jobs = _job_plan(a.shape[0], a.device)

    def rows(x, lo, hi):
        return None if x is None else x[lo:hi]

    if b is None:
        work = []
        for i, j in jobs:
            ra, rb = (bounds[i], bounds[i + 1]), (bounds[j], bounds[j + 1])
            work.append((rows(a, *ra), rows(inv_a, *ra)) + ((None, None) if i == j else
                                                           (rows(a, *rb), rows(inv_a, *rb))))
    else:
        work = [(a[s:e], rows(inv_a, s, e), b, inv_b) for s, e in zip(bounds[:-1], bounds[1:])]
    weights = [job[0].shape[0] * (job[0].shape[0] - 1) // 2 if job[2] is None else job[0].shape[0] * job[2].shape[0]
               for job in work]
    rank, world = (0, 1) if group is None else distributed.rank_and_world(group)
    owner = [0] * len(work) if group is None else distributed.assign_units(weights, world)
    mine = sum(w for w, o in zip(weights, owner) if o == rank)
    moments = torch.zeros(len(work), 4, dtype=torch.float64)
    counts = torch.zeros(len(work), 3 + inputs.bins, dtype=torch.int64)

    def run_mine():
        with progress_bar(progress if rank == 0 else False, total=mine, desc="cosine pairs", unit="pairs",
                          unit_scale=True, work=mine * a.shape[1], auto_above=_PROGRESS_WORK) as bar:
            for u, (ja, ja_inv, jb, jb_inv) in enumerate(work):
                if weights[u] == 0 or owner[u] != rank:
                    continue
                mom, cnt, hist = run(ja, ja_inv, jb, jb_inv, inputs.bins, inputs.lo, inputs.hi, inputs.precision)
                moments[u] = mom.cpu()
                counts[u, :3] = cnt.cpu()
                counts[u, 3:] = hist.cpu()
                bar.update(int(cnt[0]))

    if group is None:
        run_mine()
    else:
        distributed.run_on_every_rank("pairwise_cosine_stats", run_mine, group)
        moments, counts = distributed.sum_across_ranks([moments, counts], group)
    return merge_partials(moments, counts, [w > 0 for w in weights])


# ------------------------------------------------------------------------------- launchers


CUDA_KERNEL_ENV = "REPCAP_CUDA_STATS_KERNEL"


@contextlib.contextmanager
def _cuda_kernel_variant(a: torch.Tensor):
    """The CUDA op reads its variant from REPCAP_CUDA_STATS_KERNEL. For CUDA tensors, when that is
    unset or "auto", it is set for the call to the packaged table's choice for a's dtype and d
    (repcap_fast._kernel_choices), then restored."""
    saved = os.environ.get(CUDA_KERNEL_ENV)
    if a.device.type != "cuda" or saved not in (None, "auto"):
        yield
        return
    os.environ[CUDA_KERNEL_ENV] = choose("pairwise_cosine_stats", "cuda", a.dtype, a.shape[1])
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(CUDA_KERNEL_ENV, None)
        else:
            os.environ[CUDA_KERNEL_ENV] = saved


@register_kernel("pairwise_cosine_stats", "cpu", "cuda")
def _pairwise_cosine_stats_compiled(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    """The C++ op; the dispatcher routes CPU tensors to csrc/cpu and CUDA tensors to csrc/cuda. On
    CUDA its kernel variant is REPCAP_CUDA_STATS_KERNEL's ("tiles", or "panels", whose float32
    GEMMs run through cuBLAS at `precision`, set here; "auto" follows the packaged table)."""
    with cublas_precision(precision, a.device), _cuda_kernel_variant(a):
        return torch.ops.repcap_fast.pairwise_cosine_stats(a, a_inv_norm, b, b_inv_norm, bins, lo, hi,
                                                           precision_code(precision))


@register_kernel("pairwise_cosine_stats", "triton")
def _pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    return torch.ops.repcap_fast.pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision)


@torch.library.custom_op("repcap_fast::pairwise_cosine_stats_triton", mutates_args=())
def _pairwise_cosine_stats_triton_op(a: torch.Tensor, a_inv_norm: torch.Tensor, b: Optional[torch.Tensor],
                                     b_inv_norm: Optional[torch.Tensor], bins: int, lo: float, hi: float,
                                     precision: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernels as a custom op: the contract of torch.ops.repcap_fast.pairwise_cosine_stats
    (csrc/module.cpp), with precision by name."""
    return triton_kernels().pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision)


_pairwise_cosine_stats_triton_op.register_fake(pairwise_cosine_stats_fake)


@register_kernel("pairwise_cosine_stats", "torch")
def _pairwise_cosine_stats_torch(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    """The float64 reference on one job's raw rows (it normalizes them itself; the inverse norms
    and the precision do not apply)."""
    raw = pairwise_cosine_stats_reference(a, b, bins=bins, lo=lo, hi=hi, dtype=torch.float64)
    moments = torch.tensor([raw["sum"], raw["sum_sq"], raw["min"], raw["max"]], dtype=torch.float64)
    counts = torch.tensor([raw["count"], raw["below"], raw["above"]], dtype=torch.int64)
    return moments, counts, raw["hist"]

