"""Conv rows of ``tilecast kernels-eval`` (serving path, no torch) and the LOGO table format.

The default table scores the predictor as users get it: every measured conv of the held-out
shapes (``conv_data.heldout_shapes``) becomes an analyzer ``Kernel`` with its ``ConvDims``
and goes through ``OnnxPredictor.predict`` (routing, the fastest candidate algorithm,
features), next to the roofline on the same kernels. ``--cv logo`` retrains per fold
(``conv_train.logo_conv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analyzer.predictor import Predictor, RooflinePredictor
from ..analyzer.types import ConvDims, Kernel, MatmulDims, OpCost
from . import conv as cv
from . import conv_data as cd
from .evaluate import EvalRow
from .prepare import DeviceLookup, default_lookup

if TYPE_CHECKING:
    from .conv_train import ConvFold


def to_kernels(s: cd.ConvSamples) -> list[Kernel]:
    """Analyzer kernels of measured convs (the costs ``analyzer/costs/conv.py`` computes)."""
    out = []
    cc = s.columns()
    flops, nbytes = cv.direct_flops(cc), sum(cv.tensor_bytes(cc))
    for i in range(len(s)):
        n, c, k, h, w, p, q, r, ss, st, pad = (int(getattr(s, f)[i]) for f in (
            "n", "c", "k", "h", "w", "p", "q", "r", "s", "stride", "pad"))
        mm = MatmulDims(1, n * p * q, k, c * r * ss)
        cost = OpCost("conv", int(flops[i]), int(nbytes[i]), str(s.dtype[i]), "matrix",
                      matmul=mm, elements=n * k * p * q,
                      conv=ConvDims(n, c, k, h, w, p, q, r, ss, stride=st, pad=pad))
        out.append(Kernel(f"conv_{i}", (f"conv_{i}",), "Conv", cost))
    return out


def _predict(predictor: Predictor, s: cd.ConvSamples, lookup: DeviceLookup) -> np.ndarray:
    out, kernels = np.zeros(len(s)), to_kernels(s)
    for name in sorted(set(s.device.tolist())):
        idx = np.nonzero(s.device == name)[0]
        preds = predictor.predict([kernels[i] for i in idx], lookup(name))
        out[idx] = [p.latency_ms for p in preds]
    return out


def conv_eval_rows(data_dirs: Sequence[Path | str], predictor_path: Path | str | None = None,
                   lookup: DeviceLookup = default_lookup) -> list[EvalRow]:
    """tilecast and roofline MAPE per GPU on the held-out conv shapes (none without data),
    against the kernels' latencies and against the recorded ones (``conv_data``)."""
    from .predictor import OnnxPredictor

    s = cd.load_conv(data_dirs)
    if s is None:
        return []
    s = s.select(cd.heldout_shapes(s))
    preds = {"tilecast": _predict(OnnxPredictor(predictor_path), s, lookup),
             "roofline": _predict(RooflinePredictor(), s, lookup)}
    rows = []
    for gpu in sorted(set(s.device.tolist())):
        m = s.device == gpu
        # "conv": against the kernels' latencies; "conv, recorded": the CSV's, harness drift in
        for family, truth in (("conv", s.latency_ms), ("conv, recorded", s.measured_ms)):
            for name, pred in preds.items():
                err = float(np.mean(np.abs(pred[m] / truth[m] - 1.0)) * 100.0)
                rows.append(EvalRow(gpu, family, name, int(m.sum()), err))
    return rows


def format_folds(folds: Sequence[ConvFold]) -> str:
    """The LOGO table: one line per held-out GPU (MAPE on its held-out shapes)."""
    head = (f"{'held-out GPU (conv, unseen shapes)':36s} {'n':>6s} {'tilecast':>9s} "
            f"{'roofline':>9s} {'algo acc':>9s} {'recorded':>9s}")
    lines = [head, "-" * len(head)]
    for f in folds:
        lines.append(f"{f.gpu:36s} {f.n:6d} {f.tilecast_mape_pct:8.1f}% "
                     f"{f.roofline_mape_pct:8.1f}% {100 * f.algorithm_accuracy:8.1f}% "
                     f"{f.measured_mape_pct:8.1f}%")
    return "\n".join(lines)
