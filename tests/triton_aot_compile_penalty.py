"""Compiles the Triton kernels of gram_offdiag_penalty ahead of time for an NVIDIA target, on a
machine without a GPU, with exactly the arguments and specialization a real launch gives them.

The launcher runs on "meta" tensors with every kernel replaced by a recorder; each distinct
launch (kernel, argument specialization, constexprs, options) is then bound and compiled by
Triton's own binder (JITFunction.create_binder's path) for the chosen target. Catches what the
interpreter cannot: an integer argument equal to 1 becoming a constexpr, lowering errors,
shared-memory overuse.

    python tests/triton_aot_compile_penalty.py DTYPE K D WITH_GRAD PRECISION [ARCH]
        [--fused-max-d N] [--ptxas-info]

DTYPE fp32|fp64, WITH_GRAD 0|1, PRECISION ieee|tf32 (float32 matmul precision "highest"|"high").
--fused-max-d overrides FUSED_MAX_D (0 forces the panel path). --ptxas-info adds registers and
spill bytes per kernel (runs ptxas -v once more). Prints one JSON line. Run in a process without
TRITON_INTERPRET.
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(os.path.dirname(HERE), "triton_kernels", "gram_offdiag_penalty.py")
KERNELS = ["_gram_offdiag_forward_kernel", "_gram_offdiag_fused_kernel", "_gram_panel_kernel",
           "_panel_merge_kernel", "_panel_gemm_kernel"]


def load_module():
    """The package module when it is this checkout's file, else the file itself."""
    try:
        from repcap_fast.triton_kernels import gram_offdiag_penalty as module

        if os.path.samefile(module.__file__, SOURCE):
            return module
    except (ImportError, OSError):
        pass
    spec = importlib.util.spec_from_file_location("gram_offdiag_penalty_aot", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    def __init__(self, fn, calls):
        self.fn = fn
        self.calls = calls

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.calls.append((self.fn, grid, args, kwargs))
        return record


def ptxas_info(ptx, arch):
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path  # the ptxas Triton itself uses for this arch
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        proc = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    info = {} if proc.returncode == 0 else {"ptxas_error": out[-500:]}
    for key, pattern in (("regs", r"Used (\d+) registers"), ("spill_store_bytes", r"(\d+) bytes spill stores"),
                         ("spill_load_bytes", r"(\d+) bytes spill loads")):
        found = re.search(pattern, out)
        if found:
            info[key] = int(found.group(1))
    return info


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dtype", choices=["fp32", "fp64"])
    parser.add_argument("k", type=int)
    parser.add_argument("d", type=int)
    parser.add_argument("with_grad", type=int, choices=[0, 1])
    parser.add_argument("precision", choices=["ieee", "tf32"])
    parser.add_argument("arch", type=int, nargs="?", default=90)
    parser.add_argument("--fused-max-d", type=int, default=None)
    parser.add_argument("--ptxas-info", action="store_true")
    parser.add_argument("--p", type=int, default=20)
    args = parser.parse_args()

    module = load_module()
    dtype = {"fp32": torch.float32, "fp64": torch.float64}[args.dtype]
    torch.set_float32_matmul_precision("highest" if args.precision == "ieee" else "high")
    if args.fused_max_d is not None:
        module.FUSED_MAX_D = {torch.float32: args.fused_max_d, torch.float64: args.fused_max_d}
    calls = []
    for name in KERNELS:
        setattr(module, name, Recorder(getattr(module, name), calls))

    k, d = args.k, args.d
    meta = torch.device("meta")
    x = torch.empty((k, d), dtype=dtype, device=meta)
    row_max = torch.empty((k,), dtype=dtype, device=meta)
    row_sum = torch.empty((k,), dtype=torch.float64, device=meta)
    grad = torch.empty((k, d), dtype=dtype, device=meta) if args.with_grad else x.new_empty(0)
    module._launch(x, args.p, bool(args.with_grad), row_max, row_sum, grad, interpreting=False)

    target = GPUTarget("cuda", args.arch, 32)
    backend = make_backend(target)
    binders = {}
    seen = {}
    for fn, grid, call_args, kwargs in calls:
        kwargs = dict(kwargs)
        # As JITFunction.run does before binding.
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        if fn not in binders:
            binders[fn] = create_function_from_signature(fn.signature, fn.params, backend)
        bound_args, specialization, options = binders[fn](*call_args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization,
                                                              options)
        key = (fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items(), key=repr)),
               repr(sorted(attrs.items())), repr(options))
        seen.setdefault(key, (fn, grid, signature, constexprs, attrs, options))

    results = []
    for fn, grid, signature, constexprs, attrs, options in seen.values():
        start = time.time()
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                options=options.__dict__)
        entry = {"kernel": fn.__name__, "seconds": round(time.time() - start, 2),
                 "shared_bytes": kernel.metadata.shared, "grid": list(grid),
                 "num_warps": options.num_warps, "num_stages": options.num_stages,
                 "constexprs": {fn.arg_names[path[0]]: v for path, v in constexprs.items()
                                if isinstance(v, (int, str, bool))}}
        if args.ptxas_info:
            entry.update(ptxas_info(kernel.asm["ptx"], args.arch))
        results.append(entry)
    print(json.dumps({"ok": True, "arch": args.arch, "launches": len(calls), "kernels": results}))


if __name__ == "__main__":
    main()
