"""Consistency of forecasts beyond the batch: the checks that found stop 41's bugs.

    python benchmarks/consistency.py [--devices l4,mi300x] [--quiet]

``benchmarks/sanity.py`` holds every zoo model's forecast to its batch. This script holds
them to the other quantities a user varies, on every device in the database (or
``--devices``), and prints each series:

- **Prompt length.** GPT-2 Large, BERT-Large and Llama 3 8B (two layers, batch 2) exported at
  doubling sequence lengths, forecast in fp32, ``amp-fp16`` and ``amp-bf16`` (where the GPU
  has the dtype) under the eager and graph runtimes: no forecast may fall as the prompt grows.
- **Decode batch.** ``tilecast serve`` on Llama 3 8B (two layers forecast as 32; fp32 and a
  bf16 export; 1024-token prompts) at batch 1, 2, 4, ..., 64 under the cudagraph runtime: no
  decode step may take less time for more sequences. (Stop 41: the decode step kept the
  prompt's broadcast re-reads: with 4096-token prompts an fp32 MI300X step fell from 85.5 to
  72.2 ms per token from batch 1 to 8.)
- **Training against inference** (reported, not asserted): one training step over one forward
  pass of the same graph, per device, for the zoo's batch-64 exports. A step is a forward and a
  backward of about twice its FLOPs, so about 3x; the shared labels of BERT-Large at batch 8
  measure 3.25x on the MI210 and 3.27x on the V100. Stop 41 found AMD steps at 5.6-10x from
  GEMMs whose tile pick was a guess; the ratios outside 2-4.5x are listed as leads.

Exports go to the sanity cache (``$TILECAST_CACHE`` or ``~/.cache/tilecast``, ``sanity/``).
Exit status 1 when a series falls; every fall is listed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import tilecast

SEQUENCES = {"gpt2-large": (128, 256, 512, 1024), "bert-large": (64, 128, 256, 512),
             "llama-3-8b": (128, 256, 512, 1024, 2048)}
MATHS = ("graph", "amp-fp16", "amp-bf16")
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
RATIO_MODELS = ("bert-large", "gpt2-large", "llama-3-8b", "mobilenet-v3-large", "resnet-50",
                "vit-base")
RATIO_RANGE = (2.0, 4.5)


def _cache() -> Path:
    root = Path(os.environ.get("TILECAST_CACHE", Path.home() / ".cache" / "tilecast"))
    (root / "sanity").mkdir(parents=True, exist_ok=True)
    return root / "sanity"


def _export(name: str, path: Path, **kw) -> Path:
    if not path.exists():
        from tilecast.exporters import export_model

        export_model(name, layers=2, output=path, **kw)
    return path


def _falls(series: list[tuple[int, float]]) -> list[str]:
    return [f"{a} -> {b}: {ta:.4g} -> {tb:.4g} ms"
            for (a, ta), (b, tb) in zip(series[:-1], series[1:], strict=True) if tb < ta]


def prompt_lengths(devices, quiet: bool) -> list[str]:
    bad = []
    for name, seqs in SEQUENCES.items():
        files = {s: _export(name, _cache() / f"{name}-b2-s{s}-l2.onnx", batch=2, seq=s)
                 for s in seqs}
        for dev in devices:
            for math in MATHS:
                for runtime in ("eager", "graph"):
                    try:
                        series = [(s, tilecast.analyze(str(f), dev, math=math,
                                                       runtime=runtime).total_ms)
                                  for s, f in files.items()]
                    except tilecast.TilecastError:  # a math mode the GPU cannot run
                        continue
                    falls = _falls(series)
                    bad += [f"{name} {dev.name} {math} {runtime}: seq {x}" for x in falls]
                    if not quiet:
                        print(f"{name:<12}{dev.name:<38}{math:<10}{runtime:<7}"
                              + " ".join(f"{t:10.3f}" for _, t in series))
    return bad


def decode_batches(devices, quiet: bool) -> list[str]:
    from tilecast.serving import analyze_serving

    bad = []
    for dtype in ("float32", "bfloat16"):
        path = _export("llama-3-8b", _cache() / f"llama-3-8b-b1-s1024-{dtype}-l2.onnx",
                       batch=1, seq=1024, dtype=dtype)
        for dev in devices:
            series = [(b, analyze_serving(str(path), dev, generate=64, batch=b,
                                          runtime="cudagraph", layers=32).tpot_ms)
                      for b in DECODE_BATCHES]
            bad += [f"llama-3-8b {dtype} {dev.name}: batch {x}" for x in _falls(series)]
            if not quiet:
                print(f"decode {dtype:<10}{dev.name:<38}"
                      + " ".join(f"{t:9.3f}" for _, t in series))
    return bad


def training_ratios(devices) -> list[str]:
    leads = []
    for name in RATIO_MODELS:
        path = _export(name, _cache() / f"{name}-b64-l2.onnx", batch=64)
        for dev in devices:
            forward = tilecast.analyze(str(path), dev).total_ms
            ratio = tilecast.analyze(str(path), dev, mode="training").total_ms / forward
            if not RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:
                leads.append(f"{name} {dev.name}: training step {ratio:.2f}x the forward")
    return leads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", help="comma-separated GPU names (default: all)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    args = parser.parse_args()
    devices = ([tilecast.load_device(d) for d in args.devices.split(",")] if args.devices
               else tilecast.list_devices())
    seq_bad = prompt_lengths(devices, args.quiet)
    decode_bad = decode_batches(devices, args.quiet)
    leads = training_ratios(devices)
    print(f"\nprompt length: {len(seq_bad)} falls; decode batch: {len(decode_bad)} falls; "
          f"training / forward outside {RATIO_RANGE[0]}-{RATIO_RANGE[1]}x: {len(leads)} "
          f"(reported, not asserted)")
    for line in seq_bad + decode_bad + leads:
        print("  " + line)
    return 1 if seq_bad or decode_bad else 0


if __name__ == "__main__":
    sys.exit(main())
