"""Depthwise and grouped convs as PyTorch and cuDNN run them: PyTorch's own NCHW depthwise
kernel held to its instruction issue (analyzer/native.py, learned/native_issue.py), and
tensor-core grouped convs as batched implicit GEMMs (learned/routing.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.native import Launch, launch, runs_native
from tilecast.analyzer.types import ConvDims, Kernel, MatmulDims, NativeDepthwise, OpCost
from tilecast.device_db import list_devices, load_device
from tilecast.learned.native_issue import issue_ms

learned = pytest.importorskip("tilecast.learned")
if not learned.available():
    pytest.skip("the learned predictor is not shipped in this install", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]


def _conv_model(dtype: str, n: int, c: int, k: int, groups: int, hw: int = 56,
                taps: int = 3, stride: int = 1) -> onnx.ModelProto:
    out = (hw + 2 * (taps // 2) - taps) // stride + 1
    pad, dtype = taps // 2, {"float32": "float"}.get(dtype, dtype)  # ONNX text's type names
    pads = ", ".join([str(pad)] * 4)
    return onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g ({dtype}[{n}, {c}, {hw}, {hw}] x, {dtype}[{k}, {c // groups}, {taps}, {taps}] w)
  => ({dtype}[{n}, {k}, {out}, {out}] y) {{
  y = Conv <group = {groups}, strides = [{stride}, {stride}], pads = [{pads}]> (x, w)
}}""")


def _kernel(model: onnx.ModelProto, device: str = "h100", **kw):
    return tilecast.analyze(model, device, **kw).kernels[0]


def test_the_launch_is_one_thread_per_output_in_blocks_of_1024() -> None:
    # 32 x 512 x 112 x 112 outputs of a 3 x 3 window: the recorded grid, 200,704 x 1024
    assert launch(NativeDepthwise(32 * 512 * 112 * 112, 9, 512)) == Launch(200704, 1024, 9)


@pytest.mark.parametrize("dtype, channels, runtime, native", [
    ("bfloat16", 512, "eager", True),     # every NCHW bf16 depthwise row our H100 measured
    ("float32", 512, "cudagraph", True),  # cuDNN's depthwise path is fp16 only
    ("float16", 512, "eager", False),     # use_cudnn_depthwise: fp16, >= 32 channels
    ("float16", 16, "eager", True),       # below cuDNN's 32 channels
    ("bfloat16", 512, "graph", False),    # a compiler runs its own kernels
    ("int8", 512, "eager", False),
])
def test_pytorch_runs_its_depthwise_kernel(dtype, channels, runtime, native) -> None:
    assert runs_native(NativeDepthwise(1000, 9, channels), dtype, "graph", runtime) is native


@pytest.mark.parametrize("c, k, groups, native", [
    (64, 64, 64, NativeDepthwise(8 * 64 * 56 * 56, 9, 64)),     # depthwise
    (64, 128, 64, NativeDepthwise(8 * 128 * 56 * 56, 9, 64)),   # channel multiplier 2
    (64, 64, 32, None),                                         # grouped: cuDNN
    (64, 64, 1, None),                                          # dense: cuDNN
])
def test_the_cost_names_the_native_depthwise_launch(c, k, groups, native) -> None:
    conv = _kernel(_conv_model("bfloat16", 8, c, k, groups))
    assert conv.kernel.cost.native == native


def test_the_issue_floor_of_a_large_depthwise_conv() -> None:
    """32 x 512 x 112 x 112 outputs of a 5 x 5 window on an H100: 200,704 blocks over 132
    SMs, 1,521 per SM, each 32 warps x (190 + 16.5 x 25) = 602.5 instructions per thread,
    issued 4 per clock at 1.98 GHz: 3.703 ms (measured 3.64 on the H100, 3.60 on the H200)."""
    floor = issue_ms(NativeDepthwise(32 * 512 * 112 * 112, 25, 512), load_device("h100"))
    assert floor == pytest.approx(1521 * 32 * 602.5 / (4 * 1.98e6), rel=1e-9)
    assert floor == pytest.approx(3.703, abs=1e-3)


def test_the_floor_holds_our_hoppers_depthwise_measurements() -> None:
    """The counts come from the H100's rows (``benchmarks/depthwise_issue.py``); the H200's
    rows, never fitted, sit as close, and the forecast holds both within 8 % where the copy
    rate made them 2.6x too fast."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import depthwise_issue as bench

    for folder, (device, _) in bench.SETS.items():
        samples = bench.rows(folder)
        assert len(samples) >= 15, folder
        err, median = bench.mape(samples, device)
        assert err < 6.0 and 0.95 < median < 1.05, (folder, err, median)
    per_output, per_tap = bench.fit(bench.rows(bench.FIT_ON), "h100")
    assert per_output == pytest.approx(190, abs=1) and per_tap == pytest.approx(16.5, abs=0.1)


def test_a_bf16_depthwise_conv_is_forecast_at_its_issue_rate() -> None:
    """MobileNet's widest depthwise conv at batch 256 (256 x 96 x 112 x 112 outputs, 3 x 3;
    bf16, eager): bound by issue, as the H100 ran it, slower than its bytes at the copy rate;
    under a compiled runtime (cuDNN / the compiler's kernel) the floor does not apply."""
    model = _conv_model("bfloat16", 256, 96, 96, 96, hw=112)
    eager, compiled = _kernel(model), _kernel(model, runtime="graph")
    floor = issue_ms(eager.kernel.cost.native, load_device("h100"))
    assert eager.bound == "compute" and eager.latency_ms >= floor
    assert compiled.kernel.cost.native is None and compiled.latency_ms < 0.5 * floor
    # the floor adds no flag on the architecture it was measured on (bf16 has its own)
    assert eager.extrapolated == compiled.extrapolated


def test_off_hopper_the_floor_is_flagged_extrapolated() -> None:
    v100 = _kernel(_conv_model("float32", 256, 96, 96, 96, hw=112), "v100-pcie-32gb")
    assert v100.bound == "compute" and v100.extrapolated


def _depthwise(n: int, taps: int, dtype: str) -> Kernel:
    c, hw = 96, 56
    outputs = n * c * hw * hw
    item = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return Kernel("dw", ("dw",), "Conv", OpCost(
        "conv", 2 * outputs * taps, item * (2 * outputs + c * taps), dtype, "matrix",
        matmul=MatmulDims(c, n * hw * hw, 1, taps), elements=outputs,
        conv=ConvDims(n, c, c, hw, hw, hw, hw, 3, 3, pad=1, groups=c),
        native=NativeDepthwise(outputs, taps, c)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_more_images_or_taps_never_take_less_time(dtype) -> None:
    p = learned.default_predictor()
    for dev in (d for d in list_devices() if d.vendor == "nvidia"):
        if dtype not in dev.supported_dtypes:
            continue
        by_batch = [q.latency_ms for q in p.predict([_depthwise(2 ** i, 9, dtype)
                                                     for i in range(10)], dev)]
        # 3 x 3 to 7 x 7 windows (the copy rule alone is not monotone in the FLOPs of a
        # 1 x 1 one: docs/predictor.md, "Depthwise and grouped convs")
        by_taps = [q.latency_ms for q in p.predict([_depthwise(64, t, dtype)
                                                    for t in (9, 25, 49)], dev)]
        assert by_batch == sorted(by_batch) and by_taps == sorted(by_taps), dev.name


@pytest.mark.parametrize("dtype, c, groups, part", [
    # 16 channels per group in bf16: cuDNN's tensor-core implicit GEMM, one per group
    ("bfloat16", 512, 32, "matmul"),
    ("bfloat16", 128, 32, "matmul"),     # 4 per group: still the tensor-core kernel
    ("bfloat16", 64, 32, "elementwise"),  # 2 per group: cuDNN's direct SIMT kernel
    ("float32", 512, 32, "elementwise"),  # fp32: CUDA cores
    ("bfloat16", 512, 512, "elementwise"),  # depthwise
])
def test_grouped_convs_route_by_channels_per_group(dtype, c, groups, part) -> None:
    from tilecast.learned.routing import route

    conv = _kernel(_conv_model(dtype, 8, c, c, groups)).kernel
    r = route([conv], conv_model=True)
    assert r.parts[part].kernel.tolist() == [0]
    if part == "matmul":  # the batched view: b = groups products of N P Q x K/g over C/g R S
        assert (r.parts["matmul"].b[0], r.parts["matmul"].n[0]) == (groups, c // groups)


def test_a_tensor_core_grouped_conv_is_not_forecast_at_the_cuda_core_rate() -> None:
    """ResNeXt-style 3 x 3 grouped conv (32 groups of 16 channels, batch 32, 224 x 224, bf16)
    on an H100: 237 GFLOP that cuDNN ran in 4.95 ms (NCHW, its transposes included). On the
    copy rule its FLOPs ran at the CUDA cores' rate, 17.9 ms; as 32 tensor-core GEMMs the
    forecast is bound by the bytes it and its transposes move."""
    conv = _kernel(_conv_model("bfloat16", 32, 512, 512, 32, hw=224))
    assert 1.0 < conv.latency_ms < 6.0
    assert np.isfinite(conv.latency_ms)


def _trained_depthwise(dtype: str) -> onnx.ModelProto:
    """x -> PRelu -> depthwise Conv (64 channels, multiplier 2): both the PRelu's slope and
    the conv's weight train, so the step needs the conv's dX and dW."""
    t = {"float32": "float"}.get(dtype, dtype)
    return onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g ({t}[8, 64, 56, 56] x) => ({t}[8, 128, 56, 56] y)
    <{t}[64, 1, 1] a = {{{",".join(["0"] * 64)}}},
     {t}[128, 1, 3, 3] w = {{{",".join(["0"] * 1152)}}}> {{
  h = PRelu (x, a)
  y = Conv <group = 64, pads = [1, 1, 1, 1]> (h, w)
}}""")


@pytest.mark.parametrize("dtype, native", [
    # one thread per element of dX visiting the taps of the 2 output channels its channel
    # feeds: 18
    ("float32", NativeDepthwise(8 * 64 * 56 * 56, 18, 64)),
    ("bfloat16", NativeDepthwise(8 * 64 * 56 * 56, 18, 64)),
    ("float16", None),  # 64 channels in fp16: cuDNN, as the forward
])
def test_pytorchs_depthwise_data_gradient_runs_its_own_kernel_too(dtype, native) -> None:
    """Training: dX of an NCHW depthwise conv is PyTorch's ``conv_depthwise2d_backward_kernel``
    (blocks of 1024, our H100's lease-14 rows); the weight gradient keeps the copy rule."""
    f = tilecast.analyze(_trained_depthwise(dtype), "h100", mode="training")
    grads = {k.kernel.name.rsplit(".", 1)[-1]: k for k in f.kernels
             if k.kernel.op_type == "ConvGrad"}
    assert grads["dX"].kernel.cost.native == native
    assert grads["dW"].kernel.cost.native is None
    if native is not None:
        floor = issue_ms(native, load_device("h100"))
        assert grads["dX"].latency_ms >= floor and grads["dX"].bound == "compute"


def test_pytorchs_own_depthwise_kernel_is_dispatched_as_its_own_op() -> None:
    """No cuDNN call: a tiny native depthwise conv takes an elementwise op's host dispatch
    (our H100: 26 us for the smallest, 31 for cuDNN's dense convs), a cuDNN one the conv
    call's."""
    p = learned.default_predictor()
    ew, conv = p.host_dispatch_ms["elementwise"][0], p.host_dispatch_ms["conv"][0]
    native = _kernel(_conv_model("bfloat16", 1, 16, 16, 16, hw=28))
    cudnn = _kernel(_conv_model("float16", 1, 32, 32, 32, hw=28))  # fp16, 32 channels
    assert native.kernel.cost.native is not None and cudnn.kernel.cost.native is None
    assert native.latency_ms == pytest.approx(ew, rel=0.25) and native.latency_ms < conv
    assert cudnn.latency_ms >= conv


def test_analyze_names_the_kernels_held_to_their_issue() -> None:
    from tilecast.report import render_table

    model = _conv_model("bfloat16", 256, 96, 96, 96, hw=112)
    eager, compiled = tilecast.analyze(model, "h100"), tilecast.analyze(model, "h100",
                                                                        runtime="graph")
    assert [k.kernel.op_type for k in eager.issue_bound] == ["Conv"]
    assert "issue: 1 kernels" in render_table(eager)
    assert not compiled.issue_bound and "issue:" not in render_table(compiled)


def test_a_grouped_conv_pays_for_the_tiles_it_leaves_empty() -> None:
    """32 x 512 x 224 x 224 in 32 groups of 16 channels, 3 x 3: per group an implicit GEMM of
    n = 16 output channels over k = 16 x 9 = 144, on cuDNN's 64 x 64 x 64 tiles (the H100's
    kernel names): 64 / 16 x 192 / 144 = 5.33 times its FLOPs in MMA work (m = 32 x 224 x 224
    fills its tiles). A dense conv (one group) is not a grouped GEMM."""
    from tilecast.learned.routing import route
    from tilecast.learned.tensor_core import group_tile_padding

    grouped = _kernel(_conv_model("bfloat16", 32, 512, 512, 32, hw=224)).kernel
    dense = _kernel(_conv_model("bfloat16", 32, 64, 64, 1, hw=56)).kernel
    mm = route([grouped, dense], conv_model=True).parts["matmul"]
    padding = group_tile_padding(mm, np.ones(2, dtype=bool), np.ones(2, dtype=bool))
    assert padding[0] == pytest.approx(4 * 192 / 144) and padding[1] == 0.0
