"""method="alternating-projection": the equiangular tight frames it reaches, its settings and its limits."""

import math

import pytest
import torch

from repcap_fast import capacity, packing
from repcap_fast.cli import main as cli
from repcap_fast.packing import projection as packing_projection

# (k, d) of real equiangular tight frames the method reaches from a single start: the cube's and
# the icosahedron's diagonals, 10 in R^5, 14 in R^7, 16 in R^6, 28 in R^7, and two simplices.
REACHED = [(4, 3), (6, 3), (10, 5), (14, 7), (16, 6), (28, 7), (5, 4), (9, 8)]


@pytest.mark.parametrize("k,d", REACHED)
def test_equiangular_tight_frames_are_reached_on_at_least_two_of_three_seeds(k, d):
    welch = capacity.welch_bound(k, d)
    gaps = [packing.optimize(k, d, steps=600, seed=seed, method="alternating-projection", dtype=torch.float64,
                             progress=False).eps_star - welch for seed in (0, 1, 2)]
    assert min(gaps) >= -1e-12  # no packing beats the bound
    assert sum(gap < 1e-4 for gap in gaps) >= 2, gaps


def test_the_result_records_the_method_and_the_best_packing_seen():
    res = packing.optimize(16, 6, steps=400, method="alternating-projection", dtype=torch.float64, progress=False)
    assert (res.method, res.p, res.p_start, res.lr, res.polish_steps) == ("alternating-projection", 1, 1, 0.0, 0)
    assert len(res.loss_history) == 400 and res.loss_init == res.loss_history[0]
    assert res.eps_star == pytest.approx(min(res.loss_history), abs=1e-12)  # the best step's packing is kept
    assert res.eps_star < res.eps_star_init and res.bound_name == "welch" and res.eps_minus_bound < 1e-4
    # with restarts: the best start
    best = packing.optimize(18, 9, steps=300, seed=0, restarts=4, method="alternating-projection",
                            dtype=torch.float64, progress=False)
    assert best.eps_star == min(best.restart_eps_stars) and len(best.restart_eps_stars) == 4


def test_where_no_frame_meets_the_bound_the_best_packing_is_kept():
    # 5 lines in R^3: the Welch bound 0.408 is not reachable (the optimum is 1/√5); the method
    # still returns a valid packing, no better than the optimum
    res = packing.optimize(5, 3, steps=300, method="alternating-projection", dtype=torch.float64, progress=False)
    assert 1 / math.sqrt(5) - 1e-9 <= res.eps_star < res.eps_star_init


def test_it_can_be_polished_and_swept(tmp_path):
    res = packing.optimize(5, 3, steps=200, method="alternating-projection", polish_steps=20, progress=False)
    assert res.polish_steps == 20 and res.eps_star <= res.loss_history[-1] + 1e-6
    out = tmp_path / "s.json"
    cells = packing.sweep([6, 10], [3, 5], out, steps=200, method="alternating-projection", progress=False)
    assert {c["method"] for c in cells} == {"alternating-projection"} and packing.load_cells(out) == cells
    assert packing.sweep([6, 10], [3, 5], out, steps=200, method="alternating-projection", progress=False) == cells


def test_settings_that_do_not_apply_and_sizes_beyond_its_limit_are_refused(monkeypatch, capsys):
    method = "alternating-projection"
    with pytest.raises(ValueError, match="p does not apply to method='alternating-projection'"):
        packing.optimize(6, 3, steps=5, method=method, p=8)
    with pytest.raises(ValueError, match="p_start does not apply"):
        packing.optimize(6, 3, steps=5, method=method, p_start=4)
    with pytest.raises(ValueError, match="lr does not apply"):
        packing.optimize(6, 3, steps=5, method=method, lr=0.01)
    with pytest.raises(ValueError, match="precision='bf16' does not apply"):
        packing.optimize(6, 3, steps=5, method=method, precision="bf16")
    monkeypatch.setattr(packing_projection, "MAX_K", 5)
    with pytest.raises(ValueError, match="k must be at most 5, got k=6"):
        packing.optimize(6, 3, steps=5, method=method)
    assert cli(["pack", "--k", "6", "--d", "3", "--steps", "5", "--method", method, "--no-progress"]) == 2
    assert "k must be at most 5" in capsys.readouterr().err
    monkeypatch.setattr(packing_projection, "MAX_K", 4096)
    assert cli(["pack", "--k", "6", "--d", "3", "--steps", "50", "--method", method, "--no-progress"]) == 0
    assert "method=alternating-projection steps=50 no p" in capsys.readouterr().out


def test_the_projection_polish_takes_minimax_to_the_frame_it_misses():
    # minimax alone stops 0.045 above the Welch bound at (16, 6); the polish from its packing reaches it
    alone = packing.optimize(16, 6, steps=800, method="minimax", dtype=torch.float64, progress=False)
    res = packing.optimize(16, 6, steps=800, method="minimax", dtype=torch.float64, progress=False,
                           projection_steps=600)
    assert alone.eps_minus_bound > 0.01 and res.eps_minus_bound < 1e-4, (alone.eps_minus_bound, res.eps_minus_bound)
    assert res.projection_steps == 600 and len(res.projection_history) == 600
    assert res.polish_steps == 40 and res.loss_history == alone.loss_history  # the same run, then the polishes
    assert "projection_history" not in res.to_dict(history=False)


@pytest.mark.parametrize("method", ["paper", "riemannian"])
def test_the_projection_polish_never_raises_eps(method):
    # 5 lines in R^3: the bound (Welch) is out of reach, so the iterates wander; the start is kept when best
    kwargs = dict(steps=300, method=method, dtype=torch.float64, progress=False)
    alone = packing.optimize(5, 3, **kwargs)
    res = packing.optimize(5, 3, projection_steps=200, **kwargs)
    assert res.eps_star <= alone.eps_star + 1e-12 and res.eps_star >= 1 / math.sqrt(5) - 1e-9


def test_the_projection_polish_is_refused_where_it_does_not_apply(monkeypatch, capsys):
    with pytest.raises(ValueError, match="projection_steps must be"):
        packing.optimize(6, 3, steps=5, method="minimax", projection_steps=-1)
    with pytest.raises(ValueError, match="method='alternating-projection' already is that iteration"):
        packing.optimize(6, 3, steps=5, method="alternating-projection", projection_steps=5)
    monkeypatch.setattr(packing_projection, "MAX_K", 5)
    with pytest.raises(ValueError, match="projection_steps holds k×k Gram.*k must be at most 5, got k=6"):
        packing.optimize(6, 3, steps=5, method="minimax", projection_steps=5)
    monkeypatch.setattr(packing_projection, "MAX_K", 4096)
    assert cli(["pack", "--k", "6", "--d", "3", "--steps", "50", "--method", "riemannian", "--projection-steps",
                "30", "--no-progress"]) == 0
    assert "projection_steps=30" in capsys.readouterr().out


def test_beyond_the_exact_projection_the_subspace_iteration_reaches_the_frames_too(monkeypatch):
    # k > EIGH_MAX_K: the tight-frame step is the warm-started subspace iteration (O(k²d))
    monkeypatch.setattr(packing_projection, "EIGH_MAX_K", 8)
    for k, d in [(16, 6), (28, 7)]:
        gaps = [packing.optimize(k, d, steps=600, seed=seed, method="alternating-projection", dtype=torch.float64,
                                 progress=False).eps_minus_bound for seed in (0, 1, 2)]
        assert min(gaps) >= -1e-12 and sum(gap < 1e-4 for gap in gaps) >= 2, (k, d, gaps)


def test_sweeps_take_the_projection_polish_record_it_and_never_mix_it(tmp_path, capsys):
    out = tmp_path / "s.json"
    kwargs = dict(steps=300, method="minimax", dtype=torch.float64, progress=False)
    cells = packing.sweep([16], [6], out, projection_steps=400, **kwargs)
    alone = packing.optimize(16, 6, projection_steps=400, **kwargs)
    assert cells[0]["projection_steps"] == 400 and cells[0]["eps_star"] == alone.eps_star
    assert packing.load_cells(out) == cells and packing.sweep([16], [6], out, projection_steps=400, **kwargs) == cells
    with pytest.raises(ValueError, match=r"other settings .*'projection_steps': 400.*'projection_steps': 0"):
        packing.sweep([16], [6], out, **kwargs)
    with pytest.raises(ValueError, match="projection_steps must be >= 0"):
        packing.sweep([16], [6], tmp_path / "t.json", projection_steps=-1, **kwargs)
    with pytest.raises(ValueError, match="method='alternating-projection' already is that iteration"):
        packing.sweep([16], [6], tmp_path / "t.json", steps=5, method="alternating-projection", projection_steps=5,
                      progress=False)
    # a cell beyond the polish's limit is refused before any cell runs
    with pytest.raises(ValueError, match="projection_steps holds k×k Gram.*got k=5000"):
        packing.sweep([16, 5000], [6], tmp_path / "u.json", steps=5, projection_steps=5, progress=False)
    assert not (tmp_path / "u.json").exists()  # (16, 6) did not run first
    assert cli(["sweep", "--ks", "10", "--ds", "5", "--steps", "100", "--method", "riemannian",
                "--projection-steps", "50", "--out", str(tmp_path / "v.json"), "--no-progress"]) == 0
    assert packing.load_cells(tmp_path / "v.json")[0]["projection_steps"] == 50
