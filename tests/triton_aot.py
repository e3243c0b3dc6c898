"""Compiles every Triton kernel of repcap_fast ahead of time for an NVIDIA target, on a machine
without a GPU, with exactly the arguments and specialization a real launch gives them.

Each variant runs its op's Triton launcher (its `_launch` part, which only launches) on "meta"
tensors with every kernel replaced by a recorder; each distinct recorded launch (kernel, argument
specialization, constexprs, options) is then bound and compiled by Triton's own binder
(JITFunction.create_binder's path) for the variant's architecture. This catches what the
interpreter cannot: an integer argument equal to 1 becoming a constexpr, lowering errors,
shared-memory overuse, register spills (--ptxas-info).

    python tests/triton_aot.py [--ptxas-info] < variants.json     # a JSON list of variants
    python tests/triton_aot.py --list                              # the variants of the tests

Prints one JSON line per variant: {"id", "ok", "kernels": [{"kernel", "shared_bytes", ...}], or
"error"}. Runs without TRITON_INTERPRET (removed here); identical launches compile once.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

if __name__ == "__main__":  # before triton is imported (the tests import this file for VARIANTS only)
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402  (after the environment is set)

META = torch.device("meta")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_SHARED = {90: 227 * 1024, 80: 163 * 1024}  # dynamic shared memory per block: H100/H200, A100
SMS = 132  # the H100/H200 SM count the GPU launcher would see

# Every variant: op, arguments, arch, and the kernels its launch must run.
VARIANTS = [
    # pairwise_cosine_stats: dtype, self pairs, m, n, d, bins, precision
    {"op": "pairwise_cosine_stats", "dtype": "bf16", "self": True, "m": 2, "n": 2, "d": 1, "bins": 4096,
     "precision": "highest", "arch": 90},  # every size argument is 1
    {"op": "pairwise_cosine_stats", "dtype": "bf16", "self": True, "m": 151936, "n": 151936, "d": 4096, "bins": 4096,
     "precision": "highest", "arch": 90},
    {"op": "pairwise_cosine_stats", "dtype": "fp16", "self": False, "m": 65, "n": 1, "d": 384, "bins": 4096,
     "precision": "highest", "arch": 90},
    {"op": "pairwise_cosine_stats", "dtype": "fp32", "self": True, "m": 1025, "n": 1025, "d": 33, "bins": 4096,
     "precision": "highest", "arch": 90},
    # float32 at "highest": the split pass (the default) at full size, and the float32 FMA pass
    {"op": "pairwise_cosine_stats", "dtype": "fp32", "self": True, "m": 151936, "n": 151936, "d": 4096,
     "bins": 4096, "precision": "highest", "arch": 90},
    {"op": "pairwise_cosine_stats", "dtype": "fp32", "self": False, "m": 65, "n": 1, "d": 384, "bins": 4096,
     "precision": "highest", "arch": 80},
    {"op": "pairwise_cosine_stats", "dtype": "fp32", "self": True, "m": 1025, "n": 1025, "d": 33, "bins": 4096,
     "precision": "highest", "arch": 90, "fp32_pass": "ieee"},
    {"op": "pairwise_cosine_stats", "dtype": "fp32", "self": False, "m": 1, "n": 1, "d": 5, "bins": 1,
     "precision": "tf32", "arch": 90},
    {"op": "pairwise_cosine_stats", "dtype": "bf16", "self": True, "m": 700, "n": 700, "d": 48, "bins": 65536,
     "precision": "highest", "arch": 90},
    {"op": "pairwise_cosine_stats", "dtype": "bf16", "self": True, "m": 30522, "n": 30522, "d": 384, "bins": 4096,
     "precision": "highest", "arch": 80},
    # the grouped variant (REPCAP_TRITON_STATS_KERNEL=grouped)
    *[{"op": "pairwise_cosine_stats", "variant": "grouped", "dtype": dt, "self": sp, "m": m, "n": n, "d": d,
       "bins": bins, "precision": pr, "arch": arch}
      for dt, sp, m, n, d, bins, pr, arch in [
          ("bf16", True, 2, 2, 1, 4096, "highest", 90),  # every size argument is 1
          ("bf16", True, 151936, 151936, 4096, 4096, "highest", 90),
          ("bf16", True, 151936, 151936, 896, 4096, "highest", 90),
          ("fp16", False, 65, 1, 384, 4096, "highest", 90),
          ("fp32", True, 1025, 1025, 33, 4096, "highest", 90),
          ("fp32", True, 151936, 151936, 4096, 4096, "highest", 90),
          ("fp32", True, 151936, 151936, 4096, 4096, "tf32", 90),
          ("bf16", True, 700, 700, 48, 65536, "highest", 90),
          ("bf16", True, 700, 700, 48, 100, "highest", 90),  # a window narrower than 256 bins
          ("bf16", True, 30522, 30522, 384, 4096, "highest", 80),
      ]],
    # the grouped variant reading through TMA descriptors (REPCAP_TRITON_STATS_KERNEL=grouped_tma; rows of
    # a multiple of 16 bytes)
    *[{"op": "pairwise_cosine_stats", "variant": "grouped_tma", "dtype": dt, "self": sp, "m": m, "n": n, "d": d,
       "bins": 4096, "precision": pr, "arch": 90}
      for dt, sp, m, n, d, pr in [
          ("bf16", True, 151936, 151936, 4096, "highest"),
          ("bf16", True, 151936, 151936, 896, "highest"),
          ("bf16", True, 2, 2, 8, "highest"),
          ("fp16", False, 65, 1, 384, "highest"),
          ("fp32", True, 151936, 151936, 4096, "highest"),  # the split pass: four descriptors
          ("fp32", False, 151936, 151936, 4096, "highest"),
          ("fp32", True, 151936, 151936, 4096, "tf32"),
      ]],
    # gram_offdiag_penalty: dtype, k rows, rows [row_offset, row_offset + m), d, with_grad, precision, p,
    # fused_max_d (None: the module's; 0 forces the panel path)
    *[{"op": "gram_offdiag_penalty", "dtype": dt, "k": k, "d": d, "with_grad": g, "precision": pr, "arch": a, "p": p,
       "fused_max_d": f, "row_offset": ro, "m": m, "kernels": kern}
      for dt, k, d, g, pr, a, p, f, ro, m, kern in [
          ("fp32", 1, 1, True, "highest", 90, 2, None, 0, 1, "fused"),  # every size argument is 1 (p-1 = 1)
          ("fp64", 1, 1, False, "highest", 90, 1, None, 0, 1, "forward"),  # every size argument is 1 (p = 1)
          ("fp32", 1, 1, True, "highest", 90, 2, 0, 0, 1, "panel"),  # every size argument is 1, panel path
          ("fp32", 262144, 4096, False, "highest", 90, 20, None, 0, 262144, "forward"),
          ("fp32", 262144, 4096, True, "highest", 90, 20, None, 0, 262144, "panel"),
          ("fp32", 262144, 4096, True, "highest", 90, 20, None, 131072, 32768, "panel"),  # a rank's row block
          ("fp64", 32768, 4096, False, "highest", 90, 20, None, 0, 32768, "forward"),
          ("fp64", 32768, 4096, True, "highest", 90, 20, None, 0, 32768, "panel"),
          ("fp32", 5000, 300, True, "highest", 90, 3, None, 0, 5000, "panel"),  # d not a multiple of 16
          ("fp32", 4099, 256, True, "highest", 90, 8, None, 0, 4099, "fused"),  # the largest fused tile
          ("fp32", 4099, 256, True, "highest", 90, 8, None, 1, 2049, "fused"),
          ("fp32", 97, 64, True, "highest", 90, 8, None, 0, 97, "fused"),
          ("fp64", 4099, 128, True, "highest", 90, 8, None, 0, 4099, "fused"),
          ("fp64", 1025, 300, True, "highest", 90, 8, None, 0, 1025, "panel"),
          ("fp32", 32768, 4096, True, "tf32", 90, 20, None, 0, 32768, "panel"),
          ("fp32", 32768, 4096, False, "tf32", 90, 20, None, 0, 32768, "forward"),
          ("fp32", 4099, 256, True, "tf32", 90, 8, None, 0, 4099, "fused"),
          ("fp32", 32768, 4096, True, "highest", 80, 20, None, 0, 32768, "panel"),
          ("fp32", 4099, 256, True, "tf32", 80, 8, None, 0, 4099, "fused"),
          ("fp64", 4099, 128, True, "highest", 80, 8, None, 0, 4099, "fused"),
          # precision bf16: the operands cast to bfloat16 (bf16 tensor-core dots, tests/test_triton_compile.py)
          ("fp32", 32768, 4096, True, "bf16", 90, 20, None, 0, 32768, "panel"),
          ("fp32", 32768, 4096, False, "bf16", 90, 20, None, 0, 32768, "forward"),
          ("fp32", 4099, 256, True, "bf16", 90, 8, None, 0, 4099, "fused"),
          ("fp32", 97, 64, True, "bf16", 90, 8, None, 0, 97, "fused"),
          ("fp32", 4099, 256, True, "bf16", 80, 8, None, 0, 4099, "fused"),
          ("fp32", 32768, 4096, True, "bf16", 80, 20, None, 0, 32768, "panel"),
      ]],
    # subspace_pga: the ranks op (x N×d) or the ρ op (N tokens projected on k dimensions); n ≥ 2^31
    # pairs at N = 65536: 64-bit size arguments
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp32", "n_tokens": 4096, "k": 100, "precision": "highest",
     "arch": 90},
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp32", "n_tokens": 4096, "k": 100, "precision": "tf32", "arch": 90},
    {"op": "subspace_pga", "fn": "ranks", "dtype": "fp32", "n_tokens": 3, "k": 1, "precision": "highest", "arch": 90},
    {"op": "subspace_pga", "fn": "ranks", "dtype": "fp32", "n_tokens": 2, "k": 1, "precision": "highest", "arch": 90},
    {"op": "subspace_pga", "fn": "ranks", "dtype": "fp64", "n_tokens": 1024, "k": 64, "precision": "highest",
     "arch": 80},
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp64", "n_tokens": 1024, "k": 64, "precision": "highest",
     "arch": 90},
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp32", "n_tokens": 1025, "k": 17, "precision": "highest",
     "arch": 80},
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp32", "n_tokens": 65536, "k": 100, "precision": "highest",
     "arch": 90},
    {"op": "subspace_pga", "fn": "rhos", "dtype": "fp64", "n_tokens": 65536, "k": 100, "precision": "highest",
     "arch": 80},
    # grassmann_normals: (bases, d, k, seed, first_basis); seed 1 and one basis of one normal make
    # the arguments equal to 1 constexprs; 100 bases of 4096×100 and a 63-bit seed: 64-bit sizes
    *[{"op": "grassmann_normals", "dtype": "fp64", "n": n, "d": d, "k": k, "seed": seed, "first_basis": first,
       "arch": arch}
      for n, d, k, seed, first, arch in [(100, 4096, 100, 0, 0, 90), (1, 1, 1, 1, 1, 90),
                                         (3, 7, 5, 2**63 - 1, 2**40, 90), (100, 4096, 100, 12345, 0, 80)]],
]
PENALTY_KERNELS = {"forward": {"_gram_offdiag_forward_kernel"}, "fused": {"_gram_offdiag_fused_kernel"},
                   "panel": {"_gram_panel_kernel", "_panel_merge_kernel", "_panel_gemm_kernel"}}


def variant_id(v) -> str:
    return "-".join(f"{value}" for key, value in v.items() if key not in ("op", "kernels"))


class Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the launch."""

    def __init__(self, fn, calls: list):
        self.fn = fn
        self.calls = calls

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.calls.append((self.fn, grid, args, kwargs))

        return record


def recorded_launches(module, run) -> list:
    """The launches `run()` makes of the module's kernels (run on meta tensors)."""
    from triton.runtime.jit import JITFunction

    calls = []
    kernels = {name: fn for name, fn in vars(module).items() if isinstance(fn, JITFunction)}
    for name, fn in kernels.items():
        setattr(module, name, Recorder(fn, calls))
    try:
        run()
    finally:
        for name, fn in kernels.items():
            setattr(module, name, fn)
    return calls


def launches_of(v) -> list:
    """Runs the variant's launcher on meta tensors; its recorded launches."""

    from repcap_fast.triton_kernels import gram_offdiag_penalty as penalty_module
    from repcap_fast.triton_kernels import grassmann_normals as normals_module
    from repcap_fast.triton_kernels import pairwise_cosine_stats as cosine_module
    from repcap_fast.triton_kernels import subspace_pga as pga_module
    from repcap_fast.triton_kernels._utils import tile_counts

    dtype = DTYPES[v["dtype"]]
    if v["op"] == "grassmann_normals":
        out = torch.empty(v["n"], v["d"], v["k"], dtype=dtype, device=META)
        return recorded_launches(normals_module, lambda: normals_module.grassmann_normals_triton(
            out, v["seed"], v["first_basis"]))
    if v["op"] == "pairwise_cosine_stats":
        m, n, d = v["m"], v["n"], v["d"]
        a = torch.empty(m, d, dtype=dtype, device=META)
        b = None if v["self"] else torch.empty(n, d, dtype=dtype, device=META)
        inv_a = torch.empty(m, dtype=torch.float32, device=META)
        inv_b = None if b is None else torch.empty(n, dtype=torch.float32, device=META)
        block = cosine_module._config(dtype, False)[0]
        programs = cosine_module._num_programs(tile_counts(m, n, v["self"], block)[0], 4 * SMS)
        saved_pass = os.environ.get(cosine_module.FP32_PASS_ENV)
        os.environ[cosine_module.FP32_PASS_ENV] = v.get("fp32_pass", "split")
        try:
            ops = cosine_module.kernel_operands(a, inv_a, b, inv_b, v["precision"])
        finally:
            os.environ.pop(cosine_module.FP32_PASS_ENV)
            if saved_pass is not None:
                os.environ[cosine_module.FP32_PASS_ENV] = saved_pass
        if v.get("variant") in ("grouped", "grouped_tma"):
            partials = cosine_module._grouped_partials(m, n, d, v["self"], dtype, programs, v["bins"], META, False)
            saved = cosine_module.WINDOW
            cosine_module.WINDOW = v.get("window", saved)
            try:
                return recorded_launches(cosine_module, lambda: cosine_module._launch_grouped(
                    ops, v["bins"], -1.0, 1.0, v["precision"], programs, partials, False,
                    tma=v["variant"] == "grouped_tma"))
            finally:
                cosine_module.WINDOW = saved
        partials = cosine_module._partials(programs, v["bins"], META)
        return recorded_launches(cosine_module, lambda: cosine_module._launch(
            ops, v["bins"], -1.0, 1.0, v["precision"], programs, partials, False))
    if v["op"] == "gram_offdiag_penalty":
        k, d, m, g = v["k"], v["d"], v["m"], v["with_grad"]
        x = torch.empty(k, d, dtype=dtype, device=META)
        row_max = torch.empty(m, dtype=dtype, device=META)
        row_sum = torch.empty(m, dtype=torch.float64, device=META)
        grad = torch.empty(m, d, dtype=dtype, device=META) if g else x.new_empty(0)
        saved = penalty_module.FUSED_MAX_D
        if v["fused_max_d"] is not None:
            penalty_module.FUSED_MAX_D = {torch.float32: v["fused_max_d"], torch.float64: v["fused_max_d"]}
        try:
            return recorded_launches(penalty_module, lambda: penalty_module._launch(
                x, v["row_offset"], m, v["p"], g, row_max, row_sum, grad, v["precision"], False))
        finally:
            penalty_module.FUSED_MAX_D = saved
    n_tokens, k = v["n_tokens"], v["k"]
    n = n_tokens * (n_tokens - 1) // 2
    packed = dtype != torch.float64
    if v["fn"] == "ranks":
        def run():
            u = torch.empty(1, n_tokens, k, dtype=dtype, device=META)
            keys = pga_module._keys(u, pga_module._OUT_PAIR if packed else pga_module._OUT_DIST, v["precision"])
            pga_module._rank_pass(keys, packed, ranks=torch.empty(n, dtype=torch.float64, device=META))
    else:
        def run():
            batch = 64  # the GPU batch
            u = torch.empty(batch, n_tokens, k, dtype=dtype, device=META)
            twice = torch.empty(n, dtype=torch.int32, device=META)
            keys = pga_module._keys(u, pga_module._OUT_TWICE if packed else pga_module._OUT_DIST, v["precision"],
                                    twice)
            pga_module._rank_pass(keys, packed, twice=None if packed else twice)
    return recorded_launches(pga_module, run)


def mma_kinds(ptx: str) -> list:
    """The tensor-core instructions of a kernel's PTX, as "wgmma:<operand type>" (Hopper's
    warpgroup MMA) or "mma:<operand type>" (mma.sync), sorted; [] when its dots run on FMA."""
    kinds = set()
    for inst in re.findall(r"^\s*((?:wgmma\.mma_async|mma\.sync)[\w.]*)", ptx, flags=re.MULTILINE):
        operand = re.search(r"\.(bf16|f16|tf32|f64|e4m3|e5m2|s8|u8)\b", inst)
        kinds.add(f"{'wgmma' if inst.startswith('wgmma') else 'mma'}:{operand.group(1) if operand else '?'}")
    return sorted(kinds)


def tma_loads(ptx: str) -> int:
    """How many TMA copies (cp.async.bulk.tensor, global to shared memory) a kernel's PTX issues."""
    return len(re.findall(r"^\s*(?:@!?%\w+\s+)?cp\.async\.bulk\.tensor\.", ptx, flags=re.MULTILINE))


def fresh_accumulators(ptx: str) -> int:
    """How many Hopper wgmma instructions start from a zero accumulator (scale-d the literal 0):
    a product that starts a fresh float32 accumulator rather than adding into a running one."""
    return len(re.findall(r"^\s*wgmma\.mma_async[\w.]*\s*\{[^}]*\},\s*[^,]+,\s*[^,]+,\s*0\s*,", ptx,
                          flags=re.MULTILINE))


def ptxas_info(ptx: str, arch: int) -> dict:
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


_COMPILED = {}  # identical launches (of any variant) compile once


def compile_launches(calls: list, arch: int, with_ptxas: bool) -> list:
    """Binds each recorded launch as JITFunction.run does and compiles each distinct one."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    results, seen = [], set()
    for fn, grid, args, kwargs in calls:
        kwargs = dict(kwargs)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
        key = (arch, fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items(), key=repr)),
               repr(sorted(attrs.items())), repr(options))
        if key in seen:
            continue
        seen.add(key)
        if key not in _COMPILED:
            start = time.time()
            kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                    options=options.__dict__)
            entry = {"kernel": fn.__name__, "seconds": round(time.time() - start, 2),
                     "shared_bytes": kernel.metadata.shared, "num_warps": options.num_warps,
                     "num_stages": options.num_stages, "mma": mma_kinds(kernel.asm["ptx"]),
                     "fresh_accumulators": fresh_accumulators(kernel.asm["ptx"]),
                     "tma_loads": tma_loads(kernel.asm["ptx"])}
            if with_ptxas:
                entry.update(ptxas_info(kernel.asm["ptx"], arch))
            _COMPILED[key] = entry
        results.append({**_COMPILED[key], "grid": list(grid)})
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", action="store_true", help="print the tests' variants as JSON and exit")
    parser.add_argument("--ptxas-info", action="store_true", help="add registers and spill bytes per kernel")
    args = parser.parse_args()
    if args.list:
        print(json.dumps(VARIANTS))
        return
    for v in json.load(sys.stdin):
        try:
            kernels = compile_launches(launches_of(v), v["arch"], args.ptxas_info)
            line = {"id": variant_id(v), "ok": True, "kernels": kernels}
        except Exception:  # noqa: BLE001 - reported per variant
            line = {"id": variant_id(v), "ok": False, "error": traceback.format_exc()[-3000:]}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
