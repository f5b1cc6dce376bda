"""The "learn latency directly" baseline (scikit-learn; evaluation only).

A gradient-boosted regressor per family maps raw shape numbers and device numbers to log
latency, with no roofline and no tiles: what NeuSight argues does not transfer to unseen GPUs.
It sees the same training rows (training GPUs, train split) as the learned predictor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .dataset import KernelSamples, load_kernels
from .prepare import TRAIN_DEVICES, DeviceLookup, default_lookup


def training_rows(data_dirs: Sequence[Path | str]) -> KernelSamples:
    s = load_kernels(data_dirs, "train")
    return s.select(np.isin(s.device, TRAIN_DEVICES))


class DirectRegressor:
    def __init__(self, lookup: DeviceLookup = default_lookup, seed: int = 0) -> None:
        self.lookup = lookup
        self.seed = seed
        self.models: dict[str, object] = {}

    def _x(self, s: KernelSamples) -> np.ndarray:
        devs = {n: self.lookup(n) for n in set(s.device.tolist())}
        dev = np.array([[devs[n].peak_tflops_fp32, devs[n].mem_bandwidth_gbps, devs[n].sm_count,
                         devs[n].l2_cache_mb, devs[n].boost_clock_mhz] for n in s.device])
        shape = np.column_stack([s.b, s.m, s.n, s.k, s.rows, s.cols, s.elements, s.flops,
                                 s.bytes, s.op == "linear"]).astype(np.float64)
        return np.log2(1.0 + np.column_stack([shape, dev]))

    def fit(self, s: KernelSamples) -> DirectRegressor:
        from sklearn.ensemble import HistGradientBoostingRegressor

        for fam in sorted(set(s.family.tolist())):
            m = s.family == fam
            model = HistGradientBoostingRegressor(max_iter=300, random_state=self.seed)
            self.models[fam] = model.fit(self._x(s.select(m)), np.log(s.latency_ms[m]))
        return self

    def predict(self, s: KernelSamples) -> np.ndarray:
        out = np.zeros(len(s))
        for fam, model in self.models.items():
            m = s.family == fam
            if m.any():
                out[m] = np.exp(model.predict(self._x(s.select(m))))  # type: ignore[attr-defined]
        return out
