"""Linear probes per layer on labelled texts, reported next to the Subspace-PGA z.

Each text is one example: its representation at layer l is the mean of the residual stream over
its tokens (padding excluded; the special tokens the tokenizer adds are included, as the model
sees them), read at the same points as the report's hidden states (`models.runner.Runner`). The
probe is the field's standard, scikit-learn's LogisticRegression on standardized features, scored
by seeded, stratified k-fold cross-validation (an optional dependency: `pip install
'repcap_fast[probe]'`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from . import _validation as val
from ._progress import progress_bar
from .models import check_layers, open_model
from .models.hidden_states import jsonl_objects, padded_batch
from .models.runner import Runner

POOLINGS = ("mean", "last")


def read_labelled(path: str, text_key: str = "text", label_key: str = "label") -> Tuple[List[str], List]:
    """Reads (texts, labels) from a JSON-lines file; blank lines are skipped.

    Every line holds a string field `text_key` and a label field `label_key` (a string, an int or a
    bool).

    Args:
        path (str): the .jsonl file.
        text_key (str): the text field. Default "text".
        label_key (str): the label field. Default "label".

    Returns:
        tuple[list[str], list]: the texts and their labels.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: not a .jsonl file, not UTF-8, a line without a non-empty text or a label, or no
            labelled text at all.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"probe file {path!r} does not exist")
    if not path.endswith(".jsonl"):
        raise ValueError(f"probe file {path!r}: expected a .jsonl file (one JSON object per line with "
                         f"{text_key!r} and {label_key!r})")
    texts, labels = [], []
    try:
        for i, obj in jsonl_objects(path):
            if not isinstance(obj, dict) or not isinstance(obj.get(text_key), str) or not obj[text_key].strip():
                raise ValueError(f"{path}:{i}: expected an object with a non-empty string field {text_key!r}")
            label = obj.get(label_key)
            if not isinstance(label, (str, int, bool)):
                raise ValueError(f"{path}:{i}: expected a label field {label_key!r} (a string, int or bool), got "
                                 f"{json.dumps(label)[:40]}")
            texts.append(obj[text_key])
            labels.append(label)
    except UnicodeDecodeError as exc:
        raise ValueError(f"probe file {path!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as "
                         "UTF-8") from None
    if not texts:
        raise ValueError(f"probe file {path!r} holds no labelled texts")
    return texts, labels


def check_labels(labels: Sequence, folds: int, where: str = "y") -> None:
    """Labels a `folds`-fold stratified probe can use.

    At least two different labels, and each label at least `folds` times (every fold needs each
    label).
    """
    counts = Counter(str(v) for v in labels)
    if len(counts) < 2:
        raise ValueError(f"{where}: probes need at least two different labels, got only {sorted(counts)}")
    fewest = min(counts.values())
    if fewest < folds:
        raise ValueError(f"{where}: folds={folds}, but label {min(counts, key=counts.get)!r} has only {fewest} texts: "
                         "every fold needs each label; pass fewer folds or more texts")


def _import_sklearn() -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ImportError("probes need scikit-learn: `pip install 'repcap_fast[probe]'` (or scikit-learn)") from None


def check_probe_file(path: str, folds: int = 5, text_key: str = "text", label_key: str = "label"):
    """Everything about a probe run that needs no model, checked before any work.

    scikit-learn is installed, the file is UTF-8 JSON lines with a text and a label on every line,
    it has two labels or more, and each label has at least `folds` texts. Returns (texts, labels).
    """
    _import_sklearn()
    folds = val.check_int(folds, "folds", 2)
    texts, labels = read_labelled(path, text_key, label_key)
    check_labels(labels, folds, f"probe file {path!r}")
    return texts, labels


def text_representations(source, texts: Sequence[str], layers="all", *, pooling: str = "mean",
                         max_tokens: int = 128, batch_size: int = 8, tokenizer=None, dtype=None, device=None,
                         last_layer: str = "final_norm", progress: bool = True) -> Dict[int, torch.Tensor]:
    """Each text's representation at every requested layer: layer → len(texts) × d float32 tensor.

    The mean over its tokens ("mean") or its last token ("last") of the residual stream, on the
    model's device. Texts longer than `max_tokens` tokens (special tokens included) are cut there.

    Args:
        source (str | os.PathLike | object): a path, repo id or alias, or a model in memory.
        texts (Sequence[str]): the texts.
        layers (str | int | Sequence[int]): "all", an int or a list. Default "all".
        pooling (str): "mean" or "last". Default "mean".
        max_tokens (int): tokens kept per text (at least 2). Default 128.
        batch_size (int): texts per forward pass. Default 8.
        tokenizer (object): a model in memory's tokenizer. Default None.
        dtype (torch.dtype | None): as for `models.hidden_states`. Default None.
        device (str | torch.device | None): as for `models.hidden_states`. Default None.
        last_layer (str): "final_norm" or "resid_post". Default "final_norm".
        progress (bool): show a progress bar. Default True.

    Returns:
        dict[int, torch.Tensor]: layer → representations.

    Raises:
        ValueError: no texts, a model without a tokenizer, a bad pooling, or a layer out of range.
    """
    val.check_choice(pooling, "pooling", POOLINGS)
    max_tokens = val.check_int(max_tokens, "max_tokens", 2)
    batch_size = val.check_int(batch_size, "batch_size", 1)
    if not texts:
        raise ValueError("texts must hold at least one text")
    src, _ = open_model(source, tokenizer=tokenizer, dtype=dtype, device=device)
    if src.tokenizer is None:
        raise ValueError(f"probes of {src.label} need its tokenizer: pass tokenizer=")
    runner = Runner(src, last_layer)
    keep = check_layers(layers, runner.n_layers)
    tok = src.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out: Dict[int, List[torch.Tensor]] = {layer: [] for layer in keep}
    with torch.inference_mode(), progress_bar(bool(progress), total=len(texts), desc="probe texts",
                                              unit="text") as bar:
        for b0 in range(0, len(texts), batch_size):
            batch = [list(tok(t, add_special_tokens=True, verbose=False)["input_ids"])[:max_tokens]
                     for t in texts[b0:b0 + batch_size]]
            ids, mask = padded_batch(batch, pad)
            hs = runner(ids.to(src.device), mask.to(src.device))
            m = mask.to(src.device, torch.float32).unsqueeze(-1)
            last = torch.tensor([len(seq) - 1 for seq in batch], device=src.device)
            for layer in keep:
                h = hs[layer].float()
                pooled = (h * m).sum(1) / m.sum(1) if pooling == "mean" else h[torch.arange(len(batch)), last]
                out[layer].append(pooled)
            bar.update(len(batch))
    return {layer: torch.cat(parts) for layer, parts in out.items()}


def probe_accuracy(X, y: Sequence, *, folds: int = 5, seed: int = 0, C: float = 1.0) -> Dict:
    """Cross-validated accuracy of a logistic-regression probe reading labels y from the rows of X.

    Seeded, stratified k-fold cross-validation of scikit-learn's LogisticRegression, with the
    features standardized within each training fold.

    Args:
        X (torch.Tensor | np.ndarray): n_texts × d features.
        y (Sequence): one label per row.
        folds (int): the number of folds (at least 2). Default 5.
        seed (int): seeds the folds' shuffle. Default 0.
        C (float): the inverse regularization strength. Default 1.0.

    Returns:
        dict: accuracy (mean over folds), std (sample std), folds (each fold's accuracy) and chance
        (the most frequent label's share).

    Raises:
        ValueError: X is not n_texts × d with one row per label, fewer than two labels, or a label
            with fewer than `folds` texts.
        ImportError: scikit-learn is not installed.
    """
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_score
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        raise ImportError("probes need scikit-learn: `pip install 'repcap_fast[probe]'` (or scikit-learn)") from None
    folds = val.check_int(folds, "folds", 2)
    seed = val.check_seed(seed)
    x = (X.detach().to("cpu", torch.float64).numpy() if isinstance(X, torch.Tensor)  # sklearn runs on the host
         else np.asarray(X, dtype=np.float64))
    labels = np.asarray([str(v) for v in y])
    if x.ndim != 2 or x.shape[0] != len(labels):
        raise ValueError(f"X must be (n_texts × d) with one row per label: got {x.shape} for {len(labels)} labels")
    check_labels(labels.tolist(), folds)
    counts = Counter(labels.tolist())
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=5000))
    scores = cross_val_score(probe, x, labels, cv=StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed))
    return {"accuracy": float(scores.mean()), "std": float(scores.std(ddof=1)), "folds": scores.tolist(),
            "chance": max(counts.values()) / len(labels)}


def probe_profile(source, path: str, *, layers="all", folds: int = 5, seed: int = 0, text_key: str = "text",
                  label_key: str = "label", pooling: str = "mean", max_tokens: int = 128, batch_size: int = 8,
                  tokenizer=None, last_layer: str = "final_norm", progress: bool = True,
                  dtype=None, device=None) -> Dict:
    """Probe accuracy per layer on the labelled texts of a JSON-lines file (`read_labelled`), for the report.

    {file, n_texts, labels (counts), folds, seed, pooling, classifier, layers: [{layer, accuracy,
    std, folds, chance}]}.
    """
    texts, labels = check_probe_file(path, folds, text_key, label_key)  # before the model runs
    reps = text_representations(source, texts, layers, pooling=pooling, max_tokens=max_tokens, batch_size=batch_size,
                                tokenizer=tokenizer, last_layer=last_layer, progress=progress, dtype=dtype,
                                device=device)
    rows = [{"layer": layer, **probe_accuracy(x, labels, folds=folds, seed=seed)} for layer, x in reps.items()]
    return {"file": os.path.abspath(path), "n_texts": len(texts),
            "labels": {str(k): v for k, v in sorted(Counter(str(v) for v in labels).items())},
            "folds": folds, "seed": seed, "pooling": pooling, "max_tokens": max_tokens, "last_layer": last_layer,
            "classifier": "scikit-learn LogisticRegression(C=1, max_iter=5000) on StandardScaler features, "
                          "StratifiedKFold(shuffle=True, random_state=seed)", "layers": rows}

