"""Attention costs (causal pairs, grouped-query kv bytes, fused projections), the registry's
refusals, the zero-cost list, coverage of exported-model op types, and shape errors.

Per score: QK^T 2*D + PV 2*Dv + 6 (scale, max, subtract, exp, sum, divide) [+1 with a mask].
float32 = 4 bytes.
"""

from __future__ import annotations

import onnx.parser
import pytest
from test_costs import cost_of as _cost_of

import tilecast.analyzer.costs  # noqa: F401  (registers the formulas)
from tilecast.analyzer.costs.attention import causal_pairs
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.registry import REGISTRY, CostEntry, ZeroCost
from tilecast.analyzer.types import MatmulDims, OpCost
from tilecast.errors import ShapeError


def cost_of(inputs: str, body: str, op: str, opset: int = 23) -> OpCost:
    """test_costs' helper at the first opset with the standard Attention op."""
    return _cost_of(inputs, body, op, opset)


QKV4 = "float[1,2,4,8] q, float[1,2,4,8] k, float[1,2,4,8] v"
CASES = [
    # MHA, B=1, H=2, S=4, D=8: scores 2*4*4 = 32 -> 32*(16 + 16 + 6) = 1216
    # bytes: Q, K, V, Y 64 floats each
    ("onnx_full", QKV4, "y = Attention(q, k, v)", "Attention", 1216, 4 * 64 * 4),
    # causal: each head sees 1+2+3+4 = 10 of 16 pairs -> 20 scores * 38 = 760; same bytes
    ("onnx_causal", QKV4, "y = Attention<is_causal=1>(q, k, v)", "Attention", 760, 4 * 64 * 4),
    # a float mask adds 1 per score: 32 * 39; + mask (4,4) bytes
    ("onnx_mask", QKV4 + ", float[4,4] m", "y = Attention(q, k, v, m)", "Attention",
     1248, 4 * 64 * 4 + 64),
    # GQA, 3-D: Hq=4, Hkv=2, D=8, S=4: scores 4*16 = 64 -> 64*38 = 2432;
    # bytes Q 4*32*4 + K, V 4*4*16 each (kv heads) + Y 4*32*4 = 512 + 256 + 256 + 512
    ("onnx_gqa_3d", "float[1,4,32] q, float[1,4,16] k, float[1,4,16] v",
     "y = Attention<q_num_heads=4, kv_num_heads=2>(q, k, v)", "Attention", 2432, 1536),
    # decode step, causal, past of 7: Skv = 8, one query sees all 8 keys (no halving):
    # scores 2*8 = 16 -> 16*38 = 608; bytes q, k, v 16 floats each + past k, v 112 each
    # + Y 16 + present k, v 2*8*8 each = 4*(48 + 224 + 16 + 256)
    ("onnx_decode_causal", QKV4.replace("4,8", "1,8") + ", float[1,2,7,8] pk, float[1,2,7,8] pv",
     "y, ok, ov = Attention<is_causal=1>(q, k, v, , pk, pv)", "Attention", 608, 2176),
    # com.microsoft Attention: projection (1*4 x 16) @ (16 x 48) = 6144 + 192 bias adds,
    # then N=2, D=8, S=4: 32 scores * 38 = 1216 -> 7552;
    # bytes x 64 + w 768 + b 48 + y 64 floats = 4*944
    ("ms_attention", "float[1,4,16] x, float[16,48] w, float[48] b",
     "y = com.microsoft.Attention<num_heads=2>(x, w, b)", "Attention", 7552, 3776),
    # unidirectional halves the score work: 20 scores * 38 = 760 + 6336 projection
    ("ms_attention_causal", "float[1,4,16] x, float[16,48] w, float[48] b",
     "y = com.microsoft.Attention<num_heads=2, unidirectional=1>(x, w, b)", "Attention",
     7096, 3776),
    # QAttention: the same work as ms_attention after an int8 projection; bytes x 64 (uint8)
    # + w 768 (int8) + b 48 floats + 2 float scales + y 64 floats = 832 + 4*114
    ("ms_qattention", "uint8[1,4,16] x, int8[16,48] w, float[48] b, float xs, float ws",
     "y = com.microsoft.QAttention<num_heads=2>(x, w, b, xs, ws)", "QAttention", 7552, 1288),
    # MultiHeadAttention, cross: S=4 queries, L=6 keys, N=2, D=8: 48 scores * 38 = 1824
    # bytes q 64 + k 96 + v 96 + y 64 floats
    ("ms_mha", "float[1,4,16] q, float[1,6,16] k, float[1,6,16] v",
     "y = com.microsoft.MultiHeadAttention<num_heads=2>(q, k, v)", "MultiHeadAttention",
     1824, 4 * 320),
    # GroupQueryAttention, always causal: Hq=4, Hkv=2, D=8, S=4: 4*10 = 40 scores * 38 = 1520;
    # bytes q 512 + k, v 256 each + seqlens_k 4 + total_sequence_length 4 + y 512
    ("ms_gqa", "float[1,4,32] q, float[1,4,16] k, float[1,4,16] v, int32[1] sk, int32 tot",
     "y = com.microsoft.GroupQueryAttention<num_heads=4, kv_num_heads=2>(q, k, v, , , sk, tot)",
     "GroupQueryAttention", 1520, 1544),
]


@pytest.mark.parametrize(("inputs", "body", "op", "flops", "nbytes"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_attention_table(inputs, body, op, flops, nbytes):
    c = cost_of(inputs, body, op)
    assert (c.family, c.unit, c.flops, c.bytes) == ("attention", "matrix", flops, nbytes)


def test_qattention_runs_at_int8():
    c = cost_of("uint8[1,4,16] x, int8[16,48] w, float[48] b, float xs, float ws",
                "y = com.microsoft.QAttention<num_heads=2>(x, w, b, xs, ws)", "QAttention")
    assert c.dtype == "uint8"  # the device maps uint8 / int8 to its int8 peak


def test_attention_matmul_view_is_qk():
    c = cost_of("float[1,4,32] q, float[1,6,16] k, float[1,6,16] v",
                "y = Attention<q_num_heads=4, kv_num_heads=2>(q, k, v)", "Attention")
    assert c.matmul == MatmulDims(b=4, m=4, n=6, k=8)


def test_gqa_reads_kv_heads_only():
    """Same queries; 2 kv heads instead of 4 read half the K and V bytes, same FLOPs."""
    mha = cost_of("float[1,4,32] q, float[1,4,32] k, float[1,4,32] v",
                  "y = Attention<q_num_heads=4, kv_num_heads=4>(q, k, v)", "Attention")
    gqa = cost_of("float[1,4,32] q, float[1,4,16] k, float[1,4,16] v",
                  "y = Attention<q_num_heads=4, kv_num_heads=2>(q, k, v)", "Attention")
    assert mha.flops == gqa.flops
    assert mha.bytes - gqa.bytes == 2 * 4 * 16 * 4


@pytest.mark.parametrize(("sq", "skv", "window", "pairs"), [
    (4, 4, 0, 10),  # lower triangle of a square prompt
    (1, 8, 0, 8),  # decode: the one query sees every key
    (4, 8, 0, 5 + 6 + 7 + 8),  # chunk after a 4-token cache (bottom-right aligned)
    (1000, 1000, 0, 1000 * 1001 // 2),  # about half of the square for long prompts
    (4, 4, 1, 1 + 2 + 2 + 2),  # local window: at most 2 keys per query
])
def test_causal_pairs(sq, skv, window, pairs):
    assert causal_pairs(sq, skv, window) == pairs


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="overlaps"):
        REGISTRY.register("", "MatMul", lambda node: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="already registered"):
        REGISTRY.register_zero("", "MatMul", "no")
    with pytest.raises(ValueError, match="zero-cost"):
        REGISTRY.register("", "Reshape", lambda node: None)  # type: ignore[arg-type, return-value]


ZERO = ("Reshape", "Shape", "Size", "Squeeze", "Unsqueeze", "Identity", "Constant", "Flatten",
        "Dropout")


def test_zero_cost_ops_have_reasons():
    zero = {z.op_type: z.reason for z in REGISTRY.zero_cost()}
    assert set(ZERO) <= set(zero)
    assert all(len(reason) > 10 for reason in zero.values())
    assert isinstance(REGISTRY.lookup("", "Reshape", 18), ZeroCost)
    # Expand materializes its output: a real copy, not metadata
    assert isinstance(REGISTRY.lookup("", "Expand", 18), CostEntry)


# Ops of torch.onnx (dynamo) exports of BERT, GPT-2, OPT, Llama, Switch/MoE, torchvision CNNs,
# plus ONNX Runtime's fused transformer ops.
EXPORTED_OPS = (
    "MatMul", "Gemm", "Add", "Mul", "Div", "Sub", "Pow", "Sqrt", "Tanh", "Erf", "Softmax",
    "LayerNormalization", "Gather", "Transpose", "Concat", "Slice", "Split", "Expand", "Where",
    "Cast", "Equal", "Neg", "Sin", "Cos", "Range", "ReduceMean", "ReduceMax", "ArgMax", "TopK",
    "OneHot", "ScatterND", "Trilu", "ConstantOfShape", "CumSum", "Max", "Min", "Sigmoid",
    "Clip", "Less", "And", "Not", "IsNaN", "Relu", "Exp", "Reciprocal", "Greater", "GatherND",
    "GatherElements", "ScatterElements", "Einsum", "Conv", "ConvTranspose",
    "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize", "Attention",
    "RMSNormalization", "RotaryEmbedding", "Gelu", "Pad", "Tile", "LogSoftmax", "ReduceSum",
    "NonZero",
)
CONTRIB_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization",
               "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
               "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd", "FusedMatMul",
               "RotaryEmbedding")


@pytest.mark.parametrize(("domain", "op"), [("", op) for op in EXPORTED_OPS]
                         + [("com.microsoft", op) for op in CONTRIB_OPS])
def test_exported_ops_are_costed(domain, op):
    assert isinstance(REGISTRY.lookup(domain, op, 23), CostEntry)


def test_unknown_shape_names_node_and_op():
    text = """<ir_version: 10, opset_import: ["" : 18]>
g (float[N, 16] x, float[16, 8] w) => (float[N, 8] y) { y = MatMul(x, w) }"""
    node = build_graph(onnx.parser.parse_model(text)).nodes[0]
    entry = REGISTRY.lookup(node.domain, node.op_type, node.opset)
    with pytest.raises(ShapeError, match=r"MatMul_0.*MatMul.*\[-1, 16\].*unknown"):
        entry.fn(node)


def test_bad_attribute_is_a_shape_error():
    with pytest.raises(ShapeError, match="q_num_heads"):
        cost_of("float[1,4,32] q, float[1,4,16] k, float[1,4,16] v",
                "y = Attention(q, k, v)", "Attention")


@pytest.mark.parametrize("inputs, body, op, flops, nbytes, estimated", [
    # DecoderMaskedMultiHeadAttention, self, past 7 in its own cache (no shared buffer):
    # B 1, N 2, D 8, Skv 8: 16 scores * 38 = 608; bytes q, k, v 16 floats each + past 2*112
    # + Y 16 + present 2*128 -> 4*(48 + 224 + 16 + 256)
    ("float[1,1,16] q, float[1,1,16] k, float[1,1,16] v, float[1,2,7,8] pk, float[1,2,7,8] pv",
     "y, ok, ov = com.microsoft.DecoderMaskedMultiHeadAttention<num_heads=2>"
     "(q, k, v, , , pk, pv)", "DecoderMaskedMultiHeadAttention", 608, 2176, False),
    # shared buffer of 16: the past length is a runtime value, the buffer bounds it (16
    # keys: 32 * 38 = 1216, estimated); the present writes 1 position per head: 2*8 each
    ("float[1,1,16] q, float[1,1,16] k, float[1,1,16] v, float[1,2,16,8] pk, "
     "float[1,2,16,8] pv, int32 pl",
     "y, ok, ov = com.microsoft.DecoderMaskedMultiHeadAttention<num_heads=2, "
     "past_present_share_buffer=1>(q, k, v, , , pk, pv, pl)",
     "DecoderMaskedMultiHeadAttention", 1216, 4 * (48 + 512 + 16 + 32) + 4, True),
    # PackedMultiHeadAttention, 5 tokens of 2 sequences padded to 4: N 2, D 8, each token
    # attends at most 4 keys: 2*5*4 = 40 scores * 38 = 1520, estimated (5 < 8);
    # bytes q, k, v, Y 80 floats each + offsets 8 + cumulative 3 int32
    ("float[5,16] q, float[5,16] k, float[5,16] v, int32[2,4] off, int32[3] cu",
     "y = com.microsoft.PackedMultiHeadAttention<num_heads=2>(q, k, v, , off, cu)",
     "PackedMultiHeadAttention", 1520, 4 * (4 * 80 + 8 + 3), True),
    # no padding (8 tokens = 2 x 4): exact, 2*8*4 = 64 scores * 38 = 2432
    ("float[8,16] q, float[8,16] k, float[8,16] v, int32[2,4] off, int32[3] cu",
     "y = com.microsoft.PackedMultiHeadAttention<num_heads=2>(q, k, v, , off, cu)",
     "PackedMultiHeadAttention", 2432, 4 * (4 * 128 + 8 + 3), False),
])
def test_decoder_and_packed_attention(inputs, body, op, flops, nbytes, estimated):
    c = _cost_of(inputs, body, op, 17)
    assert (c.flops, c.bytes, c.estimated) == (flops, nbytes, estimated)


@pytest.mark.parametrize("inputs, body, op, flops, nbytes", [
    # SparseAttention, B 1, S 4 over a cache buffer of 8, Hq 2, Hkv 1, D 8, blocks of 4 with
    # 3 nonzero (48 pairs): causal pairs 5+6+7+8 = 26 < 48, so 2*26 = 52 scores * 38 = 1976;
    # bytes q 256 + k, v 128 each + caches 256 each + masks 12 each + lengths 4 + 4, Y 256,
    # present caches 256 each
    ("float[1,4,16] q, float[1,4,8] k, float[1,4,8] v, float[1,1,8,8] pk, float[1,1,8,8] pv, "
     "int32[1,3] br, int32[1,3] bc, int32 t, int32[1] kt",
     "y, ok, ov = com.microsoft.SparseAttention<num_heads=2, kv_num_heads=1, "
     "sparse_block_size=4>(q, k, v, pk, pv, br, bc, t, kt)", "SparseAttention", 1976, 1824),
    # PagedAttention, 5 tokens of 2 sequences, block table (2, 8) of 16-slot blocks: each token
    # attends at most 128 keys: 4 heads * 5 * 128 = 2560 scores * (4*128 + 6) = 1326080;
    # bytes q 5120 + k, v 2560 each + cu 12 + past 8 + table 64, Y 5120 + new K, V 5120, and
    # the KV read bounded by 2 sequences of 128 keys: 2*128*2*256*2 = 262144 (pool 1638400)
    ("float16[5,512] q, float16[5,256] k, float16[5,256] v, float16[100,16,2,128] kc, "
     "float16[100,16,2,128] vc, int32[3] cu, int32[2] ps, int32[2,8] bt",
     "y, ko, vo = com.microsoft.PagedAttention<num_heads=4, kv_num_heads=2>"
     "(q, k, v, kc, vc, cu, ps, bt)", "PagedAttention", 1326080, 282708),
])
def test_runtime_length_attention_is_a_marked_bound(inputs, body, op, flops, nbytes):
    c = _cost_of(inputs, body, op, 17)
    assert (c.flops, c.bytes, c.estimated) == (flops, nbytes, True)
