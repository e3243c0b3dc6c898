"""The Triton kernels of gram_offdiag_penalty compiled ahead of time for sm_90 (and sm_80) on this
CPU-only machine, with the specialization a real launch gives them (the launcher itself runs on
meta tensors and its launches are recorded). The interpreter cannot catch these failures: an
argument equal to 1 becoming a constexpr, lowering errors, shared-memory overuse."""

import json
import os
import subprocess
import sys

import pytest

from conftest import has_triton_nvidia_backend

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SHARED = {90: 227 * 1024, 80: 163 * 1024}  # dynamic shared memory per block, H100/H200, A100

FORWARD = {"_gram_offdiag_forward_kernel"}
FUSED = {"_gram_offdiag_fused_kernel"}
PANEL = {"_gram_panel_kernel", "_panel_merge_kernel", "_panel_gemm_kernel"}

VARIANTS = [
    # dtype, k, d, with_grad, precision, arch, p, fused_max_d (None: the module's), kernels
    ("fp32", 1, 1, 1, "ieee", 90, 2, None, FUSED),  # every size argument is 1 (and p-1 = 1)
    ("fp64", 1, 1, 0, "ieee", 90, 1, None, FORWARD),  # every size argument is 1 (and p = 1)
    ("fp32", 1, 1, 1, "ieee", 90, 2, 0, PANEL),  # every size argument is 1, panel path
    ("fp32", 262144, 4096, 0, "ieee", 90, 20, None, FORWARD),
    ("fp32", 262144, 4096, 1, "ieee", 90, 20, None, PANEL),
    ("fp64", 32768, 4096, 0, "ieee", 90, 20, None, FORWARD),
    ("fp64", 32768, 4096, 1, "ieee", 90, 20, None, PANEL),
    ("fp32", 5000, 300, 1, "ieee", 90, 3, None, PANEL),  # d not a multiple of 16
    ("fp32", 4099, 256, 1, "ieee", 90, 8, None, FUSED),  # the largest fused tile
    ("fp32", 97, 64, 1, "ieee", 90, 8, None, FUSED),
    ("fp64", 4099, 128, 1, "ieee", 90, 8, None, FUSED),
    ("fp64", 1025, 300, 1, "ieee", 90, 8, None, PANEL),
    ("fp32", 32768, 4096, 1, "tf32", 90, 20, None, PANEL),
    ("fp32", 32768, 4096, 0, "tf32", 90, 20, None, FORWARD),
    ("fp32", 4099, 256, 1, "tf32", 90, 8, None, FUSED),
    ("fp32", 32768, 4096, 1, "ieee", 80, 20, None, PANEL),
    ("fp32", 4099, 256, 1, "tf32", 80, 8, None, FUSED),
    ("fp64", 4099, 128, 1, "ieee", 80, 8, None, FUSED),
]


triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not has_triton_nvidia_backend(), reason="triton has no NVIDIA backend here")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v[:8])))
def test_gram_offdiag_penalty_kernels_compile_for_gpu(variant):
    dtype, k, d, with_grad, precision, arch, p, fused_max_d, kernels = variant
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cmd = [sys.executable, os.path.join(HERE, "triton_aot_compile_penalty.py"),
           dtype, str(k), str(d), str(with_grad), precision, str(arch), "--p", str(p)]
    if fused_max_d is not None:
        cmd += ["--fused-max-d", str(fused_max_d)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"]
    assert {entry["kernel"] for entry in result["kernels"]} == kernels, result
    for entry in result["kernels"]:
        assert entry["shared_bytes"] <= MAX_SHARED[arch], entry
