"""Load an ONNX model without its weights and derive the shape of every value.

Weights are never read: the file is walked without the data of its large tensors
(``weightless.py``), external tensors stay references, and initializer shapes come from
TensorProto dims. The user binds only the graph's input dims; every other dim is derived by one
propagation pass (``propagate.py``), with tilecast's rules for ops ONNX does not know
(``shape_rules.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from ..errors import ModelLoadError, UnknownDimError
from . import dim_exprs
from .causal import CausalMask, abstract_values, causal_masks
from .padding import Unpadded, unpadded_masks
from .propagate import propagate
from .types import DTYPES, NodeView, TensorInfo
from .validate import validate_graph
from .weightless import load_weightless, strip_proto
from .zero_bias import inputs_without_zero_bias, zero_vectors

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
    input_dims: tuple[str, ...] = ()  # the symbolic dims of the graph's inputs
    unbound_inputs: tuple[str, ...] = ()  # those the caller did not bind
    # attention masks (additive or boolean) built as causal ones, and scores filled outside
    # such a band (causal.py): name -> window
    causal_masks: Mapping[str, CausalMask] = field(default_factory=dict)
    # the masks an unpadded batch skips under Hugging Face's SDPA path (padding.py)
    unpadded: Unpadded = field(default_factory=Unpadded)

    def unbound_in(self, node: NodeView) -> list[tuple[str, str]]:
        """(tensor, dim name) pairs of the node's values whose shape holds an unbound dim."""
        names = [t.name for t in (*node.inputs, *node.outputs) if t is not None]
        return [(n, self.unbound_dims[n]) for n in names if n in self.unbound_dims]


def load_model(source: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    """Read a model without its weight bytes (dims and dtypes kept), with clear errors for bad
    files. An in-memory model is copied without its weights; the caller's proto is untouched."""
    if isinstance(source, onnx.ModelProto):
        return strip_proto(source)
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes), not an ONNX model")
    try:
        model = load_weightless(path)
    except Exception as exc:  # the weightless reader's Malformed, protobuf's DecodeError, ...
        raise ModelLoadError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'decode failed'})"
                             ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{path} is not an ONNX model (no graph found)")
    return model


def _named_input_dims(model: onnx.ModelProto) -> tuple[str, ...]:
    inits = {t.name for t in model.graph.initializer}
    names: dict[str, None] = {}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param:
                names.setdefault(d.dim_param)
    return tuple(names)


def _derived(names: tuple[str, ...]) -> tuple[str, ...]:
    """The expression names (``past_sequence_length + sequence``) made only of other input dims:
    their value follows from those. A name like ``seq-len`` whose parts are no input dims is a
    plain dim."""
    return tuple(n for n in names if dim_exprs.is_expression(n)
                 and set(dim_exprs.names_in(n)) <= set(names))


def graph_input_dims(model: onnx.ModelProto) -> tuple[str, ...]:
    """The named symbolic dims of the graph's inputs (initializers excluded), in order, less
    those derived from the others. An ``unk__N`` name on a graph input is still the input's own
    dim, so it can be bound."""
    names = _named_input_dims(model)
    derived = set(_derived(names))
    return tuple(n for n in names if n not in derived)


def _check_dims(dims: Mapping[str, int], input_dims: tuple[str, ...]) -> None:
    unknown = sorted(set(dims) - set(input_dims))
    if unknown:
        have = ", ".join(input_dims) if input_dims else "none (every input dim is fixed)"
        raise UnknownDimError(f"--dim {unknown[0]}: the graph has no input dim named "
                              f"{unknown[0]!r}; its input dims: {have}")


def _tensor_info(name: str, tp: onnx.TypeProto | None, unbound: dict[str, str],
                 ) -> TensorInfo:
    if tp is None or not tp.HasField("tensor_type"):
        return TensorInfo(name, None, "unknown")
    tt = tp.tensor_type
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
    """Derive every shape from the bound input dims and return typed node views. Raises
    ``UnknownDimError`` when ``dims`` names a dim the graph's inputs do not have."""
    model = _inline_functions(model)
    validate_graph(model)
    dims = dict(dims or {})
    input_dims = graph_input_dims(model)
    _check_dims(dims, input_dims)
    bound = dim_exprs.evaluate(_derived(_named_input_dims(model)), dims)
    # with input dims left unbound, unknown shapes are expected: the error will name the dims
    known = propagate(model, bound, fallback=set(input_dims) <= set(dims))
    unbound: dict[str, str] = {}
    values: dict[str, TensorInfo] = {t.name: _initializer_info(t)
                                     for t in model.graph.initializer}
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    zeros = zero_vectors(model)
    nodes = []
    for i, node in enumerate(model.graph.node):
        nodes.append(_node_view(node, i, values, known, unbound, opsets, zeros))
    g_inputs = tuple(values.get(vi.name) or _tensor_info(vi.name, known.get(vi.name), unbound)
                     for vi in model.graph.input)
    g_outputs = tuple(vi.name for vi in model.graph.output)
    values = abstract_values(model, nodes)  # what causal.py and padding.py read masks from
    causal = causal_masks(nodes, values)
    return Graph(model.graph.name or "model", tuple(nodes), opsets, g_inputs, g_outputs, unbound,
                 input_dims, tuple(d for d in input_dims if d not in dims), causal,
                 unpadded_masks(model, nodes, values, causal))


def _lookup(name: str, values: dict[str, TensorInfo], known: Mapping[str, Any],
            unbound: dict[str, str]) -> TensorInfo:
    info = values.get(name)
    if info is None:
        info = _tensor_info(name, known.get(name), unbound)
        values[name] = info
    return info


def _node_view(node: onnx.NodeProto, index: int, values: dict[str, TensorInfo],
               known: Mapping[str, Any], unbound: dict[str, str],
               opsets: Mapping[str, int], zeros: frozenset[str] = frozenset()) -> NodeView:
    domain = "" if node.domain == "ai.onnx" else node.domain
    ins = tuple(_lookup(n, values, known, unbound) if n else None
                for n in inputs_without_zero_bias(node, domain, zeros))
    outs = tuple(_lookup(n, values, known, unbound) for n in node.output)
    return NodeView(node.name or f"{node.op_type}_{index}", node.op_type, domain, ins, outs,
                    _attrs(node), opsets.get(domain, 0))
