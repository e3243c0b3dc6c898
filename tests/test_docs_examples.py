"""Every Python block of README.md and of the documentation pages (docs/**/*.md) runs.

Each block is a complete script: it is written to a file and run as a script in a process of its
own, forked from tests/_docs_runner.py (which has torch and repcap_fast imported already: the same
result as a fresh `python block.py`, a few seconds sooner), so a block can start processes of its
own under `if __name__ == "__main__":` (the DDP example). A block that cannot run on this machine
starts with a marker line that says why:

    # docs-example: cuda <why it needs a GPU>     (run only where CUDA is available)
    # docs-example: skip <why it never runs here>

A marker without a reason fails.

A block that prints is followed by its output block (```text title="Output"), and what the block
prints must match it: text exactly (whitespace runs as one space, `...` as a wildcard), numbers to
one unit in their last printed digit (tests/_docs_outputs.py). A block that prints without an
output block fails, and so does an output block whose block prints nothing.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from _docs_outputs import OUTPUT_FENCE, blocks, mismatch

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^# docs-example: (\w+)(.*)$")


def _blocks():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for line, code, expected, _span in blocks(text):
            yield pytest.param(code, expected, id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_the_pages_have_examples():
    assert PAGES and BLOCKS


@pytest.fixture(scope="module")
def runner():
    """One tests/_docs_runner.py per test process; each block runs in a child it forks."""
    env = {k: v for k, v in os.environ.items() if k != "REPCAP_BACKEND"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_docs_runner.py")], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def _run(runner, script, cwd, timeout=900):
    """Runs `script` as a fresh script would run; returns (returncode, stdout, stderr)."""
    out, err = cwd.parent / f"{cwd.name}.stdout", cwd.parent / f"{cwd.name}.stderr"  # beside, not in, cwd
    request = {"script": str(script), "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": timeout}
    runner.stdin.write(json.dumps(request) + "\n")
    runner.stdin.flush()
    line = runner.stdout.readline()
    assert line, f"the docs runner died (exit status {runner.poll()})"
    return json.loads(line)["returncode"], out.read_text(errors="replace"), err.read_text(errors="replace")


def test_the_runner_reports_failures_and_runs_blocks_as_scripts(runner, tmp_path):
    script = tmp_path / "block.py"
    script.write_text("import sys, os\nassert __name__ == '__main__' and sys.argv[0] == __file__\n"
                      "print(os.getcwd())\nraise ValueError('boom')\n", encoding="utf-8")
    code, out, err = _run(runner, script, tmp_path)
    assert code == 1 and out.strip() == str(tmp_path) and "ValueError: boom" in err
    script.write_text("import sys\nprint('x', end='')\nsys.exit(3)\n", encoding="utf-8")
    assert _run(runner, script, tmp_path)[:2] == (3, "x")
    script.write_text("x = 1\n", encoding="utf-8")  # globals start empty: names of earlier blocks are gone
    assert _run(runner, script, tmp_path)[0] == 0
    script.write_text("print(x)\n", encoding="utf-8")
    code, _, err = _run(runner, script, tmp_path)
    assert code == 1 and "NameError" in err


@pytest.mark.parametrize("code,expected", BLOCKS)
def test_example_runs(code, expected, tmp_path, runner):
    first = code.splitlines()[0]
    marker = MARKER.match(first)
    if marker:
        kind, reason = marker.group(1), marker.group(2).strip()
        assert kind in ("cuda", "skip") and reason, f"a marker needs a kind (cuda, skip) and a reason: {first!r}"
        if kind == "skip" or not torch.cuda.is_available():
            pytest.skip(reason)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    returncode, out, err = _run(runner, script, tmp_path)
    assert returncode == 0, f"the example failed (exit status {returncode}):\n{out[-3000:]}\n{err[-5000:]}"
    if expected is None:
        assert not out.strip(), (f"the example prints, but no output block follows it: add\n{OUTPUT_FENCE}\n"
                                 f"{out.rstrip()}\n```\n(python tests/_docs_outputs.py PAGE writes it)")
    else:
        assert out.strip(), "the example has an output block but prints nothing"
        problem = mismatch(expected, out)
        assert problem is None, problem


def test_output_blocks_compare_text_and_numbers():
    assert mismatch("(19900, 0.0028)\nwrote ... in ... s", "(19900, 0.0029)\nwrote /x/y in 52.4 s") is None
    assert "number 1" in mismatch("(19900, 0.0028)", "(19901, 0.0028)")  # integers are exact
    assert "number 2" in mismatch("(19900, 0.0028)", "(19900, 0.0030)")  # one unit of the last digit
    assert mismatch("3.99e+07", "4.00e+07") is None and mismatch("3.99e+07", "4.01e+07")
    assert "differs" in mismatch("z per layer", "z per head")
    assert mismatch("a  b\n", "a b") is None
