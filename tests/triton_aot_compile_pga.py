"""Compiles the Triton distance kernel of subspace PGA ahead of time for an NVIDIA target on a
machine without a GPU, with a real launch's argument specialization (see
tests/triton_aot_compile.py).

    python tests/triton_aot_compile_pga.py DTYPE N K [ARCH]      (DTYPE fp32|fp64)

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

from repcap_fast.triton_kernels import subspace_pga as module  # noqa: E402
from triton_aot_compile import specialize  # noqa: E402


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
    no_spec = {fn.arg_names[i] if isinstance(i, int) else i for i in (fn.do_not_specialize or ())}
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
        else:
            signature[name] = pointer
            attrs[(i,)] = [["tt.divisibility", 16]]
    start = time.time()
    kernel = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    print(json.dumps({"ok": True, "seconds": round(time.time() - start, 2),
                      "shared_bytes": kernel.metadata.shared, "arch": arch}))


if __name__ == "__main__":
    main()
