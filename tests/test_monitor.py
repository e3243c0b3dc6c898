"""RepresentationMonitor: its values equal the standalone calls, the model and the training are left
exactly as they were, and every bad argument fails when the monitor is built."""

import json
import math
import random

import numpy as np
import pytest
import torch

import repcap_fast as rf
from repcap_fast import pga
from repcap_fast.monitor import RepresentationMonitor

transformers = pytest.importorskip("transformers")


def gpt2(seed=0, n_layer=2, vocab=100, dropout=0.1, tie=True):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=vocab, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout,
                                  attn_pdrop=dropout, tie_word_embeddings=tie)
    return transformers.GPT2LMHeadModel(cfg)


def ids(rows=8, cols=32, vocab=100, seed=0):
    return torch.randint(0, vocab, (rows, cols), generator=torch.Generator().manual_seed(seed))


class Tiny(torch.nn.Module):
    """A model of the user's own: embedding, two blocks, a separate head."""

    def __init__(self, vocab=60, d=24):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(),
                                                               torch.nn.Dropout(0.2)) for _ in range(2)])
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        h = self.emb(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def test_values_equal_the_standalone_calls():
    model = gpt2()
    monitor = RepresentationMonitor(model, ids(), n_tokens=96, k=8, n_null=12, ccrs=(1, 3),
                                    measures=("epsilon", "pga", "spectral"))
    got = monitor.measure(7)
    W = model.transformer.wte.weight.detach()
    stats = rf.pairwise_cosine_stats(W, progress=False)
    assert got["step"] == 7
    assert got["eps/input"] == stats.epsilon() and got["mu/input"] == stats.mean and got["sigma/input"] == stats.std
    assert got["eps/output"] == got["eps/input"]  # tied
    hs = rf.hidden_states(model, token_ids=monitor.probe_ids, layers="all", n_tokens=96, seed=0, progress=False,
                          seq_len=32)
    profile = pga.pga_profile([hs[layer] for layer in hs.layers], W, k=8, n_null=12, ccrs=(1, 3), progress=False)
    for c, results in profile.items():
        for layer, r in zip(hs.layers, results):
            assert got[f"pga_z/ccr{c}/layer{layer}"] == pytest.approx(r.z, rel=0, abs=1e-12)
    spectral = pga.spectral_metrics(hs[2])
    assert got["rankme/layer2"] == pytest.approx(spectral["rankme"], rel=1e-12)
    assert set(monitor.timings) >= {"hidden_states", "epsilon", "pga", "spectral", "total"}


def test_an_untied_model_gets_both_embeddings():
    model = gpt2(tie=False)
    got = RepresentationMonitor(model, ids(), n_tokens=64, k=8, n_null=5, measures="epsilon").measure(0)
    assert got["eps/output"] == rf.cosine_moments(model.lm_head.weight.detach()).epsilon()
    assert got["eps/output"] != got["eps/input"]


def test_a_model_of_ones_own_with_a_layers_mapping():
    model = Tiny()
    probe = ids(6, 20, vocab=60)
    monitor = RepresentationMonitor(model, probe, layers={"emb": "emb", "b0": model.blocks[0], "b1": "blocks.1"},
                                    embeddings={"input": "emb.weight", "output": model.head.weight}, n_tokens=50,
                                    k=6, n_null=10)
    got = monitor.measure(1)
    rows, cols = monitor.probe_positions
    assert len(rows) == 50 and monitor.probe_ids.shape == (3, 20)
    assert all(any(torch.equal(row, p) for p in probe) for row in monitor.probe_ids)
    # the same states read by hand: the submodules' outputs at the sampled positions
    outs = {}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, a, o, n=n: outs.__setitem__(n, o))
             for n in ("emb", "blocks.0", "blocks.1")]
    model.eval()
    with torch.no_grad():
        model(monitor.probe_ids)  # 3 of the 6 windows: enough for 50 tokens
    for h in hooks:
        h.remove()
    states = [outs[n][rows, cols] for n in ("emb", "blocks.0", "blocks.1")]
    profile = pga.pga_profile(states, model.head.weight.detach(), k=6, n_null=10, ccrs=(1,), progress=False)
    assert [got[f"pga_z/ccr1/{label}"] for label in ("emb", "b0", "b1")] == pytest.approx(
        [r.z for r in profile[1]], rel=0, abs=1e-12)
    assert got["eps/input"] == rf.pairwise_cosine_stats(model.emb.weight.detach(), progress=False).epsilon()
    assert got["eps/output"] == rf.cosine_moments(model.head.weight.detach()).epsilon()


def test_texts_with_the_models_tokenizer_make_the_probe(tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(rf.models.resolve_source("minilm").path)
    model = gpt2(vocab=len(tok))
    text = tmp_path / "probe.txt"
    text.write_text("The cat sat on the mat and looked at the door. " * 40)
    monitor = RepresentationMonitor(model, texts=text, tokenizer=tok, n_tokens=64, seq_len=32, k=8, n_null=5)
    assert monitor.probe_ids.shape == (2, 32)  # ceil(64 / 32) windows
    assert monitor.measure(0)["eps/input"] > 0


def _state(model):
    return ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()],
            torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy(),
            torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))


def test_the_model_and_the_process_state_are_left_as_they_were():
    model = gpt2()
    model.train()
    model.transformer.h[0].eval()  # partly in training mode
    model.transformer.wpe.weight.requires_grad_(False)
    monitor = RepresentationMonitor(model, ids(), n_tokens=64, k=8, n_null=5)
    plain = monitor.measure(0)
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    before = _state(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = monitor.measure(1)
        assert torch.is_autocast_enabled("cpu")
    after = _state(model)
    assert before[0] == after[0] and before[1] == after[1]
    assert torch.equal(before[2], after[2]) and before[3] == after[3] and np.array_equal(before[4], after[4])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    # autocast was off inside: the same values as outside it
    assert {k: v for k, v in inside.items() if k not in ("step", "monitor/seconds")} == {
        k: v for k, v in plain.items() if k not in ("step", "monitor/seconds")}
    with torch.no_grad():
        monitor.measure(2)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def _train(model, steps, monitor=None, every=5):
    torch.manual_seed(11)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = ids(40, 32, seed=5)
    model.train()
    for step in range(steps):
        batch = data[torch.randint(0, 40, (4,))]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if monitor is not None and step % every == 0:
            monitor.measure(step)
    return model


def test_training_is_bit_identical_with_and_without_the_monitor():
    plain = _train(gpt2(seed=1), 20)
    watched_model = gpt2(seed=1)
    monitor = RepresentationMonitor(watched_model, ids(), n_tokens=64, k=8, n_null=5,
                                    measures=("epsilon", "pga", "spectral"))
    watched = _train(watched_model, 20, monitor)
    for (name, a), (_, b) in zip(plain.named_parameters(), watched.named_parameters()):
        assert torch.equal(a, b), name
    assert watched.training


def test_the_jsonl_file_gets_one_line_per_measurement_and_is_appended_to(tmp_path):
    out = tmp_path / "runs" / "metrics.jsonl"
    monitor = RepresentationMonitor(gpt2(), ids(), n_tokens=64, k=8, n_null=5, output=out)
    a, b = monitor.measure(0), monitor.measure(10)
    again = RepresentationMonitor(gpt2(), ids(), n_tokens=64, k=8, n_null=5, output=str(out))
    again.measure(20)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 10, 20]
    assert lines[0] == a and lines[1]["eps/input"] == b["eps/input"]


def test_a_nan_value_is_written_as_null(tmp_path):
    out = tmp_path / "m.jsonl"
    monitor = RepresentationMonitor(gpt2(), ids(), n_tokens=64, k=8, n_null=5, output=out)
    monitor._append({"step": 3, "pga_z/ccr1/layer0": math.nan})
    assert json.loads(out.read_text().splitlines()[-1]) == {"step": 3, "pga_z/ccr1/layer0": None}


@pytest.mark.parametrize("kwargs, match", [
    ({"layers": [0, 5]}, "layers: 5 is out of range"),
    ({"layers": {"x": "blocks.9"}}, r"layers\['x'\]: the model has no submodule 'blocks.9'"),
    ({"probe": ids(4, 16, vocab=150)}, r"probe: token ids must be in \[0, 100\)"),
    ({"probe": ids(4, 16).float()}, "probe must hold integer token ids"),
    ({"probe": ids(1, 40), "n_tokens": 64}, "n_tokens=64 but the probe holds 40 tokens"),
    ({"probe": ids(2, 80)}, "seq_len: the probe's windows have 80 tokens; the model takes at most 64"),
    ({"measures": ("epsilon", "rankme")}, "measures must be one of"),
    ({"k": 32}, "k must satisfy 1 <= k < d = 32"),
    ({"n_null": 1}, "n_null must be an int >= 2"),
    ({"ccrs": (1, 1)}, "ccrs must be distinct"),
    ({"backend": "cuda"}, "cuda"),
    ({"precision": "bf16"}, "precision must be one of"),
    ({"last_layer": "final"}, "last_layer must be one of"),
    ({"output": 5}, "output"),
    ({"embeddings": {"input": "transformer.wte.weight"}}, "embeddings= is for a model of your own"),
])
def test_bad_arguments_fail_when_the_monitor_is_built(kwargs, match):
    kwargs = {"probe": ids(), "n_tokens": 64, "k": 8, "n_null": 5, **kwargs}
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        RepresentationMonitor(gpt2(), **kwargs)


def test_bad_outputs_fail_when_the_monitor_is_built(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        RepresentationMonitor(gpt2(), ids(), n_tokens=64, k=8, n_null=5, output=tmp_path)
    text = tmp_path / "probe.txt"
    text.write_text("one two three " * 50)
    tok = transformers.AutoTokenizer.from_pretrained(rf.models.resolve_source("minilm").path)
    with pytest.raises(ValueError, match="output .* is texts, which this run reads"):
        RepresentationMonitor(gpt2(vocab=len(tok)), texts=text, tokenizer=tok, n_tokens=64, seq_len=32, k=8, n_null=5,
                              output=text)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00\x01 not json")
    with pytest.raises(ValueError, match="not a JSONL file of measurements"):
        RepresentationMonitor(gpt2(), ids(), n_tokens=64, k=8, n_null=5, output=other)


def test_a_model_of_ones_own_refuses_bad_layers_and_embeddings():
    model = Tiny()
    probe = ids(4, 20, vocab=60)
    with pytest.raises(ValueError, match="is not a submodule of the model"):
        RepresentationMonitor(model, probe, layers={"x": torch.nn.Linear(2, 2)}, n_tokens=40, k=4, n_null=5)
    with pytest.raises(ValueError, match="the model has no parameter 'head.bias'"):
        RepresentationMonitor(model, probe, layers={"x": "emb"}, embeddings={"output": "head.bias"}, n_tokens=40)
    with pytest.raises(ValueError, match="'pga' needs the model's unembedding"):
        RepresentationMonitor(model, probe, layers={"x": "emb"}, embeddings={"input": "emb.weight"}, n_tokens=40)
    with pytest.raises(ValueError, match="is not a parameter of the model"):
        RepresentationMonitor(model, probe, layers={"x": "emb"}, embeddings={"output": torch.randn(60, 24)},
                              n_tokens=40)
    with pytest.raises(ValueError, match=r"probe: token ids must be in \[0, 60\)"):
        RepresentationMonitor(model, ids(4, 20, vocab=100), layers={"x": "emb"},
                              embeddings={"input": "emb.weight", "output": "head.weight"}, n_tokens=40)
    with pytest.raises(ValueError, match="for a model of your own, pass layers= as a mapping"):
        RepresentationMonitor(model, probe, n_tokens=40)
    with pytest.raises(ValueError, match="last_layer applies to transformers and TransformerLens models"):
        RepresentationMonitor(model, probe, layers={"x": "emb"}, embeddings={"input": "emb.weight"},
                              measures="epsilon", n_tokens=40, last_layer="resid_post")


class Pooled(Tiny):
    """Also a pooled 2-D output (batch × d) and a submodule that never runs."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.Identity()
        self.unused = torch.nn.Linear(24, 24)

    def forward(self, x):
        logits = super().forward(x)
        self.pool(self.emb(x).mean(1))
        return logits


@pytest.mark.parametrize("where, got", [("pool", r"got shape \(2, 24\)"), ("unused", "got nothing")])
def test_a_submodule_whose_output_is_not_batch_tokens_d_is_named(where, got):
    monitor = RepresentationMonitor(Pooled(), ids(4, 20, vocab=60), layers={"b": where}, measures="spectral",
                                    embeddings={"input": "emb.weight"}, n_tokens=40)
    with pytest.raises(ValueError, match=rf"layers\['b'\] \({where}\): expected its output to be batch × tokens × d.*"
                                         + got):
        monitor.measure(0)


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        model = gpt2()
    with pytest.raises(ValueError, match="model: .* is on the meta device"):
        RepresentationMonitor(model, ids(), n_tokens=64, k=8, n_null=5)


def test_a_compiled_model_is_looked_through():
    model = gpt2()
    monitor = RepresentationMonitor(torch.compile(model, backend="eager"), ids(), n_tokens=64, k=8, n_null=5)
    assert monitor.model is model


def test_read_metrics_orders_by_step_keeps_the_last_of_a_repeated_step_and_reads_null_as_nan(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 10, "eps/input": 0.3}\n\n{"step": 0, "eps/input": null}\n'
                    '{"step": 10, "eps/input": 0.4}\n')
    got = rf.monitor.read_metrics(path)
    assert [r["step"] for r in got] == [0, 10] and math.isnan(got[0]["eps/input"]) and got[1]["eps/input"] == 0.4
    path.write_text('{"eps/input": 0.3}\n')
    with pytest.raises(ValueError, match="m.jsonl:1: expected a JSON object with an integer 'step'"):
        rf.monitor.read_metrics(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no measurements"):
        rf.monitor.read_metrics(path)


def test_the_probe_keeps_the_windows_it_needs_chosen_with_the_seed():
    batch = ids(40, 32)
    a = RepresentationMonitor(gpt2(), batch, n_tokens=64, k=8, n_null=5, measures="epsilon")
    b = RepresentationMonitor(gpt2(), batch, n_tokens=64, k=8, n_null=5, measures="epsilon", seed=1)
    assert a.probe_ids.shape == b.probe_ids.shape == (2, 32)  # 64 tokens, about 32 from each window
    assert not torch.equal(a.probe_ids, b.probe_ids)
    stream = ids(1, 1000).flatten()
    c = RepresentationMonitor(gpt2(), stream, n_tokens=100, seq_len=50, tokens_per_window=10, k=8, n_null=5)
    assert c.probe_ids.shape == (10, 50)
    starts = [int((stream.unfold(0, 50, 50) == row).all(1).nonzero()) for row in c.probe_ids]
    assert starts == sorted(starts)  # whole windows of the stream, in order


def test_a_transformer_lens_model_equals_its_standalone_calls():
    tl = pytest.importorskip("transformer_lens")
    torch.manual_seed(0)
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_head=16, d_vocab=100, act_fn="gelu",
                                     normalization_type="LN")
    model = tl.HookedTransformer(cfg)
    monitor = RepresentationMonitor(model, ids(), n_tokens=64, k=8, n_null=10)
    got = monitor.measure(0)
    hs = rf.hidden_states(model, token_ids=monitor.probe_ids, layers="all", n_tokens=64, seed=0, progress=False,
                          seq_len=32)
    profile = pga.pga_profile([hs[layer] for layer in hs.layers], model.W_U.detach().T, k=8, n_null=10, ccrs=(1,),
                              progress=False)
    assert [got[f"pga_z/ccr1/layer{layer}"] for layer in hs.layers] == pytest.approx([r.z for r in profile[1]],
                                                                                     rel=0, abs=1e-12)
    assert got["eps/input"] == rf.cosine_moments(model.W_E.detach()).epsilon()
    assert got["eps/output"] == rf.cosine_moments(model.W_U.detach().T).epsilon()
