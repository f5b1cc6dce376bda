"""benchmarks/data_consistency.py check 7: Linear speed by reduction length, from the data."""

from __future__ import annotations

import importlib.util
from dataclasses import fields
from pathlib import Path

import numpy as np

from tilecast.learned.dataset import KernelSamples


def _bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data_consistency.py"
    spec = importlib.util.spec_from_file_location("data_consistency", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _samples(rows: list[tuple]) -> KernelSamples:
    """(op, device, K, GFLOP, ms[, M = N]) per row (M = N = 2048 unless given); the other
    columns are zeros."""
    n = len(rows)
    cols = {f.name: np.zeros(n) for f in fields(KernelSamples)}
    cols.update(op=np.array([r[0] for r in rows]), device=np.array([r[1] for r in rows]),
                k=np.array([r[2] for r in rows]), flops=np.array([r[3] * 1e9 for r in rows]),
                latency_ms=np.array([r[4] for r in rows]),
                m=np.array([r[5] if len(r) > 5 else 2048 for r in rows]))
    cols["n"] = cols["m"]
    return KernelSamples(**cols)


def test_k_bands_are_medians_over_the_short_band_at_a_fixed_duration() -> None:
    # 200 GFLOP in 20 ms = 10 TFLOP/s at K = 1,024 and 1,500 (median 10); 100 GFLOP in 20
    # ms = 5 TFLOP/s at K = 40,000: 0.50 of the first band. Left out: two 5 ms Linears (under
    # the 10 ms floor; at 1 TFLOP/s they would make the first band's median 5.5), a bmm, and
    # a K = 50,000 Linear of 64 x 64 outputs (under 4M; at 0.5 TFLOP/s the band's median
    # would be 2.75).
    s = _samples([("linear", "GPU A", 1024, 200.0, 20.0), ("linear", "GPU A", 1500, 200.0, 20.0),
                  ("linear", "GPU A", 40000, 100.0, 20.0), ("linear", "GPU A", 1024, 5.0, 5.0),
                  ("linear", "GPU A", 1100, 5.0, 5.0),
                  ("bmm", "GPU A", 40000, 400.0, 20.0),
                  ("linear", "GPU A", 50000, 10.0, 20.0, 64)])
    lines = _bench().long_reductions(s)
    row = next(line for line in lines if line.startswith("GPU A"))
    assert row.split()[2] == "10.00"  # TFLOP/s of the K < 2,048 band
    assert row.endswith("0.50 (   1)")  # >= 32k: one row at half the rate
    assert row.count("-") == 3  # no rows in the three middle bands
