"""Regression tests for the reliability round 2 (issue 33), the parts in repcap_fast.models: each
reproducer that gave a wrong answer, a raw traceback or needless work, with what it must do now.
Every test here failed before its fix."""

import importlib.util
import pickle
import re
import tracemalloc
import warnings

import numpy as np
import pytest
import torch

from repcap_fast.models import check_layers, hidden_states, load_embeddings, open_model, random_init, readers

from _helpers import checkpoint, randn, write_json

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
needs_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="gguf is not installed")
needs_lens = pytest.mark.skipif(importlib.util.find_spec("transformer_lens") is None,
                                reason="transformer-lens is not installed")
needs_nnsight = pytest.mark.skipif(importlib.util.find_spec("nnsight") is None, reason="nnsight is not installed")

V = 100  # the tiny models' vocabulary




def _word_tokenizer(ids=range(V)):
    """A word-level tokenizer whose words w{i} have the token ids given ([UNK] is the last one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ids = list(ids)
    vocab = {f"w{i}": i for i in ids[:-1]}
    vocab["[UNK]"] = ids[-1]
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[UNK]")


def _gpt2(dropout=0.1, seed=0):
    """A tiny GPT-2 with dropout everywhere (embeddings, attention, residual), in eval mode."""
    import transformers as tf

    cfg = tf.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128, resid_pdrop=dropout,
                        embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.GPT2LMHeadModel(cfg).eval()


def _llama(dropout=0.1, seed=0):
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attention_dropout=dropout)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.LlamaForCausalLM(cfg).eval()


def _flags(module):
    return {name: m.training for name, m in module.named_modules()}


def _mixed(model):
    """Training mode, but with some submodules in eval: the state every flag must come back to."""
    model.train()
    mods = [m for _, m in model.named_modules()]
    for m in mods[1::3]:
        m.training = False
    return _flags(model)


IDS = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(1))
KW = dict(token_ids=IDS, n_tokens=40, progress=False)


# -------------------------------------- 1. a model in training mode runs in eval mode, and stays as it was


@needs_transformers
@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("last_layer", ["final_norm", "resid_post"])
def test_training_mode_model_gives_its_eval_mode_states(build, last_layer):
    """Dropout was on: two identical calls disagreed, and differed from eval mode by up to 2.9."""
    model = build()
    want = hidden_states(model, last_layer=last_layer, **KW)
    for state in ("train", "mixed"):
        flags = _flags(model.train()) if state == "train" else _mixed(model)
        for _ in range(2):
            got = hidden_states(model, last_layer=last_layer, **KW)
            assert all(torch.equal(got[layer], want[layer]) for layer in want.layers), state
            assert _flags(model) == flags, f"{state}: the model's training flags were not restored"
    model.eval()
    assert _flags(model) == {name: False for name in flags}


@needs_transformers
def test_training_flags_are_restored_when_the_forward_raises():
    model = _gpt2()
    _mixed(model)
    model.transformer.h[1].training = True
    flags = _flags(model)
    seen = []

    def fail(module, *_):
        seen.append(module.training)
        raise RuntimeError("boom in block 1")

    hook = model.transformer.h[1].register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="boom in block 1"):
            hidden_states(model, **KW)
    finally:
        hook.remove()
    assert seen == [False] and flags["transformer.h.1"]  # it ran in eval mode, and is back in training
    assert _flags(model) == flags


@needs_transformers
def test_probe_representations_of_a_training_mode_model_are_its_eval_mode_ones():
    from repcap_fast.probes import text_representations

    model, tok = _gpt2(), _word_tokenizer()
    texts = [" ".join(f"w{(7 * i + j) % 90}" for j in range(12)) for i in range(6)]
    want = text_representations(model, texts, tokenizer=tok, progress=False)
    flags = _mixed(model)
    for _ in range(2):
        got = text_representations(model, texts, tokenizer=tok, progress=False)
        assert all(torch.equal(got[layer], want[layer]) for layer in want)
        assert _flags(model) == flags


@needs_lens
def test_hooked_transformer_in_training_mode_is_run_in_eval_mode_and_restored():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=128, d_head=8, n_heads=4, d_mlp=64, d_vocab=V,
                                  act_fn="gelu", normalization_type="LN", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl = HookedTransformer(cfg).eval()
    # TransformerLens has no dropout of its own: one on the residual stream, on only in training
    seen = []

    def dropout(x, hook):
        seen.append(hook.training)
        return torch.nn.functional.dropout(x, 0.5, hook.training)

    tl.blocks[0].hook_resid_post.add_hook(dropout, is_permanent=True)
    want = hidden_states(tl, **KW)
    _mixed(tl)
    tl.blocks[0].hook_resid_post.training = True
    flags = _flags(tl)
    for _ in range(2):
        got = hidden_states(tl, **KW)
        assert all(torch.equal(got[layer], want[layer]) for layer in want.layers)
        assert seen and not any(seen) and _flags(tl) == flags


@needs_nnsight
def test_nnsight_model_in_training_mode_is_run_in_eval_mode_and_restored():
    import nnsight

    model = _gpt2()
    want = hidden_states(model, **KW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = nnsight.LanguageModel(model, tokenizer=_word_tokenizer())
    flags = _mixed(model)
    got = hidden_states(lm, **KW)
    assert all(torch.equal(got[layer], want[layer]) for layer in want.layers)
    assert _flags(model) == flags


def test_the_eval_mode_is_stated_in_the_docstrings():
    from repcap_fast.models import runner

    assert "eval mode" in hidden_states.__doc__ and "training" in hidden_states.__doc__
    assert "training" in runner.Runner.__doc__


# ------------------------------------------- 5. n_rows="tokenizer" keeps the rows up to the highest id


def _tokenizer_dir(tmp_path, rows, vocab, added=(), vocab_list=False):
    emb = randn(rows, 8)
    path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb}, {"model_type": "llama",
                                                                      "tie_word_embeddings": True})
    model = ({"type": "Unigram", "vocab": [[f"w{i}", -1.0] for i in range(vocab)]} if vocab_list else
             {"type": "WordLevel", "vocab": {f"w{i}": i for i in vocab}})
    write_json(tmp_path / "tokenizer.json", {"model": model, "added_tokens": [{"id": i, "content": f"<a{i}>"}
                                                                             for i in added]})
    return path, emb


@pytest.mark.parametrize("rows, vocab, added, vocab_list, tokens, span", [
    (20, range(10), [15], False, 11, 16),  # an added token with a high id: 16 rows, row 15 is a token
    (12, [0, 1, 2, 3, 4, 8, 9], [], False, 7, 10),  # holes (5, 6, 7) below the highest id stay as rows
    (30, range(10), [10, 11, 20, 20], False, 13, 21),
    (20, 10, [17], True, 11, 18),  # a Unigram vocabulary (a list) and an added token beyond it
    (20, range(20), [], False, 20, 20),  # no padding
])
def test_n_rows_tokenizer_keeps_every_row_up_to_the_highest_id(tmp_path, rows, vocab, added, vocab_list, tokens,
                                                                 span):
    """11 ids 0..9 and 15 kept 11 rows: token 15 dropped, non-token row 10 kept."""
    path, emb = _tokenizer_dir(tmp_path, rows, vocab, added, vocab_list)
    e = load_embeddings(path, n_rows="tokenizer")
    assert e.rows_kept == span and torch.equal(e.input, emb[:span])
    assert e.tokenizer_size == span and e.tokenizer_tokens == tokens and e.padded_rows == rows - span
    d = e.to_dict()
    assert d["padded_rows"] == rows - span and d["tokenizer_tokens"] == tokens
    full = load_embeddings(path)
    assert full.rows_kept == rows and full.padded_rows == rows - span


@pytest.mark.parametrize("vocab, added", [(range(10), [25]), (range(21), [])])
def test_n_rows_tokenizer_refuses_ids_beyond_the_matrix(tmp_path, vocab, added):
    path, _ = _tokenizer_dir(tmp_path, 20, vocab, added)
    with pytest.raises(ValueError, match=r"n_rows='tokenizer'.*tokenizer\.json.*ids up to (25|20).*20 rows"):
        load_embeddings(path, n_rows="tokenizer")
    e = load_embeddings(path)  # without n_rows='tokenizer' the matrix is read as it is: no row is padding
    assert e.rows_kept == 20 and e.padded_rows == 0


@needs_transformers
@pytest.mark.parametrize("ids, span", [(list(range(5)) + [8, 9, 15], 16), (list(range(V)), V)])
def test_n_rows_tokenizer_of_a_model_in_memory_uses_the_highest_id(ids, span):
    """len(tokenizer) counts tokens (8 for ids 0..4, 8, 9, 15), not rows."""
    model, tok = _gpt2(), _word_tokenizer(ids)
    e = load_embeddings(model, tokenizer=tok, n_rows="tokenizer")
    w = model.get_input_embeddings().weight
    assert e.rows_kept == span and torch.equal(e.input, w[:span]) and e.tokenizer_size == span
    assert e.tokenizer_tokens == len(ids) and e.padded_rows == V - span
    with pytest.raises(ValueError, match=r"n_rows='tokenizer'.*ids up to 120.*100 rows"):
        load_embeddings(model, tokenizer=_word_tokenizer(range(121)), n_rows="tokenizer")


# ------------------------------------------------ 13. GGUF rows are sliced before they are dequantized


def _gguf_types():
    try:
        import gguf
    except ImportError:
        return []
    out = []
    for q in gguf.GGMLQuantizationType:
        if q not in gguf.GGML_QUANT_SIZES:
            continue
        block, size = gguf.GGML_QUANT_SIZES[q]
        try:
            with np.errstate(all="ignore"):
                gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), q)
        except (NotImplementedError, KeyError, ValueError):
            if q.name not in ("F64", "I8", "I16", "I32", "I64"):  # stored as plain numbers: read as they are
                continue
        out.append(q.name)
    return out


def _raw_gguf(path, qname, rows, row_values, seed=0):
    """A GGUF file whose token_embd.weight is `rows` rows of random bytes stored as qname."""
    import gguf

    q = gguf.GGMLQuantizationType[qname]
    block, size = gguf.GGML_QUANT_SIZES[q]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, row_values // block * size), dtype=np.uint8)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(row_values)
    w.add_token_list([f"t{i}" for i in range(rows)])
    w.add_tensor("token_embd.weight", raw, raw_shape=raw.shape, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _bits(t):
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@needs_gguf
@pytest.mark.parametrize("qname", _gguf_types())
def test_gguf_rows_are_sliced_before_dequantizing(tmp_path, monkeypatch, qname):
    """load_embeddings(gguf, n_rows=1000) dequantized all 262,144 rows first (14 s, 2.4 GB)."""
    import gguf

    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qname]]
    rows, n = 1024, 5
    path = _raw_gguf(tmp_path / f"{qname}.gguf", qname, rows, max(block, 256))
    full = load_embeddings(path).input
    shapes = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, q: (shapes.append(data.shape), real(data, q))[1])
    reader = readers.open_reader(readers.ResolvedSource(path, path, "gguf", "x"))
    tracemalloc.start()
    try:
        part = reader.read("token_embd.weight", n)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert part.shape == (n, full.shape[1]) and part.dtype == full.dtype
    assert torch.equal(_bits(part), _bits(full[:n]))  # bitwise, NaN and inf included
    assert all(s[0] == n for s in shapes), f"rows dequantized: {shapes}"
    assert peak < full.numel() * full.element_size() / 8, f"{peak} bytes allocated to read {n} of {rows} rows"
    assert torch.equal(_bits(load_embeddings(path, n_rows=n).input), _bits(full[:n]))


@needs_gguf
def test_smollm2_rows_are_sliced_before_dequantizing(smollm2_embeddings, monkeypatch):
    import gguf

    shapes = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, q: (shapes.append(data.shape), real(data, q))[1])
    e = load_embeddings("smollm2", n_rows=1000)
    assert torch.equal(e.input, smollm2_embeddings.input[:1000]) and e.rows_kept == 1000
    assert shapes and all(s[0] == 1000 for s in shapes)


# ------------------------------------------------------------- 14. one clear error naming the file


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble, np.complex64])
def test_npy_of_a_dtype_torch_cannot_hold_is_refused_by_name(tmp_path, dtype):
    path = tmp_path / "m.npy"
    np.save(path, np.ones((4, 3), dtype=dtype))
    with pytest.raises(ValueError, match=rf"m\.npy: .*{np.dtype(dtype).name}.*(float64|float32)"):
        load_embeddings(str(path))


@pytest.mark.parametrize("dump", [
    lambda p: pickle.dump({"w": np.ones((4, 3))}, open(p, "wb")),
    lambda p: pickle.dump(randn(4, 3), open(p, "wb")),
    lambda p: pickle.dump([1, 2], open(p, "wb"), protocol=0),
    lambda p: pickle.dump({"a": 1}, open(p, "wb"), protocol=2),
], ids=["arrays", "tensor", "protocol0", "protocol2"])
def test_plain_pickle_pt_is_refused_as_a_pickle_not_as_truncated(tmp_path, dump):
    path = str(tmp_path / "m.pt")
    dump(path)
    with pytest.raises(ValueError, match=r"m\.pt: .*a plain Python pickle.*not .*torch\.save") as info:
        load_embeddings(path)
    assert "truncated" not in str(info.value)


@pytest.mark.parametrize("kind", ["safetensors", "npy", "pt", "sharded"])
@pytest.mark.parametrize("src_dtype, dtype, big", [(torch.float32, torch.float16, 1e5),
                                                    (torch.float64, torch.float16, -7e4),
                                                    (torch.float64, torch.float32, 1e39),
                                                    (torch.float64, torch.bfloat16, 1e39),
                                                    (torch.int64, torch.float16, 70000)])
def test_dtype_cast_overflow_is_named_at_the_cast(tmp_path, kind, src_dtype, dtype, big):
    """--dtype float16 turned values beyond float16's range into inf: the error then said NaN/Inf."""
    from safetensors.torch import save_file

    emb = randn(10, 4).to(src_dtype)
    emb[3, 1] = big
    name = str(dtype).replace("torch.", "")
    if kind == "safetensors":
        path = checkpoint(tmp_path, {"model.embed_tokens.weight": emb}, {"model_type": "llama",
                                                                          "tie_word_embeddings": True})
    elif kind == "npy":
        path = str(tmp_path / "m.npy")
        np.save(path, emb.numpy())
    elif kind == "pt":
        path = str(tmp_path / "m.pt")
        torch.save({"w": emb}, path)
    else:
        save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "a.safetensors"))
        write_json(tmp_path / "model.safetensors.index.json", {"weight_map": {"model.embed_tokens.weight":
                                                                              "a.safetensors"}})
        path = str(tmp_path / "model.safetensors.index.json")
    shown = re.escape(f"{abs(big):g}")
    with pytest.raises(ValueError, match=rf"dtype={name}: .*{shown}.*beyond {name}'s range.*inf.*"
                                         rf"(float32 or bfloat16|float64)"):
        load_embeddings(path, dtype=dtype)
    assert torch.equal(load_embeddings(path, dtype=dtype, n_rows=3).input, emb[:3].to(dtype))  # row 3 not read
    emb[3, 1] = 1
    small = str(tmp_path / "small.npy")
    np.save(small, emb.numpy())
    assert torch.equal(load_embeddings(small, dtype=dtype).input, emb.to(dtype))  # values in range: as before


@needs_transformers
def test_dtype_cast_overflow_of_a_model_in_memory_and_of_a_model_loaded_from_disk(tmp_path):
    model, tok = _gpt2(dropout=0.0), _word_tokenizer()
    with torch.no_grad():
        model.transformer.wte.weight[5, 2] = 1e5
    with pytest.raises(ValueError, match=r"dtype=float16: .*100000.*beyond float16's range.*float32 or bfloat16"):
        load_embeddings(model, tokenizer=tok, dtype=torch.float16)
    assert load_embeddings(model, tokenizer=tok, n_rows=5, dtype=torch.float16).input.isfinite().all()  # row 5 cut
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"dtype=float16: .*beyond float16's range.*float32 or bfloat16"):
        hidden_states(str(tmp_path), dtype=torch.float16, **KW)
    with pytest.raises(ValueError, match=r"dtype=float16: .*beyond float16's range"):
        open_model(str(tmp_path), dtype=torch.float16)
    assert hidden_states(str(tmp_path), dtype=torch.bfloat16, **KW)[2].isfinite().all()


@needs_transformers
@pytest.mark.parametrize("in_memory", [True, False], ids=["in-memory", "from-disk"])
def test_float16_activation_overflow_is_named(tmp_path, in_memory):
    """Weights in float16's range whose sum is not (60000 + 10000 at the embedding output): inf
    states, reported later as NaN/Inf with no word of float16."""
    model, tok = _gpt2(dropout=0.0), _word_tokenizer()
    with torch.no_grad():
        model.transformer.wte.weight[:, 0] = 60000.0
        model.transformer.wpe.weight[:, 0] = 10000.0
    if in_memory:
        source = model.half()
        dtype = None
    else:
        model.save_pretrained(tmp_path)
        tok.save_pretrained(tmp_path)
        source, dtype = str(tmp_path), torch.float16
    with pytest.raises(ValueError, match=r"dtype=float16: .*layer 0 hold inf or NaN.*exceed float16's range.*"
                                         r"float32 or bfloat16"):
        hidden_states(source, dtype=dtype, **KW)


# ------------------------------------------- 2. integer arguments: every integer kind, nothing else


INTS = [7, np.int64(7), np.int32(7), np.uint8(7), torch.tensor(7), torch.tensor([7], dtype=torch.int32),
        np.array(7)]
NOT_INTS = [True, np.bool_(True), "7", 7.0, 7.5, float("nan"), None, torch.tensor(7.0), [7]]


def _id(x):
    return f"{type(x).__name__}-{x!r}"[:30]


@pytest.mark.parametrize("value", INTS, ids=_id)
def test_layers_accept_every_integer_kind(value):
    assert check_layers(value, 9) == [7] and check_layers([value, 0], 9) == [0, 7]
    assert check_layers(np.array([7, 0]), 9) == [0, 7] and check_layers(torch.tensor([-1, 7]), 9) == [7, 9]


@pytest.mark.parametrize("value", [v for v in NOT_INTS if v is not None and not isinstance(v, list)], ids=_id)
def test_layers_refuse_non_integers_by_name(value):
    """layers=[1.0] was reported as out of range."""
    with pytest.raises((TypeError, ValueError), match=r"layers.*(integer|int)") as info:
        check_layers([value], 9)
    assert "out of range" not in str(info.value)
    if not isinstance(value, str):
        with pytest.raises((TypeError, ValueError), match=r"layers.*(integer|int)"):
            check_layers(value, 9)


def test_layers_out_of_range_still_says_so():
    with pytest.raises(ValueError, match="out of range"):
        check_layers([10], 9)
    with pytest.raises(ValueError, match="out of range"):
        check_layers(np.int64(-11), 9)


@pytest.mark.parametrize("value", INTS, ids=_id)
def test_n_rows_accepts_every_integer_kind(tmp_path, value):
    path = str(tmp_path / "m.npy")
    np.save(path, randn(10, 4).numpy())
    e = load_embeddings(path, n_rows=value)
    assert e.rows_kept == 7 and isinstance(e.rows_kept, int) and e.input.shape == (7, 4)


@pytest.mark.parametrize("value", NOT_INTS[:-3] + [torch.tensor(7.0), torch.tensor([7, 8])], ids=_id)
def test_n_rows_refuses_non_integers_by_name(tmp_path, value):
    path = str(tmp_path / "m.npy")
    np.save(path, randn(10, 4).numpy())
    with pytest.raises((TypeError, ValueError), match="n_rows"):
        load_embeddings(path, n_rows=value)


@needs_transformers
@pytest.mark.parametrize("name", ["n_tokens", "batch_size", "seq_len", "tokens_per_window", "seed"])
@pytest.mark.parametrize("value", INTS, ids=_id)
def test_hidden_states_counts_accept_every_integer_kind(name, value):
    model = _gpt2(dropout=0.0)
    want = hidden_states(model, **{**KW, name: 7 if name != "n_tokens" else 7})
    got = hidden_states(model, **{**KW, name: value})
    assert all(torch.equal(got[layer], want[layer]) for layer in want.layers)
    assert isinstance(got.meta["seed"], int) and isinstance(got.meta["n_tokens"], int)


@needs_transformers
@pytest.mark.parametrize("name", ["n_tokens", "batch_size", "seq_len", "tokens_per_window", "seed"])
@pytest.mark.parametrize("value", NOT_INTS, ids=_id)
def test_hidden_states_counts_refuse_non_integers_by_name(name, value):
    model = _gpt2(dropout=0.0)
    with pytest.raises((TypeError, ValueError), match=name):
        hidden_states(model, **{**KW, name: value})


@needs_transformers
@pytest.mark.parametrize("bad", [torch.tensor([[True, False]]), torch.tensor([[1 + 1j]])], ids=["bool", "complex"])
def test_hidden_states_refuses_token_ids_that_are_not_integers(bad):
    with pytest.raises(ValueError, match="token_ids"):
        hidden_states(_gpt2(dropout=0.0), token_ids=bad, n_tokens=3, progress=False)


@needs_transformers
@pytest.mark.parametrize("value", [np.int64(3), torch.tensor(3)], ids=_id)
def test_seeds_of_random_init_and_load_embeddings_accept_integer_kinds(value):
    model = _gpt2(dropout=0.0)
    a, b = random_init(model, seed=3), random_init(model, seed=value)
    assert a.seed == b.seed == 3 and isinstance(b.seed, int)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    e = load_embeddings(model, init="random", seed=value)
    assert torch.equal(e.input, a.model.get_input_embeddings().weight)


@needs_transformers
@pytest.mark.parametrize("value", [True, 3.0, "3", -1, None], ids=_id)
def test_seeds_are_refused_by_name_before_anything_runs(value):
    model = _gpt2(dropout=0.0)
    with pytest.raises((TypeError, ValueError), match="seed"):
        load_embeddings(model, seed=value)
    with pytest.raises((TypeError, ValueError), match="seed"):
        open_model(model, seed=value)
