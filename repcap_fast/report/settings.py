"""What a report computes and on what (`ReportSettings`), and the names of the files it writes."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch

from .. import _validation as val
from .._backends import BACKENDS, check_precision, resolve_backend
from ..models import INITS, LAST_LAYER_POINTS
from ..ops.pairwise_cosine_stats import check_settings as check_stats_settings

#: The sections of report.json, in order (``probe`` is added when a probe file is given).
REPORT_SECTIONS = ("provenance", "model", "epsilon", "hidden_states", "pga", "spectral")

#: Every file a report (or a control report) writes at the top of its folder: a new report
#: replaces all of them, so none of an earlier run's files is left beside it.
REPORT_FILES = ("report.json", "report.md", "cosine_histogram.png", "pga_profile.png", "spectral.png", "probe.png",
                "pga_control.png")

#: The controls `run_report(control=...)` runs beside the model: "random", its random initialization.
CONTROLS = ("random",)


@dataclass(frozen=True)
class ReportSettings:
    """What `run_report` computes and on what; the defaults are the papers' settings.

    The settings are checked when they are made (before any work); the checks that need the
    model (k < d_model, the layers) follow its load.

    Attributes:
        n_tokens (int): tokens sampled for the hidden states (`models.hidden_states`). Default 2048.
        layers (str | int | tuple[int, ...]): "all", one layer or a list (0 = the embedding output).
            Default "all".
        k (int): dimension of the readout subspace (Subspace PGA). Default 100.
        n_null (int): random subspaces in the null of z. Default 100.
        ccrs (tuple[int, ...]): the CCR-m variants (m top principal components removed); one int is
            one variant. Default (1, 5, 10).
        seed (int): seeds the token sample, the null subspaces, a random init and the probes' folds.
            Default 0.
        device (str | None): where the model runs and every op runs; None: the CPU for a model read
            from disk, a model in memory's own device. Default None.
        dtype (torch.dtype | None): the model's dtype; None: float32 from disk, a model in memory's own.
            Default None.
        backend (str): the ops' backend ("auto", "cuda", "triton", "cpu", "torch"). Default "auto".
        precision (str): float32 product precision of the ops, "highest" or "tf32" (GPU tensor cores).
            Default "highest".
        bins (int): histogram bins of the pair cosines. Default 4096.
        k_sigma (float): ε = μ + k_sigma·σ. Default 2.0.
        n_rows (int | str | None): embedding rows used: all (None), the first N, or "tokenizer"
            (`load_embeddings`). Default None.
        zero_rows (str): a zero embedding row is an "error", or "drop" (counted). Default "error".
        batch_size (int): windows per forward pass. Default 8.
        text_file (str | None): a plain-text (paragraphs) or .jsonl file to sample tokens from; None:
            the bundled corpus, or the texts given to `run_report`. Default None.
        jsonl_key (str): the text field of a .jsonl text_file. Default "text".
        init (str): "trained", or "random": the same architecture at initialization, seeded with
            `seed` (`models.random_init`). Default "trained".
        last_layer (str): where the last layer is read, "final_norm" or "resid_post"
            (`models.hidden_states`). Default "final_norm".
        probe_file (str | None): a .jsonl of labelled texts ("text", "label") for linear probes per
            layer next to z (needs scikit-learn). Default None.
        probe_folds (int): folds of the probes' stratified cross-validation. Default 5.

    Raises:
        ValueError: a value out of range or not one of its choices (k < 1, repeated ccrs, a CCR-m with
            m ≥ n_tokens, an unknown backend or layers string, a probe_file that is not .jsonl).
        TypeError: a value of the wrong type (a float n_tokens, a string k).
        FileNotFoundError: text_file or probe_file does not exist.

    Examples:
        >>> s = rf.report.ReportSettings(n_tokens=512, k=50, ccrs=1)
        >>> s.ccrs, s.to_dict()["k"]
        ((1,), 50)
        >>> rf.report.ReportSettings(ccrs=(1, 1))
        Traceback (most recent call last):
        ...
        ValueError: ccrs must name at least one CCR variant, each once, got (1, 1)
    """

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
        """The settings as JSON values (for report.json): lists for tuples, the dtype's name."""
        out = dataclasses.asdict(self)
        out.update(ccrs=list(self.ccrs), dtype=None if self.dtype is None else str(self.dtype).replace("torch.", ""),
                   layers=self.layers if isinstance(self.layers, (str, int)) else list(self.layers))
        return out


_SETTING_NAMES = {f.name for f in dataclasses.fields(ReportSettings)}


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
