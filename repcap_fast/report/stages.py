"""The stages of a report, one function each, in the order `run_report` runs them.

The embedding matrices (`embeddings_stage`), the hidden states (`hidden_states_stage`), ε
(`epsilon_stage`), Subspace PGA (`pga_stage`), the spectra (`spectral_stage`) and the linear probes
(`probe_stage`). Each returns its section of report.json and, given a path, writes its plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _validation as val
from .. import plotting
from .._backends import resolve_backend
from ..geometry import readout_basis
from ..models import (
    Embeddings,
    HiddenStates,
    InMemorySource,
    NoUnembeddingError,
    check_layers,
    hidden_states,
    is_in_memory,
    layer_count,
    load_embeddings,
    open_model,
    runnable,
)
from ..ops.pairwise_cosine_stats import check_settings as check_stats_settings
from ..pga import pga_profile
from ..probes import probe_profile
from ._common import _finite
from .analyses import embedding_vs_unembedding, epsilon_analysis, spectral_profile
from .settings import ReportSettings


@dataclass
class ReportModel:
    """The model a report analyses, once loaded: its embedding matrices and what can run on it.

    Attributes:
        source (object): what the later stages run: the path, repo id or alias as given, or the model
            in memory (given, or built at initialization).
        embeddings (Embeddings): the input embedding and, when there is one, the unembedding.
        model (InMemorySource | None): the model object when it is in memory, else None.
        device (str): where the ops run (settings.device, a model in memory's device, or "cpu").
        skip (str | None): why no hidden states, PGA or spectra can run (no unembedding, a single
            matrix without a model), or None.

    Examples:
        >>> rm = rf.report.embeddings_stage("minilm", rf.report.ReportSettings(n_rows=500))
        >>> rm.embeddings.input.shape, rm.device, rm.skip
        (torch.Size([500, 384]), 'cpu', None)
    """

    source: Any
    embeddings: Embeddings
    model: Optional[InMemorySource]
    device: str
    skip: Optional[str]

    def to_dict(self) -> Dict:
        """The "model" section of report.json: the embeddings' provenance, the device, the model in memory."""
        out = self.embeddings.to_dict()
        out["device"] = self.device
        if self.model is not None:
            out["in_memory"] = self.model.describe()
        return out

    def drop_built_model(self) -> None:
        """Lets a model built at initialization go (the later stages need only the states and the embeddings)."""
        if self.model is not None and self.model.init == "random":
            self.source = self.model = None


def _load_for_report(source, n_rows, device) -> Tuple[Embeddings, Optional[str]]:
    """Both matrices when the source has an unembedding, else the input alone (and why)."""
    try:
        return load_embeddings(source, which="both", n_rows=n_rows, device=device), None
    except NoUnembeddingError as exc:
        return load_embeddings(source, which="input", n_rows=n_rows, device=device), str(exc)


def embeddings_stage(source, settings: ReportSettings, *, tokenizer=None) -> ReportModel:
    """Loads the embedding matrices of a model, and says whether its hidden states can run.

    A model in memory (or one built at initialization, settings.init="random") is opened first
    (`models.open_model`) and stays where it is; the ops then run on its device, and the backend is
    checked for that device.

    Args:
        source (str | os.PathLike | object | None): a path, repo id or alias, or a model in memory
            (`models.in_memory_source`); None: the default model.
        settings (ReportSettings): n_rows, init, seed, dtype, device, backend, bins, precision are used.
        tokenizer (object | None): a model in memory's tokenizer, when it does not carry one. Default None.

    Returns:
        ReportModel: the embeddings, the model in memory (or None), the device, and why the later
        stages cannot run (or None).

    Raises:
        ValueError: tokenizer given for a model read from disk, a backend or precision that the
            device cannot run, a source without an embedding tensor, or a model in memory on another
            device or dtype than settings asks.
        FileNotFoundError: the source is not on this machine.

    Examples:
        >>> rm = rf.report.embeddings_stage("minilm", rf.report.ReportSettings(n_rows=1000))
        >>> rm.embeddings.rows_kept, rm.embeddings.tied, rm.to_dict()["device"]
        (1000, True, 'cpu')
    """
    s = settings
    model = None  # the model object when it is in memory (given, or built at initialization)
    if s.init == "random" or is_in_memory(source):
        model, _ = open_model(source, tokenizer=tokenizer, init=s.init, seed=s.seed, dtype=s.dtype, device=s.device)
        source = model
    elif tokenizer is not None:
        raise ValueError("tokenizer= is for a model in memory; a model read from disk uses its own tokenizer")
    device = s.device if s.device is not None else str(model.device) if model is not None else "cpu"
    if s.device is None:  # the model's device (or the CPU) decides where the ops run: their backend checked
        check_stats_settings(val.check_device(device), s.bins, zero_rows=s.zero_rows, backend=s.backend,
                             precision=s.precision)
        resolve_backend(s.backend, val.check_device(device), "subspace_pga")
    emb, no_unembedding = _load_for_report(source, s.n_rows, device)
    can_run, why = runnable(source)
    skip = f"no unembedding: {no_unembedding}" if no_unembedding is not None else None if can_run else why
    return ReportModel(source, emb, model, device, skip)


def check_model_settings(rm: ReportModel, settings: ReportSettings) -> Optional[List[int]]:
    """Checks the settings that depend on the model (k, the CCR variants, the layers), before any heavy work.

    Args:
        rm (ReportModel): the loaded model (`embeddings_stage`).
        settings (ReportSettings): k, ccrs and layers are checked.

    Returns:
        list[int] | None: the layers the model's config promises, or None when its config does not
        say how many blocks it has.

    Raises:
        ValueError: k ≥ d_model, a CCR-m with m ≥ d_model, a layer out of range, or the model
            cannot run text (rm.skip).

    Examples:
        >>> rm = rf.report.embeddings_stage("minilm", rf.report.ReportSettings(n_rows=500))
        >>> rf.report.check_model_settings(rm, rf.report.ReportSettings(layers=[0, -1]))
        [0, 6]
    """
    if rm.skip is not None:
        raise ValueError(f"no hidden states: {rm.skip}")
    s, d = settings, rm.embeddings.d_model
    val.check_k(s.k, d)
    if max(s.ccrs) >= d:
        raise ValueError(f"ccrs: CCR-{max(s.ccrs)} needs ccr < d_model, and this model has d_model = {d}")
    n_layers = layer_count(rm.embeddings.config)
    return None if n_layers is None else check_layers(s.layers, n_layers)


def hidden_states_stage(rm: ReportModel, settings: ReportSettings, *, layers: Optional[List[int]] = None,
                        texts: Optional[Sequence[str]] = None, token_ids=None, text_name: Optional[str] = None,
                        progress: bool = True) -> HiddenStates:
    """Runs the model on a seeded token sample and keeps its hidden states at the requested layers.

    `models.hidden_states` with the settings' sample (n_tokens, seed, batch_size, last_layer,
    layers); a model in memory runs where it is, one read from disk in settings.dtype on
    settings.device. The states go to the device the ops run on.

    Args:
        rm (ReportModel): the loaded model (`embeddings_stage`).
        settings (ReportSettings): the token sample and the layers.
        layers (list[int] | None): the layers the config promises (`check_model_settings`); the run
            must give exactly these. None: not checked. Default None.
        texts (Sequence[str] | None): texts to sample from instead of the bundled corpus. Default None.
        token_ids (object): token ids instead of a text (1-D stream or 2-D batch). Default None.
        text_name (str | None): the texts' name in the report. Default None.
        progress (bool): show a progress bar. Default True.

    Returns:
        HiddenStates: layer → N×d float32 states, with their provenance (`to_dict`).

    Raises:
        ValueError: the text is too short for n_tokens, texts and token_ids both given, a tokenizer
            that does not fit, or float16 activations out of range.
        RuntimeError: the model ran other layers than its config promised.

    Examples:
        >>> s = rf.report.ReportSettings(n_tokens=64, layers=[0, 6], ccrs=1, n_rows=500)
        >>> rm = rf.report.embeddings_stage("minilm", s)
        >>> states = rf.report.hidden_states_stage(rm, s, texts=["The cat sat on the mat. " * 20], progress=False)
        >>> states.layers, tuple(states[6].shape)
        ([0, 6], (64, 384))
    """
    s = settings
    in_memory = rm.model is not None
    states = hidden_states(rm.source, texts=texts, token_ids=token_ids, layers=s.layers, n_tokens=s.n_tokens,
                           batch_size=s.batch_size, dtype=None if in_memory else s.dtype,
                           device=None if in_memory else s.device, seed=s.seed, text_name=text_name,
                           progress=progress, last_layer=s.last_layer, states_device=rm.device)
    if layers is not None and states.layers != layers:
        raise RuntimeError(f"the model ran layers {states.layers}, its config says {layers}")
    return states


def epsilon_stage(embeddings: Embeddings, settings: ReportSettings, *, progress: bool = True,
                  plot: Optional[str] = None) -> Dict:
    """ε of the input embedding, and of the unembedding and the two against each other when they are untied.

    `epsilon_analysis` of each matrix (ε = μ + k_sigma·σ of the pair cosines, streamed and
    exact, with class and capacities) and, for an untied model, `embedding_vs_unembedding`.

    Args:
        embeddings (Embeddings): the matrices (`embeddings_stage`, or `models.load_embeddings`).
        settings (ReportSettings): bins, k_sigma, backend, zero_rows and precision are used.
        progress (bool): show progress bars on long passes. Default True.
        plot (str | None): where to write the histogram of the cosines (PNG); None: no plot. Default None.

    Returns:
        dict: the "epsilon" section: ``input``, ``output`` (None when tied or absent, with a
        ``note``), and ``input_vs_output`` for an untied model.

    Raises:
        ValueError: a zero row with zero_rows="error", a NaN or inf value, or a setting the device
            cannot run.

    Examples:
        >>> s = rf.report.ReportSettings(n_rows=500, bins=256)
        >>> section = rf.report.epsilon_stage(rf.load_embeddings("minilm", n_rows=500), s, progress=False)
        >>> section["input"]["pairs"], section["output"], section["note"]
        (124750, None, 'tied: the unembedding is the input embedding')
    """
    s, emb = settings, embeddings
    matrix = emb.input if emb.input is not None else emb.output
    eps_kw = dict(bins=s.bins, k_sigma=s.k_sigma, backend=s.backend, zero_rows=s.zero_rows, precision=s.precision,
                  progress=progress)
    eps_in, stats_in = epsilon_analysis(matrix, **eps_kw)
    section = {"input": eps_in}
    curves = [("input embedding", stats_in)]
    if emb.tied is False and emb.output is not None:
        eps_out, stats_out = epsilon_analysis(emb.output, **eps_kw)
        section["output"] = eps_out
        curves.append(("unembedding", stats_out))
        section["input_vs_output"] = embedding_vs_unembedding(emb.input, emb.output, **eps_kw)
    else:
        section["output"] = None
        section["note"] = ("tied: the unembedding is the input embedding" if emb.tied
                           else "no unembedding in this source")
    if plot is not None:
        plotting.plot_cosine_histograms(curves, plot, f"{emb.source}: {emb.rows_kept}×{emb.d_model}", s.k_sigma)
    return section


def pga_stage(states: HiddenStates, embeddings: Embeddings, settings: ReportSettings, *, progress: bool = True,
              plot: Optional[str] = None) -> Tuple[Dict, torch.Tensor]:
    """Subspace PGA of every layer for every CCR variant: z of the readout subspace against random ones.

    The readout basis is the top-k right singular vectors of the unembedding W_U
    (`pga.readout_basis`); per layer and CCR-m, ρ_readout = Spearman(d_full, d_readout) of the
    pair cosine distances, and z = (ρ_readout − mean ρ_b) / std ρ_b over n_null random
    subspaces (`pga.pga_profile`).

    Args:
        states (HiddenStates): the states of each layer (`hidden_states_stage`).
        embeddings (Embeddings): the unembedding (``output``) gives the readout basis.
        settings (ReportSettings): k, n_null, ccrs, seed, backend and precision are used.
        progress (bool): show a progress bar. Default True.
        plot (str | None): where to write z per layer (PNG); None: no plot. Default None.

    Returns:
        tuple[dict, torch.Tensor]: the "pga" section (k, n_null, seed, ccrs, readout, readout_solver,
        last_layer, profile: CCR → rows of layer, z, rho_readout, null_mean, null_std, null_rhos,
        n_pairs, backend, warnings) and the d×k readout basis.

    Raises:
        ValueError: k ≥ d, a CCR-m with m ≥ min(N, d), or states that hold NaN/inf.

    Examples:
        >>> s = rf.report.ReportSettings(n_tokens=64, layers=[0, 6], ccrs=1, k=16, n_null=5, n_rows=2000)
        >>> rm = rf.report.embeddings_stage("minilm", s)
        >>> texts = rf.models.default_corpus()[1][:40]
        >>> states = rf.report.hidden_states_stage(rm, s, texts=texts, progress=False)
        >>> section, basis = rf.report.pga_stage(states, rm.embeddings, s, progress=False)
        >>> [row["layer"] for row in section["profile"]["1"]], tuple(basis.shape)
        ([0, 6], (384, 16))
    """
    s, emb = settings, embeddings
    readout = readout_basis(emb.output, s.k)  # once, for the profile and the spectra
    results = pga_profile([states[layer] for layer in states.layers], basis=readout.basis, n_null=s.n_null,
                          ccrs=s.ccrs, seed=s.seed, backend=s.backend, precision=s.precision, progress=progress)
    profile = {str(ccr): [{"layer": layer, **{key: _finite(getattr(r, key)) for key in
                                             ("z", "rho_readout", "null_mean", "null_std")},
                           "null_rhos": [_finite(x) for x in r.null_rhos], "n_pairs": r.n_pairs,
                           "backend": r.backend, "warnings": list(r.warnings)}
                          for layer, r in zip(states.layers, per_layer)]
               for ccr, per_layer in results.items()}
    section = {"k": s.k, "n_null": s.n_null, "seed": s.seed, "ccrs": list(s.ccrs),
               "readout": "top-k right singular vectors of W_U (the unembedding"
                          + (", tied to the input embedding)" if emb.tied else ")"),
               "readout_solver": readout.solver, "last_layer": states.meta["last_layer"], "profile": profile}
    if plot is not None:
        plotting.plot_pga_profile(profile, plot, f"{emb.source}: Subspace PGA, k={s.k}, {s.n_null} nulls, "
                                                 f"{s.n_tokens} tokens")
    return section, readout.basis


def spectral_stage(states: HiddenStates, basis: torch.Tensor, settings: ReportSettings, *,
                   plot: Optional[str] = None, title: str = "spectra per layer") -> Dict:
    """Spectral metrics and readout alignment per layer (`spectral_profile`, top 10 directions).

    Args:
        states (HiddenStates): the states of each layer (`hidden_states_stage`).
        basis (torch.Tensor): the d×k readout basis (`pga_stage`).
        settings (ReportSettings): k is recorded.
        plot (str | None): where to write the spectra per layer (PNG); None: no plot. Default None.
        title (str): the plot's title. Default "spectra per layer".

    Returns:
        dict: the "spectral" section: m_directions (10), k, layers (`spectral_profile`'s rows).

    Raises:
        ValueError: states or basis of the wrong shape, or holding NaN/inf.

    Examples:
        >>> s = rf.report.ReportSettings(n_tokens=64, layers=[0, 6], ccrs=1, k=16)
        >>> states = rf.hidden_states("minilm", texts=["The cat sat on the mat. " * 20], n_tokens=64,
        ...                           layers=[0, 6], progress=False)
        >>> basis = rf.pga.readout_basis(rf.load_embeddings("minilm").input, k=16).basis
        >>> section = rf.report.spectral_stage(states, basis, s)
        >>> section["m_directions"], [row["layer"] for row in section["layers"]]
        (10, [0, 6])
    """
    rows = spectral_profile(states, basis)
    if plot is not None:
        plotting.plot_spectral(rows, plot, title)
    return {"m_directions": 10, "k": settings.k, "layers": rows}


def probe_stage(rm: ReportModel, layers: Sequence[int], settings: ReportSettings, *,
                pga: Optional[Dict] = None, progress: bool = True, plot: Optional[str] = None) -> Dict:
    """Linear-probe accuracy per layer on the labelled texts of settings.probe_file.

    Each text is the mean of its tokens' states at a layer; a logistic-regression probe is scored
    by seeded, stratified k-fold cross-validation (`probes.probe_profile`).

    Args:
        rm (ReportModel): the loaded model (`embeddings_stage`).
        layers (Sequence[int]): the layers probed (those of the hidden states).
        settings (ReportSettings): probe_file, probe_folds, seed, batch_size, last_layer, dtype and
            device are used.
        pga (dict | None): the "pga" section, plotted beside the accuracies. Default None.
        progress (bool): show a progress bar. Default True.
        plot (str | None): where to write accuracy and z per layer (PNG; needs pga); None: no plot.
            Default None.

    Returns:
        dict: the "probe" section (`probes.probe_profile`): file, n_texts, labels, folds, seed,
        pooling, classifier, layers (accuracy, std, folds, chance per layer).

    Raises:
        ValueError: settings.probe_file is None, or its labels cannot be cross-validated in
            probe_folds folds.
        ImportError: scikit-learn is not installed.

    Examples:
        >>> s = rf.report.ReportSettings(probe_file="labels.jsonl")  # doctest: +SKIP
        >>> rf.report.probe_stage(rm, [0, 6], s)["layers"][0]["accuracy"]  # doctest: +SKIP
        0.9...

        Skipped: it needs a .jsonl file of labelled texts, and `rm` from `embeddings_stage`.
    """
    s = settings
    if s.probe_file is None:
        raise ValueError("probe_stage needs settings.probe_file (a .jsonl of labelled texts)")
    in_memory = rm.model is not None
    section = probe_profile(rm.source, s.probe_file, layers=list(layers), folds=s.probe_folds, seed=s.seed,
                            batch_size=s.batch_size, last_layer=s.last_layer, progress=progress,
                            dtype=None if in_memory else s.dtype, device=None if in_memory else s.device)
    if plot is not None and pga is not None:
        plotting.plot_probe(section, pga["profile"], plot, f"{rm.embeddings.source}: linear probes and Subspace PGA")
    return section
