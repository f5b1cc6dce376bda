"""Math modes: TF32 tensor cores and autocast (amp-fp16 / amp-bf16) on tiny ONNX text graphs."""

from __future__ import annotations

import numpy as np
import onnx.helper
import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.analyzer.mathmode import AUTOCAST_REASON, FOLDED_WEIGHT_CAST, MATH_MODES
from tilecast.analyzer.predictor import RooflinePredictor
from tilecast.cli import main

# x -> MatMul(w1) -> Relu -> MatMul(w2): every op autocasts to half or runs in its input type.
MLP = """
<ir_version: 8, opset_import: ["" : 17]>
mlp ({T}[64, 128] x) => ({T}[64, 32] y) <{T}[128, 256] w1 = {{0.0}}, {T}[256, 32] w2 = {{0.0}}> {{
  h = MatMul(x, w1)
  r = Relu(h)
  y = MatMul(r, w2)
}}"""

# A pre-norm transformer MLP block with a softmax head, large enough that its matmuls dominate.
BLOCK = """
<ir_version: 8, opset_import: ["" : 17]>
block ({T}[2048, 1024] x) => ({T}[2048, 1024] p) <{T}[1024] g = {{1.0}}, {T}[1024] b = {{0.0}},
    {T}[1024, 4096] w1 = {{0.0}}, {T}[4096, 1024] w2 = {{0.0}}, {T} half = {{0.5}}> {{
  n = LayerNormalization(x, g, b)
  h = MatMul(n, w1)
  e = Erf(h)
  a = Mul(e, half)
  o = MatMul(a, w2)
  s = Add(o, x)
  p = Softmax(s)
}}"""


# A ResNet basic block behind a stem conv (so the residual is half, as in ResNet).
RESNET_BLOCK = """
<ir_version: 8, opset_import: ["" : 17]>
res ({T}[32, 64, 56, 56] x) => ({T}[32, 64, 56, 56] y) <{T}[64, 64, 3, 3] w0 = {{0.0}},
    {T}[64, 64, 3, 3] w1 = {{0.0}}, {T}[64, 64, 3, 3] w2 = {{0.0}}, {T}[64] s = {{1.0}},
    {T}[64] t = {{0.0}}, {T}[64] mu = {{0.0}}, {T}[64] var = {{1.0}}> {{
  a = Conv <pads = [1, 1, 1, 1]> (x, w0)
  b = Relu(a)
  c = Conv <pads = [1, 1, 1, 1]> (b, w1)
  d = BatchNormalization(c, s, t, mu, var)
  e = Relu(d)
  f = Conv <pads = [1, 1, 1, 1]> (e, w2)
  g = BatchNormalization(f, s, t, mu, var)
  h = Add(g, b)
  y = Relu(h)
}}"""


def _model(text: str, dtype: str):
    """The graph with every float tensor in ``dtype`` (the text parser reads no fp16 data)."""
    model = onnx.parser.parse_model(text.format(T="float"))
    if dtype != "float":
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        for t in model.graph.initializer:
            t.data_type = elem
            t.ClearField("float_data")  # weightless: tilecast reads dims and dtype only
        for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info):
            vi.type.tensor_type.elem_type = elem
    return model


def _kernels(f):
    return [(k.kernel.op_type, k.kernel.dtype, k.kernel.bytes) for k in f.kernels]


def test_cli_and_library_agree_on_the_modes():
    assert MATH_MODES == ("graph", "tf32", "tf32-conv", "amp-fp16", "amp-bf16")


def test_tf32_runs_fp32_matmuls_on_tf32_and_keeps_their_bytes():
    model = _model(MLP, "float")
    base = tilecast.analyze(model, "a100-sxm4-40gb", predictor="roofline")
    tf32 = tilecast.analyze(model, "a100-sxm4-40gb", predictor="roofline", math="tf32")
    assert tf32.math == "tf32" and base.math == "graph"
    assert [k.kernel.dtype for k in tf32.kernels] == ["tf32", "float32", "tf32"]
    assert [k.kernel.bytes for k in tf32.kernels] == [k.kernel.bytes for k in base.kernels]


def test_tf32_matmul_uses_the_tf32_peak():
    # 64x128x256 matmul: 2*64*128*256 = 4.19 MFLOP at 156 TFLOP/s (TF32) instead of 19.5
    dev = tilecast.load_device("a100-sxm4-40gb")
    f = tilecast.analyze(_model(MLP, "float"), dev, predictor="roofline", math="tf32",
                         runtime="graph")
    k = f.kernels[0].kernel
    work_ms = max(k.flops / (156e12), k.bytes / dev.mem_bandwidth_bytes_per_s) * 1e3
    # the predictor's time: the work at the TF32 peak plus the launch (the graph runtime then
    # holds so short a kernel to its two DRAM round trips)
    p = RooflinePredictor().predict([k], dev)[0]
    assert p.latency_ms == pytest.approx(work_ms + dev.launch_overhead_us * 1e-3)


@pytest.mark.parametrize("device,math", [
    ("t4", "tf32"), ("v100-sxm2-32gb", "tf32"), ("p100", "tf32"), ("mi250x", "tf32"),
    ("t4", "tf32-conv"), ("t4", "amp-bf16"), ("v100-sxm2-32gb", "amp-bf16"),
])
def test_math_mode_the_gpu_lacks_is_one_error_line(tmp_path, device, math):
    path = tmp_path / "mlp.onnx"
    onnx.save(_model(MLP, "float"), path)
    res = CliRunner().invoke(main, ["analyze", str(path), "-d", device, "--math", math])
    assert res.exit_code == 2
    assert res.output.count("Error:") == 1 and math in res.output
    assert "Traceback" not in res.output


# A conv feeding a Linear: PyTorch 1.12+ runs the first in TF32 (cudnn.allow_tf32) and the
# second in fp32 (matmul.allow_tf32 is False).
CONV_HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
net ({T}[8, 64, 14, 14] x) => ({T}[8, 1000] y) <{T}[256, 64, 3, 3] w = {{0.0}},
    {T}[256, 1000] fc = {{0.0}}> {{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  p = GlobalAveragePool(c)
  f = Flatten(p)
  y = MatMul(f, fc)
}}"""


def test_tf32_conv_runs_the_convs_on_tf32_and_the_matmuls_in_fp32():
    model = _model(CONV_HEAD, "float")
    # the graph runtime: each kernel's time is its own (no host queue in between)
    runs = {m: tilecast.analyze(model, "a100-sxm4-40gb", math=m, runtime="graph")
            for m in ("graph", "tf32", "tf32-conv")}
    dtypes = {m: {k.kernel.op_type: k.kernel.dtype for k in f.kernels} for m, f in runs.items()}
    assert dtypes["tf32-conv"]["Conv"] == "tf32" and dtypes["tf32-conv"]["MatMul"] == "float32"
    assert dtypes["tf32"]["MatMul"] == "tf32" and dtypes["graph"]["Conv"] == "float32"
    ms = {m: {k.kernel.op_type: k.latency_ms for k in f.kernels} for m, f in runs.items()}
    assert ms["tf32-conv"]["Conv"] == ms["tf32"]["Conv"]  # the conv as under tf32
    assert ms["tf32-conv"]["MatMul"] == ms["graph"]["MatMul"]  # the head as in fp32
    assert runs["tf32-conv"].math == "tf32-conv"


def test_tf32_conv_trains_the_conv_gradients_on_tf32_too():
    f = tilecast.analyze(_model(CONV_HEAD, "float"), "a100-sxm4-40gb", mode="training",
                         math="tf32-conv", predictor="roofline")
    grads = {(k.kernel.op_type, k.kernel.dtype) for k in f.kernels if k.kernel.phase == "backward"
             and k.kernel.cost.unit == "matrix"}
    assert ("ConvGrad", "tf32") in grads and ("ConvGrad", "float32") not in grads
    assert any(op != "ConvGrad" and dt == "float32" for op, dt in grads)  # the head's


def test_amp_mlp_kernels_with_their_casts():
    f = tilecast.analyze(_model(MLP, "float"), "a100-sxm4-40gb", predictor="roofline",
                         math="amp-fp16")
    # x cast (64*128 * (4 read + 2 written)), w1 cast (128*256 * 6), MatMul in half
    # (x, w1, h at 2 bytes), Relu on h, w2 cast (256*32 * 6), MatMul (r, w2, y at 2 bytes).
    assert _kernels(f) == [
        ("Cast", "float16", 64 * 128 * 6), ("Cast", "float16", 128 * 256 * 6),
        ("MatMul", "float16", 2 * (64 * 128 + 128 * 256 + 64 * 256)),
        ("Relu", "float16", 2 * 2 * 64 * 256), ("Cast", "float16", 256 * 32 * 6),
        ("MatMul", "float16", 2 * (64 * 256 + 256 * 32 + 64 * 32)),
    ]
    assert f.math == "amp-fp16" and f.node_count == 3


def test_amp_bf16_uses_bfloat16():
    f = tilecast.analyze(_model(MLP, "float"), "h100-sxm", predictor="roofline",
                         math="amp-bf16")
    assert {k.kernel.dtype for k in f.kernels} == {"bfloat16"}


def test_amp_on_a_half_graph_adds_nothing():
    graph = tilecast.analyze(_model(MLP, "float16"), "l4", predictor="roofline")
    amp = tilecast.analyze(_model(MLP, "float16"), "l4", predictor="roofline", math="amp-fp16")
    assert _kernels(amp) == _kernels(graph)


SHARED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 128] x, float[64, 128] z) => (float[64, 128] y) <float[128, 128] w = {0.0}> {
  a = MatMul(x, w)
  b = MatMul(z, w)
  y = Add(a, b)
}"""


def test_a_weight_is_cast_once_per_pass_activations_per_use():
    f = tilecast.analyze(onnx.parser.parse_model(SHARED), "l4", predictor="roofline",
                         math="amp-fp16")
    casts = [k.kernel.name for k in f.kernels if k.kernel.op_type == "Cast"]
    # x and z once each (activations), w once (autocast's cast cache)
    assert len(casts) == 3 and sum(n.startswith("w/") for n in casts) == 1


MIXED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 128] x, float[64, 128] r) => (float[64, 128] s, float[64, 128] m, float[64, 128] n,
    float[64, 128] p) <float[128, 128] w = {0.0}, float[128] gam = {1.0}, float c = {2.0}> {
  h = MatMul(x, w)
  s = Add(h, r)
  m = Mul(h, c)
  n = LayerNormalization(h, gam)
  p = Softmax(h)
}"""


@pytest.mark.parametrize("op_type,dtype,nbytes", [
    # half h + fp32 r: PyTorch's own promotion runs it in fp32, reading h as half (no cast)
    ("Add", "float32", 64 * 128 * (2 + 4 + 4)),
    # a 0-d constant does not promote: stays half
    ("Mul", "float16", 64 * 128 * (2 + 2) + 4),
    # layer_norm autocasts to fp32: a cast kernel half -> fp32, then fp32 in and out
    ("LayerNormalization", "float32", 64 * 128 * (4 + 4) + 128 * 4),
    # softmax takes dtype=float32 (fp32_set_opt_dtype): reads half, writes fp32, no cast
    ("Softmax", "float32", 64 * 128 * (2 + 4)),
])
def test_autocast_policies(op_type, dtype, nbytes):
    f = tilecast.analyze(onnx.parser.parse_model(MIXED), "l4", predictor="roofline",
                         math="amp-fp16")
    k = next(k for k in f.kernels if k.kernel.op_type == op_type)
    assert (k.kernel.dtype, k.kernel.bytes) == (dtype, nbytes)


def test_only_the_layer_norm_input_gets_an_fp32_cast():
    f = tilecast.analyze(onnx.parser.parse_model(MIXED), "l4", predictor="roofline",
                         math="amp-fp16")
    to_fp32 = [k for k in f.kernels if k.kernel.op_type == "Cast" and k.kernel.dtype == "float32"]
    assert len(to_fp32) == 1 and to_fp32[0].kernel.name.startswith("h/")
    assert to_fp32[0].kernel.bytes == 64 * 128 * (2 + 4)


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "t4", "h100-sxm", "mi300x"])
def test_amp_fp32_graph_matches_the_fp16_export_plus_its_casts(device):
    fp32 = _model(RESNET_BLOCK, "float")
    amp = tilecast.analyze(fp32, device, predictor="roofline", math="amp-fp16", runtime="graph")
    half = tilecast.analyze(_model(RESNET_BLOCK, "float16"), device, predictor="roofline",
                            runtime="graph")
    casts_ms = sum(k.latency_ms for k in amp.kernels if k.kernel.op_type == "Cast")
    assert casts_ms > 0
    assert amp.total_ms == pytest.approx(half.total_ms + casts_ms, rel=0.05)
    # and autocast is faster than fp32 math on every GPU with half tensor cores
    assert amp.total_ms < tilecast.analyze(fp32, device, predictor="roofline",
                                           runtime="graph").total_ms


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "t4"])
def test_amp_casts_add_at_most_their_own_time_in_eager(device):
    # Eager: a cast dispatched while the GPU is busy fills host slack, so autocast costs
    # between nothing and the casts' own (attributed) time over the fp16 export.
    amp = tilecast.analyze(_model(RESNET_BLOCK, "float"), device, predictor="roofline",
                           math="amp-fp16")
    half = tilecast.analyze(_model(RESNET_BLOCK, "float16"), device, predictor="roofline")
    casts_ms = sum(k.latency_ms for k in amp.kernels if k.kernel.op_type == "Cast")
    assert half.total_ms * 0.999 <= amp.total_ms <= (half.total_ms + casts_ms) * 1.001


def test_amp_transformer_block_differs_from_fp16_only_where_autocast_keeps_fp32():
    # a CUDA-graph replay: no host floor, so each kernel's time is its own, and every op its
    # own kernel (the graph runtime would fuse the residual Add into the GEMM's epilogue)
    amp = tilecast.analyze(_model(BLOCK, "float"), "a100-sxm4-40gb", predictor="roofline",
                           math="amp-fp16", runtime="cudagraph")
    half = tilecast.analyze(_model(BLOCK, "float16"), "a100-sxm4-40gb", predictor="roofline",
                            runtime="cudagraph")
    same = {k.kernel.name: k.latency_ms for k in half.kernels}
    differ = {k.kernel.op_type for k in amp.kernels
              if k.kernel.op_type != "Cast" and k.latency_ms != pytest.approx(same[k.kernel.name])}
    # layer_norm and softmax run in fp32; the residual Add promotes to the fp32 input x
    assert differ == {"LayerNormalization", "Add", "Softmax"}


def test_amp_training_casts_gradients_back():
    f = tilecast.analyze(_model(MLP, "float"), "a100-sxm4-40gb", predictor="roofline",
                         math="amp-fp16", mode="training", optimizer="adam")
    grads = [k for k in f.kernels if k.kernel.op_type == "CastGrad"]
    # the two weight casts get their gradient casts (x needs no gradient): read the half
    # gradient, write the fp32 one
    assert sorted(k.kernel.bytes for k in grads) == [256 * 32 * 6, 128 * 256 * 6]
    assert {k.kernel.dtype for k in grads} == {"float32"}
    updates = [k for k in f.kernels if k.kernel.phase == "update"]
    assert {k.kernel.dtype for k in updates} == {"float32"}  # fp32 master weights


def test_cast_kernels_carry_the_autocast_reason():
    from tilecast.analyzer.analysis import cost_graph
    from tilecast.analyzer.graph import build_graph
    from tilecast.analyzer.mathmode import autocast_results

    results = autocast_results(cost_graph(build_graph(_model(MLP, "float"))), "float16")
    assert sum(r.reason == AUTOCAST_REASON for r in results) == 3


@pytest.mark.parametrize("runtime, mode, weight_casts", [
    ("graph", "inference", 0),     # the engine is built with half weights: cast once, not per pass
    ("cudagraph", "inference", 2),  # a replay runs autocast's per-forward weight casts
    ("eager", "inference", 2),
    ("graph", "training", 2),      # weights change every step: cast every step
])
def test_a_compiled_engine_casts_its_weights_at_build(runtime, mode, weight_casts):
    f = tilecast.analyze(_model(MLP, "float"), "a100-sxm4-40gb", predictor="roofline",
                         math="amp-fp16", runtime=runtime, mode=mode)
    casts = [k.kernel.name for k in f.kernels if k.kernel.op_type == "Cast"]
    assert sum(n.startswith(("w1/", "w2/")) for n in casts) == weight_casts
    assert sum(n.startswith("x/") for n in casts) == 1  # the input is cast every pass
    folded = {z.reason: z.count for z in f.zero_cost_reasons}.get(FOLDED_WEIGHT_CAST, 0)
    assert folded == 2 - weight_casts


# torch.onnx writes a parameter equal to another (zero-initialized biases, tied weights) as an
# Identity of the one initializer it keeps: still a parameter, cast once per pass by autocast
# and folded into an engine built in half, as the initializer itself is
TIED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 128] x) => (float[64, 128] y) <float[128, 128] w = {0.0}, float[128] b = {0.0}> {
  b2 = Identity(b)
  h = Gemm(x, w, b)
  y = Gemm(h, w, b2)
}"""


@pytest.mark.parametrize("runtime, bias_casts", [("eager", 2), ("graph", 0)])
def test_a_parameter_written_as_an_identity_is_a_weight(runtime, bias_casts):
    f = tilecast.analyze(onnx.parser.parse_model(TIED), "a100-sxm4-40gb", predictor="roofline",
                         math="amp-fp16", runtime=runtime)
    casts = [k.kernel for k in f.kernels if k.kernel.op_type == "Cast"]
    # b and b2 once each per pass (eager), w once; the activation x is cast every pass
    assert sum(c.name.startswith(("b/", "b2/")) for c in casts) == bias_casts
    assert [c.name for c in casts if c.name.startswith("b2/")] in ([], ["b2/autocast"])
    assert sum(c.name.startswith("x/") for c in casts) == 1
