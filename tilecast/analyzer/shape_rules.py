"""Shape rules for ops ONNX shape inference does not know (com.microsoft fused ops and the like),
and corrections where it answers wrong for a standard op.

Each rule maps the input shapes of a node to its output shapes (None where unknown); the
propagation pass (``propagate.py``) applies them in graph order, so shapes flow on to the
standard ops downstream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx

Shape = tuple[int | str, ...]
ShapeRule = Callable[[Sequence[Shape | None], onnx.NodeProto], list[Shape | None]]


def _same_as_input0(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # Fused elementwise/normalization ops: the main output and the residual sum (output 3 of
    # SkipLayerNormalization) have the input's shape; the normalizations' mean / inv-std
    # outputs (1, 2) hold one value per row, the normalized last dim kept as 1.
    x = ins[0]
    stats = None if x is None or not x else (*x[:-1], 1)
    return [x] + [x if i == 3 else stats for i in range(1, len(node.output))]


def _attention(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # com.microsoft Attention: input (B, S, hidden), weights (hidden, q + k + v hidden).
    x, w = ins[0], ins[1] if len(ins) > 1 else None
    sizes = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), None)
    if x is None or (w is None and not sizes):
        return [None]
    v_hidden = sizes[2] if sizes else w[-1] // 3 if isinstance(w[-1], int) else w[-1]
    return [(*x[:-1], v_hidden)]


def _embed_layer_norm(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # (Q)EmbedLayerNormalization: input_ids (B, S) and word_embedding (V, H) -> output
    # (B, S, H), mask_index (B), and the optional embedding sum (B, S, H).
    ids, emb = ins[0], ins[2] if len(ins) > 2 else None
    if ids is None or emb is None or len(ids) != 2:
        return [None]
    out = (*ids, emb[-1])
    return [out, (ids[0],), out]


def _multi_head_attention(ins: Sequence[Shape | None], node: onnx.NodeProto,
                          ) -> list[Shape | None]:
    # query (B, S, D); value (B, L, Dv) or (B, N, L, H): output (B, S, Dv or N * H).
    q = ins[0]
    v = ins[2] if len(ins) > 2 else None
    if q is None:
        return [None]
    if v is not None and len(v) == 4 and all(isinstance(d, int) for d in (v[1], v[3])):
        return [(*q[:-1], v[1] * v[3])]
    return [(*q[:-1], v[-1] if v is not None and len(v) == 3 else q[-1])]


def _group_query_attention(ins: Sequence[Shape | None], node: onnx.NodeProto,
                           ) -> list[Shape | None]:
    # query (B, S, Hq * D), or packed (B, S, (Hq + 2 Hkv) * D) without key; past_key
    # (B, Hkv, P, D): output (B, S, Hq * D), present_key / present_value (B, Hkv, P + S, D).
    q = ins[0]
    heads = {a.name: a.i for a in node.attribute if a.name in ("num_heads", "kv_num_heads")}
    hq, hkv = heads.get("num_heads"), heads.get("kv_num_heads")
    if q is None or len(q) != 3 or not isinstance(q[2], int) or not hq or not hkv:
        return [None]
    packed = len(ins) < 2 or not node.input[1]
    d = q[2] // (hq + 2 * hkv) if packed else q[2] // hq
    has_past = len(node.input) > 3 and bool(node.input[3])
    past = ins[3] if has_past else None
    total: int | str | None = q[1]
    if has_past:
        known = past is not None and isinstance(past[2], int) and isinstance(q[1], int)
        total = past[2] + q[1] if known else None
    present = (q[0], hkv, total, d) if total is not None else None
    return [(q[0], q[1], hq * d), present, present]


def _fused_matmul(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # alpha * op(A) @ op(B) with numpy broadcasting of the batch dims (transBatch* not handled).
    flags = {a.name: a.i for a in node.attribute}
    a, b = ins[0], ins[1] if len(ins) > 1 else None
    if a is None or b is None or len(a) < 2 or len(b) < 2 or \
            flags.get("transBatchA") or flags.get("transBatchB"):
        return [None]
    m = a[-1] if flags.get("transA") else a[-2]
    n = b[-2] if flags.get("transB") else b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    rank = max(len(batch_a), len(batch_b))
    batch_a = (1,) * (rank - len(batch_a)) + batch_a
    batch_b = (1,) * (rank - len(batch_b)) + batch_b
    batch = tuple(y if x == 1 else x for x, y in zip(batch_a, batch_b, strict=True))
    return [(*batch, m, n)]


def _matmul_n_bits(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # A (..., K) @ packed 4-bit B: output (..., N), N an attribute.
    n = next((a.i for a in node.attribute if a.name == "N"), None)
    return [(*ins[0][:-1], n) if ins[0] is not None and n else None]


def _same_twice(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    """SkipGroupNorm: Y and the sum S, both of X's shape."""
    return [ins[0], ins[0]]


def _bias_split_gelu(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    x = ins[0]
    return [(*x[:-1], x[-1] // 2) if x is not None and isinstance(x[-1], int) else None]


def _gather_block_quantized(ins: Sequence[Shape | None], node: onnx.NodeProto,
                            ) -> list[Shape | None]:
    """(V, D / (8 / bits)) uint8 rows gathered by indices: (*indices, D) at gather_axis 0 and
    the quantized axis last (how ORT GenAI stores int4 embedding tables)."""
    data, idx = ins[0], ins[1] if len(ins) > 1 else None
    attrs = {a.name: a.i for a in node.attribute}
    if data is None or idx is None or attrs.get("gather_axis", 0) != 0 or \
            attrs.get("quantize_axis", len(data) - 1) not in (-1, len(data) - 1):
        return [None]
    per_byte = 8 // attrs.get("bits", 4)
    return [(*idx, *data[1:-1], data[-1] * per_byte)]


def _cdist(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    """A (N, D), B (M, D) -> the (N, M) distances."""
    a, b = ins[0], ins[1] if len(ins) > 1 else None
    return [(a[0], b[0]) if a is not None and b is not None else None]


def nhwc_weight(x: Shape, w: Shape, group: int, kernel: Sequence[int]) -> Shape | None:
    """An NHWC conv's weight as (M, C / g, *kernel): ORT's NhwcConv fusion stores it either
    as Conv's (M, C / g, kh, kw) or transposed to (M, kh, kw, C / g); the channel count (and
    the kernel_shape attribute where given) tells which."""
    c = x[-1]
    if not all(isinstance(d, int) for d in (*x, *w)):
        return None
    if w[1] * group == c and (not kernel or tuple(w[2:]) == tuple(kernel)):
        return w
    if w[-1] * group == c and (not kernel or tuple(w[1:-1]) == tuple(kernel)):
        return (w[0], w[-1], *w[1:-1])
    return None


def _window_out(x: Shape, taps: Sequence[int], a: dict) -> list[int]:
    """Output sizes of a sliding window over channels-last X (N, *spatial, C), as Conv and
    MaxPool define them (strides, pads, dilations, auto_pad, ceil_mode)."""
    rank = len(x) - 2
    strides, dil = a.get("strides", [1] * rank), a.get("dilations", [1] * rank)
    pads = a.get("pads", [0] * 2 * rank)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    out = []
    for i in range(rank):
        size, span = x[1 + i], dil[i] * (taps[i] - 1) + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-size // strides[i]))
        else:
            room = size + pads[i] + pads[i + rank] - span
            out.append((-(-room // strides[i]) if a.get("ceil_mode") else room // strides[i])
                       + 1)
    return out


def _attrs(node: onnx.NodeProto) -> dict:
    return {at.name: onnx.helper.get_attribute_value(at) for at in node.attribute}


def _nhwc_conv(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    """X (N, *spatial, C) -> Y (N, *out, M), with Conv's output size per spatial axis."""
    x, w = ins[0], ins[1] if len(ins) > 1 else None
    a = _attrs(node)
    if x is None or w is None:
        return [None]
    wn = nhwc_weight(x, w, a.get("group", 1), a.get("kernel_shape", ()))
    if wn is None:
        return [None]
    return [(x[0], *_window_out(x, wn[2:], a), wn[0])]


def _nhwc_max_pool(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    """X (N, *spatial, C) -> Y (N, *out, C) over ``kernel_shape`` windows."""
    x, a = ins[0], _attrs(node)
    if x is None or not a.get("kernel_shape") or not all(isinstance(d, int) for d in x):
        return [None]
    return [(x[0], *_window_out(x, a["kernel_shape"], a), x[-1])]


RULES: dict[tuple[str, str], ShapeRule] = {
    **{("com.microsoft", op): _same_as_input0 for op in (
        "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding",
        "LayerNormalization")},
    ("", "SimplifiedLayerNormalization"): _same_as_input0,
    # experimental ops of opsets 1-9 that ONNX no longer defines (no shape inference left)
    **{("", op): _same_as_input0 for op in (
        "ImageScaler", "Affine", "Scale", "ScaledTanh", "ParametricSoftplus")},
    # an ONNX function op without a shape-inference function of its own:
    ("", "GroupNormalization"): _same_as_input0,
    ("com.microsoft", "Attention"): _attention,
    # QAttention: input, weight (hidden, 3 * hidden), bias: the layout of Attention's.
    ("com.microsoft", "QAttention"): _attention,
    ("com.microsoft", "EmbedLayerNormalization"): _embed_layer_norm,
    ("com.microsoft", "QEmbedLayerNormalization"): _embed_layer_norm,
    ("com.microsoft", "MultiHeadAttention"): _multi_head_attention,
    ("com.microsoft", "GroupQueryAttention"): _group_query_attention,
    ("com.microsoft", "FusedMatMul"): _fused_matmul,
    ("com.microsoft", "MatMulNBits"): _matmul_n_bits,
    ("com.microsoft", "GroupNorm"): _same_as_input0,
    ("com.microsoft", "SkipGroupNorm"): _same_twice,
    ("com.microsoft", "BiasSplitGelu"): _bias_split_gelu,
    ("com.microsoft", "GatherBlockQuantized"): _gather_block_quantized,
    ("com.microsoft", "Inverse"): _same_as_input0,
    # FusedMatMul's earlier name, and FusedMatMul with a fused activation
    ("com.microsoft", "TransposeMatMul"): _fused_matmul,
    ("com.microsoft", "FusedMatMulActivation"): _fused_matmul,
    ("com.microsoft", "MatMulBnb4"): _matmul_n_bits,  # bitsandbytes' 4-bit weights: K, N attrs
    ("com.microsoft", "CDist"): _cdist,
    ("com.microsoft", "NhwcConv"): _nhwc_conv,
    ("com.microsoft", "NhwcFusedConv"): _nhwc_conv,
    ("com.microsoft", "NhwcMaxPool"): _nhwc_max_pool,
    ("com.microsoft", "GatedRMSNorm"): _same_as_input0,
    ("com.microsoft", "MRotaryEmbedding"): _same_as_input0,
    ("com.microsoft", "MoE"): _same_as_input0,
    ("com.microsoft", "QMoE"): _same_as_input0,
}


def _stft_onesided(node: onnx.NodeProto, outs: list[onnx.TypeProto | None],
                   ) -> list[onnx.TypeProto | None]:
    """ONNX's STFT inference reads a missing ``onesided`` as 0; the schema's default is 1, and
    ONNX Runtime and the reference evaluator return n // 2 + 1 bins. Checked with onnx 1.23:
    a 64-sample window gave 64 bins in the inferred type, 33 in both runtimes' output."""
    if any(a.name == "onesided" for a in node.attribute) or not outs or outs[0] is None:
        return outs
    dims = outs[0].tensor_type.shape.dim
    if len(dims) == 4 and dims[2].HasField("dim_value"):
        dims[2].dim_value = dims[2].dim_value // 2 + 1
    return outs


# (domain, op_type) -> a fix applied to ONNX's inferred output types
CORRECTIONS: dict[tuple[str, str], Callable[[onnx.NodeProto, list[onnx.TypeProto | None]],
                                            list[onnx.TypeProto | None]]] = {
    ("", "STFT"): _stft_onesided,
}


def _expand_dims(ins: Sequence[Shape | None], values: Sequence[Any]) -> list[Shape | None]:
    """ORT's ExpandDims(X, axis): X with a 1 inserted at ``axis``, a host-side scalar."""
    x, axis = ins[0], values[1] if len(values) > 1 else None
    if x is None or axis is None:
        return [None]
    a = int(axis)
    a = a + len(x) + 1 if a < 0 else a
    return [(*x[:a], 1, *x[a:])]


# (domain, op_type) -> a rule that also reads the host values of small inputs (None where
# not known); the outputs take input 0's element type.
VALUE_RULES: dict[tuple[str, str], Callable[[Sequence[Shape | None], Sequence[Any]],
                                            list[Shape | None]]] = {
    ("com.microsoft", "ExpandDims"): _expand_dims,
}
