"""A sweep's harness drift: estimated from the rows' places alone, taken out of conv latencies
only where it is significant, and present in every shared conv CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from tilecast.learned import sweep_drift as sd
from tilecast.learned.conv_data import read_conv_csv

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "neusight-asplos25"
needs_data = pytest.mark.skipif(not (DATA / "kernels/nvidia/train/conv").is_dir(),
                                reason="shared NeuSight conv data absent (../shared/datasets)")


@pytest.mark.parametrize(("values", "weights", "fit"), [
    ([1, 2, 3], [1, 1, 1], [1, 2, 3]),  # already non-decreasing
    ([3, 1], [1, 1], [2, 2]),  # one violation pools to the mean
    ([3, 1], [1, 3], [1.5, 1.5]),  # weighted: (3 * 1 + 1 * 3) / 4
    ([0, 4, 2, 2, 5], [1, 1, 1, 1, 1], [0, 8 / 3, 8 / 3, 8 / 3, 5]),  # pools back over two
])
def test_non_decreasing_fit(values, weights, fit) -> None:
    got = sd.non_decreasing(np.array(values, float), np.array(weights, float))
    assert got == pytest.approx(fit)


def _sweep(rng: np.random.Generator, n: int, drift_end_ms: float):
    """Random conv-like shapes in random order: kernel time a power law of the dims with
    lognormal noise, plus a harness drift growing linearly down the file."""
    dims = rng.uniform(1, 10, size=(n, 3))
    kernel = 0.02 * np.exp(0.4 * dims.sum(axis=1) - 4) * rng.lognormal(0, 0.15, n)
    pos = sd.positions(n)
    return dims, kernel, kernel + drift_end_ms * pos, pos


@pytest.mark.parametrize("drift_end_ms", [0.25, 0.7])
def test_drift_is_recovered_from_positions(drift_end_ms) -> None:
    dims, kernel, measured, pos = _sweep(np.random.default_rng(0), 4000, drift_end_ms)
    base = sd.shape_baseline_ms(dims, np.zeros(len(dims)), measured)
    drift, fit = sd.drift_ms(measured, base, pos)
    assert fit.applied and fit.span_ms == pytest.approx(drift_end_ms, abs=0.06)
    # what is left is the kernel: no trend with the position, within the slices' noise
    left = measured - drift - kernel
    assert abs(np.median(left[pos > 0.9]) - np.median(left[pos < 0.1])) < 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_drift_leaves_the_latencies(seed) -> None:
    dims, _, measured, pos = _sweep(np.random.default_rng(seed), 4000, 0.0)
    base = sd.shape_baseline_ms(dims, np.zeros(len(dims)), measured)
    drift, fit = sd.drift_ms(measured, base, pos)
    assert not fit.applied and not drift.any()


def test_short_files_are_left_as_measured() -> None:
    dims, _, measured, pos = _sweep(np.random.default_rng(0), sd.MIN_ROWS - 1, 1.0)
    drift, fit = sd.drift_ms(measured, measured, pos)
    assert not fit.applied and not drift.any()


def test_conv_reader_takes_the_drift_out(tmp_path) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "Tesla_T4.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["OPName", "Latency", "Device", "Kernels", "B", "Input_Channel",
                    "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"])
        for i in range(1000):
            b, c, k, hw = (int(rng.integers(1, 33)), int(rng.integers(8, 513)),
                           int(rng.integers(8, 513)), int(rng.integers(7, 57)))
            ms = 0.03 + 2 * b * c * k * hw * hw * 9 / 5e9 + 0.5 * i / 999  # drift to 0.5 ms
            w.writerow(["conv", ms, "Tesla T4", ";volta_scudnn_128x64_relu_small_nn_v1",
                        b, c, k, 3, hw, 1, 1])
    s, raw = read_conv_csv(path), read_conv_csv(path, drift=False)
    assert s.measured_ms == pytest.approx(raw.latency_ms) and not raw.drift_ms.any()
    assert s.drift_ms[-1] == pytest.approx(0.5, abs=0.05) and s.drift_ms[0] == 0.0
    assert (s.latency_ms > 0.02).all()


@needs_data
def test_every_shared_conv_sweep_drifts() -> None:
    """The evidence: the smallest convs of each file's last tenth measure several times those
    of its first tenth although the shapes are drawn alike; with the drift out, at most a
    quarter of that rise is left (0.02-0.08 ms, against 0.25-0.70 ms recorded)."""
    files = sorted((DATA / "kernels/nvidia/train/conv").glob("*.csv"))
    assert len(files) == 5
    for f in files:
        s = read_conv_csv(f)
        first, last = s.position < 0.1, s.position > 0.9
        raw_low = [np.percentile(s.measured_ms[m], 2) for m in (first, last)]
        low = [np.percentile(s.latency_ms[m], 2) for m in (first, last)]
        assert raw_low[1] > 2 * raw_low[0], f.name
        assert abs(low[1] - low[0]) < 0.25 * (raw_low[1] - raw_low[0]), f.name
        assert 0.15 < s.drift_ms.max() < 1.0, f.name
        assert np.median(s.n[first]) == pytest.approx(np.median(s.n[last]), rel=0.2)
