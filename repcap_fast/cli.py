"""Command line.

``repcap info``, ``repcap report [SOURCE]``, ``repcap survey SOURCE...``, ``repcap epsilon
[SOURCE]``, ``repcap pack``, ``repcap sweep`` and ``repcap fit``.
"""

from __future__ import annotations

import argparse
import collections.abc
import contextlib
import itertools
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch

from . import _validation as val
from . import capacity, distributed, fitting, packing, plotting
from ._backends import BACKENDS, PENALTY_PRECISIONS, PRECISIONS, BackendUnavailableError, info
from ._deprecated import moved_names
from ._outputs import check_no_clobber, check_plot_suffix
from ._validation import DTYPE_NAMES
from ._version import __version__
from .models import DEFAULT_MODEL, INITS, LAST_LAYER_POINTS, load_embeddings, resolve_source
from .models.casting import cast
from .ops.pairwise_cosine_stats import check_settings as check_stats_settings
from .ops.pairwise_cosine_stats import cosine_moments, pairwise_cosine_stats
from .report import CONTROLS, ReportSettings, run_pga_survey, run_report, run_survey
from .sweep_file import MAX_GRID_VALUES


def _cmd_info(args) -> int:
    print(json.dumps(info(), indent=2))
    return 0


def _fmt_k(k: float) -> str:
    return "inf" if not np.isfinite(k) else f"{k:.4g}"


def _check_outputs(args, *files, inputs=(), extra=()) -> None:
    """The command's output files (--json, --plot), checked and normalized before any work.

    Folders created, writable, not a folder; a --plot without a suffix gets .png (the file written
    and printed), and its suffix must be a format matplotlib writes; no output may be an input of
    the run (`inputs`: (name, path) pairs) or another output (`extra`: more output paths, e.g. one
    plot per fit form, as (name, function of the checked args)).
    """
    for attr in files:
        path = getattr(args, attr, None)
        if path is not None:
            setattr(args, attr, val.check_output_file(path, f"--{attr}", ".png" if attr == "plot" else None))
            if attr == "plot":
                check_plot_suffix(args.plot)
    outputs = [(f"--{attr}", getattr(args, attr, None)) for attr in files]
    outputs += [(name, make(args)) for name, make in extra]
    check_no_clobber([(name, path) for name, path in outputs if path is not None], inputs)


def _source_path(source):
    """The file or folder a SOURCE names; None for a source that does not resolve (the load reports that)."""
    try:
        return resolve_source(source).path
    except (ValueError, OSError):
        return None


def _check_device_arg(args) -> None:
    if getattr(args, "device", None):
        val.check_device(args.device, "--device")


def _cmd_epsilon(args) -> int:
    _check_device_arg(args)
    check_stats_settings(args.device or "cpu", args.bins, zero_rows=args.zero_rows, backend=args.backend,
                         precision=args.precision)
    if not math.isfinite(args.k_sigma):
        raise ValueError(f"--k-sigma must be finite, got {args.k_sigma}")
    _check_outputs(args, "json", "plot", inputs=[("the source", _source_path(args.source))])
    t0 = time.perf_counter()
    emb = load_embeddings(args.source, which=args.which, tensor=args.tensor, n_rows=args.n_rows)
    a = emb.input if args.which == "input" else emb.output
    tensor_name = emb.input_name if args.which == "input" or emb.tied else emb.output_name
    # every file the load opened (a shard, a tokenizer) is an input too: checked before writing
    check_no_clobber([("--json", args.json), ("--plot", args.plot)],
                     [("a file of the source", f) for f in emb.files_opened])
    if args.dtype:  # a value beyond the dtype's range is an error naming the cast, not a later "NaN/Inf"
        a = cast(a, DTYPE_NAMES[args.dtype], f"the matrix {tensor_name or emb.source!s}")
    if args.device:
        a = a.to(args.device)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    stats = pairwise_cosine_stats(
        a, bins=args.bins, zero_rows=args.zero_rows, backend=args.backend,
        precision=args.precision, progress=None if args.progress else False,
    )
    stream_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    moments = cosine_moments(a, zero_rows=args.zero_rows)
    gram_s = time.perf_counter() - t2
    v, d = stats.shape_a
    eps = stats.epsilon(args.k_sigma)
    table = capacity.capacity_table(d, eps, vocab=v)

    print(f"source      {emb.source}" + (f"  [{tensor_name}]" if tensor_name else "")
          + f"  ({emb.kind}, {emb.architecture})")
    if emb.tied is not None:
        print(f"tied        {emb.tied}: {emb.tied_reason}")
    if emb.padded_rows:
        print(f"padding     {emb.padded_rows} rows beyond the tokenizer's ids (0..{emb.tokenizer_size - 1}) "
              f"({'dropped' if emb.rows_kept <= emb.tokenizer_size else 'kept; --n-rows tokenizer drops them'})")
    print(f"matrix      {v} x {d}  {str(a.dtype).replace('torch.', '')}  on {a.device}"
          + (f"  (dropped {stats.dropped_rows_a} zero rows)" if stats.dropped_rows_a else ""))
    print(f"pairs       n = {stats.count:,}   backend = {stats.backend}   ({stream_s:.2f} s)")
    print(f"mean        μ = {stats.mean:.6f}   (Gram identity {moments.mean:.6f})")
    print(f"std         σ = {stats.std:.6f}   (Gram identity {moments.std:.6f})")
    print(f"epsilon     ε = μ + {args.k_sigma:g}σ = {eps:.6f}   (Gram identity {moments.epsilon(args.k_sigma):.6f})")
    print(f"range       min = {stats.min:.6f}   max = {stats.max:.6f}")
    print(f"class       {capacity.describe_class(eps)}")
    print("capacity    formula            k (max features)   Welch/orthoplex floor on max|c| for k")
    labels = {"jl_C8": "JL, C=8", "jl_C3.029": "JL, C=3.029", "adjusted_C1.293": "adjusted, C=1.293",
              "full": "full form"}
    for key, row in table["formulas"].items():
        if row is None:
            print(f"            {labels[key]:<18} {'n/a (ε < 0)':>16}")
            continue
        print(f"            {labels[key]:<18} {_fmt_k(row['capacity']):>16}   {row['welch_floor']:.6f}")
    if capacity.model_class(eps) == 1:
        print("            (class 1: these capacities are indeterminate)")
    print(f"floor       no {v} unit vectors in R^{d} have max|c| below {table['welch_floor_vocab']:.6f} "
          "(Welch/orthoplex)")

    if args.json:
        doc = {
            "provenance": {
                "source": emb.source, "tensor": tensor_name, "file": emb.files_opened[-1] if emb.files_opened else None,
                "which": args.which, "model": emb.to_dict(),
                "shape": [v, d], "dtype": str(a.dtype).replace("torch.", ""), "device": str(a.device),
                "backend": stats.backend, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": {"load": load_s, "stream": stream_s, "gram": gram_s},
                "versions": {k: info()[k] for k in ("repcap_fast", "torch", "triton", "python")},
                "command": sys.argv,
            },
            "stream": stats.to_dict(include_hist=True),
            "gram": moments.to_dict(),
            "epsilon": eps,
            "k_sigma": args.k_sigma,
            "quantiles": {str(q): stats.quantile(q) for q in (0.01, 0.5, 0.9, 0.99, 0.999)},
            "capacity": table,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote       {args.json}")
    if args.plot:
        plotting.plot_cosine_histograms([("pairwise cosines", stats)], args.plot,
                                        f"{os.path.basename(str(emb.source))}: {v}×{d}, ε = {eps:.4f}", args.k_sigma)
        print(f"wrote       {args.plot}")
    return 0


def _write_json(path: str, payload: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    print(f"wrote       {path}")


def _n_rows(text: str):
    if text in ("tokenizer", "vocab"):
        return "tokenizer"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'tokenizer', got {text!r}") from None


def _cmd_pack(args) -> int:
    _check_outputs(args, "json", "plot")
    _check_device_arg(args)
    res = packing.optimize(args.k, args.d, steps=args.steps, p=args.p, lr=args.lr, seed=args.seed,
                           device=args.device, dtype=args.dtype, backend=args.backend, precision=args.precision,
                           progress=args.progress, method=args.method, p_start=args.p_start,
                           polish_steps=args.polish_steps, restarts=args.restarts,
                           projection_steps=args.projection_steps)
    ratio = "inf" if not np.isfinite(res.eps_over_welch) else f"{res.eps_over_welch:.4f}"
    p_text = (f"p={res.p}" if res.method == "paper" else "no p" if res.method in packing.NO_P
              else f"p={res.p_start}->{res.p}")
    polish = f" projection_steps={res.projection_steps}" if res.projection_steps else ""
    polish += f" polish_steps={res.polish_steps}" if res.polish_steps else ""
    print(f"k={res.k} d={res.d} method={res.method} steps={res.steps} {p_text}{polish} lr={res.lr} "
          f"({res.seconds:.1f} s, {res.backend}, precision {res.precision})")
    print(f"eps*        {res.eps_star:.6f}   (random start {res.eps_star_init:.6f})")
    if res.restarts > 1:
        print(f"restarts    {res.restarts}: best seed {res.best_seed}; eps* of each start "
              + " ".join(f"{e:.6f}" for e in res.restart_eps_stars))
    print(f"welch bound {res.welch:.6f}   eps*/welch {ratio}")
    print(f"certificate {res.bound:.6f} ({res.bound_name})   eps* - bound {res.eps_minus_bound:.6f}")
    print(f"mu+2sigma   {res.mu_plus_2sigma:.6f}")
    print(f"loss        {res.loss_init:.6g} -> {res.loss_final:.6g}")
    if args.json:
        _write_json(args.json, {"repcap_fast": __version__, "command": "pack", "result": res.to_dict()})
    if args.plot:
        plotting.plot_loss(res.loss_history, args.plot,
                           f"packing k={res.k}, d={res.d}, {res.method}, {p_text}: eps*={res.eps_star:.4f}",
                           **({} if res.method == "paper" else
                              {"ylabel": "smooth-max objective (T·ln Σ exp(|ĝ|/T))" if res.method == "smooth-max"
                               else "ε* of each step's packing" if res.method == "alternating-projection"
                               else "‖S² − aS − bI‖² of each step's signs" if res.method == "equiangular-search"
                               else "(1/p)·ln Σ|ĝ|^p (log of a smooth max of |ĝ|)", "log_scale": False}))
        print(f"wrote       {args.plot}")
    return 0


def _int_list(text: str):
    """"1000,2000" or "1000:8000:1000" (start:stop:step, stop included), as ranges.

    The values are counted from the ranges (len of a range is arithmetic), so a range of 10^12
    values is refused (by the sweep, naming the option) before any list is built.
    """
    parts = []
    for part in text.split(","):
        part = part.strip()
        if ":" in part:
            start, stop, step = (int(v) for v in part.split(":"))
            if step <= 0:
                raise argparse.ArgumentTypeError(f"step must be > 0 in {part!r}")
            parts.append(range(start, stop + 1, step))
        elif part:
            parts.append(range(int(part), int(part) + 1))
    if not any(len(r) for r in parts):
        raise argparse.ArgumentTypeError(f"no values in {text!r}")
    return _Grid(parts)


class _Grid(collections.abc.Sequence):
    """The values of --ks or --ds: ranges, concatenated lazily (len without listing them)."""

    def __init__(self, parts):
        self.parts = parts

    def __len__(self):
        return sum(len(r) for r in self.parts)

    def __getitem__(self, index):
        return list(itertools.chain.from_iterable(self.parts))[index]

    def __iter__(self):
        return itertools.chain.from_iterable(self.parts)


def _cmd_sweep(args) -> int:
    _check_device_arg(args)
    for option, grid in (("--ks", args.ks), ("--ds", args.ds)):
        if len(grid) > MAX_GRID_VALUES:  # counted from the ranges: nothing listed yet
            raise ValueError(f"{option} has {len(grid)} values; a sweep takes at most {MAX_GRID_VALUES} per axis")
    cells = packing.sweep(args.ks, args.ds, args.out, steps=args.steps, p=args.p, lr=args.lr,
                          seed=args.seed, device=args.device, dtype=args.dtype, backend=args.backend,
                          resume=not args.restart, progress=args.progress, method=args.method,
                          p_start=args.p_start, polish_steps=args.polish_steps, precision=args.precision,
                          restarts=args.restarts, projection_steps=args.projection_steps)
    print(f"{len(cells)} cells in {args.out}")
    for c in cells:
        gap = "n/a" if c["eps_minus_bound"] is None else f"{c['eps_minus_bound']:.5f}"
        print(f"k={c['k']:>7} d={c['d']:>5}  eps*={c['eps_star']:.5f}  welch={c['welch']:.5f}  "
              f"bound={c['bound']:.5f} ({c['bound_name']})  gap={gap}")
    return 0


def _fit_plot_paths(plot: str, forms) -> dict:
    """The PNG `repcap fit --plot` writes for each form (one file, or one per form)."""
    root, ext = os.path.splitext(plot)
    return {form: plot if len(forms) == 1 else f"{root}_{form}{ext}" for form in forms}


def _cmd_fit(args) -> int:
    forms = list(fitting.FIT_FORMS) if args.form == "all" else [args.form]
    _check_outputs(args, "json", "plot", inputs=[("the results file", args.results)],
                   extra=[(f"--plot ({form})", lambda a, f=form: a.plot and _fit_plot_paths(a.plot, forms)[f])
                          for form in forms if len(forms) > 1])
    cells = packing.load_cells(args.results)
    fits = {}
    for form in forms:
        res = fitting.fit(cells, form, eps_key=args.eps_key)
        fits[form] = res.to_dict()
        params = ", ".join(f"{k}={v:.6g}" for k, v in res.params.items())
        print(f"{form:<9} {params:<60} R2={res.r2:.5f} MAPE={res.mape:.3f}% NRMSE={res.nrmse:.3f}% "
              f"max_err={res.max_error:.4g} (n={len(res.eps)}, excluded {len(res.excluded)}; packing method "
              f"{res.method or 'not recorded'})" + (f"  AT BOUND: {', '.join(res.at_bounds)}" if res.at_bounds else ""))
        if args.plot:
            path = _fit_plot_paths(args.plot, forms)[form]
            res.plot(path)
            print(f"wrote       {path}")
    if args.json:
        _write_json(args.json, {"repcap_fast": __version__, "command": "fit", "results": args.results,
                                "eps_key": args.eps_key, "fits": fits})
    return 0


def _layers(text: str):
    if text == "all":
        return "all"
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated ints, got {text!r}") from None


def _cmd_report(args) -> int:
    _check_device_arg(args)
    settings = _report_settings(args)
    run_report(args.source, args.out, settings, control=args.control, progress=args.progress, command=sys.argv)
    return 0


def _report_settings(args) -> ReportSettings:
    """The ReportSettings of `repcap report` and `repcap survey --pga` from their options."""
    if args.text and args.jsonl:
        raise ValueError("give --text or --jsonl, not both")
    if args.jsonl and not args.jsonl.endswith(".jsonl"):
        raise ValueError(f"--jsonl {args.jsonl!r}: expected a .jsonl file")
    return ReportSettings(n_tokens=args.n_tokens, layers=args.layers, k=args.k, n_null=args.n_null,
                          ccrs=tuple(args.ccr), seed=args.seed, device=args.device, dtype=DTYPE_NAMES[args.dtype],
                          backend=args.backend, precision=args.precision, bins=args.bins, n_rows=args.n_rows,
                          zero_rows=args.zero_rows, batch_size=args.batch_size, text_file=args.text or args.jsonl,
                          jsonl_key=args.jsonl_key, init=args.init, last_layer=args.last_layer,
                          probe_file=args.probe, probe_folds=args.probe_folds)


_PGA_ONLY = ("text", "jsonl", "jsonl_key", "n_tokens", "layers", "k", "n_null", "ccr", "seed", "dtype", "batch_size",
             "precision", "init", "last_layer", "probe", "probe_folds", "agreement_null")


def _cmd_survey(args) -> int:
    _check_device_arg(args)
    given = [name for name, default in args.pga_only_defaults.items() if getattr(args, name) != default]
    if given and not args.pga:
        raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in given)}: only with --pga (the survey "
                         f"without it compares ε and capacity of the embedding matrices)")
    if args.pga:
        run_pga_survey(args.sources, args.out, _report_settings(args), agreement_null=args.agreement_null,
                       progress=args.progress, command=sys.argv)
        return 0
    run_survey(args.sources, args.out, bins=args.bins, backend=args.backend, device=args.device, n_rows=args.n_rows,
               zero_rows=args.zero_rows, progress=args.progress, command=sys.argv)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `repcap` command and its subcommands.

    Returns:
        argparse.ArgumentParser: the parser (`repcap --help` is its help).
    """
    parser = argparse.ArgumentParser(prog="repcap", description="repcap_fast: representation geometry of LMs")
    parser.add_argument("--version", action="version", version=f"repcap_fast {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (by default: one line, exit code 2)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="what was built and which backend each op uses")
    p_info.set_defaults(func=_cmd_info)
    p_eps = sub.add_parser("epsilon", help="ε, class and capacity of an embedding matrix")
    source_help = (f"a model directory, .safetensors, .gguf, .npy or .pt file, a Hugging Face repo id in the local "
                   f"cache, or an alias: minilm, smollm2 (default: {DEFAULT_MODEL})")
    p_eps.add_argument("source", nargs="?", default=None, help=source_help)
    p_eps.add_argument("--which", choices=("input", "output"), default="input",
                       help="the input embedding (default) or the unembedding W_U")
    p_eps.add_argument("--tensor", help="tensor name inside the file (default: from the architecture)")
    p_eps.add_argument("--n-rows", type=_n_rows, help="use only the first N rows, or 'tokenizer': only the real tokens "
                       "of a padded vocabulary")
    p_eps.add_argument("--zero-rows", choices=("error", "drop"), default="error")
    p_eps.add_argument("--bins", type=int, default=4096)
    p_eps.add_argument("--k-sigma", type=float, default=2.0)
    p_eps.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto")
    p_eps.add_argument("--precision", choices=PRECISIONS, default="highest")
    p_eps.add_argument("--dtype", choices=tuple(DTYPE_NAMES), help="cast the matrix first")
    p_eps.add_argument("--device", help="e.g. cuda, cuda:1 (default: where it was loaded, the CPU)")
    p_eps.add_argument("--json", metavar="PATH", help="write results with provenance")
    p_eps.add_argument("--plot", metavar="PATH", help="write a PNG of the cosine histogram")
    p_eps.add_argument("--no-progress", dest="progress", action="store_false")
    p_eps.set_defaults(func=_cmd_epsilon)

    def packing_options(p, grid: bool):
        p.add_argument("--method", choices=packing.METHODS, default="paper",
                       help="the optimizer (default: paper, the published one; minimax packs tightest)")
        p.add_argument("--steps", type=int, default=5000, help="optimizer steps (default 5000, the paper's)")
        p.add_argument("--p", type=int, default=None, help="penalty exponent of the paper's method (default "
                       "min(int(m/ln d), 20)); the last p of the continuation methods (default 1024)")
        p.add_argument("--p-start", type=int, default=None, help="the first p of the continuation methods (default 4)")
        p.add_argument("--polish-steps", type=int, default=None,
                       help="active-set polish steps after the optimizer (default 40 for minimax, else 0)")
        p.add_argument("--projection-steps", type=int, default=0,
                       help="alternating-projection polish steps after the optimizer, before the active-set "
                            "polish (default 0; k <= 4096)")
        p.add_argument("--lr", type=float, default=None, help="Adam lr (default 0.005 if d <= 1024 else 0.0025; the "
                       "continuation methods start at twice that and decay to 1%% of their start)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--restarts", type=int, default=1, help="seeded starts (seeds seed, seed+1, ...) per cell, "
                       "keeping the one of least eps* (default 1)")
        p.add_argument("--device", default="cpu", help="e.g. cpu, cuda, cuda:1")
        p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
        p.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto")
        p.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                       default=True if grid else None)
        p.add_argument("--precision", choices=PENALTY_PRECISIONS, default="highest",
                       help="operands of the penalty steps' float32 GEMMs: highest (IEEE float32, default), tf32 or "
                            "bf16 (GPU tensor cores; the cpu backend emulates them by rounding the operands); "
                            "eps*, mu+2sigma and the reported losses always come from the exact kernel"
                            + ("; recorded in --out, and a resume never mixes precisions" if grid else ""))

    p_pack = sub.add_parser("pack", help="packing simulation of one (k, d) cell")
    p_pack.add_argument("--k", type=int, required=True, help="number of vectors")
    p_pack.add_argument("--d", type=int, required=True, help="dimension")
    packing_options(p_pack, grid=False)
    p_pack.add_argument("--json", metavar="PATH", help="write the result and loss history")
    p_pack.add_argument("--plot", metavar="PATH", help="write a PNG of the loss curve")
    p_pack.set_defaults(func=_cmd_pack)

    p_sweep = sub.add_parser("sweep", help="packing simulations over a (k, d) grid; resumes")
    p_sweep.add_argument("--ks", type=_int_list, required=True, help='e.g. "2000:32000:2000" or "1000,2000"')
    p_sweep.add_argument("--ds", type=_int_list, required=True, help='e.g. "32,64,128"')
    p_sweep.add_argument("--out", required=True, help="results file (.json, or .csv); rewritten after each cell")
    p_sweep.add_argument("--restart", action="store_true", help="ignore the cells already in --out")
    packing_options(p_sweep, grid=True)
    p_sweep.set_defaults(func=_cmd_sweep)

    def analysis_options(p):
        """The options of a report (also `survey --pga`)."""
        p.add_argument("--text", metavar="FILE", help="plain text to sample tokens from (default: the bundled "
                       "public-domain corpus, The Adventures of Sherlock Holmes)")
        p.add_argument("--jsonl", metavar="FILE", help="JSON lines with a text field (see --jsonl-key)")
        p.add_argument("--jsonl-key", default="text")
        p.add_argument("--n-tokens", type=int, default=2048, help="tokens sampled for the hidden states (default 2048)")
        p.add_argument("--layers", type=_layers, default="all", help="'all' or e.g. 0,6,12")
        p.add_argument("--k", type=int, default=100, help="readout subspace dimension (default 100)")
        p.add_argument("--n-null", type=int, default=100, help="random subspaces in the null (default 100)")
        p.add_argument("--ccr", type=_int_list, default=[1, 5, 10], help="CCR variants (default 1,5,10)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--device", default="cpu", help="e.g. cpu, cuda")
        p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="model dtype")
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--n-rows", type=_n_rows, help="first N rows of the embeddings, or 'tokenizer'")
        p.add_argument("--zero-rows", choices=("error", "drop"), default="error",
                       help="embedding rows that are all zero: stop with an error (default), or drop and count them")
        p.add_argument("--bins", type=int, default=4096)
        p.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto")
        p.add_argument("--precision", choices=PRECISIONS, default="highest",
                       help="float32 products of the ε and PGA kernels (tf32: GPU tensor cores)")
        p.add_argument("--init", choices=INITS, default="trained",
                       help="trained: the weights (default); random: the same architecture built from its config at "
                            "initialization, seeded with --seed (needs only config.json and a tokenizer)")
        p.add_argument("--last-layer", choices=LAST_LAYER_POINTS, default="final_norm",
                       help="the point of the residual stream the last layer is read at: final_norm (default; "
                            "transformers' last hidden state, after the final norm) or resid_post (the last block's "
                            "output before it, as TransformerLens's hook_resid_post)")
        p.add_argument("--probe", metavar="FILE.jsonl",
                       help="labelled texts (JSON lines with text and label keys): a logistic-regression probe per "
                            "layer, k-fold cross-validated and seeded, reported next to z (needs scikit-learn: "
                            "pip install 'repcap_fast[probe]')")
        p.add_argument("--probe-folds", type=int, default=5, help="cross-validation folds of the probes (default 5)")

    p_rep = sub.add_parser("report", help="the full analysis of one model: ε, capacity, Subspace-PGA profile, spectra")
    p_rep.add_argument("source", nargs="?", default=None, help=source_help)
    p_rep.add_argument("--out", default="repcap_report", help="output folder (default ./repcap_report)")
    analysis_options(p_rep)
    p_rep.add_argument("--control", choices=CONTROLS,
                       help="random: analyse the weights and their random-init control side by side (OUT/trained, "
                            "OUT/random_init, and a comparison in OUT/report.md)")
    p_rep.add_argument("--no-progress", dest="progress", action="store_false")
    p_rep.set_defaults(func=_cmd_report)

    p_sur = sub.add_parser("survey", help="several models side by side: d_model, ε, class, capacity")
    p_sur.add_argument("sources", nargs="+", help="one or more sources (as for report); the table compares them")
    p_sur.add_argument("--out", default="repcap_survey", help="output folder (default ./repcap_survey)")
    p_sur.add_argument("--pga", action="store_true",
                       help="Subspace PGA across the models or checkpoints: each one's whole report (OUT/NN_name), z "
                            "per (layer, model) as a table, a heatmap and trajectories over relative depth, the "
                            "top-PC readout mass, and cross-model agreement of models that share a tokenizer "
                            "(the report options below apply)")
    p_sur.add_argument("--agreement-null", type=int, default=10,
                       help="random subspaces per model in the cross-model agreement (default 10)")
    analysis_options(p_sur)
    p_sur.add_argument("--no-progress", dest="progress", action="store_false")
    p_sur.set_defaults(pga_only_defaults={a.dest: a.default for a in p_sur._actions if a.dest in _PGA_ONLY})
    p_sur.set_defaults(func=_cmd_survey)

    p_fit = sub.add_parser("fit", help="fit the capacity constants to sweep results")
    p_fit.add_argument("results", help="a sweep file (.json or .csv)")
    p_fit.add_argument("--form", choices=("all",) + tuple(fitting.FIT_FORMS), default="all")
    p_fit.add_argument("--eps-key", default="eps_star", help="the measured ε (default eps_star; or mu_plus_2sigma)")
    p_fit.add_argument("--json", metavar="PATH", help="write the constants and metrics")
    p_fit.add_argument("--plot", metavar="PATH", help="write PNGs of data against fit (one per form)")
    p_fit.set_defaults(func=_cmd_fit)
    for command in sub.choices.values():  # --debug also after the command (repcap pack --debug ...)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error")
    return parser


_DISTRIBUTED_COMMANDS = ("epsilon", "pack", "sweep")


def main(argv=None) -> int:
    """Runs the `repcap` command line; the entry point of the `repcap` script.

    An error a user's input, files or machine can cause is printed as one `repcap: error: ...`
    line (no traceback; --debug shows it) and gives exit status 2.

    Args:
        argv (list[str] | None): the arguments (None: sys.argv[1:]).

    Returns:
        int: the exit status (0 on success, 2 on such an error, 130 when interrupted by Ctrl-C).
    """
    args = build_parser().parse_args(argv)
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun
            if args.command not in _DISTRIBUTED_COMMANDS:
                raise ValueError(f"`repcap {args.command}` does not run across ranks yet; run it without torchrun "
                                   f"(across ranks: {', '.join(_DISTRIBUTED_COMMANDS)})")
            started = distributed.init_from_torchrun(getattr(args, "device", None) or "cpu")
            if str(getattr(args, "device", None) or "").startswith("cuda"):  # each rank on its own GPU
                args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            if not distributed.is_main():  # rank 0 prints and writes files; the others compute their share
                args.json = args.plot = None
                with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                    rc = args.func(args)
            else:
                rc = args.func(args)
            if started:  # a clean shutdown after success: every rank done with the group, then torn down
                torch.distributed.barrier()
                torch.distributed.destroy_process_group()
            return rc
        return args.func(args)
    except _EXPECTED_ERRORS as exc:
        if args.debug:
            raise
        print(f"repcap: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was written stays (a sweep resumes from its file)
        if args.debug:
            raise
        print(f"\nrepcap: interrupted ({args.command} stopped by Ctrl-C)", file=sys.stderr)
        return 130


# What a user's input, files or machine can cause: one `repcap: error: …` line and exit code 2
# (--debug shows the traceback). Bad-argument TypeErrors and missing-tensor KeyErrors of this
# package are ValueErrors too. Anything else (a bare TypeError, KeyError, RuntimeError) is a
# bug and keeps its traceback.
_EXPECTED_ERRORS = (ValueError, OSError, ImportError, NotImplementedError, OverflowError, BackendUnavailableError,
                    distributed.RankFailure, packing.PackingDiverged)


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (KeyError's repr quotes stripped; an OSError names its file)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1:  # MissingTensorError: no quotes
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def plot_histogram(stats, path: str, title: str, k_sigma: float = 2.0) -> None:
    """Deprecated.

    ``plotting.plot_cosine_histograms([("pairwise cosines", stats)], path, title, k_sigma)``; it
    will be removed in the next release.
    """
    warnings.warn("repcap_fast.cli.plot_histogram is deprecated; use repcap_fast.plotting.plot_cosine_histograms",
                  DeprecationWarning, stacklevel=2)
    plotting.plot_cosine_histograms([("pairwise cosines", stats)], path, title, k_sigma)


__getattr__ = moved_names(__name__, {"plot_loss": ("repcap_fast.plotting", "plot_loss")})


if __name__ == "__main__":
    sys.exit(main())
