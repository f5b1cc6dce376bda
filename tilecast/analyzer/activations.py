"""Decomposed activations: one kernel, as the framework runs them.

Exporters write some activations as chains of elementwise nodes: the legacy torch.onnx exporter
turns ``F.gelu`` into ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``, tanh-GELU into
Pow/Mul/Add/Tanh chains, SiLU into ``Mul(x, Sigmoid(x))``. PyTorch launches one kernel for each
of these ops, and graph runtimes fuse the chains back (onnxruntime's GELU fusion). So a chain
anchored on a transcendental node (Erf, Tanh, Sigmoid) whose only non-constant input is one
tensor ``x``, and whose intermediates are read only inside the chain, becomes one kernel on its
last node: reads ``x`` once, writes the result once, with the chain's FLOPs. The other nodes are
zero-cost with :data:`FUSED_ACTIVATION`. Decided from the data flow, never from node names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from .analysis import NodeResult
from .types import NodeView, TensorInfo

FUSED_ACTIVATION = "part of a decomposed activation run as one kernel (e.g. GELU)"
ANCHORS = frozenset({"Erf", "Tanh", "Sigmoid"})
# What the chains around an anchor are made of: arithmetic with constants or with x.
ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Neg"})
MAX_CHAIN = 12  # nodes; every decomposition tilecast has met has at most 8


def _constant(t: TensorInfo | None) -> bool:
    return t is None or t.is_initializer or (t.shape is not None and t.numel <= 1)


def _elementwise(r: NodeResult) -> bool:
    return r.outcome == "costed" and r.cost is not None and r.cost.family == "elementwise" \
        and not r.node.domain


def _arithmetic(r: NodeResult) -> bool:
    return _elementwise(r) and r.node.op_type in ARITHMETIC


def _chain(i: int, results: tuple[NodeResult, ...], producer: dict[str, int],
           readers: dict[str, list[int]]) -> tuple[list[int], TensorInfo] | None:
    """(node indices in graph order, the source x) of the activation anchored at node i."""
    anchor = results[i].node
    group, x = {i}, None
    j = producer.get(anchor.inputs[0].name) if anchor.inputs and anchor.inputs[0] else None
    while j is not None and _arithmetic(results[j]) and len(group) < MAX_CHAIN:
        live = [t for t in results[j].node.inputs if not _constant(t)]
        if len(live) != 1:
            break
        group.add(j)
        j = producer.get(live[0].name)
    first = results[min(group)].node
    x = next((t for t in first.inputs if not _constant(t)), None)
    if x is None:
        return None
    inside = {t.name for k in group for t in results[k].node.outputs}
    frontier = True
    while frontier and len(group) < MAX_CHAIN:
        frontier = False
        for k in sorted({r for name in inside for r in readers.get(name, ()) if r >= 0} - group):
            node = results[k].node
            ok = _arithmetic(results[k]) and all(
                _constant(t) or t.name in inside or t.name == x.name for t in node.inputs)
            if ok:
                group.add(k)
                inside.update(t.name for t in node.outputs)
                frontier = True
    order = sorted(group)
    last = results[order[-1]].node.outputs[0].name
    for k in order[:-1]:  # intermediates may only be read inside the chain
        for t in results[k].node.outputs:
            if t.name == last or any(r not in group for r in readers.get(t.name, ())):
                return None
    return (order, x) if len(order) > 1 else None


def _fused(last: NodeView, x: TensorInfo, results: tuple[NodeResult, ...],
           order: list[int]) -> NodeResult:
    out = last.outputs[0]
    flops = sum(results[k].cost.flops for k in order)
    cost = replace(results[order[-1]].cost, flops=flops, bytes=x.nbytes + out.nbytes)
    return NodeResult(replace(last, inputs=(x,)), "costed", cost)


def fuse_activations(results: tuple[NodeResult, ...],
                     graph_outputs: frozenset[str] = frozenset()) -> tuple[NodeResult, ...]:
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    readers: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        for t in r.node.inputs:
            if t is not None:
                readers[t.name].append(i)
    for name in graph_outputs:
        readers[name].append(-1)  # a graph output is read outside any chain
    out, taken = list(results), set()
    for i, r in enumerate(results):
        if r.node.op_type not in ANCHORS or not _elementwise(r) or i in taken:
            continue
        found = _chain(i, results, producer, readers)
        if found is None or taken & set(found[0]):
            continue
        order, x = found
        taken.update(order)
        out[order[-1]] = _fused(results[order[-1]].node, x, results, order)
        for k in order[:-1]:
            node = results[k].node
            out[k] = NodeResult(replace(node, inputs=(), outputs=()), "zero", None,
                                FUSED_ACTIVATION)
    return tuple(out)
