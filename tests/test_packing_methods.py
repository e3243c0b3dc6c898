"""The packing methods beyond the paper's (packing.optimize(method=...)): known optimal line
packings, the objectives against dense float64 autograd, the Riemannian optimizer, the active-set
polish, the paper's method unchanged, sweeps that record the method, and bad input."""

import json
import math

import pytest
import torch

import repcap_fast as rf
from repcap_fast import packing
from repcap_fast.cli import main as cli
from repcap_fast.packing import methods as pm
from repcap_fast.reference import gram_offdiag_penalty_reference


def _max_offdiag(X: torch.Tensor) -> float:
    Xn = X.double() / X.double().norm(dim=1, keepdim=True)
    g = Xn @ Xn.T
    g.fill_diagonal_(0)
    return float(g.abs().max())


# Equiangular tight frames meet the Welch bound: 6 lines in R^3 (the icosahedron's diagonals) at
# 1/√5, and 28 lines in R^7 at 1/3. The issue asks for 1e-3 in seconds from several seeds.
@pytest.mark.parametrize("k,d,optimum", [(6, 3, 1 / math.sqrt(5)), (28, 7, 1 / 3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_minimax_reaches_known_optimal_line_packings(k, d, optimum, seed):
    res = packing.optimize(k, d, steps=1000, seed=seed, method="minimax", dtype=torch.float64)
    assert res.eps_star == pytest.approx(optimum, abs=1e-3)
    assert res.eps_star >= optimum - 1e-12  # nothing beats the Welch bound
    assert res.welch == pytest.approx(optimum, rel=1e-12)


def test_the_paper_s_method_is_far_from_those_optima():
    # what the new methods fix: the paper's fixed p = 20 stops well above 1/3 at (28, 7)
    res = packing.optimize(28, 7, steps=500, seed=0)
    assert res.method == "paper" and res.eps_star > 1 / 3 + 0.01


@pytest.mark.parametrize("method", ["p-continuation", "smooth-max", "riemannian", "minimax"])
def test_every_method_beats_the_paper_at_equal_steps(method):
    for seed in range(2):
        paper = packing.optimize(120, 10, steps=200, seed=seed)
        other = packing.optimize(120, 10, steps=200, seed=seed, method=method,
                                 polish_steps=3 if method == "minimax" else None)
        assert other.eps_star < paper.eps_star, (seed, other.eps_star, paper.eps_star)
        assert other.method == method and other.steps == 200 and len(other.loss_history) == 200


def test_the_paper_s_method_is_adam_on_the_raw_parameters_unchanged():
    """method="paper" against the published algorithm written out: Adam on the raw k×d
    parameters, loss Σ|ĝ|^p of the row-normalized parameters (float64 autograd reference)."""
    k, d, steps = 30, 4, 25
    res = packing.optimize(k, d, steps=steps, seed=5, dtype=torch.float64, backend="torch")
    X = packing.optimizer._initial_vectors(k, d, 5).clone().requires_grad_(True)
    opt = torch.optim.Adam([X], lr=packing.default_lr(d))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = gram_offdiag_penalty_reference(X, packing.default_p(k, d), True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert res.loss_history == pytest.approx(losses, rel=1e-10)
    assert res.eps_star == pytest.approx(_max_offdiag(X.detach()), rel=1e-10)
    assert (res.method, res.p_start, res.p, res.polish_steps, res.polish_history) == (
        "paper", packing.default_p(k, d), packing.default_p(k, d), 0, [])


@pytest.mark.parametrize("p", [3, 64, 400])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_log_penalty_matches_the_autograd_log_of_the_reference(p, dtype):
    X = torch.randn(60, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(p)) * 3
    Xr = X.clone().requires_grad_(True)
    ref = torch.log(gram_offdiag_penalty_reference(Xr, p, True))
    (ref_grad,) = torch.autograd.grad(ref, Xr)
    log_loss, grad = rf.gram_offdiag_log_penalty(X.to(dtype), p)
    assert grad.dtype == dtype and grad.shape == X.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    assert log_loss == pytest.approx(float(ref.detach()), rel=tol, abs=tol)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=tol * 10 * float(ref_grad.abs().max()))


def test_log_penalty_stays_finite_where_the_penalty_underflows():
    X = torch.randn(200, 16, generator=torch.Generator().manual_seed(0))
    assert float(rf.gram_offdiag_penalty(X, 1024)) == 0.0  # Σ|ĝ|^1024 underflows float32
    log_loss, grad = rf.gram_offdiag_log_penalty(X, 1024)
    assert math.isfinite(log_loss) and torch.isfinite(grad).all() and float(grad.abs().max()) > 0
    zero = torch.eye(4)  # every pair orthogonal: ln 0
    log_loss, grad = rf.gram_offdiag_log_penalty(zero, 8)
    assert log_loss == -math.inf and float(grad.abs().max()) == 0.0


@pytest.mark.parametrize("temperature", [0.5, 0.01])
def test_smooth_max_objective_matches_dense_autograd(temperature, monkeypatch):
    monkeypatch.setattr(pm, "_block_rows", lambda k, elements=0: 7)  # several row blocks, one ragged
    X = torch.randn(40, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    X = X / X.norm(dim=1, keepdim=True)
    Xr = X.clone().requires_grad_(True)
    g = Xr @ Xr.T
    off = ~torch.eye(40, dtype=torch.bool)
    ref = temperature * torch.logsumexp(g.abs()[off] / temperature, 0)
    (ref_grad,) = torch.autograd.grad(ref, Xr)
    ref_grad = ref_grad - X * (ref_grad * X).sum(1, keepdim=True)
    value, grad, eps = pm.smooth_max_objective(X, temperature)
    assert value == pytest.approx(float(ref.detach()), rel=1e-12)
    assert eps == pytest.approx(float(g.detach().abs()[off].max()), rel=1e-15)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12 * float(ref_grad.abs().max()))


def test_smooth_max_in_float32_at_a_sharp_temperature_matches_float64():
    """At T = 1e-3 nearly every term's exponent is far below −80, where exp would form float32
    subnormals (slow); they are clamped there, < 2e-35 of each row's largest term: the value and
    the gradient still match the float64 objective to float32 precision."""
    X = torch.randn(300, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    X = X / X.norm(dim=1, keepdim=True)
    v64, g64, e64 = pm.smooth_max_objective(X, 1e-3)
    v32, g32, e32 = pm.smooth_max_objective(X.float(), 1e-3)
    assert v32 == pytest.approx(v64, rel=1e-6) and e32 == pytest.approx(e64, rel=1e-6)
    assert float((g32.double() - g64).abs().max()) <= 1e-5 * float(g64.abs().max())


def test_riemannian_adam_keeps_rows_unit_and_descends():
    X = torch.randn(50, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    X = X / X.norm(dim=1, keepdim=True)
    opt = pm.RiemannianAdam(X)
    start, _ = pm.log_power_objective(X, 8, "auto", "highest")
    for _ in range(100):
        _, grad = pm.log_power_objective(X, 8, "auto", "highest")
        opt.step(grad, 0.01)
        assert float((X.norm(dim=1) - 1).abs().max()) < 1e-14
        assert float((opt.m * X).sum(1).abs().max()) < 1e-14  # the moment lies in the tangent spaces
    end, _ = pm.log_power_objective(X, 8, "auto", "highest")
    assert end < start - 0.1


def test_polish_recovers_an_optimum_from_a_perturbed_one():
    tau = (1 + math.sqrt(5)) / 2  # the icosahedron's 6 diagonals: 6 lines in R^3 at exactly 1/√5
    ico = torch.tensor([[0, 1, tau], [0, 1, -tau], [1, tau, 0], [1, -tau, 0], [tau, 0, 1], [-tau, 0, 1]],
                       dtype=torch.float64)
    assert _max_offdiag(ico) == pytest.approx(1 / math.sqrt(5), abs=1e-15)
    noisy = ico + 1e-3 * torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    history = []
    out = pm.polish(noisy, 30, lambda step, eps: history.append(eps))
    assert _max_offdiag(noisy) > 1 / math.sqrt(5) + 1e-4
    assert _max_offdiag(out) == pytest.approx(1 / math.sqrt(5), abs=1e-9)
    assert history == sorted(history, reverse=True)  # ε* never rises
    assert float((out.norm(dim=1) - 1).abs().max()) < 1e-14


def test_polish_never_makes_a_packing_worse():
    X = torch.randn(300, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    before = _max_offdiag(X)
    out = pm.polish(X, 5)
    assert _max_offdiag(out) <= before


def test_method_settings_are_recorded_and_the_schedule_spans_p_start_to_p():
    res = packing.optimize(40, 5, steps=50, method="riemannian", p=64, p_start=2, lr=0.01)
    assert (res.method, res.p_start, res.p, res.polish_steps) == ("riemannian", 2, 64, 0)
    assert [pm.p_at(s, 50, 2, 64) for s in (0, 49)] == [2, 64]
    assert pm.lr_at(49, 50, 0.01) == pytest.approx(0.01 * pm.LR_END_FRACTION)
    doc = res.to_dict(history=False)
    assert doc["method"] == "riemannian" and "polish_history" not in doc
    json.dumps(res.to_dict())
    polished = packing.optimize(40, 5, steps=50, method="minimax", polish_steps=3)
    assert polished.polish_steps == 3 and 1 <= len(polished.polish_history) <= 3
    assert polished.eps_star <= polished.polish_history[0] + 1e-6  # float32 rounding of the result


def test_any_method_may_be_polished_and_paper_stays_unpolished_by_default():
    res = packing.optimize(40, 5, steps=50, polish_steps=4)
    plain = packing.optimize(40, 5, steps=50)
    assert res.method == "paper" and res.loss_history == plain.loss_history
    assert res.eps_star <= plain.eps_star + 1e-7 and res.polish_history


def test_sweep_records_the_method_and_refuses_to_mix_methods_on_resume(tmp_path):
    out = tmp_path / "s.json"
    cells = packing.sweep([6, 8], [3], out, steps=40, method="riemannian", lr=0.01, progress=False)
    assert [c["method"] for c in cells] == ["riemannian"] * 2 and cells[0]["p_start"] == 4
    assert cells[0]["p"] == pm.DEFAULT_P_END
    assert packing.sweep([6, 8], [3], out, steps=40, method="riemannian", lr=0.01, progress=False) == cells
    with pytest.raises(ValueError, match=r"made with other settings .*'method': 'riemannian'.*'method': 'paper'"):
        packing.sweep([6, 8], [3], out, steps=40, lr=0.01, progress=False)
    with pytest.raises(ValueError, match="one file holds one method"):
        packing.sweep([6, 8], [3], out, steps=40, method="riemannian", lr=0.01, polish_steps=2, progress=False)
    with pytest.raises(ValueError, match="one file holds one method"):
        packing.sweep([6, 8], [3], out, steps=40, method="riemannian", lr=0.01, p=128, progress=False)
    packing.sweep([6, 8], [3], out, steps=40, method="riemannian", lr=0.01, p=1024, p_start=4, progress=False)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_version_1_to_4_sweep_files_are_read_as_the_paper_s_method_at_highest(tmp_path, suffix, version):
    """Versions 1 and 2 as the paper's method at "highest"; versions 1 to 3 as one start (restarts 1,
    best_seed their seed) with the certificate of their k and d (version 4 added them); all four
    without the projection polish (version 5 added it); equal to a fresh run's."""
    out = tmp_path / f"s{suffix}"
    cells = packing.sweep([6, 8], [3], out, steps=20, progress=False)
    dropped = ("projection_steps",) + (("restarts", "best_seed", "bound", "bound_name", "eps_minus_bound")
                                       if version < 4 else ()) + (
        ("precision",) if version < 3 else ()) + (
        ("method", "p_start", "polish_steps") if version == 1 else ())
    v1_fields = [f for f in packing.CELL_FIELDS if f not in dropped]
    v1_cells = [{f: c[f] for f in v1_fields} for c in cells]
    if suffix == ".json":
        out.write_text(json.dumps({"format": f"repcap_fast.packing.sweep/{version}", "cells": v1_cells}))
    else:
        rows = [",".join(v1_fields)] + [",".join("" if c[f] is None else repr(c[f]) if isinstance(c[f], float)
                                                 else str(c[f]) for f in v1_fields) for c in v1_cells]
        out.write_text("\n".join(rows) + "\n")
    assert packing.load_cells(out) == cells
    # a resume of the paper's sweep keeps them (nothing to run: the file is left as it is)
    assert packing.sweep([6, 8], [3], out, steps=20, progress=False) == cells
    with pytest.raises(ValueError, match="one file holds one method"):
        packing.sweep([6, 8], [3], out, steps=20, method="minimax", progress=False)
    with pytest.raises(ValueError, match="'precision': 'highest'.*'precision': 'bf16'"):
        packing.sweep([6, 8], [3], out, steps=20, precision="bf16", progress=False)


def test_a_cell_with_an_unknown_method_is_refused(tmp_path):
    out = tmp_path / "s.json"
    packing.sweep([6], [3], out, steps=5, progress=False)
    doc = json.loads(out.read_text())
    doc["cells"][0]["method"] = "magic"
    out.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"s\.json: cells\[0\] \(k=6, d=3\): method is 'magic', not one of paper"):
        packing.load_cells(out)


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "adamw"}, "method must be one of"),
    ({"method": 3}, "method"),
    ({"p_start": 4}, "p_start applies to the continuation methods"),
    ({"method": "riemannian", "p_start": 2000}, "p_start must be at most p"),
    ({"method": "riemannian", "p": 16, "p_start": 32}, "p_start must be at most p"),
    ({"method": "riemannian", "p_start": 0}, "p_start must be >= 1"),
    ({"method": "riemannian", "p_start": 2.5}, "p_start must be an int"),
    ({"method": "minimax", "polish_steps": -1}, "polish_steps"),
    ({"method": "minimax", "polish_steps": 1.5}, "polish_steps"),
])
def test_bad_method_settings_name_the_argument(kwargs, match, tmp_path):
    with pytest.raises((ValueError, TypeError), match=match):
        packing.optimize(10, 3, steps=2, **kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        packing.sweep([10], [3], tmp_path / "never_written.json", steps=2, progress=False, **kwargs)
    assert not list(tmp_path.iterdir())


def test_cli_pack_and_sweep_with_a_method(tmp_path, capsys):
    out = tmp_path / "pack.json"
    assert cli(["pack", "--k", "28", "--d", "7", "--steps", "600", "--method", "minimax", "--json", str(out),
                "--plot", str(tmp_path / "loss.png"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "method=minimax" in text and "p=4->1024" in text and "polish_steps=40" in text
    result = json.loads(out.read_text())["result"]
    assert result["eps_star"] == pytest.approx(1 / 3, abs=1e-3) and (tmp_path / "loss.png").stat().st_size > 0
    sweep = tmp_path / "sweep.csv"
    assert cli(["sweep", "--ks", "6,8", "--ds", "3", "--steps", "30", "--method", "smooth-max", "--out",
                str(sweep), "--no-progress"]) == 0
    assert {c["method"] for c in packing.load_cells(sweep)} == {"smooth-max"}


def test_a_fit_records_the_packing_method_and_refuses_a_mix(tmp_path):
    from repcap_fast import fitting

    cells = packing.sweep([20, 40, 80], [3, 4], tmp_path / "m.json", steps=30, method="riemannian", progress=False)
    assert fitting.fit(cells, "adjusted").to_dict()["packing_method"] == "riemannian"
    paper = packing.sweep([20, 40, 80], [5], tmp_path / "p.json", steps=30, progress=False)
    assert fitting.fit(paper, "jl").method == "paper"
    with pytest.raises(ValueError, match=r"several packing methods \(paper, riemannian\)"):
        fitting.fit(cells + paper, "jl")
    assert fitting.fit([(c["k"], c["d"], c["eps_star"]) for c in cells], "jl").method is None
