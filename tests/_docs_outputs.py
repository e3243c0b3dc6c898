"""The expected outputs of the documentation's Python blocks: how they are written, and how the
examples test (tests/test_docs_examples.py) compares them with what a block printed.

A block that prints is followed, after blank lines only, by its output block:

    ```python
    print(rf.epsilon(X))
    ```

    ```text title="Output"
    0.3551
    ```

The comparison:

- the text between numbers must match, with runs of whitespace compared as one space;
- ``...`` in the expected output matches any text (a timing, a temporary path), across lines;
- a number written with a decimal point or an exponent may differ by one unit in its last printed
  digit (``0.2014`` matches 0.2013 to 0.2015, ``3.99e+07`` matches 3.98e+07 to 4.00e+07): the
  tolerance of a value rounded for print; an integer must be equal.

Run as a script, it rewrites the output blocks of the pages from a run of every printing block
(``python tests/_docs_outputs.py README.md docs/guides/pga.md``); an existing output block's
``...`` parts are kept where they still match, so only a changed number needs a look.
"""

from __future__ import annotations

import decimal
import re

OUTPUT_FENCE = '```text title="Output"'
PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*\n", re.S | re.M)
OUTPUT_BLOCK = re.compile(r"(\n*)" + re.escape(OUTPUT_FENCE) + r"\n(.*?)^```[ \t]*$", re.S | re.M)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
ELLIPSIS = "..."


def blocks(text: str):
    """(line, code, expected output or None, (start, end) of the output block) of each Python block;
    without an output block, start = end = the end of the Python block."""
    for m in PYTHON_FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out = OUTPUT_BLOCK.match(text, m.end())
        if out:
            yield line, m.group(1), out.group(2), (m.end(), out.end())
        else:
            yield line, m.group(1), None, (m.end(), m.end())


def _pattern(expected: str) -> tuple[re.Pattern, list[str]]:
    """A regex for the expected output (numbers as groups) and the expected numbers, in order."""
    parts, numbers = [], []
    pos = 0
    tokens = re.compile(r"(?P<ell>\.\.\.)|(?P<num>" + NUMBER.pattern + r")|(?P<ws>\s+)")
    for m in tokens.finditer(expected):
        if m.start() > pos:
            parts.append(re.escape(expected[pos:m.start()]))
        if m.group("ell"):
            parts.append(r".*?")
        elif m.group("num"):
            parts.append(r"(" + NUMBER.pattern + r")")
            numbers.append(m.group("num"))
        else:
            parts.append(r"\s+")
        pos = m.end()
    parts.append(re.escape(expected[pos:]))
    for i, part in enumerate(parts):  # whitespace next to `...` may be absent ("x ..." matches "x")
        if part == r"\s+" and ".*?" in (parts[i - 1] if i else None, parts[i + 1] if i + 1 < len(parts) else None):
            parts[i] = r"\s*"
    return re.compile("".join(parts), re.S), numbers


def _value(text: str) -> decimal.Decimal:
    return decimal.Decimal(text.replace(",", ""))


def tolerance(expected_number: str) -> decimal.Decimal:
    """One unit in the last printed digit of a float, 0 for an integer."""
    text = expected_number.replace(",", "")
    if "." not in text and "e" not in text.lower():
        return decimal.Decimal(0)
    return decimal.Decimal(1).scaleb(decimal.Decimal(text).as_tuple().exponent)


def mismatch(expected: str, actual: str) -> str | None:
    """None when `actual` (what the block printed) matches `expected`; else what differs."""
    exp, act = expected.strip(), actual.strip()
    pattern, numbers = _pattern(exp)
    m = pattern.fullmatch(act)
    if not m:
        return f"the printed text differs from the output block:\n--- expected\n{exp}\n--- printed\n{act}"
    for i, (want, got) in enumerate(zip(numbers, m.groups()), 1):
        if tolerance(want) == 0 and got.replace(",", "") != want.replace(",", ""):  # integers: as written
            return f"number {i} of the output: printed {got}, the output block says {want}:\n--- printed\n{act}"
        if abs(_value(got) - _value(want)) > tolerance(want):
            return (f"number {i} of the output: printed {got}, the output block says {want} "
                    f"(tolerance {tolerance(want)}):\n--- printed\n{act}")
    return None


def merged(old: str | None, printed: str) -> str:
    """The output block's new text: the old one where it still matches (keeping its `...`), else
    what was printed."""
    if old is not None and mismatch(old, printed) is None:
        return old.rstrip("\n")
    return printed.rstrip("\n")


def rewrite(text: str, outputs: dict[int, str]) -> str:
    """`text` with the output block of each block (by its line) set to `outputs[line]`."""
    pieces, pos = [], 0
    for line, _code, old, span in blocks(text):
        if line not in outputs:
            continue
        start, end = span
        pieces.append(text[pos:start])
        if outputs[line].strip():
            pieces.append(f"\n{OUTPUT_FENCE}\n{merged(old, outputs[line])}\n```")
            if old is None:
                pieces.append("\n")
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces)


def _main(paths: list[str]) -> int:
    import os
    import pathlib
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "REPCAP_BACKEND"}
    for path in paths:
        page = pathlib.Path(path)
        text = page.read_text(encoding="utf-8")
        outputs = {}
        for line, code, _old, _span in blocks(text):
            if code.startswith("# docs-example:"):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                script = pathlib.Path(tmp) / "example.py"
                script.write_text(code, encoding="utf-8")
                run = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True,
                                     text=True, timeout=900)
            if run.returncode:
                print(f"{page}:{line} failed:\n{run.stderr[-3000:]}", file=sys.stderr)
                return 1
            outputs[line] = run.stdout
            print(f"{page}:{line}: {len(run.stdout.splitlines())} lines printed", file=sys.stderr)
            for warning in sorted({w for w in run.stderr.splitlines() if "Warning:" in w}):
                print(f"    {warning.strip()}", file=sys.stderr)
        page.write_text(rewrite(text, outputs), encoding="utf-8")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
