"""What runs where: load-time folding, host-side shape arithmetic and QDQ int8 fusion."""

from __future__ import annotations

import json

import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.analyzer.fold import FOLDED, HOST, HOST_MAX_ELEMENTS
from tilecast.analyzer.forecast import Forecast
from tilecast.analyzer.qdq import FUSED_DQ
from tilecast.cli import main

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'

# Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the legacy exporter's view(x.size(0), -1)
SHAPE_CHAIN = HEADER + """
g (float[4, 8, 16] x) => (float[4, 128] y) {
  s = Shape(x)
  zero = Constant<value = int64 {0}>()
  n = Gather(s, zero)
  ax = Constant<value = int64[1] {0}>()
  n1 = Unsqueeze(n, ax)
  minus = Constant<value = int64[1] {-1}>()
  shape = Concat<axis = 0>(n1, minus)
  r = Reshape(x, shape)
  y = Relu(r)
}"""

# A tied LM head: the embedding table's transpose has only constant inputs.
TIED = HEADER + """
g (float[2, 64] h) => (float[2, 100] y) <float[100, 64] wte = {0.0}> {
  wt = Transpose<perm = [1, 0]>(wte)
  y = MatMul(h, wt)
}"""


def _model(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


def _reasons(f: Forecast) -> dict[str, str]:
    return {z.op_type: z.reason for z in f.zero_cost_reasons}


def test_shape_chain_runs_on_the_host():
    f = tilecast.analyze(_model(SHAPE_CHAIN), "l4", predictor="roofline")
    assert [k.kernel.op_type for k in f.kernels] == ["Relu"]
    reasons = _reasons(f)
    for op in ("Shape", "Gather", "Unsqueeze", "Concat"):
        assert reasons[op] == HOST, op
    assert reasons["Constant"] == FOLDED
    assert reasons["Reshape"] != HOST  # a view of the float activation, not shape arithmetic


@pytest.mark.parametrize("n, where", [
    # Range(0, size) from Shape: a host value while it is a small shape-like vector (ONNX
    # Runtime's 100-element small-tensor bound), a GPU kernel beyond it (position ids).
    (HOST_MAX_ELEMENTS, "host"), (HOST_MAX_ELEMENTS + 1, "gpu"),
])
def test_host_values_are_bounded_in_size(n, where):
    text = HEADER + f"""
g (float[{n}, 4] x) => (int64[{n}] y) {{
  s = Shape(x)
  zero = Constant<value = int64 {{0}}>()
  one = Constant<value = int64 {{1}}>()
  n = Gather(s, zero)
  y = Range(zero, n, one)
}}"""
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    ops = [k.kernel.op_type for k in f.kernels]
    assert ops == ([] if where == "host" else ["Range"])


@pytest.mark.parametrize(("fill", "where"), [
    # 1 / sqrt(d) from the head size (torch.onnx's SDPA scale): a Python float in PyTorch
    ("", "host"),
    # a (4, 8) float tensor filled from the sizes: 32 elements, still a small host value
    ("  y = ConstantOfShape<value = float[1] {1.0}>(s)\n", "host"),
    # a (32, 8) one: 256 elements, over HOST_MAX_ELEMENTS, so a GPU fill
    ("  s2 = Mul(s, four)\n  y = ConstantOfShape<value = float[1] {1.0}>(s2)\n", "gpu"),
])
def test_float_values_derived_from_sizes(fill: str, where: str):
    body = fill or """  d = Slice(s, minus1, big)
  df = Cast<to = 1>(d)
  r = Sqrt(df)
  y = Reciprocal(r)
"""
    text = HEADER + """
g (float[4, 8] x) => (float[N] y) <int64[1] minus1 = {-1}, int64[1] big = {9},
                                   int64[2] four = {8, 1}> {
  s = Shape(x)
""" + body + "}"
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    ops = [k.kernel.op_type for k in f.kernels]
    assert ops == ([] if where == "host" else ["ConstantOfShape"])


def test_weight_only_subgraph_is_folded_at_load():
    f = tilecast.analyze(_model(TIED), "l4", predictor="roofline")
    assert [k.kernel.op_type for k in f.kernels] == ["MatMul"]
    assert _reasons(f)["Transpose"] == FOLDED
    # the MatMul still reads the (folded) transposed weight: 4 * (2*64 + 64*100 + 2*100)
    assert f.kernels[0].kernel.bytes == 4 * (128 + 6400 + 200)


def test_node_reading_a_graph_input_is_not_folded():
    text = HEADER + """
g (float[8, 8] x) => (float[8, 8] y) <float[8, 8] w = {0.0}> {
  wt = Transpose(w)
  y = Add(wt, x)
}"""
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    assert [k.kernel.op_type for k in f.kernels] == ["Add"]


def test_random_ops_are_never_folded():
    text = HEADER + """
g (float[8] x) => (float[8] y) {
  r = RandomNormal<shape = [8]>()
  y = Add(r, x)
}"""
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    assert "RandomNormal" in {k.kernel.op_type for k in f.kernels} | set(f.unsupported)


def test_reasons_in_json_table_and_round_trip():
    f = tilecast.analyze(_model(SHAPE_CHAIN), "l4", predictor="roofline")
    data = json.loads(f.to_json())
    rows = {(z["op_type"], z["reason"]): z["count"] for z in data["zero_cost_reasons"]}
    assert rows[("Shape", HOST)] == 1 and rows[("Constant", FOLDED)] == 3
    assert data["zero_cost"]["Gather"] == 1
    back = Forecast.from_json(f.to_json())
    assert back.zero_cost_reasons == f.zero_cost_reasons
    assert back.zero_cost_by_reason()[HOST] == 4


def test_table_names_host_and_folded_counts(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(_model(SHAPE_CHAIN), path)
    out = CliRunner().invoke(main, ["analyze", str(path), "--device", "l4",
                                    "--predictor", "roofline"])
    assert out.exit_code == 0, out.output
    line = next(s for s in out.output.splitlines() if s.startswith("zero-cost nodes"))
    assert f"{HOST} 4" in line and f"{FOLDED} 3" in line


# --- QDQ ---------------------------------------------------------------------------------------
# One quantized conv as ONNX Runtime's quantizer writes it (N, C, H, W = 8, 64, 56, 56; 3x3).
QDQ_CONV = HEADER + """
g (float[8, 64, 56, 56] x) => (float[8, 64, 56, 56] y)
  <int8[64, 64, 3, 3] wq = {0}, float ws = {0.1}, int8 zp = {0}, float xs = {0.1},
   int32[64] bq = {0}, float bs = {0.01}> {
  xq = QuantizeLinear(x, xs, zp)
  xd = DequantizeLinear(xq, xs, zp)
  wd = DequantizeLinear(wq, ws, zp)
  bd = DequantizeLinear(bq, bs)
  c = Conv<pads = [1, 1, 1, 1]>(xd, wd, bd)
  cq = QuantizeLinear(c, xs, zp)
  y = DequantizeLinear(cq, xs, zp)
}"""


def test_qdq_conv_is_costed_at_int8():
    f = tilecast.analyze(_model(QDQ_CONV), "l4", predictor="roofline")
    by_op = {k.kernel.op_type: k.kernel for k in f.kernels}
    conv = by_op["Conv"]
    n = 8 * 64 * 56 * 56
    assert conv.dtype == "int8" and conv.cost.unit == "matrix"
    # int8 input + int8 weight + int32 bias read, float32 output written
    assert conv.bytes == n + 64 * 64 * 9 + 4 * 64 + 4 * n
    assert conv.flops == 2 * n * 64 * 9 + n  # the implicit GEMM, plus the bias adds
    reasons = {(z.op_type, z.reason): z.count for z in f.zero_cost_reasons}
    assert reasons[("DequantizeLinear", FOLDED)] == 2  # weight and bias
    assert reasons[("DequantizeLinear", FUSED_DQ)] == 1  # the activation's
    # the activation Quantize (x) and the output's run; the output DQ feeds the graph output
    assert [k.kernel.op_type for k in f.kernels].count("QuantizeLinear") == 2


def _conv_stack(layers: int, qdq: bool) -> onnx.ModelProto:
    """``layers`` 3x3 convs on (8, 64, 56, 56), as ONNX Runtime's QDQ quantizer writes them
    (Relu absorbed by the output QuantizeLinear's range) or in float32 with Relu."""
    inits = ("int8[64, 64, 3, 3] wq = {0}, float ws = {0.1}, int8 zp = {0}, float xs = {0.1}"
             if qdq else "float[64, 64, 3, 3] w = {0.0}")
    body = ["a0 = QuantizeLinear(x, xs, zp)" if qdq else "a0 = Identity(x)"]
    if qdq:
        body.append("wd = DequantizeLinear(wq, ws, zp)")
    for i in range(layers):
        if qdq:
            body += [f"d{i} = DequantizeLinear(a{i}, xs, zp)",
                     f"c{i} = Conv<pads = [1, 1, 1, 1]>(d{i}, wd)",
                     f"a{i + 1} = QuantizeLinear(c{i}, xs, zp)"]
        else:
            body += [f"c{i} = Conv<pads = [1, 1, 1, 1]>(a{i}, w)", f"a{i + 1} = Relu(c{i})"]
    body.append(f"y = DequantizeLinear(a{layers}, xs, zp)" if qdq else f"y = Identity(a{layers})")
    lines = "\n  ".join(body)
    return _model(HEADER + f"g (float[8, 64, 56, 56] x) => (float[8, 64, 56, 56] y) <{inits}> "
                  f"{{\n  {lines}\n}}")


@pytest.mark.parametrize("predictor", ["roofline", "default"])
def test_qdq_stack_forecasts_faster_than_fp32(predictor):
    # Per layer, int8: the conv reads 1-byte activations at the int8 peak, then the Quantize
    # reads 4 and writes 1 byte per element; float32: the conv reads and writes 4 bytes per
    # element at the fp32 peak, then Relu does again.
    q = tilecast.analyze(_conv_stack(4, qdq=True), "l4", predictor=predictor)
    fp = tilecast.analyze(_conv_stack(4, qdq=False), "l4", predictor=predictor)
    assert q.total_ms < fp.total_ms
    assert {k.kernel.dtype for k in q.kernels if k.kernel.op_type == "Conv"} == {"int8"}


def test_residual_add_of_quantized_tensors_reads_int8():
    # DQ(conv output) + DQ(block input): both dequantizes fuse into the Add, which reads two
    # 1-byte tensors and writes float32: 8*64*56*56 * (1 + 1 + 4) bytes
    text = QDQ_CONV.replace("y = DequantizeLinear(cq, xs, zp)",
                            "d = DequantizeLinear(cq, xs, zp)\n  y = Add(d, xd)")
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    ops = [k.kernel.op_type for k in f.kernels]
    assert "DequantizeLinear" not in ops
    add = next(k.kernel for k in f.kernels if k.kernel.op_type == "Add")
    assert add.dtype == "int8" and add.bytes == 8 * 64 * 56 * 56 * 6


def test_dequantize_that_also_feeds_a_float_op_still_runs():
    text = QDQ_CONV.replace("y = DequantizeLinear(cq, xs, zp)",
                            "d = DequantizeLinear(cq, xs, zp)\n  y = Sigmoid(d)\n"
                            "  e = Relu(xd)")
    f = tilecast.analyze(_model(text), "l4", predictor="roofline")
    # d feeds only a float Sigmoid; xd feeds the int8 Conv and a float Relu: both run
    assert [k.kernel.op_type for k in f.kernels].count("DequantizeLinear") == 2


def test_dynamic_quantization_uses_the_int8_peak():
    text = HEADER + """
g (float[256, 512] x) => (int32[256, 1024] y) <uint8[512, 1024] w = {0}, uint8 wz = {0}> {
  xq, xs, xz = DynamicQuantizeLinear(x)
  y = MatMulInteger(xq, w, xz, wz)
}"""
    dev = tilecast.load_device("l4")
    f = tilecast.analyze(_model(text), dev, predictor="roofline")
    mm = next(k.kernel for k in f.kernels if k.kernel.op_type == "MatMulInteger")
    assert dev.peak_tflops(mm.dtype, mm.cost.unit) == dev.peak_tops_int8_matrix
