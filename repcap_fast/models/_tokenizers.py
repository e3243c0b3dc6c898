"""How many rows a tokenizer's ids index (its highest id + 1) and how many distinct ids it has:
from tokenizer.json, vocab.txt, a GGUF file's token list, or a tokenizer object."""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

from .readers import _GGUFReader, _Reader, read_json
from .sources import ResolvedSource


def _no_tokenizer_why(resolved: ResolvedSource, kind: str) -> str:
    """Why a source has no tokenizer size, naming where it was looked for."""
    if kind == "gguf":
        return f"{resolved.path} has no tokenizer.ggml.tokens"
    if kind in ("sae", "npy"):
        return f"{resolved.path} is a single matrix"
    directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    tj = os.path.join(directory, "tokenizer.json")
    if os.path.exists(tj):
        return f"{tj} has no token ids to count (model.vocab, an object or a list, and added_tokens)"
    return f"{directory} has no tokenizer.json or vocab.txt"


def _tokenizer_size(resolved: ResolvedSource, reader: _Reader) -> Tuple[Optional[Tuple[int, int]], str]:
    """((rows its ids span: the highest id + 1, its distinct token ids), the file it was read from).

    When a tokenizer is there (vocabulary plus added tokens); else (None, "").
    """
    if isinstance(reader, _GGUFReader):
        n = reader.field_length("tokenizer.ggml.tokens")  # a list: ids 0..n-1
        return (None if not n else (n, n)), f"{resolved.path} (tokenizer.ggml.tokens)"
    directory = resolved.path if resolved.kind == "directory" else os.path.dirname(resolved.path)
    tj = os.path.join(directory, "tokenizer.json")
    if os.path.exists(tj):
        return _tokenizer_json_size(tj), tj
    vt = os.path.join(directory, "vocab.txt")
    if os.path.exists(vt):
        try:
            with open(vt, encoding="utf-8") as fh:
                n = sum(1 for _ in fh)  # one token a line: ids 0..n-1
        except UnicodeDecodeError as exc:
            raise ValueError(f"{vt}: not UTF-8 text (byte {exc.start})") from exc
        return (n, n) if n else None, vt
    return None, ""


def _tokenizer_json_size(path: str) -> Optional[Tuple[int, int]]:
    """(the highest token id + 1, the number of distinct ids) of a tokenizer.json (model.vocab plus added_tokens).

    None when it has no vocabulary this can count. ValueError naming the file when it is malformed.
    """
    tok = read_json(path, "a tokenizer")
    model = tok.get("model", {})
    if model is None:
        model = {}
    if not isinstance(model, dict):
        raise ValueError(f"{path}: \"model\" is a JSON {type(model).__name__}, not an object")
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        if not all(_is_id(v) for v in vocab.values()):
            bad = next((k, v) for k, v in vocab.items() if not _is_id(v))
            raise ValueError(f"{path}: model.vocab[{str(bad[0])[:40]!r}] is {json.dumps(bad[1])[:40]}, not a "
                             f"token id (a non-negative int)")
        ids = set(vocab.values())
    elif isinstance(vocab, list):
        ids = set(range(len(vocab)))
    else:
        return None
    added = tok.get("added_tokens", [])
    if added is None:
        added = []
    if not isinstance(added, list):
        raise ValueError(f"{path}: \"added_tokens\" is a JSON {type(added).__name__}, not a list")
    for i, t in enumerate(added):
        if not isinstance(t, dict):
            raise ValueError(f"{path}: added_tokens[{i}] is {json.dumps(t)[:40]}, not an object")
        if "id" in t:
            if not _is_id(t["id"]):
                raise ValueError(f"{path}: added_tokens[{i}].id is {json.dumps(t['id'])[:40]}, not a token id "
                                 f"(a non-negative int)")
            ids.add(t["id"])
    return (max(ids) + 1, len(ids)) if ids else None


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _in_memory_tokenizer_size(tok) -> Optional[Tuple[int, int]]:
    """(the highest token id + 1, the number of tokens) of a tokenizer object.

    len(tokenizer) counts tokens, and ids may leave holes (or sit beyond len).
    """
    if tok is None:
        return None
    try:
        ids = {int(i) for i in tok.get_vocab().values()}
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: its length is all there is
        ids = set()
    n = len(tok)
    return (max(max(ids) + 1, n), max(len(ids), n)) if ids else ((n, n) if n else None)
