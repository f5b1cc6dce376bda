"""Context parallelism: the sequence split over cp ranks, attention's K and V passed round a
ring (or heads exchanged for sequence with all-to-alls).

Megatron-core's context parallelism (its "context parallel" guide; the ring exchange of Liu
et al., "Ring Attention with Blockwise Transformers for Near-Infinite Context", ICLR 2024):
every activation is split over the sequence into cp parts, so a rank runs each token-wise
kernel (linears, norms, elementwise, embedding, LM head) on 1/cp of the tokens and its
queries' attention against the whole sequence. The other ranks' K and V chunks arrive round a
ring, cp - 1 send/recv steps per attention, each overlapped with the attention of the chunk
at hand; the backward passes K and V and their gradients the same way. Causal masks are
load-balanced (each rank holds 2 of 2 x cp chunks), so a rank does 1/cp of the attention work.
Weights are whole on every rank; their gradients are reduced over the dp x cp ranks.

The all-to-all variant (``cp_comm="a2a"``: Jacobs et al., "DeepSpeed Ulysses", 2023;
Megatron-core's a2a) trades the sequence split for a head split around the attention: an
all-to-all each for Q, for K and V, and for the output (and for their gradients in the
backward), not overlapped, and the attention runs the whole sequence on 1/cp of the heads.
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
from .tensor import rescale_matmul

# Families a K or V operand may be traced back through to its projection (views, the
# rotary embedding's elementwise, the grouped-query repeat's expand).
PASS = (None, "movement", "elementwise")


@dataclass(frozen=True)
class AttentionExchange:
    """What one attention block's context-parallel ranks exchange, in bytes of the whole
    sequence: Q, K and V as projected (K and V before a grouped-query repeat: what
    Megatron-core sends) and the attention's output."""

    row: int  # the block's output projection (its layer segment)
    q_bytes: int
    kv_bytes: int
    out_bytes: int

    def calls(self, cp: int, comm: str) -> tuple[list[tuple[str, float]], list]:
        """(forward, backward) collectives per microbatch, each (op, bytes per rank)."""
        if comm == "a2a":
            calls = [("all-to-all", x / cp) for x in (self.q_bytes, self.kv_bytes,
                                                      self.out_bytes)]
            return calls, list(calls)
        return ([("send-recv", self.kv_bytes / cp)] * (cp - 1),
                [("send-recv", 2 * self.kv_bytes / cp)] * (cp - 1))


def _operands(results: Sequence[NodeResult], b: Block
              ) -> tuple[TensorInfo, TensorInfo, TensorInfo, TensorInfo]:
    """(Q, K, V, output) of an attention block: Q K^T's inputs and probs x V's second input
    and output, or a fused attention node's inputs 0-2 and output."""
    first = min(b.core)
    node, out = results[first].node, results[b.core_out].node
    if results[first].cost is not None and results[first].cost.family == "attention":
        return node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]
    return node.inputs[0], node.inputs[1], out.inputs[1], out.outputs[0]


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


def attention_exchanges(results: Sequence[NodeResult], s: Structure, cp: int, comm: str,
                        tp: int = 1) -> tuple[AttentionExchange, ...]:
    """What every attention block exchanges; an error where cp cannot split its sequence
    (or, for the all-to-all, its heads on each tensor-parallel rank)."""
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
        if comm == "a2a" and (b.heads // tp) % cp:
            raise TilecastError(f"cp={cp} with all-to-all needs the heads per tensor-parallel "
                                f"rank ({b.heads} / tp {tp}) divisible by cp, at node "
                                f"'{results[min(b.core)].node.name}'")
        q, _, _, o = _operands(results, b)
        out.append(AttentionExchange(b.row, _source_bytes(w, q), kv_bytes(results, b, w),
                                     o.nbytes))
    return tuple(out)


def kv_bytes(results: Sequence[NodeResult], b: Block, w: Walker | None = None) -> int:
    """Bytes of an attention block's K and V over the whole sequence as projected (before a
    grouped-query repeat): what context parallelism sends, and what a KV cache holds."""
    w = w or Walker(results)
    _, k, v, _ = _operands(results, b)
    return _source_bytes(w, k) + _source_bytes(w, v)


def context_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult],
                    index: Mapping[str, int], cp: int, forward: Mapping[int, MatmulDims],
                    head_split: frozenset[int] = frozenset()) -> list[Kernel]:
    """The kernels one context-parallel rank runs: every token-wise kernel on 1/cp of the
    tokens; the products of the ``head_split`` nodes (the attention cores under the
    all-to-all) on 1/cp of the heads over the whole sequence; a parameter's gradient
    accumulation and update stay whole."""
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
        d = k.cost.matmul
        if i in head_split and d is not None and d.b % cp == 0:
            out.append(replace(k, cost=rescale_matmul(k.cost, replace(d, b=d.b // cp))))
        else:
            out.append(replace(k, cost=scale_rows(k.cost, fwd, 1, cp)))
    return out


def shrunk_forward(results: Sequence[NodeResult], cp: int, base: Mapping[int, MatmulDims],
                   head_split: frozenset[int] = frozenset()) -> dict[int, MatmulDims]:
    """Every product's forward dims on 1/cp of the rows, or of the heads for the
    ``head_split`` nodes (of ``base``'s dims where given)."""
    out = dict(base)
    for i, r in enumerate(results):
        mm = out.get(i) or (r.cost.matmul if r.cost is not None else None)
        if mm is None:
            continue
        out[i] = (replace(mm, b=mm.b // cp) if i in head_split and mm.b % cp == 0
                  else scaled_forward(mm, 1, cp))
    return out


def attention_cores(s: Structure) -> frozenset[int]:
    """The nodes of every attention core (Q K^T through probs x V)."""
    return frozenset(i for b in s.blocks for i in b.core)


__all__ = ["AttentionExchange", "attention_exchanges", "context_kernels", "shrunk_forward",
           "sequence_length", "attention_cores", "kv_bytes"]
