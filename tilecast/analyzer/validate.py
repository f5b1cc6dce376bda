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
def _arity(op_type: str, version: int, domain: str) -> tuple[int, tuple[tuple[int, str], ...],
                                                            tuple[int, str, int] | None] | None:
    """(max inputs, required (position, name)s, variadic (position, name, min count)) of the
    op's schema, or None when onnx.defs has no schema for it."""
    try:
        schema = defs.get_schema(op_type, version, domain)
    except defs.SchemaError:
        return None
    required = tuple((i, f.name) for i, f in enumerate(schema.inputs) if f.option == _SINGLE)
    variadic = next(((i, f.name, f.min_arity) for i, f in enumerate(schema.inputs)
                     if f.option == _VARIADIC), None)
    return schema.max_input, required, variadic


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"node '{node.name or f'{node.op_type}_{index}'}' ({node.op_type})"


def _check_arity(node: onnx.NodeProto, index: int, opsets: dict[str, int]) -> None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = opsets.get(domain)
    arity = _arity(node.op_type, version, domain) if version else None
    if arity is None:
        return
    most, required, variadic = arity
    inputs = node.input
    if len(inputs) > most:
        raise InvalidGraphError(f"{_label(node, index)} has {len(inputs)} inputs; opset "
                                f"{version} {node.op_type} takes at most {most}")
    for i, name in required:
        if i >= len(inputs) or not inputs[i]:
            raise InvalidGraphError(f"{_label(node, index)}: required input #{i} '{name}' is "
                                    f"missing (opset {version} {node.op_type})")
    if variadic is not None and len(inputs) - variadic[0] < variadic[2]:
        raise InvalidGraphError(f"{_label(node, index)}: variadic input '{variadic[1]}' needs "
                                f"at least {variadic[2]} values")


def _check_elem_types(graph: onnx.GraphProto) -> None:
    for kind, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("value_info", graph.value_info)):
        for vi in values:
            # a non-tensor type reads as elem_type 0 (UNDEFINED), which is valid here
            if vi.type.tensor_type.elem_type not in _VALID_ELEM_TYPES:
                raise InvalidGraphError(f"{kind} '{vi.name}' has element type "
                                        f"{vi.type.tensor_type.elem_type}, not an ONNX "
                                        "TensorProto.DataType value")
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
    producer: dict[str, int] = {}
    later = {out for node in g.node for out in node.output if out}
    for index, node in enumerate(g.node):
        for name in node.input:
            if name and name not in available:
                reason = ("is produced by a later node: the graph has a cycle or is not in "
                          "topological order" if name in later else
                          "is produced by no node, initializer or graph input")
                raise InvalidGraphError(f"{_label(node, index)}: input '{name}' {reason}")
        _check_arity(node, index, opsets)
        for name in node.output:
            if not name:
                continue
            if name in available:
                first = producer.get(name)
                by = _label(g.node[first], first) if first is not None else \
                    "an initializer or graph input"
                raise InvalidGraphError(f"{_label(node, index)}: output '{name}' is already "
                                        f"assigned by {by} (ONNX graphs are single assignment)")
            available.add(name)
            producer[name] = index
    for vi in g.output:
        if vi.name not in available:
            raise InvalidGraphError(f"graph output '{vi.name}' is produced by no node, "
                                    "initializer or graph input")
