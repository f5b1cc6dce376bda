"""Fused attention ops: ONNX Attention (opset 23+), com.microsoft Attention (and its int8
QAttention), MultiHeadAttention, GroupQueryAttention, DecoderMaskedMultiHeadAttention, the
packed (padding-free) PackedAttention / PackedMultiHeadAttention, SparseAttention and
PagedAttention; ONNX LinearAttention (opset 27).

FLOPs = QK^T (2 * scores * D) + PV (2 * scores * Dv) + per-score softmax work, where ``scores``
is B * Hq * (query, key) pairs computed. A causal op skips the pairs above the diagonal: fused
kernels (flash / memory-efficient) do not visit them, which halves the work of a square prompt
but leaves a one-token decode step whole -- so the visible pairs are counted exactly rather
than halved. K and V bytes use the kv heads (grouped-query attention reads Hkv < Hq heads).
The matmul view is the QK^T product: MatmulDims(B * Hq, Sq, Skv, D).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..registry import CostFn, cost, register_all
from ..types import MatmulDims, NodeView, OpCost, RowDims
from .common import attr_str, has_input, in_shape, io_bytes, nbytes, prod, require, unique_bytes
from .elementwise import ROTARY

MS = "com.microsoft"
SCORE_FLOPS = 6  # per score: scale, then softmax's max, subtract, exp, sum, divide
MASK_FLOPS = 1  # adding a mask / bias to a score
SOFTCAP_FLOPS = 3  # softcap * tanh(score / softcap)


@dataclass(frozen=True)
class Heads:
    """One attention call: B batches, Hq query heads sharing Hkv key/value heads, Sq queries
    against Skv keys in total (cache + new), head sizes D (query/key) and Dv (value)."""

    b: int
    hq: int
    hkv: int
    sq: int
    skv: int
    d: int
    dv: int
    causal: bool = False
    window: int = 0  # > 0: each query sees at most window + 1 keys (local attention)

    @property
    def scores(self) -> int:
        pairs = causal_pairs(self.sq, self.skv, self.window) if self.causal else self.sq * self.skv
        return self.b * self.hq * pairs

    def out_bytes(self, item: float) -> tuple[int, int, int]:
        """Bytes of Y, of the present key cache and of the present value cache."""
        kv = self.b * self.hkv * self.skv
        return (int(self.b * self.hq * self.sq * self.dv * item), int(kv * self.d * item),
                int(kv * self.dv * item))


def _prefix(x: int, cap: int) -> int:
    """sum(min(t, cap) for t in 1..x), 0 for x <= 0."""
    x = max(x, 0)
    return x * (x + 1) // 2 if x <= cap else cap * (cap + 1) // 2 + (x - cap) * cap


def causal_pairs(sq: int, skv: int, window: int = 0) -> int:
    """Visible (query, key) pairs of a bottom-right aligned causal mask: query i sits at
    position skv - sq + i and sees the keys up to it (at most window + 1 of them)."""
    cap = min(skv, window + 1) if window > 0 else skv
    return _prefix(skv, cap) - _prefix(skv - sq, cap)


def attention_cost(node: NodeView, h: Heads, per_score: int, outputs: dict[int, int], *,
                   extra_flops: int = 0, skip_inputs: tuple[int, ...] = (),
                   extra_bytes: int = 0, scores: int | None = None) -> OpCost:
    """``outputs``: bytes of the outputs whose size follows from ``h`` (Y, present caches),
    whatever shape inference said; other named outputs count at their inferred size.
    ``scores``: the (query, key) pairs computed, where a mask bounds them below ``h``'s."""
    s = h.scores if scores is None else scores
    flops = 2 * s * h.d + 2 * s * h.dv + per_score * s + extra_flops
    ins = [t for i, t in enumerate(node.inputs) if i not in skip_inputs]
    written = sum(outputs[i] if i in outputs else nbytes(node, t)
                  for i, t in enumerate(node.outputs) if t.name)
    return OpCost("attention", flops, unique_bytes(node, ins) + written + extra_bytes,
                  node.inputs[0].dtype, unit="matrix",
                  matmul=MatmulDims(h.b * h.hq, h.sq, h.skv, h.d, causal=h.causal),
                  rows=RowDims(h.b * h.hq * h.sq, h.skv), elements=h.b * h.hq * h.sq * h.dv)


def _per_score(node: NodeView, mask_inputs: tuple[int, ...]) -> int:
    masked = any(has_input(node, i) for i in mask_inputs)
    return SCORE_FLOPS + MASK_FLOPS * masked + SOFTCAP_FLOPS * bool(node.attr("softcap", 0.0))


def _heads_attr(node: NodeView, key: str) -> int:
    n = node.attr(key)
    require(node, isinstance(n, int) and n > 0, f"attribute {key} (a positive int) is required")
    return n


@cost("Attention", since=23)
def onnx_attention(node: NodeView, window: int = 0) -> OpCost:
    """Q, K, V 4-D (B, H, S, D) or 3-D (B, S, H * D) with q_num_heads / kv_num_heads;
    past_key (B, Hkv, P, D) makes Skv = P + new keys; is_causal is bottom-right aligned.
    ``window`` > 0 (a sliding-window mask read from the graph, attention_fusion.py): each
    query sees at most window + 1 keys."""
    q, k, v = in_shape(node, 0), in_shape(node, 1), in_shape(node, 2)
    if len(q) == 4:
        b, hq, sq, d, hkv, skv, dv = *q, k[1], k[2], v[3]
    else:
        hq, hkv = _heads_attr(node, "q_num_heads"), _heads_attr(node, "kv_num_heads")
        b, sq, d, skv, dv = q[0], q[1], q[2] // hq, k[1], v[2] // hkv
    past = in_shape(node, 4)[2] if has_input(node, 4) else 0
    h = Heads(b, hq, hkv, sq, past + skv, d, dv, causal=bool(node.attr("is_causal", 0)),
              window=window)
    y, pk, pv = h.out_bytes(node.inputs[0].itemsize)
    return attention_cost(node, h, _per_score(node, (3,)), {0: y, 1: pk, 2: pv})


def packed_attention(past: int, masks: tuple[int, ...]) -> CostFn:
    """Factory for com.microsoft Attention-style ops: input (B, S, hidden) @ weights (hidden,
    q + k + v hidden) + bias, then attention over past (2, B, N, P, H) + S keys; ``present``
    (output 1) holds both caches. ``past`` / ``masks``: the op's input positions. The kernel
    runs at input 0's dtype: int8 for QAttention, whose QKV projection is the int8 GEMM."""

    def fn(node: NodeView) -> OpCost:
        x, w, n = in_shape(node, 0), in_shape(node, 1), _heads_attr(node, "num_heads")
        require(node, len(x) == 3 and len(w) == 2, "expects input (B, S, hidden), 2-D weights")
        qh, _, vh = node.attr("qkv_hidden_sizes") or [w[1] // 3] * 3
        b, s = x[0], x[1]
        cached = in_shape(node, past)[3] if has_input(node, past) else 0
        h = Heads(b, n, n, s, cached + s, qh // n, vh // n,
                  causal=bool(node.attr("unidirectional", 0)))
        projection = 2 * b * s * x[2] * w[1] + (b * s * w[1] if has_input(node, 2) else 0)
        y, pk, pv = h.out_bytes(node.outputs[0].itemsize)
        return attention_cost(node, h, _per_score(node, masks), {0: y, 1: pk + pv},
                              extra_flops=projection)

    return fn


# Attention: input, weights, bias, mask_index (3), past (4), attention_bias (5).
register_all(("Attention",), packed_attention(4, (3, 5)), domain=MS)
# QAttention: input, weight, bias, input_scale, weight_scale, mask_index (5), input_zero_point,
# weight_zero_point, past (8): the same attention after an int8 projection.
register_all(("QAttention",), packed_attention(8, (5,)), domain=MS)


def _mha_heads(node: NodeView, n: int) -> tuple[int, int, int, int, int, int]:
    """(B, Sq, new keys, D, Dv, kv heads) for MultiHeadAttention's input layouts."""
    q = in_shape(node, 0)
    if not has_input(node, 1):  # packed QKV (B, S, N, 3, H)
        require(node, len(q) == 5, "without key, query must be packed (B, S, N, 3, H)")
        return q[0], q[1], q[1], q[4], q[4], q[2]
    k = in_shape(node, 1)
    if len(k) == 5:  # packed KV (B, L, N, 2, H)
        return q[0], q[1], k[1], k[4], k[4], k[2]
    if len(k) == 4:  # key / value already split into heads (B, N, L, H): cross attention
        return q[0], q[1], k[2], k[3], in_shape(node, 2)[3], k[1]
    return q[0], q[1], k[1], q[2] // n, in_shape(node, 2)[2] // n, n


@cost("MultiHeadAttention", domain=MS)
def ms_multi_head_attention(node: NodeView) -> OpCost:
    """query, key, value, bias, key_padding_mask, attention_bias, past_key (B, N, P, H), ..."""
    n = _heads_attr(node, "num_heads")
    b, sq, new_kv, d, dv, hkv = _mha_heads(node, n)
    past = in_shape(node, 6)[2] if has_input(node, 6) else 0
    h = Heads(b, n, hkv, sq, past + new_kv, d, dv, causal=bool(node.attr("unidirectional", 0)))
    bias_adds = b * (sq * n * d + new_kv * hkv * (d + dv)) if has_input(node, 3) else 0
    y, pk, pv = h.out_bytes(node.inputs[0].itemsize)
    return attention_cost(node, h, _per_score(node, (4, 5)), {0: y, 1: pk, 2: pv},
                          extra_flops=bias_adds)


def _gqa_rotary(node: NodeView, tokens: int, heads: int, d: int) -> tuple[int, int]:
    """(FLOPs, bytes) of GQA's fused rotary: the cos/sin cache rows at the tokens' positions."""
    if not (node.attr("do_rotary", 0) and has_input(node, 7)):
        return 0, 0
    cache = in_shape(node, 7)  # (max positions, D / 2), sin_cache alike
    rows = min(prod(cache[:-1]), tokens)
    return ROTARY * tokens * heads * d, int(2 * rows * cache[-1] * node.inputs[7].itemsize)


@cost("GroupQueryAttention", domain=MS)
def ms_group_query_attention(node: NodeView) -> OpCost:
    """Always causal. query (B, S, Hq * D) or packed (B, S, (Hq + 2 Hkv) * D); past_key
    (B, Hkv, P, D). P is taken as the cached length: a max-length shared buffer over-counts."""
    q = in_shape(node, 0)
    hq, hkv = _heads_attr(node, "num_heads"), _heads_attr(node, "kv_num_heads")
    packed = not has_input(node, 1)
    d = q[2] // (hq + 2 * hkv) if packed else q[2] // hq
    new_kv = q[1] if packed else in_shape(node, 1)[1]
    past = in_shape(node, 3)[2] if has_input(node, 3) else 0
    h = Heads(q[0], hq, hkv, q[1], past + new_kv, d, d, causal=True,
              window=max(node.attr("local_window_size", -1), 0))
    rot_flops, rot_bytes = _gqa_rotary(node, q[0] * q[1], hq + hkv, d)
    y, pk, pv = h.out_bytes(node.inputs[0].itemsize)
    return attention_cost(node, h, _per_score(node, (10,)), {0: y, 1: pk, 2: pv},
                          extra_flops=rot_flops, skip_inputs=(7, 8), extra_bytes=rot_bytes)


# Per token, a KV head's state update in FLOPs per state element (d_k x d_v) and per value
# element, from the ONNX spec's recurrences (an FMA = 2): "linear" S += k v^T (2); "gated"
# scales S by exp(g) first (+1); "delta" forms S^T k (2), subtracts it from v and scales by
# beta (2 per value element) before the outer product (2); "gated_delta" also scales S (+1).
LINEAR_UPDATE = {"linear": (2, 0), "gated": (3, 0), "delta": (4, 2), "gated_delta": (5, 2)}


@cost("LinearAttention", since=27)
def linear_attention(node: NodeView) -> OpCost:
    """query (B, T, Hq dk), key (B, T, Hkv dk), value (B, T, Hkv dv) [, past_state (B, Hkv,
    dk, dv), decay, beta] -> output (B, T, Hq dv), present_state. Per token, each KV head
    updates its d_k x d_v state (``LINEAR_UPDATE``) and each query head reads it out, q^T S
    and the scale (2 dk dv + dv). The sequential recurrence's count; chunk-parallel kernels add
    intra-chunk products of the chunk size per token, left out. No kernel of it was
    measured: the memory-bound rule with these FLOPs costs it."""
    q, v = in_shape(node, 0), in_shape(node, 2)
    hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
    require(node, bool(hq) and bool(hkv) and hq % hkv == 0 and q[2] % hq == 0
            and v[2] % hkv == 0, f"heads q {hq} / kv {hkv} do not divide {list(q)}, {list(v)}")
    dk, dv = q[2] // hq, v[2] // hkv
    rule = attr_str(node, "update_rule", "gated_delta")
    require(node, rule in LINEAR_UPDATE, f"unknown update_rule {rule!r}")
    per_state, per_value = LINEAR_UPDATE[rule]
    per_token = hkv * (per_state * dk * dv + per_value * dv) + hq * (2 * dk * dv + dv)
    return OpCost("attention", q[0] * q[1] * per_token, io_bytes(node),
                  node.inputs[0].dtype, elements=q[0] * q[1] * hq * dv)


@cost("DecoderMaskedMultiHeadAttention", domain=MS)
def ms_decoder_masked_mha(node: NodeView) -> OpCost:
    """One new token per sequence (Whisper and beam-search decoders): query (B, 1, hidden) or
    packed QKV (B, 1, 3 hidden); key / value the new token (self attention) or the encoder's
    states (B, N, L, H) (cross attention, L keys). Self attention attends the past cache
    (B, N, P, H) and the new key. With ``past_present_share_buffer`` the cache is a buffer of
    the maximum length and the past length a runtime value: the buffer's length bounds it,
    and the kernel is marked ``estimated``; the present cache then writes one position."""
    q, n = in_shape(node, 0), _heads_attr(node, "num_heads")
    packed = not has_input(node, 1)
    hidden = q[2] // 3 if packed else q[2]
    d = hidden // n
    cross = has_input(node, 1) and len(in_shape(node, 1)) == 4
    shared = bool(node.attr("past_present_share_buffer", 0))
    if cross:
        skv = in_shape(node, 1)[2]
    else:
        past = in_shape(node, 5)[2] if has_input(node, 5) else 0
        skv = past if shared else past + 1
    h = Heads(q[0], n, n, 1, skv, d, d)
    y, pk, pv = h.out_bytes(node.inputs[0].itemsize)
    if shared:  # the present caches alias the past buffers: one new position written
        pk = pv = int(q[0] * n * d * node.inputs[0].itemsize)
    bias = 3 * q[0] * hidden if has_input(node, 10) else 0
    c = attention_cost(node, h, _per_score(node, (3, 4)), {0: y, 1: pk, 2: pv},
                       extra_flops=bias)
    return replace(c, estimated=shared and not cross)


def _packed_tokens(node: NodeView, offsets: int) -> tuple[int, int, int]:
    """(tokens T, batch B, padded length S) of a packed op: T real tokens of B sequences of at
    most S (``token_offset`` is (B, S))."""
    off = in_shape(node, offsets)
    return prod(in_shape(node, 0)[:1]), off[0], off[1]


@cost("PackedMultiHeadAttention", domain=MS)
def ms_packed_mha(node: NodeView) -> OpCost:
    """Padding removed: query (T, hidden) or packed QKV (T, N, 3, H); each of the T tokens
    attends the keys of its own sequence, at most S (token_offset (B, S)). The sequence
    lengths are runtime values: T x S pairs per head bound the true sum of squared lengths,
    exact when no token was padding (T = B S); otherwise the kernel is marked ``estimated``."""
    q, n = in_shape(node, 0), _heads_attr(node, "num_heads")
    tokens, b, s = _packed_tokens(node, 4)
    d = q[3] if len(q) == 4 else q[1] // n
    dv = d if len(q) == 4 else in_shape(node, 2)[1] // n
    h = Heads(1, n, n, tokens, s, d, dv)
    bias = tokens * n * (2 * d + dv) if has_input(node, 3) else 0
    c = attention_cost(node, h, _per_score(node, (6,)), {0: int(tokens * n * dv *
                                                                node.inputs[0].itemsize)},
                       extra_flops=bias)
    return replace(c, estimated=tokens < b * s)


@cost("PackedAttention", domain=MS)
def ms_packed_attention(node: NodeView) -> OpCost:
    """PackedMultiHeadAttention after its QKV projection: input (T, hidden) @ weights
    (hidden, q + k + v hidden) + bias, token_offset (B, S) at input 3."""
    x, w, n = in_shape(node, 0), in_shape(node, 1), _heads_attr(node, "num_heads")
    qh, _, vh = node.attr("qkv_hidden_sizes") or [w[1] // 3] * 3
    tokens, b, s = _packed_tokens(node, 3)
    h = Heads(1, n, n, tokens, s, qh // n, vh // n)
    projection = 2 * tokens * x[1] * w[1] + (tokens * w[1] if has_input(node, 2) else 0)
    c = attention_cost(node, h, _per_score(node, (5,)),
                       {0: int(tokens * vh * node.inputs[0].itemsize)},
                       extra_flops=projection)
    return replace(c, estimated=tokens < b * s)


@cost("SparseAttention", domain=MS)
def ms_sparse_attention(node: NodeView) -> OpCost:
    """Phi-3-small's block-sparse attention: query (B, S, Hq D) or packed QKV; past caches
    (B, Hkv, M, D) are buffers of the maximum length M; the CSR block mask (num_layout,
    max_nnz) at input 6. Each head's pairs are bounded by the mask's nonzero blocks
    (max_nnz x block^2) and by the causal pairs of S queries over M keys; lengths are runtime
    values, so the kernel is marked ``estimated``."""
    q = in_shape(node, 0)
    hq, hkv = _heads_attr(node, "num_heads"), _heads_attr(node, "kv_num_heads")
    packed = not has_input(node, 1)
    d = q[2] // (hq + 2 * hkv) if packed else q[2] // hq
    cache = in_shape(node, 3)[2] if has_input(node, 3) else q[1]
    block = _heads_attr(node, "sparse_block_size")
    nnz = in_shape(node, 6)[-1] * block * block
    h = Heads(q[0], hq, hkv, q[1], max(cache, q[1]), d, d)
    pairs = min(nnz, causal_pairs(h.sq, h.skv))
    y, pk, pv = h.out_bytes(node.inputs[0].itemsize)
    c = attention_cost(node, h, SCORE_FLOPS, {0: y, 1: pk, 2: pv},
                       scores=h.b * h.hq * pairs)
    return replace(c, estimated=True)


@cost("PagedAttention", domain=MS)
def ms_paged_attention(node: NodeView) -> OpCost:
    """Continuous batching over a block-based KV cache: T packed tokens of B sequences;
    block_table (B, max blocks) at input 7, caches (num_blocks, block, Hkv, D). Each token
    attends at most max blocks x block keys, and the KV read is bounded by B sequences of
    that length (never more than the cache pool). The sequence lengths are runtime values:
    ``estimated``. The new tokens' K and V are written into the cache."""
    q, kc = in_shape(node, 0), in_shape(node, 3)
    hq, hkv = _heads_attr(node, "num_heads"), _heads_attr(node, "kv_num_heads")
    packed = not has_input(node, 1)
    d = q[1] // (hq + 2 * hkv) if packed else q[1] // hq
    dv = node.attr("v_head_size", 0) or d
    table = in_shape(node, 7)
    context = table[1] * kc[1]
    item = node.inputs[0].itemsize
    pool = nbytes(node, node.inputs[3]) + (nbytes(node, node.inputs[4])
                                           if has_input(node, 4) else 0)
    kv_read = min(pool, int(table[0] * context * hkv * (d + dv) * item))
    h = Heads(1, hq, hkv, q[0], context, d, dv)
    new_kv = int(q[0] * hkv * (d + dv) * item)
    c = attention_cost(node, h, _per_score(node, ()), {0: int(q[0] * hq * dv * item),
                                                       1: new_kv, 2: 0},
                       skip_inputs=(3, 4), extra_bytes=kv_read)
    return replace(c, estimated=True)
