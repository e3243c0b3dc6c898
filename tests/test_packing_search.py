"""method="equiangular-search": the frames it finds, what it refuses, and what it returns when it finds none."""

import math

import pytest
import torch

from repcap_fast import capacity, packing
from repcap_fast.cli import main as cli
from repcap_fast.packing import ansatz
from repcap_fast.packing import search as packing_search

# real equiangular tight frames of the list, the fast ones on every seed here (the larger ones,
# (26, 13) to (36, 15), on one seed below and in bench/packing_known_optima.py)
SMALL_ETFS = [(4, 3), (6, 3), (10, 5), (14, 7), (16, 6), (18, 9), (5, 4), (9, 8)]


def _search(k, d, seed=0, steps=20000, **kwargs):
    return packing.optimize(k, d, steps=steps, seed=seed, method="equiangular-search", dtype=torch.float64,
                            progress=False, **kwargs)


@pytest.mark.parametrize("k,d", SMALL_ETFS)
def test_small_frames_are_found_on_every_seed(k, d):
    welch = capacity.welch_bound(k, d)
    for seed in (0, 1, 2):
        res = _search(k, d, seed)
        assert abs(res.eps_star - welch) < 1e-12, (seed, res.eps_star, welch)
        assert res.loss_history[-1] == 0 and min(res.loss_history[:-1], default=1) > 0  # stops at the first F = 0
        assert res.bound_name == "welch"


@pytest.mark.parametrize("k,d", [(26, 13), (28, 7), (30, 15)])
def test_the_larger_frames_gradient_methods_miss_are_found(k, d):
    res = _search(k, d, seed=0)
    assert abs(res.eps_minus_bound) < 1e-12, res.eps_minus_bound


def test_the_vectors_are_an_equiangular_tight_frame():
    k, d = 16, 6
    x = packing_search.equiangular_search(torch.randn(k, d, dtype=torch.float64), 5000, 0, lambda s, f: None)
    assert x.shape == (k, d) and x.dtype == torch.float64
    torch.testing.assert_close(torch.linalg.vector_norm(x, dim=1), torch.ones(k, dtype=torch.float64))
    g = (x @ x.T).abs()
    off = g[~torch.eye(k, dtype=torch.bool)]
    torch.testing.assert_close(off, torch.full_like(off, 1 / 3), atol=1e-13, rtol=0)  # equiangular at Welch
    torch.testing.assert_close(x.T @ x, (k / d) * torch.eye(d, dtype=torch.float64), atol=1e-12, rtol=0)  # tight


def test_the_result_is_deterministic_and_records_the_method():
    a, b = _search(18, 9, seed=4), _search(18, 9, seed=4)
    assert a.loss_history == b.loss_history and a.eps_star == b.eps_star
    assert (a.method, a.p, a.p_start, a.lr, a.polish_steps) == ("equiangular-search", 1, 1, 0.0, 0)
    best = _search(14, 7, seed=0, restarts=3)
    assert len(best.restart_eps_stars) == 3 and max(best.restart_eps_stars) - best.welch < 1e-12


def test_when_the_steps_run_out_the_nearest_tight_frame_to_the_best_signs_is_returned():
    # (36, 15) takes thousands of moves: 30 are not enough, and the result says how far it is
    res = _search(36, 15, steps=30)
    assert len(res.loss_history) == 30 and min(res.loss_history) > 0
    assert math.isfinite(res.eps_star) and 1e-3 < res.eps_minus_bound and res.eps_star < 1


@pytest.mark.parametrize("k,d,why", [
    (9, 5, "not both odd integers"),        # k ≠ 2d, 1/μ = √10: no frame
    (8, 4, "not 2 mod 4"),                  # no conference matrix of order 8
    (22, 11, "not a sum of two squares"),   # nor of order 22
    (7, 2, "Gerzon's bound on equiangular lines in R\\^2"),
    (7, 5, "Gerzon's bound for the Naimark complement in R\\^2"),
    (4, 4, "k=4 ≤ d=4"),
])
def test_where_no_frame_can_exist_it_refuses_and_says_why(k, d, why):
    with pytest.raises(ValueError, match=f"none exists for k={k}, d={d}: .*{why}"):
        _search(k, d)


def test_the_necessary_conditions_admit_the_known_frames():
    for k, d in SMALL_ETFS + [(26, 13), (28, 7), (30, 15), (36, 15), (36, 21), (276, 23), (65, 64)]:
        assert packing_search.etf_obstruction(k, d) == "", (k, d)


def test_settings_that_do_not_apply_and_sizes_beyond_its_limit_are_refused(capsys):
    method = "equiangular-search"
    with pytest.raises(ValueError, match="p does not apply to method='equiangular-search'"):
        packing.optimize(6, 3, steps=5, method=method, p=8)
    with pytest.raises(ValueError, match="lr does not apply"):
        packing.optimize(6, 3, steps=5, method=method, lr=0.01)
    with pytest.raises(ValueError, match="precision='tf32' does not apply to method='equiangular-search'"):
        packing.optimize(6, 3, steps=5, method=method, precision="tf32")
    with pytest.raises(ValueError, match="k must be at most 300, got k=306"):  # (306, 153) passes the conditions
        packing.optimize(306, 153, steps=5, method=method)
    assert cli(["pack", "--k", "306", "--d", "153", "--method", method, "--no-progress"]) == 2
    assert "k must be at most 300" in capsys.readouterr().err
    assert cli(["pack", "--k", "10", "--d", "5", "--steps", "100", "--method", method, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "method=equiangular-search steps=100 no p" in out and "eps* - bound 0.000000" in out


def test_a_polish_after_a_failed_search_never_raises_eps():
    alone = _search(36, 15, steps=30)
    polished = _search(36, 15, steps=30, projection_steps=100)
    assert polished.eps_star <= alone.eps_star + 1e-12


def test_a_sweep_refuses_a_cell_without_a_frame_before_any_cell_runs(tmp_path):
    out = tmp_path / "s.json"
    with pytest.raises(ValueError, match="none exists for k=11, d=5"):
        packing.sweep([10, 11], [5], out, steps=200, method="equiangular-search", progress=False)
    assert not out.exists()  # (10, 5) did not run first
    cells = packing.sweep([10], [5], out, steps=200, method="equiangular-search", dtype=torch.float64,
                          progress=False)
    assert cells[0]["method"] == "equiangular-search" and abs(cells[0]["eps_minus_bound"]) < 1e-12


def test_both_evaluations_walk_the_same_search(monkeypatch):
    def walk(k, d, seed, steps):
        seen = []
        packing_search.equiangular_search(torch.randn(k, d, dtype=torch.float64, generator=torch.Generator()
                                                      .manual_seed(seed)), steps, seed, lambda s, f: seen.append(f))
        return seen

    default = walk(16, 6, 0, 400), walk(26, 13, 1, 150)
    monkeypatch.setattr(ansatz, "DENSE_WORK", 0)  # every ansatz by the change of F
    assert (walk(16, 6, 0, 400), walk(26, 13, 1, 150)) == default
    monkeypatch.setattr(ansatz, "DENSE_WORK", 1 << 62)  # every ansatz by its flipped S²
    assert (walk(16, 6, 0, 400), walk(26, 13, 1, 150)) == default


def test_a_wrong_change_of_f_is_caught(monkeypatch):
    monkeypatch.setattr(ansatz, "DENSE_WORK", 0)
    real = ansatz._Orbits.deltas
    monkeypatch.setattr(ansatz._Orbits, "deltas", lambda self, *a: real(self, *a) + 4.0)
    with pytest.raises(RuntimeError, match="the F predicted for a flip"):
        packing_search.equiangular_search(torch.randn(16, 6, dtype=torch.float64), 50, 0, lambda s, f: None)


def test_sizes_above_the_old_limit_of_64_run():
    # k = 66 (the simplex in R^65 passes the conditions) was refused before the change of F
    res = packing.optimize(66, 65, steps=30, method="equiangular-search", dtype=torch.float64, progress=False)
    f = res.loss_history
    assert len(f) == 30 and f[-1] < f[0]  # the tabu search descends on F from its random signs
    assert res.eps_star <= res.eps_star_init


@pytest.mark.parametrize("k,d", [(38, 19), (42, 21), (50, 25), (54, 27), (62, 31), (28, 7), (28, 21), (126, 21),
                                 (126, 105)])
def test_the_paley_and_unital_frames_are_found_by_enumeration(k, d):
    res = _search(k, d, seed=3, steps=2000)
    assert abs(res.eps_minus_bound) < 1e-12 and len(res.loss_history) <= 1 << packing_search.EXHAUSTIVE_BITS


def test_the_schedule():
    slices = list(packing_search.schedule(50, 5000))
    assert [s.index for s in slices] == list(range(len(slices))) and sum(s.moves for s in slices) == 5000
    sizes = [s.ansatz.size() for s in slices if s.kind == "exhaustive"]
    assert sizes and sizes == sorted(sizes) and max(sizes) <= packing_search.EXHAUSTIVE_BITS
    assert all(s.moves == 1 << s.ansatz.size() for s in slices[:len(sizes)])  # every sign pattern once
    tabu = [s for s in slices if s.kind == "tabu"]
    assert tabu and all(s.ansatz.size() > packing_search.EXHAUSTIVE_BITS for s in tabu)
    # a shorter search is a prefix of a longer one (its last slice cut short): more steps never give a larger ε*
    short = list(packing_search.schedule(50, 4000))
    assert short[:-1] == slices[:len(short) - 1] and short[-1].ansatz == slices[len(short) - 1].ansatz
    assert short[-1].moves <= slices[len(short) - 1].moves
    # the ansätze that fix at most one line first, each round; the others from round LATER_BY, with shorter slices
    tabu = [s for s in packing_search.schedule(36, 100_000) if s.kind == "tabu"]
    first = sum(1 for a in ansatz.portfolio(36) if a.size() > packing_search.EXHAUSTIVE_BITS and a.fixed <= 1)
    base, later = packing_search.BASE_SLICE, packing_search.LATER_BY
    assert first and all(s.ansatz.fixed <= 1 for s in tabu[:(later + 1) * first])
    assert [s.moves for s in tabu[:(later + 1) * first:first]] == [base << r for r in range(later + 1)]
    assert tabu[(later + 1) * first].ansatz.fixed > 1 and tabu[(later + 1) * first].moves == base


def test_the_workers_do_not_change_the_search(monkeypatch):
    def walk():
        seen = []
        x = packing_search.equiangular_search(torch.randn(36, 15, dtype=torch.float64, generator=torch.Generator()
                                                          .manual_seed(0)), 3000, 5, lambda s, f: seen.append((s, f)))
        return seen, x

    monkeypatch.setenv(packing_search.WORKERS_ENV, "1")
    alone, x1 = walk()
    monkeypatch.setattr(packing_search, "PARALLEL_AFTER_S", 0.0)  # every slice after the first in the workers
    monkeypatch.setenv(packing_search.WORKERS_ENV, "2")
    together, x2 = walk()
    assert [s for s, _ in alone] == list(range(len(alone))) and together == alone and torch.equal(x1, x2)


def test_a_bad_number_of_workers_is_refused(monkeypatch):
    monkeypatch.setenv(packing_search.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="REPCAP_SEARCH_WORKERS must be an integer"):
        packing_search.workers()
    monkeypatch.setenv(packing_search.WORKERS_ENV, "0")
    with pytest.raises(ValueError, match="REPCAP_SEARCH_WORKERS must be at least 1, got 0"):
        packing_search.workers()
    with pytest.raises(ValueError, match="REPCAP_SEARCH_WORKERS must be at least 1"):  # before any step
        packing_search.equiangular_search(torch.randn(16, 6, dtype=torch.float64), 10, 0, lambda s, f: 1 / 0)
    monkeypatch.setenv(packing_search.WORKERS_ENV, "3")
    assert packing_search.workers() == 3


def test_by_default_the_search_takes_enough_steps_to_reach_the_frame():
    res = packing.optimize(36, 15, method="equiangular-search", dtype=torch.float64, progress=False)
    assert res.steps == packing_search.default_steps(36) == 100_000 and abs(res.eps_minus_bound) < 1e-12
    assert len(res.loss_history) < res.steps  # it stopped at the frame
    assert [packing_search.default_steps(k) for k in (64, 65, 126, 300)] == [100_000, 95_456, 13_105, 971]
    assert packing.methods.default_steps("minimax", 36) == packing.methods.DEFAULT_STEPS == 5000
