"""Fusion groups: the kernels a fusing compiler (torch.compile / inductor style) would launch.

Rules: cheap memory-bound nodes (elementwise, normalization, softmax, reductions, data movement)
join their producer's group when they read its output, so the kernel that computes a value also
computes what reads it and the value is not read back from DRAM. Matmuls, convolutions and
attention stay library kernels of their own and never fuse into each other; an elementwise
group fed only by one matmul is reported as an epilogue that could fuse into it. Zero-cost
nodes (Reshape, ...) are transparent. A group's bytes are its external inputs and outputs
only: a member's output that something outside the group (or the graph's caller) reads is
still written once.

A value with several readers joins each of them that it can without a cycle: a group may not
feed a kernel outside it that feeds the group back (inductor's scheduler makes the same check,
``will_fusion_create_cycle`` in torch/_inductor/scheduler.py, and inlines a pointwise value
into every reader). So an RMSNorm's ``Cast -> Pow -> ReduceMean -> ... -> Mul(x, r)``, where the
cast value has two readers, is one kernel that reads its 16-bit input once, as compiled code
runs it; the residual add before it joins it and still writes its sum for the next residual,
and a Q head transpose that both halves of a rotary embedding read joins the rotary's kernel.

A runtime that fuses only named patterns (Megatron-LM's fused kernels, for one) keeps some of
those joins apart: ``FusionRules`` says which (``multi_reader=False``: a value joins its reader
only when that reader is its only one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .analysis import NodeResult
from .fold import FOLDED
from .graph import Graph
from .types import BroadcastReread, OpCost, RowDims

FUSIBLE = ("elementwise", "normalization", "softmax", "reduction", "movement")
# A fused group is named after its most expensive-to-schedule member: row kernels dominate.
FAMILY_RANK = {"normalization": 4, "softmax": 3, "reduction": 2, "elementwise": 1, "movement": 0}


@dataclass(frozen=True)
class FusionGroup:
    id: int
    members: tuple[int, ...]  # indices into the NodeResult sequence, topological order
    cost: OpCost | None  # None when every member is zero-cost
    op_type: str
    epilogue_of: str | None = None  # matmul/conv node this group could fuse into


@dataclass(frozen=True)
class FusionRules:
    """Which producer -> consumer joins a runtime makes; the default is a fusing compiler's.

    ``softmax_prologue_dtypes``: the dtypes at which a softmax fuses what feeds it (a scale,
    a mask); ``None`` for every dtype. ``multi_reader``: whether a value with several readers
    joins them (a compiler's scheduler) or only a value's single reader does (named patterns).
    Elsewhere the compiler's rule applies.
    """

    softmax_prologue_dtypes: frozenset[str] | None = None
    multi_reader: bool = True

    def joins(self, consumer: NodeResult) -> bool:
        """Whether the consumer's group may take in its producer's."""
        c = consumer.cost
        if self.softmax_prologue_dtypes is None or c is None or c.family != "softmax":
            return True
        return c.dtype in self.softmax_prologue_dtypes


COMPILER = FusionRules()


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _fusible(r: NodeResult) -> bool:
    return r.outcome == "zero" or (r.outcome == "costed" and r.cost.family in FUSIBLE)


def _consumers(results: tuple[NodeResult, ...]) -> dict[str, list[int]]:
    cons: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        for t in r.node.inputs:
            if t is not None and not t.is_initializer:
                cons[t.name].append(i)
    return cons


def fusion_groups(graph: Graph, results: tuple[NodeResult, ...],
                  rules: FusionRules = COMPILER) -> tuple[FusionGroup, ...]:
    """Partition the nodes into fusion groups (every node in exactly one group)."""
    cons = _consumers(results)
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    outputs = set(graph.outputs)
    uf = _join_readers(results, cons, outputs, rules)
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(len(results)):
        members[uf.find(i)].append(i)
    groups = []
    for gid, root in enumerate(sorted(members)):
        idx = tuple(members[root])
        groups.append(_make_group(gid, idx, results, cons, producer, outputs))
    return tuple(groups)


def _join_readers(results: tuple[NodeResult, ...], cons: dict[str, list[int]],
                  outputs: set[str], rules: FusionRules) -> _UnionFind:
    """Union each fusible value's producer with its fusible readers (module doc)."""
    succ = [sorted({u for t in r.node.outputs for u in cons.get(t.name, [])})
            for r in results]
    uf = _UnionFind(len(results))
    members: dict[int, set[int]] = {i: {i} for i in range(len(results))}  # by root
    for i, r in enumerate(results):
        if not _fusible(r):
            continue
        for t in r.node.outputs:
            users = cons.get(t.name, [])
            if not (rules.multi_reader or (len(users) == 1 and t.name not in outputs)):
                continue
            for u in dict.fromkeys(users):
                if not (_fusible(results[u]) and rules.joins(results[u])):
                    continue
                a, b = uf.find(i), uf.find(u)
                if a == b or _closes_cycle(members[a] | members[b], succ):
                    continue
                uf.union(a, b)
                members[uf.find(a)] = members.pop(a) | members.pop(b)
    return uf


def _closes_cycle(merged: set[int], succ: list[list[int]]) -> bool:
    """Whether a path leaves ``merged`` and comes back: the group would wait for a kernel that
    waits for it. Nodes are in topological order, so a path past the group's last node never
    returns."""
    last = max(merged)
    stack = [v for m in merged for v in succ[m] if v not in merged and v < last]
    seen = set(stack)
    while stack:
        for v in succ[stack.pop()]:
            if v in merged:
                return True
            if v not in seen and v < last:
                seen.add(v)
                stack.append(v)
    return False


def _make_group(gid: int, idx: tuple[int, ...], results: tuple[NodeResult, ...],
                cons: dict[str, list[int]], producer: dict[str, int], outputs: set[str],
                ) -> FusionGroup:
    rs = [results[i] for i in idx]
    costed = [r for r in rs if r.cost is not None]
    if len(idx) == 1 or not costed:
        r = rs[0]
        return FusionGroup(gid, idx, r.cost if len(idx) == 1 else None, r.node.op_type,
                           None)
    inside = set(idx)
    ext_in, ext_out = _external_tensors(rs, inside, cons, producer, outputs)
    lead = max(costed, key=lambda r: (FAMILY_RANK.get(r.cost.family, 0), r.cost.bytes))
    cost = OpCost(
        family=lead.cost.family,
        flops=sum(r.cost.flops for r in costed),
        bytes=sum(t.nbytes for t in (*ext_in, *ext_out)),
        dtype=lead.cost.dtype,
        rows=_group_rows(costed),
        elements=max(r.cost.elements for r in costed),
        estimated=any(r.cost.estimated for r in costed),
        reread=_group_reread(costed),
    )
    ops = "+".join(dict.fromkeys(r.node.op_type for r in costed))
    return FusionGroup(gid, idx, cost, f"Fused[{ops}]",
                       _epilogue_of(ext_in, producer, results))


def _group_reread(costed) -> BroadcastReread | None:
    """The members' broadcast re-reads: one kernel still walks each broadcast operand once
    per repeat (the largest slice stands for all)."""
    rr = [r.cost.reread for r in costed if r.cost.reread is not None]
    if not rr:
        return None
    return BroadcastReread(sum(r.bytes for r in rr), max(r.slice_bytes for r in rr),
                           sum(r.operand_bytes for r in rr))


# Ops that read only their input's shape, never its elements.
METADATA_READERS = frozenset({"Shape", "Size"})


def _data_inputs(r: NodeResult) -> tuple:
    """The inputs whose elements the group's kernel reads for ``r``: every input of a costed
    node; of a zero-cost one only the data a view passes through (input 0), not the shapes,
    axes or ratios beside it (host values), and nothing of a node folded at load or of a
    shape query."""
    if r.outcome != "zero":
        return r.node.inputs
    if r.reason == FOLDED or r.node.op_type in METADATA_READERS:
        return ()
    return r.node.inputs[:1]


def _external_tensors(rs, inside, cons, producer, outputs):
    ext_in: dict[str, object] = {}
    ext_out: dict[str, object] = {}
    for r in rs:
        for t in _data_inputs(r):
            if t is not None and producer.get(t.name) not in inside and t.shape is not None:
                ext_in[t.name] = t
        for t in r.node.outputs:
            used_outside = any(c not in inside for c in cons.get(t.name, []))
            if (used_outside or t.name in outputs) and t.shape is not None:
                ext_out[t.name] = t
    return list(ext_in.values()), list(ext_out.values())


def _group_rows(costed: list[NodeResult]) -> RowDims | None:
    rows = [r.cost.rows for r in costed if r.cost.rows is not None]
    return max(rows, key=lambda d: d.rows * d.cols) if rows else None


def _epilogue_of(ext_in, producer, results) -> str | None:
    srcs = {producer[t.name] for t in ext_in if t.name in producer}
    heavy = [i for i in srcs if results[i].cost is not None
             and results[i].cost.family in ("matmul", "conv")]
    return results[heavy[0]].node.name if len(heavy) == 1 else None
