"""Pooling and resampling: windowed pools, global pools, Resize / Upsample.

Windowed pools do one op per tap of every output window: taps = output elements * kernel size
(strides, pads, dilations and ceil_mode only change the output size, which shape inference has
worked out). Padded taps are counted too: the kernels visit them.
"""

from __future__ import annotations

from dataclasses import replace

from ..registry import CostFn, register_all
from ..types import NativePool, NodeView, OpCost, RowDims
from .common import (
    attr_str,
    in_shape,
    io_bytes,
    out_shape,
    prod,
    require,
    require_nonempty,
    vector_cost,
)
from .sampling import interp_flops


def window_pool(flops_per_tap: int, flops_per_output: int = 0, native: bool = False) -> CostFn:
    """Factory: MaxPool (compare per tap), AveragePool (add per tap, divide per output),
    LpPool (|x|^p accumulate per tap, root per output). ``native``: a 2-D pool that PyTorch
    runs on its own NCHW kernel, one thread per output walking its taps (``analyzer.native``)."""

    def fn(node: NodeView) -> OpCost:
        kernel = node.attr("kernel_shape")
        require(node, bool(kernel), "kernel_shape is required")
        y = out_shape(node)
        require_nonempty(node, y)
        n = prod(y)
        flops = flops_per_tap * n * prod(kernel) + flops_per_output * n
        cost = vector_cost(node, "pooling", flops, io_bytes(node), elements=n)
        if native and len(kernel) == 2:
            return replace(cost, native=NativePool(n, prod(kernel)))
        return cost

    return fn


def global_pool(flops_per_element: int, flops_per_output: int = 0) -> CostFn:
    """Factory: GlobalXPool reduces each (n, c) plane: rows N*C of spatial cols."""

    def fn(node: NodeView) -> OpCost:
        x = in_shape(node, 0)
        rows = RowDims(x[0] * x[1], prod(x[2:]))
        flops = flops_per_element * prod(x) + flops_per_output * rows.rows
        return vector_cost(node, "pooling", flops, io_bytes(node), rows=rows)

    return fn


register_all(("MaxPool",), window_pool(1, native=True))
# ONNX Runtime's channels-last MaxPool: the same taps whatever the layout
register_all(("NhwcMaxPool",), window_pool(1), domain="com.microsoft")
register_all(("AveragePool",), window_pool(1, 1))
register_all(("LpPool",), window_pool(2, 1))
register_all(("GlobalMaxPool",), global_pool(1))
register_all(("GlobalAveragePool",), global_pool(1, 1))
register_all(("GlobalLpPool",), global_pool(2, 1))


def resize(node: NodeView) -> OpCost:
    """Per output element, the mode's interpolation (``sampling.interp_flops``) over the r
    resized dims (default nearest)."""
    x, y = in_shape(node, 0), out_shape(node)
    r = max(sum(1 for a, b in zip(x, y, strict=False) if a != b), 1)
    n = prod(y)
    flops = interp_flops(attr_str(node, "mode", "nearest"), r) * n
    return vector_cost(node, "pooling", flops, io_bytes(node), elements=n)


register_all(("Resize", "Upsample"), resize)
