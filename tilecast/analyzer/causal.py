"""Which additive attention masks of a graph are causal: the pairs a fused kernel skips.

An exporter without a fused attention op writes the causal mask as tensor arithmetic on two
position ranges, e.g. Hugging Face transformers' mask for ``--attn eager``::

    visible = LessOrEqual(kv_index[1, 1, 1, Skv], q_index[1, 1, Sq, 1]) & Equal(zeros, zeros)
    mask = Where(visible, 0, finfo.min)        # added to the scores before Softmax

A graph runtime that fuses the attention chain (attention_fusion.py) runs it as a causal
FlashAttention-style kernel and skips the hidden tiles, as an exported ``is_causal`` op does.
The mask itself is one (Sq, Skv) tensor whose values tilecast does not hold, so this module
reads what it is from how it was built: every value derived from constants gets an abstract
value (a splat or an affine index grid, index_values.py; a band of visible key - query
offsets; an additive band mask) and every other value stays unknown. Newer transformers
build the same mask vmap-style: the position ids gathered (GatherND) at stacked (batch,
index) grids, and'ed with a packed-sequence check that is all True for one sequence per row.
A band and'ed with what tilecast cannot read (the padding of an ``attention_mask`` input) is
at most the band: a kernel that skips what lies outside it is right whatever the padding
holds, so it counts as the band. Shapes of inputs whose dims are bound are read too (a
cache's length sets where the queries' positions start).
Only a band that is exactly bottom-right aligned (query i sees keys up to i + Skv - Sq, the
``is_causal`` convention of ``costs/attention.causal_pairs``), optionally with a lower edge
(a sliding window), counts as causal; anything else is counted as every pair, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from .band_values import HIDDEN_BELOW, band_of, decode
from .index_values import (
    INDEX_RULES,
    SHAPE_ONLY,
    Affine,
    Uniform,
    as_affine,
    constant,
    linear,
    of_array,
    read_array,
    scalar,
    slice_args,
)
from .types import NodeView


@dataclass(frozen=True)
class Band:
    """Boolean: True where ``lo <= key - query <= hi`` (None: unbounded) over the last two
    axes (queries on -2, keys on -1). Not ``exact``: True at most there (the band and'ed
    with a value tilecast does not know, such as a padding mask from ``attention_mask``)."""

    lo: int | None
    hi: int | None
    exact: bool = True


@dataclass(frozen=True)
class BandMask:
    """Additive mask: 0 inside ``band``, ``HIDDEN_BELOW`` or lower outside it."""

    band: Band


@dataclass(frozen=True)
class MaskedScores:
    """Scores (anything) with every element outside ``band`` replaced by a very negative
    value: ``scores.masked_fill(hidden, -inf)``, a Where selecting between them."""

    band: Band


@dataclass(frozen=True)
class CausalMask:
    """A bottom-right aligned causal mask; ``window`` > 0: each query sees window + 1 keys.
    ``carries_values``: inside the band it holds values a kernel adding it must read (a
    position bias filled with a very negative value outside the band, as T5 builds it).
    ``exact``: built from constants and shapes alone, the band and nothing else (not and'ed
    with a padding mask read from the inputs): a kernel masking by index needs none of it."""

    window: int = 0
    carries_values: bool = False
    exact: bool = True
    causal: bool = True  # False: no pair hidden (padding.py: an unpadded batch's mask)


Rule = Callable[[NodeView, Sequence[object]], object]


def _band_view(rule: Rule) -> Rule:
    """A view or broadcast keeps a band while the last two dims stay the same."""

    def wrapped(node: NodeView, args: Sequence[object]) -> object:
        x = args[0]
        if not isinstance(x, Band | BandMask | MaskedScores):
            return rule(node, args)
        ins, out = node.inputs[0].shape, node.outputs[0].shape
        return x if ins is not None and out is not None and len(ins) >= 2 \
            and tuple(ins[-2:]) == tuple(out[-2:]) else None

    return wrapped


def _compare(swap: bool, strict: bool) -> Rule:
    """x <= y (LessOrEqual), x < y, x >= y, x > y of two grids, written as a - b <= c with
    (a, b) = (x, y) or (y, x) and c = 0 or -1 (integers): a band when a - b is
    offset +- (key - query), keys on the last axis and queries on the one before."""

    def rule(node: NodeView, args: Sequence[object]) -> object:
        a, b = (args[1], args[0]) if swap else (args[0], args[1])
        d = linear(-1)(node, [a, b])
        out = node.outputs[0].shape
        d = as_affine(d, len(out)) if out is not None else None
        if d is None:
            return None
        c = -1 if strict else 0
        if len(out) >= 2 and not any(d.coefs[:-2]):
            if d.coefs[-2:] == (-1, 1):  # key - query <= c - offset
                return Band(None, c - d.offset)
            if d.coefs[-2:] == (1, -1):  # query - key <= c - offset: key - query >= offset-c
                return Band(d.offset - c, None)
        lo, hi = _extent(d, out)  # the same answer everywhere: ``kv_index >= 0``
        return Uniform(1.0) if hi <= c else Uniform(0.0) if lo > c else None

    return rule


def _extent(d: Affine, shape: Sequence[int]) -> tuple[int, int]:
    """The least and the greatest value a grid takes over a shape."""
    spans = [c * (n - 1) for c, n in zip(d.coefs, shape, strict=True)]
    return (d.offset + sum(min(0, x) for x in spans), d.offset + sum(max(0, x) for x in spans))


def _and(node: NodeView, args: Sequence[object]) -> object:
    """And of two bands is their intersection; of a band and anything else (a padding mask
    read from the inputs) at most the band: a kernel skipping what is outside it is right
    whatever the other operand holds."""
    a, b = args[0], args[1]
    if isinstance(a, Uniform) and a.value:
        return b
    if isinstance(b, Uniform) and b.value:
        return a
    if isinstance(a, Band) and isinstance(b, Band):
        lo = [v for v in (a.lo, b.lo) if v is not None]
        hi = [v for v in (a.hi, b.hi) if v is not None]
        return Band(max(lo) if lo else None, min(hi) if hi else None, a.exact and b.exact)
    band = a if isinstance(a, Band) else b if isinstance(b, Band) else None
    return replace(band, exact=False) if band is not None and not isinstance(
        a if band is b else b, Uniform) else None


def _hidden(v: object) -> bool:
    return isinstance(v, Uniform) and v.value <= HIDDEN_BELOW


def _complement(b: Band) -> Band | None:
    """Where an exact one-sided band is False: the other side of its edge."""
    if not b.exact or (b.lo is None) == (b.hi is None):
        return None
    return Band(b.hi + 1, None) if b.lo is None else Band(None, b.lo - 1)


def _zero(v: object) -> bool:
    return isinstance(v, Uniform) and v.value == 0


def _where(node: NodeView, args: Sequence[object]) -> object:
    """Where(band, 0, very negative) is an additive band mask, and so is Where(band, very
    negative, 0) of a one-sided band (masked_fill of the hidden side); Where(anything, very
    negative, band mask) (a padding mask filled in) hides at least what the band hides. A
    splat condition selects one side."""
    cond, x, y = args[0], args[1], args[2]
    if isinstance(cond, Uniform):
        return x if cond.value else y
    if isinstance(cond, Band) and _zero(x) and _hidden(y):
        return BandMask(cond)
    if isinstance(cond, Band) and _hidden(x) and _zero(y):
        visible = _complement(cond)
        return BandMask(visible) if visible is not None else None
    if _hidden(x) and isinstance(y, BandMask):
        return BandMask(replace(y.band, exact=False))
    if isinstance(cond, Band) and _hidden(x) and not isinstance(y, Uniform):
        visible = _complement(cond)  # masked_fill(hidden, -inf) of scores
        return MaskedScores(visible) if visible is not None else None
    if isinstance(cond, Band) and _hidden(y) and not isinstance(x, Uniform):
        return MaskedScores(cond)
    return None


def _band_slice(node: NodeView, args: Sequence[object]) -> object:
    """A slice of one of a band's two axes from ``start`` (step 1) moves its edges: kept
    from query a on, each key - query is a more than before; from key c on, c less (GPT-2's
    ``bias[:, :, k - q:k, :k]``). Other values: the index rule."""
    x = args[0]
    if not isinstance(x, Band | BandMask):
        return INDEX_RULES["Slice"](node, args)
    parsed, rank = slice_args(node, args), len(node.inputs[0].shape or ())
    if parsed is None or parsed[2] != 1 or rank < 2:
        return None
    axis, start, _ = parsed
    shift = {rank - 2: start, rank - 1: -start}.get(axis, 0)
    band = x.band if isinstance(x, BandMask) else x
    moved = replace(band, lo=None if band.lo is None else band.lo + shift,
                    hi=None if band.hi is None else band.hi + shift)
    return BandMask(moved) if isinstance(x, BandMask) else moved


def _not(node: NodeView, args: Sequence[object]) -> object:
    x = args[0]
    return _complement(x) if isinstance(x, Band) else INDEX_RULES["Not"](node, args)


def _equal(node: NodeView, args: Sequence[object]) -> object:
    """A band compared with 1 is itself, with 0 its complement (``mask == 0`` of a tril of
    ones); anything else as the index rule reads it."""
    a, b = args[0], args[1]
    band, other = (a, b) if isinstance(a, Band) else (b, a)
    if isinstance(band, Band) and isinstance(other, Uniform) and other.value in (0, 1):
        return band if other.value == 1 else _complement(band)
    return INDEX_RULES["Equal"](node, args)


def _trilu(node: NodeView, args: Sequence[object]) -> object:
    """Trilu of a splat over (query, key): triu keeps key - query >= k, tril key - query <= k
    (zeros elsewhere). Of True, that is the band; of a very negative value, an additive mask
    hiding it (``torch.triu(torch.full((S, S), -inf), 1)``, PyTorch's square subsequent mask)."""
    x, k = args[0], 0 if node.input(1) is None else scalar(args[1])
    if not isinstance(x, Uniform) or k is None:
        return None
    kept = Band(k, None) if node.attr("upper", 1) else Band(None, k)
    if _hidden(x):
        visible = _complement(kept)
        return BandMask(visible) if visible is not None else None
    return kept if x.value == 1 else None


# ops whose rule reads any known operand; the others need their first (a view's shape or
# axes operand may be anything)
ANY_OPERAND = frozenset({"And", "Where"})
RULES: Mapping[str, Rule] = {
    **{op: _band_view(r) if op in ("Reshape", "Unsqueeze", "Squeeze", "Expand", "Cast",
                                   "Identity") else r for op, r in INDEX_RULES.items()},
    "And": _and, "Where": _where, "Not": _not, "Trilu": _trilu,
    "Equal": _equal, "Slice": _band_slice,
    "LessOrEqual": _compare(False, False), "Less": _compare(False, True),
    "GreaterOrEqual": _compare(True, False), "Greater": _compare(True, True),
}


def _tensor(t: onnx.TensorProto) -> object:
    """A constant's abstract value: a splat or grid, or the band mask the weightless reader
    found in its values (band_values.py)."""
    a = read_array(t)
    v = of_array(a)
    if v is not None:
        return v
    b = band_of(_floats(a)) if a is not None else decode(t.doc_string) if t.doc_string \
        else None
    if b is None:
        return None
    band = Band(b.lo, b.hi)
    return BandMask(band) if b.additive else band


def _floats(a: np.ndarray) -> np.ndarray:
    """Values in a dtype numpy computes with: bfloat16 and the like as float32."""
    return a if a.dtype == np.bool_ or a.dtype.kind in "fiu" else a.astype(np.float32)


def _attr_constant(node: onnx.NodeProto) -> object:
    """A Constant's ``value`` or ConstantOfShape's splat."""
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            v = _tensor(a.t) if node.op_type == "Constant" else constant(a.t)
            return v if node.op_type == "Constant" or isinstance(v, Uniform) else None
    return Uniform(0.0) if node.op_type == "ConstantOfShape" else None


def _ready(proto: onnx.NodeProto, values: Mapping[str, object]) -> bool:
    if not proto.input or proto.op_type in SHAPE_ONLY:
        return bool(proto.input)
    return any(n in values for n in proto.input[:None if proto.op_type in ANY_OPERAND else 1])


def abstract_values(model: onnx.ModelProto, nodes: Sequence[NodeView],
                    ones: Sequence[str] = (), base: Mapping[str, object] | None = None
                    ) -> dict[str, object]:
    """Every value derived from constants alone (and the graph inputs ``ones``, taken as all
    ones) that one of the abstract forms describes. ``base``: these values without ``ones``
    (this call's own result), so that only the nodes downstream of them are evaluated."""
    if base is None:
        values: dict[str, object] = {t.name: v for t in model.graph.initializer
                                     if (v := _tensor(t)) is not None}
        changed = None
    else:
        values, changed = dict(base), set(ones)
    values.update({name: Uniform(1.0) for name in ones if name not in values})
    for proto, node in zip(model.graph.node, nodes, strict=True):
        if changed is not None and not changed.intersection(proto.input):
            continue
        v = _value(proto, node, values)
        out = proto.output[0] if proto.output else None
        if out is None or (changed is not None and v == values.get(out)):
            continue
        if v is not None:
            values[out] = v
        elif changed is not None:
            values.pop(out, None)
        if changed is not None:
            changed.add(out)
    return values


def _value(proto: onnx.NodeProto, node: NodeView, values: Mapping[str, object]) -> object:
    if proto.op_type in ("Constant", "ConstantOfShape") and proto.domain in ("", "ai.onnx"):
        return _attr_constant(proto)
    if proto.op_type in RULES and proto.domain in ("", "ai.onnx") and _ready(proto, values):
        return RULES[proto.op_type](node, [*(values.get(n) for n in proto.input), None, None])
    return None


def causal_masks(nodes: Sequence[NodeView], values: Mapping[str, object]
                 ) -> dict[str, CausalMask]:
    """The graph's masks, additive (0 / very negative) or boolean (True: attend), and
    scores filled with a very negative value outside such a band (a Where), that are
    bottom-right aligned causal over their last two dims (name -> window), read from how
    they were built (``values``: the graph's ``abstract_values``)."""
    shapes = {t.name: t.shape for n in nodes for t in (*n.inputs, *n.outputs) if t is not None}
    out = {name: mask_of(v, shapes.get(name)) for name, v in values.items()}
    return {name: m for name, m in out.items() if m is not None}


def mask_of(v: object, shape: tuple[int, ...] | None) -> CausalMask | None:
    """The causal mask an abstract value of this shape is, if it is one."""
    band = v.band if isinstance(v, BandMask | MaskedScores) else v
    if not isinstance(band, Band) or shape is None or len(shape) < 2:
        return None
    sq, skv = shape[-2], shape[-1]
    lo, hi = band.lo, band.hi
    if hi != skv - sq or (lo is not None and lo > hi):
        return None
    return CausalMask(0 if lo is None or hi - lo >= skv else hi - lo,
                      isinstance(v, MaskedScores), band.exact)
