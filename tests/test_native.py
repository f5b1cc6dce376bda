"""PyTorch's own NCHW kernels that walk their elements one load per thread at a time (batch
norm, max pool): which calls run them (analyzer/native.py), how they launch, and the
DRAM-latency floor the learned predictor holds them to (learned/latency_walk.py)."""

from __future__ import annotations

from dataclasses import replace

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.native import Launch, launch, runs_native
from tilecast.analyzer.types import Kernel, NativeBatchNorm, NativePool, OpCost, RowDims
from tilecast.device_db import list_devices, load_device
from tilecast.learned.latency_walk import walk_ms

learned = pytest.importorskip("tilecast.learned")
if not learned.available():
    pytest.skip("the learned predictor is not shipped in this install", allow_module_level=True)


@pytest.mark.parametrize("bn, expected", [
    # Statistics of a 7 x 7 map: tf = 64 covers 49 pixels, 512 / 64 = 8 rows of threads (the
    # H100 trace's 64x8 blocks), one block per channel; a thread walks 128 / 8 images x 1.
    (NativeBatchNorm(128, 2048, 49, "per_channel"), Launch(2048, 512, 16)),
    # ResNet-50's stem, 112 x 112: tf = 512, one row; 128 images x ceil(12544 / 512) = 25.
    (NativeBatchNorm(128, 64, 12544, "per_channel"), Launch(64, 512, 3200)),
    # 14 x 14: tf = 256 (the trace's 256x2), 2 rows; ceil(128 / 2) x 1.
    (NativeBatchNorm(128, 1024, 196, "per_channel"), Launch(1024, 512, 64)),
    # Its backward: the same blocks, each walking the channel twice.
    (NativeBatchNorm(128, 1024, 196, "backward"), Launch(1024, 512, 128)),
    # Normalize, 56 x 56: tf = max(getNumThreads(784) = 512, min(512, 64)) = 512, tb = 1;
    # grid (64, min(262144 / 64, 128)) = 64 x 128 as traced; each thread 1 x ceil(3136 / 512).
    (NativeBatchNorm(128, 64, 3136, "transform"), Launch(8192, 512, 7)),
    # 7 x 7: tf = max(32, min(64, 64)) = 64, tb = 1; 2048 x 128 blocks of one step.
    (NativeBatchNorm(128, 2048, 49, "transform"), Launch(262144, 64, 1)),
    # Capped grid: 1 pixel, tf = 32, tb = 2; rows = min(262144 / 4096, 2048) = 64, so a thread
    # walks ceil(4096 / (64 x 2)) = 32 images.
    (NativeBatchNorm(4096, 4096, 1, "transform"), Launch(262144, 64, 32)),
    # ResNet-50's 3x3 max pool at batch 256: 256 x 64 x 56 x 56 outputs in blocks of 256 (the
    # trace's 200,704 x 256), each thread 9 taps.
    (NativePool(256 * 64 * 56 * 56, 9), Launch(200704, 256, 9)),
])
def test_the_launch_is_pytorchs(bn, expected) -> None:
    assert launch(bn) == expected


BN, POOL = NativeBatchNorm(8, 64, 3136, "transform"), NativePool(1000, 9)


@pytest.mark.parametrize("kernel, dtype, math, runtime, native", [
    (BN, "bfloat16", "graph", "eager", True),        # a bf16 model: never cuDNN
    (BN, "bfloat16", "amp-bf16", "cudagraph", True),  # bf16 autocast: bf16 input, fp32 weights
    (BN, "float16", "graph", "eager", True),         # model.half(): fp16 weights too
    (BN, "float16", "amp-fp16", "eager", False),     # fp16 input with fp32 weights: cuDNN
    (BN, "float32", "graph", "eager", False),        # cuDNN
    (BN, "bfloat16", "graph", "graph", False),       # a compiled runtime runs its own kernels
    (POOL, "float32", "graph", "eager", True),       # PyTorch pools itself in every dtype
    (POOL, "bfloat16", "graph", "graph", False),
])
def test_pytorch_picks_its_native_kernels(kernel, dtype, math, runtime, native) -> None:
    assert runs_native(kernel, dtype, math, runtime) is native


def _values(n: int, value: str) -> str:
    return ",".join([value] * n)


CNN = f"""<ir_version: 8, opset_import: ["" : 17]>
cnn (float[32, 8, 28, 28] x) => (float[32, 16, 28, 28] y)
    <float[16, 8, 3, 3] w = {{{_values(1152, "0.1")}}},
    float[16] s = {{{_values(16, "1.0")}}}, float[16] b = {{{_values(16, "0.0")}}},
    float[16] m = {{{_values(16, "0.0")}}}, float[16] v = {{{_values(16, "1.0")}}}> {{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = BatchNormalization (c, s, b, m, v)
}}"""


def _bn_kernels(math: str, runtime: str = "eager", device: str = "h100"):
    f = tilecast.analyze(onnx.parser.parse_model(CNN), device, mode="training", math=math,
                         runtime=runtime)
    return [k for k in f.kernels if k.kernel.op_type.startswith("BatchNorm")]


def test_training_marks_each_native_pass() -> None:
    """Under bf16 autocast the statistics are a per-channel walk, the normalize pass the
    transform, and the backward one kernel walking each channel twice (the trace: 53
    ``batch_norm_backward_kernel`` launches for 53 batch norms); fp16 autocast hands all of
    them to cuDNN."""
    kinds = {k.kernel.op_type: k.kernel.cost.native.kernel
             for k in _bn_kernels("amp-bf16") if k.kernel.cost.native is not None}
    assert kinds == {"BatchNormStats": "per_channel", "BatchNormalization": "transform",
                     "BatchNormalizationGrad": "backward"}
    assert all(k.kernel.cost.native is None for k in _bn_kernels("amp-fp16"))


def _forward_bn(mode: str, math: str, runtime: str = "eager") -> list:
    f = tilecast.analyze(onnx.parser.parse_model(CNN), "h100", mode=mode, math=math,
                         runtime=runtime)
    return [k.kernel for k in f.kernels
            if k.kernel.op_type.startswith("BatchNorm") and k.kernel.phase == "forward"]


@pytest.mark.parametrize("mode, math, runtime, expected", [
    # PyTorch's own kernels (the H100 traces: direct_copy_kernel_cuda and
    # batch_norm_calc_invstd before each inference transform; one
    # unrolled_elementwise_kernel_for_multi_outputs after each training statistics pass)
    ("inference", "amp-bf16", "eager",
     [("BatchNormMeanCopy", True), ("BatchNormInvstd", True), ("BatchNormalization", False)]),
    ("inference", "amp-bf16", "cudagraph",
     [("BatchNormMeanCopy", True), ("BatchNormInvstd", True), ("BatchNormalization", False)]),
    ("training", "amp-bf16", "eager",
     [("BatchNormStats", False), ("BatchNormUpdateStats", True), ("BatchNormalization", True)]),
    # cuDNN's batch norm (fp16 autocast keeps fp32 weights): one launch per pass
    ("inference", "amp-fp16", "eager", [("BatchNormalization", False)]),
    ("training", "amp-fp16", "eager", [("BatchNormStats", False), ("BatchNormalization", True)]),
    # a compiled graph folds the inference batch norm into the conv
    ("inference", "amp-bf16", "graph", []),
])
def test_pytorchs_batch_norm_launches_its_per_channel_kernels(mode, math, runtime,
                                                               expected) -> None:
    assert [(k.op_type, k.follow_on) for k in _forward_bn(mode, math, runtime)] == expected


def test_a_per_channel_kernel_moves_the_fp32_statistics_of_the_channels() -> None:
    # 16 channels of fp32: the copy reads and writes one vector (128 B), the inversion too;
    # the training update reads the batch and running mean and variance and writes the
    # running ones and the inverse (7 vectors, 448 B)
    infer = {k.op_type: k.cost for k in _forward_bn("inference", "amp-bf16")}
    train = {k.op_type: k.cost for k in _forward_bn("training", "amp-bf16")}
    costs = (infer["BatchNormMeanCopy"], infer["BatchNormInvstd"], train["BatchNormUpdateStats"])
    assert [(c.bytes, c.elements, c.dtype, c.family) for c in costs] == [
        (128, 16, "float32", "elementwise"), (128, 16, "float32", "elementwise"),
        (448, 16, "float32", "elementwise")]


def test_the_walk_holds_a_native_kernel_above_the_copy_rate() -> None:
    """bf16 statistics of 32 x 16 x 28 x 28 on an H100: 16 blocks of 512 threads (tf = 512:
    784 pixels), each thread 32 x ceil(784 / 512) = 64 loads of 375.1 ns: 24.0 us, plus the
    0.79 MB it reads queued at 3.35 TB/s (0.24 us): 24.2 us at least, where fp16 autocast
    (cuDNN, no walk) keeps the learned time."""
    bf16 = {k.kernel.name: k for k in _bn_kernels("amp-bf16")}
    fp16 = {k.kernel.name: k for k in _bn_kernels("amp-fp16")}
    stats = next(name for name in bf16 if name.endswith(".stats"))
    assert walk_ms([bf16[stats].kernel], load_device("h100"))[0] == pytest.approx(0.02425, 1e-3)
    assert bf16[stats].latency_ms >= 0.0242 and bf16[stats].bound == "latency"
    assert bf16[stats].latency_ms > fp16[stats].latency_ms


def _stats(n: int, spatial: int, dtype: str = "bfloat16") -> Kernel:
    c, elements = 256, n * 256 * spatial
    bn = NativeBatchNorm(n, c, spatial, "per_channel")
    return Kernel("bn.stats", ("bn",), "BatchNormStats",
                  OpCost("reduction", 4 * elements, 2 * elements, dtype,
                         rows=RowDims(c, n * spatial), elements=2 * c, native=bn))


@pytest.mark.parametrize("spatial", [49, 196, 784, 3136])
def test_more_images_never_take_less_time(spatial) -> None:
    p = learned.default_predictor()
    for dev in (d for d in list_devices() if d.vendor == "nvidia"):
        times = [pred.latency_ms for pred in p.predict(
            [_stats(2 ** i, spatial) for i in range(9)], dev)]
        assert times == sorted(times), dev.name


def test_a_gpu_without_a_measured_latency_is_flagged() -> None:
    """No published pointer chase covers the T4: its fp16 native kernels (model.half()) keep
    the learned time and say they are extrapolated; given a latency, the walk holds them."""
    p = learned.default_predictor()
    t4 = load_device("t4")
    assert t4.dram_latency_ns is None
    (bare,) = p.predict([_stats(64, 784, "float16")], t4)
    (held,) = p.predict([_stats(64, 784, "float16")], replace(t4, dram_latency_ns=400.0))
    assert bare.extrapolated
    assert held.gpu_ms > bare.gpu_ms


POOLED = """<ir_version: 8, opset_import: ["" : 17]>
pool (bfloat16[256, 64, 112, 112] x) => (bfloat16[256, 64, 56, 56] y) {
  y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (x)
}"""


def test_a_bf16_max_pool_waits_for_its_taps() -> None:
    """ResNet-50's max pool at batch 256 on an H100: 200,704 blocks of 256 threads, 8 resident
    per SM (2048 threads), so ceil(200704 / 1056) = 191 rounds of 9 taps at 375.1 ns (0.645
    ms), plus its 411 MB in and 103 MB out queued at 3.35 TB/s (0.153 ms): 0.798 ms at least
    (the trace: 0.82 ms). Under the graph runtime (a compiler's pool) no floor."""
    model = onnx.parser.parse_model(POOLED)
    eager = tilecast.analyze(model, "h100", runtime="cudagraph").kernels[0]
    assert eager.kernel.cost.native == NativePool(256 * 64 * 56 * 56, 9)
    assert walk_ms([eager.kernel], load_device("h100"))[0] == pytest.approx(0.7982, 1e-3)
    assert eager.latency_ms >= 0.7982
    compiled = tilecast.analyze(model, "h100", runtime="graph").kernels[0]
    assert compiled.kernel.cost.native is None and compiled.latency_ms < 0.6


TRAINED_POOL = f"""<ir_version: 8, opset_import: ["" : 17]>
pool (float[128, 3, 224, 224] x) => (float[128, 64, 56, 56] y)
    <float[64, 3, 7, 7] w = {{{_values(64 * 3 * 49, "0.01")}}}> {{
  c = Conv <pads = [3, 3, 3, 3], strides = [2, 2]> (x, w)
  y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (c)
}}"""


def test_the_max_pool_gradient_walks_the_windows_over_each_pixel() -> None:
    """ResNet-50's pool backward at batch 128: one thread per input pixel of 128 x 64 planes
    of 112 x 112 (49 blocks of 256 each), each reading up to ceil(3 / 2)^2 = 4 window indices:
    ceil(401408 / 1056) = 381 rounds x 4 x 375.1 ns = 0.572 ms, plus its 462 MB (the pooled
    gradient and its indices in, the input gradient out) queued at 3.35 TB/s, 0.138 ms: 0.710
    ms at least (the training trace: 1.07 ms)."""
    f = tilecast.analyze(onnx.parser.parse_model(TRAINED_POOL), "h100", mode="training",
                         math="amp-bf16")
    (grad,) = [k for k in f.kernels if k.kernel.op_type == "MaxPoolGrad"]
    assert grad.kernel.cost.native == NativePool(128 * 64 * 112 * 112, 4)
    assert launch(grad.kernel.cost.native) == Launch(401408, 256, 4)
    assert grad.latency_ms >= walk_ms([grad.kernel], load_device("h100"))[0] == pytest.approx(
        0.7097, 1e-3)


def test_the_report_says_which_kernels_wait_on_latency() -> None:
    from tilecast.report import render_table

    model = onnx.parser.parse_model(POOLED)
    eager = tilecast.analyze(model, "h100")
    assert [k.kernel.op_type for k in eager.latency_bound] == ["MaxPool"]
    assert "latency: 1 kernels" in render_table(eager)
    compiled = tilecast.analyze(model, "h100", runtime="graph")
    assert not compiled.latency_bound and "latency:" not in render_table(compiled)


@pytest.mark.parametrize("kind", ["transform", "per_channel", "backward"])
def test_a_batch_norm_floor_never_falls_as_the_tensor_grows(kind) -> None:
    """PyTorch changes the normalize pass's block shape by band of the map's size (259 pixels:
    64-thread blocks, 260: 128), which a launch-based floor would carry into a drop; each
    floor must only grow with the images, the channels and the map (every NVIDIA device)."""
    for dev in (d for d in list_devices() if d.dram_latency_ns is not None
                and d.vendor == "nvidia"):
        for n, c in ((1, 64), (8, 3), (128, 256), (2, 4096)):
            maps = [_bn(kind, n, c, hw) for hw in range(1, 1100, 3)]
            images = [_bn(kind, m, c, 196) for m in range(1, 300, 7)]
            channels = [_bn(kind, n, ch, 49) for ch in range(1, 5000, 37)]
            for series in (maps, images, channels):
                floors = walk_ms(series, dev).tolist()
                assert floors == sorted(floors), (dev.name, kind, n, c)


def _bn(kind: str, n: int, c: int, spatial: int) -> Kernel:
    elements = n * c * spatial
    return Kernel("bn", ("bn",), "BatchNormalization",
                  OpCost("elementwise", elements, 4 * elements, "bfloat16", elements=elements,
                         native=NativeBatchNorm(n, c, spatial, kind)))


def test_a_large_normalize_pass_queues_its_bytes_behind_its_walk() -> None:
    """ResNet-50's 256 x 56 x 56 normalize at batch 256 in bf16 on an H100: 205,520,896
    elements over 132 x 2048 resident threads, ceil = 761 rounds x 375.1 ns = 285.5 us, plus
    its 822.1 MB (X in, Y out) at 3.35 TB/s = 245.4 us: 530.9 us (our trace: 538.7 us; the
    walk alone, 285.5, was 0.53x of it)."""
    (floor,) = walk_ms([_bn("transform", 256, 256, 3136)], load_device("h100"))
    assert floor == pytest.approx(0.2855 + 0.2454, abs=2e-4)
