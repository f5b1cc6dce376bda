"""Check a graph's structure before analysis: the errors name the node and what was expected.

Checked (one pass over the nodes, never over weight bytes): nodes in topological order (which
also rules out cycles), single assignment, every input produced by an earlier node, an
initializer or a graph input, every graph output produced, the required inputs of each op
present (arity from the op schemas ``onnx.defs`` ships, so no hand-kept list), and valid
element types on graph inputs, outputs, value_info and initializers. Subgraph bodies of
control-flow nodes are not checked (tilecast does not cost them). Ops without a registered
schema (custom domains, ops newer than the installed onnx) skip the arity check.
"""

from __future__ import annotations

import functools

import onnx
from onnx import defs

from ..errors import InvalidGraphError

_VALID_ELEM_TYPES = frozenset(onnx.TensorProto.DataType.values())
_SINGLE = defs.OpSchema.FormalParameterOption.Single
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic


@functools.lru_cache(maxsize=1024)
def _schema(op_type: str, version: int, domain: str) -> defs.OpSchema | None:
    try:
        return defs.get_schema(op_type, version, domain)
    except defs.SchemaError:
        return None


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"node '{node.name or f'{node.op_type}_{index}'}' ({node.op_type})"


def _check_arity(node: onnx.NodeProto, where: str, opsets: dict[str, int]) -> None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = opsets.get(domain)
    schema = _schema(node.op_type, version, domain) if version else None
    if schema is None:
        return
    inputs = node.input
    if len(inputs) > schema.max_input:
        raise InvalidGraphError(f"{where} has {len(inputs)} inputs; opset {version} "
                                f"{node.op_type} takes at most {schema.max_input}")
    for i, formal in enumerate(schema.inputs):
        if formal.option == _SINGLE and (i >= len(inputs) or not inputs[i]):
            raise InvalidGraphError(f"{where}: required input #{i} '{formal.name}' is missing "
                                    f"(opset {version} {node.op_type} needs at least "
                                    f"{schema.min_input} inputs)")
        if formal.option == _VARIADIC and len(inputs) - i < formal.min_arity:
            raise InvalidGraphError(f"{where}: variadic input '{formal.name}' needs at least "
                                    f"{formal.min_arity} values, got {max(len(inputs) - i, 0)}")


def _check_elem_types(graph: onnx.GraphProto) -> None:
    for kind, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("value_info", graph.value_info)):
        for vi in values:
            if vi.type.HasField("tensor_type"):
                elem = vi.type.tensor_type.elem_type
                if elem not in _VALID_ELEM_TYPES:
                    raise InvalidGraphError(f"{kind} '{vi.name}' has element type {elem}, not "
                                            "an ONNX TensorProto.DataType value")
    for t in graph.initializer:
        if t.data_type not in _VALID_ELEM_TYPES or t.data_type == onnx.TensorProto.UNDEFINED:
            raise InvalidGraphError(f"initializer '{t.name}' has element type {t.data_type}, "
                                    "not an ONNX TensorProto.DataType value")


def validate_graph(model: onnx.ModelProto) -> None:
    """Raise :class:`InvalidGraphError` naming the first node (or value) that breaks the
    structure the analysis relies on. Cost: one pass over nodes and value names."""
    g = model.graph
    _check_elem_types(g)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    available = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    available |= {vi.name for vi in g.input}
    producer: dict[str, str] = {}
    later = {out for node in g.node for out in node.output if out}
    for index, node in enumerate(g.node):
        where = _label(node, index)
        for name in node.input:
            if name and name not in available:
                reason = ("is produced by a later node: the graph has a cycle or is not in "
                          "topological order" if name in later else
                          "is produced by no node, initializer or graph input")
                raise InvalidGraphError(f"{where}: input '{name}' {reason}")
        _check_arity(node, where, opsets)
        for name in node.output:
            if not name:
                continue
            if name in available:
                first = producer.get(name, "an initializer or graph input")
                raise InvalidGraphError(f"{where}: output '{name}' is already assigned by "
                                        f"{first} (ONNX graphs are single assignment)")
            available.add(name)
            producer[name] = where
    for vi in g.output:
        if vi.name not in available:
            raise InvalidGraphError(f"graph output '{vi.name}' is produced by no node, "
                                    "initializer or graph input")
