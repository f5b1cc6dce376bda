"""Mixture-of-experts layers and expert parallelism: which experts a rank holds, what it runs
and which tokens it exchanges.

An MoE layer is recognized from structure: two or more MLP blocks (``structure.Block``) whose
inputs are slices of one activation along its leading axis, one slice per block and as many
blocks as that axis is long. That is the capacity-padded token buffer of Switch Transformers
and GShard, (experts, tokens per expert, width), which ``tilecast export`` writes for MoE
models (exporters/moe.py).

Expert parallelism of degree ep (Lepikhin et al., "GShard", ICLR 2021; Fedus et al., "Switch
Transformers", JMLR 2022; Megatron-core's MoE layers, whose expert-parallel ranks are
data-parallel ranks): each rank of an expert-parallel group holds E / ep of the experts. An
all-to-all sends each expert's slice of every rank's buffer to the rank that holds the expert
(dispatch) and another brings the outputs back (combine); the backward runs both again on the
gradients. A rank then runs E / ep experts on ep times the rows: the FLOPs of a data-parallel
rank in fewer, larger GEMMs, with 1 / ep of the expert weights. Expert gradients are reduced
over the dp / ep ranks that hold the same experts. Experts stay tensor-parallel when tp > 1
(Megatron-core's default expert tensor parallelism is tp).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..analyzer.analysis import NodeResult
from ..analyzer.mathmode import AUTOCAST_REASON
from ..analyzer.types import Kernel, MatmulDims
from ..errors import TilecastError
from .rows import scale_rows, scaled_forward
from .structure import Block, Structure, Walker


@dataclass(frozen=True)
class ExpertGroup:
    """One MoE layer: its experts in graph order and the token buffers it exchanges."""

    members: tuple[frozenset[int], ...]  # per expert: slice, column, inner and row nodes
    rows: tuple[int, ...]  # per expert: its row-parallel (second) linear
    source: str  # the dispatched buffer (experts, tokens per expert, width)
    dispatch_bytes: int  # that buffer, per rank and microbatch
    combine_bytes: int  # the experts' outputs, gathered back
    slots: int = 0  # token slots per expert in the graph (the buffer's second dim)

    @property
    def experts(self) -> int:
        return len(self.members)


def _slice_source(w: Walker, block: Block) -> tuple[str, frozenset[int]] | None:
    """(buffer, nodes on the way) when the block's input is one leading-axis slice of a
    buffer: reached through zero-cost views (and the casts autocast inserts) from a node that
    takes 1/E of it."""
    node = w.results[block.column[0]].node
    weight = w.weight(block.column[0])
    acts = [t for t in node.inputs[:2] if t is not None and t is not weight
            and not t.is_initializer]
    if not acts:
        return None
    t, path = acts[0], set()
    while t.name in w.producer:
        i = w.producer[t.name]
        path.add(i)
        r = w.results[i]
        data = [u for u in r.node.inputs if u is not None and not u.is_initializer]
        if len(data) != 1:
            return None
        src = data[0]
        if (src.shape and len(src.shape) >= 2 and src.shape[0] >= 2 and t.known
                and src.known and t.numel * src.shape[0] == src.numel):
            return src.name, frozenset(path)
        if r.cost is not None and r.reason != AUTOCAST_REASON:
            return None  # a kernel that is not a slice (nor autocast's cast of one)
        t = src
    return None


def recognize_experts(results: Sequence[NodeResult], s: Structure) -> tuple[ExpertGroup, ...]:
    """Every MoE layer of the graph (none for a dense model)."""
    w = Walker(results)
    by_source: dict[str, list[tuple[Block, frozenset[int]]]] = defaultdict(list)
    sizes: dict[str, tuple[int, int, int]] = {}
    for b in s.blocks:
        if b.kind != "mlp":
            continue
        found = _slice_source(w, b)
        if found is not None:
            by_source[found[0]].append((b, found[1]))
    for r in results:
        for t in r.node.outputs:
            if t.name in by_source and t.shape:
                sizes[t.name] = (t.shape[0], t.shape[1] if len(t.shape) > 1 else 0, t.nbytes)
    groups = []
    for name, found in by_source.items():
        experts, slots, nbytes = sizes.get(name, (0, 0, 0))
        if len(found) != experts:
            continue
        found.sort(key=lambda f: f[0].start)
        members = tuple(path | set(b.column) | b.inner | {b.row} for b, path in found)
        rows = tuple(b.row for b, _ in found)
        combine = sum(results[i].node.outputs[0].nbytes for i in rows)
        groups.append(ExpertGroup(members, rows, name, nbytes, combine, slots))
    return tuple(sorted(groups, key=lambda g: min(g.rows)))


@dataclass(frozen=True)
class ExpertPlan:
    """What expert parallelism of degree ``ep`` does to one rank: the experts it holds run on
    ep times the rows, the others' nodes, weights and activations are not on it."""

    ep: int
    groups: tuple[ExpertGroup, ...]
    local: frozenset[int]
    remote: frozenset[int]
    local_tensors: frozenset[str]  # outputs and weights of the local experts' nodes
    remote_tensors: frozenset[str]
    expert_weights: frozenset[str]  # the local experts' parameters


def plan_experts(results: Sequence[NodeResult], groups: Sequence[ExpertGroup], ep: int,
                 ) -> ExpertPlan:
    """The first E / ep experts of every MoE layer are this rank's (every rank is alike)."""
    local: set[int] = set()
    remote: set[int] = set()
    for g in groups:
        if g.experts % ep:
            raise TilecastError(f"ep={ep} does not divide the {g.experts} experts of the MoE "
                                f"layer fed by '{g.source}'")
        keep = g.experts // ep
        for e, nodes in enumerate(g.members):
            (local if e < keep else remote).update(nodes)

    def tensors(nodes: set[int], weights: bool) -> frozenset[str]:
        out = set()
        for i in nodes:
            node = results[i].node
            out.update(t.name for t in node.inputs if t is not None and t.is_initializer)
            if not weights:
                out.update(t.name for t in node.outputs)
        return frozenset(out)

    return ExpertPlan(ep, tuple(groups), frozenset(local), frozenset(remote),
                      tensors(local, False), tensors(remote, False), tensors(local, True))


def grown_forward(results: Sequence[NodeResult], plan: ExpertPlan,
                  base: Mapping[int, MatmulDims] | None = None) -> dict[int, MatmulDims]:
    """The forward dims of the local experts' linears: ep times the rows (of ``base``'s dims
    where given)."""
    out = dict(base or {})
    for i in plan.local:
        mm = out.get(i) or (results[i].cost.matmul if results[i].cost is not None else None)
        if mm is not None:
            out[i] = scaled_forward(mm, plan.ep, 1)
    return out


def expert_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult],
                   plan: ExpertPlan, index: Mapping[str, int]) -> list[Kernel]:
    """The kernels one expert-parallel rank runs (before tensor-parallel sharding)."""
    out = []
    for k in kernels:
        i = index.get(k.nodes[0]) if k.nodes else None
        if i is None:  # a gradient sum or an update of a tensor
            tensor = k.name.rsplit(".", 1)[0]
            if tensor in plan.remote_tensors:
                continue
            if tensor in plan.local_tensors and tensor not in plan.expert_weights:
                k = replace(k, cost=scale_rows(k.cost, None, plan.ep, 1))
        elif i in plan.remote:
            continue
        elif i in plan.local:
            fwd = results[i].cost.matmul if results[i].cost is not None else None
            k = replace(k, cost=scale_rows(k.cost, fwd, plan.ep, 1))
        out.append(k)
    return out


__all__ = ["ExpertGroup", "ExpertPlan", "recognize_experts", "plan_experts", "grown_forward",
           "expert_kernels"]
