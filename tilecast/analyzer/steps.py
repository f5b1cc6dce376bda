"""Launch the kernels of ops that run as several (RNN steps, einsum contractions)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .analysis import NodeResult
from .registry import STEPS
from .types import Kernel


def expand_steps(results: Sequence[NodeResult], kernels: Sequence[Kernel]) -> list[Kernel]:
    """Replace the one kernel of a multi-kernel node by the kernels it launches."""
    multi = {r.node.name: r.node for r in results
             if r.outcome == "costed" and (r.node.domain, r.node.op_type) in STEPS}
    if not multi:
        return list(kernels)
    out: list[Kernel] = []
    for k in kernels:
        node = multi.get(k.name) if k.nodes == (k.name,) else None
        if node is None:
            out.append(k)
            continue
        for suffix, cost in STEPS[(node.domain, node.op_type)](node):
            out.append(replace(k, name=f"{k.name}.{suffix}", cost=cost))
    return out
