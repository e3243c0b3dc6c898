"""Benchmark of subspace_pga: the fused CPU kernel (and method="stream") against a plain loop
over scipy.stats.spearmanr (with scipy's pdist), against the naive torch pipeline a user would
write (`naive_torch`: fixed, sharing none of our helpers) and against the float64 torch
reference, in one run, as ratios, with peak extra memory (fresh process per variant). The kernel
is timed warm (the readout basis and the null draws kept, as in a profile or a loop over layers)
and cold (both forgotten before every call). On a GPU: the cuda and triton backends against the naive
pipeline and the torch per-subspace loop on the same GPU.

    python -m pytest bench/bench_pga.py -s              # CPU: N=1024, d=512, k=64, 100 nulls
    python -m pytest bench/bench_pga.py -s -k gpu       # GPU: N=4096, d=4096, k=100, 100 nulls

Results: a table printed last and JSON under bench/results/ (bench/_harness.py).
"""


import numpy as np
import pytest
import torch

from repcap_fast import pga

from _harness import (
    HAS_CUDA,
    SMOKE,
    emit,
    format_table,
    fresh_process_peak,
    mib,
    ratio,
    timed,
    write_results,
)

N, D, K, NULLS = (256, 128, 16, 20) if SMOKE else (1024, 512, 64, 100)
RESULTS = {}


def make_inputs():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=g) @ (torch.randn(D, D, generator=g) / D**0.5)
    w = torch.randn(4 * D, D, generator=g)
    return h, w


def scipy_loop(h, w):
    """What a user writes with SciPy: CCR-1, then pdist + spearmanr per subspace."""
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    x = h.double().numpy()
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x - x @ vt[:1].T @ vt[:1]
    basis = pga.readout_basis(w, K).basis.numpy()
    nulls = pga.grassmann_bases(D, K, NULLS, seed=0).numpy()
    full = pdist(x, "cosine")
    rho = lambda b: spearmanr(full, pdist(x @ b, "cosine")).statistic  # noqa: E731
    null = np.array([rho(b) for b in nulls])
    return (rho(basis) - null.mean()) / null.std(ddof=1)


def naive_torch(h, w, k, n_null, nulls=None):
    """What a user writes in plain torch, fixed on purpose (it shares none of repcap_fast's
    helpers): CCR-1 by torch.linalg.svd, the readout by a full SVD of W_U, null bases by QR of
    Gaussians (its own draws unless `nulls` is given), and per subspace: projection, the N×N
    cosine distances, the upper triangle, argsort ranks with ties averaged, Pearson of ranks.
    float64 throughout, on h's device."""
    x = h.double()
    x = x - x.mean(0)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    x = x - (x @ vh[:1].T) @ vh[:1]
    _, _, vw = torch.linalg.svd(w.double(), full_matrices=False)
    readout = vw[:k].T
    if nulls is None:
        g = torch.Generator().manual_seed(0)
        nulls = []
        for _ in range(n_null):
            q, r = torch.linalg.qr(torch.randn(x.shape[1], k, dtype=torch.float64, generator=g))
            nulls.append((q * torch.sign(torch.diagonal(r))).to(x.device))
    rows, cols = torch.triu_indices(x.shape[0], x.shape[0], 1, device=x.device)

    def distances(y):
        y = y / y.norm(dim=1, keepdim=True)
        return (1.0 - y @ y.T)[rows, cols]

    def ranks(v):  # 1-based, ties get their average rank
        order = torch.argsort(v)
        _, inverse, counts = torch.unique_consecutive(v[order], return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).double()
        out = torch.empty_like(v)
        out[order] = (ends - (counts.double() - 1.0) / 2.0)[inverse]
        return out

    def spearman(a, b):
        ra, rb = ranks(a), ranks(b)
        ra, rb = ra - ra.mean(), rb - rb.mean()
        return float(ra @ rb / (ra.norm() * rb.norm()))

    full = distances(x)
    rho_readout = spearman(full, distances(x @ readout))
    null = np.array([spearman(full, distances(x @ b.to(x.device, torch.float64))) for b in nulls])
    return (rho_readout - null.mean()) / null.std(ddof=1)


def run(variant, h, w):
    if variant == "scipy_loop":
        return scipy_loop(h, w)
    if variant == "naive_torch":
        return naive_torch(h, w, K, NULLS)
    if variant == "cpu_kernel_cold":
        pga.clear_readout_cache()
    if variant == "cpu_stream":
        return pga.subspace_pga(h, w, k=K, n_null=NULLS, ccr=1, seed=0, method="stream", progress=False).z
    backend = {"cpu_kernel": "cpu", "cpu_kernel_cold": "cpu", "torch_reference": "torch"}[variant]
    return pga.subspace_pga(h, w, k=K, n_null=NULLS, ccr=1, seed=0, backend=backend, progress=False).z


def memory(variant):
    return fresh_process_peak("import bench_pga as b\nh, w = b.make_inputs()", f"b.run({variant!r}, h, w)")


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


def test_naive_torch_computes_our_z_on_our_null_subspaces(inputs):
    """The naive pipeline is a fair baseline: on the same null subspaces it gives the same z."""
    h, w = inputs
    ours = pga.subspace_pga(h, w, k=K, n_null=NULLS, ccr=1, seed=0, backend="torch", progress=False).z
    naive = naive_torch(h, w, K, NULLS, nulls=pga.grassmann_bases(D, K, NULLS, seed=0))
    assert abs(naive - ours) < 1e-6 * max(1.0, abs(ours)), (naive, ours)


@pytest.mark.parametrize("variant", ["cpu_kernel", "cpu_kernel_cold", "cpu_stream", "torch_reference", "naive_torch",
                                     "scipy_loop"])
def test_cpu(benchmark, inputs, variant):
    h, w = inputs
    out = []
    rounds = 3 if variant.startswith("cpu_kernel") else 1
    row = timed(lambda: run(variant, h, w), rounds, benchmark=benchmark, outputs=out)
    z = float(out[0])
    if variant == "naive_torch":  # its own null draws: z agrees to sampling noise only (checked above on ours)
        RESULTS[variant] = {**row, "z": z, **memory(variant)}
        return
    for other, res in RESULTS.items():  # every variant computes the same z
        if other == "naive_torch":
            continue
        assert abs(res["z"] - z) < 1e-4 * max(1.0, abs(z)), (variant, other, z, res["z"])
    if variant == "cpu_stream" and "cpu_kernel" in RESULTS:
        RESULTS["cpu_kernel"]["z_stream_minus_exact"] = z - RESULTS["cpu_kernel"]["z"]
    RESULTS[variant] = {**row, "z": z, **memory(variant)}


GPU_RESULTS = {}
GPU_N, GPU_D, GPU_K = (1024, 512, 64) if SMOKE else (4096, 4096, 100)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("backend", ["cuda", "cuda_cold", "triton", "torch", "stream", "naive_torch"])
def test_gpu(benchmark, backend):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(GPU_N, GPU_D, generator=g) @ (torch.randn(GPU_D, GPU_D, generator=g) / GPU_D**0.5)).cuda()
    w = torch.randn(2 * GPU_D, GPU_D, generator=g).cuda()
    method, name = ("stream", "auto") if backend == "stream" else ("exact", backend.replace("_cold", ""))

    def once():
        if backend == "naive_torch":
            return naive_torch(h, w, GPU_K, NULLS)
        if backend == "cuda_cold":
            pga.clear_readout_cache()
        return pga.subspace_pga(h, w, k=GPU_K, n_null=NULLS, ccr=1, seed=0, backend=name, method=method,
                                progress=False).z

    out = []
    row = timed(once, 1 if backend in ("torch", "stream", "naive_torch") else 3, benchmark=benchmark, outputs=out,
                gpu_peak=True)
    GPU_RESULTS[backend] = {**row, "z": float(out[0])}
    if backend == "cuda":
        GPU_RESULTS[backend]["setup_seconds"] = gpu_setup_seconds(h, w)
    emit(GPU_RESULTS[backend], f"pga gpu {backend}")


PROFILE = {"cpu": (4, 512, 256, 32, 50) if not SMOKE else (2, 128, 64, 8, 10),
           "cuda": (32, 2048, 4096, 100, 100) if not SMOKE else (4, 512, 1024, 32, 20)}  # layers, N, d, k, nulls
PROFILE_RESULTS = {}


def run_profile(device):
    """pga_profile over synthetic layers (each H = G·M_l with Gaussian G and a layer's own
    mixing M_l), CCR {1, 5, 10}, from an uncached W_U: the whole profile a user runs."""
    layers, n_tokens, d, k, nulls = PROFILE[device]
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2 * d, d, generator=g).to(device)
    base = torch.randn(n_tokens, d, generator=g)
    hs = [(base @ (torch.eye(d) + torch.randn(d, d, generator=g) / d**0.5)).to(device) for _ in range(layers)]
    pga.clear_readout_cache()
    out = pga.pga_profile(hs, w, k=k, n_null=nulls, ccrs=(1, 5, 10), seed=0, progress=False)
    return float(out[1][0].z)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device")])])
def test_profile(benchmark, device):
    out = []
    row = timed(lambda: run_profile(device), 1, benchmark=benchmark, outputs=out, warmup=False,
                **({"device": "cuda", "gpu_peak": True} if device == "cuda" else {}))
    layers, n_tokens, d, k, nulls = PROFILE[device]
    PROFILE_RESULTS[device] = {**row, "layers": layers, "N": n_tokens, "d": d, "k": k, "n_null": nulls,
                               "ccrs": [1, 5, 10], "z_layer0_ccr1": out[0]}
    emit(PROFILE_RESULTS[device], f"pga profile {device}")


def _uncached_readout(w, solver):
    pga.clear_readout_cache()
    return pga.readout_basis(w, GPU_K, solver=solver)


def gpu_setup_seconds(h, w):
    """The parts of one GPU call that are not the kernels: the readout basis uncached (the d×d
    Gram, then the solver auto picks, and eigh for comparison), CCR-1 (xᵀx and its top
    directions) and the Grassmann draws; and which solver auto used."""
    out = {name: timed(fn, 1, device="cuda")["seconds"]
           for name, fn in (("readout_basis", lambda: _uncached_readout(w, "auto")),
                            ("readout_basis_eigh", lambda: _uncached_readout(w, "eigh")),
                            ("center_and_ccr", lambda: pga.center_and_ccr(h, 1)),
                            ("grassmann_bases", lambda: pga.grassmann_bases(GPU_D, GPU_K, NULLS, 0, device="cuda")))}
    out["readout_solver"] = _uncached_readout(w, "auto").solver
    return out


def _table(results, baselines):
    rows = [{"variant": name, **r, "peak_mib": mib(r.get("peak_extra_bytes"))} for name, r in results.items()]
    return format_table([("variant", "variant"), ("seconds", "seconds"), ("z", "z"), ("peak_mib", "peak extra MiB")],
                        rows, {"seconds": ".3f", "z": ".6f", "peak_mib": ".0f"}) + \
        [f"{name}: {value:.1f}x" for name, value in baselines.items()]


def teardown_module(module):
    if PROFILE_RESULTS:
        lines = [f"pga_profile {dev}: {r['layers']} layers x CCR {{1, 5, 10}}, N={r['N']}, d={r['d']}, k={r['k']}, "
                 f"{r['n_null']} nulls: {r['seconds']:.2f} s" for dev, r in PROFILE_RESULTS.items()]
        write_results("pga_profile", {"op": "pga_profile", "results": PROFILE_RESULTS}, lines)
    if GPU_RESULTS:
        ratios = {f"{base}_over_{name}": ratio(GPU_RESULTS.get(key, {}).get("seconds"),
                                               GPU_RESULTS.get(name, {}).get("seconds"))
                  for base, key in (("torch_loop", "torch"), ("naive_torch", "naive_torch"))
                  for name in ("cuda", "cuda_cold", "triton")}
        ratios = {key: value for key, value in ratios.items() if value is not None}
        lines = [f"subspace_pga gpu: N={GPU_N}, d={GPU_D}, k={GPU_K}, {NULLS} nulls", *_table(GPU_RESULTS, ratios)]
        if "setup_seconds" in GPU_RESULTS.get("cuda", {}):
            lines.append("cuda call, non-kernel parts: " + ", ".join(
                f"{k} {v:.3f} s" if isinstance(v, float) else f"{k}: {v}"
                for k, v in GPU_RESULTS["cuda"]["setup_seconds"].items()))
        write_results("pga_gpu", {"op": "subspace_pga", "N": GPU_N, "d": GPU_D, "k": GPU_K, "n_null": NULLS,
                                  "results": GPU_RESULTS, "ratios": ratios}, lines)
    if RESULTS:
        kernel = RESULTS.get("cpu_kernel", {}).get("seconds")
        ratios = {f"{other}_over_cpu_kernel": ratio(RESULTS[other]["seconds"], kernel)
                  for other in ("scipy_loop", "naive_torch", "torch_reference", "cpu_stream", "cpu_kernel_cold")
                  if other in RESULTS and kernel}
        cold = RESULTS.get("cpu_kernel_cold", {}).get("seconds")
        if cold:
            ratios.update({f"{other}_over_cpu_kernel_cold": ratio(RESULTS[other]["seconds"], cold)
                           for other in ("scipy_loop", "naive_torch") if other in RESULTS})
        lines = [f"subspace_pga cpu: N={N}, d={D}, k={K}, {NULLS} nulls", *_table(RESULTS, ratios)]
        write_results("pga_cpu", {"op": "subspace_pga (CCR-1, readout + nulls)", "N": N, "d": D, "k": K,
                                  "n_null": NULLS, "results": RESULTS, "ratios": ratios}, lines)
