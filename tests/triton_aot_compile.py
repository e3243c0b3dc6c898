"""Compiles the Triton kernel of pairwise_cosine_stats ahead of time for an NVIDIA target, on a
machine without a GPU, with the argument specialization a launch would give it (an integer
argument equal to 1 becomes a constexpr unless listed in do_not_specialize; multiples of 16 get
the divisibility hint). Catches what the interpreter cannot: typing of specialized arguments,
lowering, shared memory.

    python tests/triton_aot_compile.py DTYPE SELF_PAIRS M N D BINS PRECISION [ARCH]

Prints one JSON line. Run in a process without TRITON_INTERPRET.
"""

import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from repcap_fast.triton_kernels import pairwise_cosine_stats as module  # noqa: E402


def specialize(value, specialize_it):
    if specialize_it and value == 1:
        return "constexpr", 1, None
    ty = "i32" if -(2**31) <= value < 2**31 else "i64"
    return ty, None, ([["tt.divisibility", 16]] if specialize_it and value % 16 == 0 else None)


def main():
    dtype, self_pairs, m, n, d, bins, precision = sys.argv[1:8]
    arch = int(sys.argv[8]) if len(sys.argv) > 8 else 90
    self_pairs = self_pairs == "1"
    m, n, d, bins = int(m), int(n), int(d), int(bins)
    fn = module._pairwise_cosine_stats_kernel
    torch_dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    import torch

    block, block_k, num_warps, num_stages = module._config(getattr(torch, torch_dtype), interpreting=False)
    row_tiles = triton.cdiv(m, block)
    col_tiles = triton.cdiv(n, block)
    n_tiles = row_tiles * (row_tiles + 1) // 2 if self_pairs else row_tiles * col_tiles
    programs = max(1, min(n_tiles, 4 * 132))
    ints = dict(m=m, n=n, d=d, stride_a=d, stride_b=d, n_tiles=n_tiles, n_col_tiles=col_tiles,
                tiles_per_program=triton.cdiv(n_tiles, programs), bins=bins)
    pointer = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}[dtype]
    pointers = {"a_ptr": pointer, "b_ptr": pointer, "sum_ptr": "*fp64", "sum_sq_ptr": "*fp64",
                "outside_ptr": "*i64", "hist_ptr": "*i64", "min_ptr": "*fp32", "max_ptr": "*fp32",
                "a_inv_ptr": "*fp32", "b_inv_ptr": "*fp32"}
    constexprs = {"SELF_PAIRS": self_pairs, "UPCAST": False,
                  "INPUT_PRECISION": precision if dtype == "fp32" else "tf32",
                  "BLOCK_M": block, "BLOCK_N": block, "BLOCK_K": block_k}
    print_compiled(fn, ints, pointers, constexprs, arch, num_warps, num_stages, other="fp32")


def compile_kernel(fn, ints, pointers, constexprs, arch, num_warps, num_stages, other="fp32"):
    """Compiles `fn` for an NVIDIA target with a real launch's specialization: `ints` (integer
    arguments: specialized unless in do_not_specialize), `pointers` (name -> "*fp32"...; the
    rest get the type `other`), `constexprs`. Returns the compiled kernel and the seconds taken."""
    constexprs = dict(constexprs)
    no_spec = set(getattr(fn, "do_not_specialize", ()) or ())
    no_spec = {fn.arg_names[i] if isinstance(i, int) else i for i in no_spec}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ints:
            ty, value, attr = specialize(ints[name], name not in no_spec)
            signature[name] = ty
            if ty == "constexpr":
                constexprs[name] = value
            if attr:
                attrs[(i,)] = attr
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = other
    start = time.time()
    kernel = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    return kernel, time.time() - start


def print_compiled(fn, ints, pointers, constexprs, arch, num_warps, num_stages, other="fp32"):
    kernel, seconds = compile_kernel(fn, ints, pointers, constexprs, arch, num_warps, num_stages, other)
    print(json.dumps({"ok": True, "seconds": round(seconds, 2),
                      "shared_bytes": kernel.metadata.shared, "arch": arch}))


if __name__ == "__main__":
    main()
