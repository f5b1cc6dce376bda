"""The predictor interface and the roofline baseline.

A predictor maps costed kernels on a device to latencies, all kernels of a graph in one call
(so learned predictors can batch them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from typing import Protocol, runtime_checkable

from ..device_db.device import Device
from ..errors import PredictorError
from .types import Kernel

# "latency": held to the DRAM-latency walk of a kernel whose threads keep one load in flight
# each (learned/latency_walk.py), slower than its bytes at the copy rate.
BOUNDS = ("compute", "memory", "latency", "overhead")


@dataclass(frozen=True)
class Prediction:
    latency_ms: float
    bound: str  # one of BOUNDS
    tile: str | None = None  # e.g. "128x64" for matmuls, "4x128" for row kernels
    extrapolated: bool = False  # outside what the predictor was validated on
    gpu_ms: float | None = None  # GPU time alone, without eager host dispatch (None: same)
    host_ms: float | None = None  # eager host dispatch time of its op(s) (None: not modelled)
    clamped: bool = False  # held at the envelope (the utilization floor) by the predictor
    fixed_ms: float | None = None  # part of gpu_ms that is per-launch, not work (None: unknown)
    # Part of gpu_ms spent in cuDNN's NCHW <-> NHWC transposes around a tensor-core conv, which
    # PyTorch runs (eager or replayed) and a compiled runtime avoids by choosing NHWC.
    layout_ms: float = 0.0
    # measured / forecast range of the kernel's family on GPUs its model never saw (the learned
    # predictor's leave-one-GPU-out bands); None where no validated band applies.
    band: tuple[float, float] | None = None


@runtime_checkable
class Predictor(Protocol):
    name: str

    def predict(self, kernels: Sequence[Kernel], device: Device) -> list[Prediction]:
        """One prediction per kernel, in order."""
        ...


def predict_checked(pred: Predictor, kernels: Sequence[Kernel], device: Device,
                    ) -> list[Prediction]:
    """``pred``'s predictions, each latency checked to be a finite, non-negative number: one
    that is not (a user's predictor file, or a degenerate kernel) would turn the eager
    runtime's running clock, and every kernel after it, into NaN."""
    preds = pred.predict(kernels, device)
    for k, p in zip(kernels, preds, strict=True):
        if not (isfinite(p.latency_ms) and p.latency_ms >= 0):
            raise PredictorError(
                f"predictor {pred.name!r} returned latency {p.latency_ms} ms for kernel "
                f"'{k.name}' ({k.op_type}, {k.dtype}, {k.flops} FLOPs, {k.bytes} bytes)")
    return preds


def roofline_times_ms(kernel: Kernel, device: Device) -> tuple[float, float]:
    """(compute time, memory time) in ms at the device's peaks for the kernel's dtype and unit."""
    peak = device.peak_tflops(kernel.dtype, kernel.cost.unit) * 1e12
    compute_ms = kernel.flops / peak * 1e3
    memory_ms = kernel.bytes / device.mem_bandwidth_bytes_per_s * 1e3
    return compute_ms, memory_ms


def classify_bound(compute_ms: float, memory_ms: float, overhead_ms: float) -> str:
    if overhead_ms >= max(compute_ms, memory_ms):
        return "overhead"
    return "compute" if compute_ms >= memory_ms else "memory"


class RooflinePredictor:
    """latency = max(FLOPs / peak, bytes / bandwidth) + the device's launch overhead."""

    name = "roofline"

    def predict(self, kernels: Sequence[Kernel], device: Device) -> list[Prediction]:
        overhead_ms = device.launch_overhead_us * 1e-3
        out = []
        for k in kernels:
            compute_ms, memory_ms = roofline_times_ms(k, device)
            out.append(Prediction(
                latency_ms=max(compute_ms, memory_ms) + overhead_ms,
                bound=classify_bound(compute_ms, memory_ms, overhead_ms),
                extrapolated=k.cost.estimated,
            ))
        return out
