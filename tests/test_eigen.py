"""Top eigenpairs without a full eigh (repcap_fast.eigen), the readout basis built on them and
its cache, and CCR's shared decomposition: against torch.linalg.eigh in float64."""

import math

import numpy as np
import pytest
import torch

from repcap_fast import eigen, geometry, pga

from _helpers import rng


def _gram(eigenvalues, seed=0):
    """Q diag(λ) Qᵀ with a random orthogonal Q (float64), and Q."""
    d = len(eigenvalues)
    q, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    return (q * torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T, q


def _sin_largest_angle(a, b):
    """sin of the largest principal angle between span(a) and span(b) (orthonormal columns)."""
    return float(torch.linalg.matrix_norm(b - a @ (a.T @ b), ord=2))


WELL_SEPARATED = {
    "geometric decay": ([2.0 ** (-i / 20) for i in range(400)], 10),
    "outliers over a flat bulk": ([50.0, 30.0, 20.0] + [1.0 - i / 1000 for i in range(397)], 3),
    "flat, Marchenko-Pastur-like": (torch.linspace(1.36, 0.7, 1024).tolist(), 10),  # at d = 512 it falls back
    "one direction": ([3.0] + [2.0 ** (-i / 50) for i in range(299)], 1),
    "k = 30 of 600": ([1.0 / (1 + i) ** 0.7 for i in range(600)], 30),
}


@pytest.mark.parametrize("case", sorted(WELL_SEPARATED))
@pytest.mark.parametrize("seed", [0, 1])
def test_subspace_iteration_is_within_1e_10_of_eigh_on_well_separated_spectra(case, seed):
    values, m = WELL_SEPARATED[case]
    gram, q = _gram(values, seed)
    got = eigen.top_eigenpairs(gram, m, solver="iterate")
    assert got.solver.startswith("subspace iteration"), got.solver
    assert got.angle_bound <= eigen.ANGLE_TOL
    full = eigen.top_eigenpairs(gram, m, solver="eigh")
    assert full.solver == "eigh" and math.isnan(full.angle_bound)
    assert _sin_largest_angle(full.vectors, got.vectors) <= 1e-10
    assert _sin_largest_angle(q[:, :m], got.vectors) <= 1e-10  # and of the planted eigenvectors
    torch.testing.assert_close(got.values, full.values, rtol=1e-13, atol=1e-13 * values[0])
    assert float((got.vectors.T @ got.vectors - torch.eye(m, dtype=torch.float64)).abs().max()) < 1e-13
    assert torch.equal(got.vectors, eigen.top_eigenpairs(gram, m, solver="iterate").vectors)  # deterministic


@pytest.mark.parametrize("relative_gap", [0.0, 1e-14, 1e-12])
def test_a_cluster_at_the_cut_falls_back_to_eigh(relative_gap):
    """λ_m and λ_{m+1} equal or within rounding of each other: the top-m eigenspace is not
    determined to 1e-10, so no certificate exists and the result is eigh's."""
    m = 5
    values = [10.0, 9.0, 8.0, 7.0, 6.0, 6.0 * (1 - relative_gap)] + [1.0 / (1 + i) for i in range(250)]
    gram, _ = _gram(values)
    got = eigen.top_eigenpairs(gram, m, solver="iterate")
    assert got.solver.startswith("eigh (fallback"), got.solver
    full = eigen.top_eigenpairs(gram, m, solver="eigh")
    assert torch.equal(got.vectors, full.vectors) and torch.equal(got.values, full.values)


def test_rank_below_the_block_falls_back_and_stays_orthonormal():
    values = [5.0, 4.0, 3.0] + [0.0] * 197  # rank 3, block 13
    gram, _ = _gram(values)
    got = eigen.top_eigenpairs(gram, 2, solver="iterate")
    assert got.solver.startswith(("eigh", "subspace iteration"))
    full = eigen.top_eigenpairs(gram, 2, solver="eigh")
    assert _sin_largest_angle(full.vectors, got.vectors) <= 1e-10


def test_auto_takes_eigh_when_the_block_is_large_against_d():
    gram, _ = _gram([2.0 ** (-i / 10) for i in range(120)])
    assert eigen.top_eigenpairs(gram, 10).solver == "eigh"  # block 20 > 120 / 8
    gram, _ = _gram([2.0 ** (-i / 10) for i in range(200)])
    assert eigen.top_eigenpairs(gram, 10).solver.startswith("subspace iteration")  # block 20 ≤ 200 / 8


@pytest.mark.parametrize("kwargs, message", [
    ({"solver": "lanczos"}, "solver must be one of"),
    ({"m": 0}, "m must satisfy"),
    ({"m": 40}, "m must satisfy"),
    ({"gram": torch.zeros(3, 4, dtype=torch.float64)}, "gram must be a square float64"),
    ({"gram": torch.eye(40)}, "gram must be a square float64"),
])
def test_bad_arguments_name_themselves(kwargs, message):
    args = {"gram": torch.eye(40, dtype=torch.float64), "m": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        eigen.top_eigenpairs(args.pop("gram"), args.pop("m"), **args)


def _low_rank_unembedding(V=3000, d=256, seed=3):
    r = rng(seed)
    return torch.from_numpy(r.standard_normal((V, d)) * np.geomspace(30.0, 0.05, d)).float()


def test_readout_basis_by_iteration_matches_eigh_and_svd():
    W = _low_rank_unembedding()
    it = pga.readout_basis(W, k=12, solver="iterate")
    assert it.solver.startswith("subspace iteration")
    ref = pga.readout_basis(W, k=12, solver="eigh")
    assert ref.solver == "eigh"
    assert float((it.basis - ref.basis).abs().max()) <= 1e-10  # same vectors, same signs
    _, s, _ = np.linalg.svd(W.double().numpy(), full_matrices=False)
    np.testing.assert_allclose(it.singular_values.numpy(), s[:12], rtol=1e-10)
    assert pga.readout_basis(W, k=12).solver.startswith("subspace iteration")  # auto: 22 * 8 <= 256


def test_readout_basis_is_cached_by_content(monkeypatch):
    W = _low_rank_unembedding(V=500, d=64)
    calls = []
    real = eigen.top_eigenpairs
    monkeypatch.setattr(eigen, "top_eigenpairs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    first = pga.readout_basis(W, k=4)
    again = pga.readout_basis(W.clone(), k=4)  # another tensor, the same values: a hit
    assert len(calls) == 1 and torch.equal(first.basis, again.basis)
    again.basis.zero_()  # callers get copies: the cache is not theirs to change
    assert torch.equal(pga.readout_basis(W, k=4).basis, first.basis) and len(calls) == 1
    pga.readout_basis(W, k=5)
    pga.readout_basis(W.T.contiguous(), k=4, layout="tl")
    assert len(calls) == 3  # another k, another layout: decomposed
    W[7, 3] = torch.nextafter(W[7, 3], torch.tensor(math.inf))  # one ulp, in place
    changed = pga.readout_basis(W, k=4)
    assert len(calls) == 4 and not torch.equal(changed.singular_values, first.singular_values)


@pytest.mark.parametrize("digest", [geometry.content_digest, geometry._device_fingerprint], ids=["cpu", "device"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_content_digest_sees_every_bit_and_only_the_values(digest, dtype):
    """The CPU digest (BLAKE2b) and the one computed on a GPU (run here on CPU tensors)."""
    x = torch.from_numpy(rng(5).standard_normal((700, 13))).to(dtype)
    base = digest(x)
    assert digest(x.clone()) == base and digest(x.T.contiguous().T) == base  # the values, not the layout
    if digest is geometry.content_digest:
        assert digest(x.T.contiguous()) != base  # the shape is part of it
        assert digest(x.to(torch.float64 if dtype != torch.float64 else torch.float32)) != base
    words = x.reshape(-1).view(torch.int16)
    for index in (0, 4321, words.numel() - 1):
        for bit in (0, 7, 15):
            y = x.clone()
            flat = y.reshape(-1).view(torch.int16)
            flat[index] ^= torch.tensor(1 << bit, dtype=torch.int32).to(torch.int16)
            assert digest(y) != base, (index, bit)
    swapped = x.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # the same words in another order
    assert digest(swapped) != base


def test_ccr_by_iteration_matches_eigh():
    r = rng(11)
    h = torch.from_numpy(r.standard_normal((1500, 200)) * np.geomspace(20.0, 0.5, 200))
    for m in (1, 5, 10):
        got = geometry.center_and_ccr(h, m)
        assert got.removed.shape == (m, 200)
        x = h - h.mean(0)
        ref = eigen.top_eigenpairs(x.T @ x, m, solver="eigh").vectors
        assert _sin_largest_angle(ref, got.removed.T) <= 1e-10


def test_ccr_with_fewer_tokens_than_dimensions_takes_the_token_gram(monkeypatch):
    """N < d: the directions come from the N×N Gram x xᵀ (v_i = xᵀu_i/σ_i), not an SVD of x (a
    float64 2048×4096 SVD was most of a GPU PGA profile); they match numpy's SVD to 1e-10 and
    are orthonormal. Past the numerical rank (λ_m ≤ 1e-8·λ_1) the SVD gives them."""
    svds = []
    real_svd = torch.linalg.svd
    monkeypatch.setattr(torch.linalg, "svd", lambda *a, **k: svds.append(1) or real_svd(*a, **k))
    r = rng(14)
    h = torch.from_numpy(r.standard_normal((300, 700)) * np.geomspace(30.0, 0.3, 700))
    x = (h - h.mean(0)).numpy()
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    for m in (1, 5, 10):
        got = geometry.center_and_ccr(h, m)
        assert _sin_largest_angle(torch.from_numpy(vt[:m].T), got.removed.T) <= 1e-10
        gram = got.removed @ got.removed.T
        assert float((gram - torch.eye(m, dtype=torch.float64)).abs().max()) < 1e-12
        assert float((got.H @ got.removed.T).abs().max()) < 1e-9 * float(np.abs(x).max())
    assert svds == []
    low_rank = torch.from_numpy(r.standard_normal((40, 3)) @ r.standard_normal((3, 90)))  # centered rank ≤ 3
    res = geometry.center_and_ccr(low_rank, 5)
    assert svds == [1]  # directions 4 and 5 lie past the rank: the SVD's null-space completion
    assert float(res.H.abs().max()) < 1e-10 * float(low_rank.abs().max())
    assert float((res.removed @ res.removed.T - torch.eye(5, dtype=torch.float64)).abs().max()) < 1e-12


def test_shared_ccr_decomposes_each_layer_once_and_changes_no_bit(monkeypatch):
    r = rng(12)
    layers = [torch.from_numpy(r.standard_normal((300, 160)) * np.geomspace(9.0, 0.5, 160)) for _ in range(2)]
    alone = {(i, m): geometry.center_and_ccr(h, m) for i, h in enumerate(layers) for m in (1, 5, 10)}
    calls = []
    real = geometry._top_right_singular_vectors
    monkeypatch.setattr(geometry, "_top_right_singular_vectors", lambda x, m: calls.append(m) or real(x, m))
    with geometry.shared_ccr(10):
        for i, h in enumerate(layers):
            for m in (1, 5, 10):
                got = geometry.center_and_ccr(h, m)
                assert torch.equal(got.H, alone[(i, m)].H) and torch.equal(got.removed, alone[(i, m)].removed)
        assert calls == [10, 10]  # one decomposition per layer
        layers[0].mul_(2.0)  # in place: decomposed again
        geometry.center_and_ccr(layers[0], 1)
        assert calls == [10, 10, 10]
    geometry.center_and_ccr(layers[1], 1)
    assert calls == [10, 10, 10, 10]  # outside the block nothing is reused
