"""Which GEMM operands are constants of the graph (a layer's weights), read once per pass.

A linear layer reads its weight once per forward pass (and its input gradient once more in
training). Between two reads of one weight the pass reads every other one, so once a pass's
weights outgrow the L2, none is still resident when the next pass comes back to it: they
stream from DRAM, however small one matrix is. The kernel benchmarks the learned predictor
trains on run one GEMM again and again, where an operand that fits the L2 stays there
(``learned.features.l2_hits``); a model's pass is not that. This module marks the B operand
of a MatMul, Gemm, FusedMatMul or Conv that is an initializer, directly or through free views
of one (a Transpose folded at load, a Reshape): ``MatmulDims.weight_b``. Whether those bytes
stream is the predictor's call, per pass and GPU (``learned.predictor``). A Cast of a weight
is a kernel of its own (autocast), whose output the GEMM reads fresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .analysis import NodeResult
from .params import FREE_VIEWS, MS
from .types import MatmulDims, TensorInfo

# (domain, op_type) of the nodes whose input 1 is the B operand of their GEMM view.
WEIGHT_B_OPS = frozenset({("", "MatMul"), ("", "Gemm"), ("", "Conv"), (MS, "FusedMatMul")})


def _constant(t: TensorInfo | None, producer: dict) -> bool:
    """``t`` is an initializer, or a free view of one."""
    while t is not None and not t.is_initializer and t.name in producer:
        src = producer[t.name]
        t = src.input(0) if src.op_type in FREE_VIEWS and not src.domain else None
    return t is not None and t.is_initializer and t.shape is not None and t.numel > 1


def mark_weight_operands(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    """``results`` with ``weight_b`` set on the GEMM view of every node whose B is a weight."""
    producer = {t.name: r.node for r in results for t in r.node.outputs if t.name}
    out = []
    for r in results:
        d: MatmulDims | None = r.cost.matmul if r.cost is not None else None
        if d is not None and (r.node.domain, r.node.op_type) in WEIGHT_B_OPS \
                and _constant(r.node.input(1), producer):
            r = replace(r, cost=replace(r.cost, matmul=replace(d, weight_b=True)))
        out.append(r)
    return tuple(out)
