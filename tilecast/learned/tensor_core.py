"""Matrix-unit GEMMs with no training data: their compute at the GPU's sourced sustained rate.

Every NVIDIA training kernel is an fp32 SIMT GEMM (AMD's fp32 matrix-core kernels are trained
too). For a matmul on tensor / matrix cores in a dtype the data does not hold (fp16, bf16, TF32,
int8, fp8), the learned compute utilization, per-wave setup and per-wave operand traffic are
those of SIMT tiles applied to a tensor-core peak: the wave-traffic term alone held an 8192^3
fp16 GEMM to 41 % of the H100's peak and 52-65 % of the A100's, where vendor BLAS sustains 81 %
and 77 % (``Device.matrix_sustained_fraction``, sourced per GPU, docs/devices.md). So those
kernels take the physics instead, the learned parts that do not depend on the math unit kept:

    busy_ms = smax4(compute_ms / sustained_fraction, dram_ms / u_memory)
    gpu_ms  = fixed_ms + busy_ms

``compute_ms`` is the FLOPs in whole waves of cuBLAS's tensor-core tiles at the matrix peak (tile
quantization stays), ``dram_ms`` the bytes that miss the L2; ``u_memory`` and ``fixed_ms`` are the
model's (learned from fp32 streaming and launches). Every term grows with the work and the
fraction is a constant of the GPU, so the forecast stays monotone, and ``u <= 1`` keeps it above
the roofline. GPUs without a sourced fraction keep the learned form; the kernels stay
``extrapolated`` either way (no measured 16-bit kernel; issue 13 replaces this with data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .features import Features
from .form import P_BUSY, Q_HOST


@dataclass(frozen=True)
class Sustained:
    """The physics forecast of the rows a mask selects (arrays over those rows)."""

    gpu_ms: np.ndarray
    latency_ms: np.ndarray
    compute_ms: np.ndarray  # the compute term: compute_ms / sustained_fraction
    memory_ms: np.ndarray  # the memory term: dram_ms / u_memory


def smooth_max(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """(a^p + b^p)^(1/p), the form's smooth maximum, computed without overflow."""
    top = np.maximum(np.maximum(a, b), 1e-30)
    return top * ((a / top) ** p + (b / top) ** p) ** (1.0 / p)


def sustained(f: Features, mask: np.ndarray, fraction: float, u_memory: np.ndarray,
              fixed_ms: np.ndarray, host_ms: np.ndarray) -> Sustained:
    """Latency of the matrix-unit rows ``mask`` of the matmul family at ``fraction`` of the
    matrix peak, with the model's memory utilization, fixed cost and host dispatch."""
    compute = f.compute_ms[mask] / fraction
    memory = f.dram_ms[mask] / u_memory[mask]
    gpu = fixed_ms[mask] + smooth_max(compute, memory, P_BUSY)
    return Sustained(gpu, smooth_max(host_ms[mask], gpu, Q_HOST), compute, memory)
