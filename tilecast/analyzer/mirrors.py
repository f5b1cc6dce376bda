"""ONNX Runtime contrib ops (com.microsoft) that compute what a standard op computes, give or
take a fused epilogue: their shapes come from the standard op's inference and their work from
its formula (``costs/contrib.py``).

ONNX Runtime's graph optimizers write them into saved models: ``FusedConv`` / ``FusedGemm``
(an activation fused after the Conv or Gemm), the QDQ-to-QLinear rewrites (``QLinearAdd``,
``QLinearConv``, ...) and com.microsoft copies of standard ops (``DequantizeLinear``, ``Range``,
``Trilu``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

MS = "com.microsoft"
ACTIVATION_ATTRS = frozenset({"activation", "activation_params", "activation_alpha",
                              "activation_beta", "activation_gamma", "activation_axis"})
QUANTIZED_ATTRS = frozenset({"channels_last"})


@dataclass(frozen=True)
class Mirror:
    """The standard op a contrib op mirrors: ``op_type`` at ``opset`` on inputs ``inputs`` (in
    that order), without the ``drop`` attributes. (Its epilogue's FLOPs are costs/contrib.py's.)
    """

    op_type: str
    inputs: tuple[int, ...]
    opset: int = 17
    drop: frozenset[str] = frozenset()
    variadic_from: int | None = None  # inputs from here on, every ``variadic_step``-th
    variadic_step: int = 1
    layout_attr: str = ""  # an attribute that, when non-zero, changes the layout: no mirror
    # Quantized data the standard op's type constraints refuse: infer on float copies of the
    # inputs, then give the output the type of input 0 (the quantized data type).
    retype: bool = False
    outputs: int = 1  # the outputs the standard op infers (the rest keep no shape)

    def proto(self, node: onnx.NodeProto) -> onnx.NodeProto | None:
        """The standard node (same name and outputs), or None where the layout differs. The
        attributes are copied as they are (not re-made from values: an empty list has no
        type to re-make it with)."""
        layout = next((a for a in node.attribute if a.name == self.layout_attr), None)
        if layout is not None and helper.get_attribute_value(layout):
            return None
        std = helper.make_node(self.op_type, self.input_names(node),
                               list(node.output[:self.outputs]), name=node.name)
        std.attribute.extend(a for a in node.attribute
                             if a.name not in self.drop and a.name != self.layout_attr)
        return std

    def input_names(self, node: onnx.NodeProto) -> list[str]:
        names = [node.input[i] if i < len(node.input) else "" for i in self.inputs]
        if self.variadic_from is not None:
            names += list(node.input[self.variadic_from::self.variadic_step])
        while names and not names[-1]:
            names.pop()
        return names


def _qlinear(op: str, inputs: tuple[int, ...], opset: int = 13) -> Mirror:
    """A QLinear op on uint8 / int8 data; with ``channels_last`` set the layout is NHWC: no
    mirror."""
    return Mirror(op, inputs, opset=opset, drop=QUANTIZED_ATTRS, layout_attr="channels_last",
                  retype=True)


MIRRORS: dict[tuple[str, str], Mirror] = {
    (MS, "FusedConv"): Mirror("Conv", (0, 1, 2), drop=ACTIVATION_ATTRS),
    (MS, "FusedGemm"): Mirror("Gemm", (0, 1, 2), drop=ACTIVATION_ATTRS),
    (MS, "QLinearConv"): Mirror("QLinearConv", tuple(range(9)), drop=QUANTIZED_ATTRS,
                                layout_attr="channels_last"),
    (MS, "QGemm"): Mirror("Gemm", (0, 3, 6), retype=True),
    (MS, "MatMulInteger16"): Mirror("MatMulInteger", (0, 1)),
    (MS, "DynamicQuantizeMatMul"): Mirror("MatMul", (0, 1)),
    (MS, "GemmFastGelu"): Mirror("MatMul", (0, 1)),
    (MS, "QLinearAdd"): _qlinear("Add", (0, 3)),
    (MS, "QLinearMul"): _qlinear("Mul", (0, 3)),
    (MS, "QLinearSigmoid"): _qlinear("Sigmoid", (0,)),
    (MS, "QLinearLeakyRelu"): _qlinear("LeakyRelu", (0,)),
    (MS, "QLinearAveragePool"): _qlinear("AveragePool", (0,)),
    (MS, "QLinearGlobalAveragePool"): _qlinear("GlobalAveragePool", (0,)),
    (MS, "QLinearSoftmax"): Mirror("Softmax", (0,), opset=13, drop=frozenset({"opset"}),
                                   retype=True),
    (MS, "QLinearWhere"): _qlinear("Where", (0, 1, 4)),
    (MS, "QLinearReduceMean"): _qlinear("ReduceMean", (0,)),
    (MS, "QLinearConcat"): Mirror("Concat", (), opset=13, variadic_from=2, variadic_step=3,
                                  retype=True),
    (MS, "MulInteger"): Mirror("Mul", (0, 2)),
    (MS, "ReduceSumInteger"): Mirror("ReduceSum", (0,), opset=11),
    (MS, "TorchEmbedding"): Mirror("Gather", (0, 1)),
    (MS, "ComplexMul"): Mirror("Mul", (0, 1)),
    (MS, "ComplexMulConj"): Mirror("Mul", (0, 1)),
    **{(MS, op): Mirror(op, (0, 1, 2), opset=opset) for op, opset in (
        ("DequantizeLinear", 13), ("QuantizeLinear", 13), ("Range", 13), ("Trilu", 14),
        ("GatherND", 13), ("GridSample", 16), ("Pad", 13))},
    # softmax(data + bias): rows from ``axis`` on (flattened, as Softmax before opset 13)
    (MS, "BiasSoftmax"): Mirror("Softmax", (0,), opset=11,
                                drop=frozenset({"is_inner_broadcast"})),
    (MS, "SwiGLU"): Mirror("Mul", (0, 1), drop=frozenset(
        {"activation_alpha", "activation_beta", "limit", "round_activation"})),
    (MS, "ScaledSiLU"): Mirror("Mul", (0, 1), drop=frozenset({"alpha"})),
    # ONNX's LinearAttention (opset 27) with a sliding state window the standard op lacks
    (MS, "LinearAttention"): Mirror("LinearAttention", (0, 1, 2, 3, 4, 5), opset=27,
                                    drop=frozenset({"state_window"}), outputs=2),
}


def mirror_of(domain: str, op_type: str) -> Mirror | None:
    return MIRRORS.get((domain, op_type))
