"""`repcap report`: the paper-grade analysis of one real model, written as report.json (full
provenance), report.md (a readable summary, `report_markdown`) and PNG plots. A model beside its
random-init control is `report_control`; several models side by side (`repcap survey`) are
`survey`; their functions are served from here too.

A report on one model has four parts:
1. ε of the embedding matrix, streamed over all pairs and exact through the Gram identity, with
   its class, the capacity table with the Welch floor, a histogram plot, and the
   embedding-vs-unembedding statistics when the two are untied;
2. the Subspace-PGA profile: z per layer for CCR-1, 5 and 10 with the null band;
3. spectral metrics per layer (RankMe, α-ReQ, isotropy, condition number) and the alignment of the
   top principal directions with the readout subspace;
4. where everything came from: source, files, tensor names, ties, text, token sample, seeds,
   versions, and the time of each stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import time
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _validation as val
from . import capacity, plotting
from ._backends import BACKENDS, check_precision, info, resolve_backend
from ._deprecated import moved_names
from ._outputs import StagedFolder, check_no_clobber
from .geometry import readout_basis
from .models import (
    INITS,
    LAST_LAYER_POINTS,
    HiddenStates,
    NoUnembeddingError,
    check_layers,
    hidden_states,
    is_in_memory,
    layer_count,
    load_embeddings,
    open_model,
    read_texts,
    runnable,
)
from .ops.pairwise_cosine_stats import check_settings as check_stats_settings
from .ops.pairwise_cosine_stats import cosine_moments, pairwise_cosine_stats
from .pga import pga_profile
from .probes import check_probe_file, probe_profile
from .report_markdown import report_markdown
from .spectral import spectral_metrics

REPORT_SECTIONS = ("provenance", "model", "epsilon", "hidden_states", "pga", "spectral")


def _finite(x):
    """JSON-safe float: None for NaN and ±inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return _finite(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, torch.Tensor):
        return _clean(obj.tolist())
    return obj


def _stage(name: str, log) -> float:
    log(f"== {name}")
    return time.perf_counter()


# --- ε --------------------------------------------------------------------------------------------

def epsilon_analysis(matrix: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0, backend: str = "auto",
                     zero_rows: str = "error", precision: str = "highest", progress: bool = True):
    """Streamed statistics (kernel 1) and exact moments (Gram identity) of one V×d matrix, with its
    class and capacity table. zero_rows: "error", or "drop" (counted in the result); precision: the
    streamed kernel's (the exact moments are float64). Returns (dict, CosineStats)."""
    k_sigma = val.as_real(k_sigma, "k_sigma")  # before the pass
    t0 = time.perf_counter()
    stats = pairwise_cosine_stats(matrix, bins=bins, backend=backend, zero_rows=zero_rows, precision=precision,
                                  progress=None if progress else False)
    t_stream = time.perf_counter() - t0
    t0 = time.perf_counter()
    moments = cosine_moments(matrix, zero_rows=zero_rows)
    t_gram = time.perf_counter() - t0
    v, d = stats.shape_a
    eps = stats.epsilon(k_sigma)
    out = {
        "shape": [int(matrix.shape[0]), d], "rows_used": v, "zero_rows_dropped": stats.dropped_rows_a,
        "dtype": str(matrix.dtype).replace("torch.", ""), "pairs": stats.count,
        "backend": stats.backend, "precision": precision,
        "stream": {"mean": stats.mean, "std": stats.std, "epsilon": eps, "min": stats.min, "max": stats.max,
                   "quantiles": {str(q): stats.quantile(q) for q in (0.01, 0.5, 0.9, 0.99, 0.999)}},
        "exact": {"mean": moments.mean, "std": moments.std, "epsilon": moments.epsilon(k_sigma)},
        "epsilon": eps, "k_sigma": k_sigma,
        "class": capacity.model_class(eps), "class_description": capacity.describe_class(eps),
        "capacity": capacity.capacity_table(d, eps, vocab=v),
        "seconds": {"stream": t_stream, "gram": t_gram},
    }
    return out, stats


def embedding_vs_unembedding(E: torch.Tensor, U: torch.Tensor, *, bins: int = 4096, k_sigma: float = 2.0,
                             backend: str = "auto", zero_rows: str = "error", precision: str = "highest",
                             progress: bool = True) -> Dict:
    """For untied models: cos(E_i, U_i) of each token's own two rows, and all V×V pairs cos(E_i, U_j).
    Tokens with a zero row in E or U have no cosine: an error, or with zero_rows="drop" left out."""
    k_sigma = val.as_real(k_sigma, "k_sigma")
    norms_e, norms_u = val.row_norms(E, "E"), val.row_norms(U, "U")
    nonzero = (norms_e > 0) & (norms_u > 0)
    if not bool(nonzero.all()) and zero_rows != "drop":
        raise ValueError(f"{int((~nonzero).sum())} tokens have a zero row in the embedding or the unembedding; "
                         f"pass zero_rows='drop' (--zero-rows drop) to leave them out")
    e = val.unit_rows(E[nonzero], torch.float64, norms_e[nonzero])
    u = val.unit_rows(U[nonzero], torch.float64, norms_u[nonzero])
    same = (e * u).sum(dim=1)
    cross = pairwise_cosine_stats(E, U, bins=bins, backend=backend, zero_rows=zero_rows, precision=precision,
                                  progress=None if progress else False)
    return {
        "tokens_left_out": int((~nonzero).sum()),
        "same_token": {"mean": float(same.mean()), "std": float(same.std(unbiased=False)),
                       "min": float(same.min()), "max": float(same.max()),
                       "quantiles": {str(q): float(torch.quantile(same, q)) for q in (0.01, 0.5, 0.99)}},
        "all_pairs": {"pairs": cross.count, "mean": cross.mean, "std": cross.std, "epsilon": cross.epsilon(k_sigma),
                      "min": cross.min, "max": cross.max, "backend": cross.backend},
    }


# --- PGA and spectra ------------------------------------------------------------------------------

def spectral_profile(states: HiddenStates, basis: torch.Tensor, m: int = 10) -> List[Dict]:
    """Per layer: RankMe (singular values of H), α-ReQ, isotropy, condition number, and the fraction
    of each of the top m principal directions that lies in the readout subspace
    (`spectral.spectral_metrics`: two SVDs per layer, of R in H = QR for N ≥ 2d)."""
    rows = []
    for layer in states.layers:
        metrics = spectral_metrics(states[layer], basis, m)
        align = metrics.pop("readout_alignment_top")
        rows.append({"layer": layer, **metrics, "readout_alignment_top": align.tolist(),
                     "readout_alignment_mean": float(align.mean()),
                     "random_direction_expectation": basis.shape[1] / basis.shape[0]})
    return rows


# --- the report -----------------------------------------------------------------------------------

def _provenance(command: Optional[List[str]], settings: Dict) -> Dict:
    versions = {k: info()[k] for k in ("repcap_fast", "torch", "triton", "python")}
    for module in ("transformers", "numpy", "scipy", "gguf", "safetensors"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or without a version
            versions[module] = None
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            "settings": settings, "versions": versions,
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_for_report(source, n_rows, device):
    """Both matrices when the source has an unembedding, else the input alone (and why)."""
    try:
        return load_embeddings(source, which="both", n_rows=n_rows, device=device), None
    except NoUnembeddingError as exc:
        return load_embeddings(source, which="input", n_rows=n_rows, device=device), str(exc)


def _source_label(source) -> str:
    if source is None or isinstance(source, (str, os.PathLike)):
        return None if source is None else str(source)
    return getattr(source, "label", None) or type(source).__name__


@dataclass(frozen=True)
class ReportSettings:
    """What `run_report` computes and on what (the defaults are the papers' settings).

    n_tokens, seed: the token sample of the hidden states (`models.hidden_states`); layers: "all",
    an int or a list; k, n_null, ccrs: Subspace PGA; bins, k_sigma: the cosine histogram and
    ε = μ + k_sigma·σ; n_rows, zero_rows: which embedding rows are used (`load_embeddings`,
    `pairwise_cosine_stats`); device, dtype, batch_size: the model run and where every op runs
    (None: the CPU and float32 for a model read from disk, a model in memory's own device and
    dtype); backend, precision: the ops' backend and float32 product precision ("highest", or
    "tf32" on GPU tensor cores). init: "trained", or "random" (the same architecture from its
    config at initialization, seeded with `seed`: `models.random_init`); last_layer: the point of
    the residual stream the last layer is read at ("final_norm" or "resid_post", see
    `models.in_memory.Runner`). probe_file: a .jsonl of labelled texts ("text", "label") for
    linear probes per layer next to z (`probes.probe_profile`, probe_folds-fold cross-validated,
    seeded with `seed`; needs scikit-learn).
    text_file: a plain-text (paragraphs) or .jsonl file to sample tokens from (jsonl_key its field);
    None: the bundled corpus, or the texts given to run_report."""

    n_tokens: int = 2048
    layers: Union[str, int, Tuple[int, ...]] = "all"
    k: int = 100
    n_null: int = 100
    ccrs: Tuple[int, ...] = (1, 5, 10)
    seed: int = 0
    device: Optional[str] = None
    dtype: Optional[torch.dtype] = None
    backend: str = "auto"
    precision: str = "highest"
    bins: int = 4096
    k_sigma: float = 2.0
    n_rows: Union[None, int, str] = None
    zero_rows: str = "error"
    batch_size: int = 8
    text_file: Optional[str] = None
    jsonl_key: str = "text"
    init: str = "trained"
    last_layer: str = "final_norm"
    probe_file: Optional[str] = None
    probe_folds: int = 5

    def __post_init__(self):
        # Checked before any work; the model-dependent checks (k < d, layers) follow the load.
        # Stored normalized: Python ints, a torch.dtype, a str device, tuples.
        for name in ("n_tokens", "batch_size", "bins"):
            object.__setattr__(self, name, val.check_int(getattr(self, name), name, 1))
        object.__setattr__(self, "n_null", val.check_n_null(self.n_null))
        object.__setattr__(self, "seed", val.check_seed(self.seed))
        val.check_choice(self.zero_rows, "zero_rows", ("error", "drop"))
        check_precision(self.precision)
        if self.dtype is not None:
            object.__setattr__(self, "dtype", val.check_dtype(self.dtype))
        val.check_choice(self.init, "init", INITS)
        val.check_choice(self.last_layer, "last_layer", LAST_LAYER_POINTS)
        object.__setattr__(self, "k", val.check_int(self.k, "k", 1))
        ccrs = self.ccrs
        if isinstance(ccrs, (str, bytes)) or not hasattr(ccrs, "__iter__") or \
                isinstance(ccrs, (torch.Tensor, np.ndarray)) and ccrs.ndim == 0:
            ccrs = (ccrs,)  # one CCR variant, e.g. ccrs=1 (a string is refused by check_int)
        object.__setattr__(self, "ccrs", tuple(val.check_int(c, "ccrs", 0) for c in ccrs))
        if not self.ccrs or len(set(self.ccrs)) != len(self.ccrs):
            raise ValueError(f"ccrs must name at least one CCR variant, each once, got {self.ccrs}")
        if max(self.ccrs) >= self.n_tokens:  # CCR-m needs m < min(N, d); d is checked once the model is known
            raise ValueError(f"ccrs: CCR-{max(self.ccrs)} removes {max(self.ccrs)} principal components, which "
                             f"needs more than that many tokens: n_tokens is {self.n_tokens}")
        object.__setattr__(self, "k_sigma", val.as_real(self.k_sigma, "k_sigma"))
        if self.device is not None:  # None: the device is known once the source is (run_report checks it then)
            device = val.check_device(self.device)
            check_stats_settings(device, self.bins, zero_rows=self.zero_rows, backend=self.backend,
                                 precision=self.precision)
            resolve_backend(self.backend, device, "subspace_pga")
            object.__setattr__(self, "device", str(self.device))
        else:
            check_stats_settings("cpu", self.bins, zero_rows=self.zero_rows, precision=self.precision)
            if self.backend not in ("auto",) + BACKENDS:
                raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {self.backend!r}")
        if self.layers is None:
            object.__setattr__(self, "layers", "all")
        elif isinstance(self.layers, str):
            if self.layers != "all":
                raise ValueError(f"layers must be 'all', an int or a list of ints, got {self.layers!r}")
        elif not hasattr(self.layers, "__iter__") or isinstance(self.layers, (torch.Tensor, np.ndarray)) and \
                self.layers.ndim == 0:
            object.__setattr__(self, "layers", val.as_int(self.layers, "layers"))
        else:
            object.__setattr__(self, "layers", tuple(val.as_int(x, "layers") for x in self.layers))
        if self.text_file is not None and not os.path.isfile(self.text_file):
            raise FileNotFoundError(f"text_file {self.text_file!r} does not exist")
        object.__setattr__(self, "probe_folds", val.check_int(self.probe_folds, "probe_folds", 2))
        if self.probe_file is not None:
            if not os.path.isfile(self.probe_file):
                raise FileNotFoundError(f"probe_file {self.probe_file!r} does not exist")
            if not str(self.probe_file).endswith(".jsonl"):
                raise ValueError(f"probe_file {self.probe_file!r}: expected a .jsonl file with text and label keys")

    def to_dict(self) -> Dict:
        out = dataclasses.asdict(self)
        out.update(ccrs=list(self.ccrs), dtype=None if self.dtype is None else str(self.dtype).replace("torch.", ""),
                   layers=self.layers if isinstance(self.layers, (str, int)) else list(self.layers))
        return out


_SETTING_NAMES = {f.name for f in dataclasses.fields(ReportSettings)}

# Every file a report (or a control report) writes at the top of its folder: a new report
# replaces all of them, so none of an earlier run's files is left beside it (StagedFolder).
REPORT_FILES = ("report.json", "report.md", "cosine_histogram.png", "pga_profile.png", "spectral.png", "probe.png",
                "pga_control.png")



def _report_inputs(source, settings: ReportSettings) -> List[Tuple[str, Optional[str]]]:
    """The files a report reads, for `check_no_clobber`: the source (when it is a path), the text
    file and the probe file."""
    return [("the source", source if isinstance(source, (str, os.PathLike)) else None),
            ("text_file", settings.text_file), ("probe_file", settings.probe_file)]


def run_report(source=None, out: str = "repcap_report", settings: Optional[ReportSettings] = None, *,
               texts: Optional[Sequence[str]] = None, text_name: Optional[str] = None, token_ids=None,
               tokenizer=None, control: Optional[str] = None, progress: bool = True, log=print,
               command: Optional[List[str]] = None, _keep: Optional[Dict] = None, **legacy) -> Dict:
    """Runs the whole analysis of one model and writes OUT/report.json, OUT/report.md and the PNGs.
    Returns the report dict. See the module docstring for what it contains.

    source: a path, repo id or alias, or a model in memory (a transformers model, a TransformerLens
    HookedTransformer, an nnsight LanguageModel, an SAE-Lens SAE; with settings.init="random" also
    a transformers config): `models.in_memory`. A model in memory is analysed where it is, in its
    own dtype (settings.device and dtype None), and never moved or cast.
    settings: a ReportSettings (default: the papers' settings). texts: strings to sample tokens
    from instead of settings.text_file or the bundled corpus (text_name names them in the report);
    token_ids: token ids instead of a text (a 1-D stream, or a 2-D batch of windows; no tokenizer
    needed). tokenizer: a model in memory's tokenizer, when it does not carry one.
    control="random": `run_control_report`, both the weights and the same architecture at
    initialization, side by side. Passing the settings as keywords (n_tokens=..., k=...) is
    deprecated. (_keep: a dict that receives the hidden states and the readout basis, for
    `run_pga_survey`.)

    Arguments are checked against the model's config before any heavy work; the hidden states
    (where a text that is too short shows) run before the V² pass of ε; the probe file (labels,
    folds, UTF-8) and the CCR variants (against n_tokens and d_model) are checked before the
    hidden states. No output may be an input (the source, text or probe file). Every file is
    written into a staging folder and moved into OUT at the end, replacing all of an earlier
    run's report files (`REPORT_FILES`; other files in OUT are never touched). If a stage fails
    (or the run is interrupted), report.json is still written with the stages that finished,
    "complete": false and the error, no earlier report.md or plot is left beside it, and the
    error is raised."""
    settings = _with_legacy(settings or ReportSettings(), legacy)
    if control is not None:
        val.check_choice(control, "control", CONTROLS)
        from .report_control import run_control_report  # it runs this function twice

        return run_control_report(source, out, settings, texts=texts, text_name=text_name, token_ids=token_ids,
                                  tokenizer=tokenizer, progress=progress, log=log, command=command)
    out = val.check_output_folder(out, "out")  # created and writable before any work
    if texts is not None and token_ids is not None:
        raise ValueError("pass texts or token_ids, not both")
    if (texts is not None or token_ids is not None) and settings.text_file is not None:
        raise ValueError(f"pass {'texts' if texts is not None else 'token_ids'} or settings.text_file "
                         f"({settings.text_file!r}), not both: the report would sample only one of them")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in REPORT_FILES],
                     _report_inputs(source, settings))
    if settings.probe_file is not None:  # the labels, folds and scikit-learn, before the model loads
        check_probe_file(settings.probe_file, settings.probe_folds)
    if texts is None and token_ids is None and settings.text_file is not None:
        texts = read_texts(settings.text_file, jsonl_key=settings.jsonl_key)
        text_name = text_name or os.path.basename(settings.text_file)
    recorded = {"source": _source_label(source), **settings.to_dict(),
                "text": text_name or ("token_ids" if token_ids is not None else
                                      "default corpus" if texts is None else "texts"),
                "text_file": None if settings.text_file is None else os.path.abspath(settings.text_file),
                "text_file_sha256": None if settings.text_file is None else _file_sha256(settings.text_file)}
    report: Dict = {"provenance": _provenance(command, recorded)}
    seconds: Dict[str, float] = {}
    plots: Dict[str, str] = {}
    t_all = time.perf_counter()
    s = settings
    staged = StagedFolder(out, REPORT_FILES)  # out gets exactly this run's files at the end, even on failure

    def finish(error: Optional[BaseException] = None) -> Dict:
        seconds["total"] = time.perf_counter() - t_all
        report["provenance"]["seconds"] = seconds
        report["provenance"]["plots"] = plots
        report["complete"] = error is None
        if error is not None:
            report["error"] = f"{type(error).__name__}: {error}"
        cleaned = _clean(report)
        with staged:  # published into OUT at the end of the block, or discarded if a write fails
            with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
                json.dump(cleaned, fh, indent=1, allow_nan=False)
            if error is None:
                with open(staged.path("report.md"), "w", encoding="utf-8") as fh:
                    fh.write(report_markdown(cleaned))
        return cleaned

    try:
        t0 = _stage("loading the embedding matrices" + (" (building the model at initialization)"
                                                        if s.init == "random" else ""), log)
        model = None  # the model object when it is in memory (given, or built at initialization)
        if s.init == "random" or is_in_memory(source):
            model, _ = open_model(source, tokenizer=tokenizer, init=s.init, seed=s.seed, dtype=s.dtype,
                                  device=s.device)
            source = model
        elif tokenizer is not None:
            raise ValueError("tokenizer= is for a model in memory; a model read from disk uses its own tokenizer")
        device = s.device if s.device is not None else str(model.device) if model is not None else "cpu"
        if s.device is None:  # the model's device (or the CPU) decides where the ops run: their backend checked
            check_stats_settings(val.check_device(device), s.bins, zero_rows=s.zero_rows, backend=s.backend,
                                 precision=s.precision)
            resolve_backend(s.backend, val.check_device(device), "subspace_pga")
        emb, no_unembedding = _load_for_report(source, s.n_rows, device)
        report["model"] = emb.to_dict()
        report["model"]["device"] = device
        if model is not None:
            report["model"]["in_memory"] = model.describe()
        seconds["load"] = time.perf_counter() - t0
        log(f"   {emb.kind} · {emb.architecture} · {emb.rows_kept}×{emb.d_model} · tied={emb.tied} ({emb.tied_reason})")

        # What can run, and are the arguments valid for this model? Checked before any heavy work.
        can_run, why = runnable(source)
        skip = None
        if no_unembedding is not None:
            skip = f"no unembedding: {no_unembedding}"
        elif not can_run:
            skip = why
        keep_layers = None
        if skip is None:
            val.check_k(s.k, emb.d_model)
            if max(s.ccrs) >= emb.d_model:
                raise ValueError(f"ccrs: CCR-{max(s.ccrs)} needs ccr < d_model, and this model has d_model = "
                                 f"{emb.d_model}")
            n_layers = layer_count(emb.config)
            if n_layers is not None:
                keep_layers = check_layers(s.layers, n_layers)

        if skip is None:
            t0 = _stage(f"hidden states ({s.n_tokens} tokens, seed {s.seed})", log)
            states = hidden_states(source, texts=texts, token_ids=token_ids, layers=s.layers, n_tokens=s.n_tokens,
                                   batch_size=s.batch_size, dtype=None if model is not None else s.dtype,
                                   device=None if model is not None else s.device, seed=s.seed, text_name=text_name,
                                   progress=progress, last_layer=s.last_layer, states_device=device)
            report["hidden_states"] = states.to_dict()
            seconds["hidden_states"] = time.perf_counter() - t0
            if keep_layers is not None and states.layers != keep_layers:
                raise RuntimeError(f"the model ran layers {states.layers}, its config says {keep_layers}")
            if model is not None and model.init == "random" and s.probe_file is None:
                source = model = None  # the rest needs only the states and the embeddings: the built model can go

        t0 = _stage("ε of the embedding matrix (streamed over all pairs, and exact)", log)
        matrix = emb.input if emb.input is not None else emb.output
        eps_kw = dict(bins=s.bins, k_sigma=s.k_sigma, backend=s.backend, zero_rows=s.zero_rows, precision=s.precision,
                      progress=progress)
        eps_in, stats_in = epsilon_analysis(matrix, **eps_kw)
        eps_section = {"input": eps_in}
        curves = [("input embedding", stats_in)]
        if emb.tied is False and emb.output is not None:
            eps_out, stats_out = epsilon_analysis(emb.output, **eps_kw)
            eps_section["output"] = eps_out
            curves.append(("unembedding", stats_out))
            eps_section["input_vs_output"] = embedding_vs_unembedding(emb.input, emb.output, **eps_kw)
        else:
            eps_section["output"] = None
            eps_section["note"] = ("tied: the unembedding is the input embedding" if emb.tied
                                   else "no unembedding in this source")
        report["epsilon"] = eps_section
        plots["cosine_histogram"] = "cosine_histogram.png"
        plotting.plot_cosine_histograms(curves, staged.path(plots["cosine_histogram"]),
                                        f"{emb.source}: {emb.rows_kept}×{emb.d_model}", s.k_sigma)
        seconds["epsilon"] = time.perf_counter() - t0
        log(f"   ε = {eps_in['epsilon']:.6f} (exact {eps_in['exact']['epsilon']:.6f}) · {eps_in['class_description']}")

        if skip is not None:
            report["hidden_states"] = report["pga"] = report["spectral"] = {"skipped": skip}
            log(f"   no hidden states, PGA or spectra: {skip}")
        else:
            t0 = _stage(f"Subspace PGA: {len(states)} layers × CCR {list(s.ccrs)}, k={s.k}, {s.n_null} null "
                        f"subspaces", log)
            readout = readout_basis(emb.output, s.k)  # once, for the profile and the spectra
            basis = readout.basis
            if _keep is not None:
                _keep.update(states=states, basis=basis)
            results = pga_profile([states[layer] for layer in states.layers], basis=basis, n_null=s.n_null,
                                  ccrs=s.ccrs, seed=s.seed, backend=s.backend, precision=s.precision,
                                  progress=progress)
            profile = {str(ccr): [{"layer": layer, **{key: _finite(getattr(r, key)) for key in
                                                     ("z", "rho_readout", "null_mean", "null_std")},
                                   "null_rhos": [_finite(x) for x in r.null_rhos], "n_pairs": r.n_pairs,
                                   "backend": r.backend, "warnings": list(r.warnings)}
                                  for layer, r in zip(states.layers, per_layer)]
                       for ccr, per_layer in results.items()}
            report["pga"] = {"k": s.k, "n_null": s.n_null, "seed": s.seed, "ccrs": list(s.ccrs),
                             "readout": "top-k right singular vectors of W_U (the unembedding"
                                        + (", tied to the input embedding)" if emb.tied else ")"),
                             "readout_solver": readout.solver, "last_layer": states.meta["last_layer"],
                             "profile": profile}
            plots["pga_profile"] = "pga_profile.png"
            plotting.plot_pga_profile(profile, staged.path(plots["pga_profile"]),
                                      f"{emb.source}: Subspace PGA, k={s.k}, {s.n_null} nulls, {s.n_tokens} tokens")
            seconds["pga"] = time.perf_counter() - t0

            t0 = _stage("spectral metrics and readout alignment per layer", log)
            spectral = spectral_profile(states, basis)
            report["spectral"] = {"m_directions": 10, "k": s.k, "layers": spectral}
            plots["spectral"] = "spectral.png"
            plotting.plot_spectral(spectral, staged.path(plots["spectral"]), f"{emb.source}: spectra per layer")
            seconds["spectral"] = time.perf_counter() - t0

            if s.probe_file is not None:
                t0 = _stage(f"linear probes per layer on {os.path.basename(s.probe_file)}", log)
                report["probe"] = probe_profile(source, s.probe_file, layers=states.layers, folds=s.probe_folds,
                                                seed=s.seed, batch_size=s.batch_size, last_layer=s.last_layer,
                                                progress=progress, dtype=None if model is not None else s.dtype,
                                                device=None if model is not None else s.device)
                plots["probe"] = "probe.png"
                plotting.plot_probe(report["probe"], profile, staged.path(plots["probe"]),
                                    f"{emb.source}: linear probes and Subspace PGA")
                seconds["probe"] = time.perf_counter() - t0
    except BaseException as exc:
        finish(exc)
        log(f"== failed: {type(exc).__name__}: {exc} (what finished is in {out}/report.json)")
        raise
    report = finish()
    log(f"== wrote {out}/report.json, report.md and {len(plots)} plots in {seconds['total']:.1f} s")
    return report


CONTROLS = ("random",)


def _with_legacy(settings: ReportSettings, legacy: Dict) -> ReportSettings:
    """The settings with the deprecated keyword form applied (run_report(..., n_tokens=512))."""
    if not legacy:
        return settings
    unknown = sorted(set(legacy) - _SETTING_NAMES)
    if unknown:
        raise val.ArgumentTypeError(f"run_report() got unexpected keyword arguments {unknown}; settings go in a "
                                    f"ReportSettings ({sorted(_SETTING_NAMES)})")
    warnings.warn("run_report(..., name=value) is deprecated; pass settings=ReportSettings(name=value)",
                  DeprecationWarning, stacklevel=3)
    if legacy.get("jsonl_key", "text") is None:
        legacy["jsonl_key"] = "text"
    return dataclasses.replace(settings, **legacy)


_moved = moved_names(__name__, {name: ("repcap_fast.plotting", name) for name in
                                ("plot_cosine_histograms", "plot_pga_profile", "plot_spectral")})
# Control reports and surveys run reports, so they live in their own modules and are served from
# here too (repcap_fast.report.run_survey, ...), imported when first asked for.
_RUN_ELSEWHERE = {"run_control_report": "report_control", "control_markdown": "report_control",
                  "run_survey": "survey", "run_pga_survey": "survey", "pga_survey_markdown": "survey",
                  "AGREEMENT_DEPTHS": "survey", "SURVEY_FILES": "survey"}


def __getattr__(name: str):
    if name in _RUN_ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(f"repcap_fast.{_RUN_ELSEWHERE[name]}"), name)
    return _moved(name)
