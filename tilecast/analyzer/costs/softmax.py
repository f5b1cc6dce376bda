"""Softmax, LogSoftmax, Hardmax: row kernels over the softmax axis; the two losses built on them.

The axis semantics changed at opset 13: before, the input is flattened to 2-D at ``axis``
(default 1) and each row spans every dim from ``axis`` on; from 13, rows run along the single
dim ``axis`` (default -1). Same FLOPs per element, different rows/cols -- two registrations.
"""

from __future__ import annotations

from ..registry import REGISTRY, CostFn
from ..types import NodeView, OpCost, RowDims
from .common import in_shape, io_bytes, norm_axis, prod, require, unique_bytes, vector_cost

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


def softmax_cross_entropy(node: NodeView) -> OpCost:
    """scores (N, C, d...), labels (N, d...) [, weights (C)] -> loss [, log_prob]: a log-softmax
    over the C classes of every (n, d...) position, then per position the label's log-prob
    picked, weighted and negated, and summed into the loss (3)."""
    x = in_shape(node, 0)
    require(node, len(x) >= 2, f"scores {list(x)} need a class dim")
    rows, cols = prod(x) // max(x[1], 1), x[1]
    return vector_cost(node, "softmax", LOG_SOFTMAX * rows * cols + 3 * rows, io_bytes(node),
                       rows=RowDims(rows, cols), dtype=node.inputs[0].dtype,
                       elements=rows * cols)


def negative_log_likelihood(node: NodeView) -> OpCost:
    """input (N, C, d...), target (N, d...) [, weight (C)] -> loss: per target element one
    log-prob gathered, weighted, negated and summed (3). Reads only the gathered elements."""
    target = in_shape(node, 1)
    picked = prod(target)
    gathered = int(picked * node.inputs[0].itemsize)
    rest = unique_bytes(node, (node.input(1), node.input(2), *node.outputs))
    return vector_cost(node, "gather", 3 * picked, gathered + rest,
                       dtype=node.inputs[0].dtype, elements=picked)


REGISTRY.register("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy)
REGISTRY.register("", "NegativeLogLikelihoodLoss", negative_log_likelihood)
