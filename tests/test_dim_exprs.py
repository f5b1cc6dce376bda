"""Input dims named by an expression of other input dims (optimum's with-past decoders)."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer import dim_exprs
from tilecast.analyzer.graph import build_graph, graph_input_dims
from tilecast.errors import UnknownDimError

# A with-past step as optimum names it: the mask spans past + new tokens, and so does the
# key/value it concatenates; only batch, sequence and past_sequence_length are input dims.
WITH_PAST = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, sequence, 16] x, int64[batch, TOTAL] mask,
   float[batch, past_sequence_length, 16] past) => (float[batch, sequence, M] y) {
    kv = Concat <axis = 1> (past, x)
    kvt = Transpose <perm = [0, 2, 1]> (kv)
    y = MatMul (x, kvt)
    m = Cast <to = 1> (mask)
}
"""


def with_past(mask_dim: str = "past_sequence_length + sequence") -> onnx.ModelProto:
    """WITH_PAST with the mask's dim named ``mask_dim`` (ONNX's text syntax has no names with
    operators in them, so the name is set on the parsed model)."""
    model = onnx.parser.parse_model(WITH_PAST)
    for vi in model.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param == "TOTAL":
                d.dim_param = mask_dim
    return model


def test_expression_dims_are_derived_not_bound():
    model = with_past()
    assert graph_input_dims(model) == ("batch", "sequence", "past_sequence_length")


@pytest.mark.parametrize("past, sequence", [(127, 1), (0, 128), (16, 16)])
def test_expression_dims_take_their_value_from_the_bound_dims(past, sequence):
    graph = build_graph(with_past(),
                        {"batch": 2, "sequence": sequence, "past_sequence_length": past})
    shapes = {t.name: t.shape for n in graph.nodes for t in (*n.inputs, *n.outputs)}
    assert shapes["mask"] == (2, past + sequence)
    assert shapes["y"] == (2, sequence, past + sequence)


def test_a_with_past_graph_analyzes_complete():
    f = tilecast.analyze(with_past(), "l4",
                         dims={"batch": 1, "sequence": 1, "past_sequence_length": 127})
    assert (dict(f.unsupported), dict(f.unshaped), f.incomplete) == ({}, {}, False)


def test_the_expression_itself_is_not_an_input_dim():
    with pytest.raises(UnknownDimError, match="its input dims: batch, sequence, past_seq"):
        build_graph(with_past(), {"past_sequence_length + sequence": 3})


@pytest.mark.parametrize("name, plain", [
    ("seq-len", True),  # parts that are no input dims: a plain dim of its own
    ("past_sequence_length + 1", False),  # optimum's older name: one input dim plus one
    ("batch", True),
    ("a + 1.5", True),  # not integer arithmetic
    ("__import__('os')", True),  # calls are never evaluated
])
def test_which_names_are_expressions(name, plain):
    model = with_past(name)
    assert (name in graph_input_dims(model)) == plain


@pytest.mark.parametrize("name, value", [
    ("p + s", 8 + 3), ("p + 1", 9), ("(p - s) * 2", 10), ("p // s", 2)])
def test_evaluate(name, value):
    assert dim_exprs.evaluate((name,), {"p": 8, "s": 3})[name] == value


@pytest.mark.parametrize("name", ["s - p", "p // (s - s)", "q + 1", "(" * 500 + "p" + ")" * 500,
                                  "p +\x00 s"])
def test_no_size_stays_unbound(name):
    # a negative size, a division by zero, an unbound name, text too deep or not text at all
    assert name not in dim_exprs.evaluate((name,), {"p": 8, "s": 3})
