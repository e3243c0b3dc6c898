"""The rank reference of Subspace PGA (repcap_fast.reference: spearman, average ranks, condensed
cosine distances) against SciPy's spearmanr, rankdata and pdist."""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import ConstantInputWarning, rankdata, spearmanr

from repcap_fast import pga

from _helpers import rng


@pytest.mark.parametrize("n", [2, 3, 97, 1000])
def test_spearman_without_ties(n):
    r = rng(n)
    x, y = r.standard_normal(n), r.standard_normal(n)
    y = y + 0.5 * x
    assert pga.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-14)


@pytest.mark.parametrize("levels", [2, 5, 50])
def test_spearman_with_ties(levels):
    r = rng(levels)
    x = r.integers(0, levels, 500).astype(float)
    y = x + r.integers(0, levels, 500)
    assert pga.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-14)
    np.testing.assert_allclose(pga.average_ranks(torch.from_numpy(x)).numpy(), rankdata(x), rtol=0, atol=0)


def test_spearman_constant_input_is_nan_with_scipys_warning():
    x, y = np.ones(10), np.arange(10.0)
    with pytest.warns(ConstantInputWarning):
        ours = pga.spearman(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = spearmanr(x, y).statistic
    assert math.isnan(ours) and math.isnan(theirs)
    with pytest.warns(ConstantInputWarning):
        assert math.isnan(pga.spearman(y, x))


def test_spearman_bad_input():
    with pytest.raises(ValueError, match="same length"):
        pga.spearman([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="NaN"):
        pga.spearman([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        pga.spearman([1.0], [2.0])


@pytest.mark.parametrize("n,d", [(3, 1), (40, 7), (201, 64)])
def test_pairwise_cosine_distances_match_pdist(n, d):
    h = rng(n).standard_normal((n, d))
    ours = pga.pairwise_cosine_distances(torch.from_numpy(h)).numpy()
    np.testing.assert_allclose(ours, pdist(h, "cosine"), rtol=0, atol=1e-14)
    ours32 = pga.pairwise_cosine_distances(torch.from_numpy(h).float()).numpy()
    np.testing.assert_allclose(ours32, pdist(h.astype(np.float32).astype(np.float64), "cosine"), atol=1e-14)
