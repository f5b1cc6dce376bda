"""Softmax, LogSoftmax, Hardmax: row kernels over the softmax axis.

The axis semantics changed at opset 13: before, the input is flattened to 2-D at ``axis``
(default 1) and each row spans every dim from ``axis`` on; from 13, rows run along the single
dim ``axis`` (default -1). Same FLOPs per element, different rows/cols -- two registrations.
"""

from __future__ import annotations

from ..registry import REGISTRY, CostFn
from ..types import NodeView, OpCost, RowDims
from .common import in_shape, io_bytes, norm_axis, prod, vector_cost

SOFTMAX = 5  # max, subtract, exp, sum, divide (by the row sum)
LOG_SOFTMAX = 5  # max, subtract, exp, sum, subtract log(sum)
HARDMAX = 1  # one compare per element to find the row's argmax


def _rows_flattened(node: NodeView) -> tuple[int, int]:  # opset < 13
    x = in_shape(node, 0)
    a = norm_axis(node, node.attr("axis", 1), len(x))
    return prod(x[:a]), prod(x[a:])


def _rows_along_axis(node: NodeView) -> tuple[int, int]:  # opset >= 13
    x = in_shape(node, 0)
    a = norm_axis(node, node.attr("axis", -1), len(x))
    return prod(x) // max(x[a], 1), x[a]


def softmax_like(flops_per_element: int, *, opset13: bool) -> CostFn:
    layout = _rows_along_axis if opset13 else _rows_flattened

    def fn(node: NodeView) -> OpCost:
        rows, cols = layout(node)
        return vector_cost(node, "softmax", flops_per_element * rows * cols, io_bytes(node),
                           rows=RowDims(rows, cols))

    return fn


for _op, _flops in (("Softmax", SOFTMAX), ("LogSoftmax", LOG_SOFTMAX), ("Hardmax", HARDMAX)):
    REGISTRY.register("", _op, softmax_like(_flops, opset13=False), until=12)
    REGISTRY.register("", _op, softmax_like(_flops, opset13=True), since=13)
