"""A tensor-core GEMM's reduction loop: one L2 round trip per 128-byte k-step is the least a
CTA's loop takes (learned/tensor_core.py, ``k_chain_ms``)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import onnx.helper
import pytest

import tilecast
from tilecast.analyzer.runtime import GRAPH_KERNEL_LAUNCH_US, apply_runtime
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import list_devices, load_device, lowest_l2_latency_ns
from tilecast.learned.predictor import default_predictor
from tilecast.learned.tensor_core import CUBLAS_UNSPLIT_STEPS, k_chain_ms, l2_latency_ns


def _gemm(m: int, n: int, k: int, dtype: str = "bfloat16") -> Kernel:
    size = 4 if dtype == "tf32" else 2  # tf32: an fp32 GEMM under --math tf32 (mathmode.py)
    cost = OpCost("matmul", 2 * m * n * k, size * (m * k + k * n + m * n), dtype, "matrix",
                  matmul=MatmulDims(1, m, n, k), elements=m * n)
    return Kernel("mm", ("mm",), "MatMul", cost)


def _busy_ms(kernel: Kernel, device) -> float:
    p = default_predictor().predict([kernel], device)[0]
    return p.gpu_ms - p.fixed_ms


def _conv(c: int, k: int = 512, hw: int = 7) -> Kernel:
    """A batch-1 bf16 1 x 1 conv, forecast as the analyzer costs it: a pointwise conv runs on
    NCHW as it stands (no layout transposes), so its busy time is its loop's."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.BFLOAT16, [1, c, hw, hw])
    w = onnx.helper.make_tensor_value_info("w", onnx.TensorProto.BFLOAT16, [k, c, 1, 1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.BFLOAT16, [1, k, hw, hw])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Conv", ["x", "w"], ["y"])], "c",
                                   [x, w], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    (kernel,) = [k.kernel for k in tilecast.analyze(model, "h100", predictor="roofline").kernels]
    return kernel


# (device, dtype, n, k, steps): 16 rows by 64 or 512 columns, so the operands stream in 1-2 us
# and the loop decides. Steps = ceil(k / (128 B / itemsize)): 64 deep in 16 bits, 32 in TF32;
# a GEMM (cuBLAS) counts at most CUBLAS_UNSPLIT_STEPS = 40 of them (it splits longer loops).
@pytest.mark.parametrize(("device", "dtype", "n", "k", "steps"), [
    ("h100-sxm5-80gb", "bfloat16", 512, 2304, 36),   # ResNet-50's 14 x 14 3 x 3 reduction
    ("h100-sxm5-80gb", "float16", 512, 2305, 37),    # one element more: one step more
    ("a100-sxm4-40gb", "float16", 512, 1152, 18),
    ("v100-sxm2-32gb", "float16", 64, 2048, 32),
    ("a100-sxm4-40gb", "tf32", 64, 1024, 32),         # 32-deep steps
    ("h100-sxm5-80gb", "bfloat16", 64, 16384, 40),   # 256 steps: cuBLAS splits, 40 counted
])
def test_a_lone_tile_takes_one_l2_round_trip_per_k_step(device, dtype, n, k, steps) -> None:
    dev = load_device(device)
    assert _busy_ms(_gemm(16, n, k, dtype), dev) == pytest.approx(
        steps * dev.l2_latency_ns * 1e-6, rel=1e-9)


def test_a_conv_keeps_its_whole_loop() -> None:
    # cuDNN ran ResNet-50's 72-step batch-1 convs unsplit (the H100 replay: 11.3-11.5 us)
    h100 = load_device("h100-sxm5-80gb")
    assert _busy_ms(_conv(4608), h100) == pytest.approx(72 * h100.l2_latency_ns * 1e-6,
                                                        rel=1e-9)
    assert _busy_ms(_conv(4608), h100) > _busy_ms(_gemm(49, 512, 4608), h100)


def test_an_unmeasured_chip_takes_the_vendors_shortest_l2_latency() -> None:
    t4 = load_device("t4")
    assert t4.l2_latency_ns is None
    shortest = min(d.l2_latency_ns for d in list_devices()
                   if d.vendor == "nvidia" and d.l2_latency_ns is not None)
    assert l2_latency_ns(t4) == lowest_l2_latency_ns("nvidia") == shortest
    assert _busy_ms(_gemm(16, 64, 2048, "float16"), t4) == pytest.approx(
        32 * shortest * 1e-6, rel=1e-9)


def test_no_chain_off_nvidia() -> None:
    mi210 = load_device("mi210")
    kern = _gemm(16, 64, 2048, "float16")
    assert (default_predictor().predict([kern], mi210)
            == default_predictor().predict([kern], replace(mi210, l2_latency_ns=None)))


def test_a_fused_attention_row_has_no_chain_and_a_convs_no_cap() -> None:
    # k_chain_ms reads the parts' k, itemsize and fused columns: two 16-bit rows of k = 4,608
    # (72 steps), the second a fused attention's equivalent GEMM (its loop runs over keys)
    h100 = load_device("h100-sxm5-80gb")
    parts = SimpleNamespace(k=np.array([4608.0, 4608.0]), itemsize=np.array([2.0, 2.0]),
                            fused=np.array([False, True]))
    every = np.ones(2, dtype=bool)
    conv = k_chain_ms(parts, every, h100, conv=np.array([True, True]))
    gemm = k_chain_ms(parts, every, h100, conv=np.array([False, False]))
    step_ms = h100.l2_latency_ns * 1e-6
    assert conv.tolist() == pytest.approx([72 * step_ms, 0.0])
    assert gemm.tolist() == pytest.approx([CUBLAS_UNSPLIT_STEPS * step_ms, 0.0])


def test_a_cuda_graph_forecast_grows_with_the_reduction() -> None:
    # 1 x 1 convs of 7 x 7 maps with 1,152 to 9,216 input channels: 18 to 144 steps
    h100 = load_device("h100-sxm5-80gb")
    kernels = [_conv(c) for c in (1152, 2304, 4608, 9216)]
    preds = apply_runtime(default_predictor().predict(kernels, h100), h100, "cudagraph")
    us = [p.latency_ms * 1e3 for p in preds]
    assert us == sorted(us) and us[0] < us[-1]
    assert us[2] == pytest.approx(72 * h100.l2_latency_ns * 1e-3 + GRAPH_KERNEL_LAUNCH_US,
                                  rel=1e-6)


@pytest.mark.parametrize("device", [d for d in list_devices() if d.l2_latency_ns is not None],
                         ids=lambda d: d.name)
def test_an_l2_hit_is_quicker_than_a_dram_load(device) -> None:
    assert device.dram_latency_ns is not None
    assert 0 < device.l2_latency_ns < device.dram_latency_ns
    assert math.isfinite(device.l2_latency_ns)
