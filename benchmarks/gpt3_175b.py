"""The GPT-3 175B distributed check: one training step on 1024 A100-80GB (DGX A100 nodes),
tp=8, pp=8, dp=16, global batch 1536, microbatch 1, mixed precision (fp16 graph), full
activation recomputation -- the configuration of Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Table 1 (138-140 TFLOP/s
per GPU reported).

    python benchmarks/gpt3_175b.py [--predictor default] [--layers-exported 2]

A 175B graph is never exported layer by layer: the model is exported with two transformer
layers (hidden 12288, 96 heads, seq 2048, vocab 51200, fp16; weights never materialized) and
the forecast repeats the first layer up to 96 (tilecast.parallel's ``layers``), with the
embedding and LM head forecast once. Prints the forecast's wall time (export excluded: it is
cached under ~/.cache/tilecast/exports), step time, per-GPU memory, TFLOP/s per GPU and the
300-billion-token run those steps add up to (the paper's estimate: 34 days).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

# Brown et al. 2020, Table 2.1: GPT-3 175B; vocabulary 51,200 as in Megatron-LM's benchmark
# runs ("All models use a vocabulary size of 51,200 and a sequence length of 2048", the
# Megatron-LM README's scaling table, the same runs as Narayanan et al.'s Table 1).
CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "activation_function": "gelu_new", "n_ctx": 2048, "n_embd": 12288, "n_head": 96,
    "n_layer": 96, "n_positions": 2048, "vocab_size": 51200, "layer_norm_epsilon": 1e-05,
}
PAPER_TFLOPS = 140.0  # Narayanan et al. SC'21 Table 1, 175B row (t=8, p=8, 1024 GPUs)
# Narayanan et al. SC'21 Section 5.1: GPT-3 175B on 300 billion tokens with 1024 A100s at
# batch 1536 takes an estimated 34 days (their equation 4, 8TP / (nX) at X = 140 TFLOP/s).
PAPER_TOKENS, PAPER_DAYS = 300e9, 34.0


def export_graph(cache: Path, layers_exported: int = 2, dtype: str = "float16") -> Path:
    """The two-layer 175B training graph, exported once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"gpt3-175b-v51200-L{layers_exported}-b1-s2048-{dtype}-train.onnx"
    if not path.is_file():
        from tilecast.exporters import export_model

        t = time.perf_counter()
        export_model(CONFIG, batch=1, seq=2048, task="causal-lm", dtype=dtype,
                     layers=layers_exported, output=path, train_mode=True)
        print(f"exported {path} in {time.perf_counter() - t:.1f} s (cached)")
    return path


def forecast(path: Path, predictor: str = "default", virtual_stages: int = 1,
             overlap_grad_reduce: bool = True):
    """Narayanan et al.'s 175B run: tp 8, pp 8, dp 16, 96 microbatches of 1, recomputation,
    Adam, Megatron fusions, on DGX A100 nodes (a ``ParallelForecast``)."""
    from tilecast.parallel import Layout, analyze_parallel

    layout = Layout(dp=16, tp=8, pp=8, microbatches=1536 // 16, recompute="full",
                    virtual_stages=virtual_stages, overlap_grad_reduce=overlap_grad_reduce)
    return analyze_parallel(path, layout, cluster="dgx-a100", predictor=predictor,
                            optimizer="adam", layers=96, fusion=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictor", default="default")
    ap.add_argument("--layers-exported", type=int, default=2)
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    path = export_graph(Path.home() / ".cache" / "tilecast" / "exports", args.layers_exported,
                        args.dtype)
    t = time.perf_counter()
    f = forecast(path, args.predictor)
    wall = time.perf_counter() - t
    layout = f.layout
    worst = max(f.ranks, key=lambda r: r.memory.total)
    print(f"forecast wall time      {wall:.2f} s")
    print(f"layout                  {layout.label()} on {f.cluster.name} "
          f"({layout.gpus} GPUs, {f.cluster.nodes_for(layout.gpus)} nodes)")
    print(f"global batch            {f.global_batch}")
    print(f"step time               {f.step_ms / 1e3:.2f} s")
    print(f"per-GPU memory (peak)   {worst.memory.total / 2**30:.1f} GiB of "
          f"{worst.memory.capacity / 2**30:.0f} (stage {worst.stage}: weights "
          f"{worst.memory.weights / 2**30:.1f}, grads {worst.memory.gradients / 2**30:.1f}, "
          f"optimizer {worst.memory.optimizer / 2**30:.1f}, activations "
          f"{worst.memory.activations / 2**30:.1f})")
    tf = f.tflops_per_gpu
    print(f"throughput              {tf:.1f} TFLOP/s per GPU (paper: {PAPER_TFLOPS:.0f}; "
          f"{(tf - PAPER_TFLOPS) / PAPER_TFLOPS * 100:+.1f} %)")
    from tilecast.parallel import plan_run

    run = plan_run(f, PAPER_TOKENS)
    print(f"300B-token run          {run.steps:,} steps, {run.days:.1f} days, "
          f"{run.gpu_hours:,.0f} GPU-hours (paper's estimate: {PAPER_DAYS:.0f} days)")
    inter = forecast(path, args.predictor, virtual_stages=2)
    print(f"interleaved (2 chunks)  {inter.step_ms / 1e3:.2f} s, "
          f"{inter.tflops_per_gpu:.1f} TFLOP/s per GPU")
    after = forecast(path, args.predictor, overlap_grad_reduce=False)
    print(f"dp reduce after bwd     {after.step_ms / 1e3:.2f} s, "
          f"{after.tflops_per_gpu:.1f} TFLOP/s per GPU (Megatron-LM's default, "
          "--no-overlap-grad-reduce)")
    for r in f.ranks:
        print(f"  stage {r.stage}: layers {r.layers[0]}-{r.layers[1] - 1} compute "
              f"{r.compute_ms:.0f} ms, exposed comm {r.exposed_comm_ms:.0f} ms, bubble "
              f"{r.bubble_ms:.0f} ms, update {r.update_ms:.0f} ms")


if __name__ == "__main__":
    main()
