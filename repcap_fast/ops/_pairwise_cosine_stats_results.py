"""The results of pairwise_cosine_stats and cosine_moments (repcap_fast.ops.pairwise_cosine_stats).

``CosineStats`` (the streamed statistics and histogram), ``CosineMoments`` (the exact moments of
the Gram identity) and ``mean_std``, the moments from the power sums that both use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np
import torch

from .. import _validation as val


@dataclass(frozen=True, eq=False)
class CosineStats:
    r"""Statistics of the pairwise cosines c_ij = x̂_i·x̂_j, as ``pairwise_cosine_stats`` returns them.

    Over the unordered pairs i<j of A, or all pairs (i in A, j in B). ``hist`` counts pairs in
    ``bins`` equal bins over ``range`` (edges in ``edges``; the last bin includes its right edge);
    pairs outside ``range`` are counted in ``below`` and ``above``, never dropped, so
    ``hist.sum() + below + above == count``.

    Attributes:
        count (int): the number of pairs n.
        mean (float): $\mu = \sum c / n$.
        std (float): the population $\sigma = \sqrt{\sum c^2/n - \mu^2}$.
        min (float): the smallest cosine.
        max (float): the largest cosine.
        hist (torch.Tensor): int64 [bins], the pairs per bin.
        edges (torch.Tensor): float64 [bins + 1], the bin edges over ``range``.
        below (int): the pairs below ``range``.
        above (int): the pairs above ``range``.
        sum (float): $\sum c$, float64.
        sum_sq (float): $\sum c^2$, float64.
        backend (str): the backend that ran ("cpu", "cuda", "triton" or "torch").
        shape_a (tuple): A's shape after n_rows and dropped zero rows.
        shape_b (tuple or None): B's shape likewise, None without B.
        dropped_rows_a (int): zero rows dropped from A (zero_rows="drop").
        dropped_rows_b (int): zero rows dropped from B.
        settings (dict): the call's settings (bins, range, zero_rows, n_rows, precision, dtype) and
            ``compute``, how the statistics were formed.

    Examples:
        >>> stats = rf.pairwise_cosine_stats(torch.eye(3), bins=4)
        >>> stats.count, stats.mean, stats.std, stats.hist.tolist()
        (3, 0.0, 0.0, [0, 0, 3, 0])
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
        """The accepted deviation ε = μ + k_sigma·σ (the paper's k_sigma = 2).

        Args:
            k_sigma: a finite real (default 2).

        Returns:
            float: ε.

        Raises:
            ValueError: k_sigma is NaN or ±inf.
            TypeError: k_sigma is not a real number.
        """
        return self.mean + val.as_real(k_sigma, "k_sigma") * self.std

    @property
    def bin_width(self) -> float:
        """The width of one histogram bin, (hi − lo) / bins."""
        return float(self.edges[1] - self.edges[0])

    def quantile(self, q):
        """Quantile(s) of the cosines from the histogram, linear within a bin.

        Within one bin width (``bin_width``) of the exact quantile, and clipped to [min, max]
        (q = 0 and q = 1 are the exact min and max).

        Args:
            q (float or array-like): a probability in [0, 1], or an array of them.

        Returns:
            float or numpy.ndarray: the quantile, a float for a scalar q.

        Raises:
            ValueError: q outside [0, 1] or not finite, or a quantile that falls outside
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
        """The number of pairs in the bin that holds t and every bin above it, plus ``above``.

        These are the pairs with c ≥ t', t' the left edge of t's bin: exact for c ≥ t when t is a
        bin edge below ``hi``, otherwise an upper bound within one bin; ``tail_count(hi)`` is the
        last bin (which holds c == hi, e.g. duplicate rows) plus ``above``.

        Args:
            t: a threshold within ``range``.

        Returns:
            int: the count.

        Raises:
            ValueError: t outside ``range``.
        """
        edges = self.edges.numpy()
        if not edges[0] <= float(t) <= edges[-1]:
            raise ValueError(f"t must lie in the histogram range {tuple(edges[[0, -1]])}, got {t}")
        first = min(int(np.searchsorted(edges, float(t), side="right")) - 1, len(edges) - 2)
        return int(self.hist[first:].sum()) + int(self.above)

    def to_dict(self, include_hist: bool = True) -> dict:
        """The statistics as a JSON-ready dict, with ``epsilon`` (k_sigma = 2).

        Args:
            include_hist: add ``hist`` and ``edges`` as lists (default True).

        Returns:
            dict: every attribute, the shapes as lists.
        """
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
    r"""The exact mean and population std of the pairwise cosines, as ``cosine_moments`` returns them.

    Attributes:
        count (int): the number of pairs n.
        mean (float): $\mu = \sum c / n$.
        std (float): the population $\sigma = \sqrt{\sum c^2/n - \mu^2}$.
        sum (float): $\sum c$, float64.
        sum_sq (float): $\sum c^2$, float64.
        shape_a (tuple): A's shape after n_rows and dropped zero rows.
        shape_b (tuple or None): B's shape likewise, None without B.
        dropped_rows_a (int): zero rows dropped from A (zero_rows="drop").
        dropped_rows_b (int): zero rows dropped from B.

    Examples:
        >>> m = rf.cosine_moments(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]))
        >>> m.count, round(m.mean, 4), round(m.std, 4)
        (3, 0.4714, 0.3333)
    """

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
        """The accepted deviation ε = μ + k_sigma·σ (the paper's k_sigma = 2).

        Args:
            k_sigma: a finite real (default 2).

        Returns:
            float: ε.

        Raises:
            ValueError: k_sigma is NaN or ±inf.
            TypeError: k_sigma is not a real number.
        """
        return self.mean + val.as_real(k_sigma, "k_sigma") * self.std

    def to_dict(self) -> dict:
        """The moments as a JSON-ready dict, with ``epsilon`` (k_sigma = 2)."""
        d = dict(self.__dict__)
        d["epsilon"] = self.epsilon()
        d["shape_a"] = list(self.shape_a)
        d["shape_b"] = list(self.shape_b) if self.shape_b else None
        return d


def mean_std(count: int, total: float, total_sq: float, lowest: Optional[float] = None,
             highest: Optional[float] = None) -> Tuple[float, float]:
    """(μ, population σ) from the count, Σc and Σc² (float64 power sums).

    σ² = Σc²/n − μ² cancels when σ ≪ rms(c): σ below about 1e-7·rms(c) is good to about
    6e-8·rms(c) absolute. With the smallest and largest value known, μ is kept within [lowest,
    highest] (rounding could put it an ulp outside), σ within (highest − lowest)/2, and equal
    values give σ = 0 exactly.
    """
    mean = total / count
    std = math.sqrt(max(total_sq / count - mean * mean, 0.0))
    if lowest is not None and highest is not None and lowest <= highest:
        mean = min(max(mean, lowest), highest)
        std = min(std, (highest - lowest) / 2)
    return mean, std
