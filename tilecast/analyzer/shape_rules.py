"""Shape rules for ops ONNX shape inference does not know (com.microsoft fused ops and the like).

Each rule maps the input shapes of a node to its output shapes. ``complete_missing_shapes``
applies them where inference left outputs without a shape, then re-runs inference so the
shapes flow on to the standard ops downstream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx
from onnx import helper

Shape = tuple[int | str, ...]
ShapeRule = Callable[[Sequence[Shape | None], onnx.NodeProto], list[Shape | None]]
MAX_ROUNDS = 16


def _same_as_input0(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # Fused elementwise/normalization ops: every output the node declares (main output, and the
    # residual sum of SkipLayerNormalization) has the input's shape; stats outputs are skipped.
    return [ins[0]] + [ins[0] if i == 3 else None for i in range(1, len(node.output))]


def _attention(ins: Sequence[Shape | None], node: onnx.NodeProto) -> list[Shape | None]:
    # com.microsoft Attention: input (B, S, hidden), weights (hidden, q + k + v hidden).
    x, w = ins[0], ins[1] if len(ins) > 1 else None
    sizes = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), None)
    if x is None or (w is None and not sizes):
        return [None]
    v_hidden = sizes[2] if sizes else w[-1] // 3 if isinstance(w[-1], int) else w[-1]
    return [(*x[:-1], v_hidden)]


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


RULES: dict[tuple[str, str], ShapeRule] = {
    **{("com.microsoft", op): _same_as_input0 for op in (
        "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding",
        "LayerNormalization")},
    ("", "SimplifiedLayerNormalization"): _same_as_input0,
    # an ONNX function op without a shape-inference function of its own:
    ("", "GroupNormalization"): _same_as_input0,
    ("com.microsoft", "Attention"): _attention,
    ("com.microsoft", "MultiHeadAttention"): _multi_head_attention,
    ("com.microsoft", "GroupQueryAttention"): _group_query_attention,
    ("com.microsoft", "FusedMatMul"): _fused_matmul,
    ("com.microsoft", "MatMulNBits"): _matmul_n_bits,
}


def _shape_of(vi: onnx.ValueInfoProto | None) -> Shape | None:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in vi.type.tensor_type.shape.dim)


def _apply_rules(model: onnx.ModelProto) -> bool:
    g = model.graph
    infos = {vi.name: vi for vi in (*g.input, *g.output, *g.value_info)}
    known = {n: vi for n, vi in infos.items() if vi.type.tensor_type.HasField("shape")}
    for t in g.initializer:
        known.setdefault(t.name, helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    added = False
    for node in g.node:
        rule = RULES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        if rule is None or all(o in known for o in node.output if o):
            continue
        in_vis = [known.get(n) for n in node.input]
        if not in_vis or in_vis[0] is None:
            continue
        elem = in_vis[0].type.tensor_type.elem_type
        shapes = rule([_shape_of(v) for v in in_vis], node)
        for name, shape in zip(node.output, shapes, strict=False):
            if name and shape is not None and name not in known:
                vi = helper.make_tensor_value_info(name, elem, list(shape))
                if name in infos:  # typed but shapeless: complete it in place, no duplicate
                    infos[name].type.CopyFrom(vi.type)
                else:
                    g.value_info.append(vi)
                known[name] = vi
                added = True
    return added


def complete_missing_shapes(model: onnx.ModelProto,
                            infer: Callable[[onnx.ModelProto], onnx.ModelProto],
                            ) -> onnx.ModelProto:
    for _ in range(MAX_ROUNDS):
        if not _apply_rules(model):
            break
        model = infer(model)
    return model
