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
