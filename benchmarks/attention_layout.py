"""Attention's two products, forecast against the labels' per-node timings, per GPU.

    python benchmarks/attention_layout.py [--data ../shared/datasets/neusight-asplos25]

Eager attention runs ``Q K^T`` as a batched product whose second operand is a transposed view
(``key.transpose(-1, -2)``: cuBLAS / rocBLAS read it with the op(B) flag) and ``P V`` on two
contiguous operands, the layout of every ``bmm`` row in the shared kernel sweep. For each GPU
with per-node CSVs this prints the shipped predictor's forecast / measured time (geometric mean
over the inference labels' attention nodes) of each product, and of the sweep's own ``bmm``
rows shaped like ``Q K^T`` (M, N >= 512, K <= 128): if the sweep's rows are forecast well and
the transposed product is not, the gap is the layout, which no training row holds (the
``bmmt`` rows of ``tilecast collect`` measure it on a lent GPU). Nothing here is fitted.
"""

from __future__ import annotations

import ast
import math
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from data_consistency import labelled_runs, parse_data_args  # noqa: E402

from tilecast.analyzer.types import Kernel, MatmulDims, OpCost  # noqa: E402
from tilecast.learned.predictor import OnnxPredictor  # noqa: E402

SMALL_K = 128  # head sizes: 64, 80, 128


def product(shapes: str) -> tuple[str, MatmulDims] | None:
    """("qk" | "pv", dims) of a 4-D attention matmul node from its recorded input shapes."""
    try:
        a, b = ast.literal_eval(shapes)
    except (ValueError, SyntaxError, TypeError):
        return None
    if len(a) != 4 or len(b) != 4 or a[-1] != b[-2]:
        return None
    dims = MatmulDims(a[0] * a[1], a[2], b[3], a[3], batched=True)
    if a[-1] <= SMALL_K and b[-1] == a[-2]:
        return "qk", dims
    return ("pv", dims) if a[-1] == a[-2] and b[-1] <= SMALL_K else None


def _kernel(i: int, d: MatmulDims) -> Kernel:
    flops, nbytes = 2 * d.b * d.m * d.n * d.k, 4 * d.b * (d.m * d.k + d.k * d.n + d.m * d.n)
    return Kernel(f"k{i}", (f"k{i}",), "MatMul",
                  OpCost("matmul", flops, nbytes, "float32", "matrix", matmul=d))


def _gmean(pairs: list[tuple[float, float]]) -> str:
    if not pairs:
        return f"{'-':>12s}"
    g = math.exp(sum(math.log(p / m) for p, m in pairs) / len(pairs))
    return f"{len(pairs):4d} {g:7.2f}"


def label_products(runs, pred: OnnxPredictor) -> dict[tuple[str, str], list]:
    """(gpu, "qk" | "pv") -> [(forecast ms, measured ms)] over the inference labels."""
    out: dict[tuple[str, str], list] = defaultdict(list)
    for label, nodes in runs:
        if label.mode != "inference":
            continue
        found = [(p, n.forward_ms) for n in nodes if n.target == "matmul" and n.forward_ms > 0
                 and (p := product(n.input_shapes))]
        preds = pred.predict([_kernel(i, d) for i, ((_, d), _) in enumerate(found)],
                             label.device)
        for ((kind, _), ms), p in zip(found, preds, strict=True):
            out[(label.gpu, kind)].append((p.latency_ms, ms))
    return out


def sweep_like_qk(data: Path, pred: OnnxPredictor) -> dict[str, list]:
    """Device name -> [(forecast, measured)] of the sweep's bmm rows shaped like Q K^T."""
    from tilecast.learned.dataset import KernelSamples, load_kernels
    from tilecast.learned.evaluate import predict_by_device
    from tilecast.learned.prepare import default_lookup

    s = KernelSamples.concat([load_kernels([data], sp, vendor) for sp in ("train", "eval")
                              for vendor in ("nvidia", "amd")])
    s = s.select((s.op == "bmm") & (s.k <= SMALL_K) & (s.m >= 512) & (s.n >= 512))
    forecast = predict_by_device(pred, s)
    out: dict[str, list] = defaultdict(list)
    for i, dev in enumerate(s.device.tolist()):
        out[default_lookup(dev).name].append((float(forecast[i]), float(s.latency_ms[i])))
    return out


def main() -> int:
    data = parse_data_args(__doc__)
    if data is None:
        return 2
    pred, runs = OnnxPredictor(), labelled_runs(data)
    labels, sweep = label_products(runs, pred), sweep_like_qk(data, pred)
    names = {label.gpu: label.device.name for label, _ in runs}
    print("forecast / measured, geometric mean (n, ratio)")
    print(f"{'gpu':26s} {'Q K^T (labels)':>14s} {'P V (labels)':>14s} {'sweep nn like QK':>18s}")
    for gpu in sorted({g for g, _ in labels}):
        print(f"{gpu:26s}  {_gmean(labels[(gpu, 'qk')])}  {_gmean(labels[(gpu, 'pv')])}"
              f"      {_gmean(sweep.get(names[gpu], []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
