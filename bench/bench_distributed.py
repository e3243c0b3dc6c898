"""Benchmark of pairwise_cosine_stats across ranks (gloo on CPU; NCCL world size 1 on a GPU).

    python bench/bench_distributed.py                 # CPU: MiniLM 30522×384 on 1 rank and on 2 ranks
    python bench/bench_distributed.py --gpu-smoke     # GPU: NCCL, world size 1 (bench/gpu_suite.sh)

Each variant runs in fresh processes; the time is the call itself, after a barrier, the slowest
rank's. The 1-rank run uses all cores; each of N ranks gets cores/N threads, so on one machine the
ranks share the same cores and the comparison shows the cost of the split and the exchange.
Results: a table and JSON under bench/results/ (REPCAP_BENCH_OUT overrides).
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

OUT_DIR = os.environ.get("REPCAP_BENCH_OUT", os.path.join(os.path.dirname(__file__), "results"))


def _load(device="cpu"):
    if device.startswith("cuda"):  # the GPU machine has no model packages: a random bf16 matrix
        g = torch.Generator().manual_seed(0)
        return (torch.randn(65536, 1024, generator=g) + 0.1).to(torch.bfloat16)
    from repcap_fast.models import load_embeddings

    return load_embeddings("minilm").input.float().contiguous()


def _worker(rank, world, store, threads, backend, device, result_dir):
    torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    import repcap_fast as rf

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
    from repcap_fast.distributed import local

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
        import repcap_fast as rf

        torch.set_num_threads(cores)
        x = _load()
        one_process = rf.pairwise_cosine_stats(x, progress=False).epsilon()
        assert one_process == results["one_rank"]["epsilon"] == results["two_ranks"]["epsilon"]
    meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "cpu_count": cores,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "matrix": "random 65536x1024 bfloat16" if args.gpu_smoke else "MiniLM 30522x384 float32",
            "epsilon_one_process": one_process}
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"distributed_{tag}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    for name, r in results.items():
        if isinstance(r, dict):
            print(f"{name:<14} world={r['world']} threads/rank={r['threads_per_rank']} {r['seconds']:.3f} s "
                  f"(per rank {', '.join(f'{s:.3f}' for s in r['per_rank_seconds'])}) ε={r['epsilon']:.6f}")
        else:
            print(f"{name:<14} {r:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
