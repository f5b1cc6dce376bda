"""Eager attention as one fused kernel under a graph runtime.

An exporter without a fused attention op (``--attn eager``, most Hugging Face exports) writes
attention as MatMul(Q, K^T) -> [scale] -> [mask add] -> [casts] -> Softmax -> [casts] ->
MatMul(P, V). The graph runtimes tilecast models run that chain as one kernel that keeps the
scores on chip: TensorRT fuses an attention graph built of matrix-multiply and softmax layers,
with a boolean or an add mask, into one kernel (its documentation, "Fused Attention",
docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/transformers-fused-attention.html;
it asks for the scale on Q or K before the first product, which an exporter's scale on the
scores may not meet), ONNX Runtime's transformer optimizer rewrites the chain into its
Attention / MultiHeadAttention ops, and the LLM inference engines run FlashAttention. The
chain then costs what a fused attention op costs (``costs/attention.py``): the two products
and the softmax per score, reading Q, K, V and what is added once and writing the output once;
the (B, H, Sq, Skv) scores never reach DRAM.

Pattern, every intermediate read by the next step alone (reshape views between them passed
through): a batched MatMul (Q and K each optionally scaled by one value just before it, as
torch's SDPA decomposition writes sqrt(scale) on both), then optionally a Mul or Div by one
value, up to two Adds (a position bias such as T5's, then a mask; any broadcast; a mask
that only this Add reads and that a Where builds from a condition and two values is built in
the kernel, which reads the condition), a Where filling the scores outside
a causal band or setting them to one value where a condition holds (``masked_fill``; the
kernel reads the condition), any Casts, then a Softmax over the last axis, any Casts (and
torch's NaN guard on them), and a batched MatMul whose left operand is the probabilities.
The kernel reads K itself where the Reshapes and Transposes building K^T can be walked
back (``attention_layout.key_of``: they become part of it), else K^T (the fused node
records ``k_transposed``).
The Split and transposes that lay out Q, K, V and the output are read and written in
place by the kernel where they keep the head dim contiguous (``attention_layout.py``). A
mask the graph builds as a bottom-right aligned causal one (causal.py reads how it was built)
limits the kernel to the visible pairs, as an exported ``is_causal`` op does, and one built
from positions alone is then read by nobody: the nodes building it are dropped
(mask_builders.py). Any other mask counts every pair. Under a graph runtime, inference only.

Eager PyTorch and a CUDA-graph replay run hand-written attention op by op, but one
``F.scaled_dot_product_attention`` call as one kernel (flash or memory-efficient attention;
its backward too), and torch.onnx writes that call as this chain with sqrt(scale) on both Q
and K^T (its TorchScript exporter's ``scaled_dot_product_attention`` symbolic and the dynamo
exporter's decomposition alike). Neither Hugging Face's eager attention nor hand-written
attention scales both operands (they scale the scores, or Q alone), so under those runtimes,
in any mode, the chains that carry that signature are fused (``sdpa_calls``) where PyTorch
has a fused kernel for them (fp16 / bf16 / fp32, head dims 16-byte aligned for 16-bit
types, 4 elements for fp32: ``SDPA_ALIGNMENT``); the kernel reads K, and the Reshapes and
Transposes building K^T are part of the call. A mask is an explicit ``attn_mask`` there:
every pair is computed, as PyTorch's memory-efficient kernel does with one, and a boolean
one's Where to 0 / -inf stays (PyTorch converts it before the kernel); except the mask
torch.onnx writes for ``is_causal=True`` (mask_builders.py), a flag PyTorch's kernel applies
by index. On a GPU without
fused SDPA kernels (``sdpa_kernels.NO_FUSED_SDPA``: MI100) the chain stays op by op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .analysis import NodeResult
from .attention_layout import key_of
from .causal import CausalMask
from .costs.attention import MASK_FLOPS, SCORE_FLOPS, Heads, attention_cost, onnx_attention
from .epilogues import SoleReaders, costed, other_operand
from .mask_builders import drop_unread, exported_is_causal
from .padding import UNPADDED
from .sdpa_kernels import ANY_GPU, SdpaKernels, grouped_kv
from .types import MatmulDims, NodeView, OpCost, TensorInfo

FUSED_ATTENTION = "fused into an attention kernel (graph runtime)"
SDPA_CALL = "part of one scaled_dot_product_attention call (PyTorch runs it fused)"
# PyTorch's fused SDPA kernels (flash, memory-efficient) take these dtypes, with head dims a
# multiple of 16 bytes of 16-bit elements or of 4 fp32 ones (aten sdp_utils.cpp,
# minimum_gemm_alignment / check_head_dim_size_mem_efficient); otherwise its math path runs
# the decomposed ops one by one.
SDPA_ALIGNMENT = {"float16": 8, "bfloat16": 8, "float32": 4}
# Tensors added to the scores before the softmax that a fused kernel reads: a mask and a
# position bias (T5's relative attention bias, ALiBi) at most.
MAX_ADDED = 2


@dataclass(frozen=True)
class _Added:
    """A tensor added to the scores (a mask, a position bias) and what the kernel reads for
    it: the tensor, or the condition of the Where that built it from two values."""

    tensor: TensorInfo
    read: TensorInfo


@dataclass(frozen=True)
class _Chain:
    members: tuple[int, ...]  # nodes that become zero-cost (QK^T, scale, mask, casts, softmax)
    views: tuple[int, ...]  # reshape views between them
    pv: int  # the P @ V MatMul: it runs the fused kernel
    q: TensorInfo  # as the kernel reads it: before a scale folded into its score scale
    k: TensorInfo
    masks: tuple[_Added, ...]  # added to the scores: a mask, a position bias (T5, ALiBi)
    filled: TensorInfo | None  # the scores filled outside a causal band (a Where step)
    selected: TensorInfo | None  # a Where's condition, read: masked_fill of any other mask
    scaled: bool = False  # Q and K both scaled before QK^T: torch's SDPA decomposition
    k_transposed: bool = True  # k is the first product's K^T (else K: an SDPA call's)
    v: TensorInfo | None = None  # V as the kernel reads it, where not P @ V's operand


def _batched(r: NodeResult) -> bool:
    return (costed(r, "MatMul") and r.cost.matmul is not None and r.cost.matmul.batched
            and len(r.node.inputs) == 2 and all(t is not None and t.known for t in r.node.inputs))


def _one_value(t: TensorInfo | None) -> bool:
    """A fill or scale of one element (any broadcast)."""
    return t is not None and t.known and t.numel == 1


def _softmax_axis(r: NodeResult) -> int:
    """Softmax's axis; before opset 13 the default 1 flattened everything after it."""
    return r.node.attr("axis", -1 if r.node.opset >= 13 else 1)


class _Walk:
    """One pass down the chain from a tensor: the next sole reader past views."""

    def __init__(self, out: list[NodeResult], readers: SoleReaders, y: TensorInfo) -> None:
        self.out, self.readers, self.y = out, readers, y
        self.members: list[int] = []
        self.views: list[int] = []
        self.next, seen = readers.through_views(y.name, out, self.views)
        self.read = seen or y

    def take(self) -> None:
        j = self.next
        self.members.append(j)
        self.y = self.out[j].node.outputs[0]
        self.next, seen = self.readers.through_views(self.y.name, self.out, self.views)
        self.read = seen or self.y

    def nan_guard(self) -> None:
        """Take torch's guard on the probabilities, Where(IsNaN(p), 0, p) (SDPA's math path
        zeroes fully masked rows): a fused kernel handles those rows itself."""
        found = sorted(set(self.readers.at.get(self.read.name, [])))
        if self.next is not None or len(found) != 2 or min(found) < 0:
            return
        isnan, where = sorted(found, key=lambda j: self.out[j].node.op_type != "IsNaN")
        nan, sel = self.out[isnan], self.out[where]
        if not (costed(nan, "IsNaN") and costed(sel, "Where") and len(nan.node.outputs) == 1
                and self.readers.sole(nan.node.outputs[0].name) == where):
            return
        cond, fill, kept = sel.node.inputs
        if cond is None or cond.name != nan.node.outputs[0].name or kept is None \
                or kept.name != self.read.name or not _one_value(fill):
            return
        self.members.append(isnan)
        self.next = where
        self.take()

    def at(self, *op_types: str) -> bool:
        return self.next is not None and costed(self.out[self.next], *op_types) \
            and len(self.out[self.next].node.outputs) == 1


def _where(node: NodeView, scores: TensorInfo, causal: Mapping[str, CausalMask]
           ) -> tuple[TensorInfo | None, TensorInfo | None] | None:
    """A Where step on the scores: (its output, None) when it fills them outside a causal
    band (causal.py), (None, its condition) when it sets them to one value where a
    condition holds (``masked_fill`` with any other mask: the kernel reads the condition);
    None for anything else (a second tensor selected in would be read too: left apart)."""
    values = [t.name if t is not None else None for t in node.inputs[1:]]
    if scores.name not in values:
        return None
    if node.outputs[0].name in causal:
        return node.outputs[0], None
    cond, other = node.inputs[0], node.inputs[2 if values[0] == scores.name else 1]
    if cond is None or not cond.known or not _one_value(other):
        return None
    return None, cond


def _unscaled(t: TensorInfo, qk: int, w: _Walk, produced_at: Mapping[str, int]
              ) -> TensorInfo:
    """Q or K as the kernel reads it. A Mul (or Div) by one value that the first product
    alone reads folds into the kernel's score scale, which then reads the unscaled tensor:
    TensorRT's fused attention asks for the scale on Q or K, or sqrt(scale) on both, and
    torch's SDPA decomposition writes the latter."""
    p = produced_at.get(t.name)
    if p is None or w.readers.sole(t.name) != qk or not costed(w.out[p], "Mul", "Div") \
            or len(w.out[p].node.inputs) != 2:
        return t
    a, b = w.out[p].node.inputs
    for x, s in ((a, b), (b, a)) if w.out[p].node.op_type == "Mul" else ((a, b),):
        if _one_value(s) and x is not None and x.known and x.dtype == t.dtype \
                and tuple(x.shape) == tuple(t.shape):
            w.members.append(p)
            return x
    return t


def _added(mask: TensorInfo, add: int, w: _Walk, produced_at: Mapping[str, int],
           built_in: bool = True) -> _Added:
    """A mask added to the scores as the kernel reads it: one the add alone reads, built by
    a Where of a condition and two values (torch's SDPA decomposition turns a boolean mask
    into 0 / -inf that way, in every layer), is built in the kernel from the condition
    (``built_in``; eager PyTorch converts a boolean ``attn_mask`` to an additive one before
    its kernel, ``convert_boolean_attn_mask`` in aten's attention.cpp: the Where stays)."""
    p = produced_at.get(mask.name)
    where = w.out[p] if built_in and p is not None and w.readers.sole(mask.name) == add \
        else None
    if where is None or not costed(where, "Where") or len(where.node.inputs) != 3:
        return _Added(mask, mask)
    cond, a, b = where.node.inputs
    if cond is None or not cond.known or not (_one_value(a) and _one_value(b)):
        return _Added(mask, mask)
    w.members.append(p)
    return _Added(mask, cond)


def _chain(i: int, out: list[NodeResult], readers: SoleReaders,
           causal: Mapping[str, CausalMask], produced_at: Mapping[str, int],
           masks_built_in: bool = True) -> _Chain | None:
    w = _Walk(out, readers, out[i].node.outputs[0])
    w.members.append(i)
    if w.at("Mul", "Div"):
        s = other_operand(out[w.next], w.read)
        if _one_value(s) and (out[w.next].node.op_type == "Mul"
                                                or out[w.next].node.inputs[0].name == w.read.name):
            w.take()
    masks: list[_Added] = []
    while len(masks) < MAX_ADDED and w.at("Add") and other_operand(out[w.next], w.read):
        masks.append(_added(other_operand(out[w.next], w.read), w.next, w, produced_at,
                            masks_built_in))
        w.take()
    filled, selected = None, None
    if w.at("Where") and (step := _where(out[w.next].node, w.read, causal)) is not None:
        filled, selected = step
        w.take()
    while w.at("Cast"):
        w.take()
    if not w.at("Softmax") or _softmax_axis(out[w.next]) not in (-1, len(w.read.shape) - 1):
        return None
    w.take()
    while w.at("Cast"):
        w.take()
    w.nan_guard()
    while w.at("Cast"):
        w.take()
    pv = w.next
    if pv is None or not _batched(out[pv]) or out[pv].node.inputs[0].name != w.read.name:
        return None
    q_in, k_in = out[i].node.inputs
    q, k = _unscaled(q_in, i, w, produced_at), _unscaled(k_in, i, w, produced_at)
    return _Chain(tuple(w.members), tuple(w.views), pv, q, k, tuple(masks), filled, selected,
                  scaled=q is not q_in and k is not k_in)


def _causal_op(r: NodeResult, causal: Mapping[str, CausalMask]) -> NodeResult:
    """An ONNX Attention whose boolean or additive mask is built causal (an ``--attn sdpa``
    export's mask) runs as its ``is_causal`` form: the visible pairs (within a sliding
    window, if the mask has one), the mask not read."""
    mask = r.node.input(3) if costed(r, "Attention") and r.node.domain == "" else None
    found = causal.get(mask.name) if mask is not None and mask.shape is not None else None
    if found is None:
        return r
    kept = mask if found.carries_values else None  # a biased band is read, the rest skipped
    flag = {"is_causal": 1} if found.causal else {}  # else no pair hidden: padding.py
    node = replace(r.node, inputs=(*r.node.inputs[:3], kept, *r.node.inputs[4:]),
                   attrs={**r.node.attrs, **flag})
    c = onnx_attention(node, found.window)
    if c.matmul is None or not _over(mask.shape, c.matmul.m, c.matmul.n, found):
        return r
    return replace(r, node=node, cost=c)


def _sdpa_kernel(c: _Chain, qk: MatmulDims, v_head: int) -> bool:
    """Would PyTorch run this SDPA call on a fused kernel (dtype and head-dim alignment)?"""
    align = SDPA_ALIGNMENT.get(c.q.dtype)
    return c.scaled and align is not None and qk.k % align == 0 and v_head % align == 0


def _causal_added(c: _Chain, qk: MatmulDims, causal: Mapping[str, CausalMask]
                  ) -> list[CausalMask | None]:
    """Per tensor added to the scores: the causal mask it is over these queries and keys."""
    found = [causal.get(a.tensor.name) if a.tensor.shape is not None else None
             for a in c.masks]
    return [f if f is not None and _over(a.tensor.shape, qk.m, qk.n, f) else None
            for a, f in zip(c.masks, found, strict=True)]


def _over(shape: Sequence[int], m: int, n: int, mask: CausalMask) -> bool:
    """Is a mask of this shape over (m queries, n keys)? One hiding no pair may broadcast."""
    tail = tuple(shape[-2:])
    return tail == (m, n) or not mask.causal and len(tail) == 2 \
        and all(d in (1, e) for d, e in zip(tail, (m, n), strict=True))


def _fused(qk: MatmulDims, pv: NodeResult, c: _Chain, causal: Mapping[str, CausalMask]
           ) -> tuple[NodeView, OpCost] | None:
    """The fused kernel's node (reading Q, K, V and what is added to the scores, writing the
    output) and the fused attention op's cost of it; None unless both products share heads,
    queries, keys. A causal mask (causal.py) over these queries and keys: the visible pairs
    only, as an ``is_causal`` kernel computes them; its bytes are not read (the kernel masks
    by index). Each other added tensor is read once and costs one FLOP per score."""
    d = pv.cost.matmul
    if (d.b, d.m, d.k) != (qk.b, qk.m, qk.n):
        return None
    found = _causal_added(c, qk, causal)
    bands = [causal[c.filled.name]] if c.filled is not None else []
    mask = next((f for f in (*bands, *found) if f is not None), None)
    read = tuple(a.read for a, f in zip(c.masks, found, strict=True)
                 if f is None or f.carries_values)
    read += (c.selected,) if c.selected is not None else ()
    attrs = {**pv.node.attrs, "k_transposed": 1} if c.k_transposed else dict(pv.node.attrs)
    v = c.v if c.v is not None else pv.node.inputs[1]
    node = replace(pv.node, op_type="Attention", inputs=(c.q, c.k, v, *read),
                   attrs=attrs)  # K^T: attention_layout.py
    causal_ = mask is not None and mask.causal
    heads = Heads(1, qk.b, qk.b, qk.m, qk.n, qk.k, d.n, causal=causal_,
                  window=mask.window if causal_ else 0)
    return node, attention_cost(node, heads, SCORE_FLOPS + MASK_FLOPS * len(read), {})


def _unread_masks(c: _Chain, qk: MatmulDims, causal: Mapping[str, CausalMask],
                  out: list[NodeResult]) -> list[str]:
    """What the chain's kernel skips by index: each added causal mask built from positions
    alone (as the kernel would read it: a Where's condition) and the band a Where step fills
    the scores outside of (mask_builders.py drops the nodes building them)."""
    names = [a.read.name for a, m in zip(c.masks, _causal_added(c, qk, causal), strict=True)
             if m is not None and m.exact and not m.carries_values]
    if c.filled is not None and causal[c.filled.name].exact:
        step = next(out[j] for j in c.members if out[j].node.outputs
                    and out[j].node.outputs[0].name == c.filled.name)
        names.append(step.node.inputs[0].name)
    return names


def _grouped(c: _Chain, out: list[NodeResult], readers: SoleReaders,
             produced_at: Mapping[str, int], unpadded: Mapping[str, CausalMask],
             sdpa: SdpaKernels) -> _Chain | None:
    """A call passed no mask (an unpadded batch) with K and V repeated per query head:
    Hugging Face passes them grouped, which PyTorch's flash kernel reads as they are (the
    repeats part of the call) and any other GPU or dtype runs on the math path (None: op by
    op, as exported; sdpa_kernels.py)."""
    kv = grouped_kv(c.k, out[c.pv].node.inputs[1], out, readers, produced_at) \
        if any(a.tensor.name in unpadded for a in c.masks) else None
    if kv is None:
        return c
    return replace(c, k=kv[0], v=kv[1], members=(*c.members, *kv[2])) \
        if sdpa.reads_gqa(c.q.dtype) else None


def _as_sdpa_call(c: _Chain, out: list[NodeResult], readers: SoleReaders,
                  produced_at: Mapping[str, int]) -> _Chain:
    """The chain reading K itself, with the Reshapes and Transposes building K^T as members
    (SDPA's kernels take K as the model passed it); as it is where K^T is built otherwise."""
    found = key_of(c.k, out, readers, produced_at)
    if found is None:
        return c
    return replace(c, k=found[0], members=(*c.members, *found[1]), k_transposed=False)


def fuse_attention(results: Sequence[NodeResult], graph_outputs: Iterable[str] = (),
                   causal: Mapping[str, CausalMask] | None = None, *,
                   sdpa_calls: bool = False, unpadded: Mapping[str, CausalMask] | None = None,
                   sdpa: SdpaKernels = ANY_GPU) -> tuple[NodeResult, ...]:
    """Inference under a graph runtime: each eager attention chain becomes one fused
    attention kernel at its P @ V MatMul (module docstring). ``causal``: the graph's causal
    masks (``Graph.causal_masks``); a chain adding one computes only the visible pairs.

    ``sdpa_calls``: eager PyTorch (any mode): only the chains torch.onnx writes for one
    ``scaled_dot_product_attention`` call (Q and K both scaled by sqrt(scale), which neither
    Hugging Face's eager attention nor hand-written attention does) that PyTorch would run
    on a fused kernel (``_sdpa_kernel``). PyTorch's kernel given an explicit mask computes
    every pair, so only the exported ``is_causal`` flag is read as causal then, and a boolean
    mask's conversion to 0 / -inf (the export's Where) runs before it. ``unpadded``: the
    masks an unpadded batch does not pass at all (padding.py), as the kernels then run;
    ``sdpa``: which kernels PyTorch has for the GPU (grouped-query K and V: sdpa_kernels.py)."""
    readers = SoleReaders(results, graph_outputs)
    produced_at = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    causal = {} if causal is None else causal
    if sdpa_calls:
        causal = {**exported_is_causal(causal, results, produced_at), **(unpadded or {})}
    out = [_causal_op(r, causal) for r in results]
    unread = [r.node.inputs[3].name for r, o in zip(results, out, strict=True)
              if o is not r and o.node.input(3) is None and causal[r.node.inputs[3].name].exact]
    reason = SDPA_CALL if sdpa_calls else FUSED_ATTENTION
    for i, r in enumerate(out):
        if not _batched(r) or out[i] is not r:
            continue
        c = _chain(i, out, readers, causal, produced_at, not sdpa_calls)
        if c is not None and sdpa_calls and not _sdpa_kernel(c, r.cost.matmul,
                                                             out[c.pv].cost.matmul.n):
            c = None
        c = _as_sdpa_call(c, out, readers, produced_at) if c is not None else None
        if c is not None and sdpa_calls:
            c = _grouped(c, out, readers, produced_at, unpadded or {}, sdpa)
        fused = _fused(r.cost.matmul, out[c.pv], c, causal) if c is not None else None
        if fused is None:
            continue
        unread += _unread_masks(c, r.cost.matmul, causal, out)
        _apply(out, c, fused, reason)
    skipped = [n for n in unread if n in (unpadded or {})]  # padding.py: none is built
    out = drop_unread(out, skipped, graph_outputs, UNPADDED)
    return drop_unread(out, [n for n in unread if n not in skipped], graph_outputs)


def _apply(out: list[NodeResult], c: _Chain, fused: tuple[NodeView, OpCost], reason: str
           ) -> None:
    """The chain's kernel at its P @ V node; its members zero-cost, its views gone."""
    out[c.pv] = replace(out[c.pv], node=fused[0], cost=fused[1])
    for j in c.members:
        out[j] = NodeResult(replace(out[j].node, inputs=(), outputs=()), "zero", None, reason)
    for j in c.views:
        out[j] = replace(out[j], node=replace(out[j].node, inputs=(), outputs=()))
