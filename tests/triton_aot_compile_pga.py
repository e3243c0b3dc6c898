"""Compiles the Triton distance kernel of subspace PGA ahead of time for an NVIDIA target on a
machine without a GPU, with a real launch's argument specialization (see
tests/triton_aot_compile.py).

    python tests/triton_aot_compile_pga.py DTYPE N K [ARCH]      (DTYPE fp32|fp64)

Prints one JSON line. Run in a process without TRITON_INTERPRET.
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from repcap_fast.triton_kernels import subspace_pga as module  # noqa: E402
from triton_aot_compile import print_compiled  # noqa: E402


def main():
    dtype, n_tokens, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    arch = int(sys.argv[4]) if len(sys.argv) > 4 else 90
    fn = module._subspace_pga_distance_kernel
    block, block_k, num_warps, num_stages = module._config(interpreting=False)
    nb = triton.cdiv(n_tokens, block)
    ints = dict(n_tokens=n_tokens, n_pairs=n_tokens * (n_tokens - 1) // 2, n_tiles=nb * (nb + 1) // 2,
                n_col_tiles=nb, k=k, stride_ub=n_tokens * k, stride_ur=k)
    pointer = {"fp32": "*fp32", "fp64": "*fp64"}[dtype]
    constexprs = {"INPUT_PRECISION": "ieee", "BLOCK": block, "BLOCK_K": block_k}
    print_compiled(fn, ints, {"u_ptr": pointer, "dist_ptr": pointer}, constexprs, arch, num_warps, num_stages)


if __name__ == "__main__":
    main()
