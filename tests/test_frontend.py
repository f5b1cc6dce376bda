"""The front end: shapes derived from the input dims alone, exporter guesses discarded, weights
never read, and forecasts that complete (``unshaped``) where a shape cannot be known."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import tilecast
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.cli import main
from tilecast.errors import ShapeError, UnknownDimError

# Host-side shape arithmetic as exporters write it. The value_info is what the legacy exporter
# and ORT's quantizer leave: anonymous (unk__) and wrong; tilecast must derive its own.
ARITH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 8] x) => (float[batch, seq, 8] y, float[batch, seq8] r)
  <float[unk__0, 8] pos, float[unk__1] rng, int64[unk__2] flat> {
  shp = Shape(x)
  one = Constant<value = int64[1] {1}>()
  two = Constant<value = int64[1] {2}>()
  zero = Constant<value = int64[1] {0}>()
  s = Slice(shp, one, two)
  table = Constant<value = float[64, 8] {0.0}>()
  pos = Slice(table, zero, s)
  y = Add(x, pos)
  lim = Squeeze(s)
  z0 = Constant<value = int64 {0}>()
  z1 = Constant<value = int64 {1}>()
  rng = Range(z0, lim, z1)
  b = Gather<axis = 0>(shp, zero)
  minus = Constant<value = int64[1] {-1}>()
  flat = Concat<axis = 0>(b, minus)
  r = Reshape(x, flat)
}"""
DIMS = {"batch": 2, "seq": 5}

# NonZero's output length depends on the data: nothing after it can be shaped.
DATA_DEPENDENT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 3] x, float[3, 8] w) => (int64 t, float[4, 8] m) {
  nz = NonZero(x)
  t = Transpose(nz)
  h = Relu(x)
  m = MatMul(h, w)
}"""


def _shapes(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, tuple[int, ...] | None]:
    g = build_graph(model, dims)
    return {t.name: t.shape for n in g.nodes for t in (*n.inputs, *n.outputs) if t is not None}


@pytest.mark.parametrize(("value", "shape"), [
    ("s", (1,)),  # Shape[1:2] = [seq]
    ("pos", (5, 8)),  # table[0:seq]: the exporter's [unk__0, 8] is ignored
    ("rng", (5,)),  # Range(0, seq, 1)
    ("flat", (2,)),  # [batch, -1]
    ("r", (2, 40)),  # x reshaped to [batch, -1]: 5 * 8 = 40
    ("y", (2, 5, 8)),
])
def test_shapes_derived_from_input_dims(value, shape):
    assert _shapes(onnx.parser.parse_model(ARITH), DIMS)[value] == shape


def test_unknown_dim_lists_the_graph_input_dims():
    with pytest.raises(UnknownDimError, match=r"'sequence'.*input dims: batch, seq"):
        build_graph(onnx.parser.parse_model(ARITH), {"batch": 2, "sequence": 5})


def test_unbound_error_asks_only_for_input_dims():
    with pytest.raises(ShapeError) as err:
        tilecast.analyze(onnx.parser.parse_model(ARITH), "l4", predictor="roofline")
    msg = str(err.value)
    assert "--dim batch=VALUE --dim seq=VALUE" in msg and "unk__" not in msg


def test_unshaped_nodes_are_counted_and_the_forecast_completes():
    f = tilecast.analyze(onnx.parser.parse_model(DATA_DEPENDENT), "l4", predictor="roofline")
    assert dict(f.unshaped) == {"NonZero": 1, "Transpose": 1}
    assert f.incomplete and not f.unsupported
    assert {"MatMul", "Relu"} <= {k.kernel.op_type for k in f.kernels if k.kernel.family not in
                                  ("unshaped", "unsupported")}
    data = json.loads(f.to_json())
    assert (data["unshaped"], data["incomplete"]) == ({"NonZero": 1, "Transpose": 1}, True)
    assert tilecast.Forecast.from_json(f.to_json()).unshaped == f.unshaped
    # NonZero is where the shapes stop (its input is known; -1: the data-dependent count);
    # Transpose only inherits it. Unnamed nodes are named by op type and position.
    assert f.unshaped_from == "'NonZero_0' (NonZero, shapes ([4, 3]) -> ([2, -1]))"
    assert tilecast.Forecast.from_json(f.to_json()).unshaped_from == f.unshaped_from


# A loop unrolled at trace time: the exporter wrote the traced length (4) as a constant, so
# binding seq to anything else gives an Add whose inputs do not broadcast.
TRACED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq] x, float[batch, 4] h) => (float[batch, seq] y) {
  a = Add(x, h)
  y = Relu(a)
}"""


@pytest.mark.parametrize(("seq", "stopped"), [
    (4, ""),  # the traced size: every shape is known
    (9, "'Add_0' (Add, shapes ([2, 9], [2, 4]) -> (?))"),  # 9 and 4 do not broadcast
])
def test_unshaped_names_where_the_shapes_stop(seq, stopped):
    f = tilecast.analyze(onnx.parser.parse_model(TRACED), "l4", dims={"batch": 2, "seq": seq},
                         predictor="roofline")
    assert f.unshaped_from == stopped and bool(f.unshaped) == bool(stopped)


@pytest.fixture
def data_dependent_path(tmp_path):
    path = tmp_path / "dd.onnx"
    onnx.save(onnx.parser.parse_model(DATA_DEPENDENT), path)
    return path


@pytest.mark.parametrize("fmt, shown", [
    ("table", "unshaped ops: NonZero x1, Transpose x1"),
    ("table", "(first stopped at 'NonZero_0' (NonZero, shapes ([4, 3]) -> ([2, -1])))"),
    ("markdown", "unshaped ops: NonZero x1, Transpose x1"),
    ("csv", ",unshaped,"),
    ("json", '"unshaped": {'),
    ("json", '"unshaped_from": "\'NonZero_0\' (NonZero'),
])
def test_unshaped_shown_in_every_format(data_dependent_path, fmt, shown):
    r = CliRunner().invoke(main, ["analyze", str(data_dependent_path), "-d", "l4",
                                  "--predictor", "roofline", "--format", fmt])
    assert r.exit_code == 0 and shown in r.output


def test_strict_fails_an_incomplete_forecast_with_one_error_line(data_dependent_path):
    r = CliRunner().invoke(main, ["analyze", str(data_dependent_path), "-d", "l4",
                                  "--predictor", "roofline", "--strict"])
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert r.exit_code == 2 and len(errors) == 1
    assert "0 unsupported and 2 unshaped" in errors[0] and "stop at 'NonZero_0'" in errors[0]


def test_cli_unknown_dim_is_one_error_line(tmp_path):
    path = tmp_path / "arith.onnx"
    onnx.save(onnx.parser.parse_model(ARITH), path)
    r = CliRunner().invoke(main, ["analyze", str(path), "-d", "l4", "--dim", "batch=2",
                                  "--dim", "sequence=5"])
    assert r.exit_code == 2 and r.output.count("Error:") == 1 and "batch, seq" in r.output


def _with_weights(path) -> None:
    big = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")  # 16 KiB: a weight
    shape = numpy_helper.from_array(np.array([4, 64], np.int64), "shape")  # kept: arithmetic
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.ones((32, 64), np.float32)))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), const,
             helper.make_node("Add", ["h", "c"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "w", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [big, shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_weight_bytes_are_never_loaded(tmp_path):
    path = tmp_path / "weights.onnx"
    _with_weights(path)
    model = load_model(path)
    w, shape = model.graph.initializer
    assert (list(w.dims), w.raw_data, list(w.float_data)) == ([64, 64], b"", [])
    assert numpy_helper.to_array(shape).tolist() == [4, 64]
    value = model.graph.node[1].attribute[0].t
    assert (list(value.dims), value.raw_data) == ([32, 64], b"")
    # the Reshape target was kept, so the output shape is derived: (32, 64) -> [4, 64]... of
    # n = 32 rows: 32 * 64 elements = 4 * 512, so the kept target must be used as given
    shapes = _shapes(model, {"n": 32})
    assert (shapes["h"], shapes["a"], shapes["y"]) == ((32, 64), (32, 64), (4, 64))


def test_in_memory_model_is_stripped_not_modified(tmp_path):
    path = tmp_path / "weights.onnx"
    _with_weights(path)
    model = onnx.load(path)
    before = model.SerializeToString()
    stripped = load_model(model)
    assert stripped.graph.initializer[0].raw_data == b""
    assert model.SerializeToString() == before


# BiasSplitGelu has no tilecast shape rule; onnxruntime's symbolic shape inference knows it.
ORT_ONLY = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1]>
g (float[batch, 4, 16] x, float[16] b) => (float[batch, 4, 8] y) {
  h = com.microsoft.BiasSplitGelu(x, b)
  y = Relu(h)
}"""


def test_onnxruntime_symbolic_inference_is_the_fallback():
    shapes = _shapes(onnx.parser.parse_model(ORT_ONLY), {"batch": 2})
    assert shapes["h"] == (2, 4, 8)  # (N, S, D / 2)


def test_named_stats_outputs_of_fused_norms_are_shaped():
    # ORT-optimized graphs may name SkipLayerNormalization's mean / inv-std outputs: one value
    # per row, (2, 8, 1) here; the residual sum (output 3) has the input's shape
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1]>
    g (float[2, 8, 64] x, float[2, 8, 64] s, float[64] gamma, float[64] beta)
      => (float[2, 8, 64] y, float[2, 8, 64] total) {
      y, mean, inv, total = com.microsoft.SkipLayerNormalization(x, s, gamma, beta)
    }""")
    shapes = _shapes(model, {})
    assert (shapes["mean"], shapes["inv"], shapes["total"]) == ((2, 8, 1), (2, 8, 1), (2, 8, 64))
    assert not tilecast.analyze(model, "l4", predictor="roofline").incomplete


def test_anonymous_name_on_a_graph_input_can_be_bound():
    # discarding unk__ dims applies to value_info; on a graph input the name is the input's own
    text = ARITH.replace("float[batch, seq, 8] x)", "float[unk__7, seq, 8] x)")
    model = onnx.parser.parse_model(text)
    assert _shapes(model, {"unk__7": 2, "seq": 5})["r"] == (2, 40)


# T5's relative-position buckets, shortened: log(|i - j| / 8) is -inf on the diagonal and NaN
# after the cast to int64, values a Where then discards. Evaluating them on the host is right;
# numpy's warnings about them reached the user's terminal.
BUCKETS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq] x) => (int64[seq, seq] b) {
  shp = Shape(x)
  one = Constant<value = int64[1] {1}>()
  two = Constant<value = int64[1] {2}>()
  s = Slice(shp, one, two)
  lim = Squeeze(s)
  z0 = Constant<value = int64 {0}>()
  z1 = Constant<value = int64 {1}>()
  pos = Range(z0, lim, z1)
  col = Unsqueeze(pos, one)
  rel = Sub(col, pos)
  dist = Abs(rel)
  f = Cast<to = 1>(dist)
  eight = Constant<value = float {8.0}>()
  scaled = Div(f, eight)
  lg = Log(scaled)
  big = Cast<to = 7>(lg)
  eight_i = Constant<value = int64 {8}>()
  small = Less(dist, eight_i)
  b = Where(small, dist, big)
}"""


def test_host_arithmetic_with_infinities_is_silent(recwarn):
    graph = build_graph(onnx.parser.parse_model(BUCKETS), {"batch": 1, "seq": 16})
    shapes = {t.name: t.shape for n in graph.nodes for t in n.outputs}
    assert shapes["b"] == (16, 16)
    assert [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)] == []


def test_an_unsupported_op_can_be_where_the_shapes_stop():
    # nothing infers a foreign-domain op: the Relu after it is unshaped, and the root named is
    # the unsupported op itself
    text = """<ir_version: 8, opset_import: ["" : 17, "acme" : 1]>
g (float[2,8] x) => (y) {
  a = acme.Mystery(x)
  y = Relu(a)
}"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    assert dict(f.unshaped) == {"Relu": 1}
    assert f.unshaped_from == "'Mystery_0' (Mystery, unsupported, shapes ([2, 8]) -> (?))"


EXPAND = """<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[2,8] x, int32 given) => (y) {
  ax = Constant<value = int32 {-1}>()
  e = com.microsoft.ExpandDims(x, AXIS)
  y = Relu(e)
}"""


def test_expand_dims_reads_its_axis_on_the_host():
    # ORT's ExpandDims is a view whose axis is an input: a constant one is read (-1: last)
    f = tilecast.analyze(onnx.parser.parse_model(EXPAND.replace("AXIS", "ax")), "l4",
                         predictor="roofline")
    assert not f.incomplete and f.kernels[0].kernel.cost.elements == 16


def test_a_view_nothing_infers_can_be_where_the_shapes_stop():
    # the axis a graph input: nothing can shape the view, and it is named as the root
    f = tilecast.analyze(onnx.parser.parse_model(EXPAND.replace("AXIS", "given")), "l4",
                         predictor="roofline")
    assert f.unshaped_from == "'ExpandDims_1' (ExpandDims, no kernel, shapes ([2, 8], []) -> (?))"
