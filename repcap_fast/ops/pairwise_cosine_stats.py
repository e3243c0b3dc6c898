"""pairwise_cosine_stats: statistics of all pairwise cosine similarities, never materializing V×V.

Also ``cosine_moments`` (the exact mean and std through d×d Grams) and ``epsilon``. The result
classes are in ``_pairwise_cosine_stats_results``, the argument checks in
``_pairwise_cosine_stats_checks``.

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
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch

from .. import _validation as val
from .. import distributed
from .._backends import (
    cublas_precision,
    custom_op,
    eager_only,
    launcher,
    precision_code,
    register_kernel,
    triton_kernels,
)
from .._kernel_choices import choose
from .._ops import pairwise_cosine_stats_fake
from .._progress import progress_bar
from ..reference import cosine_moments_reference, pairwise_cosine_stats_reference
from ._pairwise_cosine_stats_checks import Operands, check_operands, check_settings
from ._pairwise_cosine_stats_results import CosineMoments, CosineStats, mean_std

__all__ = ["CosineMoments", "CosineStats", "cosine_moments", "epsilon", "pairwise_cosine_stats"]

# Above this much work (pairs × d multiply-adds, about a second on a 2-core CPU) a progress bar
# is shown when progress=None.
_PROGRESS_WORK = 80_000_000_000
# The upper triangle is cut into row groups; each job (a diagonal block or a rectangle of
# two groups) is one launcher call, merged in job order: progress between calls, and a fixed
# decomposition (so results do not depend on anything but V and the device type). GPU jobs are
# larger: each call costs a launch and a host synchronization.
_JOB_ROWS = {"cpu": 8192, "cuda": 65536}
_MAX_GROUPS = 16


# ------------------------------------------------------------------------------ validation


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
        """What every rank must agree on: the matrices' digests and shapes, and the settings."""
        b = self.ops.b
        return {"A": distributed.tensor_digest(self.ops.a), "B": distributed.tensor_digest(b),
                "shape_a": tuple(self.ops.a.shape), "shape_b": None if b is None else tuple(b.shape),
                "bins": self.bins, "range": (self.lo, self.hi), "backend": self.backend,
                "precision": self.precision, "zero_rows": self.zero_rows}


def _check_inputs(A, B, bins, value_range, zero_rows, n_rows, backend, precision) -> _Inputs:
    """Every argument of pairwise_cosine_stats, checked."""
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
    r"""Statistics of all pairwise cosine similarities of the rows of A, never forming V×V.

    For $\hat x_i = x_i/\lVert x_i \rVert$ and $c_{ij} = \hat x_i \cdot \hat x_j$ over the
    $n = V(V-1)/2$ pairs $i < j$ of A (or the V·m pairs (i in A, j in B)): the count n,
    $\mu = \sum c/n$, the population $\sigma = \sqrt{\sum c^2/n - \mu^2}$, min, max and a
    fixed-bin histogram, streamed tile by tile in O(V·d) memory. $\varepsilon = \mu + 2\sigma$ is
    ``result.epsilon()``.

    For float32 and float64 inputs at precision "highest", μ, σ, ``sum`` and ``sum_sq`` come from
    the float64 Gram identity of ``cosine_moments`` (exact to float64 rounding, O(V·d²) more
    work), and min, max and the histogram from float32 dot products. Results are bitwise
    repeatable on the same backend and machine.

    Args:
        A (torch.Tensor or numpy.ndarray): (V, d) float16/bfloat16/float32/float64 tensor or numpy
            array, one vector per row.
        B (torch.Tensor or numpy.ndarray, optional): an (m, d) matrix on A's device; then all
            V·m pairs (i in A, j in B) are used.
        bins: the histogram's number of equal bins (default 4096; the kernel backends allow up to
            ``info()["limits"]["histogram_bins"]``).
        range: the histogram's (lo, hi) (default (-1, 1)); pairs outside it are counted in
            ``below`` and ``above``.
        zero_rows: "error" (default) refuses zero-norm rows; "drop" drops and counts them.
        n_rows: use only the first n_rows rows (padded vocabularies): of A, and of B too when B
            is given; a pair (n_a, n_b) sets them apart (default None: all rows).
        backend: "auto" (default), "cuda", "triton", "cpu" or "torch" (the float64 reference).
        precision: "highest" (default: float32 inputs give cosines to float32 rounding) or "tf32"
            (float32 inputs on GPU tensor cores, rows rounded to TF32 first: about 1e-4 per
            cosine, unbiased; the CPU ignores it). 16-bit inputs are computed with float32 sums.
        progress: show a progress bar (default None: on for large inputs, about a second of
            CPU work or more).
        group (torch.distributed.ProcessGroup, optional): a process group. When
            one is given, or the default group is initialized with more than one rank (torchrun),
            the work is split across the ranks, which must all pass the same A, B and settings
            (checked); every rank returns the single-process result, bitwise.

    Returns:
        CosineStats: count, mean, std, min, max, the histogram (hist, edges, below, above), the
        power sums, the shapes, dropped rows and settings.

    Raises:
        ValueError: A or B not 2-D or empty; A alone with fewer than 2 rows; B with another d or
            on another device; NaN/Inf values; zero-norm rows with zero_rows="error" (or no rows
            left after dropping them); an invalid bins, range, n_rows, zero_rows, backend or
            precision; with a group, an input that is invalid or differs on some rank (the same
            error on every rank).
        TypeError: A or B not a float tensor or array, or bins or n_rows not an integer
            (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).
        repcap_fast._backends.BackendUnavailableError: the backend asked for is not built here.
        repcap_fast.distributed.RankFailure: with a group, the computation failed on some rank.

    Examples:
        >>> X = torch.randn(200, 32, generator=torch.Generator().manual_seed(0))
        >>> stats = rf.pairwise_cosine_stats(X)
        >>> stats.count, round(stats.mean, 4), round(stats.std, 4), round(stats.epsilon(), 4)
        (19900, 0.0028, 0.1761, 0.3551)
        >>> round(stats.max, 3), stats.quantile(0.99) > stats.quantile(0.5)
        (0.65, True)
        >>> rf.pairwise_cosine_stats(X[:10], X[10:25]).count
        150
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
    """Whether μ, σ, sum and sum_sq come from the float64 Gram identity (``cosine_moments``).

    That is O(V·d²) rather than the kernel's float32 cosines: float32 and float64 inputs at
    precision "highest" on a kernel backend (the torch backend is float64 throughout; "tf32" and
    16-bit inputs keep the pass's own sums).
    """
    exact = (torch.float32, torch.float64)
    ops = inputs.ops
    return (inputs.backend != "torch" and inputs.precision == "highest" and ops.a.dtype in exact
            and (ops.b is None or ops.b.dtype in exact))


def _with_gram_moments(raw: dict, ops: Operands) -> dict:
    """The kernel's statistics with Σc and Σc² from the float64 Gram identity, and μ, σ from them.

    μ and σ are kept within the pass's [min, max].
    """
    exact = cosine_moments_reference(ops.a, ops.b)
    mean, std = mean_std(raw["count"], exact["sum"], exact["sum_sq"], raw["min"], raw["max"])
    return dict(raw, sum=exact["sum"], sum_sq=exact["sum_sq"], mean=mean, std=std)


@eager_only
def cosine_moments(A, B=None, *, zero_rows: str = "error", n_rows: Optional[int] = None) -> CosineMoments:
    r"""The exact mean and std of the pairwise cosines through the d×d Gram identity, in float64.

    With unit rows $\hat x_i$ and $S = \sum_i \hat x_i$: $\sum_{i<j} c_{ij} = (\lVert S \rVert^2 - V)/2$
    and $\sum_{i<j} c_{ij}^2 = (\lVert \hat X^\top \hat X \rVert_F^2 - V)/2$ (for A×B: $S_A \cdot S_B$ and
    $\langle \hat X_A^\top \hat X_A, \hat X_B^\top \hat X_B \rangle_F$), so μ and the population σ
    need no pairs at all: O(V·d²) time, O(d²) extra memory, on A's device.

    Args:
        A (torch.Tensor or numpy.ndarray): (V, d) float16/bfloat16/float32/float64 tensor or numpy
            array, one vector per row.
        B (torch.Tensor or numpy.ndarray, optional): an (m, d) matrix on A's device; then the
            V·m pairs (i in A, j in B).
        zero_rows: "error" (default) refuses zero-norm rows; "drop" drops and counts them.
        n_rows: use only the first n_rows rows, as in ``pairwise_cosine_stats`` (default None).

    Returns:
        CosineMoments: count, mean, std, sum, sum_sq, the shapes and the dropped rows.

    Raises:
        ValueError: A or B not 2-D or empty; A alone with fewer than 2 rows; B with another d or
            on another device; NaN/Inf values; zero-norm rows with zero_rows="error" (or no rows
            left after dropping them); an invalid n_rows or zero_rows.
        TypeError: A or B not a float tensor or array, or n_rows not an integer
            (``repcap_fast._validation.ArgumentTypeError``, also a ValueError).

    Examples:
        >>> X = torch.randn(200, 32, generator=torch.Generator().manual_seed(0))
        >>> m = rf.cosine_moments(X)
        >>> m.count, round(m.mean, 4), round(m.std, 4), round(m.epsilon(), 4)
        (19900, 0.0028, 0.1761, 0.3551)
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
    """The accepted deviation ε = μ + k_sigma·σ of the pairwise cosines of A's rows (or of A×B).

    μ and the population σ of the cosines c_ij = x̂_i·x̂_j, as ``cosine_moments`` (method
    "gram") or ``pairwise_cosine_stats`` (method "stream") compute them.

    Args:
        A (torch.Tensor or numpy.ndarray): (V, d) float tensor or numpy array, one vector per row.
        B (torch.Tensor or numpy.ndarray, optional): an (m, d) matrix; then the V·m pairs (i in A, j in B).
        method: "gram" (default: exact, float64, O(V·d²)) or "stream" (``pairwise_cosine_stats``).
        k_sigma: the multiple of σ, a finite real (default 2, the paper's).
        **kwargs (Any): passed on to ``cosine_moments`` (zero_rows, n_rows) or, for "stream", to
            ``pairwise_cosine_stats`` (bins, range, zero_rows, n_rows, backend, precision, ...).

    Returns:
        float: ε.

    Raises:
        ValueError: an unknown method, k_sigma NaN or ±inf, or what ``cosine_moments`` or
            ``pairwise_cosine_stats`` raises for the matrices and settings.
        TypeError: k_sigma not a real number, a keyword that the method does not take, or a
            matrix of the wrong type.

    Examples:
        >>> round(rf.epsilon(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])), 4)
        1.1381
    """
    val.as_real(k_sigma, "k_sigma")  # before the pass
    val.check_choice(method, "method", ("gram", "stream"))
    if method == "gram":
        return cosine_moments(A, B, **kwargs).epsilon(k_sigma)
    if method == "stream":
        return pairwise_cosine_stats(A, B, **kwargs).epsilon(k_sigma)
    raise ValueError(f"method must be 'gram' or 'stream', got {method!r}")


# -------------------------------------------------------------------------------- dispatch


def kernel_operand(x: torch.Tensor, norms: torch.Tensor, name: str):
    """(operand in a kernel dtype, float32 inverse of the float64 norms).

    Kernels form dot products of the raw rows and scale them in the epilogue; rows with extreme
    norms (or float64 values beyond float32) are pre-normalized in float64 first, so float32
    cannot overflow.
    """
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
    """The statistics from per-unit partials, merged in unit order.

    moments (units, 4) float64 = Σc, Σc², min, max; counts (units, 3 + bins) int64 = pairs,
    below, above, histogram. Units that are not `used` (no pairs) are skipped.
    """
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
    """Cuts the pairs into jobs, runs each on the backend's launcher, merges the partials in job order.

    With a process group, each rank runs the jobs `assign_units` gives it, the per-job partials
    are summed across ranks (each job's partial is nonzero on exactly one rank, so the sum is
    exact), and every rank merges them in the same job order: the single-process result, bitwise.
    """
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
        """Rows lo:hi of x, or None."""
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
        """Runs this rank's jobs into moments and counts."""
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
    """Sets REPCAP_CUDA_STATS_KERNEL, the CUDA op's variant, for the call, then restores it.

    For CUDA tensors, when it is unset or "auto", it is set to the packaged table's choice for a's
    dtype and d (repcap_fast._kernel_choices).
    """
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
    """The C++ op; the dispatcher routes CPU tensors to csrc/cpu and CUDA tensors to csrc/cuda.

    On CUDA its kernel variant is REPCAP_CUDA_STATS_KERNEL's ("tiles", or "panels", whose float32
    GEMMs run through cuBLAS at `precision`, set here; "auto" follows the packaged table).
    """
    with cublas_precision(precision, a.device), _cuda_kernel_variant(a):
        return torch.ops.repcap_fast.pairwise_cosine_stats(a, a_inv_norm, b, b_inv_norm, bins, lo, hi,
                                                           precision_code(precision))


@register_kernel("pairwise_cosine_stats", "triton")
def _pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    """The Triton kernels, through their custom op."""
    return torch.ops.repcap_fast.pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision)


@custom_op("repcap_fast::pairwise_cosine_stats_triton", mutates_args=())
def _pairwise_cosine_stats_triton_op(a: torch.Tensor, a_inv_norm: torch.Tensor, b: Optional[torch.Tensor],
                                     b_inv_norm: Optional[torch.Tensor], bins: int, lo: float, hi: float,
                                     precision: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernels as a custom op.

    The contract of torch.ops.repcap_fast.pairwise_cosine_stats (csrc/module.cpp), with precision
    by name.
    """
    return triton_kernels().pairwise_cosine_stats_triton(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision)


_pairwise_cosine_stats_triton_op.register_fake(pairwise_cosine_stats_fake)


@register_kernel("pairwise_cosine_stats", "torch")
def _pairwise_cosine_stats_torch(a, a_inv_norm, b, b_inv_norm, bins, lo, hi, precision):
    """The float64 reference on one job's raw rows.

    It normalizes them itself; the inverse norms and the precision do not apply.
    """
    raw = pairwise_cosine_stats_reference(a, b, bins=bins, lo=lo, hi=hi, dtype=torch.float64)
    moments = torch.tensor([raw["sum"], raw["sum_sq"], raw["min"], raw["max"]], dtype=torch.float64)
    counts = torch.tensor([raw["count"], raw["below"], raw["above"]], dtype=torch.int64)
    return moments, counts, raw["hist"]

