"""The plots are files: writing one leaves the caller's matplotlib backend and pyplot figures
alone (a notebook's inline backend was switched to Agg by the first report, so its own plots
stopped showing)."""

import subprocess
import sys
import textwrap


def test_writing_a_plot_keeps_the_callers_backend_and_figures(tmp_path):
    code = textwrap.dedent(f"""
        import matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
        from repcap_fast import plotting
        from repcap_fast._outputs import check_plot_suffix

        mine = plt.figure()
        check_plot_suffix({str(tmp_path / "a.png")!r})
        plotting.plot_loss([3.0, 2.0, 1.0], {str(tmp_path / "loss.png")!r}, "loss")
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert plt.get_fignums() == [mine.number], plt.get_fignums()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    png = (tmp_path / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_the_spectra_plot_says_which_layers_it_leaves_out_and_why(tmp_path):
    import math

    from repcap_fast import plotting

    rows = [{"layer": i, "rankme": 10.0 + i, "alpha_req": 1.2, "isotropy": 0.1,
             "condition_number": c, "readout_alignment_mean": 0.3, "readout_alignment_top": [0.2],
             "random_direction_expectation": 0.25} for i, c in enumerate([5.0, 7.0, math.inf, None])]
    assert plotting._missing_note([0, 1, 2, 3], [r["condition_number"] for r in rows], "condition_number") == (
        "(layers 2, 3 not plotted: ∞, rank-deficient)")
    assert plotting._missing_note([0, 1], [1.0, 2.0], "rankme") == ""
    assert plotting._missing_note([0, 1], [1.0, float("nan")], "alpha_req") == "(layer 1 not plotted: undefined)"
    path = tmp_path / "spectral.png"
    plotting.plot_spectral(rows, str(path), "spectra")
    assert path.stat().st_size > 10_000
    for r in rows:  # every condition number infinite (N <= d): the panel is empty, and says so
        r["condition_number"] = math.inf
    plotting.plot_spectral(rows, str(path), "spectra")


def _records(steps=(0, 50, 100, 150), tied=True):
    out = []
    for s in steps:
        r = {"step": s, "eps/input": 0.2 + s / 1e4, "pga_z/ccr1/layer0": -4.0 + s / 100, "pga_z/ccr1/layer1": 1.0,
             "pga_z/ccr5/layer0": 3.0, "pga_z/ccr5/layer1": float("nan")}
        r["eps/output"] = r["eps/input"] if tied else r["eps/input"] + 0.05
        out.append(r)
    return out


def test_the_training_plot_reads_the_series_by_ccr_and_layer():
    from repcap_fast import plotting

    steps, eps, z, rankme = plotting._training_series(_records())
    assert steps.tolist() == [0, 50, 100, 150] and sorted(eps) == ["input", "output"]
    assert sorted(z) == [1, 5] and list(z[1]) == ["layer0", "layer1"] and rankme == {}
    assert z[1]["layer0"].tolist() == [-4.0, -3.5, -3.0, -2.5]
    assert plotting._edges(steps).tolist() == [-25, 25, 75, 125, 175]
    assert plotting._edges(steps[:1]).tolist() == [-0.5, 0.5]


def test_the_training_plot_writes_an_image_from_records_or_a_file(tmp_path):
    import json

    import pytest

    from repcap_fast import plotting

    plotting.training_plot(_records(tied=False), str(tmp_path / "a.png"), "run")
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({k: (None if v != v else v) for k, v in r.items()}) + "\n" for r in _records()))
    plotting.training_plot(path, str(tmp_path / "b.svg"))
    assert (tmp_path / "a.png").stat().st_size > 10_000 and (tmp_path / "b.svg").read_text().startswith("<?xml")
    with pytest.raises(ValueError, match="no measurements"):
        plotting.training_plot([], str(tmp_path / "c.png"))
    with pytest.raises(ValueError, match=r"metrics\[1\]: expected a dict with an integer 'step'"):
        plotting.training_plot([{"step": 0, "eps/input": 0.2}, {"eps/input": 0.3}], str(tmp_path / "c.png"))
    with pytest.raises(ValueError, match="neither ε"):
        plotting.training_plot([{"step": 0, "rankme/layer0": 3.0}], str(tmp_path / "c.png"))
