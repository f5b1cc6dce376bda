"""fp32 SIMT GEMMs and convolutions no faster than the GPU's sourced sustained SGEMM rate.

The learned compute utilization of an fp32 SIMT GEMM comes from the five NVIDIA training GPUs
(Pascal to GA100). On a GPU outside them it is extrapolated, and on Hopper it overshoots: the
learned form ran an 8192^3 SGEMM on the H100 SXM at 0.87 of its fp32 peak, where a public cuBLAS
sweep measures 0.77 (``Device.fp32_sustained_fraction``, sourced per GPU, docs/devices.md). A
large square GEMM is SIMT's best case, so where that fraction is sourced, no fp32 SIMT GEMM
runs its FLOPs faster than that fraction of the peak:

    gpu_ms >= fixed_ms + roof_compute_ms / fraction   (roof_compute_ms: FLOPs at the fp32 peak)

The bound is on the kernel's busy time, with its per-launch part (``fixed_ms``) on top, as the
tensor-core rule has it (``tensor_core.sustained``): the sweep times 30 back-to-back
``torch.mm`` calls as one, so each call's launch hides behind the previous kernel and the
rate it reports is the kernel's busy rate. The measured fraction already holds the sweep's
tile quantization, so the bound is on the plain FLOPs, not on the whole waves of the
forecast's tile.

It is a ceiling on speed, not a target: on the training GPUs and the L4 the learned form sits at
or within 1 % above it, so it binds in earnest only where the form extrapolates past the
measured hardware (docs/predictor.md, "The SIMT ceiling", has the evidence either way).
Both sides grow with the work, so their maximum does too (monotone), and ``fraction <= 1``
keeps the forecast above the roofline.
"""

from __future__ import annotations

import numpy as np

from .features import FEATURES, Features
from .form import Q_HOST
from .tensor_core import smooth_max

# The families it holds: matmul and the dense convolutions, whose cuDNN kernels (implicit
# GEMM, Winograd's batched SGEMM and fused tiles) are SGEMM-class SIMT kernels (their FLOPs:
# the algorithm's, ``conv.algorithm_work``). Every conv the conv family costs is fp32 SIMT;
# tensor-core convs go to the matmul model's implicit-GEMM view (``routing.py``).
FAMILIES = ("matmul", "conv")


def simt_fp32_rows(f: Features) -> np.ndarray:
    """Rows of ``f`` (matmul or conv) that run fp32 on SIMT units (not tensor cores)."""
    names = FEATURES[f.family]
    fp32 = f.x[:, names.index("log2_itemsize_bytes")] == 2
    if "tensor_core" not in names:
        return fp32
    return fp32 & (f.x[:, names.index("tensor_core")] == 0)


def hold_to_sustained(f: Features, outs: dict[str, np.ndarray], names: dict[str, str],
                      fraction: float, host_ms: np.ndarray) -> np.ndarray:
    """Raise the forecasts of the fp32 SIMT rows of ``f`` that beat ``fraction`` of the fp32
    peak to that rate, in place in ``outs`` (the graph's outputs, keyed by ``names``); returns
    the rows it held."""
    gpu = outs[names["gpu_ms"]].astype(np.float64)
    floor = outs[names["fixed_ms"]].astype(np.float64) + f.roof_compute_ms / fraction
    held = simt_fp32_rows(f) & (floor > gpu)
    if held.any():
        gpu = np.where(held, floor, gpu)
        latency = np.where(held, smooth_max(host_ms, gpu, Q_HOST), outs[names["latency_ms"]])
        u_c = np.where(held, np.minimum(outs[names["u_compute"]], fraction),
                       outs[names["u_compute"]])
        for key, values in (("gpu_ms", gpu), ("latency_ms", latency), ("u_compute", u_c)):
            outs[names[key]] = values.astype(outs[names[key]].dtype)
    return held
