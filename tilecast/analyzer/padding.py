"""The attention masks an unpadded batch does not need: Hugging Face then passes SDPA none.

Hugging Face transformers builds each attention mask from its ``attention_mask`` input (the
batch's padding) and, in a decoder, the causal band. With SDPA attention it first looks at
the padding (``_ignore_causal_mask_sdpa`` and ``_ignore_bidirectional_mask_sdpa`` in
masking_utils.py: ``fast_all``, one sum compared on the host) and, where no
token is padding and the queries are all the keys or one, builds no mask at all: the call
runs with ``is_causal`` (a decoder's prompt) or unmasked (an encoder; one decoded token). It
never skips while tracing, so an export holds the mask as built from the input, and a graph
runtime computes it from whatever the input holds.

tilecast forecasts an unpadded batch: every sequence fills the bound sequence dim. A mask is
one Hugging Face skips when setting one rank-2 integer or boolean graph input to all ones
(``causal.abstract_values(..., ones=...)``) turns it into the very causal band it held at most
before (causal.py: the band and'ed with that input), or into one value where nothing was known
before (an encoder's padding mask: one value added to every score changes no softmax), over
as many queries as keys or over one query. Under eager PyTorch and a CUDA-graph replay such a
mask is not built (pipeline.py): the kernel runs causal or unmasked and reads no mask, the
nodes building it are zero-cost (``UNPADDED``), and under eager one reduction over the input
checks it (``sdpa_mask.padding_checks``; a CUDA-graph capture cannot read a check back, so its
model is called without a mask, which Hugging Face skips unchecked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from .band_values import HIDDEN_BELOW
from .causal import CausalMask, abstract_values, mask_of
from .index_values import Uniform
from .types import NodeView, TensorInfo

if TYPE_CHECKING:  # analysis.py imports graph.py, which imports this module
    from .analysis import NodeResult

UNPADDED = "builds a padding mask an unpadded batch skips (Hugging Face passes SDPA none)"
MASK_INPUT_DTYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32,
                               onnx.TensorProto.BOOL})
FLOAT_MASKS = frozenset({"float32", "float16", "bfloat16", "float64"})


@dataclass(frozen=True)
class Unpadded:
    """The masks an unpadded batch skips (name -> as the kernel then runs), and the graph
    input each is built from (name -> input)."""

    masks: Mapping[str, CausalMask] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def checked(self, before: Sequence[NodeResult], after: Sequence[NodeResult]
                ) -> tuple[str, ...]:
        """The inputs whose masks a pass (same nodes, ``before`` -> ``after``) skipped."""
        found = {self.sources[t.name] for a, b in zip(before, after, strict=True)
                 if b.reason == UNPADDED and a.reason != UNPADDED
                 for t in a.node.outputs if t.name in self.sources}
        return tuple(sorted(found))


def _candidates(model: onnx.ModelProto) -> list[str]:
    weights = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in weights
            and vi.type.tensor_type.elem_type in MASK_INPUT_DTYPES
            and len(vi.type.tensor_type.shape.dim) == 2]


def _visible(v: Uniform, dtype: str) -> bool:
    """A splat mask hiding no pair: True, or one finite value added to every score."""
    return bool(v.value) if dtype == "bool" else dtype in FLOAT_MASKS and v.value > HIDDEN_BELOW


def _skipped(seeded: object, before: CausalMask | None, was: object,
             t: TensorInfo | None) -> CausalMask | None:
    shape = t.shape if t is not None else None
    if shape is None or len(shape) < 2:
        return None
    if isinstance(seeded, Uniform):  # an encoder's mask: skipped whatever the queries
        ok = was is None and _visible(seeded, t.dtype)
        return CausalMask(causal=False) if ok else None
    if shape[-2] not in (1, shape[-1]):
        return None  # a causal one only for as many queries as keys, or one query
    found = mask_of(seeded, shape)
    ok = found is not None and before is not None and not before.exact and found.exact \
        and (found.window, found.carries_values) == (before.window, before.carries_values)
    return found if ok else None


def unpadded_masks(model: onnx.ModelProto, nodes: Sequence[NodeView],
                   base: Mapping[str, object], causal: Mapping[str, CausalMask]) -> Unpadded:
    """The masks of the graph an unpadded batch skips (module doc); ``base``: the graph's
    ``abstract_values``, ``causal``: its causal masks (``causal.causal_masks``)."""
    candidates = _candidates(model)
    if not candidates:
        return Unpadded()
    tensors = {t.name: t for n in nodes for t in (*n.inputs, *n.outputs) if t is not None}
    masks: dict[str, CausalMask] = {}
    sources: dict[str, str] = {}
    for name in candidates:
        for t, v in abstract_values(model, nodes, ones=(name,), base=base).items():
            if t == name or v == base.get(t):
                continue  # the input itself, or a value it does not reach
            m = _skipped(v, causal.get(t), base.get(t), tensors.get(t))
            if m is not None and t not in masks:
                masks[t], sources[t] = m, name
    return Unpadded(masks, sources)
