"""Sampling at computed coordinates: GridSample, AffineGrid, RoiAlign, MaxRoiPool, MaxUnpool.

Each output element interpolates a few taps of its input, at coordinates the kernel computes.
The taps are gathered: bytes count the tap reads up to the whole input once (repeats hit in
cache; unique DRAM bytes), plus every other input and the output. Where the work depends on
values the graph does not carry (the extent of a region of interest), the docstring says what
is assumed.
"""

from __future__ import annotations

from ..registry import register_all
from ..types import NodeView, OpCost
from .common import (
    attr_str,
    in_shape,
    io_bytes,
    nbytes,
    out_shape,
    prod,
    require,
    unique_bytes,
    vector_cost,
)


def interp_taps(mode: str, r: int) -> int:
    """Taps per output element of an r-D interpolation: nearest 1, linear 2^r, cubic 4^r."""
    return {"linear": 2**r, "bilinear": 2**r, "cubic": 4**r, "bicubic": 4**r}.get(mode, 1)


def interp_flops(mode: str, r: int) -> int:
    """FLOPs per output element: nearest copies one tap (1); linear blends 2^r taps with
    2^r - 1 lerps of 3 FLOPs (subtract + FMA); cubic weights 4^r taps (an FMA each)."""
    if mode in ("linear", "bilinear"):
        return 3 * (2**r - 1)
    return 2 * 4**r if mode in ("cubic", "bicubic") else 1


def _gathered(node: NodeView, taps: int) -> int:
    """Bytes of ``taps`` reads of input 0's elements: at most input 0 once."""
    x = node.inputs[0]
    return min(int(taps * x.itemsize), nbytes(node, x))


def grid_sample(node: NodeView) -> OpCost:
    """X (N, C, *in), grid (N, *out, r) -> Y (N, C, *out). Per output element the mode's
    taps (default linear: opset 16 "bilinear", 20 "linear"); per output position, r grid
    coordinates unnormalized by an FMA each (2 r), shared by the C channels (PyTorch's kernel
    loops over channels inside one thread per position)."""
    x, grid, y = in_shape(node, 0), in_shape(node, 1), out_shape(node)
    r = len(x) - 2
    require(node, r >= 1 and len(grid) == r + 2, f"grid {list(grid)} does not fit X {list(x)}")
    mode = attr_str(node, "mode", "linear")
    n, positions = prod(y), prod(grid[:-1])
    taps = n * interp_taps(mode, r)
    flops = n * interp_flops(mode, r) + 2 * r * positions
    rest = unique_bytes(node, (node.input(1), node.outputs[0]))
    return vector_cost(node, "pooling", flops, _gathered(node, taps) + rest, elements=n)


def affine_grid(node: NodeView) -> OpCost:
    """theta (N, r, r + 1), size -> grid (N, *out, r). Per output position: r base
    coordinates (an FMA each on a linspace, 2 r), then r outputs of r FMAs and an add
    (r (2 r + 1))."""
    grid = out_shape(node)
    r = grid[-1]
    positions = prod(grid[:-1])
    return vector_cost(node, "pooling", positions * (2 * r + r * (2 * r + 1)), io_bytes(node),
                       elements=prod(grid))


# sampling_ratio 0 means adaptive: ceil(roi size / output size) per ROI, which depends on the
# ROI coordinates (data). 2 is what torchvision's Mask R-CNN pooler passes.
ADAPTIVE_SAMPLES = 2


def roi_align(node: NodeView) -> OpCost:
    """X (N, C, H, W), rois (R, 4), batch_indices (R) -> Y (R, C, oh, ow). Each output bin
    averages (or takes the max of) s x s bilinear samples (4 taps, 3 lerps of 3 FLOPs, and
    one accumulate: 10 FLOPs each), then divides once; s = sampling_ratio (0: adaptive,
    taken as ``ADAPTIVE_SAMPLES``)."""
    y = out_shape(node)
    s = node.attr("sampling_ratio", 0) or ADAPTIVE_SAMPLES
    n = prod(y)
    samples = n * s * s
    rest = unique_bytes(node, (node.input(1), node.input(2), node.outputs[0]))
    return vector_cost(node, "pooling", samples * 10 + n, _gathered(node, 4 * samples) + rest,
                       elements=n)


def max_roi_pool(node: NodeView) -> OpCost:
    """X (N, C, H, W), rois (R, 5) -> Y (R, C, ph, pw): each bin takes the max over its part
    of the ROI. ROI extents are data; the formula takes each ROI as the whole feature map, so
    its bins together compare H x W taps per (ROI, channel): an upper bound (proposals are
    mostly smaller). Tap reads count up to X once."""
    x, y = in_shape(node, 0), out_shape(node)
    taps = y[0] * y[1] * prod(x[2:])
    rest = unique_bytes(node, (node.input(1), node.outputs[0]))
    return vector_cost(node, "pooling", taps, _gathered(node, taps) + rest, elements=prod(y))


def max_unpool(node: NodeView) -> OpCost:
    """X, I (N, C, *in) [, output_shape] -> Y (N, C, *out): Y is zero-filled and each X
    element written at its index. No arithmetic; X, I and Y once (unique bytes; the scatter
    rewrites elements the fill wrote)."""
    return vector_cost(node, "pooling", 0, io_bytes(node))


register_all(("GridSample",), grid_sample)
register_all(("AffineGrid",), affine_grid)
register_all(("RoiAlign",), roi_align)
register_all(("MaxRoiPool",), max_roi_pool)
register_all(("MaxUnpool",), max_unpool)
