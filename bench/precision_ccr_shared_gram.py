"""Could the CCR variants of a profile share one projected Gram per subspace? A study, not a kernel.

`pga_profile` runs CCR {1, 5, 10} of each layer as three independent kernel calls, each forming
its own projection and N×N Gram for every subspace Q (the kernels' GEMM, about 40% of a
subspace's time at N = 2048 on this CPU). The residuals differ by rank-m pieces:
x_m = x_10 + c_m·U_m' with U_m' the CCR directions m+1..10 and c_m = x_0·U_m'ᵀ, so with rows
scaled by one factor per token (1/‖x_10,i‖; cosines do not see it),

    P_m = P_10 + E,  E = c_m·(U_m'·Q)   (N×k, rank 10 − m)
    G_m = P_m·P_mᵀ = G_10 + a·c_mᵀ + c_m·aᵀ,  a = (P_10 + E/2)·(U_m'·Q)ᵀ   (a rank-2(10 − m) update)

and cos_m(i, j) = G_m(i, j)/sqrt(G_m(i, i)·G_m(j, j)). One projection and one Gram then serve
all three variants; CCR-5 and CCR-1 add updates of inner size 10 and 18, against k = 100.

This script measures, in float32 as the cpu kernel computes and against float64 (truth):
* the cosine error of both ways (direct: unit rows x̂_m, P = x̂_m·Q, rows normalized, Gram, as the
  kernels do; shared: the update above), max over the pairs, per CCR;
* ρ and z of each way against the float64 ρ and z, with the float64 full-space ranks;
* the GEMM multiply-adds per subspace of the three variants, and one thread's time for them,
  tiled as the cpu kernel tiles its Gram (`timed_gemms`).
On MiniLM's 7 layers (`hidden_states`, 1024 tokens), the readout subspace of its word embeddings
(k = 100) and NULLS null subspaces. Nothing here changes the kernels: the numbers are for deciding
whether to build it (it would give a profile other bits than three separate calls).

    python bench/precision_ccr_shared_gram.py        # about 5 minutes on 2 cores
Writes bench/results/precision_ccr_shared_gram_cpu.json (bench/_harness.py).
"""

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repcap_fast as rf  # noqa: E402
from repcap_fast import geometry, pga  # noqa: E402
from repcap_fast.reference import average_ranks, pearson  # noqa: E402

from _harness import format_table, write_results  # noqa: E402

N_TOKENS, K, NULLS, CCRS, BLOCK = 1024, 100, 20, (1, 5, 10), 10


def condensed(m: torch.Tensor) -> torch.Tensor:
    iu = torch.triu_indices(m.shape[0], m.shape[0], 1)
    return m[iu[0], iu[1]]


def unit32(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their norm (summed in float64, rounded to float32), as the kernels do."""
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=torch.float64).to(x.dtype)


def direct_cosines(x_m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The kernels' float32 way: unit rows (divided in float64), projection, unit rows, Gram."""
    u = (x_m / torch.linalg.vector_norm(x_m, dim=1, keepdim=True)).float()
    p = unit32(u @ q.float())
    return condensed(p @ p.T).double()


def shared_cosines(x10: torch.Tensor, c: torch.Tensor, dirs: torch.Tensor, q: torch.Tensor):
    """All CCRs from one projection and one Gram in float32: {m: condensed cosines}."""
    scale = 1.0 / torch.linalg.vector_norm(x10, dim=1, keepdim=True)
    p10 = (x10 * scale).float() @ q.float()
    cs = (c * scale).float()  # N×10
    dq = (dirs @ q).float()  # 10×k
    g10 = p10 @ p10.T
    out = {}
    for m in CCRS:
        if m == BLOCK:
            g = g10
        else:
            cm, dm = cs[:, m:], dq[m:]
            e = cm @ dm
            a = (p10 + 0.5 * e) @ dm.T
            g = g10 + (a @ cm.T + cm @ a.T)
        n = torch.sqrt(torch.diagonal(g)).clamp_min(torch.finfo(torch.float32).tiny)
        out[m] = condensed(g / n[:, None] / n[None, :]).double()
    return out


def rho(ref_ranks: torch.Tensor, cos: torch.Tensor) -> float:
    return pearson(ref_ranks, average_ranks((1.0 - cos).clamp(0.0, 2.0)))


def z_of(rhos):
    null = np.array(rhos[1:])
    return (rhos[0] - null.mean()) / null.std(ddof=1)


def gemm_macs(n: int, d: int, k: int):
    """Multiply-adds per subspace for CCR {1, 5, 10}: three projections and three symmetric Grams
    (half of N²k each), or one of each plus the rank-2(10 − m) updates (half of N²·2(10 − m))."""
    direct = 3 * (n * d * k + n * n * k // 2)
    updates = sum(n * (BLOCK - m) * k * 2 + n * n * 2 * (BLOCK - m) // 2 for m in CCRS if m < BLOCK)
    shared = n * d * k + n * BLOCK * d + n * n * k // 2 + updates
    return direct, shared


def timed_gemms(n: int, d: int, k: int, rounds: int = 7, tile: int = 256):
    """One thread's median seconds for the GEMMs of one subspace, CCR {1, 5, 10} together, formed
    as the cpu kernel forms its Gram: row tiles of `tile` × (the columns from the tile's first row
    on) into one reused buffer. Direct: three projections and three tiled Grams. Shared: one
    projection and one tiled Gram, and per tile the CCR-5 and CCR-1 tiles as that tile plus one
    GEMM of inner size 2(10 − m) ([a | c_m]·[c_m | a]ᵀ) into their own buffers. The two run
    alternately, so the machine's drift hits both."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, d, generator=g) for _ in CCRS]
    q = torch.linalg.qr(torch.randn(d, k, generator=g))[0]
    c = torch.randn(n, BLOCK, generator=g)
    dq = torch.randn(BLOCK, k, generator=g)
    bufs = [torch.empty(tile * n) for _ in CCRS]

    def tiles(p, out):
        for r0 in range(0, n - 1, tile):
            rows = min(tile, n - r0)
            torch.mm(p[r0 : r0 + rows], p[r0:].T, out=out[: rows * (n - r0)].view(rows, n - r0))

    def direct():
        for x in xs:
            tiles(x @ q, bufs[0])

    def shared():
        p = xs[-1] @ q
        lr = []
        for m in (5, 1):
            cm, dm = c[:, m:], dq[m:]
            a = (p + 0.5 * (cm @ dm)) @ dm.T
            lr.append((torch.cat([a, cm], dim=1), torch.cat([cm, a], dim=1)))
        for r0 in range(0, n - 1, tile):
            rows = min(tile, n - r0)
            cols = n - r0
            g10 = bufs[0][: rows * cols].view(rows, cols)
            torch.mm(p[r0 : r0 + rows], p[r0:].T, out=g10)
            for (left, right), buf in zip(lr, bufs[1:]):
                torch.addmm(g10, left[r0 : r0 + rows], right[r0:].T, out=buf[: rows * cols].view(rows, cols))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {"direct": [], "shared": []}
        direct(), shared()
        for _ in range(rounds):
            for name, f in (("direct", direct), ("shared", shared)):
                t = time.perf_counter()
                f()
                runs[name].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return {name: float(np.median(v)) for name, v in runs.items()}


def main():
    hs = rf.hidden_states("minilm", n_tokens=N_TOKENS, progress=False)
    w_u = rf.load_embeddings("minilm", which="input", dtype=torch.float32).input
    d = w_u.shape[1]
    readout = pga.readout_basis(w_u, K).basis.double()
    bases = torch.cat([readout[None], pga.grassmann_bases(d, K, NULLS, seed=0)])
    rows, per_layer = [], []
    for layer in sorted(hs):
        h = hs[layer].double()
        _, dirs, scale = geometry.center_and_ccr_unscaled(h, BLOCK)  # U: the top-10 directions (10×d)
        x0 = h / scale
        x0 = x0 - x0.mean(dim=0, keepdim=True)  # centered, as CCR's residuals are
        c = x0 @ dirs.T
        x_m = {m: x0 - c[:, :m] @ dirs[:m] for m in CCRS}
        units = {m: unit32(x_m[m]) for m in CCRS}
        ref = {m: average_ranks(condensed(1.0 - units[m] @ units[m].T).clamp(0.0, 2.0)) for m in CCRS}
        got = {m: {"f64": [], "direct": [], "shared": []} for m in CCRS}
        err = {m: {"direct": 0.0, "shared": 0.0} for m in CCRS}
        for q in bases:
            shared = shared_cosines(x_m[BLOCK], c, dirs, q)
            for m in CCRS:
                p64 = unit32(x_m[m] @ q)
                truth = condensed(p64 @ p64.T)
                direct = direct_cosines(x_m[m], q)
                err[m]["direct"] = max(err[m]["direct"], float((direct - truth).abs().max()))
                err[m]["shared"] = max(err[m]["shared"], float((shared[m] - truth).abs().max()))
                for name, cos in (("f64", truth), ("direct", direct), ("shared", shared[m])):
                    got[m][name].append(rho(ref[m], cos))
        for m in CCRS:
            r = got[m]
            z = {name: z_of(r[name]) for name in r}
            row = {"layer": layer, "ccr": m,
                   "cos_err_direct": err[m]["direct"], "cos_err_shared": err[m]["shared"],
                   "rho_err_direct": float(np.max(np.abs(np.subtract(r["direct"], r["f64"])))),
                   "rho_err_shared": float(np.max(np.abs(np.subtract(r["shared"], r["f64"])))),
                   "z_f64": z["f64"], "z_err_direct": z["direct"] - z["f64"], "z_err_shared": z["shared"] - z["f64"]}
            rows.append(row)
            print(row, flush=True)
        per_layer.append(layer)
    macs = {f"N={n}, d={dd}": dict(zip(("direct", "shared"), gemm_macs(n, dd, K))) for n, dd in
            ((1024, 384), (2048, 384), (2048, 576))}
    times = {f"N={n}, d={dd}": timed_gemms(n, dd, K) for n, dd in ((2048, 384), (2048, 576))}
    cols = [("layer", "layer"), ("ccr", "CCR"), ("cos_err_direct", "max |cos err| direct"),
            ("cos_err_shared", "shared"), ("rho_err_direct", "max |ρ err| direct"), ("rho_err_shared", "shared"),
            ("z_f64", "z (float64)"), ("z_err_direct", "z err direct"), ("z_err_shared", "z err shared")]
    lines = ["CCR {1, 5, 10} from one projected Gram per subspace (shared) or three (direct), float32, "
             f"against float64: MiniLM, {N_TOKENS} tokens, k = {K}, readout + {NULLS} nulls"]
    lines += format_table(cols, rows, {"layer": "d", "ccr": "d", "z_f64": ".3f", "z_err_direct": ".2e",
                                       "z_err_shared": ".2e"})
    lines.append("GEMM multiply-adds per subspace (CCR 1, 5, 10 together): " + "; ".join(
        f"{key}: direct {v['direct'] / 1e6:.0f}M, shared {v['shared'] / 1e6:.0f}M ({v['direct'] / v['shared']:.2f}x)"
        for key, v in macs.items()))
    lines.append("One thread, tiled as the cpu kernel, alternating, medians of 7: " + "; ".join(
        f"{key}: direct {v['direct'] * 1e3:.1f} ms, shared {v['shared'] * 1e3:.1f} ms" for key, v in times.items()))
    write_results("precision_ccr_shared_gram_cpu", {"rows": rows, "gemm_macs": macs, "gemm_seconds": times,
                                                     "settings": {"n_tokens": N_TOKENS, "k": K, "nulls": NULLS}},
                  lines)


if __name__ == "__main__":
    main()
