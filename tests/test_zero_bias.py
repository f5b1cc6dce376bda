"""A conv's all-zero bias initializer (torch.onnx's ``bias=False``) is read as no bias
(analyzer/zero_bias.py), kept inline, dropped by the weightless reader, or in an external file."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import helper, numpy_helper

import tilecast
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.analyzer.weightless import ZEROS_TAG

CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 64, 28, 28] x) => (float[8, 64, 28, 28] y)
    <float[64, 64, 3, 3] w = {0.0}, float[64] b = {BIAS}> {
  y = Conv <pads = [1, 1, 1, 1]> (x, w, b)
}"""
ZERO, ONE = "0.0", "1.0"


def _conv(bias: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(CONV.replace("{BIAS}", "{0.0}"))
    b = next(t for t in model.graph.initializer if t.name == "b")
    b.CopyFrom(numpy_helper.from_array(np.full(64, float(bias), np.float32), "b"))
    return model


def _conv_inputs(model: onnx.ModelProto) -> list[str]:
    node = next(n for n in build_graph(load_model(model)).nodes if n.op_type == "Conv")
    return [t.name for t in node.inputs if t is not None]


@pytest.mark.parametrize("bias,inputs", [(ZERO, ["x", "w"]), (ONE, ["x", "w", "b"])])
def test_a_zero_conv_bias_is_no_input(bias, inputs):
    assert _conv_inputs(_conv(bias)) == inputs


def test_a_bias_whose_data_do_not_fill_it_stays():
    # the text parser's one value for 64 channels: malformed, no evidence of zeros, no crash
    assert _conv_inputs(onnx.parser.parse_model(CONV.replace("{BIAS}", "{0.0}"))) == [
        "x", "w", "b"]


def test_a_zero_bias_a_graph_input_may_override_stays():
    model = _conv(ZERO)
    model.graph.input.append(helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [64]))
    assert _conv_inputs(model) == ["x", "w", "b"]


def test_a_gemms_zero_bias_stays():
    # a linear layer's bias may be zero by initialization, and PyTorch runs it
    model = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 64] x) => (float[8, 64] y) <float[64, 64] w = {0.0}, float[64] c = {0.0}> {
  y = Gemm(x, w, c)
}""")
    node = build_graph(load_model(model)).nodes[0]
    assert [t.name for t in node.inputs] == ["x", "w", "c"]


# 2,048 channels: 8 kB of fp32, past the reader's 4 kB, so its bytes are dropped.
WIDE = CONV.replace("64, 28, 28] y", "2048, 28, 28] y").replace("[64, 64, 3, 3] w",
                                                                "[2048, 64, 3, 3] w")


@pytest.mark.parametrize("value,tagged", [(0.0, True), (1e-30, False)])
def test_the_reader_tags_a_dropped_vector_of_zeros(tmp_path, value, tagged):
    model = onnx.parser.parse_model(WIDE.replace("{BIAS}", "{0.0}").replace(
        "float[64] b", "float[2048] b"))
    b = next(t for t in model.graph.initializer if t.name == "b")
    b.CopyFrom(numpy_helper.from_array(np.full(2048, value, np.float32), "b"))
    path = tmp_path / "wide.onnx"
    onnx.save(model, path)
    loaded = load_model(path)
    kept = next(t for t in loaded.graph.initializer if t.name == "b")
    assert not kept.raw_data  # dropped, with what it held as a tag
    assert (kept.doc_string == ZEROS_TAG) is tagged
    assert ("b" in _conv_inputs(loaded)) is not tagged


def test_an_external_zero_bias_is_read_from_its_file(tmp_path):
    model = _conv(ZERO)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    assert _conv_inputs(load_model(path)) == ["x", "w"]
    (tmp_path / "ext.data").unlink()  # no file: no evidence of zeros, the bias stays
    assert _conv_inputs(load_model(path)) == ["x", "w", "b"]


def test_autocast_casts_no_zero_bias():
    # eager amp-fp16: x and w are cast to half; a real bias is a third cast, a zero one none
    casts = {bias: sum(k.kernel.op_type == "Cast" for k in tilecast.analyze(
        _conv(bias), "a100-sxm4-40gb", math="amp-fp16").kernels) for bias in (ZERO, ONE)}
    assert casts == {ZERO: 2, ONE: 3}


def test_a_zero_bias_costs_what_no_bias_costs():
    no_bias = onnx.parser.parse_model(CONV.replace(", float[64] b = {BIAS}", "").replace(
        "(x, w, b)", "(x, w)"))
    a, b = (tilecast.analyze(m, "t4", predictor="roofline") for m in (_conv(ZERO), no_bias))
    assert (a.kernels[0].kernel.flops, a.kernels[0].kernel.bytes, a.total_ms) == (
        b.kernels[0].kernel.flops, b.kernels[0].kernel.bytes, b.total_ms)
