"""One propagation pass: the type and shape of every value, derived from the graph's input dims.

Nodes are visited once, in graph order. Each node's output types come from ONNX's per-node
shape inference (``infer_node_outputs``), fed with the values of the small host-side tensors
computed so far (``Shape -> Gather -> Concat -> Reshape`` arithmetic, ``Range`` limits, ``Slice``
bounds), or from tilecast's rules for com.microsoft ops (``shape_rules.py``). Those small values
are evaluated here with ONNX's reference ops, so once the input dims are bound every dim is a
number. Exporter value_info is only a fallback, and only where its dims are named: anonymous
(``unk__N``) and unnamed dims are exporter guesses that bind to nothing. Weights are never
needed: initializers arrive stripped of their data (``weightless.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .mirrors import mirror_of
from .shape_rules import CORRECTIONS, RULES, VALUE_RULES, Shape
from .weightless import has_data

# Values with at most this many elements are evaluated on the host (shape arithmetic, masks of
# tiny graphs); anything larger is a device tensor whose values tilecast never needs.
SMALL_ELEMENTS = 4096
# Ops whose outputs are not a function of their inputs: never evaluated.
NOT_EVALUATED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                           "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})
INT32_MAX = 2**31 - 1  # SymbolicShapeInference's bound for unknown sizes (its own default)
INFER_ERRORS = (onnx.shape_inference.InferenceError, onnx.checker.ValidationError,
                onnx.defs.SchemaError, RuntimeError, ValueError, TypeError, KeyError)
EVAL_ERRORS = (*INFER_ERRORS, IndexError, ZeroDivisionError, AttributeError, OverflowError,
               NotImplementedError, np.exceptions.AxisError)


def anonymous(d: onnx.TensorShapeProto.Dimension) -> bool:
    """A dim an exporter made up: ``unk__N`` (ONNX's inference), or neither name nor value."""
    if d.HasField("dim_value"):
        return False
    return not d.dim_param or d.dim_param.startswith("unk__")


def _bound(tp: onnx.TypeProto, dims: Mapping[str, int]) -> onnx.TypeProto:
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    if out.HasField("tensor_type") and out.tensor_type.HasField("shape"):
        for d in out.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])
    return out


def _concrete(tp: onnx.TypeProto | None) -> bool:
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in tp.tensor_type.shape.dim)


def shape_of(tp: onnx.TypeProto | None) -> Shape | None:
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in tp.tensor_type.shape.dim)


def _hints(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, onnx.TypeProto]:
    """Exporter-written types whose dims are all values or real names (bound where given)."""
    g = model.graph
    out = {}
    for vi in (*g.value_info, *g.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                not any(anonymous(d) for d in tt.shape.dim):
            out[vi.name] = _bound(vi.type, dims)
    return out


class _Pass:
    def __init__(self, model: onnx.ModelProto, dims: Mapping[str, int]) -> None:
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version
                       for o in model.opset_import}
        self.opset_protos = [helper.make_opsetid(d, v) for d, v in self.opsets.items()]
        self.ir = model.ir_version or onnx.IR_VERSION
        self.types: dict[str, onnx.TypeProto] = {}
        self.data: dict[str, np.ndarray] = {}
        for t in model.graph.initializer:
            self.types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
            if _small(t.dims) and has_data(t):
                self._keep(t.name, _to_array(t))
        for vi in model.graph.input:
            if vi.name not in self.types and vi.type.HasField("tensor_type"):
                self.types[vi.name] = _bound(vi.type, dims)
        self.hints = _hints(model, dims)
        # custom-domain ops that left outputs unknown from known inputs: what the fallback can
        # help with (a data-dependent ONNX op such as NonZero it cannot size either)
        self.custom_roots: list[str] = []

    def _keep(self, name: str, value: np.ndarray | None) -> None:
        if value is not None and value.size <= SMALL_ELEMENTS:
            self.data[name] = value

    def visit(self, node: onnx.NodeProto) -> None:
        inferred = self._infer(node)
        values = self._evaluate(node, inferred)
        for i, name in enumerate(node.output):
            if not name:
                continue
            tp = inferred[i]
            if values is not None and i < len(values) and values[i] is not None:
                self._keep(name, values[i])
                if name in self.data:
                    tp = _type_of(self.data[name])
            if not _concrete(tp) and name in self.hints and \
                    (tp is None or _concrete(self.hints[name])):
                tp = self.hints[name]
            if tp is not None:
                self.types[name] = tp
        if node.domain not in ("", "ai.onnx") and \
                all(_concrete(self.types.get(n)) for n in node.input if n) and \
                not all(_concrete(self.types.get(n)) for n in node.output if n):
            self.custom_roots.append(node.op_type)

    def _infer(self, node: onnx.NodeProto) -> list[onnx.TypeProto | None]:
        domain = "" if node.domain == "ai.onnx" else node.domain
        none: list[onnx.TypeProto | None] = [None] * len(node.output)
        rule = RULES.get((domain, node.op_type))
        if rule is not None:
            return _by_rule(rule, node, self.types) or none
        value_rule = VALUE_RULES.get((domain, node.op_type))
        if value_rule is not None:
            return self._by_value_rule(value_rule, node) or none
        mirror = mirror_of(domain, node.op_type)
        if mirror is not None:  # a contrib op: the standard op it mirrors infers its output
            std = mirror.proto(node)
            outs = None if std is None else self._infer_schema(std, "", mirror.opset,
                                                               as_float=mirror.retype)
            return (outs or []) + none[len(outs or []):]
        outs = self._infer_schema(node, domain, self.opsets.get(domain, 1))
        if outs is None:
            return none
        fix = CORRECTIONS.get((domain, node.op_type))
        return fix(node, outs) if fix else outs

    def _by_value_rule(self, rule: Any, node: onnx.NodeProto,
                       ) -> list[onnx.TypeProto | None] | None:
        first = self.types.get(node.input[0]) if node.input else None
        if first is None or not first.HasField("tensor_type"):
            return None
        try:
            shapes = rule([shape_of(self.types.get(n)) if n else None for n in node.input],
                          [self.data.get(n) for n in node.input])
        except EVAL_ERRORS:
            return None
        elem = first.tensor_type.elem_type
        return [None if s is None else helper.make_tensor_type_proto(elem, list(s))
                for s in list(shapes) + [None] * (len(node.output) - len(shapes))]

    def _infer_schema(self, node: onnx.NodeProto, domain: str, version: int,
                      as_float: bool = False) -> list[onnx.TypeProto | None] | None:
        """ONNX's inference of ``node`` at ``version`` of ``domain``; None when it cannot.
        ``as_float``: on float copies of the input types, the outputs typed as input 0."""
        if any(n and n not in self.types for n in node.input):
            return None
        types = {n: self.types[n] for n in node.input if n}
        if as_float:
            types = {n: _as_float(t) for n, t in types.items()}
        opsets = [p for p in self.opset_protos if p.domain != domain]
        try:
            schema = onnx.defs.get_schema(node.op_type, version, domain)
            out = onnx.shape_inference.infer_node_outputs(
                schema, node, types,
                {n: numpy_helper.from_array(self.data[n], n)
                 for n in node.input if n in self.data},
                opset_imports=[*opsets, helper.make_opsetid(domain, version)],
                ir_version=self.ir)
        except INFER_ERRORS:
            return None
        outs = [out.get(n) for n in node.output]
        if as_float and node.input and node.input[0] in self.types:
            elem = self.types[node.input[0]].tensor_type.elem_type
            for t in outs:
                if t is not None and t.HasField("tensor_type"):
                    t.tensor_type.elem_type = elem
        return outs

    def _evaluate(self, node: onnx.NodeProto, inferred: list[onnx.TypeProto | None],
                  ) -> list[np.ndarray | None] | None:
        if node.domain not in ("", "ai.onnx") or node.op_type in NOT_EVALUATED:
            return None
        if node.op_type in ("Shape", "Size"):
            shape = shape_of(self.types.get(node.input[0])) if node.input else None
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            attrs = {a.name: a.i for a in node.attribute}
            dims = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
            return [np.array(dims if node.op_type == "Shape" else int(np.prod(shape)),
                             dtype=np.int64)]
        if any(n and n not in self.data for n in node.input) or (
                not node.input and node.op_type != "Constant"):
            return None
        if any(_concrete(t) and not _small(d.dim_value for d in t.tensor_type.shape.dim)
               for t in inferred if t is not None):
            return None
        return _run(node, self.opsets.get("", 1), [self.data.get(n) for n in node.input])


def _as_float(tp: onnx.TypeProto) -> onnx.TypeProto:
    """A copy of a tensor type with element type float (its shape kept)."""
    copy = onnx.TypeProto()
    copy.CopyFrom(tp)
    if copy.HasField("tensor_type"):
        copy.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return copy


def _small(dims: Any) -> bool:
    n = 1
    for d in dims:
        n *= int(d)
    return n <= SMALL_ELEMENTS


def _to_array(t: onnx.TensorProto) -> np.ndarray | None:
    try:
        return numpy_helper.to_array(t)
    except EVAL_ERRORS:
        return None


def _type_of(value: np.ndarray) -> onnx.TypeProto:
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return helper.make_tensor_type_proto(elem, list(value.shape))


def _by_rule(rule: Any, node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
             ) -> list[onnx.TypeProto | None] | None:
    ins = [types.get(n) if n else None for n in node.input]
    if not ins or ins[0] is None:
        return None
    try:
        shapes = rule([shape_of(t) for t in ins], node)
    except EVAL_ERRORS:
        return None
    elem = rule_dtype(node, ins)
    return [None if s is None else helper.make_tensor_type_proto(elem, list(s))
            for s in list(shapes) + [None] * (len(node.output) - len(shapes))]


def rule_dtype(node: onnx.NodeProto, ins: list[onnx.TypeProto | None]) -> int:
    """The element type of a rule's outputs: the first float input's (quantized and embedding
    ops take integer ids or int8 data first and produce floats)."""
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
              onnx.TensorProto.DOUBLE}
    elems = [t.tensor_type.elem_type for t in ins if t is not None and t.HasField("tensor_type")]
    return next((e for e in elems if e in floats), elems[0] if elems else onnx.TensorProto.FLOAT)


@cache
def _op_class(op_type: str, version: int) -> Any:
    from onnx.reference.ops import load_op

    return load_op("", op_type, version)


def _run(node: onnx.NodeProto, version: int, inputs: list[np.ndarray | None],
         ) -> list[np.ndarray | None] | None:
    params = {"log": lambda *_a: None, "opsets": {"": version}, "verbose": 0, "new_ops": None,
              "existing_functions": {}, "evaluator_cls": None}
    try:
        # IEEE results (T5's log(0) = -inf in its position buckets, cast to int and masked
        # later) are what the runtime computes too; numpy's warnings about them are noise.
        with np.errstate(all="ignore"):
            op = _op_class(node.op_type, version)(node, params)
            out = op.run(*inputs)
    except EVAL_ERRORS:
        return None
    return [np.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else None for v in out]


def propagate(model: onnx.ModelProto, dims: Mapping[str, int], *, fallback: bool = True,
              ) -> dict[str, onnx.TypeProto]:
    """The type of every value of the main graph that can be known, in one pass. Where a
    custom-domain op with no tilecast rule leaves values unknown and ``fallback`` is set,
    onnxruntime's symbolic shape inference is asked for those (``ort_fallback``)."""
    p = _Pass(model, dims)
    for node in model.graph.node:
        p.visit(node)
    if fallback and p.custom_roots:
        ort_fallback(model, dims, p.types)
    return p.types


def ort_fallback(model: onnx.ModelProto, dims: Mapping[str, int],
                 types: dict[str, onnx.TypeProto]) -> None:
    """Fill values the pass left unknown from onnxruntime's SymbolicShapeInference, guarded:
    only unknown values take its answer, only concrete answers are taken, and never on a graph
    with the ONNX-domain ``Attention`` (opset 23), which it mistakes for com.microsoft's."""
    missing = {o for n in model.graph.node for o in n.output if o and not _concrete(types.get(o))}
    if not missing or any(n.op_type == "Attention" and n.domain in ("", "ai.onnx")
                          for n in model.graph.node):
        return
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return
    bound = onnx.ModelProto()
    bound.CopyFrom(model)  # weightless: a cheap copy
    del bound.graph.value_info[:]
    for vi in bound.graph.input:
        vi.type.CopyFrom(_bound(vi.type, dims))
    try:
        # Its steps, not its infer_shapes(): that one writes sym_shape_infer_temp.onnx into the
        # working directory and raises when a shape stays unknown; partial answers are wanted.
        sym = SymbolicShapeInference(INT32_MAX, True, False, 0)
        sym._preprocess(bound)
        while sym.run_:
            sym._infer_impl()
        sym._update_output_from_vi()
        out = sym.out_mp_
    except Exception:  # best effort: its failures are many and untyped
        return
    for vi in (*out.graph.value_info, *out.graph.output):
        if vi.name in missing and _concrete(vi.type):
            types[vi.name] = vi.type
