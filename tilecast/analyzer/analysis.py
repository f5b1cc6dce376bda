"""Give every node its outcome: costed, zero-cost (with a reason), unsupported (no formula) or
unshaped (a formula, but shapes that cannot be known): the last two get a flagged estimate."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ShapeError, TilecastError
from . import costs  # noqa: F401  (importing the package registers every formula)
from .graph import CONTROL_FLOW, Graph
from .registry import REGISTRY, CostEntry, CostRegistry, ZeroCost
from .types import NodeView, OpCost

OUTCOMES = ("costed", "zero", "unsupported", "unshaped")
_GENERATION = ("a generation loop: its decoder subgraph runs once per generated token and is "
               "not costed; forecast one decoder step with `tilecast serve` or the decoder "
               "graph itself")
# ONNX Runtime contrib ops whose work no formula can know, with the reason shown.
OPAQUE = {
    **{("com.microsoft", op): _GENERATION
       for op in ("BeamSearch", "GreedySearch", "Sampling", "WhisperBeamSearch")},
    ("com.microsoft", "EPContext"): "an execution provider's precompiled engine (TensorRT, "
                                    "QNN, OpenVINO): the graph it runs is not in the model",
}
OPAQUE_DOMAINS = {
    "com.microsoft.nchwc": "ONNX Runtime's blocked CPU layout (NCHWc, written by its "
                           "ORT_ENABLE_ALL optimizer on x86): no GPU runs it; save the model "
                           "with ORT_ENABLE_EXTENDED or lower for a GPU forecast",
}


@dataclass(frozen=True)
class NodeResult:
    node: NodeView
    outcome: str  # one of OUTCOMES
    cost: OpCost | None  # None for zero-cost nodes
    reason: str = ""  # why zero-cost, unsupported or unshaped
    # The framework activation a fused chain of elementwise nodes computes ("Gelu", "Swish";
    # activations.py), so a library epilogue can take it (epilogues.py); "" elsewhere.
    activation: str = ""

    @property
    def op_key(self) -> str:
        """op_type, qualified by its domain outside the default ONNX domain."""
        d = self.node.domain
        return f"{d}::{self.node.op_type}" if d else self.node.op_type


def _known(t: object) -> bool:
    return t is not None and t.shape is not None and -1 not in t.shape


def _estimated_bytes(node: NodeView) -> int:
    """Bytes of the tensors whose shapes are known; an output of unknown shape is assumed as
    large as the largest input (ops ONNX cannot infer mostly keep their input's size)."""
    seen: dict[str, int] = {t.name: t.nbytes for t in node.inputs if _known(t)}
    largest = max(seen.values(), default=0)
    for t in node.outputs:
        seen[t.name] = t.nbytes if _known(t) else largest
    return sum(seen.values())


def _main_dtype(node: NodeView) -> str:
    for t in (*node.outputs, *node.inputs):
        if t is not None and t.dtype != "unknown":
            return t.dtype
    return "float32"


def unsupported_result(node: NodeView, reason: str, outcome: str = "unsupported",
                       ) -> NodeResult:
    """A bytes-only, memory-bound estimate flagged ``estimated`` -- never a silent zero.
    Its family is the outcome, so reports show unsupported and unshaped work apart."""
    nbytes = _estimated_bytes(node)
    cost = OpCost(outcome, 0, nbytes, _main_dtype(node), estimated=True,
                  elements=sum(t.numel for t in node.outputs if _known(t)))
    return NodeResult(node, outcome, cost, reason)


def _unknown_shapes(node: NodeView) -> list[str]:
    """Names of the node's named values whose shape is not fully known."""
    return [t.name for t in (*node.inputs, *node.outputs)
            if t is not None and t.name and not _known(t)]


def _check_bound(graph: Graph, node: NodeView) -> NodeResult | None:
    """None when every shape of the node is known; else an error when the caller left graph
    input dims unbound (they are what to bind), else an ``unshaped`` estimate."""
    unknown = _unknown_shapes(node)
    if not unknown:
        return None
    if graph.unbound_inputs:
        names = ", ".join(f"'{d}'" for d in graph.unbound_inputs)
        binds = " ".join(f"--dim {d}=VALUE" for d in graph.unbound_inputs)
        several = len(graph.unbound_inputs) > 1
        raise ShapeError(f"graph input dim{'s' if several else ''} {names} "
                         f"{'are' if several else 'is'} unbound (needed at node '{node.name}' "
                         f"({node.op_type}, shapes {node.shape_str()})); bind "
                         f"{'them' if several else 'it'} with {binds}")
    return unsupported_result(node, f"shape of {unknown[0]!r} cannot be derived "
                                    f"(shapes {node.shape_str()})", outcome="unshaped")


def unshaped_root(results: Iterable[NodeResult]) -> str:
    """Where shape propagation stopped: the first node whose inputs are all shaped and whose
    outputs are not (the unshaped nodes after it inherit the unknown). Its shapes say why: a
    data-dependent output (NonZero), inputs the op rejects (a graph traced at one size and
    bound to another), or an unsupported or zero-cost op nothing infers (said so)."""
    results = list(results)
    if not any(r.outcome == "unshaped" for r in results):
        return ""
    label = {"unshaped": "", "unsupported": ", unsupported", "zero": ", no kernel"}
    for r in results:
        node = r.node
        if r.outcome in label and all(_known(t) for t in node.inputs if t is not None) and \
                not all(_known(t) for t in node.outputs if t.name):
            return f"'{node.name}' ({node.op_type}{label[r.outcome]}, shapes {node.shape_str()})"
    return ""


def cost_node(graph: Graph, node: NodeView, registry: CostRegistry = REGISTRY) -> NodeResult:
    entry = registry.lookup(node.domain, node.op_type, node.opset)
    if isinstance(entry, ZeroCost):
        return NodeResult(node, "zero", None, entry.reason)
    if isinstance(entry, CostEntry):
        return _check_bound(graph, node) or NodeResult(node, "costed", entry.fn(node))
    if node.op_type in CONTROL_FLOW and not node.domain:
        return unsupported_result(node, f"control flow ({node.op_type}): its subgraphs "
                                        "are not costed")
    if (node.domain, node.op_type) in OPAQUE or node.domain in OPAQUE_DOMAINS:
        reason = OPAQUE.get((node.domain, node.op_type)) or OPAQUE_DOMAINS[node.domain]
        return unsupported_result(node, reason)
    where = f"domain '{node.domain}'" if node.domain else "the ONNX domain"
    return unsupported_result(node, f"no cost formula for {node.op_type} in {where} "
                                    f"(opset {node.opset})")


def cost_graph(graph: Graph, registry: CostRegistry = REGISTRY) -> tuple[NodeResult, ...]:
    results = []
    for node in graph.nodes:
        try:
            results.append(cost_node(graph, node, registry))
        except TilecastError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
            # A formula met a graph it cannot read: say where, instead of a traceback.
            raise ShapeError(f"cannot cost node '{node.name}' ({node.op_type}, shapes "
                             f"{node.shape_str()}): {exc}") from None
    return tuple(results)


def readers_of(results: Sequence[NodeResult],
               graph_outputs: Iterable[str] = ()) -> dict[str, list[int]]:
    """Tensor name -> the indices of the nodes that read it, once per input slot (a node that
    reads a tensor twice is listed twice), and -1 for each graph output (read outside)."""
    readers: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        for t in r.node.inputs:
            if t is not None:
                readers[t.name].append(i)
    for name in graph_outputs:
        readers[name].append(-1)
    return readers
