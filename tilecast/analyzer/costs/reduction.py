"""Reductions, arg-reductions, TopK, scans and the determinant.

Reduced axes come from opset-dependent places (the ``axes`` attribute before opset 18, a
constant input after, ``noop_with_empty_axes``, ``keepdims``) but the shapes already say the
result: each of the output's elements reduces ``input elements / output elements`` values. So
the formulas read rows/cols from the input and output sizes and work for every variant.
"""

from __future__ import annotations

from ..registry import CostFn, register_all
from ..types import NodeView, OpCost, RowDims
from .common import in_shape, io_bytes, norm_axis, out_shape, prod, require, vector_cost


def _rows(node: NodeView) -> RowDims:
    n_in, n_out = prod(in_shape(node, 0)), prod(out_shape(node))
    return RowDims(n_out, n_in // n_out if n_out else 0)


def reduction(flops_per_element: int, flops_per_row: int = 0) -> CostFn:
    """Factory: work per input element, plus a finishing op per output (mean's divide,
    L2's sqrt, LogSum's log)."""

    def fn(node: NodeView) -> OpCost:
        r = _rows(node)
        flops = flops_per_element * r.rows * r.cols + flops_per_row * r.rows
        return vector_cost(node, "reduction", flops, io_bytes(node), rows=r,
                           dtype=node.inputs[0].dtype)

    return fn


register_all(("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"), reduction(1))
register_all(("ReduceMean",), reduction(1, 1))
register_all(("ReduceL1",), reduction(2))  # abs + add
register_all(("ReduceL2",), reduction(2, 1))  # FMA, then sqrt
register_all(("ReduceSumSquare",), reduction(2))  # FMA
register_all(("ReduceLogSum",), reduction(1, 1))  # add, then log
register_all(("ReduceLogSumExp",), reduction(4, 1))  # max, subtract, exp, add; then log
register_all(("ArgMax", "ArgMin"), reduction(1))  # one compare per element


def top_k(node: NodeView) -> OpCost:
    """Selecting k of each row: about log2(k) + 1 compares per element (a k-entry heap or a
    radix-select pass count); outputs are values and int64 indices."""
    x = in_shape(node, 0)
    a = norm_axis(node, node.attr("axis", -1), len(x))
    k, cols = out_shape(node)[a], x[a]
    rows = prod(x) // max(cols, 1)
    return vector_cost(node, "reduction", prod(x) * max(k, 1).bit_length(), io_bytes(node),
                       rows=RowDims(rows, cols), dtype=node.inputs[0].dtype)


def scan(node: NodeView) -> OpCost:
    """CumSum / CumProd: one op per element. The axis is a runtime input a formula cannot read
    (and FLOPs and bytes do not depend on it), so no row layout is claimed."""
    n = prod(out_shape(node))
    return vector_cost(node, "reduction", n, io_bytes(node), dtype=node.inputs[0].dtype)


register_all(("TopK",), top_k)
register_all(("CumSum", "CumProd"), scan)


def determinant(node: NodeView) -> OpCost:
    """X (..., M, M) -> Y (...): an LU factorization with partial pivoting per matrix (2/3 M^3
    FLOPs: Golub and Van Loan, Matrix Computations, 3.2) and the product of the M pivots."""
    x = in_shape(node, 0)
    require(node, len(x) >= 2 and x[-1] == x[-2], f"X {list(x)} is not square matrices")
    m, batch = x[-1], prod(x[:-2])
    return vector_cost(node, "reduction", batch * (2 * m**3 // 3 + m), io_bytes(node),
                       rows=RowDims(batch, m * m), dtype=node.inputs[0].dtype)


register_all(("Det",), determinant)
