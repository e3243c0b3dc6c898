"""The report of one model (`run_report`) and of a model beside its random-init control.

`run_report` runs the stages in order; `run_control_report` runs it twice and compares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Dict, Iterator, List, Optional, Sequence

from .. import _validation as val
from .._outputs import StagedFolder, check_no_clobber, remove_stale
from ..models import read_texts
from ..probes import check_probe_file
from ._common import _clean, _file_sha256, _log_to, _provenance, _report_inputs, _source_label, _stage
from .control import _control_comparison, _write_control_report
from .settings import CONTROLS, REPORT_FILES, ReportSettings, _with_legacy
from .stages import (
    check_model_settings,
    embeddings_stage,
    epsilon_stage,
    hidden_states_stage,
    pga_stage,
    probe_stage,
    spectral_stage,
)
from .writers import write_report

_PLOTS = {"cosine_histogram": "cosine_histogram.png", "pga_profile": "pga_profile.png", "spectral": "spectral.png",
          "probe": "probe.png"}


class _Run:
    """One report being made.

    Its dict, the seconds of each stage, its plots, and its staging folder (OUT gets exactly this
    run's files at the end, even on failure).
    """

    def __init__(self, out: str, provenance: Dict, log):
        self.out, self.log = out, log
        self.report: Dict = {"provenance": provenance}
        self.seconds: Dict[str, float] = {}
        self.plots: Dict[str, str] = {}
        self.t_all = time.perf_counter()
        self.staged = StagedFolder(out, REPORT_FILES)

    @contextlib.contextmanager
    def stage(self, key: str, title: str, plot: Optional[str] = None) -> Iterator[Optional[str]]:
        """Logs the stage's title, gives where its plot goes, and records its seconds and plot when it ends."""
        t0 = _stage(title, self.log)
        yield None if plot is None else self.staged.path(_PLOTS[plot])
        self.seconds[key] = time.perf_counter() - t0
        if plot is not None:
            self.plots[plot] = _PLOTS[plot]

    def finish(self, error: Optional[BaseException] = None) -> Dict:
        """report.json (and report.md when complete) published into OUT; the cleaned report."""
        self.seconds["total"] = time.perf_counter() - self.t_all
        self.report["provenance"]["seconds"] = self.seconds
        self.report["provenance"]["plots"] = self.plots
        self.report["complete"] = error is None
        if error is not None:
            self.report["error"] = f"{type(error).__name__}: {error}"
        cleaned = _clean(self.report)
        with self.staged:  # published into OUT at the end of the block, or discarded if a write fails
            write_report(cleaned, self.staged.staging, markdown=error is None)
        return cleaned


def _prepare(source, out, settings: ReportSettings, texts, text_name, token_ids):
    """Every check that needs no model, before any work.

    (out, texts, text_name, the settings recorded in the provenance).
    """
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
    return out, texts, text_name, recorded


def run_report(source=None, out: str = "repcap_report", settings: Optional[ReportSettings] = None, *,
               texts: Optional[Sequence[str]] = None, text_name: Optional[str] = None, token_ids=None,
               tokenizer=None, control: Optional[str] = None, progress: bool = True, log=None,
               command: Optional[List[str]] = None, _keep: Optional[Dict] = None, **legacy) -> Dict:
    """Runs the whole analysis of one model and writes OUT/report.json, OUT/report.md and the plots.

    The stages, in order: the embedding matrices (`embeddings_stage`), the settings checked
    against the model (`check_model_settings`), the hidden states (`hidden_states_stage`), ε
    (`epsilon_stage`), Subspace PGA (`pga_stage`), the spectra (`spectral_stage`) and, with a
    probe file, linear probes (`probe_stage`). A source without an unembedding or a model to run
    gets ε only. Every check that needs no model (the output folder, the text and probe files)
    runs before any work, and the hidden states (where a too-short text shows) before the V² pass
    of ε. No output may be an input. Every file is written into a staging folder and moved into
    OUT at the end, replacing all of an earlier run's report files (`REPORT_FILES`; other files in
    OUT are never touched). If a stage fails (or the run is interrupted), report.json is still
    written with the stages that finished, "complete": false and the error, and the error is raised.

    Args:
        source (str | os.PathLike | object | None): a path, repo id or alias, or a model in memory (a
            transformers model, a TransformerLens HookedTransformer, an nnsight LanguageModel, an
            SAE-Lens SAE; with settings.init="random" also a transformers config). A model in memory
            is analysed where it is, in its own dtype, and never moved or cast. None: the default
            model (MiniLM).
        out (str): the output folder. Default "repcap_report".
        settings (ReportSettings | None): what to compute; None: the papers' settings.
        texts (Sequence[str] | None): texts to sample tokens from instead of settings.text_file or the
            bundled corpus. Default None.
        text_name (str | None): the name of the texts in the report. Default None.
        token_ids (object): token ids instead of a text: a 1-D stream, or a 2-D batch of windows (no
            tokenizer needed). Default None.
        tokenizer (object): a model in memory's tokenizer, when it does not carry one. Default None.
        control (str | None): "random": `run_control_report`, the weights and the same architecture
            at initialization side by side. Default None.
        progress (bool): show progress bars. Default True.
        log (Callable[[str], None] | None): receives one line per stage. Default None: the lines go to the
            ``repcap_fast.report`` logger at INFO (``repcap`` prints them; configure ``logging`` to see them).
        command (list[str] | None): the command line, recorded in the provenance. Default None.
        **legacy (object): the settings as keywords (n_tokens=..., k=...): deprecated, use settings.

    Returns:
        dict: the report (as report.json holds it): provenance, model, epsilon, hidden_states, pga,
        spectral (and probe), complete.

    Raises:
        ValueError: an invalid argument or one that does not fit the model (k ≥ d_model, a layer out
            of range, texts and token_ids both given, a text too short for n_tokens, an output that
            is an input), or a stage's error.
        TypeError: an unknown legacy keyword, or a value of the wrong type.
        FileNotFoundError: the source, text file or probe file does not exist.

    Examples:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "E.npy")
        >>> np.save(path, np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32))
        >>> doc = rf.report.run_report(path, os.path.join(folder, "out"), rf.report.ReportSettings(bins=64),
        ...                            progress=False, log=lambda line: None)
        >>> doc["complete"], doc["epsilon"]["input"]["pairs"], doc["pga"]["skipped"][:15]
        (True, 44850, 'no unembedding:')
        >>> doc = rf.report.run_report("minilm", "minilm_report")  # doctest: +SKIP

        The last line (the whole report of MiniLM, with Subspace PGA of every layer) takes minutes.
    """
    log = _log_to(log)
    settings = _with_legacy(settings or ReportSettings(), legacy)
    if control is not None:
        val.check_choice(control, "control", CONTROLS)
        return run_control_report(source, out, settings, texts=texts, text_name=text_name, token_ids=token_ids,
                                  tokenizer=tokenizer, progress=progress, log=log, command=command)
    s = settings
    out, texts, text_name, recorded = _prepare(source, out, s, texts, text_name, token_ids)
    run = _Run(out, _provenance(command, recorded), log)
    try:
        with run.stage("load", "loading the embedding matrices" + (" (building the model at initialization)"
                                                                   if s.init == "random" else "")):
            rm = embeddings_stage(source, s, tokenizer=tokenizer)
            run.report["model"] = rm.to_dict()
        emb = rm.embeddings
        log(f"   {emb.kind} · {emb.architecture} · {emb.rows_kept}×{emb.d_model} · tied={emb.tied} ({emb.tied_reason})")
        if rm.skip is None:
            layers = check_model_settings(rm, s)  # before any heavy work
            with run.stage("hidden_states", f"hidden states ({s.n_tokens} tokens, seed {s.seed})"):
                states = hidden_states_stage(rm, s, layers=layers, texts=texts, token_ids=token_ids,
                                             text_name=text_name, progress=progress)
                run.report["hidden_states"] = states.to_dict()
            if s.probe_file is None:
                rm.drop_built_model()  # the rest needs only the states and the embeddings
        with run.stage("epsilon", "ε of the embedding matrix (streamed over all pairs, and exact)",
                       plot="cosine_histogram") as plot:
            run.report["epsilon"] = epsilon_stage(emb, s, progress=progress, plot=plot)
        eps = run.report["epsilon"]["input"]
        log(f"   ε = {eps['epsilon']:.6f} (exact {eps['exact']['epsilon']:.6f}) · {eps['class_description']}")
        if rm.skip is not None:
            run.report["hidden_states"] = run.report["pga"] = run.report["spectral"] = {"skipped": rm.skip}
            log(f"   no hidden states, PGA or spectra: {rm.skip}")
        else:
            with run.stage("pga", f"Subspace PGA: {len(states)} layers × CCR {list(s.ccrs)}, k={s.k}, {s.n_null} "
                                  f"null subspaces", plot="pga_profile") as plot:
                run.report["pga"], basis = pga_stage(states, emb, s, progress=progress, plot=plot)
            if _keep is not None:  # for run_pga_survey's cross-model agreement
                _keep.update(states=states, basis=basis)
            with run.stage("spectral", "spectral metrics and readout alignment per layer", plot="spectral") as plot:
                run.report["spectral"] = spectral_stage(states, basis, s, plot=plot,
                                                        title=f"{emb.source}: spectra per layer")
            if s.probe_file is not None:
                with run.stage("probe", f"linear probes per layer on {os.path.basename(s.probe_file)}",
                               plot="probe") as plot:
                    run.report["probe"] = probe_stage(rm, states.layers, s, pga=run.report["pga"],
                                                      progress=progress, plot=plot)
    except BaseException as exc:
        run.finish(exc)
        log(f"== failed: {type(exc).__name__}: {exc} (what finished is in {out}/report.json)")
        raise
    report = run.finish()
    log(f"== wrote {out}/report.json, report.md and {len(run.plots)} plots in {run.seconds['total']:.1f} s")
    return report


def run_control_report(source=None, out: str = "repcap_report", settings: Optional[ReportSettings] = None, *,
                       progress: bool = True, log=None, command: Optional[List[str]] = None, **kwargs) -> Dict:
    """A model and its random-init control, side by side: two whole reports and their comparison.

    The report of the weights goes to OUT/trained, that of the same architecture at
    initialization (seeded with settings.seed) to OUT/random_init, and OUT/report.json,
    OUT/report.md and OUT/pga_control.png compare them: ε of both, and z per layer of both. Both
    use the same settings, token sample and null subspaces, so they differ only in the weights.
    If one fails, OUT/report.json says which ("failed") and the error is raised.

    Args:
        source (str | os.PathLike | object | None): as for `run_report`.
        out (str): the output folder. Default "repcap_report".
        settings (ReportSettings | None): what to compute (settings.init must be "trained"); None:
            the papers' settings.
        progress (bool): show progress bars. Default True.
        log (Callable[[str], None] | None): receives one line per stage. Default None: the lines go to the
            ``repcap_fast.report`` logger at INFO (``repcap`` prints them; configure ``logging`` to see them).
        command (list[str] | None): the command line, recorded in the provenance. Default None.
        **kwargs (object): as for `run_report`: texts, text_name, token_ids, tokenizer.

    Returns:
        dict: the comparison (provenance, complete, reports, comparison: epsilon and pga), with the
        two reports under "trained" and "random_init".

    Raises:
        ValueError: settings.init is not "trained", an output that is an input, or what
            `run_report` raises.
        FileNotFoundError: the source does not exist.

    Examples:
        >>> doc = rf.report.run_control_report("minilm", "minilm_control")  # doctest: +SKIP
        >>> sorted(doc["comparison"])  # doctest: +SKIP
        ['epsilon', 'pga']

        Skipped: it runs two whole reports of a real model (minutes).
    """
    log = _log_to(log)
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
        with staged:
            write_report(_clean({"provenance": provenance, "complete": False, "error": f"{type(exc).__name__}: {exc}",
                                 "failed": started[-1], "reports": {name: f"{name}/report.json" for name in started},
                                 **reports}), staged.staging, markdown=False)
        raise
    doc = {"provenance": provenance, "complete": True, "reports": {name: f"{name}/report.json" for name in reports},
           **reports}
    doc["comparison"] = _control_comparison(reports["trained"], reports["random_init"])
    doc["provenance"]["seconds"] = {"total": time.perf_counter() - t0}
    doc = _clean(doc)
    with staged:  # published into OUT at the end of the block, or discarded if a write fails
        _write_control_report(doc, staged, settings.seed)
    log(f"== wrote {out}/report.json, report.md and pga_control.png (each analysis in {out}/trained and "
        f"{out}/random_init)")
    return doc
