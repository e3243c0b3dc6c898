"""The measurements a report is made of.

ε of one embedding matrix (`epsilon_analysis`), the embedding against the unembedding
(`embedding_vs_unembedding`), and the spectra of each layer (`spectral_profile`).
"""

from __future__ import annotations

import time
from typing import Dict, List

import torch

from .. import _validation as val
from .. import capacity
from ..models import HiddenStates
from ..ops.pairwise_cosine_stats import cosine_moments, pairwise_cosine_stats
from ..spectral import spectral_metrics


def epsilon_analysis(matrix: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0, backend: str = "auto",
                     zero_rows: str = "error", precision: str = "highest", progress: bool = True):
    """ε of one V×d matrix, streamed over all pairs and exact, with its class and capacity table.

    With c_ij the cosine of rows i < j, ε = μ + k_sigma·σ (mean and population std of the c_ij).
    The streamed pass (`pairwise_cosine_stats`) gives the moments, extremes, quantiles and the
    histogram; the exact moments come from the Gram identity in float64 (`cosine_moments`).

    Args:
        matrix (torch.Tensor): the V×d matrix (rows are tokens).
        bins (int): histogram bins over [-1, 1]. Default 4096.
        k_sigma (float): the σ multiplier of ε. Default 2.0.
        backend (str): the streamed pass's backend. Default "auto".
        zero_rows (str): a zero row is an "error", or "drop" (counted in the result). Default "error".
        precision (str): the streamed pass's float32 product precision, "highest" or "tf32".
            Default "highest".
        progress (bool): show a progress bar on long passes. Default True.

    Returns:
        tuple[dict, CosineStats]: the section of report.json (shape, rows used, pairs, the streamed
        and exact moments, ε, class, capacity table, seconds of each pass) and the streamed
        statistics.

    Raises:
        ValueError: a zero row with zero_rows="error", a NaN or inf value, fewer than two rows, or a
            setting out of range (bins, backend, precision).
        TypeError: k_sigma is not a real number, or matrix is not a floating tensor or array.

    Examples:
        >>> E = torch.randn(200, 32, generator=torch.Generator().manual_seed(0))
        >>> out, stats = rf.report.epsilon_analysis(E, bins=256, progress=False)
        >>> out["pairs"], out["class"], round(out["epsilon"], 3), round(out["exact"]["epsilon"], 3)
        (19900, 1, 0.355, 0.355)
    """
    k_sigma = val.as_real(k_sigma, "k_sigma")  # before the pass
    t0 = time.perf_counter()
    stats = pairwise_cosine_stats(matrix, bins=bins, backend=backend, zero_rows=zero_rows, precision=precision,
                                  progress=None if progress else False)
    t_stream = time.perf_counter() - t0
    t0 = time.perf_counter()
    moments = cosine_moments(matrix, zero_rows=zero_rows)
    t_gram = time.perf_counter() - t0
    v, d = stats.shape_a
    eps = stats.epsilon(k_sigma)
    out = {
        "shape": [int(matrix.shape[0]), d], "rows_used": v, "zero_rows_dropped": stats.dropped_rows_a,
        "dtype": str(matrix.dtype).replace("torch.", ""), "pairs": stats.count,
        "backend": stats.backend, "precision": precision,
        "stream": {"mean": stats.mean, "std": stats.std, "epsilon": eps, "min": stats.min, "max": stats.max,
                   "quantiles": {str(q): stats.quantile(q) for q in (0.01, 0.5, 0.9, 0.99, 0.999)}},
        "exact": {"mean": moments.mean, "std": moments.std, "epsilon": moments.epsilon(k_sigma)},
        "epsilon": eps, "k_sigma": k_sigma,
        "class": capacity.model_class(eps), "class_description": capacity.describe_class(eps),
        "capacity": capacity.capacity_table(d, eps, vocab=v),
        "seconds": {"stream": t_stream, "gram": t_gram},
    }
    return out, stats


def embedding_vs_unembedding(E: torch.Tensor, U: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0,
                             backend: str = "auto", zero_rows: str = "error", precision: str = "highest",
                             progress: bool = True) -> Dict:
    """The input embedding against the unembedding of an untied model, token by token and over all pairs.

    For each token i, cos(E_i, U_i) of its own two rows (in float64); and over all V×V pairs,
    the statistics of cos(E_i, U_j) with ε = μ + k_sigma·σ (`pairwise_cosine_stats` of E and U).

    Args:
        E (torch.Tensor): the V×d input embedding.
        U (torch.Tensor): the V×d unembedding (Hugging Face layout), rows in the same token order.
        bins (int): histogram bins of the all-pairs pass. Default 4096.
        k_sigma (float): the σ multiplier of ε. Default 2.0.
        backend (str): the all-pairs pass's backend. Default "auto".
        zero_rows (str): a token with a zero row in E or U is an "error", or "drop" (left out and
            counted). Default "error".
        precision (str): the all-pairs pass's float32 product precision. Default "highest".
        progress (bool): show a progress bar on long passes. Default True.

    Returns:
        dict: ``tokens_left_out``; ``same_token`` (mean, std, min, max, quantiles of cos(E_i, U_i));
        ``all_pairs`` (pairs, mean, std, epsilon, min, max, backend).

    Raises:
        ValueError: a token has a zero row and zero_rows is not "drop", or a NaN/inf value, or the
            shapes do not match.
        TypeError: k_sigma is not a real number.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> E = torch.randn(100, 16, generator=g)
        >>> out = rf.report.embedding_vs_unembedding(E, E + 0.1 * torch.randn(100, 16, generator=g), bins=64,
        ...                                          progress=False)
        >>> round(out["same_token"]["mean"], 3), out["all_pairs"]["pairs"]
        (0.995, 10000)
    """
    k_sigma = val.as_real(k_sigma, "k_sigma")
    norms_e, norms_u = val.row_norms(E, "E"), val.row_norms(U, "U")
    nonzero = (norms_e > 0) & (norms_u > 0)
    if not bool(nonzero.all()) and zero_rows != "drop":
        raise ValueError(f"{int((~nonzero).sum())} tokens have a zero row in the embedding or the unembedding; "
                         f"pass zero_rows='drop' (--zero-rows drop) to leave them out")
    e = val.unit_rows(E[nonzero], torch.float64, norms_e[nonzero])
    u = val.unit_rows(U[nonzero], torch.float64, norms_u[nonzero])
    same = (e * u).sum(dim=1)
    cross = pairwise_cosine_stats(E, U, bins=bins, backend=backend, zero_rows=zero_rows, precision=precision,
                                  progress=None if progress else False)
    return {
        "tokens_left_out": int((~nonzero).sum()),
        "same_token": {"mean": float(same.mean()), "std": float(same.std(unbiased=False)),
                       "min": float(same.min()), "max": float(same.max()),
                       "quantiles": {str(q): float(torch.quantile(same, q)) for q in (0.01, 0.5, 0.99)}},
        "all_pairs": {"pairs": cross.count, "mean": cross.mean, "std": cross.std, "epsilon": cross.epsilon(k_sigma),
                      "min": cross.min, "max": cross.max, "backend": cross.backend},
    }


def spectral_profile(states: HiddenStates, basis: torch.Tensor, m: int = 10) -> List[Dict]:
    """Spectral metrics and readout alignment of the hidden states at every layer.

    Per layer (`pga.spectral_metrics`): RankMe (from the singular values of H), α-ReQ, isotropy,
    condition number, and the fraction of each of the top m principal directions that lies in the
    readout subspace, against k/d for a random direction.

    Args:
        states (HiddenStates): the N×d states of each layer (`models.hidden_states`); any mapping
            layer → tensor with a ``layers`` list works.
        basis (torch.Tensor): a d×k orthonormal basis of the readout subspace (`pga.readout_basis`).
        m (int): the number of top principal directions aligned. Default 10.

    Returns:
        list[dict]: one row per layer: layer, rankme, alpha_req, isotropy, condition_number,
        readout_alignment_top (m fractions), readout_alignment_mean, random_direction_expectation.

    Raises:
        ValueError: a layer's states or the basis have the wrong shape, or hold NaN/inf.

    Examples:
        >>> states = rf.hidden_states("minilm", texts=["The cat sat on the mat. " * 20], n_tokens=64,
        ...                           layers=[0, 6], progress=False)
        >>> basis = rf.pga.readout_basis(rf.load_embeddings("minilm").input, k=16).basis
        >>> rows = rf.report.spectral_profile(states, basis, m=3)
        >>> [r["layer"] for r in rows], len(rows[0]["readout_alignment_top"])
        ([0, 6], 3)
    """
    rows = []
    for layer in states.layers:
        metrics = spectral_metrics(states[layer], basis, m)
        align = metrics.pop("readout_alignment_top")
        rows.append({"layer": layer, **metrics, "readout_alignment_top": align.tolist(),
                     "readout_alignment_mean": float(align.mean()),
                     "random_direction_expectation": basis.shape[1] / basis.shape[0]})
    return rows
