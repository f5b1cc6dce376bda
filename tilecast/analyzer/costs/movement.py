"""Data movement that really copies memory: no FLOPs, bytes = read + written.

Expand is here, not zero-cost: ONNX Runtime and torch materialize its output. Where an op reads
only part of its input (Slice), only that part is counted. A Transpose that is costed at all
is a copy; eager PyTorch makes it with ``.contiguous()``, TensorIterator's copy of a permuted
tensor, on its non-vectorized loop (``types.NativeLoop``).
"""

from __future__ import annotations

from dataclasses import replace

from ..registry import register_all
from ..types import NativeLoop, NodeView, OpCost
from .common import in_shape, io_bytes, nbytes, out_shape, prod, unique_bytes, vector_cost


def copy(node: NodeView) -> OpCost:
    """Every input read once, every output written once."""
    return vector_cost(node, "movement", 0, io_bytes(node), dtype=node.outputs[0].dtype)


def transpose(node: NodeView) -> OpCost:
    """A copy, which PyTorch's runtimes make on the non-vectorized loop: the input is not
    contiguous in the output's order (our H100's GPT-2 trace: the head permutes' copies are
    ``elementwise_kernel<128, 4, ...direct_copy_kernel_cuda...>``)."""
    return replace(copy(node), native=NativeLoop(prod(out_shape(node))))


def split(node: NodeView) -> OpCost:
    n = sum(prod(out_shape(node, i)) for i, t in enumerate(node.outputs) if t.name)
    return vector_cost(node, "movement", 0, io_bytes(node), elements=n)


def slice_(node: NodeView) -> OpCost:
    """Only the selected elements are read (plus the small starts/ends/axes/steps inputs)."""
    data, out = node.inputs[0], node.outputs[0]
    read = min(nbytes(node, data), nbytes(node, out))
    return vector_cost(node, "movement", 0, read + unique_bytes(node, (*node.inputs[1:], out)))


def tensor_scatter(node: NodeView) -> OpCost:
    """TensorScatter(past_cache, update, write_indices) models an in-place KV-cache update:
    the update is read and written into the cache; the rest of the cache is not touched."""
    update = nbytes(node, node.inputs[1])
    return vector_cost(node, "movement", 0, 2 * update + unique_bytes(node, node.inputs[2:]),
                       elements=prod(in_shape(node, 1)))


def non_zero(node: NodeView) -> OpCost:
    """The output size (rank x count) depends on the data: bounded by every element being
    non-zero, and flagged ``estimated`` when shape inference could not say."""
    x, out = in_shape(node, 0), node.outputs[0]
    if out.shape is not None and -1 not in out.shape:
        return vector_cost(node, "movement", 0, io_bytes(node), dtype="int64")
    bound = len(x) * prod(x)
    cost = vector_cost(node, "movement", 0, nbytes(node, node.inputs[0]) + 8 * bound,
                       dtype="int64", elements=bound)
    return replace(cost, estimated=True)


register_all(("Transpose",), transpose)
register_all((
    "Concat", "Pad", "Tile", "Expand", "Trilu", "Range", "ConstantOfShape",
    "DepthToSpace", "SpaceToDepth", "Col2Im", "EyeLike", "ReverseSequence", "CenterCropPad",
), copy)
register_all(("Split",), split)
register_all(("Slice",), slice_)
register_all(("TensorScatter",), tensor_scatter)
register_all(("NonZero",), non_zero)
