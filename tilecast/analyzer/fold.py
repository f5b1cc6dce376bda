"""What runs where: nodes that never launch a GPU kernel per pass, found from the data flow.

- ``folded at load``: a node all of whose inputs are constants (initializers, ``Constant``
  outputs, outputs of nodes already folded) computes the same value on every pass. ONNX
  Runtime's ConstantFolding transformer evaluates it once when the session loads, and PyTorch
  never runs it (a tied embedding's ``.t()`` is a view; a weight's dequantization happens once).
  Random ops are never folded: each pass draws new values.
- ``host``: shape arithmetic. Values derived only from ``Shape`` / ``Size`` outputs and
  constants, of at most :data:`HOST_MAX_ELEMENTS` elements, are sizes and numbers computed
  from sizes (torch.onnx writes SDPA's default scale as Shape -> Slice -> Cast -> Sqrt -> Div:
  ``1 / math.sqrt(q.size(-1))``, a Python float in PyTorch; folded once the shapes are bound
  where a runtime sees it): PyTorch computes them in Python on the host, and ONNX Runtime
  places such subgraphs on the CPU (``GetCpuPreferredNodes`` in ``onnxruntime/core/framework/
  fallback_cpu_capability.cc``: a node whose inputs are all CPU tensors or small initializers
  runs on the CPU). Node names are never consulted.

Both become zero-cost results carrying their reason; the nodes keep their inputs and outputs,
so consumers (and training mode) still see the tensors they read. QDQ rewrites (``qdq.py``)
run on the same data flow right after.
"""

from __future__ import annotations

from collections.abc import Sequence

from .analysis import NodeResult
from .qdq import fuse_qdq
from .types import NodeView

FOLDED = "folded at load"
HOST = "host"
# ONNX Runtime's kSmallInitializerThreshold (fallback_cpu_capability.cc): initializers of at
# most 100 elements count as CPU-side inputs of a shape subgraph. The same bound caps a host
# value: a shape vector has one element per dim, far below it.
HOST_MAX_ELEMENTS = 100
HOST_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16",
                         "uint8", "bool", "float64", "float32", "float16", "bfloat16"})
SHAPE_SOURCES = frozenset({"Shape", "Size"})
RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"})
# Domains whose ops ONNX Runtime can evaluate on the CPU while folding.
FOLDABLE_DOMAINS = frozenset({"", "com.microsoft"})


def _inputs(node: NodeView) -> list[str]:
    return [t.name for t in node.inputs if t is not None and t.name]


def _small_value(node: NodeView) -> bool:
    return all(t.dtype in HOST_DTYPES and t.known and t.numel <= HOST_MAX_ELEMENTS
               for t in node.outputs if t.name)


def _has_subgraph(node: NodeView) -> bool:
    return any(v == "<subgraph>" for v in node.attrs.values())


def _place(node: NodeView, const: set[str], host: set[str]) -> str | None:
    """FOLDED, HOST or None (runs on the GPU) for one node, from its inputs' placement."""
    ins = _inputs(node)
    if node.domain not in FOLDABLE_DOMAINS or node.op_type in RANDOM or _has_subgraph(node):
        return None
    if not ins:
        return FOLDED if node.op_type == "Constant" and not node.domain else None
    if all(n in const for n in ins):
        return FOLDED
    if not node.domain and node.op_type in SHAPE_SOURCES:
        return HOST
    if all(n in const or n in host for n in ins) and _small_value(node):
        return HOST
    return None


def placements(results: Sequence[NodeResult]) -> list[str | None]:
    """Per node, in graph order: FOLDED, HOST, or None for a node that runs on the GPU."""
    const = {t.name for r in results for t in r.node.inputs
             if t is not None and t.is_initializer}
    host: set[str] = set()
    out: list[str | None] = []
    for r in results:
        where = _place(r.node, const, host)
        names = {t.name for t in r.node.outputs if t.name}
        if where == FOLDED:
            const |= names
        elif where == HOST:
            host |= names
        out.append(where)
    return out


def fold_load_time(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    """Folded and host-side nodes become zero-cost with their reason; then QDQ rewrites."""
    where = placements(results)
    out = []
    for r, w in zip(results, where, strict=True):
        # Every node off the GPU carries that reason, views of host values and constants
        # included (a Reshape of a weight, an Unsqueeze of a size): it says where they run.
        if w is not None:
            r = NodeResult(r.node, "zero", None, w)
        out.append(r)
    return fuse_qdq(tuple(out), where)
