"""Indexed reads and writes: Gather*, Scatter*, OneHot.

A gather reads only the rows its indices select, not the whole table: an embedding lookup of
8 tokens in a 50k-row vocabulary reads 8 rows. Bytes = indices + gathered elements read (at most
the whole data tensor once: repeated indices hit in cache) + output written.
"""

from __future__ import annotations

from ..registry import register_all
from ..types import NodeView, OpCost
from .common import attr_str, in_shape, io_bytes, nbytes, out_shape, prod, unique_bytes, vector_cost


def gather(node: NodeView) -> OpCost:
    """Gather / GatherElements / GatherND (data, indices)."""
    data, out = node.inputs[0], node.outputs[0]
    read = min(nbytes(node, out), nbytes(node, data))
    return vector_cost(node, "gather", 0, read + unique_bytes(node, (node.input(1), out)))


def scatter(node: NodeView) -> OpCost:
    """ScatterND / ScatterElements / Scatter (data, indices, updates): the output is a full copy
    of data with updates written in; a reduction mode adds one op per update."""
    reducing = attr_str(node, "reduction", "none") != "none"
    flops = prod(in_shape(node, 2)) if reducing else 0
    return vector_cost(node, "gather", flops, io_bytes(node))


def one_hot(node: NodeView) -> OpCost:
    """(indices, depth, values): every output element is a compare-and-select."""
    return vector_cost(node, "gather", prod(out_shape(node)), io_bytes(node),
                       dtype=node.outputs[0].dtype)


register_all(("Gather", "GatherElements", "GatherND"), gather)
register_all(("ScatterND", "ScatterElements", "Scatter"), scatter)
register_all(("OneHot",), one_hot)
