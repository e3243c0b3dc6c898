"""torch.distributed: the ops split across ranks (gloo, spawned from the tests, on CPU) give the
single-process result bitwise: pairwise cosine statistics (self pairs, A×B, more ranks than jobs)
and subspace PGA (the null subspaces split; exact, stream and torch); packing follows the
single-process trajectory; mismatched or invalid inputs on one rank are reported on every rank.

Every case of one world size runs in one spawned process group (CASES), one after the other with
a barrier between them; the tests then read their case's results. Only the sweep that kills a
rank spawns groups of its own.
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import repcap_fast as rf
from repcap_fast import packing, pga
from repcap_fast._backends import KERNELS
from repcap_fast.distributed import assign_units, contiguous_share, local, resolve_group, tensor_digest
from repcap_fast.ops import pairwise_cosine_stats as cosine_op

from _helpers import INTERPRETING

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
SMALL_JOBS = {"cpu": 64, "cuda": 64}  # many jobs from small inputs: the split is exercised
SWEEP_KS, SWEEP_DS = [12, 20, 28, 36], [3, 5]
SPLIT = ["self", "rect", "tiny", "epsilon", "pga", "pga_stream", "pga_torch", "pack", "pack64", "pack_tiny",
         "sharded"]
CASES = {
    2: SPLIT + ["pack_torch", "pack_bf16", "mismatch_shape", "mismatch_values", "pga_mismatch_seed", "pga_fail",
                "local", "nan_on_one_rank", "bad_k_for_pga_on_one_rank", "bins_on_one_rank", "sharded_bins_on_one_rank",
                "sharded_settings",
                "sharded_empty_block"] + (["pack_triton"] if INTERPRETING else []),
    3: SPLIT + ["sharded_drop", "sweep", "subgroup_pack", "subgroup_sharded"],
}
_UNDO = []  # (mapping, key, old value) patched by a case, restored after it


def _monkeypatch(mapping, key, value):
    _UNDO.append((mapping, key, mapping[key]))
    mapping[key] = value


def _matrix(rows, d, seed):
    return torch.randn(rows, d, generator=torch.Generator().manual_seed(seed)) + 0.1


def _stats_fields(s):
    return {"count": s.count, "sum": s.sum, "sum_sq": s.sum_sq, "min": s.min, "max": s.max, "below": s.below,
            "above": s.above, "hist": s.hist.clone(), "mean": s.mean, "std": s.std}


def _case(name, rank):
    if name == "self":
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(1001, 24, 0), bins=257, backend="cpu", progress=False))
    if name == "rect":
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(333, 24, 1), _matrix(517, 24, 2), bins=100,
                                                      range=(-0.5, 0.6), backend="cpu", progress=False))
    if name == "tiny":  # one job, more ranks than jobs
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(10, 4, 3), backend="cpu", progress=False))
    if name == "mismatch_shape":
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(100 + rank, 8, 4), backend="cpu", progress=False))
    if name == "mismatch_values":
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(100, 8, 5 + rank), backend="cpu", progress=False))
    if name.startswith("pga"):  # pga, pga_stream, pga_torch, pga_mismatch_seed, pga_fail
        if name == "pga_fail" and rank == 1:
            def broken(*args, **kwargs):
                raise MemoryError("simulated out-of-memory on this rank")

            _monkeypatch(KERNELS["subspace_pga"], "cpu", broken)

        g = torch.Generator().manual_seed(7)
        h = torch.randn(150, 16, generator=g, dtype=torch.float64) @ torch.randn(16, 16, generator=g,
                                                                                 dtype=torch.float64)
        w = torch.randn(40, 16, generator=g, dtype=torch.float64)
        method = "stream" if name == "pga_stream" else "exact"
        backend = "torch" if name == "pga_torch" else ("auto" if method == "stream" else "cpu")
        seed = rank if name == "pga_mismatch_seed" else 3
        r = pga.subspace_pga(h.float(), w, k=4, n_null=10, ccr=1, seed=seed, method=method, backend=backend,
                             batch=3, progress=False)
        return {"z": r.z, "rho_readout": r.rho_readout, "null_rhos": r.null_rhos, "null_std": r.null_std}
    if name.startswith("sweep"):  # sweep, sweep_kill (rank 1 dies after its first cell)
        out = os.environ["REPCAP_TEST_SWEEP_OUT"]
        done = []

        def on_cell(cell):
            done.append([cell["k"], cell["d"]])
            if name == "sweep_kill" and rank == 1:
                os._exit(17)  # a killed rank: no cleanup, no message

        cells = packing.sweep(SWEEP_KS, SWEEP_DS, out, steps=25, progress=False, on_cell=on_cell)
        return {"cells": cells, "ran": done}
    if name == "local":  # rank-dependent work inside distributed.local(): no collective, no mismatch error
        with local():
            return _stats_fields(rf.pairwise_cosine_stats(_matrix(50 + rank, 8, 8), backend="cpu", progress=False))
    if name.startswith("pack"):  # pack (float32), pack64, pack_tiny, pack_torch, pack_triton, pack_bf16
        dtype = torch.float64 if name == "pack64" else torch.float32
        k = 2 if name == "pack_tiny" else 45  # pack_tiny: fewer rows than ranks, one rank owns none
        backend = {"pack_torch": "torch", "pack_triton": "triton"}.get(name, "cpu")
        steps = 8 if name == "pack_triton" else 30  # the Triton interpreter is slow
        precision = "bf16" if name == "pack_bf16" else "highest"
        r = packing.optimize(k, 6, steps=steps, seed=2, dtype=dtype, backend=backend, precision=precision,
                             progress=False)
        return {"loss_history": r.loss_history, "eps_star": r.eps_star, "eps_star_init": r.eps_star_init,
                "mean": r.mean, "std": r.std, "loss_init": r.loss_init, "loss_final": r.loss_final}
    if name == "sharded":  # each rank passes only its row block
        full = _matrix(1001, 24, 0)
        mine = contiguous_share(1001, rank, dist.get_world_size())
        return _stats_fields(rf.pairwise_cosine_stats_sharded(full[mine.start : mine.stop], bins=257, backend="cpu",
                                                              progress=False))
    if name == "nan_on_one_rank":  # invalid input on rank 1 only: every rank raises, none waits
        a = _matrix(200, 8, 9)
        if rank == 1:
            a[5, 3] = float("nan")
        return _stats_fields(rf.pairwise_cosine_stats(a, backend="cpu", progress=False))
    if name == "bad_k_for_pga_on_one_rank":
        h = _matrix(60, 8, 10).double()
        return {"z": pga.subspace_pga(h, h, k=9 if rank == 1 else 3, n_null=4, backend="cpu", progress=False).z}
    if name == "sharded_empty_block":  # rank 1 holds no rows: valid (fewer rows than ranks)
        full = _matrix(300, 8, 11)
        return _stats_fields(rf.pairwise_cosine_stats_sharded(full[:0] if rank == 1 else full, progress=False))
    if name == "sharded_drop":  # blocks of 2, 1 and 9 rows, with zero rows dropped once per block
        full = _matrix(12, 5, 12)
        full[[0, 2]] = 0
        sizes = [(0, 2), (2, 3), (3, 12)][rank]
        return _stats_fields(rf.pairwise_cosine_stats_sharded(full[sizes[0] : sizes[1]], zero_rows="drop",
                                                              backend="cpu", progress=False))
    if name == "bins_on_one_rank":  # invalid settings on rank 1 only, found before any collective
        return _stats_fields(rf.pairwise_cosine_stats(_matrix(50, 4, 13), bins=0 if rank == 1 else 10, progress=False))
    if name == "sharded_bins_on_one_rank":  # past the kernels' limit on rank 1: refused before any collective
        full = _matrix(40, 4, 14)
        return _stats_fields(rf.pairwise_cosine_stats_sharded(full[rank * 20 : rank * 20 + 20], backend="cpu",
                                                              bins=(1 << 16) + 1 if rank else 10, progress=False))
    if name == "sharded_settings":
        full = _matrix(40, 4, 14)
        return _stats_fields(rf.pairwise_cosine_stats_sharded(full[rank * 20 : rank * 20 + 20],
                                                              range=(-0.2, 0.2) if rank else (-1, 1), progress=False))
    if name.startswith("subgroup"):  # world 3; ranks 1 and 2 form a group, rank 0 stays out
        sub = dist.new_group([1, 2])
        if rank == 0:
            return {"outside": True}
        if name == "subgroup_pack":
            r = packing.optimize(20, 4, steps=10, seed=1, backend="cpu", progress=False, group=sub)
            return {"loss_history": r.loss_history, "eps_star": r.eps_star}
        full = _matrix(301, 6, 15)
        part = full[:150] if rank == 1 else full[150:]
        return _stats_fields(rf.pairwise_cosine_stats_sharded(part, group=sub, backend="cpu", progress=False))
    if name == "epsilon":
        return {"eps": rf.epsilon(_matrix(700, 16, 6), method="stream", backend="cpu", progress=False)}
    raise KeyError(name)


def _run_case(name, rank):
    try:
        return _case(name, rank)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        while _UNDO:
            mapping, key, old = _UNDO.pop()
            mapping[key] = old


def _worker(rank, world, store, names, out_dir, env):
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=180))  # a hang fails instead of waiting 30 min
    try:
        cosine_op._JOB_ROWS = SMALL_JOBS
        for name in names:
            torch.save(_run_case(name, rank), os.path.join(out_dir, f"{name}.{rank}.pt"))
            dist.barrier()  # every rank is done with this case before the next one starts
    finally:
        dist.destroy_process_group()
    # Gloo's worker threads can abort the interpreter's own teardown (seen once in CI as SIGABRT,
    # "terminate called without an active exception"); the results are saved: leave at once.
    os._exit(0)


def run_distributed(names, world, out, env=None):
    """Runs the cases `names` one after the other in one spawned group of `world` ranks; returns
    {name: [result per rank]}."""
    os.makedirs(out, exist_ok=True)
    mp.spawn(_worker, args=(world, os.path.join(out, "store"), list(names), out, env or {}), nprocs=world, join=True)
    return {name: [torch.load(os.path.join(out, f"{name}.{r}.pt")) for r in range(world)] for name in names}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{world: {case: [result per rank]}}, each world size's cases run in one spawned group."""
    cache = {}

    def get(world):
        if world not in cache:
            out = tmp_path_factory.mktemp(f"world{world}")
            env = {"REPCAP_TEST_SWEEP_OUT": str(out / "sweep.json")}
            cache[world] = run_distributed(CASES[world], world, str(out), env)
            cache[world]["sweep_out"] = out / "sweep.json"
        return cache[world]

    return get


def assert_same(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, (key, got[key], value)  # bitwise: == on floats


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", ["self", "rect", "tiny", "epsilon", "pga", "pga_stream", "pga_torch"])
def test_split_across_ranks_is_bitwise_the_single_process_result(name, world, results, monkeypatch):
    monkeypatch.setattr(cosine_op, "_JOB_ROWS", SMALL_JOBS)
    want = _case(name, 0)
    for rank, got in enumerate(results(world)[name]):
        assert "error" not in got, (rank, got)
        assert_same(got, want)


@pytest.mark.parametrize("name,field", [("mismatch_shape", "shape_a"), ("mismatch_values", "A"),
                                        ("pga_mismatch_seed", "seed")])
def test_ranks_with_different_inputs_all_get_the_error(name, field, results):
    for got in results(2)[name]:
        assert "error" in got and got["error"].startswith("ValueError")
        assert "different inputs" in got["error"] and f"{field}: rank 0" in got["error"]


def test_assign_units_balances_and_is_deterministic():
    weights = [10, 1, 7, 7, 3, 0, 5]
    owner = assign_units(weights, 3)
    loads = [sum(w for w, o in zip(weights, owner) if o == r) for r in range(3)]
    # largest first to the least loaded: no rank is more than one unit's weight above another
    assert sum(loads) == 33 and max(loads) - min(loads) <= max(weights) and max(loads) <= 12
    assert owner == assign_units(weights, 3)
    assert assign_units([4, 2], 5) in ([0, 1], [1, 0])  # more ranks than units: the rest idle
    assert assign_units([], 2) == []


def test_not_distributed_by_default_and_digest():
    assert resolve_group(None) is None
    with pytest.raises(RuntimeError, match="not initialized"):
        resolve_group(object())
    a = torch.randn(5, 3)
    assert tensor_digest(a) == tensor_digest(a.clone()) != tensor_digest(a + 1e-7)
    assert tensor_digest(a.bfloat16()) != tensor_digest(a)


def test_a_failing_rank_stops_every_rank_with_its_error(results):
    for got in results(2)["pga_fail"]:
        assert got["error"].startswith("RankFailure: subspace_pga failed on rank 1 of 2: MemoryError: simulated")


def test_torchrun_epsilon_prints_once_and_matches_one_process(tmp_path):
    import json
    import subprocess
    import sys

    import numpy as np

    src = tmp_path / "e.npy"
    np.save(src, np.random.default_rng(0).standard_normal((9000, 16)).astype(np.float32))  # 2 CPU jobs
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "repcap_fast.cli", "epsilon", str(src), "--json", str(tmp_path / "two.json"),
                          "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("epsilon     ε") == 1  # rank 0 alone prints
    one = subprocess.run([sys.executable, "-m", "repcap_fast.cli", "epsilon", str(src), "--json",
                          str(tmp_path / "one.json"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert a["stream"] == b["stream"]


def test_commands_that_do_not_run_across_ranks_say_so(monkeypatch, capsys):
    from repcap_fast.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["fit", "nothing.json"]) == 2
    assert "does not run across ranks yet" in capsys.readouterr().err


def test_sweep_across_ranks_writes_the_single_process_file(tmp_path, results):
    single = tmp_path / "single.json"
    packing.sweep(SWEEP_KS, SWEEP_DS, str(single), steps=25, progress=False)
    got = results(3)
    assert got["sweep_out"].read_text() == single.read_text()
    ran = got["sweep"]
    assert sorted(tuple(c) for r in ran for c in r["ran"]) == sorted((k, d) for k in SWEEP_KS for d in SWEEP_DS)
    assert all(r["cells"] == ran[0]["cells"] for r in ran)
    assert not list(got["sweep_out"].parent.glob("sweep.json.part*"))


def test_killed_rank_then_resume_loses_no_finished_cell(tmp_path):
    single = tmp_path / "single.json"
    packing.sweep(SWEEP_KS, SWEEP_DS, str(single), steps=25, progress=False)
    out = tmp_path / "two.json"
    env = {"REPCAP_TEST_SWEEP_OUT": str(out)}
    with pytest.raises(mp.ProcessExitedException):  # rank 1 exits after its first cell; spawn stops rank 0 too
        run_distributed(["sweep_kill"], 2, str(tmp_path / "kill"), env)
    finished = [c for p in tmp_path.glob("two.json.part*") for c in packing.load_cells(str(p))]
    assert finished  # at least rank 1's first cell was written before it died
    resumed = run_distributed(["sweep"], 2, str(tmp_path / "resume"), env)["sweep"]
    ran = {tuple(c) for r in resumed for c in r["ran"]}
    assert not ran & {(c["k"], c["d"]) for c in finished}  # no finished cell ran again
    assert out.read_text() == single.read_text() and not list(tmp_path.glob("two.json.part*"))
    # a single process also picks up part files left by a cut-short distributed sweep
    mixed = tmp_path / "mixed.json"
    with pytest.raises(mp.ProcessExitedException):
        run_distributed(["sweep_kill"], 2, str(tmp_path / "kill2"), {"REPCAP_TEST_SWEEP_OUT": str(mixed)})
    packing.sweep(SWEEP_KS, SWEEP_DS, str(mixed), steps=25, progress=False)
    assert mixed.read_text() == single.read_text() and not list(tmp_path.glob("mixed.json.part*"))


def test_local_block_runs_each_rank_alone(results):
    for rank, got in enumerate(results(2)["local"]):
        assert "error" not in got and got["count"] == (50 + rank) * (49 + rank) // 2


@pytest.mark.parametrize("world,name,tol", [(2, "pack64", 1e-10), (2, "pack", 2e-5), (2, "pack_tiny", 2e-5),
                                            (2, "pack_torch", 2e-5), (2, "pack_bf16", 2e-5), (3, "pack64", 1e-10),
                                            (3, "pack", 2e-5), (3, "pack_tiny", 2e-5)]
                         + ([(2, "pack_triton", 2e-5)] if INTERPRETING else []))
def test_packing_across_ranks_follows_the_single_process_trajectory(world, name, tol, results):
    import numpy as np

    want = _case(name, 0)
    for got in results(world)[name]:
        assert "error" not in got, got
        assert got["eps_star_init"] == want["eps_star_init"]  # the same seeded start
        np.testing.assert_allclose(got["loss_history"], want["loss_history"], rtol=tol)
        assert got["eps_star"] == pytest.approx(want["eps_star"], rel=tol)
        assert got["loss_history"][-1] < 0.95 * got["loss_history"][0]  # it did optimize
        if name == "pack_bf16":  # the steps at bf16, the first loss the exact kernel's (the same start)
            assert got["loss_init"] == pytest.approx(_case("pack", 0)["loss_history"][0], rel=1e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_row_sharded_statistics_match_one_process(world, results, monkeypatch):
    monkeypatch.setattr(cosine_op, "_JOB_ROWS", SMALL_JOBS)
    want = _case("self", 0)
    for got in results(world)["sharded"]:
        assert "error" not in got, got
        assert got["count"] == want["count"] == 1001 * 1000 // 2
        # other tiles give a pair's float32 dot product other last bits: 5e-12 in μ was seen here
        assert got["mean"] == pytest.approx(want["mean"], abs=1e-9)
        assert got["std"] == pytest.approx(want["std"], rel=1e-8)
        assert got["min"] == pytest.approx(want["min"], abs=1e-6) and got["max"] == pytest.approx(want["max"], abs=1e-6)
        assert int((got["hist"] - want["hist"]).abs().sum()) <= 1e-4 * want["count"]  # edge-rounding only
        assert got["below"] + got["above"] + int(got["hist"].sum()) == got["count"]


INVALID = "the input on rank 1 of 2 is invalid: ValueError: "


@pytest.mark.parametrize("name,text", [("nan_on_one_rank", INVALID + "A contains"),
                                       ("bad_k_for_pga_on_one_rank", INVALID + "k"),
                                       ("bins_on_one_rank", INVALID + "bins"),
                                       ("sharded_bins_on_one_rank", INVALID + "bins"),
                                       ("sharded_settings", "(range: rank 0 (-1.0, 1.0), rank 1 (-0.2, 0.2))")])
def test_invalid_input_on_one_rank_stops_every_rank(name, text, results):
    for got in results(2)[name]:
        assert "error" in got and text in got["error"], got


def test_row_sharded_blocks_may_be_empty_or_lose_zero_rows(results):
    full = _matrix(300, 8, 11)
    want = rf.pairwise_cosine_stats(full, progress=False)
    for got in results(2)["sharded_empty_block"]:
        assert "error" not in got, got
        assert got["count"] == want.count and int((got["hist"] - want.hist).abs().sum()) <= 2
    full = _matrix(12, 5, 12)
    full[[0, 2]] = 0
    want = rf.pairwise_cosine_stats(full, zero_rows="drop", backend="cpu", progress=False)
    for got in results(3)["sharded_drop"]:
        assert "error" not in got, got
        assert got["count"] == want.count == 45 and got["mean"] == pytest.approx(want.mean, abs=1e-7)  # float32 pairs


def test_subgroups_use_their_own_ranks(results):
    want_pack = packing.optimize(20, 4, steps=10, seed=1, backend="cpu", progress=False)
    got = results(3)["subgroup_pack"]
    assert got[0] == {"outside": True}
    for r in got[1:]:
        assert "error" not in r, r
        assert r["loss_history"] == pytest.approx(want_pack.loss_history, rel=2e-5)
    want = rf.pairwise_cosine_stats(_matrix(301, 6, 15), backend="cpu", progress=False)
    for r in results(3)["subgroup_sharded"][1:]:
        assert "error" not in r, r
        assert r["count"] == want.count and r["mean"] == pytest.approx(want.mean, abs=1e-9)
