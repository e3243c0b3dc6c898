"""The Gram off-diagonal penalty as a regularizer in a training step: step time and peak memory of
three forms of the same step, measured in one run and reported as ratios.

The model: a 2-layer MLP (64 → D → D, GELU) and a linear head. Its hidden activations, k rows of
D = 256, get λ·L with L = Σ_{i≠j}|ĝ_ij|^8 / (k(k−1)) (reduction "mean") beside an MSE task loss.
One step is forward, backward and an SGD update. The forms of L:

* ``naive``: the paper's formulation with autograd (repcap_fast.reference.gram_offdiag_penalty_reference):
  the k×k Gram is formed, and autograd keeps k×k intermediates for the backward pass;
* ``eager``: our op, ``repcap_fast.gram_offdiag_penalty`` (the fused kernel, never k×k);
* ``compiled``: the same step under ``torch.compile(fullgraph=True)`` (the forward and its backward
  compiled, our op inside the graph).

Each (form, k) runs in a fresh process, so its peak memory is its own: on the CPU the growth of the
resident set (VmHWM) over the timed steps beyond what the process held after its warm-up step; on
a GPU the caching allocator's peak beyond the memory allocated before the steps. A form that runs
out of memory is reported as such, with the allocation that failed; the process is held to
REPCAP_BENCH_MEM_GB of address space on the CPU (default: 85 % of the machine's memory), so an
out-of-memory error is an exception, not the kernel's OOM killer.

    python bench/bench_training_step.py                       # CPU, k = 1,024 … 32,768
    python bench/bench_training_step.py --device cuda         # the GPU case (bench/gpu_suite.sh)
    REPCAP_BENCH_SMOKE=1 python bench/bench_training_step.py  # small sizes, a minute

Results: a table printed last, JSON and a plot under bench/results/ (training_step_<device>.json/.png).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FORMS = ("naive", "eager", "compiled")
D_IN, D = 64, 256
P, LAMBDA = 8, 1.0


def _build(k, device, form, seed=0):
    """The model, its optimizer, one batch, and the loss function of `form`."""
    import torch

    import repcap_fast as rf
    from repcap_fast.reference import gram_offdiag_penalty_reference

    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({
        "l1": torch.nn.Linear(D_IN, D), "l2": torch.nn.Linear(D, D), "head": torch.nn.Linear(D, 1),
    }).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(k, D_IN, generator=g).to(device)
    y = torch.randn(k, 1, generator=g).to(device)
    penalty = gram_offdiag_penalty_reference if form == "naive" else rf.gram_offdiag_penalty

    def loss_fn(x, y):
        h = model["l2"](torch.nn.functional.gelu(model["l1"](x)))
        task = torch.nn.functional.mse_loss(model["head"](h), y)
        return task + LAMBDA * penalty(h, p=P, reduction="mean")

    if form == "compiled":
        loss_fn = torch.compile(loss_fn, fullgraph=True)
    return model, opt, x, y, loss_fn


def run_one(form, k, device, rounds):
    """Runs in its own process: warm-up step, then `rounds` timed steps; prints one JSON line."""
    import torch

    from _harness import peak_growth, sync

    if device == "cpu":
        import resource

        gb = float(os.environ.get("REPCAP_BENCH_MEM_GB", 0)) or 0.85 * os.sysconf("SC_PHYS_PAGES") * \
            os.sysconf("SC_PAGE_SIZE") / 2**30
        resource.setrlimit(resource.RLIMIT_AS, (int(gb * 2**30), int(gb * 2**30)))
    out = {"form": form, "k": k, "d": D, "p": P, "device": device}
    try:
        model, opt, x, y, loss_fn = _build(k, device, form)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            return loss

        t0 = time.perf_counter()
        out["first_loss"] = float(step())  # warm-up (and the compile)
        sync(device)
        out["warmup_s"] = time.perf_counter() - t0
        times = []

        def timed_steps():
            for _ in range(rounds):
                t = time.perf_counter()
                step()
                sync(device)
                times.append(time.perf_counter() - t)

        if device == "cpu":
            out["peak_extra_bytes"] = peak_growth(timed_steps)
        else:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            timed_steps()
            out["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
        out.update(seconds=statistics.median(times), seconds_min=min(times), rounds=rounds)
    except (RuntimeError, MemoryError) as exc:  # torch's allocator: "can't allocate memory" / "out of memory"
        message = str(exc).strip().splitlines()[0][:300]
        if "memory" not in message.lower():
            raise
        out.update(oom=True, error=message)
    print(json.dumps(out), flush=True)


def _child(form, k, device, rounds, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", form, "--ks", str(k), "--device", device,
           "--rounds", str(rounds)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"form": form, "k": k, "device": device, "error": f"timed out after {timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        killed = proc.returncode in (-9, 137)
        return {"form": form, "k": k, "device": device, "oom": killed or None,
                "error": ("killed (out of memory)" if killed else f"exit {proc.returncode}: {' | '.join(tail)}")}
    return json.loads(lines[-1])


def _ratios(rows):
    """Per k: naive/eager, naive/compiled and eager/compiled step time; the same for peak memory."""
    out = []
    for k in sorted({r["k"] for r in rows}):
        by = {r["form"]: r for r in rows if r["k"] == k}

        def rate(a, b, key):
            x, y = by.get(a, {}).get(key), by.get(b, {}).get(key)
            return x / y if x and y else None

        out.append({"k": k, **{f"{key}_{a}_over_{b}": rate(a, b, key)
                               for key in ("seconds", "peak_extra_bytes")
                               for a, b in (("naive", "eager"), ("naive", "compiled"), ("eager", "compiled"))}})
    return out


def _plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for form in FORMS:
        pts = sorted((r["k"], r) for r in rows if r["form"] == form and r.get("seconds"))
        if not pts:
            continue
        ks = [k for k, _ in pts]
        axes[0].plot(ks, [r["seconds"] for _, r in pts], marker="o", label=form)
        axes[1].plot(ks, [max(r["peak_extra_bytes"], 1) / 2**20 for _, r in pts], marker="o", label=form)
        oom = [r["k"] for r in rows if r["form"] == form and r.get("oom")]
        if oom:
            axes[0].axvline(min(oom), color="grey", ls=":", lw=1)
            axes[0].annotate(f"{form}: out of memory", (min(oom), axes[0].get_ylim()[1]), fontsize=7,
                             rotation=90, va="top", ha="right")
    for ax, label in zip(axes, ("seconds per step", "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("k (rows penalized)")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"penalty in a training step (D = {D}, p = {P})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ks", default=None, help="comma-separated k values")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per (form, k)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    smoke = os.environ.get("REPCAP_BENCH_SMOKE") == "1"
    if args.ks:
        ks = [int(k) for k in args.ks.split(",")]
    else:
        ks = [512, 1024] if smoke else [1024, 2048, 4096, 8192, 16384, 32768]
    rounds = args.rounds or (2 if smoke else 3)
    if args.child:
        run_one(args.child, ks[0], args.device, rounds)
        return 0

    from tqdm import tqdm

    from _harness import format_table, mib, write_results

    forms = args.forms.split(",")
    rows, out_of_memory = [], set()
    with tqdm(total=len(ks) * len(forms), desc="training step", unit="run") as bar:
        for k in ks:
            for form in forms:
                if form in out_of_memory:  # it ran out at a smaller k: larger ones would too
                    rows.append({"form": form, "k": k, "device": args.device, "oom": True,
                                 "error": "not run: out of memory at a smaller k"})
                else:
                    rows.append(_child(form, k, args.device, rounds, args.timeout))
                    if rows[-1].get("oom"):
                        out_of_memory.add(form)
                bar.set_postfix_str(f"{form} k={k}: {rows[-1].get('seconds', rows[-1].get('error', ''))}")
                bar.update()
    for r in rows:
        r["peak_extra_mib"] = mib(r.get("peak_extra_bytes"))
        r["note"] = "out of memory" if r.get("oom") else (r.get("error") or "")[:60] or None
    ratios = _ratios(rows)
    first_oom = {form: min((r["k"] for r in rows if r["form"] == form and r.get("oom")), default=None)
                 for form in forms}
    lines = format_table([("form", "form"), ("k", "k"), ("seconds", "s/step"), ("peak_extra_mib", "peak MiB"),
                          ("note", "note")], rows)
    lines += [""] + format_table([("k", "k"), ("seconds_naive_over_eager", "naive/eager"),
                                  ("seconds_naive_over_compiled", "naive/compiled"),
                                  ("seconds_eager_over_compiled", "eager/compiled"),
                                  ("peak_extra_bytes_naive_over_eager", "mem naive/eager"),
                                  ("peak_extra_bytes_naive_over_compiled", "mem naive/compiled")], ratios,
                                 fmt={key: ".3g" for key in ("seconds_naive_over_eager",)})
    lines += [f"first k out of memory: {first_oom}"]
    name = f"training_step_{args.device}"
    path = write_results(name, {"model": {"d_in": D_IN, "d": D, "p": P, "lambda": LAMBDA, "reduction": "mean",
                                          "optimizer": "SGD"},
                                "rounds": rounds, "results": rows, "ratios": ratios,
                                "first_k_out_of_memory": first_oom}, lines)
    plot = _plot(rows, path[: -len(".json")] + ".png")
    if plot:
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
