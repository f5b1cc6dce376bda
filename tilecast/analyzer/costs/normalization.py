"""Normalizations: row kernels with ``rows = elements / normalized size`` of ``cols`` each.

FLOPs per element (1 FMA = 2): mean 1 (add), variance 3 (subtract + FMA), normalize 2
(subtract mean, multiply by 1/std), scale 1, shift 1 -> LAYER_NORM = 8. RMS norms skip the mean
and shift: sum of squares 2 (FMA), multiply by 1/rms 1, scale 1 -> RMS_NORM = 4. Per-row work
(one sqrt and divide per row) is negligible and left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..registry import CostFn, register_all
from ..types import NativeBatchNorm, NodeView, OpCost, RowDims
from .common import (
    STATS_ITEMSIZE,
    has_input,
    in_shape,
    io_bytes,
    nbytes,
    norm_axis,
    out_shape,
    prod,
    require,
    unique_bytes,
    vector_cost,
)

MS = "com.microsoft"
LAYER_NORM = 8
RMS_NORM = 4
SKIP = 1  # the residual add of the Skip* variants
Layout = Callable[[NodeView], tuple[int, int]]  # node -> (rows, cols)


def _bytes(node: NodeView, rows: int) -> int:
    """Inputs + outputs once. Optional mean / inv-std outputs whose shape inference left unknown
    (com.microsoft ops) are per-row float32 stats."""
    out_shape(node)  # the main output must be known
    named = [t for t in node.outputs if t.name]
    known = [t for t in named if t.shape is not None and -1 not in t.shape]
    stats = len(named) - len(known)
    return unique_bytes(node, (*node.inputs, *known)) + stats * rows * STATS_ITEMSIZE


def norm_cost(node: NodeView, rows: int, cols: int, flops_per_element: int) -> OpCost:
    return vector_cost(node, "normalization", flops_per_element * rows * cols,
                       _bytes(node, rows), rows=RowDims(rows, cols))


def from_axis(default_axis: int) -> Layout:
    """Normalized over dims axis.. of input 0 (LayerNormalization-style)."""

    def layout(node: NodeView) -> tuple[int, int]:
        x = in_shape(node, 0)
        a = norm_axis(node, node.attr("axis", default_axis), len(x))
        return prod(x[:a]), prod(x[a:])

    return layout


def last_dim(node: NodeView) -> tuple[int, int]:
    x = in_shape(node, 0)
    return prod(x[:-1]), x[-1]


def normalization(layout: Layout, flops_per_element: int,
                  optional_inputs: tuple[int, ...] = ()) -> CostFn:
    """Factory. Each present optional input (skip, bias, shift) adds one add per element."""

    def fn(node: NodeView) -> OpCost:
        rows, cols = layout(node)
        extra = sum(1 for i in optional_inputs if has_input(node, i))
        return norm_cost(node, rows, cols, flops_per_element + extra)

    return fn


# LayerNormalization(X, Scale, B?): the shift B is optional, so the base excludes it.
register_all(("LayerNormalization",), normalization(from_axis(-1), LAYER_NORM - 1, (2,)))
register_all(("LayerNormalization",), normalization(from_axis(-1), LAYER_NORM - 1, (2,)),
             domain=MS)
register_all(("RMSNormalization", "SimplifiedLayerNormalization"),
             normalization(from_axis(-1), RMS_NORM))
register_all(("SimplifiedLayerNormalization",), normalization(from_axis(-1), RMS_NORM),
             domain=MS)
# SkipLayerNormalization(input, skip, gamma, beta?, bias?): skip add is always there.
register_all(("SkipLayerNormalization",),
             normalization(last_dim, LAYER_NORM - 1 + SKIP, (3, 4)), domain=MS)
# SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)
register_all(("SkipSimplifiedLayerNormalization",),
             normalization(last_dim, RMS_NORM + SKIP, (3,)), domain=MS)


EMBED_TABLES = (2, 3, 4)  # word, position, segment embedding inputs of (Q)EmbedLayerNormalization


def embed_layer_norm(node: NodeView) -> OpCost:
    """(Q)EmbedLayerNormalization: per token, the word, position and (optional) segment rows
    are gathered (each table read only at those rows), summed (one add per extra table) and
    layer-normalized. The mask index output is a per-sequence count, its work negligible."""
    ids, out = in_shape(node, 0), out_shape(node)
    rows, cols = prod(ids), out[-1]
    tables = [i for i in EMBED_TABLES if has_input(node, i)]
    gathered = sum(min(int(rows * cols * node.inputs[i].itemsize), nbytes(node, node.inputs[i]))
                   for i in tables)
    rest = [t for i, t in enumerate(node.inputs) if i not in tables]
    outs = [t for t in node.outputs if t.name]
    flops = (LAYER_NORM + len(tables) - 1) * rows * cols
    return vector_cost(node, "normalization", flops, gathered + unique_bytes(node, (*rest, *outs)),
                       rows=RowDims(rows, cols))


register_all(("EmbedLayerNormalization", "QEmbedLayerNormalization"), embed_layer_norm,
             domain=MS)


def batch_norm(node: NodeView) -> OpCost:
    """Inference folds scale, mean and var into one per-channel FMA (2 per element); training
    mode computes the batch statistics too (a full layer-norm pass per channel)."""
    x = in_shape(node, 0)
    channels = x[1] if len(x) > 1 else 1
    training = node.attr("training_mode", 0)
    cost = norm_cost(node, channels, prod(x) // max(channels, 1), LAYER_NORM if training else 2)
    if len(x) < 3:  # PyTorch's native NCHW kernels take 3-D and wider inputs
        return cost
    bn = NativeBatchNorm(x[0], channels, prod(x[2:]), "transform")
    return replace(cost, native=bn)


def instance_norm(node: NodeView) -> OpCost:
    x = in_shape(node, 0)
    return norm_cost(node, x[0] * x[1], prod(x[2:]), LAYER_NORM)


def group_norm(node: NodeView) -> OpCost:
    x, g = in_shape(node, 0), node.attr("num_groups")
    require(node, g is not None and g > 0 and x[1] % g == 0, f"bad num_groups={g}")
    return norm_cost(node, x[0] * g, prod(x) // (x[0] * g), LAYER_NORM)


def lp_norm(node: NodeView) -> OpCost:
    """x / ||x||_p along one axis: |x|^p accumulate (2, an FMA for p=2) and a divide."""
    x = in_shape(node, 0)
    a = norm_axis(node, node.attr("axis", -1), len(x))
    return norm_cost(node, prod(x) // max(x[a], 1), x[a], 3)


def mean_variance_norm(node: NodeView) -> OpCost:
    """(x - mean) / std over ``axes`` (default N, H, W): mean 1, variance 3, normalize 2."""
    x = in_shape(node, 0)
    axes = {norm_axis(node, a, len(x)) for a in node.attr("axes", [0, 2, 3])}
    cols = prod(x[a] for a in axes)
    return norm_cost(node, prod(x) // max(cols, 1), cols, 6)


register_all(("BatchNormalization",), batch_norm)
register_all(("InstanceNormalization",), instance_norm)
register_all(("GroupNormalization",), group_norm)
register_all(("LpNormalization",), lp_norm)
register_all(("MeanVarianceNormalization",), mean_variance_norm)


def local_response_norm(node: NodeView) -> OpCost:
    """LRN (AlexNet, GoogLeNet): y = x / (bias + alpha / size * sum of x^2 over ``size``
    neighbouring channels)^beta. Per element: the window's squares (an FMA each, 2 size), the
    scale and bias (an FMA, 2), the power (1) and the divide (1). Not a row kernel: each output
    reads a window across channels, so no row layout is claimed."""
    n = prod(in_shape(node, 0))
    size = node.attr("size")
    require(node, size is not None and size > 0, "size is required")
    return vector_cost(node, "normalization", (2 * size + 4) * n, io_bytes(node), elements=n)


register_all(("LRN",), local_response_norm)
