"""Spectral metrics (repcap_fast.spectral, also under repcap_fast.pga) on spectra with known
answers, and the alignment of principal directions with a readout subspace."""

import math

import numpy as np
import pytest
import torch

from repcap_fast import pga

from _helpers import planted, rng


def test_direction_alignment_finds_the_planted_subspace():
    h, w = planted()
    basis = pga.readout_basis(w, 8).basis
    al = pga.direction_alignment(h, basis, m=10)
    assert al.shape == (10,)
    assert float(al[:8].min()) > 0.99  # the top 8 principal directions lie in the readout span
    assert float(al[8:].max()) < 0.05
    h2, _ = planted(dominant=40.0)
    assert float(pga.direction_alignment(h2, basis, m=1)[0]) < 0.01  # the dominant one is orthogonal


def test_spectral_metrics_on_known_spectra():
    r = rng(3)
    q, _ = np.linalg.qr(r.standard_normal((40, 40)))
    u, _ = np.linalg.qr(r.standard_normal((500, 40)))
    # Singular values σ_i = i^(-1) → covariance eigenvalues ∝ i^(-2): α-ReQ = 2.
    s = 1.0 / np.arange(1, 41)
    h = torch.from_numpy((u * s) @ q.T)
    assert pga.alpha_req(h, center=False) == pytest.approx(2.0, abs=1e-9)
    assert pga.condition_number(h, center=False) == pytest.approx(40.0, rel=1e-9)
    p = s / s.sum() + 1e-7
    assert pga.rankme(h) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-9)
    flat = torch.from_numpy(u @ q.T)  # all σ equal
    pf = np.full(40, 1 / 40) + 1e-7
    assert pga.rankme(flat) == pytest.approx(float(np.exp(-(pf * np.log(pf)).sum())), rel=1e-9)  # ≈ 40
    assert pga.rankme(flat) == pytest.approx(40.0, rel=2e-5)
    assert pga.condition_number(flat, center=False) == pytest.approx(1.0, rel=1e-9)
    # isotropy: a symmetric cloud (±x) is near 1; a cloud shifted along one axis is far below
    sym = torch.from_numpy(np.vstack([u, -u]) @ q.T * 3)
    assert pga.isotropy(sym) > 0.9
    # shifted by 5 along q0: Z(−q0)/Z(q0) = e^−10 (both orientations of each eigenvector count)
    assert pga.isotropy(sym + 5.0 * torch.from_numpy(q[:, 0])) == pytest.approx(math.exp(-10.0), rel=0.05)
    # independent of the eigenvector signs LAPACK picks
    assert pga.isotropy(-(sym + 5.0 * torch.from_numpy(q[:, 0]))) == pytest.approx(math.exp(-10.0), rel=0.05)
    low_rank = torch.from_numpy(u[:30] @ q.T)  # centered, 30 tokens in 40 dimensions
    assert pga.condition_number(low_rank) == math.inf


@pytest.mark.parametrize("n,d", [(500, 64), (40, 64), (300, 300)])
def test_spectral_metrics_equal_the_separate_functions(n, d):
    g = torch.Generator().manual_seed(n + d)
    H = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64) + 0.3
    B = pga.grassmann_bases(d, 8, 1, 0)[0]
    got = pga.spectral_metrics(H.float(), B, 10)
    H32 = H.float()
    assert got["rankme"] == pytest.approx(pga.rankme(H32), rel=1e-12)
    assert got["alpha_req"] == pytest.approx(pga.alpha_req(H32), rel=1e-12)
    assert got["isotropy"] == pytest.approx(pga.isotropy(H32), rel=1e-9)  # N < d: the null space's Z = N too
    cond = pga.condition_number(H32)
    if math.isinf(cond):
        assert got["condition_number"] == cond
    else:
        assert got["condition_number"] == pytest.approx(cond, rel=1e-10)
    torch.testing.assert_close(got["readout_alignment_top"], pga.direction_alignment(H32, B, 10), rtol=0, atol=1e-12)
    assert set(pga.spectral_metrics(H32)) == {"rankme", "alpha_req", "isotropy", "condition_number"}


@pytest.mark.parametrize("n,d,rank", [(600, 64, 64), (128, 64, 64), (600, 64, 20), (100, 64, 64)])
def test_right_singular_pairs_of_a_tall_matrix_from_its_r_factor(n, d, rank):
    """spectral._svd_right (the SVD of R in x = QR for N ≥ 2d, else of x) gives x's singular
    values and the span of each right singular vector, full rank or not."""
    from repcap_fast.spectral import _svd_right

    g = torch.Generator().manual_seed(n + rank)
    x = torch.randn(n, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, d, generator=g, dtype=torch.float64)
    x = x @ torch.diag(torch.logspace(0, 3, d, dtype=torch.float64))  # a spread spectrum: distinct σ
    s, vh = _svd_right(x)
    _, s_ref, vh_ref = torch.linalg.svd(x, full_matrices=False)
    assert s.shape == (d,) and vh.shape == (d, d)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(s_ref[0]))
    top = rank - 1  # the nonzero σ are distinct here: each vector up to its sign
    cos = (vh[:top] * vh_ref[:top]).sum(dim=1).abs()
    torch.testing.assert_close(cos, torch.ones_like(cos), rtol=0, atol=1e-9)
