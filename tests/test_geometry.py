"""Subspace geometry (repcap_fast.geometry, also under repcap_fast.pga): the readout basis
against an SVD, Grassmann draws (orthonormal, seeded, uniform, reused within a profile), CCR."""

import numpy as np
import pytest
import torch

from repcap_fast import geometry, pga

from _helpers import rng


def test_readout_basis_matches_svd_in_both_layouts():
    r = rng(1)
    W = r.standard_normal((300, 20)) * np.linspace(5, 0.1, 20)  # V×d with a decaying spectrum
    res = pga.readout_basis(torch.from_numpy(W).float(), k=6)
    _, s, vt = np.linalg.svd(W.astype(np.float32).astype(np.float64), full_matrices=False)
    np.testing.assert_allclose(res.singular_values.numpy(), s[:6], rtol=1e-9)  # the top k
    proj_ours = res.basis @ res.basis.T
    proj_svd = torch.from_numpy(vt[:6].T @ vt[:6])
    torch.testing.assert_close(proj_ours, proj_svd, atol=1e-9, rtol=0)
    tl = pga.readout_basis(torch.from_numpy(W.T.copy()).float(), k=6, layout="tl")
    torch.testing.assert_close(tl.basis, res.basis, atol=1e-12, rtol=0)  # same vectors, same signs
    pga.check_orthonormal(res.basis)


def test_grassmann_bases_are_orthonormal_seeded_and_uniform():
    b = pga.grassmann_bases(12, 3, 400, seed=5)
    assert b.shape == (400, 12, 3) and b.dtype == torch.float64
    eye = torch.eye(3, dtype=torch.float64)
    assert float((b.transpose(1, 2) @ b - eye).abs().max()) < 1e-12
    assert torch.equal(b, pga.grassmann_bases(12, 3, 400, seed=5))
    assert torch.equal(b[:37], pga.grassmann_bases(12, 3, 37, seed=5))  # basis i depends on (seed, i) only
    assert not torch.equal(b, pga.grassmann_bases(12, 3, 400, seed=6))
    # uniform: a fixed unit vector keeps on average k/d of its squared length
    e = torch.zeros(12, dtype=torch.float64)
    e[0] = 1.0
    kept = ((b.transpose(1, 2) @ e) ** 2).sum(dim=1)
    assert float(kept.mean()) == pytest.approx(3 / 12, abs=0.03)


@pytest.mark.parametrize("m", [0, 1, 3])
def test_center_and_ccr(m):
    r = rng(m)
    h = r.standard_normal((50, 8)) * np.array([10, 5, 3, 1, 1, 1, 1, 1]) + 4.0
    res = pga.center_and_ccr(torch.from_numpy(h), m)
    assert res.removed.shape == (m, 8)
    assert float(res.H.mean(dim=0).abs().max()) < 1e-12
    if m:
        assert float((res.H @ res.removed.T).abs().max()) < 1e-10
        _, _, vt = np.linalg.svd(h - h.mean(0), full_matrices=False)
        overlap = np.abs(res.removed.numpy() @ vt[:m].T)
        np.testing.assert_allclose(np.diag(overlap), 1.0, atol=1e-10)


def test_ccr_past_the_rank_matches_svd():
    r = rng(13)
    h = torch.from_numpy(r.standard_normal((6, 20)))  # N < d: centered rank 5
    res = pga.center_and_ccr(h, 5)
    assert float(res.H.abs().max()) < 1e-12  # every direction with variance removed
    removed = res.removed
    assert float((removed @ removed.T - torch.eye(5, dtype=torch.float64)).abs().max()) < 1e-12


def test_reused_draws_give_the_same_tensor_inside_the_block_only():
    with geometry.reused_draws():
        a = pga.grassmann_bases(10, 2, 5, seed=1)
        assert pga.grassmann_bases(10, 2, 5, seed=1) is a
        assert pga.grassmann_bases(10, 2, 5, seed=2) is not a
    b = pga.grassmann_bases(10, 2, 5, seed=1)
    assert b is not a and torch.equal(a, b)


def test_kept_draws_are_copies_and_equal_a_fresh_draw(monkeypatch):
    pga.clear_readout_cache()
    draws = []
    real = geometry._orthonormalize
    monkeypatch.setattr(geometry, "_orthonormalize", lambda g_: draws.append(1) or real(g_))
    a = pga.grassmann_bases(10, 3, 6, seed=4)
    a_copy = a.clone()
    a.zero_()  # the caller owns what it gets: the kept draw is unchanged
    b = pga.grassmann_bases(10, 3, 6, seed=4)
    assert len(draws) == 1 and torch.equal(b, a_copy)
    pga.clear_readout_cache()
    assert torch.equal(pga.grassmann_bases(10, 3, 6, seed=4), a_copy) and len(draws) == 2
    monkeypatch.setattr(geometry, "_DRAW_CACHE_MAX_BYTES", 8 * 10 * 3 * 6 - 1)  # too large to keep
    pga.clear_readout_cache()
    pga.grassmann_bases(10, 3, 6, seed=4)
    pga.grassmann_bases(10, 3, 6, seed=4)
    assert len(draws) == 4
