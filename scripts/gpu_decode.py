"""Time Hugging Face generation of a zoo decoder on a leased GPU: what `tilecast serve
--runtime eager` forecasts (prefill, then one eager decode step per token with the KV cache).

usage: python scripts/gpu_decode.py OUT [--model llama-3-8b] [--runs 8x1024,1x1024]
                                        [--generate 64] [--device cuda:0]

Random bf16 weights (tilecast's exporter builds the module, as `collect-labels` does). Each
run times `generate` with 1 new token (the prefill and its first token) and with `--generate`
new tokens, greedy, `min_new_tokens` = `max_new_tokens` so that no end-of-sequence token stops
it, the default (dynamic) cache; medians of 3 after a warm-up. The time per output token is
(t(N) - t(1)) / (N - 1). Writes OUT/decode-<model>-b<batch>-p<prompt>.json per run as it is
measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPEATS = 3


def _timed(generate, new_tokens: int) -> float:
    """Median wall ms of ``generate(new_tokens)`` over REPEATS, after one warm-up."""
    generate(new_tokens)
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        start = time.perf_counter()
        generate(new_tokens)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(model: str, batch: int, prompt: int, new_tokens: int, device: str,
            layers: int | None = None) -> dict:
    from tilecast.exporters.api import build_module

    built = build_module(model, batch=batch, seq=prompt, dtype="bfloat16", layers=layers,
                         device=device)
    module = built.module.eval()
    # the exporter builds for tracing, with the KV cache off; generation keeps it
    module.config.use_cache = module.generation_config.use_cache = True
    ids = built.inputs["input_ids"]
    mask = torch.ones_like(ids)

    def generate(n: int) -> None:
        with torch.inference_mode():
            module.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, pad_token_id=0,
                            use_cache=True)

    first = _timed(generate, 1)
    total = _timed(generate, new_tokens)
    return {"model": model, "layers": layers, "batch": batch, "prompt": prompt,
            "generate": new_tokens, "dtype": "bfloat16", "prefill_ms": first,
            "generate_ms": total, "tpot_ms": (total - first) / (new_tokens - 1),
            "repeats": REPEATS, "cache": "dynamic (Hugging Face default)",
            "torch": torch.__version__, "device": torch.cuda.get_device_name(device)
            if torch.cuda.is_available() else "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--runs", default="8x1024,1x1024", help="BATCHxPROMPT,...")
    ap.add_argument("--generate", type=int, default=64)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import transformers

    for run in a.runs.split(","):
        batch, prompt = (int(x) for x in run.split("x"))
        path = a.out / f"decode-{a.model}-b{batch}-p{prompt}.json"
        try:
            res = measure(a.model, batch, prompt, a.generate, a.device, a.layers)
        except Exception as exc:  # one run must not cost the others
            print(f"decode {run}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        res["transformers"] = transformers.__version__
        path.write_text(json.dumps(res, indent=2) + "\n")
        print(f"decode {a.model} b{batch} p{prompt}: prefill {res['prefill_ms']:.1f} ms, "
              f"{res['tpot_ms']:.2f} ms per token", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
