"""Matrix-unit GEMMs with no training data run at the GPU's sourced sustained rate
(learned/tensor_core.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilecast.analyzer.runtime import GRAPH_KERNEL_LAUNCH_US, lone_kernel_ms
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import list_devices, load_device
from tilecast.learned import tensor_core
from tilecast.learned.predictor import default_predictor
from tilecast.learned.tensor_core import LAYOUT_KERNELS


def _gemm(m: int, dtype: str = "float16", n: int | None = None, k: int | None = None) -> Kernel:
    n, k = n or m, k or m
    size = 4 if dtype == "float32" else 2
    cost = OpCost("matmul", 2 * m * n * k, size * (m * k + k * n + m * n), dtype, "matrix",
                  matmul=MatmulDims(1, m, n, k), elements=m * n)
    return Kernel("mm", ("mm",), "MatMul", cost)


SOURCED = [d for d in list_devices() if d.matrix_sustained_fraction is not None]


@pytest.mark.parametrize("device", SOURCED, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_gemm_runs_at_the_sustained_fraction(device, dtype) -> None:
    # 8192^3: the fixed cost and the 400 MB of operands are a few % of the compute at
    # fraction x peak, so the forecast lands just under the sourced figure.
    peak = device.peak_tflops(dtype, "matrix")
    if peak <= device.peak_tflops_fp32:  # no matrix units for this dtype (V100 bf16)
        pytest.skip(f"{device.name} has no {dtype} matrix units")
    kernel = _gemm(8192, dtype)
    pred = default_predictor().predict([kernel], device)[0]
    tflops = kernel.flops / pred.gpu_ms / 1e9
    assert 0.93 * device.matrix_sustained_fraction * peak < tflops
    assert tflops <= device.matrix_sustained_fraction * peak
    assert pred.extrapolated and pred.bound == "compute"


def test_the_rule_takes_only_untrained_matrix_dtypes_on_sourced_gpus() -> None:
    pred = default_predictor()
    a100 = load_device("a100-sxm4-80gb")
    unsourced = replace(a100, matrix_sustained_fraction=None)
    half, single = _gemm(4096), _gemm(4096, "float32")
    # fp16: the sourced fraction decides; without it the learned (SIMT) form stays
    assert pred.predict([half], a100)[0].gpu_ms < 0.9 * pred.predict([half], unsourced)[0].gpu_ms
    # fp32 is trained (SIMT on NVIDIA, matrix cores on AMD): never touched
    for dev, bare in ((a100, unsourced),
                      (load_device("mi210"), replace(load_device("mi210"),
                                                     matrix_sustained_fraction=None))):
        assert pred.predict([single], dev)[0] == pred.predict([single], bare)[0]


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "a100-pcie-40gb", "mi210", "l4"])
def test_monotone_in_work_and_never_under_the_roofline(device: str) -> None:
    dev = load_device(device)
    peak = dev.peak_tflops("float16", "matrix") * 1e12
    sizes = [(m, 4096, 1024) for m in (16, 64, 256, 1024, 4096, 16384)] + \
        [(4096, n, 4096) for n in (64, 512, 8192)] + [(4096, 4096, k) for k in (64, 512, 8192)]
    kernels = [_gemm(m, n=n, k=k) for m, n, k in sizes]
    preds = default_predictor().predict(kernels, dev)
    for (kern, p) in zip(kernels, preds, strict=True):
        assert p.gpu_ms * 1e-3 >= kern.flops / peak  # u <= 1
    for run in (preds[0:6], preds[6:9], preds[9:12]):
        lat = [p.latency_ms for p in run]
        assert lat == sorted(lat)


def _busy_ms(kernel: Kernel, device) -> float:
    p = default_predictor().predict([kernel], device)[0]
    return p.gpu_ms - p.fixed_ms


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb", "l4", "t4"])
def test_a_decode_gemm_streams_its_weights_as_a_copy_does(device: str) -> None:
    # 8 rows against a 14336 x 4096 bf16 weight (117 MB, over twice every L2 here, so all of
    # it comes from DRAM): the GEMM's busy time is the device's streaming time for its bytes,
    # what the elementwise model gives a copy of as many bytes (its plain FLOPs, 0.9 GFLOP, are
    # a few microseconds at the sustained matrix rate and vanish in the smooth maximum).
    dev = load_device(device)
    dtype = "bfloat16" if dev.peak_tflops("bfloat16", "matrix") > 0 else "float16"
    gemm = _gemm(8, dtype, n=14336, k=4096)
    elements = gemm.bytes // 4  # a copy: each 2-byte element read once and written once
    copy = Kernel("copy", ("copy",), "Identity",
                  OpCost("elementwise", 0, 4 * elements, dtype, elements=elements))
    assert _busy_ms(gemm, dev) == pytest.approx(_busy_ms(copy, dev), rel=0.01)


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb"])
def test_few_rows_are_not_padded_to_a_tile(device: str) -> None:
    # Memory-bound GEMMs take their plain FLOPs: 1 to 64 rows against an 8192^2 fp16 weight
    # (134 MB) cost the weight's stream, plus 1.5 % for 64 rows' own input and output and
    # under 1 % from their 8.6 GFLOP in the smooth maximum, not 1-64 rows padded to a
    # 128-row tile (2x-128x the FLOPs).
    dev = load_device(device)
    busy = [_busy_ms(_gemm(m, n=8192, k=8192), dev) for m in (1, 8, 64)]
    assert busy == sorted(busy)
    assert busy[-1] < 1.05 * busy[0]


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb", "l4", "t4"])
def test_monotone_across_the_ridge_point(device: str) -> None:
    # Past the ridge point (intensity ~ rows for a skinny GEMM) the compute term turns to
    # whole waves of tiles, at least the plain FLOPs: the forecast may step up, never down.
    dev = load_device(device)
    kernels = [_gemm(m, n=4096, k=4096) for m in range(8, 1025, 8)]
    lat = [p.latency_ms for p in default_predictor().predict(kernels, dev)]
    assert lat == sorted(lat)


def _conv(n: int, c: int, k: int, size: int, r: int, dtype: str = "bfloat16",
          bias: bool = False) -> Kernel:
    from tilecast.analyzer.types import ConvDims

    p = size  # stride 1, "same" padding
    x, w, y = 2 * n * c * size * size, 2 * k * c * r * r, 2 * n * k * p * p
    cost = OpCost("conv", 2 * n * k * p * p * c * r * r, x + w + y + 2 * k * bias, dtype, "matrix",
                  matmul=MatmulDims(1, n * p * p, k, c * r * r), elements=n * k * p * p,
                  conv=ConvDims(n, c, k, size, size, p, p, r, r, pad=r // 2))
    return Kernel("conv", ("conv",), "Conv", cost)


def _as_gemm(conv: Kernel) -> Kernel:
    return Kernel("mm", ("mm",), "MatMul", replace(conv.cost, conv=None, family="matmul"))


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "a100-sxm4-80gb", "l4"])
def test_an_nchw_tensor_core_conv_pays_for_its_layout_transposes(device: str) -> None:
    # 32 x 256 x 56 x 56 -> 256 channels, 3x3 in bf16: X and Y are 51.4 MB each; cuDNN
    # transposes X in and Y out (nchwToNhwcKernel / nhwcToNchwKernel, each NCHW bf16 conv
    # measured on the H100): 2 x (51.4 + 51.4) MB streamed in series with the GEMM.
    dev = load_device(device)
    conv = _conv(32, 256, 256, 56, 3)
    pred = default_predictor()
    with_layout, gemm = (pred.predict([k], dev)[0] for k in (conv, _as_gemm(conv)))
    moved = 2 * (2 * 32 * 256 * 56 * 56) * 2
    floor_ms = moved / dev.mem_bandwidth_gbps * 1e-6  # those bytes at the datasheet bandwidth
    assert with_layout.gpu_ms - gemm.gpu_ms > floor_ms
    assert with_layout.gpu_ms - gemm.gpu_ms < 2.5 * floor_ms


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "a100-sxm4-80gb", "t4"])
def test_a_small_conv_pays_three_layout_kernels(device: str) -> None:
    # 1 x 512 x 7 x 7 -> 512, 3x3 in bf16 (ResNet-50's last stage at batch 1): X, W and Y are
    # 50 kB, 4.7 MB and 50 kB, each moved by a kernel of its own (the H100 replay: two
    # nchwToNhwcKernel and one nhwcToNchwKernel per such conv, 1.8-2.3 us each); their bytes
    # alone stream in about a microsecond, three queued kernels take longer
    dev = load_device(device)
    conv = _conv(1, 512, 512, 7, 3)
    p = default_predictor().predict([conv], dev)[0]
    lone = LAYOUT_KERNELS * (lone_kernel_ms(dev) + GRAPH_KERNEL_LAUNCH_US * 1e-3)
    assert p.layout_ms >= lone
    assert tensor_core.transposes_ms(np.array([0.0, 1e-6, 1.0]), dev).tolist() == [
        0.0, lone, 1.0]


@pytest.mark.parametrize("bias", [False, True])
def test_a_pointwise_conv_runs_on_nchw_as_it_stands(bias: bool) -> None:
    # 1x1 stride 1: Y_n = W X_n is a GEMM on NCHW (40 of 44 such H100 rows had no transpose);
    # a bias adds n elements to the conv's bytes and changes nothing
    h100 = load_device("h100-sxm5-80gb")
    conv = _conv(32, 256, 256, 56, 1, bias=bias)
    pred = default_predictor()
    p = pred.predict([conv], h100)[0]
    assert p.layout_ms == 0.0
    assert p.gpu_ms == pytest.approx(pred.predict([_as_gemm(conv)], h100)[0].gpu_ms)


def test_no_layout_transposes_off_the_nvidia_matrix_path() -> None:
    pred = default_predictor()
    mi = load_device("mi210")  # no AMD 16-bit conv was measured: its kernels are unknown
    conv = _conv(8, 128, 128, 28, 3)
    assert pred.predict([conv], mi)[0].gpu_ms == pytest.approx(
        pred.predict([_as_gemm(conv)], mi)[0].gpu_ms)


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "t4"])
def test_nchw_conv_forecast_grows_with_the_batch(device: str) -> None:
    dev = load_device(device)
    lat = [p.latency_ms for p in default_predictor().predict(
        [_conv(n, 64, 64, 56, 3) for n in (1, 2, 4, 8, 16, 32, 64, 128)], dev)]
    assert lat == sorted(lat)


def test_few_tiles_past_the_ridge_point_split_their_reduction() -> None:
    """ResNet-50's bf16 stem weight gradient at batch 1: 64 x 147 outputs over a reduction of
    112 x 112 = 12,544, 237 MFLOP on 1.9 MB (X, dY and dW once): 123 FLOP per byte, past the
    MI250X's ridge (383 / 3.28 = 117). Three 64 x 64 tiles split 74 ways fill its 220 CUs
    (it was one 128 x 160 tile on one CU, 0.45 ms, 724x its roofline). A decode GEMM below
    the ridge keeps one slice: partial outputs would only add to the bytes it streams."""
    dev = load_device("mi250x")
    wgrad = OpCost("conv", 236830720, 1925504, "bfloat16", "matrix",
                   matmul=MatmulDims(1, 64, 147, 12544), elements=64 * 147)
    pred = default_predictor().predict([Kernel("dW", ("conv",), "ConvGrad", wgrad)], dev)[0]
    roofline_ms = max(wgrad.flops / (dev.peak_tflops("bfloat16", "matrix") * 1e9),
                      wgrad.bytes / (dev.mem_bandwidth_gbps * 1e6))
    assert pred.tile == "64x64/74" and pred.gpu_ms - pred.fixed_ms < 20 * roofline_ms
    decode = default_predictor().predict([_gemm(8, "bfloat16", n=4096, k=4096)],
                                         load_device("h100-sxm5-80gb"))[0]
    assert "/" not in decode.tile


def _grad(n: int, c: int, k: int, size: int, r: int, which: str) -> Kernel:
    """A conv's bf16 gradient kernel as analyzer/training.py builds it (stride 1, "same"):
    dX an (N H W) x C output over K R S, dW a K x (C R S) output over the N P Q pixels."""
    x, w, y = 2 * n * c * size * size, 2 * k * c * r * r, 2 * n * k * size * size
    mm = (MatmulDims(1, n * size * size, c, k * r * r) if which == "dX"
          else MatmulDims(1, k, c * r * r, n * size * size))
    cost = OpCost("conv", 2 * n * k * size * size * c * r * r, x + w + y, "bfloat16", "matrix",
                  matmul=mm, elements=n * c * size * size if which == "dX" else k * c * r * r)
    return Kernel(f"conv.{which}", ("conv",), "ConvGrad", cost)


@pytest.mark.parametrize("which", ["dX", "dW"])
def test_nchw_conv_gradients_pay_their_layout_transposes(which: str) -> None:
    # 128 x 64 x 56 x 56, 3x3 to 64 channels: X and dY are 51.4 MB each. On the H100 45 of 45
    # such NCHW data gradients and 42 of 45 weight gradients transpose X / dY in (stop 48's
    # lease). dW's n x k operand is X's im2col (9 x 51.4 MB), which is no tensor: what moves
    # is X, dY and W (74 kB), at least 2 x (51.4 + 51.4) MB streamed besides the GEMM.
    h100 = load_device("h100-sxm5-80gb")
    pred = default_predictor()
    p = pred.predict([_grad(128, 64, 64, 56, 3, which)], h100)[0]
    moved = 2 * (2 * 128 * 64 * 56 * 56) * 2
    floor_ms = moved / h100.mem_bandwidth_gbps * 1e-6
    assert floor_ms < p.layout_ms < 2.5 * floor_ms


@pytest.mark.parametrize("which", ["dX", "dW"])
def test_pointwise_conv_gradients_run_on_nchw(which: str) -> None:
    # 1x1 stride 1: both gradients are GEMMs on NCHW as it stands (dX = W^T dY_n, dW = the
    # sum of dY_n X_n^T), 15 of 22 weight gradients and 18 of 22 data gradients without one
    p = default_predictor().predict([_grad(128, 64, 256, 56, 1, which)],
                                    load_device("h100-sxm5-80gb"))[0]
    assert p.layout_ms == 0.0


def test_a_conv_bound_by_its_layout_transposes_reads_memory_bound() -> None:
    # a 3 -> 16 channel 3x3 on 64 x 112^2 in bf16: X 4.8 MB and Y 25.7 MB transposed in and
    # out (61 MB) against 1.4 GFLOP: the transposes outweigh the GEMM's compute, its streaming
    # and the fixed part, and they stream bytes (it was labelled "overhead": the transposes
    # were in neither term the label compares with the fixed part)
    p = default_predictor().predict([_conv(64, 3, 16, 112, 3)], load_device("h100-sxm5-80gb"))[0]
    assert p.layout_ms > p.fixed_ms and p.bound == "memory"


@pytest.mark.parametrize("which", ["dX", "dW"])
def test_conv_gradients_grow_with_their_output_channels(which: str) -> None:
    # 3x3 on 32 x 16 x 56 x 56, K = 16 ... 512 output channels: more work, never less time.
    # (A rule that read a weight gradient's activations by comparing X's im2col with the
    # bytes flipped to the forward's reading at K = 8 C and dropped the transposes.)
    h100 = load_device("h100-sxm5-80gb")
    lat = [p.gpu_ms for p in default_predictor().predict(
        [_grad(32, 16, k, 56, 3, which) for k in (16, 32, 64, 96, 128, 192, 256, 512)], h100)]
    assert lat == sorted(lat)
