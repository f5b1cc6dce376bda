"""Which additive attention masks of a graph are causal: the pairs a fused kernel skips.

An exporter without a fused attention op writes the causal mask as tensor arithmetic on two
position ranges, e.g. Hugging Face transformers' mask for ``--attn eager``::

    visible = LessOrEqual(kv_index[1, 1, 1, Skv], q_index[1, 1, Sq, 1]) & Equal(zeros, zeros)
    mask = Where(visible, 0, finfo.min)        # added to the scores before Softmax

A graph runtime that fuses the attention chain (attention_fusion.py) runs it as a causal
FlashAttention-style kernel and skips the hidden tiles, as an exported ``is_causal`` op does.
The mask itself is one (Sq, Skv) tensor whose values tilecast does not hold, so this module
reads what it is from how it was built: every value derived from constants gets an abstract
value (a uniform constant, a position ramp along one axis, a band of visible key - query
offsets, an additive band mask) and every other value stays unknown. Only a band that is
exactly bottom-right aligned (query i sees keys up to i + Skv - Sq, the ``is_causal``
convention of ``costs/attention.causal_pairs``), optionally with a lower edge (a sliding
window), counts as causal; anything else is counted as every pair, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .types import NodeView
from .weightless import has_data

HIDDEN_BELOW = -1.0e4  # a score plus this is exp() == 0 in fp16/bf16/fp32 softmax
RAMP_ELEMENTS = 1 << 20  # a ramp is a position vector; larger constants are not read


@dataclass(frozen=True)
class Uniform:
    """Every element equals ``value`` (a splat constant)."""

    value: float


@dataclass(frozen=True)
class Ramp:
    """Positions ``start, start + 1, ...`` along ``axis`` (counted from the end), broadcast
    along every other axis."""

    start: int
    axis: int


@dataclass(frozen=True)
class Band:
    """Boolean: True where ``lo <= key - query <= hi`` (None: unbounded) over the last two
    axes (queries on -2, keys on -1)."""

    lo: int | None
    hi: int | None


@dataclass(frozen=True)
class BandMask:
    """Additive mask: 0 inside ``band``, ``HIDDEN_BELOW`` or lower outside it."""

    band: Band


Value = Uniform | Ramp | Band | BandMask


@dataclass(frozen=True)
class CausalMask:
    """A bottom-right aligned causal mask; ``window`` > 0: each query sees window + 1 keys."""

    window: int = 0


def _constant(t: onnx.TensorProto) -> Value | None:
    if not has_data(t) or int(np.prod(t.dims)) > RAMP_ELEMENTS:
        return None
    try:
        a = numpy_helper.to_array(t)
    except (ValueError, TypeError):
        return None
    if a.size == 0:
        return None
    flat = a.reshape(-1)
    if np.all(flat == flat[0]):
        return Uniform(float(flat[0]))
    if not np.issubdtype(a.dtype, np.integer):
        return None
    for axis in (i for i, d in enumerate(a.shape) if d > 1):  # copies along the other axes
        steps = np.arange(a.shape[axis]).reshape([-1 if i == axis else 1 for i in range(a.ndim)])
        if np.array_equal(a, flat[0] + np.broadcast_to(steps, a.shape)):
            return Ramp(int(flat[0]), axis - a.ndim)
    return None


def _ramp_view(x: Ramp, ins: tuple[int, ...] | None, out: tuple[int, ...] | None
               ) -> Ramp | None:
    """A ramp through a view: its axis (from the end) holds while the dims from it to the
    end are unchanged; a vector's one wide dim may move (Unsqueeze of ``arange(S)``)."""
    if ins is None or out is None:
        return None
    if len(ins) >= -x.axis and len(out) >= -x.axis and ins[x.axis:] == out[x.axis:]:
        return x
    wide_in, wide_out = [d for d in ins if d > 1], [i for i, d in enumerate(out) if d > 1]
    if len(wide_in) == 1 and len(wide_out) == 1 and out[wide_out[0]] == wide_in[0]:
        return Ramp(x.start, wide_out[0] - len(out))
    return None


def _view(node: NodeView, args: Sequence[Value | None]) -> Value | None:
    """Reshape, Unsqueeze, Expand, Cast, Squeeze: values kept, a ramp's axis read again."""
    x = args[0]
    if isinstance(x, Ramp):
        return _ramp_view(x, node.inputs[0].shape, node.outputs[0].shape)
    if isinstance(x, Band | BandMask):
        ins, out = node.inputs[0].shape, node.outputs[0].shape
        return x if ins is not None and out is not None and len(ins) >= 2 \
            and tuple(ins[-2:]) == tuple(out[-2:]) else None
    return x


def _shift(sign: int) -> Callable[[NodeView, Sequence[Value | None]], Value | None]:
    """Add (sign 1) or Sub (sign -1) of a ramp and an integer splat."""

    def rule(node: NodeView, args: Sequence[Value | None]) -> Value | None:
        a, b = args[0], args[1]
        if isinstance(a, Ramp) and isinstance(b, Uniform) and float(b.value).is_integer():
            return Ramp(a.start + sign * int(b.value), a.axis)
        if sign == 1 and isinstance(b, Ramp) and isinstance(a, Uniform) \
                and float(a.value).is_integer():
            return Ramp(b.start + int(a.value), b.axis)
        if isinstance(a, Uniform) and isinstance(b, Uniform):
            return Uniform(a.value + sign * b.value)
        return None

    return rule


def _compare(swap: bool, strict: bool) -> Callable[[NodeView, Sequence[Value | None]],
                                                   Value | None]:
    """x <= y (LessOrEqual), x < y, x >= y, x > y on a key ramp and a query ramp, written
    as a - b <= c with (a, b) = (x, y) or (y, x) and c = 0 or -1 (integers)."""

    def rule(node: NodeView, args: Sequence[Value | None]) -> Value | None:
        a, b = (args[1], args[0]) if swap else (args[0], args[1])
        if not (isinstance(a, Ramp) and isinstance(b, Ramp)):
            return None
        c = -1 if strict else 0
        if (a.axis, b.axis) == (-1, -2):  # key - query <= c + b.start - a.start
            return Band(None, c + b.start - a.start)
        if (a.axis, b.axis) == (-2, -1):  # query - key <= c', i.e. key - query >= -c'
            return Band(-(c + b.start - a.start), None)
        return None

    return rule


def _and(node: NodeView, args: Sequence[Value | None]) -> Value | None:
    a, b = args[0], args[1]
    if isinstance(a, Uniform) and a.value:
        return b
    if isinstance(b, Uniform) and b.value:
        return a
    if isinstance(a, Band) and isinstance(b, Band):
        lo = [v for v in (a.lo, b.lo) if v is not None]
        hi = [v for v in (a.hi, b.hi) if v is not None]
        return Band(max(lo) if lo else None, min(hi) if hi else None)
    return None


def _equal(node: NodeView, args: Sequence[Value | None]) -> Value | None:
    a, b = args[0], args[1]
    return Uniform(float(a.value == b.value)) if isinstance(a, Uniform) and \
        isinstance(b, Uniform) else None


def _where(node: NodeView, args: Sequence[Value | None]) -> Value | None:
    cond, x, y = args[0], args[1], args[2]
    if not (isinstance(cond, Band) and isinstance(x, Uniform) and isinstance(y, Uniform)):
        return None
    return BandMask(cond) if x.value == 0 and y.value <= HIDDEN_BELOW else None


def _range(node: NodeView, args: Sequence[Value | None]) -> Value | None:
    start, delta = args[0], args[2]
    if isinstance(start, Uniform) and isinstance(delta, Uniform) and delta.value == 1 \
            and float(start.value).is_integer():
        return Ramp(int(start.value), -1)
    return None


RULES: Mapping[str, Callable[[NodeView, Sequence[Value | None]], Value | None]] = {
    **dict.fromkeys(("Reshape", "Unsqueeze", "Squeeze", "Expand", "Cast", "Identity"), _view),
    "Add": _shift(1), "Sub": _shift(-1), "Range": _range, "And": _and, "Equal": _equal,
    "Where": _where,
    "LessOrEqual": _compare(False, False), "Less": _compare(False, True),
    "GreaterOrEqual": _compare(True, False), "Greater": _compare(True, True),
}


def _attr_constant(node: onnx.NodeProto) -> Value | None:
    """A Constant's ``value`` or ConstantOfShape's splat."""
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            v = _constant(a.t)
            return v if node.op_type == "Constant" or isinstance(v, Uniform) else None
    return Uniform(0.0) if node.op_type == "ConstantOfShape" else None


def abstract_values(model: onnx.ModelProto, nodes: Sequence[NodeView]) -> dict[str, Value]:
    """Every value derived from constants alone that one of the abstract forms describes."""
    values: dict[str, Value] = {}
    for t in model.graph.initializer:
        v = _constant(t)
        if v is not None:
            values[t.name] = v
    for proto, node in zip(model.graph.node, nodes, strict=True):
        if proto.op_type in ("Constant", "ConstantOfShape") and proto.domain in ("", "ai.onnx"):
            v = _attr_constant(proto)
        elif proto.op_type in RULES and proto.domain in ("", "ai.onnx") and proto.input and \
                proto.input[0] in values:  # a view's shape / axes operand may be anything
            v = RULES[proto.op_type](node, [*(values.get(n) for n in proto.input), None, None])
        else:
            continue
        if v is not None and proto.output:
            values[proto.output[0]] = v
    return values


def causal_masks(model: onnx.ModelProto, nodes: Sequence[NodeView]) -> dict[str, CausalMask]:
    """The graph's masks, additive (0 / very negative) or boolean (True: attend), that are
    bottom-right aligned causal over their last two dims (name -> window), read from how
    they were built."""
    out: dict[str, CausalMask] = {}
    shapes = {t.name: t.shape for n in nodes for t in n.outputs}
    for name, v in abstract_values(model, nodes).items():
        shape = shapes.get(name)
        band = v.band if isinstance(v, BandMask) else v
        if not isinstance(band, Band) or shape is None or len(shape) < 2:
            continue
        sq, skv = shape[-2], shape[-1]
        lo, hi = band.lo, band.hi
        if hi == skv - sq and (lo is None or lo <= hi):
            out[name] = CausalMask(0 if lo is None or hi - lo >= skv else hi - lo)
    return out
