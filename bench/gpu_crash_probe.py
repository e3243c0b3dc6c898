"""Each input check of the raw PGA ops, called on one device in its own process, so that a crash
(the H200 run of 2026-12-04 segfaulted on `subspace_pga_ranks` of a CUDA tensor of 65,537 × 2,
where the CPU op raises) is recorded with its signal, its faulthandler trace and, where gdb is
installed, a native backtrace, and the next probe still runs.

The probes tell the suspects apart: the token limit (whose message has non-ASCII characters,
"N(N−1)/2"), one row (its message has "×"), float16 (an ASCII message), the same limit through
`subspace_pga_rhos`, and the limit on CPU tensors as the control.

    python bench/gpu_crash_probe.py bench/results/.../gpu_crash_probe.json            # cuda
    python bench/gpu_crash_probe.py out.json --device cpu                             # here
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys

PRELUDE = """
import torch, repcap_fast as rf
dev = {device!r}
limit = rf.info()["limits"]["pga_tokens"]
ranks = torch.ops.repcap_fast.subspace_pga_ranks
rhos = torch.ops.repcap_fast.subspace_pga_rhos
try:
{body}
except Exception as e:  # the answer we want: an exception, not a crash
    print("RAISED", type(e).__name__, str(e).splitlines()[0][:300])
else:
    print("RETURNED")
"""

PROBES = {
    "ranks_over_the_token_limit": "    ranks(torch.randn(limit + 1, 2, device=dev))",
    "ranks_of_one_row": "    ranks(torch.randn(1, 2, device=dev))",
    "ranks_of_float16": "    ranks(torch.randn(4, 2, device=dev).half())",
    "rhos_over_the_token_limit": ("    x = torch.randn(limit + 1, 2, device=dev)\n"
                                  "    rhos(x, torch.randn(1, 2, 1, device=dev), "
                                  "torch.ones(3, device=dev, dtype=torch.float64))"),
    "ranks_over_the_token_limit_on_cpu": "    ranks(torch.randn(limit + 1, 2))",
}


def _signal_name(rc):
    if rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return str(-rc)


def run_probe(name, device, timeout):
    """One probe in a fresh interpreter: its exit status, signal and the tail of its output."""
    code = PRELUDE.format(device=device, body=PROBES[name])
    cmd = [sys.executable, "-X", "faulthandler", "-c", code]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", f"timed out after {timeout} s"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    result = {"rc": rc, "signal": None if rc is None else _signal_name(rc),
              "stdout": out.strip()[-600:], "stderr_tail": err.strip()[-1500:],
              "outcome": ("raised" if "RAISED" in out else "returned" if "RETURNED" in out
                          else "timeout" if rc is None else "crashed")}
    gdb = shutil.which("gdb")
    if result["outcome"] == "crashed" and gdb:
        try:
            bt = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c", code],
                                capture_output=True, text=True, timeout=timeout)
            result["gdb_bt"] = bt.stdout.strip()[-4000:]
        except subprocess.TimeoutExpired:
            result["gdb_bt"] = f"gdb timed out after {timeout} s"
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the JSON")
    parser.add_argument("--device", default="cuda", help="the device of the probes' tensors (default cuda)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per probe (default 60)")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBES), help="run these probes alone")
    args = parser.parse_args(argv)
    results = {}
    for name in args.only or PROBES:
        results[name] = run_probe(name, args.device, args.timeout)
        r = results[name]
        print(f"{name}: {r['outcome']} (rc {r['rc']}{', ' + r['signal'] if r['signal'] else ''}) "
              f"{r['stdout'][-160:]}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": args.device, "gdb": shutil.which("gdb"), "probes": results}, f, indent=1)
    print(f"wrote {args.out}")
    return 1 if any(r["outcome"] != "raised" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
