"""The kernels that only build a causal mask which an attention kernel applies by index.

A fused attention kernel given a causal mask built from positions alone (causal.py, ``exact``)
skips the hidden pairs by index and never reads the mask (attention_fusion.py), so the nodes
that built it lose their last reader. Under a graph runtime they are dead code, which its
compiler drops (TensorRT, XLA and ONNX Runtime remove nodes whose outputs nothing reads).

Under eager PyTorch the same holds for the mask torch.onnx writes for one
``scaled_dot_product_attention(q, k, v, is_causal=True)`` call: PyTorch never builds it (the
fused kernel takes the flag), while torch.onnx spells the flag out as the reference
implementation in the SDPA documentation does, ``ones(L, S).tril()`` compared with 0 and the
hidden side filled with -inf, ``Where(Equal(Trilu(Expand(1, (L, S))), 0), -inf, 0)`` added to
the scores (its TorchScript symbolic and the dynamo exporter's decomposition alike). A mask a
model builds itself and passes as ``attn_mask`` reaches the scores as a Where of that mask
(to 0 / -inf, for a boolean one) or as the mask, with no ``== 0`` of a lower Trilu: PyTorch
reads it, every pair, and it stays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from .analysis import NodeResult
from .causal import CausalMask
from .costs.zero import PASS_THROUGH
from .fusion import METADATA_READERS

CAUSAL_BY_INDEX = "built a causal mask the attention kernel applies by index"


def _made_by(name: str | None, op_type: str, results: Sequence[NodeResult],
             produced_at: Mapping[str, int]) -> NodeResult | None:
    p = produced_at.get(name) if name is not None else None
    r = results[p] if p is not None else None
    return r if r is not None and r.node.op_type == op_type and not r.node.domain else None


def _is_causal_flag(name: str, results: Sequence[NodeResult],
                    produced_at: Mapping[str, int]) -> bool:
    """Is ``name`` torch.onnx's spelling of ``is_causal=True`` (module doc)?"""
    where = _made_by(name, "Where", results, produced_at)
    cond = where.node.input(0) if where is not None else None
    equal = _made_by(cond.name if cond is not None else None, "Equal", results, produced_at)
    ins = equal.node.inputs if equal is not None else ()
    trilu = [r for t in ins if t is not None
             and (r := _made_by(t.name, "Trilu", results, produced_at)) is not None]
    return len(trilu) == 1 and trilu[0].node.attr("upper", 1) == 0 \
        and _made_by(trilu[0].node.input(0).name, "Expand", results, produced_at) is not None


def exported_is_causal(causal: Mapping[str, CausalMask], results: Sequence[NodeResult],
                       produced_at: Mapping[str, int]) -> dict[str, CausalMask]:
    """The causal masks of ``causal`` that torch.onnx wrote for an ``is_causal`` SDPA call:
    the only ones an eager PyTorch kernel applies by index."""
    return {name: m for name, m in causal.items()
            if m.exact and not m.window and not m.carries_values
            and _is_causal_flag(name, results, produced_at)}


def drop_unread(results: Sequence[NodeResult], masks: Iterable[str],
                graph_outputs: Iterable[str] = (), reason: str = CAUSAL_BY_INDEX
                ) -> tuple[NodeResult, ...]:
    """Each kernel (and view) that builds one of ``masks`` and whose outputs nothing reads
    any more becomes zero-cost, back to the host-side shape arithmetic it started from."""
    out = list(results)
    readers = Counter(t.name for r in out if r.node.op_type not in METADATA_READERS
                      for t in r.node.inputs if t is not None)  # a Shape reads no data
    readers.update(graph_outputs)
    produced_at = {t.name: i for i, r in enumerate(out) for t in r.node.outputs}
    todo = list(masks)
    while todo:
        p = produced_at.get(todo.pop())
        r = out[p] if p is not None else None
        view = r is not None and r.outcome == "zero" and r.reason in PASS_THROUGH
        if r is None or not (r.outcome == "costed" or view) \
                or any(readers[t.name] for t in r.node.outputs):
            continue
        for t in r.node.inputs:
            if t is not None:
                readers[t.name] -= 1
                todo.append(t.name)
        gone = replace(r.node, inputs=(), outputs=())
        out[p] = replace(r, node=gone) if view else \
            NodeResult(gone, "zero", None, reason)
    return tuple(out)
