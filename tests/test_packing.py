"""Packing simulation, resumable sweeps, the fit of C, the CLI, and bad input."""

import json
import math

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import capacity, fitting, packing
from repcap_fast.cli import main as cli


@pytest.fixture(scope="module")
def packed():
    return packing.optimize(200, 16, steps=300, seed=1)


def test_paper_defaults():
    assert packing.default_lr(1024) == 0.005 and packing.default_lr(1025) == 0.0025
    assert packing.default_p(4000, 64) == int(40 / math.log(64))  # k ≤ 4000: m = 40
    assert packing.default_p(8000, 64) == int(60 / math.log(64))  # k > 4000, d < 3072: m = 60
    assert packing.default_p(8000, 4096) == int(50 / math.log(4096))  # d ≥ 3072: m = 50
    assert packing.default_p(200, 2) == 20  # capped at 20
    assert packing.default_p(200, 1) == 20


def test_packing_improves_on_the_random_start_and_respects_welch(packed):
    assert packed.p == packing.default_p(200, 16) and packed.lr == 0.005
    assert packed.eps_star < 0.75 * packed.eps_star_init
    assert packed.welch == pytest.approx(math.sqrt((200 - 16) / (16 * 199)))
    assert packed.eps_star > packed.welch
    assert packed.eps_over_welch > 1
    assert len(packed.loss_history) == 300
    assert packed.loss_final < 0.1 * packed.loss_init
    # ε* and μ+2σ are read from the final vectors
    assert packed.mu_plus_2sigma == pytest.approx(packed.mean + 2 * packed.std)


def test_packing_is_repeatable_with_the_seed(packed):
    again = packing.optimize(200, 16, steps=300, seed=1)
    assert again.eps_star == packed.eps_star and again.loss_history == packed.loss_history
    other = packing.optimize(200, 16, steps=300, seed=2)
    assert other.eps_star != packed.eps_star


def test_k_below_d_approaches_orthogonality():
    res = packing.optimize(8, 16, steps=400, p=2)
    assert res.welch == 0.0 and res.eps_over_welch == math.inf
    assert res.eps_star < 1e-5 and res.eps_star_init > 0.3


def test_result_to_dict_is_json(packed):
    d = packed.to_dict()
    json.dumps(d)
    assert d["eps_minus_welch"] == pytest.approx(packed.eps_star - packed.welch)
    assert "loss_history" not in packed.to_dict(history=False)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_killed_sweep_resumes_to_the_same_file(tmp_path, suffix):
    grid = dict(ks=[20, 30, 45], ds=[4, 6], steps=25, progress=False)
    full = tmp_path / f"full{suffix}"
    packing.sweep(out=full, **grid)

    part = tmp_path / f"part{suffix}"
    seen = []

    def kill_after_two(cell):
        seen.append(cell)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        packing.sweep(out=part, on_cell=kill_after_two, **grid)
    assert len(packing.load_cells(str(part))) == 2  # the finished cells are on disk
    ran = []
    cells = packing.sweep(out=part, on_cell=ran.append, **grid)
    assert len(ran) == 4  # only the missing cells ran
    assert part.read_bytes() == full.read_bytes()
    assert [(c["k"], c["d"]) for c in cells] == [(k, d) for d in (4, 6) for k in (20, 30, 45)]


def test_sweep_refuses_other_settings(tmp_path):
    out = tmp_path / "s.json"
    packing.sweep([20], [4], out, steps=10, progress=False)
    with pytest.raises(ValueError, match="other settings"):
        packing.sweep([20], [4], out, steps=11, progress=False)
    packing.sweep([20], [4], out, steps=11, progress=False, resume=False)  # starts anew
    assert packing.load_cells(str(out))[0]["steps"] == 11
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a repcap_fast sweep file"):
        packing.sweep([20], [4], bad, steps=10, progress=False)


KS = np.array([k for d in (32, 64, 128, 256) for k in (500, 1000, 2000, 4000, 8000)], float)
DS = np.array([d for d in (32, 64, 128, 256) for k in (500, 1000, 2000, 4000, 8000)], float)


@pytest.mark.parametrize("form,true", [
    ("jl", (3.029,)),
    ("adjusted", (1.293,)),
    ("full", (0.45809143, 1.0668005, 1.44738666, 0.97197234)),
])
def test_fit_recovers_known_constants(form, true):
    eps = fitting.FIT_FORMS[form][0]((KS, DS), *true)
    res = fitting.fit([{"k": k, "d": d, "eps_star": e} for k, d, e in zip(KS, DS, eps)], form)
    assert list(res.params.values()) == pytest.approx(true, rel=1e-6)
    assert res.r2 == pytest.approx(1.0, abs=1e-12) and res.mape < 1e-6 and res.max_error < 1e-8


def test_fit_with_noise_reports_metrics_and_exclusions(tmp_path):
    rng = np.random.default_rng(0)
    eps = fitting.FIT_FORMS["adjusted"][0]((KS, DS), 1.293) * (1 + 0.01 * rng.standard_normal(len(KS)))
    cells = [(k, d, e) for k, d, e in zip(KS, DS, eps)] + [(16, 32, 0.01)]  # k ≤ d: excluded, listed
    res = fitting.fit(cells, "adjusted")
    assert res.params["C"] == pytest.approx(1.293, rel=0.02)
    assert 0.9 < res.r2 < 1.0 and 0 < res.mape < 3 and res.nrmse > 0
    assert res.to_dict()["excluded_cells"] == [{"k": 16, "d": 32,
                                                "why": "k <= d has no adjusted capacity (ln(k/d) <= 0)"}]
    jl = fitting.fit(cells, "jl")  # the JL form takes k ≤ d
    assert jl.to_dict()["n_cells"] == len(cells)
    res.plot(str(tmp_path / "fit.png"))
    assert (tmp_path / "fit.png").stat().st_size > 1000


def test_fit_bad_input():
    with pytest.raises(ValueError, match="form must be one of"):
        fitting.fit([(100, 10, 0.3)], "nope")
    with pytest.raises(ValueError, match="empty"):
        fitting.fit([], "jl")
    with pytest.raises(ValueError, match="has no 'eps_star'"):
        fitting.fit([{"k": 100, "d": 10}], "jl")
    with pytest.raises(ValueError, match="4 parameters"):
        fitting.fit([(100, 10, 0.3), (200, 10, 0.35)], "full")


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_reduced_precision_steps_with_exact_losses_and_eps(precision):
    """The steps run at the reduced precision (the CPU emulates it by rounding the operands: the
    trajectory differs from "highest"), while loss_init, loss_final, ε* and μ+2σ are the exact
    kernel's: loss_init is bitwise the "highest" run's, and loss_final is the exact loss of the
    vectors before the last update, replayed here step by step."""
    k, d, steps, seed = 30, 5, 6, 3
    highest = packing.optimize(k, d, steps=steps, seed=seed)
    low = packing.optimize(k, d, steps=steps, seed=seed, precision=precision)
    assert (highest.precision, low.precision) == ("highest", precision) and low.to_dict()["precision"] == precision
    assert low.loss_init == highest.loss_init and low.loss_history[0] == low.loss_init
    assert low.loss_history[1:] != highest.loss_history[1:]
    X = packing.optimizer._initial_vectors(k, d, seed).float().requires_grad_(True)
    opt = torch.optim.Adam([X], lr=low.lr)
    for step in range(steps):
        opt.zero_grad()
        loss = rf.gram_offdiag_penalty(X, low.p, backend="cpu", precision=precision)
        loss.backward()
        assert float(loss.detach()) == low.loss_history[step] or step in (0, steps - 1)
        if step == steps - 1:
            exact = rf.gram_offdiag_penalty(X.detach(), low.p, backend="cpu", precision="highest")
            assert low.loss_final == float(exact) != float(loss.detach())
        opt.step()
    stats = rf.pairwise_cosine_stats(X.detach(), bins=1, backend="cpu")
    assert low.eps_star == max(abs(stats.min), abs(stats.max))
    assert low.mu_plus_2sigma == pytest.approx(stats.mean + 2 * stats.std, rel=1e-12)


def test_continuation_methods_report_exact_first_and_last_objectives():
    highest = packing.optimize(12, 3, steps=5, seed=2, method="riemannian", lr=0.01)
    low = packing.optimize(12, 3, steps=5, seed=2, method="riemannian", lr=0.01, precision="bf16")
    assert low.loss_init == highest.loss_init and low.loss_history[1:] != highest.loss_history[1:]
    with pytest.raises(ValueError, match="precision='bf16' does not apply to method='smooth-max'"):
        packing.optimize(12, 3, steps=5, method="smooth-max", precision="bf16")
    with pytest.raises(ValueError, match="precision must be one of"):
        packing.optimize(12, 3, steps=5, precision="fp8")


def test_sweep_records_the_precision_and_a_resume_never_mixes_them(tmp_path):
    out = tmp_path / "s.json"
    cells = packing.sweep([20, 30], [4], out, steps=10, precision="bf16", progress=False)
    assert [c["precision"] for c in cells] == ["bf16", "bf16"]
    assert json.loads(out.read_text())["format"] == "repcap_fast.packing.sweep/5"
    assert packing.sweep([20, 30], [4], out, steps=10, precision="bf16", progress=False) == cells  # resumed
    with pytest.raises(ValueError, match=r"other settings .*'precision': 'bf16'.*'precision': 'highest'"):
        packing.sweep([20, 30, 45], [4], out, steps=10, progress=False)
    with pytest.raises(ValueError, match="precision='bf16' does not apply to method='smooth-max'"):
        packing.sweep([20], [4], tmp_path / "t.json", steps=10, method="smooth-max", precision="bf16",
                      progress=False)
    assert not (tmp_path / "t.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "repcap_fast.packing.sweep/5", "cells": [dict(cells[0], precision="fp8")]}))
    with pytest.raises(ValueError, match="precision is 'fp8', not one of highest, tf32, bf16"):
        packing.load_cells(bad)
    missing = {key: value for key, value in cells[0].items() if key != "precision"}
    bad.write_text(json.dumps({"format": "repcap_fast.packing.sweep/5", "cells": [missing]}))
    with pytest.raises(ValueError, match="has no precision"):
        packing.load_cells(bad)


def test_cli_pack_sweep_fit(tmp_path, capsys):
    assert cli(["pack", "--k", "40", "--d", "6", "--steps", "20", "--precision", "tf32", "--json",
                str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")]) == 0
    result = json.loads((tmp_path / "p.json").read_text())["result"]
    assert result["k"] == 40 and len(result["loss_history"]) == 20 and result["precision"] == "tf32"
    out = str(tmp_path / "s.csv")
    assert cli(["sweep", "--ks", "20:40:10", "--ds", "4,6", "--steps", "15", "--out", out, "--no-progress"]) == 0
    assert len(packing.load_cells(out)) == 6
    low = str(tmp_path / "s_bf16.json")
    assert cli(["sweep", "--ks", "20", "--ds", "4", "--steps", "15", "--out", low, "--precision", "bf16",
                "--no-progress"]) == 0
    assert packing.load_cells(low)[0]["precision"] == "bf16"
    assert cli(["sweep", "--ks", "20", "--ds", "4", "--steps", "15", "--out", low, "--no-progress"]) == 2
    assert "'precision': 'bf16'" in capsys.readouterr().err
    assert cli(["fit", out, "--form", "jl", "--json", str(tmp_path / "f.json"), "--plot", str(tmp_path / "f.png")]) == 0
    fit = json.loads((tmp_path / "f.json").read_text())["fits"]["jl"]
    assert fit["params"]["C"] > 0 and "r2" in fit
    assert cli(["pack", "--k", "1", "--d", "6"]) == 2
    assert "k must be >= 2" in capsys.readouterr().err


X_OK = torch.randn(10, 4)


@pytest.mark.parametrize("call,match", [
    (lambda: rf.gram_offdiag_penalty(torch.randn(1, 4)), "k >= 2"),
    (lambda: rf.gram_offdiag_penalty(torch.randn(5, 0)), "d >= 1"),
    (lambda: rf.gram_offdiag_penalty(torch.randn(5)), "2-D"),
    (lambda: rf.gram_offdiag_penalty(torch.randn(5, 3).int()), "float"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=0), "p must be an integer in"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=-2), "p must be an integer in"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=float("nan")), "p must be a finite"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=float("inf")), "p must be a finite"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=2.5), "p must be an integer"),
    (lambda: rf.gram_offdiag_penalty(X_OK, p=True), "p must be an integer"),
    (lambda: rf.gram_offdiag_penalty(torch.tensor([[1.0, float("nan")], [0.0, 1.0]])), "NaN/Inf"),
    (lambda: rf.gram_offdiag_penalty(torch.tensor([[1.0, float("inf")], [0.0, 1.0]])), "NaN/Inf"),
    (lambda: rf.gram_offdiag_penalty(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])), "1 zero rows"),
    (lambda: rf.gram_offdiag_penalty(X_OK, reduction="none"), "reduction must be one of"),
    (lambda: rf.gram_offdiag_penalty(X_OK, backend="gpu"), "backend must be one of"),
    (lambda: rf.gram_offdiag_penalty(X_OK.numpy()), "X must be a torch.Tensor"),
    (lambda: packing.optimize(1, 4, steps=1), "k must be >= 2"),
    (lambda: packing.optimize(4, 0, steps=1), "d must be >= 1"),
    (lambda: packing.optimize(4, 2, steps=0), "steps must be >= 1"),
    (lambda: packing.optimize(4, 2, steps=1, p=0), "p must be an integer in"),
    (lambda: packing.optimize(4, 2, steps=1, lr=float("nan")), "lr must be a finite"),
    (lambda: packing.optimize(4, 2, steps=1, dtype="int8"), "dtype must be one of"),
    (lambda: packing.optimize(4, 2, steps=1, precision="fp16"), "precision must be one of"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_zero_rows_are_fine_without_normalization():
    X = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 1.0]])
    loss = rf.gram_offdiag_penalty(X, 2, normalize=False, backend="cpu")
    from repcap_fast.reference import gram_offdiag_penalty_reference

    assert float(loss) == pytest.approx(float(gram_offdiag_penalty_reference(X.double(), 2, False)))


def test_resume_checks_default_settings_and_dedupes(tmp_path):
    out = tmp_path / "s.json"
    packing.sweep([20], [4], out, steps=10, p=3, progress=False)
    with pytest.raises(ValueError, match="other settings"):  # the default p for (20, 4) is 20
        packing.sweep([20], [4], out, steps=10, progress=False)
    ran = []
    packing.sweep([20, 20, 30], [4, 4], tmp_path / "d.json", steps=5, progress=False, on_cell=ran.append)
    assert [(c["k"], c["d"]) for c in ran] == [(20, 4), (30, 4)]
    csv_file = tmp_path / "other.csv"
    csv_file.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a repcap_fast sweep file"):
        packing.sweep([20], [4], csv_file, steps=5, progress=False, resume=False)


def test_sweep_survives_sigkill(tmp_path):
    """A sweep process killed with SIGKILL mid-run leaves a valid file of finished cells; the
    resumed sweep writes the same file as an uninterrupted one."""
    import signal
    import subprocess
    import sys
    import time

    grid = "ks=[40, 60, 80], ds=[4, 6], steps=150, progress=False"
    full = tmp_path / "full.json"
    packing.sweep(out=full, **eval(f"dict({grid})"))
    part = tmp_path / "part.json"
    code = f"from repcap_fast import packing; packing.sweep(out={str(part)!r}, {grid})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if part.exists() and len(packing.load_cells(str(part))) >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(packing.load_cells(str(part)))
    assert 1 <= done < 6, done  # killed mid-sweep, file intact
    packing.sweep(out=part, **eval(f"dict({grid})"))
    assert part.read_bytes() == full.read_bytes()


def test_fit_excludes_cells_without_a_value():
    cells = [{"k": k, "d": d, "eps_over_welch": (None if k <= d else 1.0 + 10.0 / k)}
             for k, d in [(8, 16), (100, 10), (200, 10), (400, 10), (800, 20)]]
    res = fitting.fit(cells, "jl", eps_key="eps_over_welch")
    assert res.to_dict()["excluded_cells"] == [{"k": 8, "d": 16, "why": "eps_over_welch is None"}]
    flat = fitting.fit([(100, 10, 0.3), (200, 10, 0.3), (400, 10, 0.3)], "jl")
    assert flat.to_dict()["r2"] is None  # constant data: R² undefined, JSON-safe
    json.dumps(flat.to_dict())


def test_capacity_fit_is_a_deprecated_alias_of_fitting_fit():
    cells = [(100, 10, 0.3), (200, 10, 0.35), (400, 10, 0.4)]
    with pytest.warns(DeprecationWarning, match="repcap_fast.fitting.fit"):
        old = capacity.fit(cells, "jl")
    assert old.params == fitting.fit(cells, "jl").params


def test_every_result_and_sweep_cell_carries_its_certificate(tmp_path):
    """A packing's certificate: the best lower bound that applies (capacity.coherence_bound) and
    ε* − bound, in the result, its dict, every sweep cell (JSON and CSV) and `repcap pack`."""
    res = packing.optimize(6, 3, steps=30, method="minimax", polish_steps=20, progress=False)
    assert (res.bound, res.bound_name) == capacity.coherence_bound(6, 3) == (pytest.approx(res.welch), "welch")
    assert res.eps_minus_bound == res.eps_star - res.bound >= -1e-12
    assert res.to_dict()["eps_minus_bound"] == res.eps_minus_bound
    above = packing.optimize(12, 3, steps=20, progress=False)  # k > d(d+1)/2: Levenstein
    assert above.bound_name == "levenstein" and above.bound > above.welch and above.eps_minus_bound > 0
    for suffix in (".json", ".csv"):
        out = tmp_path / f"s{suffix}"
        cells = packing.sweep([6, 12], [3], out, steps=20, progress=False)
        assert [c["bound_name"] for c in cells] == ["welch", "levenstein"]
        assert all(c["eps_minus_bound"] == c["eps_star"] - c["bound"] for c in cells)
        assert packing.load_cells(out) == cells
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": packing.SWEEP_FORMAT, "cells": [dict(cells[0], bound_name="guess")]}))
    with pytest.raises(ValueError, match="bound_name is 'guess'"):
        packing.load_cells(bad)


def test_cli_pack_prints_the_certificate(capsys):
    assert cli(["pack", "--k", "12", "--d", "3", "--steps", "10", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "certificate" in printed and "(levenstein)" in printed and "eps* - bound" in printed


def test_restarts_keep_the_best_start_and_record_every_start(tmp_path, capsys):
    """optimize(restarts=R): the runs from seeds seed … seed + R − 1, each equal to a run alone;
    the result is the one of least ε*, with every start's ε* and the best seed. In a sweep,
    restarts is a setting of the file (a resume never mixes them) and each cell has its best_seed."""
    alone = [packing.optimize(14, 4, steps=25, seed=s, progress=False) for s in (5, 6, 7)]
    res = packing.optimize(14, 4, steps=25, seed=5, restarts=3, progress=False)
    assert res.restart_eps_stars == [r.eps_star for r in alone]
    assert res.eps_star == min(r.eps_star for r in alone)
    assert res.best_seed == 5 + [r.eps_star for r in alone].index(res.eps_star)
    assert (res.seed, res.restarts) == (5, 3) and res.to_dict()["restart_eps_stars"] == res.restart_eps_stars
    assert alone[0].restarts == 1 and alone[0].best_seed == 5 and alone[0].restart_eps_stars == [alone[0].eps_star]
    with pytest.raises(ValueError, match="restarts must be"):
        packing.optimize(14, 4, steps=5, restarts=0)
    with pytest.raises(ValueError, match="the last start's seed"):
        packing.optimize(14, 4, steps=5, seed=2**63 - 2, restarts=3)
    out = tmp_path / "s.csv"
    cells = packing.sweep([10, 14], [4], out, steps=25, seed=5, restarts=3, progress=False)
    assert [c["restarts"] for c in cells] == [3, 3] and cells[1]["best_seed"] == res.best_seed
    assert cells[1]["eps_star"] == res.eps_star and packing.load_cells(out) == cells
    with pytest.raises(ValueError, match="other settings"):
        packing.sweep([10, 14], [4], out, steps=25, seed=5, progress=False)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": packing.SWEEP_FORMAT, "cells": [dict(cells[0], best_seed=9)]}))
    with pytest.raises(ValueError, match="best_seed is 9, not one of the starts' seeds"):
        packing.load_cells(bad)
    assert cli(["pack", "--k", "14", "--d", "4", "--steps", "25", "--seed", "5", "--restarts", "3",
                "--no-progress"]) == 0
    assert f"restarts    3: best seed {res.best_seed}" in capsys.readouterr().out
