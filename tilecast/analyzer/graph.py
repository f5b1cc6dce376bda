"""Load an ONNX model without its weights and complete the shape of every value.

Weights are never read: ``onnx.load(..., load_external_data=False)`` keeps external tensors as
references, and initializer shapes come from TensorProto dims. Shapes come from the graph's own
value_info when complete (exporters write it), else from ONNX shape inference, plus tilecast's
rules for ops ONNX does not know (``shape_rules.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from ..errors import ModelLoadError, ShapeError
from .shape_rules import complete_missing_shapes
from .types import DTYPES, NodeView, TensorInfo
from .validate import validate_graph

CONTROL_FLOW = ("If", "Loop", "Scan", "SequenceMap")


@dataclass(frozen=True)
class Graph:
    """A shape-complete graph: nodes in topological order as typed views."""

    name: str
    nodes: tuple[NodeView, ...]
    opsets: Mapping[str, int]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[str, ...] = ()
    unbound_dims: Mapping[str, str] = field(default_factory=dict)  # tensor -> first dim name

    def unbound_in(self, node: NodeView) -> list[tuple[str, str]]:
        """(tensor, dim name) pairs of the node's values whose shape holds an unbound dim."""
        names = [t.name for t in (*node.inputs, *node.outputs) if t is not None]
        return [(n, self.unbound_dims[n]) for n in names if n in self.unbound_dims]


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model file without external weight data, with clear errors for bad files."""
    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, json_format.ParseError, ...
        raise ModelLoadError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'decode failed'})"
                             ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{path} is not an ONNX model (no graph found)")
    return model


def _bind_dims(model: onnx.ModelProto, dims: Mapping[str, int]) -> None:
    """Replace symbolic dims named in ``dims`` by their values, everywhere they appear."""
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])


def _has_shape(vi: onnx.ValueInfoProto) -> bool:
    return vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Values whose shape the graph records (an output declared without a type is not known;
    later entries never hide an earlier shaped one)."""
    g = model.graph
    out: dict[str, onnx.ValueInfoProto] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if _has_shape(vi) or vi.name not in out:
            out[vi.name] = vi
    return out


def _needs_inference(model: onnx.ModelProto, known: Mapping[str, Any]) -> bool:
    inits = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        for out in node.output:
            if out and out not in inits and (out not in known or not _has_shape(known[out])):
                return True
    return False


def _tensor_info(name: str, vi: onnx.ValueInfoProto | None, unbound: dict[str, str],
                 ) -> TensorInfo:
    if vi is None or not vi.type.HasField("tensor_type"):
        return TensorInfo(name, None, "unknown")
    tt = vi.type.tensor_type
    dtype = DTYPES.get(tt.elem_type, ("unknown", 4))[0]
    if not tt.HasField("shape"):
        return TensorInfo(name, None, dtype)
    shape = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        else:
            unbound.setdefault(name, d.dim_param or "?")
            shape.append(-1)
    return TensorInfo(name, tuple(shape), dtype)


def _initializer_info(t: onnx.TensorProto) -> TensorInfo:
    return TensorInfo(t.name, tuple(t.dims), DTYPES.get(t.data_type, ("unknown", 4))[0],
                      is_initializer=True)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            out[a.name] = "<subgraph>"  # control-flow bodies are not costed (reported)
        elif a.type == onnx.AttributeProto.TENSOR:
            out[a.name] = a.t  # Constant values: read lazily by the few rules that need them
        else:
            out[a.name] = helper.get_attribute_value(a)
    return out


def _inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    if not model.functions:
        return model
    import onnx.inliner  # only models with local functions pay for this import

    return onnx.inliner.inline_local_functions(model)


def build_graph(model: onnx.ModelProto, dims: Mapping[str, int] | None = None) -> Graph:
    """Bind symbolic dims, complete shapes, and return typed node views."""
    model = _inline_functions(model)
    validate_graph(model)
    if dims:
        _bind_dims(model, dims)
    known = _value_infos(model)
    if _needs_inference(model, known):
        model = _infer(model)
        if dims:
            _bind_dims(model, dims)
        model = complete_missing_shapes(model, _infer)
        known = _value_infos(model)
    unbound: dict[str, str] = {}
    values: dict[str, TensorInfo] = {t.name: _initializer_info(t)
                                     for t in model.graph.initializer}
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    nodes = []
    for i, node in enumerate(model.graph.node):
        nodes.append(_node_view(node, i, values, known, unbound, opsets))
    g_inputs = tuple(values.get(vi.name) or _tensor_info(vi.name, vi, unbound)
                     for vi in model.graph.input)
    g_outputs = tuple(vi.name for vi in model.graph.output)
    return Graph(model.graph.name or "model", tuple(nodes), opsets, g_inputs, g_outputs, unbound)


def _lookup(name: str, values: dict[str, TensorInfo], known: Mapping[str, Any],
            unbound: dict[str, str]) -> TensorInfo:
    info = values.get(name)
    if info is None:
        info = _tensor_info(name, known.get(name), unbound)
        values[name] = info
    return info


def _node_view(node: onnx.NodeProto, index: int, values: dict[str, TensorInfo],
               known: Mapping[str, Any], unbound: dict[str, str],
               opsets: Mapping[str, int]) -> NodeView:
    ins = tuple(_lookup(n, values, known, unbound) if n else None for n in node.input)
    outs = tuple(_lookup(n, values, known, unbound) for n in node.output)
    domain = "" if node.domain == "ai.onnx" else node.domain
    return NodeView(node.name or f"{node.op_type}_{index}", node.op_type, domain, ins, outs,
                    _attrs(node), opsets.get(domain, 0))


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
        raise ShapeError(f"ONNX shape inference failed: {str(exc).splitlines()[0]}") from None
