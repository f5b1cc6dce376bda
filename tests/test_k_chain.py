"""A tensor-core GEMM's reduction loop: one L2 round trip per 128-byte k-step is the least a
CTA's loop takes (learned/tensor_core.py, ``k_chain_ms``)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tilecast.analyzer.runtime import GRAPH_KERNEL_LAUNCH_US, apply_runtime
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import list_devices, load_device, lowest_l2_latency_ns
from tilecast.learned.predictor import default_predictor
from tilecast.learned.tensor_core import l2_latency_ns


def _gemm(m: int, n: int, k: int, dtype: str = "bfloat16") -> Kernel:
    size = 4 if dtype == "tf32" else 2  # tf32: an fp32 GEMM under --math tf32 (mathmode.py)
    cost = OpCost("matmul", 2 * m * n * k, size * (m * k + k * n + m * n), dtype, "matrix",
                  matmul=MatmulDims(1, m, n, k), elements=m * n)
    return Kernel("mm", ("mm",), "MatMul", cost)


def _busy_ms(kernel: Kernel, device) -> float:
    p = default_predictor().predict([kernel], device)[0]
    return p.gpu_ms - p.fixed_ms


# (device, dtype, k, steps): 16 rows by 64 or 512 columns, so the operands stream in 1-2 us
# and the loop decides. Steps = ceil(k / (128 B / itemsize)): 64 deep in 16 bits, 32 in TF32.
@pytest.mark.parametrize(("device", "dtype", "n", "k", "steps"), [
    ("h100-sxm5-80gb", "bfloat16", 512, 4608, 72),   # ResNet-50's last 3 x 3 convs at batch 1
    ("h100-sxm5-80gb", "float16", 512, 4609, 73),    # one element more: one step more
    ("a100-sxm4-40gb", "float16", 512, 4608, 72),
    ("v100-sxm2-32gb", "float16", 64, 4608, 72),
    ("a100-sxm4-40gb", "tf32", 64, 4608, 144),        # 32-deep steps
])
def test_a_lone_tile_takes_one_l2_round_trip_per_k_step(device, dtype, n, k, steps) -> None:
    dev = load_device(device)
    assert _busy_ms(_gemm(16, n, k, dtype), dev) == pytest.approx(
        steps * dev.l2_latency_ns * 1e-6, rel=1e-9)


def test_an_unmeasured_chip_takes_the_vendors_shortest_l2_latency() -> None:
    t4 = load_device("t4")
    assert t4.l2_latency_ns is None
    shortest = min(d.l2_latency_ns for d in list_devices()
                   if d.vendor == "nvidia" and d.l2_latency_ns is not None)
    assert l2_latency_ns(t4) == lowest_l2_latency_ns("nvidia") == shortest
    assert _busy_ms(_gemm(16, 64, 4608, "float16"), t4) == pytest.approx(
        72 * shortest * 1e-6, rel=1e-9)


def test_no_chain_off_nvidia_or_for_fused_attention() -> None:
    mi210 = load_device("mi210")
    kern = _gemm(16, 64, 4608, "float16")
    assert (default_predictor().predict([kern], mi210)
            == default_predictor().predict([kern], replace(mi210, l2_latency_ns=None)))


def test_a_cuda_graph_forecast_grows_with_the_reduction() -> None:
    # ResNet-50's 3 x 3 convs at batch 1 as GEMMs (m = P Q, n = K, k = 9 C): the H100
    # replay ran them in 6.2-6.7, 7.6-7.8 and 11.3-11.5 us (datasets/h100-sxm5-80gb/traces).
    h100 = load_device("h100-sxm5-80gb")
    kernels = [_gemm(784, 128, 1152), _gemm(196, 256, 2304), _gemm(49, 512, 4608)]
    preds = apply_runtime(default_predictor().predict(kernels, h100), h100, "cudagraph")
    us = [p.latency_ms * 1e3 for p in preds]
    assert us == sorted(us)
    assert us[2] == pytest.approx(72 * h100.l2_latency_ns * 1e-3 + GRAPH_KERNEL_LAUNCH_US,
                                  rel=1e-6)


@pytest.mark.parametrize("device", [d for d in list_devices() if d.l2_latency_ns is not None],
                         ids=lambda d: d.name)
def test_an_l2_hit_is_quicker_than_a_dram_load(device) -> None:
    assert device.dram_latency_ns is not None
    assert 0 < device.l2_latency_ns < device.dram_latency_ns
    assert math.isfinite(device.l2_latency_ns)
