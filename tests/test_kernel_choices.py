"""The table of measured kernel variants that "auto" follows (repcap_fast/_kernel_choices.py): the
packaged file, the lookup, the table the GPU benchmark writes, and both backends reading it."""

import importlib.util
import json
import os
import types

import pytest
import torch

from repcap_fast import _kernel_choices as kc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cell(backend, dtype, d, **seconds):
    return {"op": "pairwise_cosine_stats", "backend": backend, "dtype": dtype, "d": d, "seconds": seconds}


def test_packaged_table_is_valid_and_names_its_source():
    table = kc.packaged_table()
    assert table["format"] == kc.FORMAT and table["choices"]
    source = table["source"]
    assert source["gpu"] and source["date_utc"]
    assert os.path.isdir(os.path.join(ROOT, source["results"])), source["results"]  # committed with the table
    for entry in table["choices"]:
        # every choice is the fastest of the variants timed in its cell
        timed = {k: v for k, v in entry["seconds"].items() if v is not None}
        assert entry["variant"] == min(timed, key=timed.get)


def test_build_table_takes_the_fastest_variant_of_each_cell():
    table = kc.build_table([cell("triton", "bfloat16", 896, strided=0.5, grouped=0.3),
                            cell("triton", "bfloat16", 4096, strided=0.5, grouped=None),
                            cell("cuda", "float32", 4096, tiles=2.3, panels=1.6),
                            cell("cuda", "float32", 896, tiles=None, panels=None)],  # nothing ran: left out
                           {"gpu": "test"})
    got = [(e["backend"], e["dtype"], e["d"], e["variant"]) for e in table["choices"]]
    assert got == [("triton", "bfloat16", 896, "grouped"), ("triton", "bfloat16", 4096, "strided"),
                   ("cuda", "float32", 4096, "panels")]


def test_choose_takes_the_nearest_measured_d_on_a_log_scale():
    table = kc.build_table([cell("triton", "bfloat16", 896, strided=2.0, grouped=1.0),
                            cell("triton", "bfloat16", 4096, strided=1.0, grouped=2.0),
                            cell("triton", "float32", 4096, strided=2.0, grouped=1.0)], {"gpu": "test"})

    def pick(dtype, d):
        return kc.choose("pairwise_cosine_stats", "triton", dtype, d, table)

    assert pick(torch.bfloat16, 100) == "grouped" and pick(torch.bfloat16, 1500) == "grouped"
    assert pick(torch.bfloat16, 2000) == "strided" and pick(torch.bfloat16, 65536) == "strided"
    assert pick(torch.bfloat16, 1915) == "grouped"  # √(896·4096) = 1915.7: nearer 896 on a log scale
    assert pick(torch.float16, 896) == "grouped"  # no float16 entries: bfloat16's
    assert pick(torch.float32, 1) == "grouped"
    assert kc.choose("pairwise_cosine_stats", "cuda", torch.float32, 4096, table) == kc.DEFAULTS[
        ("pairwise_cosine_stats", "cuda")]  # nothing measured for cuda: the default


@pytest.mark.parametrize("change,match", [
    ({"format": "repcap_fast.kernel_choices/0"}, "format must be"),
    ({"choices": [{"op": "pairwise_cosine_stats", "backend": "triton", "dtype": "bfloat16", "d": 8,
                   "variant": "fastest"}]}, "names variant 'fastest'"),
    ({"choices": [{"op": "pairwise_cosine_stats", "backend": "cpu", "dtype": "bfloat16", "d": 8,
                   "variant": "tiles"}]}, "unknown op and backend"),
    ({"choices": [{"op": "pairwise_cosine_stats", "backend": "cuda", "dtype": "float64", "d": 8,
                   "variant": "tiles"}]}, "has dtype 'float64'"),
    ({"choices": [{"op": "pairwise_cosine_stats", "backend": "cuda", "dtype": "float32", "d": 0,
                   "variant": "tiles"}]}, "has d 0"),
])
def test_a_bad_table_is_refused_by_name(change, match):
    table = {"format": kc.FORMAT, "source": {}, "choices": [], **change}
    with pytest.raises(ValueError, match=match):
        kc.check_table(table, "test table")


def test_triton_auto_follows_the_table_and_the_variable_overrides_it(monkeypatch):
    pytest.importorskip("triton")
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    table = kc.build_table([cell("triton", "bfloat16", 896, strided=2.0, grouped=1.0),
                            cell("triton", "bfloat16", 8192, strided=1.0, grouped=2.0)], {"gpu": "test"})
    monkeypatch.setattr(kc, "packaged_table", lambda: table)
    monkeypatch.delenv(tk.KERNEL_ENV, raising=False)
    assert tk.kernel_variant(torch.bfloat16, 1024) == "grouped"
    assert tk.kernel_variant(torch.bfloat16, 8000) == "strided"
    monkeypatch.setenv(tk.KERNEL_ENV, "strided")
    assert tk.kernel_variant(torch.bfloat16, 1024) == "strided"


def test_the_table_and_the_benchmark_name_every_triton_variant(monkeypatch):
    """A variant the Triton launcher runs by name is one a table may choose, and one the GPU
    benchmark times (a column of its rows), and the other way round."""
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    assert kc.VARIANTS[("pairwise_cosine_stats", "triton")] == tk.KERNEL_VARIANTS
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    spec = importlib.util.spec_from_file_location("bench_cosine_stats_columns",
                                                  os.path.join(ROOT, "bench", "bench_cosine_stats.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for backend, columns in bench.CHOICE_COLUMNS.items():
        assert tuple(columns.values()) == kc.VARIANTS[("pairwise_cosine_stats", backend)]


def test_cuda_auto_follows_the_table_for_the_call(monkeypatch):
    """The C++ op reads REPCAP_CUDA_STATS_KERNEL: for a CUDA tensor with the variable unset or
    "auto", the launcher sets the table's choice for the call and restores it; a set variable
    wins, and CPU tensors are left alone."""
    from repcap_fast.ops import pairwise_cosine_stats as op

    table = kc.build_table([cell("cuda", "bfloat16", 4096, tiles=1.0, panels=0.5)], {"gpu": "test"})
    monkeypatch.setattr(kc, "packaged_table", lambda: table)
    fake = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=(10, 4096))
    for before in (None, "auto"):
        if before is None:
            monkeypatch.delenv(op.CUDA_KERNEL_ENV, raising=False)
        else:
            monkeypatch.setenv(op.CUDA_KERNEL_ENV, before)
        with op._cuda_kernel_variant(fake):
            assert os.environ[op.CUDA_KERNEL_ENV] == "panels"
        assert os.environ.get(op.CUDA_KERNEL_ENV) == before
    monkeypatch.setenv(op.CUDA_KERNEL_ENV, "tiles")
    with op._cuda_kernel_variant(fake):
        assert os.environ[op.CUDA_KERNEL_ENV] == "tiles"
    monkeypatch.delenv(op.CUDA_KERNEL_ENV)
    with op._cuda_kernel_variant(torch.zeros(3, 4096, dtype=torch.bfloat16)):
        assert op.CUDA_KERNEL_ENV not in os.environ


def test_the_gpu_benchmark_writes_a_table_auto_can_read(tmp_path, monkeypatch):
    """bench/bench_cosine_stats.py's rows → kernel_choices.json → a valid table choosing the
    fastest column of each backend."""
    monkeypatch.setenv("REPCAP_BENCH_OUT", str(tmp_path))
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    spec = importlib.util.spec_from_file_location("bench_cosine_stats_for_test",
                                                  os.path.join(ROOT, "bench", "bench_cosine_stats.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "OUT_DIR", str(tmp_path))
    rows = [{"d": 896, "dtype": "bfloat16", "cuda": 0.15, "cuda_panels": 0.09, "triton": 0.2, "triton_grouped": 0.25,
             "triton_grouped_tma": 0.3},
            {"d": 4096, "dtype": "float32", "cuda": 2.3, "cuda_panels": None, "triton": 0.9, "triton_grouped": 0.6,
             "triton_grouped_tma": 0.5}]
    # the rows as the GPU cells leave them in RESULTS, and the source each cell's rewrite records
    monkeypatch.setattr(bench, "RESULTS", {"cpu": {"seconds": 1.0}, "gpu_d896_bfloat16": rows[0],
                                           "gpu_d4096_float32": rows[1]})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "test GPU")
    assert bench.gpu_rows() == rows
    path = bench.write_kernel_choices(bench.gpu_rows(), bench.gpu_source())
    with open(path) as f:
        table = kc.check_table(json.load(f))
    got = {(e["backend"], e["dtype"], e["d"]): e["variant"] for e in table["choices"]}
    assert got == {("cuda", "bfloat16", 896): "panels", ("triton", "bfloat16", 896): "strided",
                   ("cuda", "float32", 4096): "tiles", ("triton", "float32", 4096): "grouped_tma"}
    assert table["source"]["gpu"] == "test GPU" and table["source"]["results"] == str(tmp_path)
