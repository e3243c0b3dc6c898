"""`repcap report` and `repcap survey`: the paper-grade analysis of real models, written as
report.json (full provenance), report.md (a readable summary) and PNG plots.

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
from ._outputs import StagedFolder, check_no_clobber, remove_stale, write_json_atomic
from .geometry import readout_basis
from .models import (
    INITS,
    LAST_LAYER_POINTS,
    HiddenStates,
    NoUnembeddingError,
    check_embeddings,
    check_layers,
    hidden_states,
    in_memory_source,
    is_in_memory,
    layer_count,
    load_embeddings,
    open_model,
    read_texts,
    resolve_source,
    runnable,
)
from .ops.pairwise_cosine_stats import check_settings as check_stats_settings
from .ops.pairwise_cosine_stats import cosine_moments, pairwise_cosine_stats
from .pga import cross_model_agreement, pga_profile
from .probes import check_probe_file, probe_profile
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
SURVEY_FILES = ("survey.json", "survey.md", "epsilon_vs_d.png", "pga_heatmap.png", "pga_depth.png")


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
        try:
            with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
                json.dump(cleaned, fh, indent=1, allow_nan=False)
            if error is None:
                with open(staged.path("report.md"), "w", encoding="utf-8") as fh:
                    fh.write(report_markdown(cleaned))
        except BaseException:  # nothing half-written reaches OUT
            staged.discard()
            raise
        staged.publish()
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


def run_control_report(source=None, out: str = "repcap_report", settings: Optional[ReportSettings] = None, *,
                       progress: bool = True, log=print, command: Optional[List[str]] = None, **kwargs) -> Dict:
    """A model and its random-init control, side by side: the whole report of the weights in
    OUT/trained, of the same architecture at initialization (settings.seed) in OUT/random_init,
    and OUT/report.json, OUT/report.md and OUT/pga_control.png comparing them: ε of both, and z per
    layer of both in one plot. Both analyses use the same settings, the same token sample and the
    same null subspaces (the same seed), so they differ only in the weights. kwargs: as for
    `run_report` (texts, text_name, token_ids, tokenizer). Returns the comparison dict, with the
    two reports under "trained" and "random_init"."""
    settings = settings or ReportSettings()
    if settings.init != "trained":
        raise ValueError(f"a control report analyses the weights and a random init of them: settings.init must be "
                         f"'trained', got {settings.init!r}")
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in REPORT_FILES],
                     _report_inputs(source, settings))
    t0 = time.perf_counter()
    reports = {}
    provenance = _provenance(command, {"source": _source_label(source), **settings.to_dict(), "control": "random"})
    staged = StagedFolder(out, REPORT_FILES)  # the comparison replaces every file of an earlier run in out
    names, started = ("trained", "random_init"), []
    try:
        for name, init in zip(names, ("trained", "random")):
            log(f"=== {name.replace('_', ' ')}")
            started.append(name)
            reports[name] = run_report(source, os.path.join(out, name), dataclasses.replace(settings, init=init),
                                       progress=progress, log=log, command=command, **kwargs)
    except BaseException as exc:  # out/report.json says which analysis failed; no earlier comparison stays
        for name in names:  # an analysis not reached: an earlier run's report there would look like this one's
            if name not in started and os.path.isdir(os.path.join(out, name)):
                remove_stale(os.path.join(out, name), REPORT_FILES)
        provenance["seconds"] = {"total": time.perf_counter() - t0}
        with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
            json.dump(_clean({"provenance": provenance, "complete": False, "error": f"{type(exc).__name__}: {exc}",
                              "failed": started[-1], "reports": {name: f"{name}/report.json" for name in started},
                              **reports}), fh, indent=1, allow_nan=False)
        staged.publish()
        raise
    doc = {"provenance": provenance, "complete": True, "reports": {name: f"{name}/report.json" for name in reports},
           **reports}
    doc["comparison"] = _control_comparison(reports["trained"], reports["random_init"])
    doc["provenance"]["seconds"] = {"total": time.perf_counter() - t0}
    doc = _clean(doc)
    try:
        with open(staged.path("report.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, allow_nan=False)
        if doc["comparison"]["pga"]:
            plotting.plot_pga_control({"trained": reports["trained"]["pga"]["profile"],
                                       f"random init (seed {settings.seed})": reports["random_init"]["pga"]["profile"]},
                                      staged.path("pga_control.png"),
                                      f"{doc['trained']['model']['source']}: trained vs random init, Subspace PGA")
        with open(staged.path("report.md"), "w", encoding="utf-8") as fh:
            fh.write(control_markdown(doc))
    except BaseException:  # nothing half-written reaches OUT
        staged.discard()
        raise
    staged.publish()
    log(f"== wrote {out}/report.json, report.md and pga_control.png (each analysis in {out}/trained and "
        f"{out}/random_init)")
    return doc


def _control_comparison(trained: Dict, random: Dict) -> Dict:
    """ε of both (streamed and exact, input and output) and z per (CCR, layer) of both."""
    eps = {}
    for key in ("input", "output"):
        a, b = trained["epsilon"].get(key), random["epsilon"].get(key)
        if a and b:
            eps[key] = {name: {"epsilon": r["epsilon"], "exact": r["exact"]["epsilon"], "mean": r["stream"]["mean"],
                               "std": r["stream"]["std"], "class": r["class"]}
                        for name, r in (("trained", a), ("random_init", b))}
    pga = {}
    if "profile" in trained.get("pga", {}) and "profile" in random.get("pga", {}):
        for ccr, rows in trained["pga"]["profile"].items():
            other = {r["layer"]: r for r in random["pga"]["profile"][ccr]}
            pga[ccr] = [{"layer": r["layer"], "z_trained": r["z"], "z_random_init": other[r["layer"]]["z"],
                         "rho_trained": r["rho_readout"], "rho_random_init": other[r["layer"]]["rho_readout"]}
                        for r in rows]
    return {"epsilon": eps, "pga": pga}


def control_markdown(doc: Dict) -> str:
    """A readable summary of a control report (`run_control_report`)."""
    t = doc["trained"]
    c = doc["comparison"]
    lines = [f"# repcap report: {t['model']['source']}, trained and at random initialization", "",
             f"- the weights: [trained/report.md](trained/report.md); the same architecture at initialization "
             f"(seed {doc['provenance']['settings']['seed']}): [random_init/report.md](random_init/report.md)",
             f"- {doc['provenance']['time_utc']}, repcap_fast {doc['provenance']['versions']['repcap_fast']}", "",
             "## ε", "", "| matrix | ε trained | ε random init | exact trained | exact random init | class trained | "
             "class random init |", "|---|---|---|---|---|---|---|"]
    for key, row in c["epsilon"].items():
        a, b = row["trained"], row["random_init"]
        lines.append(f"| {key} | {_fmt(a['epsilon'], '.6f')} | {_fmt(b['epsilon'], '.6f')} | "
                     f"{_fmt(a['exact'], '.6f')} | {_fmt(b['exact'], '.6f')} | {a['class']} | {b['class']} |")
    if c["pga"]:
        ccrs = list(c["pga"])
        lines += ["", "## Subspace PGA: z per layer", "",
                  "| layer | " + " | ".join(f"CCR-{k} trained | CCR-{k} random init" for k in ccrs) + " |",
                  "|---|" + "---|---|" * len(ccrs)]
        for i, row in enumerate(c["pga"][ccrs[0]]):
            cells = " | ".join(f"{_fmt(c['pga'][k][i]['z_trained'], '.2f')} | "
                               f"{_fmt(c['pga'][k][i]['z_random_init'], '.2f')}" for k in ccrs)
            lines.append(f"| {row['layer']} | {cells} |")
        lines += ["", "![z trained vs random init](pga_control.png)"]
    else:
        lines += ["", "No Subspace PGA: " + str(doc["trained"].get("pga", {}).get("skipped", "not run")) + "."]
    return "\n".join(lines + [""])


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


def _fmt(x, spec=".4f"):
    return "n/a" if x is None else format(x, spec)


def _layer_points(last: Optional[Dict]) -> str:
    """Which point of the residual stream each layer is, in words."""
    text = "Layer 0 is the embedding output and layer l the output of block l."
    if not last:
        return text
    differs = last.get("differs_from_other_point")
    other = "resid_post" if last["point"] == "final_norm" else "final_norm"
    return (f"{text} The last layer is read at `{last['point']}`: {last['meaning']}"
            + ("" if differs is None else f"; for this model the other point (`{other}`, --last-layer {other}) is "
               + ("a different one" if differs else "the same one (no final norm)")) + ".")


def report_markdown(report: Dict) -> str:
    """A readable summary of a report dict."""
    m, e = report["model"], report["epsilon"]
    inp = e["input"]
    lines = [f"# repcap report: {m['source']}", "",
             f"- weights: `{m['path']}` ({m['kind']}, architecture {m['architecture']})",
             f"- input embedding `{m['input_name']}`: {m['vocab_rows']} rows × {inp['shape'][1]}, {inp['dtype']}; "
             f"{inp['rows_used']} rows analysed"
             + (f" ({inp['zero_rows_dropped']} zero rows dropped)" if inp.get("zero_rows_dropped") else "")
             + (f"; the tokenizer's ids fill {m['tokenizer_size']} rows, so {m['padded_rows']} rows are padding"
                + (" (dropped)" if m["padded_rows"] and m["rows_kept"] <= m["tokenizer_size"] else
                   " (kept; --n-rows tokenizer drops them)" if m["padded_rows"] else "")
                if m["tokenizer_size"] else ""),
             f"- tied: {m['tied']} ({m['tied_reason']})",
             f"- {report['provenance']['time_utc']}, repcap_fast {report['provenance']['versions']['repcap_fast']}, "
             f"torch {report['provenance']['versions']['torch']}", "",
             "## ε of the embedding matrix", "",
             "| matrix | pairs | μ | σ | ε streamed | ε exact (Gram) | class |", "|---|---|---|---|---|---|---|"]
    for key in ("input", "output"):
        s = e.get(key)
        if s:
            lines.append(f"| {key} | {s['pairs']:,} | {_fmt(s['stream']['mean'], '.6f')} | "
                         f"{_fmt(s['stream']['std'], '.6f')} | "
                         f"{_fmt(s['epsilon'], '.6f')} | {_fmt(s['exact']['epsilon'], '.6f')} | "
                         f"{s['class_description']} |")
    lines += ["", "Capacity (the most features a d-dimensional space holds at this ε) and the Welch/orthoplex floor "
              "on max|c| for that many vectors:", "", "| formula | capacity k | log10 k | floor on max \\|c\\| |",
              "|---|---|---|---|"]
    for name, row in inp["capacity"]["formulas"].items():
        lines.append(f"| {name} | " + ("n/a | n/a | n/a |" if row is None else
                                      f"{_fmt(row['capacity'], '.4g')} | {_fmt(row['log10_capacity'], '.2f')} | "
                                      f"{_fmt(row['welch_floor'], '.5f')} |"))
    if inp["class"] == 1:
        lines.append("\n**Class 1 (ε > 0.2): there is no near-orthogonal structure, and these capacities are "
                     "indeterminate.**")
    if "welch_floor_vocab" in inp["capacity"]:
        lines.append(f"\nNo {inp['capacity']['vocab']} unit vectors in R^{inp['capacity']['d']} have max|c| below "
                     f"{inp['capacity']['welch_floor_vocab']:.6f}.")
    if e.get("input_vs_output"):
        x = e["input_vs_output"]
        lines.append(f"\nEmbedding vs unembedding: cos(E_i, U_i) of the same token has mean "
                     f"{x['same_token']['mean']:.4f} "
                     f"(std {x['same_token']['std']:.4f}); over all pairs, mean {x['all_pairs']['mean']:.4f}, "
                     f"ε {x['all_pairs']['epsilon']:.4f}.")
    elif e.get("note"):
        lines.append(f"\n({e['note']}.)")
    lines.append("\n![cosines](cosine_histogram.png)\n")
    if "skipped" in report.get("pga", {}):
        lines += ["## Subspace PGA and spectra", "", f"Not run: {report['pga']['skipped']}."]
    if "profile" in report.get("pga", {}):
        p = report["pga"]
        hs = report["hidden_states"]
        lines += ["## Subspace PGA", "",
                  f"{hs['n_tokens']} tokens of {hs['text']['name']} (seed {hs['seed']}, {hs['windows_run']} windows of "
                  f"{hs['seq_len']}), readout: {p['readout']}, k = {p['k']}, {p['n_null']} null subspaces.", "",
                  _layer_points(p.get("last_layer")), "",
                  "| layer | " + " | ".join(f"z CCR-{c}" for c in p["profile"]) + " |",
                  "|---|" + "---|" * len(p["profile"])]
        probe = {r["layer"]: r for r in report["probe"]["layers"]} if report.get("probe") else None
        if probe is not None:
            lines[-2] += " probe accuracy |"
            lines[-1] += "---|"
        for i, layer in enumerate(r["layer"] for r in next(iter(p["profile"].values()))):
            zs = " | ".join(_fmt(rows[i]["z"], ".2f") + (" ⚠" if rows[i].get("warnings") else "")
                            for rows in p["profile"].values())
            acc = "" if probe is None else (f" {_fmt(probe[layer]['accuracy'], '.3f')} ± "
                                            f"{_fmt(probe[layer]['std'], '.3f')} |" if layer in probe else " |")
            lines.append(f"| {layer} | {zs} |{acc}")
        if probe is not None:
            pr = report["probe"]
            lines += ["", f"Probe accuracy: {pr['n_texts']} labelled texts of {os.path.basename(pr['file'])} "
                          f"({', '.join(f'{k}: {v}' for k, v in pr['labels'].items())}; chance "
                          f"{pr['layers'][0]['chance']:.3f}), {pr['pooling']}-pooled per layer, {pr['classifier']}, "
                          f"{pr['folds']} folds (mean ± std). ![probe](probe.png)"]
        flagged = [(ccr, row) for ccr, rows in p["profile"].items() for row in rows if row.get("warnings")]
        if flagged:
            lines += ["", "**Degenerate inputs (⚠):**", ""]
            lines += [f"- layer {row['layer']}, CCR-{ccr}: {note}" for ccr, row in flagged for note in row["warnings"]]
        lines += ["", "![pga](pga_profile.png)", "", "## Spectra per layer", "",
                  "| layer | RankMe | α-ReQ | isotropy | condition | top-PC mass in readout |",
                  "|---|---|---|---|---|---|"]
        for r in report["spectral"]["layers"]:
            lines.append(f"| {r['layer']} | {_fmt(r['rankme'], '.1f')} | {_fmt(r['alpha_req'], '.3f')} | "
                         f"{_fmt(r['isotropy'], '.3g')} | {_fmt(r['condition_number'], '.3g')} | "
                         f"{_fmt(r['readout_alignment_top'][0], '.3f')} |")
        lines += ["", "![spectra](spectral.png)"]
    secs = report["provenance"]["seconds"]
    lines += ["", "Time: " + ", ".join(f"{k} {v:.1f} s" for k, v in secs.items()), ""]
    return "\n".join(lines)


# --- survey ---------------------------------------------------------------------------------------

def run_survey(sources: Sequence, out: str = "repcap_survey", *, bins: int = 4096, k_sigma: float = 2.0,
               backend: str = "auto", device="cpu", n_rows=None, zero_rows: str = "error", progress: bool = True,
               log=print, command: Optional[List[str]] = None) -> Dict:
    """Several models side by side, like the paper's table: d_model, ε, class, capacity; and the
    plot of ε against d_model. A source is a path, repo id or alias, or a model in memory (its
    input embedding; an SAE's W_dec). Writes OUT/survey.json, OUT/survey.md and OUT/epsilon_vs_d.png.
    Every source's header and tensor names are checked before the first ε pass; an earlier
    survey's files are removed at the start, and survey.json is rewritten as each model finishes
    ("complete": false with the models done and those "pending", then "complete": true)."""
    if not sources:
        raise ValueError("survey needs at least one SOURCE")
    # every argument and every source checked before the first model loads
    check_stats_settings(val.check_device(device), bins, zero_rows=zero_rows, backend=backend)
    k_sigma = val.as_real(k_sigma, "k_sigma")
    sources = [in_memory_source(source) if is_in_memory(source) else source for source in sources]
    for source in sources:  # every source's header and tensor names, before the first ε pass
        if not is_in_memory(source):
            check_embeddings(source, which="input", n_rows=n_rows)
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in SURVEY_FILES],
                     [(f"source {s!r}", s if isinstance(s, (str, os.PathLike)) else None) for s in sources])
    remove_stale(out, SURVEY_FILES)  # survey.json is rewritten as each model finishes
    settings_doc = {"sources": [_source_label(s) for s in sources], "bins": bins, "k_sigma": k_sigma,
                    "n_rows": n_rows, "zero_rows": zero_rows}
    rows = []
    for i, source in enumerate(sources):
        t0 = _stage(_source_label(source), log)
        emb = load_embeddings(source, which="input", n_rows=n_rows, device=device)
        eps, _ = epsilon_analysis(emb.input, bins=bins, k_sigma=k_sigma, backend=backend, zero_rows=zero_rows,
                                  progress=progress)
        full = eps["capacity"]["formulas"]["full"]
        rows.append({"source": _source_label(source), "architecture": emb.architecture, "vocab_rows": emb.rows_kept,
                     "rows_used": eps["rows_used"], "zero_rows_dropped": eps["zero_rows_dropped"],
                     "d_model": emb.d_model, "tied": emb.tied, "epsilon": eps["epsilon"],
                     "epsilon_exact": eps["exact"]["epsilon"], "mean": eps["stream"]["mean"],
                     "std": eps["stream"]["std"],
                     "class": eps["class"], "class_description": eps["class_description"],
                     "capacity_full": None if full is None else full["capacity"],
                     "log10_capacity_full": None if full is None else full["log10_capacity"],
                     "welch_floor_vocab": eps["capacity"].get("welch_floor_vocab"),
                     "model": emb.to_dict(), "seconds": time.perf_counter() - t0})
        log(f"   d={emb.d_model} ε={eps['epsilon']:.4f} {eps['class_description']}")
        if i + 1 < len(sources):  # partial results, marked as such, as each model finishes
            write_json_atomic(os.path.join(out, "survey.json"), _clean({
                "provenance": _provenance(command, settings_doc), "complete": False,
                "pending": [_source_label(s) for s in sources[i + 1:]], "models": rows}), indent=1, allow_nan=False)
    doc = _clean({"provenance": _provenance(command, settings_doc), "complete": True, "models": rows})
    write_json_atomic(os.path.join(out, "survey.json"), doc, indent=1, allow_nan=False)
    md = ["# repcap survey", "", "| model | d_model | V | ε | class | capacity (full form) |",
          "|---|---|---|---|---|---|"]
    for r in doc["models"]:
        cap = "indeterminate" if r["class"] == 1 else _fmt(r["capacity_full"], ".3g")
        md.append(f"| {r['source']} | {r['d_model']} | {r['rows_used']} | {_fmt(r['epsilon'])} | "
                  f"{r['class_description']} | "
                  f"{cap} |")
    md += ["", "![epsilon vs d](epsilon_vs_d.png)", ""]
    with open(os.path.join(out, "survey.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    plotting.plot_survey(doc["models"], os.path.join(out, "epsilon_vs_d.png"))
    log(f"== wrote {out}/survey.json, survey.md and epsilon_vs_d.png")
    return doc


AGREEMENT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in text.strip("/").split("/")[-1])
    return keep[:60] or "model"


def run_pga_survey(sources: Sequence, out: str = "repcap_survey", settings: Optional[ReportSettings] = None, *,
                   texts: Optional[Sequence[str]] = None, text_name: Optional[str] = None, token_ids=None,
                   agreement_null: int = 10, progress: bool = True, log=print,
                   command: Optional[List[str]] = None) -> Dict:
    """Subspace PGA across models or training checkpoints (`repcap survey --pga`): the whole report
    of each source (in OUT/NN_name/), then z per (layer, model) for every CCR variant with the
    top-PC readout mass, as a table (survey.md), a heatmap (pga_heatmap.png: models × layers) and
    trajectories against relative depth (pga_depth.png); and, for every two models that ran on the
    same tokens (a shared tokenizer, text and seed), their cross-model agreement
    (`pga.cross_model_agreement`: Spearman of their pair distances in their readout subspaces, in
    the full spaces and in random subspaces, `agreement_null` draws, after CCR with the first of
    settings.ccrs) at the relative depths AGREEMENT_DEPTHS, matching each model's layer nearest to
    depth·L. Every source runs with the same settings. The hidden states of every model are kept
    until the agreement is computed (N × d × (L+1) float32 numbers per model). Returns the survey
    dict (also OUT/survey.json)."""
    if not sources:
        raise ValueError("survey needs at least one SOURCE")
    settings = settings or ReportSettings()
    agreement_null = val.check_n_null(agreement_null)
    sources = [in_memory_source(source) if is_in_memory(source) else source for source in sources]
    for source in sources:  # every source's header and tensor names checked before the first model loads
        if not is_in_memory(source):
            if settings.init == "trained":
                check_embeddings(source, which="input", n_rows=settings.n_rows)
            else:  # a random init needs only the config and a tokenizer: no weights to check
                resolve_source(source)
    if settings.probe_file is not None:
        check_probe_file(settings.probe_file, settings.probe_folds)
    if texts is not None and token_ids is not None:
        raise ValueError("pass texts or token_ids, not both")
    if (texts is not None or token_ids is not None) and settings.text_file is not None:
        raise ValueError(f"pass {'texts' if texts is not None else 'token_ids'} or settings.text_file "
                         f"({settings.text_file!r}), not both: the reports would sample only one of them")
    out = val.check_output_folder(out, "out")
    check_no_clobber([(f"out/{name}", os.path.join(out, name)) for name in SURVEY_FILES],
                     [(f"source {s!r}", s if isinstance(s, (str, os.PathLike)) else None) for s in sources]
                     + _report_inputs(None, settings))
    folders = [f"{i:02d}_{_slug(_source_label(source) or 'default')}" for i, source in enumerate(sources)]
    _remove_earlier_survey_reports(out, folders)
    remove_stale(out, SURVEY_FILES)  # survey.json is rewritten as each model finishes
    t_all = time.perf_counter()
    runs = []
    for i, source in enumerate(sources):
        label, folder = _source_label(source) or "default", folders[i]
        log(f"=== {i + 1}/{len(sources)}: {label}")
        keep: Dict = {}
        rep = run_report(source, os.path.join(out, folder), settings, texts=texts, text_name=text_name,
                         token_ids=token_ids, progress=progress, log=log, command=command, _keep=keep)
        runs.append((label, folder, rep, keep))
        if i + 1 < len(sources):  # partial results, marked as such, as each model finishes
            write_json_atomic(os.path.join(out, "survey.json"), _clean({
                "provenance": _provenance(command, {"sources": [_source_label(s) or "default" for s in sources],
                                                    **settings.to_dict(), "agreement_null": agreement_null}),
                "complete": False, "pending": [_source_label(s) or "default" for s in sources[i + 1:]],
                "models": [_survey_row(lab, fol, r) for lab, fol, r, _ in runs]}), indent=1, allow_nan=False)
    models = [_survey_row(label, folder, rep) for label, folder, rep, _ in runs]
    agreement = []
    with_states = [(i, label, rep, keep) for i, (label, _, rep, keep) in enumerate(runs) if "states" in keep]
    pairs = [(a, b) for i, a in enumerate(with_states) for b in with_states[i + 1:]]
    ccr = settings.ccrs[0]
    for (ia, la, ra, ka), (ib, lb, rb, kb) in pairs:
        names = {"a": la, "b": lb, "a_index": ia, "b_index": ib}
        if ra["hidden_states"]["token_ids"] != rb["hidden_states"]["token_ids"]:
            agreement.append({**names, "skipped": "the two models ran on different tokens (another tokenizer, text "
                              "or seed): their pair distances cannot be compared"})
            continue
        na, nb = ka["states"].layers[-1], kb["states"].layers[-1]
        rows = []
        for depth in AGREEMENT_DEPTHS:
            layer_a, layer_b = _nearest(ka["states"].layers, depth * na), _nearest(kb["states"].layers, depth * nb)
            if rows and rows[-1]["layer_a"] == layer_a and rows[-1]["layer_b"] == layer_b:
                continue
            log(f"   agreement {la} layer {layer_a} vs {lb} layer {layer_b}")
            res = cross_model_agreement(ka["states"][layer_a], kb["states"][layer_b], ka["basis"], kb["basis"],
                                        n_null=agreement_null, ccr=ccr, seed=settings.seed)
            rows.append({"depth": depth, "layer_a": layer_a, "layer_b": layer_b,
                         **{k: res[k] for k in ("readout", "full", "random_mean", "random_std", "ccr")}})
        agreement.append({**names, "n_tokens": len(ra["hidden_states"]["token_ids"]), "layers": rows})
    doc = _clean({"provenance": _provenance(command, {"sources": [m["source"] for m in models],
                                                       **settings.to_dict(), "agreement_null": agreement_null}),
                  "complete": True, "models": models, "agreement": agreement,
                  "agreement_depths": list(AGREEMENT_DEPTHS), "seconds": time.perf_counter() - t_all})
    write_json_atomic(os.path.join(out, "survey.json"), doc, indent=1, allow_nan=False)
    with_pga = [m for m in doc["models"] if m["z"]]
    if with_pga:
        plotting.plot_pga_survey(with_pga, os.path.join(out, "pga_heatmap.png"), os.path.join(out, "pga_depth.png"))
    with open(os.path.join(out, "survey.md"), "w", encoding="utf-8") as fh:
        fh.write(pga_survey_markdown(doc))
    log(f"== wrote {out}/survey.json, survey.md" + (", pga_heatmap.png and pga_depth.png" if with_pga else "")
        + f" (each model's report in {out}/NN_name/)")
    return doc


def _remove_earlier_survey_reports(out: str, folders: Sequence[str]) -> None:
    """The report files of an earlier PGA survey in OUT (the folders its survey.json lists) that
    this survey will not rewrite: removed, so no model of an earlier survey looks like one of
    this one. Other files there are never touched."""
    try:
        with open(os.path.join(out, "survey.json"), encoding="utf-8") as fh:
            earlier = [m.get("report", "") for m in json.load(fh).get("models", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return  # no earlier survey here (or not one of ours)
    for path in earlier:
        folder = os.path.dirname(path) if isinstance(path, str) else ""
        if folder and folder not in folders and os.path.basename(folder) == folder and \
                os.path.isdir(os.path.join(out, folder)):
            remove_stale(os.path.join(out, folder), REPORT_FILES)


def _nearest(layers: Sequence[int], target: float) -> int:
    return min(layers, key=lambda layer: (abs(layer - target), layer))


def _survey_row(label: str, folder: str, rep: Dict) -> Dict:
    e = rep["epsilon"]["input"]
    row = {"source": label, "report": f"{folder}/report.json", "d_model": e["shape"][1], "vocab_rows": e["shape"][0],
           "epsilon": e["epsilon"], "epsilon_exact": e["exact"]["epsilon"], "class": e["class"], "z": {},
           "layers": [], "top_pc_readout_mass": [], "relative_depth": []}
    if "profile" in rep.get("pga", {}):
        prof = rep["pga"]["profile"]
        row["layers"] = [r["layer"] for r in next(iter(prof.values()))]
        last = max(row["layers"][-1], 1)
        row["relative_depth"] = [layer / last for layer in row["layers"]]
        row["z"] = {ccr: [r["z"] for r in rows] for ccr, rows in prof.items()}
        row["top_pc_readout_mass"] = [r["readout_alignment_top"][0] for r in rep["spectral"]["layers"]]
        row["last_layer"] = rep["pga"]["last_layer"]["point"]
        if rep.get("probe") and "layers" in rep["probe"]:
            row["probe_accuracy"] = [r["accuracy"] for r in rep["probe"]["layers"]]
    else:
        row["skipped"] = rep.get("pga", {}).get("skipped")
    return row


def pga_survey_markdown(doc: Dict) -> str:
    """A readable summary of a PGA survey (`run_pga_survey`)."""
    s = doc["provenance"]["settings"]
    lines = ["# repcap survey: Subspace PGA across models", "",
             f"k = {s['k']}, {s['n_null']} null subspaces, {s['n_tokens']} tokens, seed {s['seed']}, CCR "
             f"{', '.join(map(str, s['ccrs']))}; the last layer at `{s['last_layer']}`. Each model's full report is "
             f"linked below.", "",
             "| model | d_model | V | ε | layers | report |", "|---|---|---|---|---|---|"]
    for m in doc["models"]:
        lines.append(f"| {m['source']} | {m['d_model']} | {m['vocab_rows']} | {_fmt(m['epsilon'])} | "
                     f"{len(m['layers']) or 'n/a'} | [{m['report']}]({m['report']}) |")
    for ccr in s["ccrs"]:
        with_z = [m for m in doc["models"] if str(ccr) in m["z"]]
        if not with_z:
            continue
        depth = max(len(m["layers"]) for m in with_z)
        lines += ["", f"## z per layer, CCR-{ccr}", "", "| layer | " + " | ".join(m["source"] for m in with_z) + " |",
                  "|---|" + "---|" * len(with_z)]
        for i in range(depth):
            lines.append(f"| {i} | " + " | ".join(_fmt(m["z"][str(ccr)][i], ".2f") if i < len(m["layers"]) else ""
                                                  for m in with_z) + " |")
    with_mass = [m for m in doc["models"] if m["top_pc_readout_mass"]]
    if with_mass:
        depth = max(len(m["layers"]) for m in with_mass)
        lines += ["", "## Top principal direction's mass in the readout subspace", "",
                  "| layer | " + " | ".join(m["source"] for m in with_mass) + " |", "|---|" + "---|" * len(with_mass)]
        for i in range(depth):
            lines.append(f"| {i} | " + " | ".join(_fmt(m["top_pc_readout_mass"][i], ".3f") if i < len(m["layers"])
                                                  else "" for m in with_mass) + " |")
    for m in doc["models"]:
        if m.get("skipped"):
            lines.append(f"\n{m['source']}: no Subspace PGA ({m['skipped']}).")
    if doc["agreement"]:
        lines += ["", "## Cross-model agreement", "",
                  "Spearman of the two models' pair distances on the same tokens: in their readout subspaces, in the "
                  "full spaces, and in random subspaces of the same dimension (mean ± std).", "",
                  "| models | depth | layers | readout | full | random |", "|---|---|---|---|---|---|"]
        for a in doc["agreement"]:
            if "skipped" in a:
                lines.append(f"| {a['a']} vs {a['b']} | | | {a['skipped']} | | |")
                continue
            for r in a["layers"]:
                lines.append(f"| {a['a']} vs {a['b']} | {r['depth']:.2f} | {r['layer_a']} / {r['layer_b']} | "
                             f"{_fmt(r['readout'])} | {_fmt(r['full'])} | {_fmt(r['random_mean'])} ± "
                             f"{_fmt(r['random_std'])} |")
    if any(m["z"] for m in doc["models"]):
        lines += ["", "![z heatmap](pga_heatmap.png)", "", "![z against relative depth](pga_depth.png)"]
    return "\n".join(lines + [""])


__getattr__ = moved_names(__name__, {name: ("repcap_fast.plotting", name) for name in
                                     ("plot_cosine_histograms", "plot_pga_profile", "plot_spectral")})
