"""Where the time of the cuda `panels` variant of pairwise_cosine_stats goes, and what the bytes and
FLOPs predict for it.

`panels` forms the upper triangle of V×V dot products as 8192 × 8192 float32 panels, one cuBLAS
GEMM each (csrc/pairwise_cosine_stats_ops.cpp), then reduces each panel with one kernel launch
(csrc/cuda/pairwise_cosine_stats_panels_cuda.cu: cosine, float64 Σc and Σc², min, max, and a
shared-memory histogram with one atomic per pair). On the H200 of 2026-12-04 it took 1.08–1.12×
a full V×d×V GEMM at bf16 (V = 151,936, d = 3584–8192), where half a GEMM is its floor.

Timed with CUDA events on the same panels (median of --repeat runs each):
    gemms          the panel GEMMs alone (at::mm into the same 256 MB scratch, same shapes)
    panels         the whole op (REPCAP_CUDA_STATS_KERNEL=panels) with REPCAP_CUDA_PANELS_OVERLAP=0
                   (GEMMs and reductions in turn on one stream), at bins 4096, 1 and 65,536 (1 bin:
                   every pair's atomic on one address, the worst contention; 65,536: past the
                   shared-histogram limit, global int64 atomics)
    overlapped     the whole op as shipped: each panel's reduction on a side stream under the
                   next panel's GEMM (bins 4096)
    read           one read of every panel's bytes (a float32 sum of the scratch per panel):
                   the memory floor of the reduction
    reduction      panels − gemms (the reduction kernels and the scratch round trip)
The prediction (printed first, also with --predict-only on a CPU): the GEMMs at the measured
full-GEMM rate, the scratch traffic (8 B per pair of the panels: written, read) at the device's
memory bandwidth, and the reduction's arithmetic.

    python bench/panels_breakdown.py out.json                 # on a GPU (part of bench/gpu_suite.sh)
    python bench/panels_breakdown.py out.json --predict-only  # the prediction for an H200
"""

import argparse
import json
import os
import statistics
import sys

import torch

PANEL = 8192  # kPanel of csrc/pairwise_cosine_stats_ops.cpp
H200 = {"name": "NVIDIA H200 (nominal)", "bf16_dense_flops": 989e12, "hbm_bytes_per_s": 4.8e12, "sms": 132,
        "clock_hz": 1.98e9}


def panel_shapes(v: int, panel: int = PANEL):
    """(rows, cols) of every panel of the upper triangle, as the launcher loops over them."""
    shapes = []
    for row0 in range(0, v, panel):
        rows = min(panel, v - row0)
        for col0 in range(row0, v, panel):
            shapes.append((rows, min(panel, v - col0)))
    return shapes


def predict(v: int, d: int, gemm_flops_per_s: float, bytes_per_s: float, elem_bytes: int = 2) -> dict:
    """Seconds of each part from the bytes and the FLOPs."""
    shapes = panel_shapes(v)
    gemm_flops = sum(2.0 * r * c * d for r, c in shapes)
    pairs_formed = sum(r * c for r, c in shapes)
    full_gemm_flops = 2.0 * v * v * d
    traffic = 8.0 * pairs_formed + sum((r + c) * d * elem_bytes for r, c in shapes)  # scratch w+r, operands
    return {"panels": len(shapes), "pairs_formed": pairs_formed, "pairs_kept": v * (v - 1) // 2,
            "gemm_flops": gemm_flops, "gemm_fraction_of_full": gemm_flops / full_gemm_flops,
            "gemm_s": gemm_flops / gemm_flops_per_s, "full_gemm_s": full_gemm_flops / gemm_flops_per_s,
            "traffic_bytes": traffic, "traffic_s": traffic / bytes_per_s,
            "predicted_s": gemm_flops / gemm_flops_per_s + traffic / bytes_per_s}


def _events_median(fn, repeat):
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times)


def measure(v: int, d: int, dtype: torch.dtype, repeat: int) -> dict:
    import repcap_fast as rf

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(v, d, device="cuda", dtype=dtype, generator=g)
    scratch = torch.empty(PANEL * PANEL, device="cuda", dtype=torch.float32)
    shapes = panel_shapes(v)

    def mm_into(a, b, out):
        """float32 dot products into out, as the launcher's at::mm_out(out, a, b, kFloat)."""
        if dtype == torch.float32:
            return torch.mm(a, b, out=out)
        try:
            return torch.mm(a, b, out_dtype=torch.float32, out=out)
        except (TypeError, RuntimeError):  # a torch without mm's out_dtype with out=: one allocation more
            return out.copy_(torch.mm(a, b, out_dtype=torch.float32))

    def gemms():
        for row0 in range(0, v, PANEL):
            rows = min(PANEL, v - row0)
            for col0 in range(row0, v, PANEL):
                cols = min(PANEL, v - col0)
                mm_into(x[row0:row0 + rows], x[col0:col0 + cols].T, scratch[: rows * cols].view(rows, cols))

    def read():
        for r, c in shapes:
            scratch[: r * c].sum()

    def full_gemm():
        torch.mm(x, x.T[:, :PANEL])  # one panel column; scaled to the full GEMM below

    os.environ["REPCAP_CUDA_STATS_KERNEL"] = "panels"
    out = {"v": v, "d": d, "dtype": str(dtype).replace("torch.", ""), "repeat": repeat}
    gemms()
    read()
    torch.cuda.synchronize()
    out["gemms_s"] = _events_median(gemms, repeat)
    out["read_s"] = _events_median(read, repeat)
    out["full_gemm_s"] = _events_median(full_gemm, repeat) * v / PANEL
    for overlap in ("0", "1"):
        os.environ["REPCAP_CUDA_PANELS_OVERLAP"] = overlap
        for bins in (4096, 1, 65536) if overlap == "0" else (4096,):
            rf.pairwise_cosine_stats(x[:PANEL], backend="cuda", bins=bins, progress=False)  # warm
            key = f"panels_bins{bins}_s" if overlap == "0" else "panels_overlapped_s"
            out[key] = _events_median(
                lambda b=bins: rf.pairwise_cosine_stats(x, backend="cuda", bins=b, progress=False), repeat)
    os.environ.pop("REPCAP_CUDA_PANELS_OVERLAP")
    out["reduction_s"] = out["panels_bins4096_s"] - out["gemms_s"]
    out["gemm_rate_flops_per_s"] = 2.0 * v * v * d / out["full_gemm_s"]
    out["read_bytes_per_s"] = 4.0 * sum(r * c for r, c in shapes) / out["read_s"]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the JSON")
    parser.add_argument("--v", type=int, default=151_936)
    parser.add_argument("--d", type=int, nargs="+", default=[896, 4096])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--predict-only", action="store_true", help="no GPU: the prediction for an H200")
    args = parser.parse_args(argv)
    rows = []
    for d in args.d:
        row = {"nominal": predict(args.v, d, 0.72 * H200["bf16_dense_flops"], 0.8 * H200["hbm_bytes_per_s"])}
        if not args.predict_only:
            m = measure(args.v, d, torch.bfloat16, args.repeat)
            row["measured"] = m
            row["from_measured_rates"] = predict(args.v, d, m["gemm_rate_flops_per_s"], m["read_bytes_per_s"])
        rows.append(row)
        p = row["nominal"]
        print(f"d={d}: {p['panels']} panels, GEMMs {p['gemm_fraction_of_full']:.3f} of the full GEMM; "
              f"predicted (H200 at 72% of peak bf16, 80% of HBM) GEMMs {p['gemm_s']:.3f} s + scratch "
              f"{p['traffic_s']:.3f} s = {p['predicted_s']:.3f} s (full GEMM {p['full_gemm_s']:.3f} s)", flush=True)
        if "measured" in row:
            m = row["measured"]
            print(f"  measured: gemms {m['gemms_s']:.3f} s, read {m['read_s']:.3f} s, "
                  f"full GEMM {m['full_gemm_s']:.3f} s, "
                  f"panels {m['panels_bins4096_s']:.3f} s (bins 1: {m['panels_bins1_s']:.3f}, "
                  f"65536: {m['panels_bins65536_s']:.3f}), reduction {m['reduction_s']:.3f} s, "
                  f"overlapped {m['panels_overlapped_s']:.3f} s", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   "nominal": H200, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
