"""Eager PyTorch converts a boolean ``attn_mask`` to an additive one before its SDPA kernel.

``convert_boolean_attn_mask`` (aten/src/ATen/native/transformers/attention.cpp) builds a
mask of the query's dtype, zeros where the boolean mask is true and -inf elsewhere (a fill,
a ``logical_not`` and a ``masked_fill_``), and the fused kernel then reads that mask. An ONNX
``Attention`` (opset 23+, an ``--attn sdpa`` export) given a boolean mask therefore runs after
one conversion under eager PyTorch and a CUDA-graph replay, as the Where to 0 / -inf that an
exported SDPA call carries does (attention_fusion.py keeps it): one elementwise kernel reading
the boolean mask and writing the additive one, which the attention kernel reads in its place.

Before a model builds a mask, Hugging Face checks whether the batch holds padding at all
(padding.py): one sum over the ``attention_mask`` input, read back by the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .analysis import NodeResult
from .costs.attention import onnx_attention
from .registry import REGISTRY
from .types import NodeView, OpCost, TensorInfo

MASK_SLOT = 3  # ONNX Attention: Q, K, V, attn_mask, past_key, past_value
CONVERSION_REASON = "PyTorch converts a boolean attn_mask before its SDPA kernel"
PADDING_CHECK = "Hugging Face's check that the batch holds no padding (fast_all: one sum)"
CHECK_OPSET = 18  # any ReduceSum: its formula reads the shapes alone


def _bool_mask(r: NodeResult) -> TensorInfo | None:
    if r.outcome != "costed" or r.node.op_type != "Attention" or r.node.domain:
        return None
    mask, q = r.node.input(MASK_SLOT), r.node.input(0)
    ok = mask is not None and mask.known and mask.dtype == "bool" and q is not None
    return mask if ok else None


def convert_bool_masks(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    """Before each ONNX Attention with a boolean mask, the kernel converting it (module doc);
    the attention reads the converted mask, at the query's dtype."""
    out: list[NodeResult] = []
    for r in results:
        mask = _bool_mask(r)
        if mask is None:
            out.append(r)
            continue
        q = r.node.inputs[0]
        added = TensorInfo(f"{mask.name}/additive", mask.shape, q.dtype)
        node = NodeView(f"{r.node.name}/attn_mask", "Where", "", (mask,), (added,), {},
                        r.node.opset)
        cost = OpCost("elementwise", mask.numel, mask.nbytes + added.nbytes, q.dtype,
                      elements=mask.numel)
        out.append(NodeResult(node, "costed", cost, CONVERSION_REASON))
        ins = list(r.node.inputs)
        ins[MASK_SLOT] = added
        view = replace(r.node, inputs=tuple(ins))
        out.append(replace(r, node=view, cost=onnx_attention(view)))
    return tuple(out)


def padding_checks(results: Sequence[NodeResult], graph_inputs: Sequence[TensorInfo],
                   checked: Sequence[str]) -> tuple[NodeResult, ...]:
    """Before the graph's kernels, one reduction over each of ``checked`` (the inputs whose
    masks were skipped): ``fast_all`` in masking_utils.py sums the padding mask and compares
    the sum with its size on the host."""
    found = {t.name: t for t in graph_inputs}
    fn = REGISTRY.lookup("", "ReduceSum", CHECK_OPSET).fn
    checks = []
    for name in checked:
        x = found.get(name)
        if x is None or not x.known:
            continue
        node = NodeView(f"{name}/padding_check", "ReduceSum", "", (x,),
                        (TensorInfo(f"{name}/all", (), x.dtype),), {"keepdims": 0}, CHECK_OPSET)
        checks.append(NodeResult(node, "costed", fn(node), PADDING_CHECK))
    return (*checks, *results)
