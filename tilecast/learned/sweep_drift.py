"""A kernel sweep's harness drift: time per timed call that grows as the sweep runs.

Why it exists (evidence in docs/predictor.md, "The conv sweep's harness drift"; reproduced by
check 6 of ``benchmarks/data_consistency.py``): each shared conv CSV holds random shapes in
the order they were measured, yet the excess of a row's latency over any estimate that does
not know the row's place rises steadily down the file, by the same amount for a 0.2 ms and a
5 ms convolution (P100: +0.6 ms from the first tenth to the last), and the smallest convs
measure 0.11 ms at the top of the file and 0.8 ms at the bottom. A GPU does not slow down by
a constant number of milliseconds whatever the kernel; a harness whose every timed call does
work that grows with the calls before it does. That drift is not the kernel's time, so it is
taken out of the latencies that train and score the model.

How it is estimated, per file: residuals of the latency over a baseline that never sees the
position (``shape_baseline_ms``: a least-squares fit of log latency, quadratic in the log
dims, per group), their median in ``BINS`` slices of the file, a non-decreasing fit through
those medians (the harness only accumulates), minus its value at the start of the file. Since
the shapes are random in the file, any position-blind baseline's errors are the same at every
position and cancel in the difference; the drift reads the position alone. Files whose drift
is within ``SIGNIFICANCE`` standard errors of none (``tilecast collect``'s own CSVs, timed
with CUDA events) are left as measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BINS = 20  # slices of the file: ~250 rows each in a 5,000-row sweep
SIGNIFICANCE = 4.0  # drift span / standard error of a difference of two slice medians
MIN_ROWS = 10 * BINS  # fewer rows than this: too few per slice to read a drift from
_MEDIAN_SE = 1.2533 * 1.4826  # standard error of a median = this * MAD / sqrt(n), normal noise


@dataclass(frozen=True)
class DriftFit:
    """One file's harness drift."""

    span_ms: float  # drift at the end of the file over its start
    noise_ms: float  # standard error of the difference of two slice medians
    applied: bool  # span_ms > SIGNIFICANCE * noise_ms: the latencies were corrected


def positions(count: int) -> np.ndarray:
    """Each data row's place in its file: 0 for the first, 1 for the last."""
    return np.arange(count, dtype=np.float64) / max(count - 1, 1)


def non_decreasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, c2), (v1, w1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(c, v) for v, _, c in blocks])


def shape_baseline_ms(log_dims: np.ndarray, groups: np.ndarray,
                      latency_ms: np.ndarray) -> np.ndarray:
    """A position-blind estimate of each row: log latency fitted by least squares, quadratic
    in the log dims (linear where a group has too few rows, its mean below that), per group."""
    out = np.empty(len(latency_ms))
    y = np.log(latency_ms)
    k = log_dims.shape[1]
    quad = [log_dims[:, i] * log_dims[:, j] for i in range(k) for j in range(i, k)]
    full = np.column_stack([np.ones(len(y)), log_dims, *quad])
    for g in set(groups.tolist()):
        m = groups == g
        cols = full.shape[1] if m.sum() >= 3 * full.shape[1] else (
            1 + k if m.sum() >= 3 * (1 + k) else 1)
        x = full[m][:, :cols]
        coef, *_ = np.linalg.lstsq(x, y[m], rcond=None)
        out[m] = np.exp(x @ coef)
    return out


def drift_ms(latency_ms: np.ndarray, baseline_ms: np.ndarray,
             position: np.ndarray) -> tuple[np.ndarray, DriftFit]:
    """Each row's harness drift (0 at the file's start) and the fit; zeros when the file is
    too short or the drift is not significant."""
    if len(latency_ms) < MIN_ROWS:
        return np.zeros(len(latency_ms)), DriftFit(0.0, float("nan"), False)
    resid = latency_ms - baseline_ms
    which = np.minimum((position * BINS).astype(np.int64), BINS - 1)
    counts = np.bincount(which, minlength=BINS).astype(np.float64)
    medians = np.array([np.median(resid[which == b]) if counts[b] else np.nan
                        for b in range(BINS)])
    filled = counts > 0
    curve = non_decreasing(medians[filled], counts[filled])
    curve = curve - curve[0]
    centers = (np.arange(BINS)[filled] + 0.5) / BINS
    mad = float(np.median(np.abs(resid - medians[which])))
    noise = float(np.sqrt(2.0) * _MEDIAN_SE * mad / np.sqrt(np.median(counts[filled])))
    span = float(curve[-1])
    if not span > SIGNIFICANCE * noise:
        return np.zeros(len(latency_ms)), DriftFit(span, noise, False)
    return np.interp(position, centers, curve), DriftFit(span, noise, True)
