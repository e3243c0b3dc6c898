"""Library code never prints: the report's stage lines go to the `repcap_fast.report` logger, and
`repcap` prints them as before. `run_report(..., progress=False)` writes nothing to stdout or
stderr; the command line still shows every stage line, and leaves no handler behind."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import repcap_fast as rf
from repcap_fast.cli import main


@pytest.fixture
def matrix(tmp_path):
    path = tmp_path / "E.npy"
    np.save(path, np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32))
    return str(path)


def test_run_report_without_progress_writes_nothing(matrix, tmp_path, capfd):
    doc = rf.report.run_report(matrix, str(tmp_path / "out"), rf.report.ReportSettings(bins=64), progress=False)
    assert doc["complete"]
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_run_survey_without_progress_writes_nothing(matrix, tmp_path, capfd):
    rf.report.run_survey([matrix], str(tmp_path / "survey"), bins=64, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_the_stage_lines_go_to_the_report_logger(matrix, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="repcap_fast"):
        rf.report.run_report(matrix, str(tmp_path / "out"), rf.report.ReportSettings(bins=64), progress=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "repcap_fast.report"]
    assert lines[0].startswith("== loading") and lines[-1].startswith("== wrote")
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "repcap_fast.report")


def test_a_log_callable_still_receives_the_lines(matrix, tmp_path, capfd):
    seen = []
    rf.report.run_report(matrix, str(tmp_path / "out"), rf.report.ReportSettings(bins=64), progress=False,
                         log=seen.append)
    assert seen[0].startswith("== loading") and seen[-1].startswith("== wrote")
    assert capfd.readouterr() == ("", "")


def test_the_command_line_prints_the_stage_lines_and_cleans_up(matrix, tmp_path, capsys):
    logger = logging.getLogger("repcap_fast")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    assert main(["report", matrix, "--out", str(tmp_path / "out"), "--bins", "64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "== loading" in out and "== wrote" in out
    assert out.count("== wrote") == 1
    assert logger.handlers == handlers and logger.level == level and logger.propagate == propagate


def test_importing_the_package_configures_no_logging():
    code = ("import logging, repcap_fast; root = logging.getLogger(); pkg = logging.getLogger('repcap_fast');"
            "print(len(root.handlers), [type(h).__name__ for h in pkg.handlers])")
    env = {k: v for k, v in os.environ.items() if k != "REPCAP_BACKEND"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "0 ['NullHandler']"
