"""Helpers shared by the cost formulas: checked shapes with clear errors, unique bytes, dtypes.

Every error names the node, its op_type and its shapes, so a user can find the node in the
graph. Formulas read shapes only through :func:`shape` / :func:`in_shape` / :func:`out_shape`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ...errors import ShapeError, UnsupportedModelError
from ..types import NodeView, OpCost, RowDims, TensorInfo

Shape = tuple[int, ...]

FLOAT_DTYPES = frozenset({
    "float32", "float16", "bfloat16", "float64", "float8e4m3fn", "float8e4m3fnuz",
    "float8e5m2", "float8e5m2fnuz", "float4e2m1",
})
STATS_ITEMSIZE = 4  # per-row mean / inverse std outputs are float32 ("U" type) in ONNX and ORT


def _where(node: NodeView) -> str:
    return f"node '{node.name}' ({node.op_type}, shapes {node.shape_str()})"


def shape_error(node: NodeView, msg: str) -> ShapeError:
    return ShapeError(f"{_where(node)}: {msg}")


def unsupported_error(node: NodeView, msg: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{_where(node)}: {msg}")


def require(node: NodeView, ok: bool, msg: str) -> None:
    """Turn a failed attribute/shape check into a ShapeError that names the node."""
    if not ok:
        raise shape_error(node, msg)


def require_nonempty(node: NodeView, y: Shape) -> None:
    """A windowed op (convolution, pooling) whose output has a dim below 1: the input is
    smaller than the window, or empty. PyTorch refuses it ("Output size is too small"), and
    no kernel does work on it, so it is the input's fault, named here."""
    require(node, all(d >= 1 for d in y),
            f"output {list(y)} is empty: the input is smaller than the window or has a zero "
            "dim; bind larger input dims")


def shape(node: NodeView, t: TensorInfo | None, what: str = "tensor") -> Shape:
    if t is None or not t.name:
        raise shape_error(node, f"{what} is missing")
    if not t.known:
        raise shape_error(node, f"the shape of {what} '{t.name}' is unknown")
    return t.shape


def in_shape(node: NodeView, i: int) -> Shape:
    return shape(node, node.input(i), f"input {i}")


def out_shape(node: NodeView, i: int = 0) -> Shape:
    return shape(node, node.outputs[i] if i < len(node.outputs) else None, f"output {i}")


def has_input(node: NodeView, i: int) -> bool:
    t = node.input(i)
    return t is not None and bool(t.name)


def has_output(node: NodeView, i: int) -> bool:
    return i < len(node.outputs) and bool(node.outputs[i].name)


def prod(dims: Iterable[int]) -> int:
    return math.prod(dims)


def nbytes(node: NodeView, t: TensorInfo) -> int:
    shape(node, t)
    return t.nbytes


def unique_bytes(node: NodeView, tensors: Iterable[TensorInfo | None]) -> int:
    """DRAM bytes of the given tensors, each distinct name once (``Mul(x, x)`` reads x once)."""
    seen: dict[str, int] = {}
    for t in tensors:
        if t is not None and t.name and t.name not in seen:
            seen[t.name] = nbytes(node, t)
    return sum(seen.values())


def io_bytes(node: NodeView) -> int:
    """Every input read once plus every output written once."""
    return unique_bytes(node, (*node.inputs, *node.outputs))


def main_dtype(node: NodeView) -> str:
    """The compute dtype: the first floating input (Where's bool condition is skipped), else the
    first typed input, else the first output."""
    ins = [t for t in node.inputs if t is not None and t.dtype != "unknown"]
    for t in ins:
        if t.dtype in FLOAT_DTYPES:
            return t.dtype
    if ins:
        return ins[0].dtype
    outs = [t for t in node.outputs if t.dtype != "unknown"]
    return outs[0].dtype if outs else "float32"


def itemsize(node: NodeView, i: int = 0) -> float:
    t = node.input(i)
    return t.itemsize if t is not None else 4


def norm_axis(node: NodeView, axis: int, rank: int) -> int:
    require(node, -rank <= axis < max(rank, 1), f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def attr_str(node: NodeView, key: str, default: str) -> str:
    """String attributes arrive as bytes from onnx.helper; formulas compare str."""
    v: Any = node.attr(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def broadcast(node: NodeView, *shapes: Sequence[int]) -> Shape:
    """Numpy-style broadcast of shapes, with a ShapeError when they are incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        require(node, len(dims) <= 1, f"shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def vector_cost(node: NodeView, family: str, flops: int, nbytes_: int, *,
                rows: RowDims | None = None, dtype: str | None = None,
                elements: int | None = None) -> OpCost:
    """An OpCost on the vector unit; ``elements`` defaults to output 0's element count."""
    n = prod(out_shape(node, 0)) if elements is None else elements
    return OpCost(family, int(flops), int(nbytes_), dtype or main_dtype(node), unit="vector",
                  rows=rows, elements=n)
