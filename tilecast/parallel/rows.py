"""A kernel on more or fewer token rows: experts on ep times the rows (experts.py), every
token-wise kernel on 1/cp of the sequence (context.py)."""

from __future__ import annotations

from dataclasses import replace

from ..analyzer.types import MatmulDims, OpCost, RowDims
from .tensor import matmul_role, rescale_matmul, scaled_reads


def _times(x: int, num: int, den: int) -> int:
    return max(x * num // den, 1)


def scale_rows(c: OpCost, fwd: MatmulDims | None, num: int, den: int) -> OpCost:
    """``c`` with its token rows times num / den. A product of a node with forward dims
    ``fwd`` scales its rows M (forward, input gradient) or, for the weight gradient, its
    contraction K (the rows it sums over); another kernel of such a node (a bias gradient)
    reduces longer or shorter columns; any other kernel scales its work and its rows, and
    every kernel its reads beyond its unique bytes (``tensor.scaled_reads``)."""
    d = c.matmul
    if d is not None and fwd is not None:
        if matmul_role(d, fwd) == "dB":
            return rescale_matmul(c, replace(d, k=_times(d.k, num, den)))
        return rescale_matmul(c, replace(d, m=_times(d.m, num, den)))
    rows = c.rows
    if rows is not None:
        rows = (RowDims(rows.rows, _times(rows.cols, num, den)) if fwd is not None
                else RowDims(_times(rows.rows, num, den), rows.cols))
    return replace(scaled_reads(c, num, den), flops=c.flops * num // den,
                   bytes=c.bytes * num // den,
                   elements=c.elements * num // den, rows=rows,
                   matmul=None if d is None else replace(d, m=_times(d.m, num, den)))


def scaled_forward(d: MatmulDims, num: int, den: int) -> MatmulDims:
    """A product's forward dims on num / den times the rows."""
    return replace(d, m=_times(d.m, num, den))
