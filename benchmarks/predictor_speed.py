"""Learned-predictor throughput: kernels predicted per second (target >= 200k/s).

Prints two figures for a synthetic batch that mixes the families the way transformer graphs
do (matmul, elementwise, softmax, layer norm, attention, a fallback op):

- session: the batched ``InferenceSession.run`` alone, on prebuilt feature arrays;
- end to end: ``OnnxPredictor.predict`` from analyzer ``Kernel`` objects to ``Prediction``s
  (routing, features, tile choice, the ONNX call, result objects).

    python benchmarks/predictor_speed.py [--kernels 200000] [--device l4] [--predictor X.onnx]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tilecast.analyzer.types import Kernel, MatmulDims, OpCost, RowDims
from tilecast.device_db.loader import load_device
from tilecast.learned.predictor import OnnxPredictor, default_predictor
from tilecast.learned.routing import route


def synthetic_kernels(n: int, seed: int = 0) -> list[Kernel]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 6
        a, b, c = (int(2 ** rng.uniform(6, 12)) for _ in range(3))
        if kind in (0, 5):
            cost = OpCost("matmul" if kind == 0 else "attention", 2 * 8 * a * b * c,
                          4 * 8 * (a * c + c * b + a * b), "float32", "matrix",
                          matmul=MatmulDims(8, a, b, c), elements=8 * a * b)
        elif kind == 1:
            cost = OpCost("elementwise", a * b, 12 * a * b, "float32", elements=a * b)
        elif kind == 2:
            cost = OpCost("softmax", 5 * a * b, 8 * a * b, "float32", rows=RowDims(a, b),
                          elements=a * b)
        elif kind == 3:
            cost = OpCost("normalization", 8 * a * b, 8 * a * b, "float32",
                          rows=RowDims(a, b), elements=a * b)
        else:
            cost = OpCost("reduction", a * b, 4 * a * b, "float32", elements=a)
        out.append(Kernel(f"k{i}", (f"k{i}",), "Op", cost))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=200_000)
    ap.add_argument("--device", default="NVIDIA L4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--predictor", help="a predictor .onnx (default: the shipped one)")
    args = ap.parse_args()
    predictor = OnnxPredictor(args.predictor) if args.predictor else default_predictor()
    device = load_device(args.device)
    print(f"predictor    : {predictor.path}")
    kernels = synthetic_kernels(args.kernels)
    predictor.predict(kernels[:100], device)  # warm-up (session, caches)

    parts = route(kernels, conv_model=predictor.conv_model).parts
    feats = {fam: predictor._features(fam, p, device) for fam, p in parts.items()}
    rows = sum(len(p.kernel) for p in parts.values())
    best = min(_timed(lambda: predictor._run(feats)) for _ in range(args.repeats))
    print(f"session only : {rows:,} rows in {best * 1e3:8.1f} ms = {rows / best:12,.0f} rows/s")
    best = min(_timed(lambda: predictor.predict(kernels, device)) for _ in range(args.repeats))
    n = len(kernels)
    print(f"end to end   : {n:,} kernels in {best * 1e3:8.1f} ms = {n / best:12,.0f} kernels/s")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
