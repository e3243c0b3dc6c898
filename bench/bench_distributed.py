"""Benchmark of pairwise_cosine_stats across ranks (gloo on CPU; NCCL world size 1 on a GPU).

    python bench/bench_distributed.py                 # CPU: MiniLM 30522×384 on 1 rank and on 2 ranks
    python bench/bench_distributed.py --gpu-smoke     # GPU: NCCL, world size 1 (bench/gpu_suite.sh)

Each variant runs in fresh processes; the time is the call itself, after a barrier, the slowest
rank's. The 1-rank run uses all cores; each of N ranks gets cores/N threads, so on one machine the
ranks share the same cores and the comparison shows the cost of the split and the exchange.
Results: a table and JSON under bench/results/ (bench/_harness.py).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import repcap_fast as rf
from repcap_fast.distributed import local

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import format_table, write_results  # noqa: E402


def _load(device="cpu"):
    if device.startswith("cuda"):  # the GPU machine has no model packages: a random bf16 matrix
        g = torch.Generator().manual_seed(0)
        return (torch.randn(65536, 1024, generator=g) + 0.1).to(torch.bfloat16)
    from repcap_fast.models import load_embeddings

    return load_embeddings("minilm").input.float().contiguous()


def _worker(rank, world, store, threads, backend, device, result_dir):
    torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    x = _load(device)
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
        x = x.cuda()
    group = dist.group.WORLD  # explicit, so that world size 1 takes the distributed path too
    rf.pairwise_cosine_stats(x[:2048], progress=False, group=group)  # warm-up (kernels, allocator)
    dist.barrier()
    t0 = time.perf_counter()
    stats = rf.pairwise_cosine_stats(x, progress=False, group=group)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    with local():  # the same call without the process group
        alone = rf.pairwise_cosine_stats(x, progress=False)
    with open(os.path.join(result_dir, f"{rank}.json"), "w") as f:
        json.dump({"seconds": seconds, "epsilon": stats.epsilon(), "count": stats.count, "backend": stats.backend,
                   "same_as_one_process": alone.to_dict() == stats.to_dict()}, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # the results are written; skip an interpreter teardown that gloo threads can abort


def run(world, threads, backend="gloo", device="cpu"):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), threads, backend, device, tmp), nprocs=world)
        rows = [json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(world)]
    assert all(r["epsilon"] == rows[0]["epsilon"] and r["same_as_one_process"] for r in rows), rows
    return {"world": world, "threads_per_rank": threads, "seconds": max(r["seconds"] for r in rows),
            "per_rank_seconds": [r["seconds"] for r in rows], "epsilon": rows[0]["epsilon"],
            "count": rows[0]["count"], "backend": rows[0]["backend"], "process_group": backend,
            "bitwise_same_as_one_process": True}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu-smoke", action="store_true", help="NCCL, world size 1, on cuda:0")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.gpu_smoke:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device")
        results = {"nccl_world1": run(1, cores, "nccl", "cuda")}
        tag = "gpu_nccl_smoke"
    else:
        results = {"one_rank": run(1, cores), "two_ranks": run(2, max(1, cores // 2))}
        results["two_over_one"] = results["two_ranks"]["seconds"] / results["one_rank"]["seconds"]
        tag = "cpu"
    one_process = None
    if not args.gpu_smoke:
        torch.set_num_threads(cores)
        one_process = rf.pairwise_cosine_stats(_load(), progress=False).epsilon()
        assert one_process == results["one_rank"]["epsilon"] == results["two_ranks"]["epsilon"]
    rows = [{"variant": name, **r, "per_rank": ", ".join(f"{s:.3f}" for s in r["per_rank_seconds"])}
            for name, r in results.items() if isinstance(r, dict)]
    lines = format_table([("variant", "variant"), ("world", "ranks"), ("threads_per_rank", "threads/rank"),
                          ("seconds", "seconds"), ("per_rank", "per rank"), ("epsilon", "ε")], rows,
                         {"seconds": ".3f", "epsilon": ".6f"})
    if "two_over_one" in results:
        lines.append(f"two ranks / one rank: {results['two_over_one']:.3f}")
    write_results(f"distributed_{tag}", {
        "op": "pairwise_cosine_stats across ranks", "epsilon_one_process": one_process, "results": results,
        "matrix": "random 65536x1024 bfloat16" if args.gpu_smoke else "MiniLM 30522x384 float32"}, lines)


if __name__ == "__main__":
    main()
