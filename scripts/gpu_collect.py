"""One time-boxed collection on a leased GPU (../shared/gpu-collection.md): kernels, then labels.

usage: python scripts/gpu_collect.py OUT [--scale 1.0] [--device cuda:0]

Every phase has its own time budget (seconds x --scale) so that a short lease still returns
some of everything: tensor-core matmuls first (the data tilecast lacks most), then whole-model
labels, convs, row ops, fp16/fp8 matmuls, fused attention. Shapes within a phase are shuffled
with a fixed seed, so a phase cut by its budget keeps a uniform sample of its plan; rows are
flushed as measured and a rerun resumes. Never fp32 or tf32: on Hopper those are the blind test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilecast.collect import collect_label, run_collection  # noqa: E402
from tilecast.collect.cli import ZOO_DIR  # noqa: E402
from tilecast.collect.shapes import Shape, default_grid, zoo_shapes  # noqa: E402

SEED = 20261126
# ResNet-50's convs (in, out, kernel, input size, stride): the stem, one block of each stage
# with its strided 3x3 and projection, at batch 1 and 32 (what the zoo model and the labels run).
RESNET_CONVS = ((3, 64, 7, 224, 2), (64, 64, 1, 56, 1), (64, 64, 3, 56, 1), (64, 256, 1, 56, 1),
                (256, 128, 1, 56, 1), (128, 128, 3, 56, 2), (256, 512, 1, 56, 2),
                (128, 512, 1, 28, 1), (512, 256, 1, 28, 1), (256, 256, 3, 28, 2),
                (256, 256, 3, 14, 1), (1024, 256, 1, 14, 1), (512, 512, 3, 14, 2),
                (512, 512, 3, 7, 1), (2048, 512, 1, 7, 1), (512, 2048, 1, 7, 1))
# Large regular GEMMs (the plan asks M, N, K up to 16k): squares and a 7B decoder's prefill,
# as (in, out) features.
SQUARES = (1024, 2048, 4096, 8192, 16384)
LLM_GEMMS = ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (14336, 4096),
             (4096, 28672))


def _shuffled(shapes: list[Shape]) -> list[Shape]:
    out = list(dict.fromkeys(shapes))
    random.Random(SEED).shuffle(out)
    return out


def matmul_plan() -> list[Shape]:
    zoo = sorted(ZOO_DIR.glob("*.json"))
    big = [Shape("linear", (1, s, s, s)) for s in SQUARES]
    big += [Shape("linear", (1, m, i, o)) for m in (2048, 8192, 16384) for i, o in LLM_GEMMS]
    # big GEMMs lead: a cut phase still has them
    rest = _shuffled([*default_grid("linear"), *zoo_shapes("linear", zoo), *default_grid("bmm"),
                      *zoo_shapes("bmm", zoo), *default_grid("bmmt", 80),
                      *zoo_shapes("bmmt", zoo)])
    return big + rest


def conv_plan() -> list[Shape]:
    resnet = [Shape("conv", (b, c, k, r, h, s, r // 2, 1, last)) for b in (1, 32)
              for c, k, r, h, s in RESNET_CONVS for last in (0, 1)]
    return _shuffled(resnet) + _shuffled(default_grid("conv"))


def rows_plan() -> list[Shape]:
    zoo = sorted(ZOO_DIR.glob("*.json"))
    ops = ("softmax", "ln", "add", "mul", "gelu", "relu", "tanh", "divu", "cast", "and", "addb",
           "whereb", "maxt", "permc")
    shapes = [s for op in ops for s in (*default_grid(op, 60), *zoo_shapes(op, zoo))]
    return _shuffled(shapes + default_grid("bn", 60) + default_grid("bnc", 60))


def loops_plan() -> list[Shape]:
    """What decides two open modelling choices (docs/predictor.md, "PyTorch's non-vectorized
    elementwise loop" and "extrapolated"): the broadcast add, the permuted heads' copy and the
    plain add at the zoo's sizes and on a grid (L2-resident to DRAM-bound), and inference
    batch norms whose weights are fp32 (cuDNN's kernel for fp16 input) beside fp16 ones
    (PyTorch's own), on the same shapes."""
    zoo = sorted(ZOO_DIR.glob("*.json"))
    ops = ("addb", "permc", "add")
    rows = [s for op in ops for s in (*default_grid(op, 40), *zoo_shapes(op, zoo))]
    bn = [Shape(op, s.dims) for s in default_grid("bn", 60) for op in ("bnc", "bn")]
    return _shuffled(rows + bn)


def training_plan() -> list[Shape]:
    """A training step's kernels that no earlier phase measured: ResNet-50's conv gradients
    (dX, dW) at the batch its training labels run (32, 128) in both layouts, the grid's convs'
    gradients (the same shapes as the forward grid: pairs), linear weight gradients (dY^T X) of
    the zoo's layers and a grid; ResNet's lead so that a cut phase still has them."""
    zoo = sorted(ZOO_DIR.glob("*.json"))
    resnet = [Shape(op, (b, c, k, r, h, s, r // 2, 1, last)) for op in ("convdx", "convdw")
              for b in (32, 128) for c, k, r, h, s in RESNET_CONVS for last in (0, 1)]
    grid = [*default_grid("convdx", 120), *default_grid("convdw", 120),
            *zoo_shapes("mmtn", zoo), *default_grid("mmtn", 150)]
    return _shuffled(resnet) + _shuffled(grid)


def conv_gemm_plan(root: Path) -> list[Shape]:
    """The plain GEMM of each dense bf16 conv already measured here: ``Linear(C R S -> K)`` on
    N P Q rows, the implicit GEMM's dims. Paired with its conv row, it says how much of the
    conv's time is its GEMM and how much cuDNN's gather and layout add."""
    import csv

    out = []
    with (root / "kernels" / "nvidia" / "train" / "conv" / "NVIDIA_H100_80GB_HBM3.csv").open(
            newline="") as fh:
        for r in csv.DictReader(fh):
            n, c, k, rr, h, st, pad, g = (int(r[x]) for x in (
                "B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
                "Padding", "Groups"))
            p = (h + 2 * pad - rr) // st + 1
            if g == 1 and r["dtype"] == "bf16" and float(r["Latency"]) >= 0.05:
                out.append(Shape("linear", (1, n * p * p, c * rr * rr, k)))
    return _shuffled(out)


def bn_training_plan() -> list[Shape]:
    """A training step's batch norms: ResNet-50's (the channels and size after each of its
    convs) at batch 32 and 128 in both layouts, forward on batch statistics and backward,
    then a grid. Measured in bf16 and fp16: ResNet-50's autocast step took 49.0 ms in fp16
    and 63.7 in bf16, and bf16 ran PyTorch's one-block-per-channel kernels (docs/accuracy.md);
    the fp16 rows' kernel names say whether fp16 runs others."""
    resnet = {(k, h // s) for _, k, _, h, s in RESNET_CONVS}
    lead = [Shape(op, (b, c, h, last)) for op in ("bnfw", "bnbw") for b in (32, 128)
            for c, h in sorted(resnet) for last in (0, 1)]
    return _shuffled(lead) + _shuffled([*default_grid("bnfw", 60), *default_grid("bnbw", 60)])


def llama_rows_plan() -> list[Shape]:
    """The row kernels of a Llama layer beside the layer norm and GELU the rows phase has."""
    zoo = sorted(ZOO_DIR.glob("*.json"))
    return _shuffled([s for op in ("rms", "silu") for s in (*default_grid(op, 120),
                                                             *zoo_shapes(op, zoo))])


def decode_linears() -> list[Shape]:
    zoo = sorted(ZOO_DIR.glob("*.json"))
    return _shuffled([s for s in zoo_shapes("linear", zoo) if s.dims[1] <= 128])


# (model, batch, seq, mode, runtime, layers): the plan's models at two batch sizes, eager and
# as one CUDA graph, and a bf16 training step.
LABELS = (("resnet-50", 1, None, "inference", "eager", None),
          ("resnet-50", 1, None, "inference", "cudagraph", None),
          ("resnet-50", 256, None, "inference", "eager", None),
          ("bert-large", 8, 512, "inference", "eager", None),
          ("bert-large", 8, 512, "inference", "cudagraph", None),
          ("gpt2-large", 4, 1024, "inference", "eager", None),
          ("llama-3-8b", 1, 2048, "inference", "eager", 4),
          ("bert-large", 8, 512, "training", "eager", None),
          ("bert-large", 1, 128, "inference", "eager", None),
          ("mobilenet-v3-large", 1, None, "inference", "eager", None),
          ("mobilenet-v3-large", 1, None, "inference", "cudagraph", None),
          ("resnet-50", 32, None, "inference", "eager", None),
          ("gpt2-large", 1, 1024, "inference", "eager", None),
          ("llama-3-8b", 1, 2048, "inference", "cudagraph", 4),
          ("resnet-50", 256, None, "inference", "cudagraph", None))


# A second lease: more batch sizes of the same models, for a per-batch bf16 table.
MORE_LABELS = (
    *(("resnet-50", b, None, "inference", rt, None) for b in (2, 8, 64, 128)
      for rt in ("eager", "cudagraph")),
    *(("mobilenet-v3-large", b, None, "inference", rt, None) for b in (8, 64, 256)
      for rt in ("eager", "cudagraph")),
    *(("vit-base", b, None, "inference", "eager", None) for b in (1, 8, 32, 128)),
    *(("bert-large", b, s, "inference", "eager", None) for b, s in ((1, 512), (2, 512),
                                                                    (4, 512), (16, 512),
                                                                    (32, 128), (8, 128))),
    *(("bert-large", b, 512, "training", "eager", None) for b in (1, 2, 4, 16)),
    *(("gpt2-large", b, 1024, "inference", "eager", None) for b in (2, 8)),
    *(("llama-3-8b", 1, s, "inference", "eager", 4) for s in (128, 512, 1024, 4096)),
    *(("llama-3-8b", b, 2048, "inference", "eager", 4) for b in (2, 4)),
    ("resnet-50", 32, None, "training", "eager", None),
    ("resnet-50", 128, None, "training", "eager", None),
    ("vit-base", 32, None, "training", "eager", None),
)


# LM heads whose vocabulary is no multiple of 8 (16-byte rows in 16-bit) beside their padded
# twins: on the H100 GPT-2 Large's 4096 x 1280 -> 50257 head ran cuBLAS's align1 fallback
# (cutlass_75 ... align1) for 5.46 ms, 8x the aligned forecast (traces/). Measured across
# GPUs, this is the data an alignment rule needs.
VOCABS = ((30522, 30528), (50257, 50264), (32000, 32000), (128256, 128256), (32001, 32008))


def alignment_plan() -> list[Shape]:
    out = [Shape("linear", (1, m, h, v)) for m in (512, 2048, 8192) for pair in VOCABS
           for v in pair for h in (1024, 1280, 4096)]
    # attention-score masks, broadcast (the non-vectorized elementwise kernel) and not
    out += [Shape(op, (b * heads * s, s)) for op in ("addb", "add", "whereb", "softmax")
            for b, heads, s in ((1, 20, 1024), (4, 20, 1024), (8, 16, 512), (1, 32, 2048))]
    return _shuffled(out)


# Long reductions beside their transposed twins (same FLOPs, same operands' sizes): on every
# fp32 training GPU a held-out Linear's forecast / measured falls as K grows (P100: Linear(50272
# -> 4096) on 65,536 rows 3.3x slower than Linear(4096 -> 50272); docs/predictor.md, "Open
# causes"). Whether tensor-core kernels show it too says whether the term is general. Dims are
# the shared CSVs' (1, rows, in, out).
LONG_K = (1024, 4096, 16384, 32768, 50272, 65536)


def long_k_plan() -> list[Shape]:
    return _shuffled([Shape("linear", (1, m, *pair)) for m in (4096, 16384, 65536)
                      for k in LONG_K for pair in ((4096, k), (k, 4096))])


# bf16 autocast over fp32 models (what `tilecast analyze --math amp-bf16` forecasts): the
# plan's bf16 (autocast) training step of BERT-Large, and inference beside the bf16 labels.
AMP_LABELS = (("bert-large", 8, 512, "training", "eager", None),
              ("bert-large", 8, 512, "inference", "eager", None),
              ("gpt2-large", 4, 1024, "inference", "eager", None),
              ("resnet-50", 128, None, "training", "eager", None),
              ("resnet-50", 256, None, "inference", "eager", None),
              ("llama-3-8b", 1, 2048, "inference", "eager", 4),
              ("bert-large", 2, 512, "training", "eager", None),
              ("vit-base", 32, None, "training", "eager", None),
              ("resnet-50", 256, None, "inference", "cudagraph", None))


# A second pass: the same models at more batch sizes, for per-batch autocast rows.
MORE_AMP_LABELS = (
    *(("bert-large", b, 512, mode, "eager", None) for b in (1, 4, 16)
      for mode in ("training", "inference")),
    *(("resnet-50", b, None, "training", "eager", None) for b in (32, 64, 256)),
    *(("resnet-50", b, None, "inference", "eager", None) for b in (32, 64, 128)),
    *(("gpt2-large", b, 1024, "inference", "eager", None) for b in (1, 8)),
    *(("vit-base", b, None, mode, "eager", None) for b in (8, 128)
      for mode in ("training", "inference")),
    *(("llama-3-8b", 1, s, "inference", "eager", 4) for s in (1024, 4096)),
    ("gpt2-large", 4, 1024, "training", "eager", None),
)


def repeat_plan(root: Path) -> list[Shape]:
    """A sample of shapes already measured (the first lease), to measure again in a separate
    folder: the run-to-run spread on a fresh machine, the floor any model's error sits on."""
    from tilecast.collect.runner import existing_keys

    out = []
    for op, n in (("linear", 150), ("bmm", 60), ("conv", 80), ("softmax", 30), ("add", 30),
                  ("ln", 30)):
        keys = sorted(existing_keys(root / "kernels" / "nvidia" / "train" / op /
                                    "NVIDIA_H100_80GB_HBM3.csv"))
        keys = [k for k in keys if k[1] == "bf16"]
        random.Random(SEED).shuffle(keys)
        out += [Shape(op, tuple(int(x) for x in k[2:])) for k in keys[:n]]
    return out


def kernels(out: Path, name: str, shapes: list[Shape], dtypes: tuple[str, ...], budget: float,
            device: str) -> None:
    """One phase; a shape that raises is dropped and the phase goes on (up to 5 such)."""
    stop, current, measured = time.monotonic() + budget, [""], 0

    def note(i: int, n: int, label: str) -> None:
        current[0] = label

    for _ in range(6):
        try:
            res = run_collection(out, shapes, dtypes, device_spec=device, repeats=20,
                                 budget_s=max(stop - time.monotonic(), 0), progress=note)
            measured += res.measured
            print(f"{name}: measured {measured}, {res.left_for_next_run} left, "
                  f"{res.skipped_too_large} too large", flush=True)
            return
        except Exception as exc:  # one bad shape must not cost the lease's other shapes
            print(f"{name}: {current[0]} FAILED {type(exc).__name__}: {str(exc)[:200]}",
                  flush=True)
            op, _, dims = current[0].split(" ", 2) if current[0].count(" ") >= 2 else ("", "", "")
            shapes = [s for s in shapes if (s.op, "x".join(map(str, s.dims))) != (op, dims)]
            import torch

            torch.cuda.empty_cache() if torch.cuda.is_available() else None


def labels(out: Path, budget: float, device: str, plan=LABELS, dtype: str = "bf16",
           math: str = "graph") -> None:
    stop = time.monotonic() + budget
    for model, batch, seq, mode, runtime, layers in plan:
        if time.monotonic() > stop:
            print("labels: budget spent", flush=True)
            return
        t = time.monotonic()
        try:
            res = collect_label(model, out, batch=batch, seq=seq, dtype=dtype, mode=mode,
                                runtime=runtime, layers=layers, device_spec=device, math=math)
            print(f"label {model} b{batch} {mode} {runtime} {math}: {res.e2e_ms:.3f} ms "
                  f"({time.monotonic() - t:.0f} s)", flush=True)
        except Exception as exc:
            print(f"label {model} b{batch} {mode} {runtime}: FAILED {type(exc).__name__}: "
                  f"{str(exc)[:300]}", flush=True)
        finally:
            import torch

            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--only", default="", help="comma-separated phase names")
    a = ap.parse_args()
    s, dev = a.scale, a.device
    phases = {
        "matmul": lambda: kernels(a.out, "matmul bf16", matmul_plan(), ("bf16",), 130 * s, dev),
        "labels": lambda: labels(a.out, 120 * s, dev),
        "conv": lambda: kernels(a.out, "conv bf16", conv_plan(), ("bf16",), 60 * s, dev),
        "rows": lambda: kernels(a.out, "rows bf16", rows_plan(), ("bf16",), 45 * s, dev),
        "fp16": lambda: kernels(a.out, "linear fp16", decode_linears(), ("fp16",), 12 * s, dev),
        "fp8": lambda: kernels(a.out, "linear fp8", decode_linears(), ("fp8",), 8 * s, dev),
        "sdpa": lambda: kernels(a.out, "sdpa bf16", _shuffled(default_grid("sdpa", 80)),
                                ("bf16",), 15 * s, dev),
    }
    grid = lambda op, n: _shuffled(default_grid(op, n))  # noqa: E731
    rows = ("softmax", "ln", "add", "mul", "gelu", "relu", "tanh", "divu", "cast", "and",
            "addb", "whereb", "maxt", "addu", "mulu", "pow", "powu", "div")
    phases |= {  # the second lease
        "labels2": lambda: labels(a.out, 140 * s, dev, MORE_LABELS),
        "labels-repeat": lambda: labels(a.out.with_name(a.out.name + "-repeat"), 90 * s, dev,
                                        LABELS + MORE_LABELS[:14]),
        "amp": lambda: labels(a.out, 150 * s, dev, AMP_LABELS, "fp32", "amp-bf16"),
        "amp2": lambda: labels(a.out, 150 * s, dev, MORE_AMP_LABELS, "fp32", "amp-bf16"),
        "amp-repeat": lambda: labels(a.out.with_name(a.out.name + "-repeat"), 60 * s, dev,
                                     AMP_LABELS, "fp32", "amp-bf16"),
        "amp-fp16": lambda: labels(a.out, 60 * s, dev, AMP_LABELS[:6], "fp32", "amp-fp16"),
        "longk": lambda: kernels(a.out, "long reductions bf16", long_k_plan(), ("bf16",),
                                 60 * s, dev),
        "alignment": lambda: kernels(a.out, "alignment bf16", alignment_plan(), ("bf16", "fp16"),
                                     60 * s, dev),
        # the repeat's 380 H100 shapes on another GPU: a paired comparison across GPUs
        "paired": lambda: kernels(a.out, "paired with the H100", repeat_plan(
            ROOT / "datasets" / "h100-sxm5-80gb"), ("bf16",), 60 * s, dev),
        "gputime": lambda: kernels(a.out.with_name(a.out.name + "-gputime"), "gpu time bf16",
                                   repeat_plan(a.out), ("bf16",), 50 * s, dev),
        "repeat": lambda: kernels(a.out.with_name(a.out.name + "-repeat"), "repeat bf16",
                                  repeat_plan(a.out), ("bf16",), 35 * s, dev),
        "matmul2": lambda: kernels(a.out, "matmul bf16 (grid 2)", _shuffled(
            [*default_grid("linear", 700), *default_grid("bmm", 500), *default_grid("bmmt", 200)]),
            ("bf16",), 110 * s, dev),
        "conv2": lambda: kernels(a.out, "conv bf16 (grid 2)", grid("conv", 900), ("bf16",),
                                 80 * s, dev),
        "fp16b": lambda: kernels(a.out, "matmul fp16 grid", _shuffled(
            [*default_grid("linear", 200), *default_grid("bmm", 150)]), ("fp16",), 30 * s, dev),
        # stop 48's lease: training kernels and a Llama layer's rows
        "training": lambda: kernels(a.out, "training bf16", training_plan(), ("bf16",),
                                    150 * s, dev),
        "conv-gemms": lambda: kernels(a.out, "conv gemms bf16", conv_gemm_plan(
            ROOT / "datasets" / "h100-sxm5-80gb"),
                                      ("bf16",), 90 * s, dev),
        "bn-training": lambda: kernels(a.out, "batch norm training", bn_training_plan(),
                                       ("bf16", "fp16"), 90 * s, dev),
        "llama-rows": lambda: kernels(a.out, "llama rows bf16", llama_rows_plan(), ("bf16",),
                                      45 * s, dev),
        # stop 54: the loops and library kernels the forecast now tells apart, on any GPU:
        # PyTorch's non-vectorized loop (broadcast rows, permuted copies) beside the vector
        # kernel, and cuDNN's inference batch norm (fp16 input, fp32 weights) beside PyTorch's
        "loops": lambda: kernels(a.out, "loops and batch norms fp16", loops_plan(),
                                 ("fp16",), 30 * s, dev),
        "rows2": lambda: kernels(a.out, "rows bf16 (grid 2)", _shuffled(
            [x for op in rows for x in default_grid(op, 200)] + default_grid("bn", 200)),
            ("bf16",), 45 * s, dev),
    }
    only = [p for p in a.only.split(",") if p]
    for name in only or ("matmul", "labels", "conv", "rows", "fp16", "fp8", "sdpa"):
        phases[name]()
    (a.out / "plan.json").write_text(json.dumps({"seed": SEED, "scale": s}) + "\n")


if __name__ == "__main__":
    main()
