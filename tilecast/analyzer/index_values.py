"""Constant index arithmetic read symbolically: splats and affine integer grids.

Exporters build position and index tensors from ``arange`` through views, broadcasts,
slices, concatenations, transposes and gathers (transformers' vmap-style masks index a
position vector with stacked ``arange`` grids). Such a value is an affine function of its
element's indices, ``offset + sum(coefs[a] * i[a])``, whatever its size, so it is tracked
as that function (``Affine``), never materialized. A rule returns None when its result is
not of a tracked form; the value is then unknown. ``causal.py`` compares two such grids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .types import NodeView
from .weightless import has_data

GRID_ELEMENTS = 1 << 20  # a grid initializer is a position vector; larger constants are not read
VECTOR_ELEMENTS = 64  # a shape has one element per dim


@dataclass(frozen=True)
class Uniform:
    """Every element equals ``value`` (a splat constant)."""

    value: float


@dataclass(frozen=True)
class Affine:
    """Integers ``offset + sum(coefs[a] * i[a])``, one coefficient per axis of the value
    (0 on every size-1 axis, at least one not 0): ``arange`` and what is derived from it."""

    offset: int
    coefs: tuple[int, ...]


@dataclass(frozen=True)
class Stack:
    """Index tuples along the last axis (GatherND's indices): component j is ``parts[j]``,
    a function of the other axes."""

    parts: tuple[Uniform | Affine, ...]


@dataclass(frozen=True)
class Vector:
    """A short 1-D integer constant that is neither a splat nor a grid: a shape."""

    values: tuple[int, ...]


Rule = Callable[[NodeView, Sequence[object]], object]


def make(offset: int, coefs: Sequence[int], shape: Sequence[int] | None) -> Uniform | Affine | None:
    """The value ``offset + coefs . i`` over ``shape``: a coefficient on a size-1 axis is
    meaningless and dropped; none left is a splat."""
    if shape is None or len(coefs) != len(shape) or not all(isinstance(d, int) for d in shape):
        return None
    kept = tuple(c if d > 1 else 0 for c, d in zip(coefs, shape, strict=True))
    return Affine(offset, kept) if any(kept) else Uniform(float(offset))


def as_affine(v: object, rank: int) -> Affine | None:
    """An integer splat or grid as an Affine of ``rank`` axes (broadcast from the right)."""
    if isinstance(v, Uniform) and float(v.value).is_integer():
        return Affine(int(v.value), (0,) * rank)
    if isinstance(v, Affine) and len(v.coefs) <= rank:
        return Affine(v.offset, (0,) * (rank - len(v.coefs)) + v.coefs)
    return None


def read_array(t: onnx.TensorProto) -> np.ndarray | None:
    """A kept tensor's values (None: stripped, external, over ``GRID_ELEMENTS`` or unreadable)."""
    if not has_data(t) or int(np.prod(t.dims)) > GRID_ELEMENTS:
        return None
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError):
        return None


def constant(t: onnx.TensorProto) -> Uniform | Affine | Vector | None:
    """A splat, or an integer initializer that is an affine grid (checked element-wise)."""
    return of_array(read_array(t))


def of_array(a: np.ndarray | None) -> Uniform | Affine | Vector | None:
    """A splat of any dtype, or an integer grid or short vector."""
    if a is None or a.size == 0:
        return None
    flat = a.reshape(-1)
    if np.all(flat == flat[0]):
        return Uniform(float(flat[0]))
    return _grid_or_vector(a) if np.issubdtype(a.dtype, np.integer) else None


def _grid_or_vector(a: np.ndarray) -> Uniform | Affine | Vector | None:
    flat = a.reshape(-1)
    if np.all(flat == flat[0]):
        return Uniform(float(flat[0]))
    base = int(flat[0])
    coefs = [int(a[tuple(int(i == ax) for i in range(a.ndim))]) - base if d > 1 else 0
             for ax, d in enumerate(a.shape)]
    grid = np.full(a.shape, base, dtype=np.int64)
    for ax, c in enumerate(coefs):
        grid = grid + c * np.arange(a.shape[ax]).reshape([-1 if i == ax else 1
                                                         for i in range(a.ndim)])
    if np.array_equal(a, grid):
        return make(base, coefs, a.shape)
    return Vector(tuple(int(x) for x in flat)) if a.ndim == 1 and a.size <= VECTOR_ELEMENTS \
        else None


def _shapes(node: NodeView) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    first = node.inputs[0] if node.inputs else None
    return (first.shape if first is not None else None), node.outputs[0].shape


def view(node: NodeView, args: Sequence[object]) -> object:
    """Reshape, Unsqueeze, Squeeze, Identity, Cast: a grid's coefficients follow its wide
    (size > 1) dims while those stay the same dims in the same order."""
    x = args[0]
    if isinstance(x, Uniform) and node.op_type == "Cast" and node.attr("to") is not None:
        dtype = helper.tensor_dtype_to_np_dtype(int(node.attr("to")))
        return Uniform(float(np.array(x.value).astype(dtype)))
    if not isinstance(x, Affine) or (node.op_type == "Cast"
                                     and node.attr("to") == onnx.TensorProto.BOOL):
        return x if isinstance(x, Uniform) else None  # a grid cast to bool is not a grid
    ins, out = _shapes(node)
    if ins is None or out is None or len(ins) != len(x.coefs):
        return None
    wide_in = [(d, c) for d, c in zip(ins, x.coefs, strict=True) if d > 1]
    wide_out = [i for i, d in enumerate(out) if d > 1]
    if [d for d, _ in wide_in] != [out[i] for i in wide_out]:
        return None
    coefs = [0] * len(out)
    for (_, c), i in zip(wide_in, wide_out, strict=True):
        coefs[i] = c
    return make(x.offset, coefs, out)


def expand(node: NodeView, args: Sequence[object]) -> object:
    """Broadcast: the grid is right-aligned into the output's rank, new axes constant."""
    x, out = args[0], node.outputs[0].shape
    if isinstance(x, Uniform) or out is None:
        return x if isinstance(x, Uniform) else None
    a = as_affine(x, len(out))
    return make(a.offset, a.coefs, out) if a is not None else None


def linear(sign: int) -> Rule:
    """Add (sign 1) or Sub (sign -1) of two integer splats or grids (broadcast)."""

    def rule(node: NodeView, args: Sequence[object]) -> object:
        a, b, out = args[0], args[1], node.outputs[0].shape
        if isinstance(a, Uniform) and isinstance(b, Uniform):
            return Uniform(a.value + sign * b.value)
        if out is None:
            return None
        pa, pb = as_affine(a, len(out)), as_affine(b, len(out))
        if pa is None or pb is None:
            return None
        return make(pa.offset + sign * pb.offset,
                    [x + sign * y for x, y in zip(pa.coefs, pb.coefs, strict=True)], out)

    return rule


def equal(node: NodeView, args: Sequence[object]) -> object:
    """Equal of two values whose difference is a splat."""
    a, b = args[0], args[1]
    if isinstance(a, Uniform) and isinstance(b, Uniform):
        return Uniform(float(a.value == b.value))
    d = linear(-1)(node, args)
    return Uniform(float(d.value == 0)) if isinstance(d, Uniform) else None


def logical_not(node: NodeView, args: Sequence[object]) -> object:
    return Uniform(float(not args[0].value)) if isinstance(args[0], Uniform) else None


def scalar(v: object) -> int | None:
    """An integer splat's value (None: anything else)."""
    return int(v.value) if isinstance(v, Uniform) and float(v.value).is_integer() else None


def slice_args(node: NodeView, args: Sequence[object]) -> tuple[int, int, int] | None:
    """(axis, start, step) of a Slice along one axis with constant single-element operands,
    start clamped as ONNX clamps it; None for anything else."""
    ins = _shapes(node)[0]
    if not ins or any(t is not None and t.shape not in ((), (1,)) for t in node.inputs[1:]):
        return None  # several axes at once
    start = scalar(args[1])
    axis = scalar(args[3]) if node.input(3) is not None else 0  # absent: the defaults
    step = scalar(args[4]) if node.input(4) is not None else 1
    if start is None or axis is None or not step:
        return None
    axis %= len(ins)
    dim = ins[axis]
    start = start + dim if start < 0 else start
    start = min(max(start, 0), dim) if step > 0 else min(max(start, -1), dim - 1)
    return axis, start, step


def cumsum(node: NodeView, args: Sequence[object]) -> object:
    """CumSum of an integer splat c along one axis: c * (i + 1), or c * i when exclusive."""
    c, axis, out = scalar(args[0]), scalar(args[1]), node.outputs[0].shape
    if c is None or axis is None or not out or (c and node.attr("reverse", 0)):
        return None
    coefs = [0] * len(out)
    coefs[axis % len(out)] = c
    return make(0 if node.attr("exclusive", 0) else c, coefs, out)


def transpose(node: NodeView, args: Sequence[object]) -> object:
    x = args[0]
    if not isinstance(x, Affine):
        return x if isinstance(x, Uniform) else None
    perm = node.attr("perm") or list(reversed(range(len(x.coefs))))
    if sorted(perm) != list(range(len(x.coefs))):
        return None
    return make(x.offset, [x.coefs[p] for p in perm], node.outputs[0].shape)


def slice_(node: NodeView, args: Sequence[object]) -> object:
    """Slice along one axis (single-element starts, ends, axes, steps)."""
    x = args[0]
    if isinstance(x, Uniform):
        return x
    parsed = slice_args(node, args) if isinstance(x, Affine) else None
    if parsed is None:
        return None
    axis, start, step = parsed
    coefs = list(x.coefs)
    coefs[axis] = x.coefs[axis] * step
    return make(x.offset + x.coefs[axis] * start, coefs, node.outputs[0].shape)


def concat(node: NodeView, args: Sequence[object]) -> object:
    """Pieces that continue one grid along the axis; else, along the last axis, size-1
    pieces stacked as index components (``Stack``)."""
    out = node.outputs[0].shape
    if not out or any(t is None or t.shape is None or len(t.shape) != len(out)
                      for t in node.inputs):
        return None
    axis = int(node.attr("axis", 0)) % len(out)
    pieces = [as_affine(v, len(out)) for v in args[:len(node.inputs)]]
    if any(p is None for p in pieces):
        return None
    sizes = [t.shape[axis] for t in node.inputs]
    line = _line(pieces, sizes, axis, out)
    if line is not None or axis != len(out) - 1 or any(n != 1 for n in sizes):
        return line
    return Stack(tuple(make(p.offset, p.coefs[:-1], out[:-1]) for p in pieces))


def _line(pieces: list[Affine], sizes: list[int], axis: int, out: Sequence[int]) -> object:
    slopes = {p.coefs[axis] for p, n in zip(pieces, sizes, strict=True) if n > 1}
    if not slopes and len(pieces) > 1:
        slopes = {pieces[1].offset - pieces[0].offset}
    if len(slopes) > 1 or len({p.coefs[:axis] + p.coefs[axis + 1:] for p in pieces}) > 1:
        return None
    slope, start = (slopes.pop() if slopes else 0), 0
    for p, n in zip(pieces, sizes, strict=True):
        if p.offset != pieces[0].offset + slope * start:
            return None
        start += n
    coefs = list(pieces[0].coefs)
    coefs[axis] = slope
    return make(pieces[0].offset, coefs, out)


def gather_nd(node: NodeView, args: Sequence[object]) -> object:
    """data[indices] (batch_dims 0) of a grid: a grid of the index components."""
    data, idx = args[0], args[1]
    ins, out = _shapes(node)
    if isinstance(data, Uniform) or out is None or ins is None or node.attr("batch_dims", 0):
        return data if isinstance(data, Uniform) else None
    parts = _components(idx, node.inputs[1].shape if node.inputs[1] is not None else None)
    if not isinstance(data, Affine) or parts is None:
        return None
    lead = len(out) - (len(ins) - len(parts))
    if lead < 0 or len(parts) > len(ins):
        return None
    offset, coefs = data.offset, [0] * lead
    for c, part in zip(data.coefs, parts, strict=False):
        p = as_affine(part, lead)
        if p is None:
            return None
        offset += c * p.offset
        coefs = [x + c * y for x, y in zip(coefs, p.coefs, strict=True)]
    return make(offset, coefs + list(data.coefs[len(parts):]), out)


def _components(idx: object, shape: Sequence[int] | None) -> tuple[object, ...] | None:
    if isinstance(idx, Stack):
        return idx.parts
    if shape is None or not shape:
        return None
    if isinstance(idx, Uniform):
        return (idx,) * shape[-1]
    if isinstance(idx, Affine) and shape[-1] <= len(idx.coefs):  # k <= the data's rank
        return tuple(make(idx.offset + idx.coefs[-1] * j, idx.coefs[:-1], shape[:-1])
                     for j in range(shape[-1]))
    return None


def shape(node: NodeView, args: Sequence[object]) -> object:
    """Shape of a value whose dims are all bound (start / end attributes as ONNX's)."""
    dims = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    picked = dims[node.attr("start", 0):node.attr("end", len(dims))]
    return _grid_or_vector(np.array(picked, dtype=np.int64)) if picked else None


def gather(node: NodeView, args: Sequence[object]) -> object:
    """Gather of one element along an axis (a scalar index): a shape's dim, a grid's slice."""
    data, i = args[0], scalar(args[1])
    idx = node.input(1)
    if isinstance(data, Uniform) or i is None or idx is None or idx.shape != ():
        return data if isinstance(data, Uniform) else None  # a splat's elements, any of them
    axis = int(node.attr("axis", 0))
    if isinstance(data, Vector) and axis in (0, -1):
        return Uniform(float(data.values[i])) if -len(data.values) <= i < len(data.values) \
            else None
    ins = _shapes(node)[0]
    if not isinstance(data, Affine) or not ins or not -len(ins) <= axis < len(ins):
        return None
    axis %= len(ins)
    i = i + ins[axis] if i < 0 else i
    coefs = [c for ax, c in enumerate(data.coefs) if ax != axis]
    return make(data.offset + data.coefs[axis] * i, coefs, node.outputs[0].shape)


def range_(node: NodeView, args: Sequence[object]) -> object:
    start, delta = scalar(args[0]), scalar(args[2])
    return make(start, [delta], node.outputs[0].shape) if start is not None and delta \
        else None


def product(node: NodeView, args: Sequence[object]) -> object:
    """Mul of two splats (a padding mask's (1 - mask) * min, with the mask all ones)."""
    a, b = args[0], args[1]
    return Uniform(a.value * b.value) if isinstance(a, Uniform) and isinstance(b, Uniform) \
        else None


def splat_gather(node: NodeView, args: Sequence[object]) -> object:
    """GatherElements of a splat: the splat."""
    return args[0] if isinstance(args[0], Uniform) else None


INDEX_RULES: Mapping[str, Rule] = {
    **dict.fromkeys(("Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Flatten"), view),
    "Mul": product, "GatherElements": splat_gather,
    "Expand": expand, "Add": linear(1), "Sub": linear(-1), "Equal": equal,
    "Not": logical_not, "CumSum": cumsum, "Transpose": transpose, "Slice": slice_,
    "Concat": concat, "GatherND": gather_nd, "Range": range_, "Shape": shape, "Gather": gather,
}
SHAPE_ONLY = frozenset({"Shape"})  # rules that read no operand's value
