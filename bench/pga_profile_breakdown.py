"""Where the time of a PGA profile goes: the profile of bench/bench_pga.py (32 layers × CCR
{1, 5, 10}, N = 2048, d = 4096, k = 100, 100 nulls on a GPU; 20.18 s on the H200 of 2026-12-04)
run once under torch.profiler, its operators and kernels ranked by their own time.

Each subspace_pga call of a profile projects the layer on the readout basis and the nulls
(GEMMs), normalizes the rows, forms and sorts the pair-distance keys of every subspace (CUB
radix sorts), and correlates their ranks with the full space's; each layer's CCR directions are
found once for its three variants (a float64 decomposition). The table names which of these the
20 s is made of; the JSON keeps the top 40 rows by device time and by host time, and the wall time.

    python bench/pga_profile_breakdown.py out.json                     # on a GPU (bench/gpu_suite.sh)
    python bench/pga_profile_breakdown.py out.json --device cpu --layers 2 --n 256 --d 128 --k 16 --nulls 10
"""

import argparse
import json
import os
import sys
import time

import torch

from repcap_fast import pga


def layers_like_the_bench(n_layers: int, n: int, d: int, device: str):
    """bench_pga.run_profile's synthetic layers (H = G·M_l) and W_U, seeded the same way."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2 * d, d, generator=g).to(device)
    base = torch.randn(n, d, generator=g)
    hs = [(base @ (torch.eye(d) + torch.randn(d, d, generator=g) / d**0.5)).to(device) for _ in range(n_layers)]
    return hs, w


def _rows(averages, key, limit):
    rows = []
    for e in sorted(averages, key=lambda e: getattr(e, key, 0.0), reverse=True)[:limit]:
        rows.append({"name": e.key[:120], "calls": e.count,
                     "self_device_s": getattr(e, "self_device_time_total", 0.0) / 1e6,
                     "self_cpu_s": e.self_cpu_time_total / 1e6})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the JSON")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--d", type=int, default=4096)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--nulls", type=int, default=100)
    args = parser.parse_args(argv)
    hs, w = layers_like_the_bench(args.layers, args.n, args.d, args.device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    pga.clear_readout_cache()
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        out = pga.pga_profile(hs, w, k=args.k, n_null=args.nulls, ccrs=(1, 5, 10), seed=0, progress=False)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    averages = prof.key_averages()
    device_key = "self_device_time_total"
    result = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
              "layers": args.layers, "N": args.n, "d": args.d, "k": args.k, "n_null": args.nulls,
              "ccrs": [1, 5, 10], "wall_s_under_profiler": wall, "z_layer0_ccr1": float(out[1][0].z),
              "by_device_time": _rows(averages, device_key, 40),
              "by_host_time": _rows(averages, "self_cpu_time_total", 40)}
    sort_by = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(averages.table(sort_by=sort_by, row_limit=25, max_name_column_width=70))
    print(f"wall under the profiler: {wall:.2f} s")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
