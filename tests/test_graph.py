"""Graph loading and shape completion: no weights read, dims bound, odd graphs survive."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.errors import ModelLoadError, ShapeError

SYMBOLIC = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 16, 32] x, float[32, 8] w) => (float[batch, 16, 8] y) {
  h = MatMul(x, w)
  y = Relu(h)
}"""

CUSTOM = """
<ir_version: 8, opset_import: ["" : 17, "com.example": 1]>
g (float[4, 32] x, float[32, 32] w) => (float[4, 32] z) {
  h = MatMul(x, w)
  y = com.example.MagicOp(h)
  z = Relu(h)
}"""

CONTRIB = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1]>
g (float[2, 8, 64] x, float[64] b, float[2, 8, 64] skip, float[64] gamma, float[64] beta)
  => (float[2, 8, 64] z) {
  g1 = com.microsoft.BiasGelu(x, b)
  n = com.microsoft.SkipLayerNormalization(g1, skip, gamma, beta)
  z = Relu(n)
}"""

LOOP = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64 trip, bool cond, float[4] x) => (float[4] y) {
  y = Loop(trip, cond, x) <body = body (int64 i, bool c, float[4] v) => (bool co, float[4] vo) {
      co = Identity(c)
      vo = Relu(v)
  }>
}"""


def test_symbolic_dim_bound_by_dims():
    g = build_graph(onnx.parser.parse_model(SYMBOLIC), {"batch": 3})
    assert g.nodes[0].outputs[0].shape == (3, 16, 8)
    assert not g.unbound_dims


def test_unbound_dim_is_a_clear_error():
    with pytest.raises(ShapeError, match=r"'batch'.*MatMul.*--dim batch=VALUE"):
        tilecast.analyze(onnx.parser.parse_model(SYMBOLIC), "l4", predictor="roofline")


def test_caller_model_is_not_modified():
    model = onnx.parser.parse_model(SYMBOLIC)
    tilecast.analyze(model, "l4", dims={"batch": 2}, predictor="roofline")
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch"


def test_custom_domain_op_is_unsupported_not_zero():
    f = tilecast.analyze(onnx.parser.parse_model(CUSTOM), "l4", predictor="roofline")
    assert f.unsupported == {"com.example::MagicOp": 1}
    est = [k for k in f.kernels if k.kernel.cost.estimated]
    # bytes-only estimate: input h and output y, 4 x 32 float32 each
    assert len(est) == 1 and est[0].kernel.bytes == 2 * 4 * 32 * 4 and est[0].latency_ms > 0


def test_contrib_ops_get_shapes_and_costs():
    g = build_graph(onnx.parser.parse_model(CONTRIB))
    assert [n.outputs[0].shape for n in g.nodes] == [(2, 8, 64)] * 3
    f = tilecast.analyze(onnx.parser.parse_model(CONTRIB), "l4", predictor="roofline")
    assert f.unsupported == {}


def test_control_flow_is_reported_not_crashing():
    f = tilecast.analyze(onnx.parser.parse_model(LOOP), "l4", predictor="roofline")
    assert f.unsupported == {"Loop": 1}


def test_weights_never_read(gpt2_path):
    # The synthetic model's external weight file does not exist: loading must not need it.
    assert not (gpt2_path.parent / "weights.absent.bin").exists()
    model = load_model(gpt2_path)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


@pytest.mark.parametrize("content, match", [
    (None, "not found"),
    (b"this is not a protobuf at all \xff\xfe", "not a readable ONNX model|not an ONNX model"),
])
def test_bad_model_files(tmp_path, content, match):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=match):
        load_model(path)


def test_truncated_protobuf(tmp_path, gpt2_path):
    data = gpt2_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError):
        load_model(path)
