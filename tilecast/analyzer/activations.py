"""Decomposed activations: one kernel, as the framework runs them.

Exporters write some activations as chains of elementwise nodes: the legacy torch.onnx exporter
turns ``F.gelu`` into ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``, tanh-GELU into
Mul/Add/Tanh chains, SiLU into ``Mul(x, Sigmoid(x))``. PyTorch launches one kernel for each of
these framework ops, and graph runtimes fuse the chains back (onnxruntime's GELU fusion). So a
chain anchored on a transcendental node (Erf, Tanh, Sigmoid) whose only non-constant input is
one tensor ``x``, and whose intermediates are read only inside the chain, becomes one kernel on
its last node: reads ``x`` once, writes the result once, with the chain's FLOPs. The other
nodes are zero-cost with :data:`FUSED_ACTIVATION`. Decided from the data flow, never from node
names.

Which chains are a framework op is a matter of opset. ONNX has a Gelu op from opset 20, and
exporters at that opset write ``F.gelu`` (either form) as that one node; an Erf or Tanh chain
there is the model's own Python (Hugging Face's ``NewGELUActivation`` in GPT-2: pow, four muls,
two adds, tanh), which eager PyTorch runs node by node (the labels' per-node CSVs time those
eight kernels). So in the eager runtime such chains stay as their nodes; graph runtimes fuse
them. SiLU has no ONNX op before Swish (opset 24), so its chain is ``F.silu`` at every opset.
"""

from __future__ import annotations

from dataclasses import replace

from .analysis import NodeResult, readers_of
from .runtime import PYTORCH_RUNTIMES
from .types import NodeView, TensorInfo

FUSED_ACTIVATION = "part of a decomposed activation run as one kernel (e.g. GELU)"
ANCHORS = frozenset({"Erf", "Tanh", "Sigmoid"})
GELU_ANCHORS = frozenset({"Erf", "Tanh"})
GELU_OP_SINCE = 20  # the ONNX opset that added Gelu
# What a gating chain (one whose result multiplies x itself: x * f(x)) computes, by its anchor:
# x * Phi(x) (erf or its tanh approximation) is GELU, x * sigmoid(a x) the Swish family (SiLU,
# a = 1; "quick GELU", a = 1.702). A chain that does not gate x (a soft cap, c * tanh(x / c))
# is fused all the same but named nothing, so no epilogue takes it for a GELU.
GATED = {"Erf": "Gelu", "Tanh": "Gelu", "Sigmoid": "Swish"}
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


def _live(node: NodeView) -> list[TensorInfo]:
    return [t for t in node.inputs if not _constant(t)]


def _upstream(i: int, results: tuple[NodeResult, ...],
              producer: dict[str, int]) -> tuple[set[int], TensorInfo] | None:
    """The arithmetic nodes feeding anchor ``i`` and the one tensor ``x`` they all start from.

    The whole cone of arithmetic ancestors when it has a single outside input (tanh-GELU's
    ``x + 0.044715 x^3`` reads x twice), else the straight single-input run above the anchor
    (a cone that reaches past x, e.g. into a residual Add, has several outside inputs)."""
    cone, todo = {i}, [i]
    while todo and len(cone) < MAX_CHAIN:
        for t in _live(results[todo.pop()].node):
            j = producer.get(t.name)
            if j is not None and j not in cone and _arithmetic(results[j]):
                cone.add(j)
                todo.append(j)
    made = {t.name for k in cone for t in results[k].node.outputs}
    sources = {t.name: t for k in cone for t in _live(results[k].node) if t.name not in made}
    if len(sources) == 1 and len(cone) <= MAX_CHAIN:
        return cone, next(iter(sources.values()))
    first = results[i].node.input(0)
    group, j = {i}, producer.get(first.name) if first is not None else None
    while j is not None and _arithmetic(results[j]) and len(group) < MAX_CHAIN:
        live = _live(results[j].node)
        if len(live) != 1:
            break
        group.add(j)
        j = producer.get(live[0].name)
    x = next(iter(_live(results[min(group)].node)), None)
    return (group, x) if x is not None else None


def _chain(i: int, results: tuple[NodeResult, ...], producer: dict[str, int],
           readers: dict[str, list[int]]) -> tuple[list[int], TensorInfo, bool] | None:
    """(node indices in graph order, the source x, whether the chain gates x: a node past the
    anchor's argument reads x itself) of the activation anchored at node i."""
    up = _upstream(i, results, producer)
    if up is None:
        return None
    group, x = up
    argument = set(group)
    inside = {t.name for k in group for t in results[k].node.outputs}
    frontier = True
    while frontier and len(group) < MAX_CHAIN:
        frontier = False
        # readers of the chain's values, and of x itself (0.5 * x, then times the rest)
        for k in sorted({r for name in (*inside, x.name) for r in readers.get(name, ())
                         if r >= 0} - group):
            node = results[k].node
            ok = _arithmetic(results[k]) and all(
                _constant(t) or t.name in inside or t.name == x.name for t in node.inputs)
            if ok and _joins(node, inside, results, readers):
                group.add(k)
                inside.update(t.name for t in node.outputs)
                frontier = True
    order = sorted(group)
    last = results[order[-1]].node.outputs[0].name
    for k in order[:-1]:  # intermediates may only be read inside the chain
        for t in results[k].node.outputs:
            if t.name == last or any(r not in group for r in readers.get(t.name, ())):
                return None
    gates = any(x.name in {t.name for t in results[k].node.inputs if t is not None}
                for k in order if k not in argument)
    return (order, x, gates) if len(order) > 1 else None


def _joins(node: NodeView, inside: set[str], results: tuple[NodeResult, ...],
           readers: dict[str, list[int]]) -> bool:
    """Arithmetic on x, constants and chain values joins the chain when it reads a chain
    value, or when it reads x alone and a reader of its result reads a chain value
    (``0.5 * x`` feeds ``(0.5 x) * (1 + tanh(...))``)."""
    if any(t is not None and t.name in inside for t in node.inputs):
        return True
    return any(t is not None and t.name in inside
               for o in node.outputs for r in readers.get(o.name, ()) if r >= 0
               for t in results[r].node.inputs)


def _fused(last: NodeView, x: TensorInfo, results: tuple[NodeResult, ...],
           order: list[int], activation: str) -> NodeResult:
    out = last.outputs[0]
    flops = sum(results[k].cost.flops for k in order)
    cost = replace(results[order[-1]].cost, flops=flops, bytes=x.nbytes + out.nbytes)
    return NodeResult(replace(last, inputs=(x,)), "costed", cost, activation=activation)


def fuse_activations(results: tuple[NodeResult, ...],
                     graph_outputs: frozenset[str] = frozenset(), *, runtime: str = "graph",
                     opset: int = 0) -> tuple[NodeResult, ...]:
    """Fuse every decomposed activation; in PyTorch's runtimes, not the GELU chains of a graph
    whose default-domain ``opset`` has the Gelu op (model code: each node is a kernel)."""
    model_code = (GELU_ANCHORS if runtime in PYTORCH_RUNTIMES and opset >= GELU_OP_SINCE
                  else frozenset())
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    readers = readers_of(results, graph_outputs)  # -1: a graph output, read outside any chain
    out, taken = list(results), set()
    for i, r in enumerate(results):
        if r.node.op_type not in ANCHORS - model_code or not _elementwise(r) or i in taken:
            continue
        found = _chain(i, results, producer, readers)
        if found is None or taken & set(found[0]):
            continue
        order, x, gates = found
        taken.update(order)
        name = GATED[r.node.op_type] if gates else ""
        out[order[-1]] = _fused(results[order[-1]].node, x, results, order, name)
        for k in order[:-1]:
            node = results[k].node
            out[k] = NodeResult(replace(node, inputs=(), outputs=()), "zero", None,
                                FUSED_ACTIVATION)
    return tuple(out)
