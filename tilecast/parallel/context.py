"""Context parallelism: the sequence split over cp ranks, attention's K and V passed round a
ring.

Megatron-core's context parallelism (its "context parallel" guide; the ring exchange of Liu
et al., "Ring Attention with Blockwise Transformers for Near-Infinite Context", ICLR 2024):
every activation is split over the sequence into cp parts, so a rank runs each token-wise
kernel (linears, norms, elementwise, embedding, LM head) on 1/cp of the tokens and its
queries' attention against the whole sequence. The other ranks' K and V chunks arrive round a
ring, cp - 1 send/recv steps per attention, each overlapped with the attention of the chunk
at hand; the backward passes K and V and their gradients the same way. Causal masks are
load-balanced (each rank holds 2 of 2 x cp chunks), so a rank does 1/cp of the attention work.
Weights are whole on every rank; their gradients are reduced over the dp x cp ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..analyzer.analysis import NodeResult
from ..analyzer.training import trainable
from ..analyzer.types import Kernel, MatmulDims, TensorInfo
from ..errors import TilecastError
from .rows import scale_rows, scaled_forward
from .structure import Block, Structure, Walker

# Families a K or V operand may be traced back through to its projection (views, the
# rotary embedding's elementwise, the grouped-query repeat's expand).
PASS = (None, "movement", "elementwise")


@dataclass(frozen=True)
class RingExchange:
    """One attention block's K/V ring: its block and the K and V bytes of the whole
    sequence (before a grouped-query repeat: what Megatron-core sends)."""

    row: int  # the block's output projection (its layer segment)
    kv_bytes: int


def _operands(results: Sequence[NodeResult], b: Block) -> tuple[TensorInfo, TensorInfo]:
    """(K, V) of an attention block: Q K^T's second input and probs x V's second input, or a
    fused attention node's inputs 1 and 2."""
    first = min(b.core)
    node = results[first].node
    if results[first].cost is not None and results[first].cost.family == "attention":
        return node.inputs[1], node.inputs[2]
    return node.inputs[1], results[b.core_out].node.inputs[1]


def _source_bytes(w: Walker, t: TensorInfo) -> int:
    """The smallest tensor on the way from ``t`` up to its projection, following the largest
    activation input of views and elementwise nodes (a grouped-query expand is undone)."""
    best = t.nbytes
    while t.name in w.producer:
        i = w.producer[t.name]
        if w.family(i) not in PASS:
            break
        data = [u for u in w.results[i].node.inputs
                if u is not None and not u.is_initializer and u.known]
        if not data:
            break
        t = max(data, key=lambda u: u.numel)
        best = min(best, t.nbytes)
    return best


def sequence_length(results: Sequence[NodeResult], b: Block) -> int:
    """The query length of an attention block (rows of Q K^T; a fused node's output rows)."""
    first = min(b.core)
    mm = results[first].cost.matmul if results[first].cost is not None else None
    if mm is not None:
        return mm.m
    shape = results[first].node.outputs[0].shape or (0, 0)
    return shape[-2]


def ring_exchanges(results: Sequence[NodeResult], s: Structure, cp: int
                   ) -> tuple[RingExchange, ...]:
    """Every attention block's ring; an error where cp cannot split its sequence."""
    attention = [b for b in s.blocks if b.kind == "attention" and b.core]
    if not attention:
        raise TilecastError(f"cp={cp} splits the sequence of attention layers, but no "
                            f"attention pattern was recognized")
    w = Walker(results)
    out = []
    for b in attention:
        seq = sequence_length(results, b)
        if seq % (2 * cp):
            node = results[min(b.core)].node
            raise TilecastError(f"cp={cp} needs the sequence divisible by 2 x cp "
                                f"(Megatron-core's load-balanced chunks), but node "
                                f"'{node.name}' ({node.op_type}) attends over {seq} queries")
        k, v = _operands(results, b)
        out.append(RingExchange(b.row, _source_bytes(w, k) + _source_bytes(w, v)))
    return tuple(out)


def context_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult],
                    index: Mapping[str, int], cp: int,
                    forward: Mapping[int, MatmulDims]) -> list[Kernel]:
    """The kernels one context-parallel rank runs: every token-wise kernel on 1/cp of the
    tokens; a parameter's gradient accumulation and update stay whole."""
    _, params = trainable(results)
    out = []
    for k in kernels:
        i = index.get(k.nodes[0]) if k.nodes else None
        if i is None:
            if k.name.rsplit(".", 1)[0] in params:
                out.append(k)
                continue
            fwd = None
        else:
            c = results[i].cost
            fwd = forward.get(i) or (c.matmul if c is not None else None)
        out.append(replace(k, cost=scale_rows(k.cost, fwd, 1, cp)))
    return out


def shrunk_forward(results: Sequence[NodeResult], cp: int,
                   base: Mapping[int, MatmulDims]) -> dict[int, MatmulDims]:
    """Every product's forward dims on 1/cp of the rows (of ``base``'s dims where given)."""
    out = dict(base)
    for i, r in enumerate(results):
        mm = out.get(i) or (r.cost.matmul if r.cost is not None else None)
        if mm is not None:
            out[i] = scaled_forward(mm, 1, cp)
    return out


__all__ = ["RingExchange", "ring_exchanges", "context_kernels", "shrunk_forward",
           "sequence_length"]
