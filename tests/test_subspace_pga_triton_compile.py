"""The Triton kernels of subspace PGA (pair distances / sort keys, and the fused rank/correlation
pass) compiled ahead of time for sm_90 and sm_80, with a real launch's specialization (the
interpreter cannot catch constexpr or lowering failures)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import has_triton_nvidia_backend

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SHARED = {90: 227 * 1024, 80: 163 * 1024}
VARIANTS = [  # n ≥ 2^31 pairs at N = 65536: 64-bit size arguments
    ("distance", "fp32", "twice", 4096, 100, 90), ("distance", "fp32", "pair", 3, 1, 90),
    ("distance", "fp64", "dist", 1024, 64, 90), ("distance", "fp32", "twice", 1025, 17, 80),
    ("distance", "fp32", "twice", 65536, 100, 90),
    ("rank", "packed", "rhos", 4096, 90), ("rank", "packed", "ranks", 2, 90),
    ("rank", "fp64", "ranks", 1024, 80), ("rank", "fp64", "rhos", 65536, 80),
]

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not has_triton_nvidia_backend(), reason="triton has no NVIDIA backend here")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_kernel_compiles_for_gpu(variant):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "triton_aot_compile_pga.py"), *map(str, variant)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["shared_bytes"] <= MAX_SHARED[variant[-1]], result
