"""Where the GPU time goes, for the next round of kernel work (GPU only; about 40 s on an H200).

    python bench/gpu_diagnostics.py [OUT.json]

Each line is one measurement, printed as it lands and saved as JSON:
- pairwise_cosine_stats at V = 65,536: each backend with the default histogram and with one bin
  (the cost of the histogram epilogue), the Triton kernel under other tile configurations, and the
  bare GEMMs (all V×V tiles, upper-triangle tiles only);
- gram_offdiag_penalty at k = 32,768, d = 4096: the cuda kernel and torch autograd with TF32 off and on;
- subspace_pga at N = d = 4096, k = 100, 100 nulls: each stage of one cuda call on its own.
"""

import json
import os
import sys

import torch

import repcap_fast as rf
from repcap_fast import pga
from repcap_fast._backends import cublas_precision
from repcap_fast.reference import gram_offdiag_penalty_reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import machine, timed  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results", "gpu_diagnostics.json")
ROWS = []


def seconds(fn, repeats=3):
    return timed(fn, repeats, device="cuda")["seconds"]


def emit(**row):
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(OUT)), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"machine": machine(), "rows": ROWS}, f, indent=1)


def gemms(x, upper):
    """The bare GEMMs of the pairs, in 8192-row panels: all V×V tiles, or the upper triangle's."""
    v = x.shape[0]
    out = torch.empty(8192, v, dtype=x.dtype, device=x.device)
    for r0 in range(0, v, 8192):
        c0 = r0 if upper else 0
        torch.mm(x[r0 : r0 + 8192], x[c0:].T, out=out[:, : v - c0])


def fixed_tile_config(default, tile):
    """A stand-in for triton_kernels.pairwise_cosine_stats._config, called as it is called
    (dtype, interp, split=False): `tile` for the one-pass kernel, the default for the split pass.
    (The lambda it replaces took `split` as its tile, and every configuration failed on 12-04 with
    "cannot unpack non-iterable bool object"; tests/test_bench_scripts.py runs it on the CPU.)"""

    def config(dtype, interp, split=False):
        return default(dtype, interp, split) if split else tile

    return config


def cosine_stats():
    from repcap_fast.triton_kernels import pairwise_cosine_stats as tk

    v = 65536
    for d, dtype in ((896, torch.bfloat16), (4096, torch.bfloat16), (4096, torch.float32)):
        x = (torch.randn(v, d, device="cuda") + 0.2).to(dtype)
        tag = dict(op="pairwise_cosine_stats", v=v, d=d, dtype=str(dtype).replace("torch.", ""))
        emit(**tag, what="gemm_full", seconds=seconds(lambda: gemms(x, False)))
        emit(**tag, what="gemm_upper_row_panels", seconds=seconds(lambda: gemms(x, True)))
        # Every variant at 4096 bins and at 1 (every pair's count on one address): 12-04 found
        # triton (then `strided`, one global atomic per pair) 3.6x slower at 1 bin.
        for backend, env, variants in (("cuda", "REPCAP_CUDA_STATS_KERNEL", ("tiles", "panels")),
                                       ("triton", tk.KERNEL_ENV, ("strided", "grouped", "grouped_tma"))):
            for variant in variants:
                os.environ[env] = variant
                for bins in (4096, 1):
                    what = f"{backend}_{variant}_bins{bins}"
                    try:
                        t = seconds(lambda: rf.pairwise_cosine_stats(x, bins=bins, backend=backend, progress=False))
                        emit(**tag, what=what, seconds=t)
                    except Exception as exc:  # noqa: BLE001 - a diagnostic reports and goes on
                        emit(**tag, what=what, error=str(exc)[:300])
                os.environ.pop(env)
        if dtype == torch.float32:
            continue
        default = tk._config
        for block, block_k, warps, stages in ((128, 64, 4, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 4),
                                              (256, 64, 8, 3)):
            tk._config = fixed_tile_config(default, (block, block_k, warps, stages))
            try:
                t = seconds(lambda: rf.pairwise_cosine_stats(x, backend="triton", progress=False), repeats=2)
                emit(**tag, what=f"triton_cfg_{block}_{block_k}_{warps}_{stages}", seconds=t)
            except Exception as exc:  # noqa: BLE001
                emit(**tag, what=f"triton_cfg_{block}_{block_k}_{warps}_{stages}", error=str(exc)[:300])
            finally:
                tk._config = default
        x = None  # freed before the next size is drawn
        torch.cuda.empty_cache()


def penalty():
    k, d, p = 32768, 4096, 8
    x = torch.randn(k, d, device="cuda").requires_grad_(True)
    tag = dict(op="gram_offdiag_penalty", k=k, d=d, p=p)

    def step(fn):
        x.grad = None
        fn().backward()

    for precision in ("highest", "tf32"):
        emit(**tag, what="cuda", precision=precision, seconds=seconds(
            lambda: step(lambda: rf.gram_offdiag_penalty(x, p, backend="cuda", precision=precision))))
        with cublas_precision(precision, x.device):
            emit(**tag, what="torch_autograd", precision=precision, seconds=seconds(
                lambda: step(lambda: gram_offdiag_penalty_reference(x, p))))


def subspace():
    n, d, k, nulls = 4096, 4096, 100, 100
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(n, d, generator=g) @ (torch.randn(d, d, generator=g) / d**0.5)).cuda()
    w = torch.randn(2 * d, d, generator=g).cuda()
    tag = dict(op="subspace_pga", n=n, d=d, k=k, nulls=nulls)
    emit(**tag, what="readout_basis", seconds=seconds(lambda: pga.readout_basis(w, k)))
    emit(**tag, what="center_and_ccr", seconds=seconds(lambda: pga.center_and_ccr(h, 1)))
    emit(**tag, what="grassmann_bases", seconds=seconds(lambda: pga.grassmann_bases(d, k, nulls, 0, device="cuda")))
    bases = pga.grassmann_bases(d, k, nulls, 0, device="cuda").float()
    hc = pga.center_and_ccr(h, 1).H.float().contiguous()
    ranks = torch.ops.repcap_fast.subspace_pga_ranks(hc)
    emit(**tag, what="ranks_full_space", seconds=seconds(lambda: torch.ops.repcap_fast.subspace_pga_ranks(hc)))
    for batch in (8, 32, 100):
        emit(**tag, what=f"rhos_kernel_batch{batch}", seconds=seconds(
            lambda: [torch.ops.repcap_fast.subspace_pga_rhos(hc, bases[i : i + batch], ranks)
                     for i in range(0, nulls, batch)]))
    emit(**tag, what="subspace_pga_cuda_total", seconds=seconds(
        lambda: pga.subspace_pga(h, w, k=k, n_null=nulls, ccr=1, seed=0, backend="cuda", progress=False)))


if __name__ == "__main__":
    for section in (subspace, penalty, cosine_stats):
        try:
            section()
        except Exception as exc:  # noqa: BLE001
            emit(op=section.__name__, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        torch.cuda.empty_cache()
    print(f"wrote {OUT}")
