"""Kernel-level accuracy on the held-out shapes (``kernels/<vendor>/eval``), per GPU and family.

Three predictors side by side, all on the same rows:

- ``tilecast``: the learned predictor through its serving path (analyzer ``Kernel`` objects ->
  ``OnnxPredictor.predict``), so routing, tiles and features are what users get;
- ``roofline``: ``analyzer.predictor.RooflinePredictor``;
- ``direct``: the "learn latency directly" baseline the NeuSight paper argues against: a
  scikit-learn gradient-boosted regressor of log latency on raw shape and device numbers,
  trained on the same training rows as tilecast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..analyzer.predictor import Predictor, RooflinePredictor
from ..analyzer.types import Kernel, MatmulDims, OpCost, RowDims
from ..errors import ConfigError
from .dataset import KernelSamples, load_kernels
from .prepare import DeviceLookup, default_lookup

# Report family of a sample: bmm.csv -> "matmul", linear.csv -> "linear".
REPORT_FAMILY = {"bmm": "matmul", "mmtn": "matmul", "linear": "linear", "softmax": "softmax",
                 "ln": "layernorm", "rms": "layernorm"}
FAMILY_ORDER = ("matmul", "linear", "elementwise", "softmax", "layernorm")
PREDICTORS = ("tilecast", "roofline", "direct")
# Leave-one-GPU-out column: tilecast on the left-out GPU's held-out shapes only (cv.py).
SHAPES = "shapes"
# mmtn: the op_type of the analyzer's weight-gradient kernel (analyzer/training.py).
_OP_TYPE = {"bmm": "MatMul", "linear": "Gemm", "mmtn": "MatMulGrad", "softmax": "Softmax",
            "ln": "LayerNormalization", "rms": "RMSNormalization", "silu": "Silu"}
_COST_FAMILY = {"matmul": "matmul", "elementwise": "elementwise", "softmax": "softmax",
                "layernorm": "normalization"}


@dataclass(frozen=True)
class EvalRow:
    gpu: str
    family: str
    predictor: str
    n: int
    mape_pct: float

    def to_json(self) -> dict:
        return asdict(self)


def report_family(op: np.ndarray) -> np.ndarray:
    return np.array([REPORT_FAMILY.get(o, "elementwise") for o in op], dtype=object)


def to_kernels(s: KernelSamples) -> list[Kernel]:
    """Analyzer kernels for measured samples (the costs the analyzer would compute)."""
    out = []
    for i in range(len(s)):
        op, fam = s.op[i], s.family[i]
        batched = op == "bmm" or (op == "mmtn" and s.b[i] > 1)
        mm = MatmulDims(int(s.b[i]), int(s.m[i]), int(s.n[i]), int(s.k[i]), batched) \
            if fam == "matmul" else None
        rows = RowDims(int(s.rows[i]), int(s.cols[i])) if fam in ("softmax", "layernorm") \
            else None
        cost = OpCost(family=_COST_FAMILY[fam], flops=int(s.flops[i]), bytes=int(s.bytes[i]),
                      dtype=str(s.dtype[i]), unit="matrix" if mm else "vector", matmul=mm,
                      rows=rows, elements=int(s.elements[i]))
        out.append(Kernel(name=f"{op}_{i}", nodes=(f"{op}_{i}",),
                          op_type=_OP_TYPE.get(op, op.capitalize()), cost=cost))
    return out


def predict_by_device(predictor: Predictor, s: KernelSamples,
                      lookup: DeviceLookup = default_lookup) -> np.ndarray:
    """Latency of every sample, one batched ``predict`` call per GPU."""
    out = np.zeros(len(s))
    kernels = to_kernels(s)
    for name in sorted(set(s.device.tolist())):
        idx = np.nonzero(s.device == name)[0]
        preds = predictor.predict([kernels[i] for i in idx], lookup(name))
        out[idx] = [p.latency_ms for p in preds]
    return out


def mape_rows(s: KernelSamples, predictions: dict[str, np.ndarray]) -> list[EvalRow]:
    fam = report_family(s.op)
    rows = []
    for gpu in sorted(set(s.device.tolist())):
        for family in FAMILY_ORDER:
            mask = (s.device == gpu) & (fam == family)
            if not mask.any():
                continue
            for name, pred in predictions.items():
                err = np.abs(pred[mask] / s.latency_ms[mask] - 1.0) * 100.0
                rows.append(EvalRow(gpu, family, name, int(mask.sum()), float(np.mean(err))))
    return rows


def load_eval(data_dirs: Sequence[Path | str]) -> KernelSamples:
    """Held-out shapes of every vendor the folders hold (NVIDIA's eval split, AMD's held-out
    part of its unsplit files)."""
    from .prepare import TRAIN_VENDORS

    parts = []
    for vendor in TRAIN_VENDORS:
        try:
            parts.append(load_kernels(data_dirs, "eval", vendor))
        except ConfigError:
            if vendor == "nvidia":
                raise
    return KernelSamples.concat(parts)


def evaluate_kernels(data_dirs: Sequence[Path | str], predictor_path: Path | str | None = None,
                     lookup: DeviceLookup = default_lookup,
                     predictors: Sequence[str] = PREDICTORS) -> list[EvalRow]:
    """MAPE per GPU x family x predictor on the eval split of ``data_dirs``."""
    from .predictor import OnnxPredictor

    evals = load_eval(data_dirs)
    preds: dict[str, np.ndarray] = {}
    if "tilecast" in predictors:
        preds["tilecast"] = predict_by_device(OnnxPredictor(predictor_path), evals, lookup)
    if "roofline" in predictors:
        preds["roofline"] = predict_by_device(RooflinePredictor(), evals, lookup)
    if "direct" in predictors:
        from .baseline import DirectRegressor, training_rows

        preds["direct"] = DirectRegressor(lookup).fit(training_rows(data_dirs)).predict(evals)
    return mape_rows(evals, preds)


def format_table(rows: Sequence[EvalRow]) -> str:
    """One line per GPU x family, predictors as columns (MAPE %, n)."""
    cells: dict[tuple[str, str], dict[str, EvalRow]] = {}
    for r in rows:
        cells.setdefault((r.gpu, r.family), {})[r.predictor] = r
    names = [p for p in (*PREDICTORS, SHAPES) if any(p in c for c in cells.values())]
    wide = max([12, *(len(family) for _, family in cells)])  # "conv, recorded" is 14
    head = f"{'GPU':26s} {'family':{wide}s} {'n':>6s} " + " ".join(f"{p:>9s}" for p in names)
    lines = [head, "-" * len(head)]
    for (gpu, family), c in cells.items():
        n = next(iter(c.values())).n
        vals = " ".join(f"{c[p].mape_pct:8.1f}%" if p in c else f"{'-':>9s}" for p in names)
        lines.append(f"{gpu:26s} {family:{wide}s} {n:6d} {vals}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TileAccuracy:
    gpu: str
    op: str  # bmm | linear
    n: int
    tile_pct: float  # predicted output tile == the measured one
    config_pct: float  # tile and split-K both

    def to_json(self) -> dict:
        return asdict(self)


def tile_accuracy(data_dirs: Sequence[Path | str], predictor_path: Path | str | None = None,
                  lookup: DeviceLookup = default_lookup) -> list[TileAccuracy]:
    """How often the tile the predictor forecasts with (``Prediction.tile``: the trees' pick,
    or a faster candidate, ``TileTable.candidates``) is what ran, per GPU and op, on the
    held-out shapes whose kernel name carries a tile."""
    from . import tiles as tl
    from .predictor import OnnxPredictor
    from .prepare import measured_tiles

    predictor = OnnxPredictor(predictor_path)
    s = load_eval(data_dirs)
    s = s.select((s.family == "matmul") & np.array([tl.parse_tile(k) is not None
                                                    for k in s.kernel_name], dtype=bool))
    kernels = to_kernels(s)
    labels = np.empty(len(s), dtype=object)
    for name in sorted(set(s.device.tolist())):
        idx = np.nonzero(s.device == name)[0]
        labels[idx] = [p.tile for p in predictor.predict([kernels[i] for i in idx],
                                                         lookup(name))]
    tile, split = tl.parse_labels(labels)
    same_tile = tile == measured_tiles(s)
    same = same_tile & (split == s.split_k)
    out = []
    for gpu in sorted(set(s.device.tolist())):
        for op in ("bmm", "linear"):
            m = (s.device == gpu) & (s.op == op)
            if m.any():
                out.append(TileAccuracy(gpu, op, int(m.sum()), float(same_tile[m].mean() * 100),
                                        float(same[m].mean() * 100)))
    return out
