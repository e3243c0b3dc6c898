"""The full analysis at vocabulary scale on one GPU, with no model package and no network: the
architectures are built from configs written here, at initialization, on the device.

- `qwen2`: a Qwen2-shaped causal LM (vocabulary 151,936, d = 896, 24 layers, the shape of
  Qwen2-0.5B; untied here, so that the embedding is also compared against the unembedding), built
  at random initialization on the device, and the whole `repcap report` pipeline run through the
  Python API on seeded random token ids: ε streamed and exact for E and U, E against U, the PGA
  profile with CCR 1, 5 and 10 (k = 100, 100 nulls, 2048 tokens), and spectra. Stage times come
  from report.json; "wall" includes building the model.
- `llama3_embeddings`: a Llama-3-8B-shaped embedding matrix alone (V = 128,256, d = 4096,
  N(0, 0.02²) in bfloat16 as that model is stored, and in float32), ε by the streamed kernel and
  by the exact Gram moments, side by side.

Each records the peak GPU memory (torch's caching allocator). Run by `bench/bench_report.py -k
scale` (a fresh process per case, in the GPU suite); `--smoke` shrinks every size so that the
same code runs on a CPU in seconds (tests/test_in_memory.py runs it that way).

    python bench/report_at_scale.py qwen2 --device cuda --out /tmp/q
    python bench/report_at_scale.py llama3_embeddings --device cuda
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch

QWEN2 = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False, rope_theta=1000000.0,
             rms_norm_eps=1e-6)
QWEN2_SMOKE = dict(QWEN2, vocab_size=3000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
LLAMA3_EMBEDDINGS = (128256, 4096)
LLAMA3_EMBEDDINGS_SMOKE = (3000, 128)
SEQ_LEN = 128


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int:
    return int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else 0


def qwen2(device: str, smoke: bool, out: str, progress: bool = True) -> dict:
    """The whole report of a Qwen2-shaped model at random initialization (see the module doc)."""
    from transformers import Qwen2Config

    from repcap_fast.report import ReportSettings, run_report

    shape = QWEN2_SMOKE if smoke else QWEN2
    settings = ReportSettings(init="random", device=device, seed=0, n_tokens=256 if smoke else 2048,
                              k=16 if smoke else 100, n_null=12 if smoke else 100, ccrs=(1, 5, 10),
                              batch_size=16)
    n_windows = 4 * settings.n_tokens // SEQ_LEN  # about 32 sampled tokens per window of 128
    token_ids = torch.randint(0, shape["vocab_size"], (n_windows, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    _reset_peak(device)
    t0 = time.perf_counter()
    config = Qwen2Config(**shape)
    report = run_report(config, out, settings, token_ids=token_ids, text_name=f"{n_windows}×{SEQ_LEN} random token ids",
                        progress=progress)
    _sync(device)
    wall = time.perf_counter() - t0
    pga = report["pga"]["profile"]
    return {"case": "qwen2", "smoke": smoke, "device": device, "wall_seconds": wall,
            "stage_seconds": report["provenance"]["seconds"], "gpu_peak_bytes": _peak(device),
            "shape": {k: shape[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "tie_word_embeddings")},
            "settings": report["provenance"]["settings"],
            "epsilon": {k: None if report["epsilon"][k] is None else
                        {"stream": report["epsilon"][k]["epsilon"], "exact": report["epsilon"][k]["exact"]["epsilon"],
                         "backend": report["epsilon"][k]["backend"]} for k in ("input", "output")},
            "input_vs_output_epsilon": report["epsilon"]["input_vs_output"]["all_pairs"]["epsilon"],
            "z": {ccr: [r["z"] for r in rows] for ccr, rows in pga.items()},
            "pga_backend": pga["1"][0]["backend"], "layers": len(pga["1"]),
            "out": os.path.basename(os.path.normpath(out))}  # the folder's name: no path of this machine


def llama3_embeddings(device: str, smoke: bool, progress: bool = True) -> dict:
    """ε of a Llama-3-8B-shaped embedding matrix, streamed and exact, in bfloat16 and float32."""
    from repcap_fast import cosine_moments, pairwise_cosine_stats

    v, d = LLAMA3_EMBEDDINGS_SMOKE if smoke else LLAMA3_EMBEDDINGS
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    base = torch.randn(v, d, generator=gen, device=device) * 0.02
    for dtype in (torch.bfloat16, torch.float32):
        e = base.to(dtype)
        row = {"dtype": str(dtype).replace("torch.", "")}
        for name, fn in (("stream", lambda m: pairwise_cosine_stats(m, progress=None if progress else False)),
                         ("exact", cosine_moments)):
            fn(e)  # compiles or loads the kernels
            _reset_peak(device)
            t0 = time.perf_counter()
            res = fn(e)
            _sync(device)
            row[name] = {"seconds": time.perf_counter() - t0, "epsilon": res.epsilon(), "mean": res.mean,
                         "std": res.std, "gpu_peak_bytes": _peak(device)}
            if name == "stream":
                row[name]["backend"] = res.backend
        row["stream_minus_exact"] = row["stream"]["epsilon"] - row["exact"]["epsilon"]
        rows.append(row)
        del e
    return {"case": "llama3_embeddings", "smoke": smoke, "device": device, "shape": [v, d], "pairs": v * (v - 1) // 2,
            "results": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=("qwen2", "llama3_embeddings"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="small sizes (runs on a CPU in seconds)")
    p.add_argument("--out", help="the report folder (qwen2; default a temporary folder)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    if args.case == "qwen2":
        res = qwen2(args.device, args.smoke, args.out or tempfile.mkdtemp(prefix="repcap_qwen2_"), args.progress)
    else:
        res = llama3_embeddings(args.device, args.smoke, args.progress)
    text = json.dumps(res, indent=1)
    print("SCALE_RESULT " + json.dumps(res))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
