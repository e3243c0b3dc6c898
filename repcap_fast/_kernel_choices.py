"""Which kernel variant "auto" runs, per op, backend, input dtype and d: the fastest that
bench/gpu_suite.sh measured.

``bench/bench_cosine_stats.py -k gpu`` times every variant side by side and writes
``kernel_choices.json`` next to its results (``build_table``). Adopting a run means copying that file
to ``repcap_fast/data/kernel_choices.json``, the table packaged here, which names the GPU and the
run it came from. A lookup (``choose``) takes the entry of the same op, backend and dtype at the
nearest measured d (on a log scale). float16 uses bfloat16's entries when it has none of its own,
since both run at the same tensor-core rate. With no entry it falls back to ``DEFAULTS``, the
variants measured first (H200, 2026-11-30).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from typing import Dict, Iterable, Optional

import torch

FORMAT = "repcap_fast.kernel_choices/1"
# The variants of each (op, backend) that a table may name, and the fallback of each.
VARIANTS = {("pairwise_cosine_stats", "triton"): ("strided", "grouped", "grouped_tma"),
            ("pairwise_cosine_stats", "cuda"): ("tiles", "panels")}
DEFAULTS = {("pairwise_cosine_stats", "triton"): "strided", ("pairwise_cosine_stats", "cuda"): "tiles"}
_DTYPES = ("float32", "bfloat16", "float16")


def build_table(cells: Iterable[dict], source: dict) -> dict:
    """The table from measured cells, each {"op", "backend", "dtype", "d", "seconds": {variant:
    seconds or None}}: per cell the variant with the fewest seconds (cells where none ran are left
    out). `source` says where the timings come from (GPU, date, results directory)."""
    choices = []
    for cell in cells:
        timed = {name: s for name, s in cell["seconds"].items() if s is not None}
        if not timed:
            continue
        choices.append({"op": cell["op"], "backend": cell["backend"], "dtype": cell["dtype"], "d": int(cell["d"]),
                        "variant": min(timed, key=timed.get), "seconds": dict(cell["seconds"])})
    return check_table({"format": FORMAT, "source": dict(source), "choices": choices})


def check_table(table: dict, where: str = "kernel choices") -> dict:
    """`table` when it is a valid table, else a ValueError naming `where` and the bad entry."""
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        got = table.get("format") if isinstance(table, dict) else table
        raise ValueError(f"{where}: format must be {FORMAT!r}, got {got!r}")
    if not isinstance(table.get("source"), dict) or not isinstance(table.get("choices"), list):
        raise ValueError(f"{where}: needs a 'source' object and a 'choices' list")
    for k, entry in enumerate(table["choices"]):
        key = (entry.get("op"), entry.get("backend"))
        if key not in VARIANTS:
            raise ValueError(f"{where}: choice {k} names an unknown op and backend {key}")
        if entry.get("variant") not in VARIANTS[key]:
            raise ValueError(f"{where}: choice {k} names variant {entry.get('variant')!r}, not one of {VARIANTS[key]}")
        if entry.get("dtype") not in _DTYPES:
            raise ValueError(f"{where}: choice {k} has dtype {entry.get('dtype')!r}, not one of {_DTYPES}")
        if not isinstance(entry.get("d"), int) or entry["d"] < 1:
            raise ValueError(f"{where}: choice {k} has d {entry.get('d')!r}, not a positive integer")
    return table


@functools.lru_cache(maxsize=1)
def packaged_table() -> dict:
    """repcap_fast/data/kernel_choices.json, checked (read once)."""
    text = resources.files("repcap_fast").joinpath("data", "kernel_choices.json").read_text()
    return check_table(json.loads(text), "repcap_fast/data/kernel_choices.json")


def choose(op: str, backend: str, dtype: torch.dtype, d: int, table: Optional[Dict] = None) -> str:
    """The variant "auto" runs for inputs of `dtype` with `d` columns: the table's entry (the
    packaged one by default) for op and backend at that dtype and the nearest measured d (ties: the
    smaller d), else DEFAULTS[(op, backend)]."""
    table = packaged_table() if table is None else table
    name = str(dtype).replace("torch.", "")
    entries = [e for e in table["choices"] if (e["op"], e["backend"]) == (op, backend)]
    same = [e for e in entries if e["dtype"] == name]
    if not same and name == "float16":
        same = [e for e in entries if e["dtype"] == "bfloat16"]
    if not same:
        return DEFAULTS[(op, backend)]
    best = min(same, key=lambda e: (abs(math.log(e["d"]) - math.log(max(d, 1))), e["d"]))
    return best["variant"]
