"""Compiles the Triton kernels of subspace PGA ahead of time for an NVIDIA target on a machine
without a GPU, with a real launch's argument specialization (see tests/triton_aot_compile.py).

    python tests/triton_aot_compile_pga.py distance DTYPE OUT N K [ARCH]   (DTYPE fp32|fp64,
        OUT dist|pair|twice: the distances themselves, or packed int64 keys with the pair index
        or twice the reference rank in the low word)
    python tests/triton_aot_compile_pga.py rank KEYS OP N [ARCH]           (KEYS packed|fp64,
        OP rhos|ranks: the fused rank/correlation kernel)

Prints one JSON line. Run in a process without TRITON_INTERPRET.
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from repcap_fast.triton_kernels import subspace_pga as module  # noqa: E402
from triton_aot_compile import print_compiled  # noqa: E402

OUT_MODES = {"dist": module._OUT_DIST, "pair": module._OUT_PAIR, "twice": module._OUT_TWICE}


def distance(dtype, out, n_tokens, k, arch):
    fn = module._subspace_pga_distance_kernel
    block, block_k, num_warps, num_stages = module._config(interpreting=False)
    nb = triton.cdiv(n_tokens, block)
    ints = dict(n_tokens=n_tokens, n_pairs=n_tokens * (n_tokens - 1) // 2, n_tiles=nb * (nb + 1) // 2,
                n_col_tiles=nb, k=k, stride_ub=n_tokens * k, stride_ur=k)
    pointer = {"fp32": "*fp32", "fp64": "*fp64"}[dtype]
    pointers = {"u_ptr": pointer, "dist_ptr": pointer if out == "dist" else "*i64", "twice_ptr": "*i32"}
    constexprs = {"OUT_MODE": OUT_MODES[out], "INPUT_PRECISION": "ieee", "BLOCK": block, "BLOCK_K": block_k}
    print_compiled(fn, ints, pointers, constexprs, arch, num_warps, num_stages)


def rank(keys, op, n_tokens, arch):
    fn = module._subspace_pga_rank_kernel
    block, num_warps = module._rank_config(interpreting=False)
    n = n_tokens * (n_tokens - 1) // 2
    ints = dict(n_pairs=n, n_iter=n.bit_length() + 1)
    pointers = {"sorted_ptr": "*i64" if keys == "packed" else "*fp64", "order_ptr": "*i64", "twice_ptr": "*i32",
                "ranks_ptr": "*fp64", "partial_ptr": "*fp64"}
    constexprs = {"PACKED": keys == "packed", "RANKS": op == "ranks", "BLOCK": block,
                  "BLOCK_STEPS": block.bit_length()}
    print_compiled(fn, ints, pointers, constexprs, arch, num_warps, 1)


def main():
    kind, args = sys.argv[1], sys.argv[2:]
    if kind == "distance":
        dtype, out, n_tokens, k = args[0], args[1], int(args[2]), int(args[3])
        distance(dtype, out, n_tokens, k, int(args[4]) if len(args) > 4 else 90)
    elif kind == "rank":
        keys, op, n_tokens = args[0], args[1], int(args[2])
        rank(keys, op, n_tokens, int(args[3]) if len(args) > 3 else 90)
    else:
        raise SystemExit(f"unknown kernel {kind!r} (distance|rank)")


if __name__ == "__main__":
    main()
