"""Matmul-like ops: MatMul (and its integer / quantized / fused forms), Gemm, Einsum.

``MatmulDims(b, m, n, k)``: b independent (m x k) @ (k x n) products. A 2-D (or 1-D) right
operand is a weight shared by every row of A ("linear"), so A's leading dims fold into m and b=1;
a batched right operand gives b = product of the broadcast batch dims.
"""

from __future__ import annotations

from ..registry import CostFn, cost, register_all, register_steps
from ..types import MatmulDims, NodeView, OpCost, RowDims
from .common import (
    Shape,
    attr_str,
    broadcast,
    has_input,
    in_shape,
    io_bytes,
    out_shape,
    prod,
    require,
    vector_cost,
)

MS = "com.microsoft"


def matmul_dims(node: NodeView, a: Shape, b: Shape) -> MatmulDims:
    """numpy.matmul semantics: 1-D A is a row vector, 1-D B a column vector."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    require(node, a2[-1] == b2[-2], f"inner dims differ: {list(a)} @ {list(b)}")
    if len(b2) == 2:  # shared weight: every leading dim of A is just more rows
        return MatmulDims(1, prod(a2[:-1]), b2[-1], a2[-1])
    batch = broadcast(node, a2[:-2], b2[:-2])
    return MatmulDims(prod(batch), a2[-2], b2[-1], a2[-1], batched=True)


def matmul_cost(node: NodeView, d: MatmulDims, a_index: int = 0, extra_flops: int = 0) -> OpCost:
    """2 FLOPs per FMA; bytes are every input and output once (weights, scales, zero points)."""
    return OpCost("matmul", 2 * d.b * d.m * d.n * d.k + extra_flops, io_bytes(node),
                  node.inputs[a_index].dtype, unit="matrix", matmul=d,
                  elements=prod(out_shape(node)))


def matmul_like(a_index: int, b_index: int) -> CostFn:
    """Factory: a numpy-style matmul of inputs ``a_index`` @ ``b_index``."""

    def fn(node: NodeView) -> OpCost:
        d = matmul_dims(node, in_shape(node, a_index), in_shape(node, b_index))
        return matmul_cost(node, d, a_index)

    return fn


register_all(("MatMul", "MatMulInteger"), matmul_like(0, 1))
register_all(("QLinearMatMul",), matmul_like(0, 3))  # a, a_scale, a_zp, b, ...
register_all(("MatMulIntegerToFloat",), matmul_like(0, 1), domain=MS)


@cost("Gemm")
def gemm(node: NodeView) -> OpCost:
    a, b = in_shape(node, 0), in_shape(node, 1)
    require(node, len(a) == 2 and len(b) == 2, "Gemm needs 2-D A and B")
    m, k = (a[1], a[0]) if node.attr("transA", 0) else a
    n = b[0] if node.attr("transB", 0) else b[1]
    # The bias C costs one add per output; alpha/beta scaling rides in the same epilogue.
    bias_adds = m * n if has_input(node, 2) else 0
    layout = None if node.attr("transA", 0) else ("nk" if node.attr("transB", 0) else "kn")
    return matmul_cost(node, MatmulDims(1, m, n, k, b_layout=layout), extra_flops=bias_adds)


def _swap_last(s: Shape, flag: int) -> Shape:
    return (*s[:-2], s[-1], s[-2]) if flag and len(s) >= 2 else s


def _batch_first_last(s: Shape, flag: int) -> Shape:
    # transBatch moves dim 0 just before the last dim: (d0, d1.., dk) -> (d1.., d0, dk).
    return (*s[1:-1], s[0], s[-1]) if flag and len(s) >= 3 else s


@cost("FusedMatMul", domain=MS)
def fused_matmul(node: NodeView) -> OpCost:
    """alpha * op(A) @ op(B); alpha folds into the epilogue at no extra pass."""
    a = _swap_last(_batch_first_last(in_shape(node, 0), node.attr("transBatchA", 0)),
                   node.attr("transA", 0))
    b = _swap_last(_batch_first_last(in_shape(node, 1), node.attr("transBatchB", 0)),
                   node.attr("transB", 0))
    return matmul_cost(node, matmul_dims(node, a, b))


@cost("MatMulNBits", domain=MS)
def matmul_nbits(node: NodeView) -> OpCost:
    """A (..., K) @ dequantized B: K and N come from attributes (B is packed blocks)."""
    a, k, n = in_shape(node, 0), node.attr("K"), node.attr("N")
    require(node, k is not None and n is not None and a[-1] == k, "needs attributes K and N")
    return matmul_cost(node, MatmulDims(1, prod(a[:-1]), n, k))


def _einsum_indices(node: NodeView) -> tuple[list[list[str]], list[str], dict[str, int]]:
    """Per-operand index lists, output indices and every index's size. Ellipsis dims become
    indices '.0', '.1', ... counted from the right so they broadcast like numpy."""
    eq = attr_str(node, "equation", "").replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms, sizes = lhs.split(","), {}
    require(node, len(terms) == len(node.inputs), f"equation {eq!r} does not match the inputs")
    ops = []
    for i, term in enumerate(terms):
        s = in_shape(node, i)
        n_ell = len(s) - len(term.replace("...", ""))
        ell = [f".{n_ell - 1 - j}" for j in range(n_ell)]
        idx = [*term.split("...")[0], *ell, *term.split("...")[-1]] if "..." in term else [*term]
        require(node, len(idx) == len(s), f"term {term!r} does not match shape {list(s)}")
        for c, d in zip(idx, s, strict=True):
            sizes[c] = max(sizes.get(c, 1), d)  # size-1 ellipsis dims broadcast
        ops.append(idx)
    if arrow:
        ell_out = [c for c in sizes if c.startswith(".")] if "..." in rhs else []
        out = [*rhs.replace("...", ""), *ell_out]
    else:  # implicit output: the ellipsis then every letter seen once, sorted
        once = [c for c in sizes if sum(o.count(c) for o in ops) == 1 and not c.startswith(".")]
        out = [c for c in sizes if c.startswith(".")] + sorted(once)
    return ops, out, sizes


def _sum_inside(idx: list[str], keep: set[str], sizes: dict[str, int], dtype: str,
                size: float, name: str, steps: list[tuple[str, OpCost]]) -> list[str]:
    """Sum away the indices of one operand that no later step needs (torch.einsum does this
    before contracting a pair): one add per element read."""
    kept = [c for c in dict.fromkeys(idx) if c in keep]
    if len(kept) == len(dict.fromkeys(idx)):
        return kept
    n_in, n_out = prod(sizes[c] for c in dict.fromkeys(idx)), prod(sizes[c] for c in kept)
    steps.append((name, OpCost("reduction", n_in, int(size * (n_in + n_out)), dtype,
                               rows=RowDims(n_out, n_in // max(n_out, 1)), elements=n_out)))
    return kept


def einsum_steps(node: NodeView) -> list[tuple[str, OpCost]]:
    """Pairwise, left to right, as torch.einsum (and numpy.einsum without ``optimize``):
    indices no later operand or the output needs are summed inside their operand first; then
    each pair is one batched matmul: batch = indices in both that stay, k = indices in both
    that go, m / n = indices of one side only. A lone operand is only summed (or permuted:
    one copy)."""
    ops, out, sizes = _einsum_indices(node)
    dtype, size = node.inputs[0].dtype, node.inputs[0].itemsize
    steps: list[tuple[str, OpCost]] = []
    cur = ops[0]
    for j, nxt in enumerate([*ops[1:], None], 1):
        later = set(out).union(*ops[j + 1:]) if nxt is not None else set(out)
        cur = _sum_inside(cur, later | set(nxt or ()), sizes, dtype, size, f"sum{j - 1}",
                          steps)
        if nxt is None:
            break
        nxt = _sum_inside(nxt, later | set(cur), sizes, dtype, size, f"sum{j}", steps)
        a, b = set(cur), set(nxt)
        groups = {"b": [c for c in cur if c in b and c in later],
                  "m": [c for c in cur if c not in b], "n": [c for c in nxt if c not in a],
                  "k": [c for c in cur if c in b and c not in later]}
        d = MatmulDims(*(prod(sizes[c] for c in groups[g]) for g in "bmnk"))
        n_a, n_b = prod(sizes[c] for c in cur), prod(sizes[c] for c in nxt)
        cur = groups["b"] + groups["m"] + groups["n"]
        n_y = d.b * d.m * d.n
        steps.append((f"contract{j}", OpCost("matmul", 2 * d.b * d.m * d.n * d.k,
                                             int(size * (n_a + n_b + n_y)), dtype,
                                             unit="matrix", matmul=d, elements=n_y)))
    if not steps:  # a permutation of one operand: one copy
        steps.append(("copy", vector_cost(node, "movement", 0, io_bytes(node))))
    return steps


register_steps("Einsum", einsum_steps, "matmul")
