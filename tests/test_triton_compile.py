"""Every Triton kernel compiled ahead of time for sm_90 (and sm_80) on this CPU-only machine, with
the specialization a real launch gives it (tests/triton_aot.py records the launchers' launches on
meta tensors). The interpreter cannot catch these failures: an argument equal to 1 becoming a
constexpr, lowering errors, shared-memory overuse. CI runs this file with the Triton that torch
2.11 ships (3.6, the GPU machine's) as well as with the newest."""

import json
import os
import subprocess
import sys

import pytest

from _helpers import has_triton_nvidia_backend

HERE = os.path.dirname(os.path.abspath(__file__))
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not has_triton_nvidia_backend(), reason="triton has no NVIDIA backend here")
from triton_aot import MAX_SHARED, PENALTY_KERNELS, VARIANTS, variant_id  # noqa: E402  (after the skips)

WORKERS = max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def compiled():
    """{variant id: result}, from WORKERS harness processes run side by side (each variant once)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    shares = [VARIANTS[i::WORKERS] for i in range(WORKERS)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "triton_aot.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for share in shares if share]
    results = {}
    for proc, share in zip(procs, shares):
        out, err = proc.communicate(json.dumps(share), timeout=900)
        assert proc.returncode == 0, err[-3000:]
        for line in out.strip().splitlines():
            result = json.loads(line)
            results[result["id"]] = result
    return results


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_triton_kernels_compile_for_gpu(variant, compiled):
    result = compiled[variant_id(variant)]
    assert result["ok"], result.get("error")
    names = {entry["kernel"] for entry in result["kernels"]}
    grouped = variant.get("variant") in ("grouped", "grouped_tma")
    want = {"pairwise_cosine_stats": {"_pairwise_cosine_stats_grouped_kernel" if grouped
                                      else "_pairwise_cosine_stats_kernel"},
            "subspace_pga": {"_subspace_pga_distance_kernel", "_subspace_pga_rank_kernel"},
            "gram_offdiag_penalty": PENALTY_KERNELS[variant.get("kernels", "panel")],
            "grassmann_normals": {"_grassmann_normals_kernel"}}[variant["op"]]
    assert names == want, result
    for entry in result["kernels"]:
        assert entry["shared_bytes"] <= MAX_SHARED[variant["arch"]], entry
    if variant["op"] == "pairwise_cosine_stats" and variant["dtype"] in ("bf16", "fp16"):
        # 16-bit inputs: the tiles run on the tensor cores (Hopper's wgmma on sm_90)
        unit = "wgmma" if variant["arch"] == 90 else "mma"
        assert all(entry["mma"] == [f"{unit}:{variant['dtype'].replace('fp16', 'f16')}"]
                   for entry in result["kernels"]), result
    if variant["op"] == "pairwise_cosine_stats" and variant["dtype"] == "fp32":
        # float32: at "highest" the split pass's three float16 products on the tensor cores (or
        # float32 FMA when fp32_pass is "ieee"), at "tf32" TF32 tensor cores
        unit = "wgmma" if variant["arch"] == 90 else "mma"
        want_mma = ({"split": [f"{unit}:f16"], "ieee": []}[variant.get("fp32_pass", "split")]
                    if variant["precision"] == "highest" else [f"{unit}:tf32"])
        assert all(entry["mma"] == want_mma for entry in result["kernels"]), result
        if want_mma == ["wgmma:f16"]:
            # the split pass's step products start a fresh accumulator (a wgmma from zero), added
            # to the running dot products afterwards, rather than one accumulator over all of d
            assert all(entry["fresh_accumulators"] >= 1 for entry in result["kernels"]), result
    if variant["op"] == "pairwise_cosine_stats" and variant["dtype"] == "bf16" and variant["arch"] == 90 \
            and variant["d"] >= 256:
        # the check can fail: one accumulator over d (a single K step would start from zero)
        assert all(entry["fresh_accumulators"] == 0 for entry in result["kernels"]), result
    if variant["op"] == "pairwise_cosine_stats":
        # grouped_tma reads its operands by TMA copies (four per step for the split pass: its high
        # and low parts of both blocks; two otherwise), and no other variant does
        copies = (4 if variant["dtype"] == "fp32" and variant["precision"] == "highest" else 2) \
            if variant.get("variant") == "grouped_tma" else 0
        assert all(entry["tma_loads"] >= copies and (entry["tma_loads"] == 0) == (copies == 0)
                   for entry in result["kernels"]), result
    if variant["op"] == "gram_offdiag_penalty" and variant["dtype"] == "fp32":
        # The dots run on the tensor cores the precision names (bf16: operands cast to bfloat16;
        # Hopper's wgmma on sm_90), and on FMA at "highest".
        unit = "wgmma" if variant["arch"] == 90 else "mma"
        want_mma = {"highest": [], "tf32": [f"{unit}:tf32"], "bf16": [f"{unit}:bf16"]}[variant["precision"]]
        for entry in result["kernels"]:
            assert entry["mma"] == ([] if entry["kernel"] == "_panel_merge_kernel" else want_mma), entry
