"""Every Python block of README.md and of the documentation pages (docs/**/*.md) runs.

Each block is a complete script: it is written to a file and run in a fresh process, so a block
can start processes of its own under `if __name__ == "__main__":` (the DDP example). A block that
cannot run on this machine starts with a marker line that says why:

    # docs-example: cuda <why it needs a GPU>     (run only where CUDA is available)
    # docs-example: skip <why it never runs here>

A marker without a reason fails.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.S | re.M)
MARKER = re.compile(r"^# docs-example: (\w+)(.*)$")


def _blocks():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(match.group(1), id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_the_pages_have_examples():
    assert PAGES and BLOCKS


@pytest.mark.parametrize("code", BLOCKS)
def test_example_runs(code, tmp_path):
    first = code.splitlines()[0]
    marker = MARKER.match(first)
    if marker:
        kind, reason = marker.group(1), marker.group(2).strip()
        assert kind in ("cuda", "skip") and reason, f"a marker needs a kind (cuda, skip) and a reason: {first!r}"
        if kind == "skip" or not torch.cuda.is_available():
            pytest.skip(reason)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "REPCAP_BACKEND"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"the example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
