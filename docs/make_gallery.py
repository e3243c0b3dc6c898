"""Remakes the gallery (docs/gallery/): `repcap report` of MiniLM with the default settings,
copied here with the paths of the machine that made it replaced by what they stand for.

    python docs/make_gallery.py

The report itself keeps the real paths (they are the provenance of a user's own run); the
gallery is read by everyone, so it shows `<site-packages>/…` and `<out>` instead.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
GALLERY = ROOT / "docs" / "gallery"
FILES = ("report.json", "report.md", "cosine_histogram.png", "pga_profile.png", "spectral.png")


def _replacements(out: pathlib.Path) -> list[tuple[str, str]]:
    """(path, what it stands for), longest first, so that a path inside another is not cut."""
    pairs = [(str(out), "<out>"), (str(ROOT), "<repository>")]
    for packages in {*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]}:
        pairs.append((packages, "<site-packages>"))
    pairs.append((sys.prefix, "<python>"))
    return sorted(pairs, key=lambda p: -len(p[0]))


def clean(text: str, out: pathlib.Path) -> str:
    for path, name in _replacements(out):
        text = text.replace(path, name)
    return re.sub(r"(?<![\w.])/tmp/[^\s\"'`)]*", "<tmp>", text)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "minilm"
        subprocess.run(["repcap", "report", "--out", str(out)], check=True, cwd=tmp)
        for name in FILES:
            src = out / name
            if name.endswith((".json", ".md")):
                (GALLERY / name).write_text(clean(src.read_text(encoding="utf-8"), out), encoding="utf-8")
            else:
                shutil.copy(src, GALLERY / name)
    print(f"wrote {', '.join(FILES)} to {GALLERY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
