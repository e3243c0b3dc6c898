"""Command line.

``repcap info``, ``repcap report [SOURCE]``, ``repcap survey SOURCE...``, ``repcap epsilon
[SOURCE]``, ``repcap pack``, ``repcap sweep`` and ``repcap fit``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
import warnings

import numpy as np
import torch

from . import _cli_parser, capacity, distributed, fitting, packing, plotting
from . import _validation as val
from ._backends import BackendUnavailableError, info
from ._deprecated import moved_names
from ._metrics import read_metrics
from ._outputs import check_no_clobber, check_plot_suffix
from ._validation import DTYPE_NAMES
from ._version import __version__
from .models import load_embeddings, resolve_source
from .models.casting import cast
from .ops.pairwise_cosine_stats import check_settings as check_stats_settings
from .ops.pairwise_cosine_stats import cosine_moments, pairwise_cosine_stats
from .packing.sweep_file import MAX_GRID_VALUES
from .report import ReportSettings, run_pga_survey, run_report, run_survey


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


def _cmd_plot_training(args) -> int:
    if args.plot is None:
        args.plot = os.path.splitext(args.metrics)[0] + ".png"
    _check_outputs(args, "plot", inputs=[("the metrics file", args.metrics)])
    records = read_metrics(args.metrics)
    plotting.training_plot(records, args.plot, args.title or os.path.basename(args.metrics))
    print(f"{len(records)} measurements, steps {records[0]['step']} to {records[-1]['step']}")
    print(f"wrote       {args.plot}")
    return 0


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
    return _cli_parser.build_parser({"info": _cmd_info, "epsilon": _cmd_epsilon, "pack": _cmd_pack,
                                     "sweep": _cmd_sweep, "report": _cmd_report, "survey": _cmd_survey,
                                     "fit": _cmd_fit, "plot-training": _cmd_plot_training})


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
    with _printed_log():
        return _run(args)


class _PrintHandler(logging.Handler):
    """Prints each record's message to the current sys.stdout (so redirect_stdout applies)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), flush=True)
        except Exception:  # noqa: BLE001 -- logging's own contract: never raise from emit
            self.handleError(record)


@contextlib.contextmanager
def _printed_log():
    """While a command runs, the library's INFO lines (the report's stages) print as they did."""
    logger = logging.getLogger("repcap_fast")
    handler, level, propagate = _PrintHandler(logging.INFO), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # printed once, even where the root logger has a handler of its own
    if level == logging.NOTSET:  # a level set by the caller (main() run in-process) is kept
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _run(args) -> int:
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
