"""Cost formulas by family: FLOPs and bytes of tiny graphs, derived by hand beside each row.

Convention: 1 FMA = 2 FLOPs; bytes = each distinct tensor read or written once, dtype-aware.
float32 = 4 bytes, float16 = 2, int64 = 8. Attention, the registry and errors are in
test_costs_attention.py.
"""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast.analyzer.costs  # noqa: F401  (registers the formulas)
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.registry import REGISTRY, CostEntry
from tilecast.analyzer.types import FAMILIES, ConvDims, MatmulDims, NodeView, OpCost, RowDims


def node_of(inputs: str, body: str, op: str, opset: int = 18) -> NodeView:
    """The first ``op`` node of a graph whose node under test writes ``y`` first. A sink reads y
    so that the graph outputs do not pre-empt shape inference."""
    text = (f'<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>\n'
            f"g ({inputs}) => (sink) {{\n{body}\n sink = Identity(y)\n}}")
    graph = build_graph(onnx.parser.parse_model(text))
    return next(n for n in graph.nodes if n.op_type == op)


def cost_of(inputs: str, body: str, op: str, opset: int = 18) -> OpCost:
    node = node_of(inputs, body, op, opset)
    entry = REGISTRY.lookup(node.domain, node.op_type, node.opset)
    assert isinstance(entry, CostEntry), f"{op} has no cost formula"
    return entry.fn(node)


AXES_LAST = "axes = Constant<value = int64[1] {-1}>()\n"

CASES = [
    # --- matmul -----------------------------------------------------------------------------
    # linear: (2,8,16) @ (16,32): b=1, m=16, n=32, k=16 -> 2*16*32*16; bytes 4*(256+512+512)
    ("matmul_linear", "float[2,8,16] x, float[16,32] w", "y = MatMul(x, w)", "MatMul",
     "matmul", 16384, 5120),
    # batched broadcast: (2,1,8,16) @ (3,16,4): batch (2,3), b=6, m=8, n=4, k=16
    # -> 2*6*8*4*16 = 6144; bytes 4*(256 + 192 + out 2*3*8*4=192)
    ("matmul_batched", "float[2,1,8,16] a, float[3,16,4] b", "y = MatMul(a, b)", "MatMul",
     "matmul", 6144, 2560),
    # fp16: 2*4*64*64 = 32768; bytes 2*(256 + 4096 + 256)
    ("matmul_fp16", "float16[4,64] x, float16[64,64] w", "y = MatMul(x, w)", "MatMul",
     "matmul", 32768, 9216),
    # Gemm transB + bias: M=4, N=32, K=16 -> 2*4*32*16 + 4*32 bias adds = 4224
    # bytes 4*(A 64 + B 512 + C 32 + Y 128)
    ("gemm_transB_bias", "float[4,16] a, float[32,16] b, float[32] c",
     "y = Gemm<transB=1>(a, b, c)", "Gemm", "matmul", 4224, 2944),
    # transA without bias: A (16,4) is K x M -> M=4, N=8, K=16: 2*4*8*16; 4*(64+128+32)
    ("gemm_transA", "float[16,4] a, float[16,8] b", "y = Gemm<transA=1>(a, b)", "Gemm",
     "matmul", 1024, 896),
    # uint8 x uint8 -> int32: 2*4*16*8; bytes 32 + 128 + 64*4
    ("matmul_integer", "uint8[4,8] a, uint8[8,16] b", "y = MatMulInteger(a, b)",
     "MatMulInteger", "matmul", 1024, 416),
    # FusedMatMul transB: (2,4,8) @ (2,16,8)^T: b=2, m=4, n=16, k=8 -> 2048; 4*(64+256+128)
    ("fused_matmul", "float[2,4,8] a, float[2,16,8] b",
     "y = com.microsoft.FusedMatMul<transB=1>(a, b)\n", "FusedMatMul", "matmul", 2048, 1792),
    # MatMulNBits (4-bit weights): fp16 A (2,4,64) @ (64 x 32): 2*8*32*64 = 32768;
    # bytes A 2*512 + packed B 32*2*16 + scales 2*64 + Y 2*256
    ("matmul_nbits", "float16[2,4,64] a, uint8[32,2,16] b, float16[64] sc",
     "y = com.microsoft.MatMulNBits<K=64, N=32, bits=4, block_size=32>(a, b, sc)",
     "MatMulNBits", "matmul", 32768, 2688),
    # Einsum bhid,bhjd->bhij: b=6, m=4, n=5, k=8 -> 2*6*4*5*8; 4*(192 + 240 + 120)
    ("einsum_bmm", "float[2,3,4,8] q, float[2,3,5,8] k",
     'y = Einsum<equation="bhid,bhjd->bhij">(q, k)', "Einsum", "matmul", 1920, 2208),
    # Einsum ij->i (one operand): a reduction of the 4*8 index space, 1 add per point
    ("einsum_reduce", "float[4,8] x", 'y = Einsum<equation="ij->i">(x)', "Einsum",
     "reduction", 32, 144),
    # --- conv -------------------------------------------------------------------------------
    # 2-D, group 2, stride 2, dilation 2, pad 2: out (20 - 4 - 1) // 2 + 1 = 8 -> Y (1,16,8,8)
    # per group: m = 64, n = 16/2 = 8, k = 4*3*3 = 36 -> 2*2*64*8*36 = 73728 + 1024 bias adds
    # bytes 4*(X 2048 + W 576 + B 16 + Y 1024)
    ("conv_grouped_dilated", "float[1,8,16,16] x, float[16,4,3,3] w, float[16] b",
     "y = Conv<group=2, strides=[2,2], dilations=[2,2], pads=[2,2,2,2]>(x, w, b)", "Conv",
     "conv", 74752, 14656),
    # 1-D depthwise: X (2,4,10), W (4,1,3), group 4 -> Y (2,4,8); b=4, m=16, n=1, k=3 -> 384
    # bytes 4*(80 + 12 + 64)
    ("conv1d_depthwise", "float[2,4,10] x, float[4,1,3] w", "y = Conv<group=4>(x, w)", "Conv",
     "conv", 384, 624),
    # 3-D: X (1,2,4,4,4), W (3,2,2,2,2) -> Y (1,3,3,3,3); m=27, n=3, k=16 -> 2592
    ("conv3d", "float[1,2,4,4,4] x, float[3,2,2,2,2] w", "y = Conv(x, w)", "Conv", "conv",
     2592, 4 * (128 + 48 + 81)),
    # ConvTranspose stride 2: X (1,4,5,5), W (4,2,3,3) -> Y (1,2,11,11); every input pixel
    # scatters 2*9 outputs from 4 channels: m=25, n=18, k=4 -> 3600; 4*(100 + 72 + 242)
    ("conv_transpose", "float[1,4,5,5] x, float[4,2,3,3] w",
     "y = ConvTranspose<strides=[2,2]>(x, w)", "ConvTranspose", "conv", 3600, 1656),
    # --- elementwise ------------------------------------------------------------------------
    # Mul(x, x): x is read once -> 4*(32 + 32)
    ("mul_repeated_input", "float[4,8] x", "y = Mul(x, x)", "Mul", "elementwise", 32, 256),
    # broadcast bias: one add per output element; 4*(32 + 8 + 32)
    ("add_broadcast", "float[4,8] x, float[8] b", "y = Add(x, b)", "Add", "elementwise",
     32, 288),
    # Gelu tanh (opset 20), fp16: 9 FLOPs per element * 32; 2*(32 + 32)
    ("gelu_tanh_fp16", "float16[2,16] x", 'y = Gelu<approximate="tanh">(x)', "Gelu",
     "elementwise", 288, 128, 20),
    # Cast f32 -> f16: one convert per element; 4*32 read + 2*32 written
    ("cast", "float[4,8] x", "y = Cast<to=10>(x)", "Cast", "elementwise", 32, 192),
    # Where: bool cond (1 byte) + x + broadcast row + output: 32 + 128 + 32 + 128
    ("where", "bool[4,8] c, float[4,8] x, float[8] z", "y = Where(c, x, z)", "Where",
     "elementwise", 32, 320),
    # variadic Max of 3 inputs: 2 compares per element
    ("max_variadic", "float[4] a, float[4] b, float[4] c", "y = Max(a, b, c)", "Max",
     "elementwise", 8, 64),
    # FastGelu with bias: (9 + 1) * 64; 4*(64 + 8 + 64)
    ("fast_gelu_bias", "float[2,4,8] x, float[8] b", "y = com.microsoft.FastGelu(x, b)",
     "FastGelu", "elementwise", 640, 544),
    # RotaryEmbedding (com.microsoft): 3 per element * 64; only 4 of the 32 cache rows are
    # read: x 256 + position_ids 32 + y 256 + cos/sin 2 * 4 rows * 4 * 4 bytes = 672
    ("rotary_ms", "float[1,4,16] x, int64[1,4] p, float[32,4] cos, float[32,4] sin",
     "y = com.microsoft.RotaryEmbedding<num_heads=2>(x, p, cos, sin)", "RotaryEmbedding",
     "elementwise", 192, 672),
    # --- normalization ----------------------------------------------------------------------
    # LayerNorm over 8 with scale and bias: 8 per element * 64; 4*(64 + 8 + 8 + 64)
    ("layer_norm", "float[2,4,8] x, float[8] s, float[8] b",
     "y = LayerNormalization(x, s, b)", "LayerNormalization", "normalization", 512, 576),
    # SkipLayerNorm, skip + gamma + beta: (7 + skip 1 + beta 1) * 64; 4*(64+64+8+8+64)
    ("skip_layer_norm", "float[2,4,8] x, float[2,4,8] sk, float[8] g, float[8] b",
     "y = com.microsoft.SkipLayerNormalization(x, sk, g, b)", "SkipLayerNormalization",
     "normalization", 576, 832),
    # EmbedLayerNormalization, 2x4 tokens, hidden 8, 3 tables: (7 + 1 shift + 2 adds) * 64;
    # bytes: rows gathered from each table, capped at its size: word 256, position 256,
    # segment min(256, 64); ids, segment ids, gamma, beta 32 each; y 256 + mask index 8
    ("embed_layer_norm", "int32[2,4] i, int32[2,4] s, float[100,8] w, float[16,8] p, "
     "float[2,8] e, float[8] g, float[8] b",
     "y, m = com.microsoft.EmbedLayerNormalization(i, s, w, p, e, g, b)",
     "EmbedLayerNormalization", "normalization", 640, 576 + 128 + 264),
    # RMS norm (ONNX-domain SimplifiedLayerNormalization): 4 per element * 16; 4*(16+8+16)
    ("rms_simplified", "float[2,8] x, float[8] s", "y = SimplifiedLayerNormalization(x, s)",
     "SimplifiedLayerNormalization", "normalization", 64, 160),
    # BatchNorm inference: one FMA per element (2) * 96; 4*(96 + 4 * 3 + 96)
    ("batch_norm", "float[2,3,4,4] x, float[3] s, float[3] b, float[3] m, float[3] v",
     "y = BatchNormalization(x, s, b, m, v)", "BatchNormalization", "normalization",
     192, 4 * (96 + 12 + 96)),
    # GroupNorm, 2 groups of (2 channels * 3 * 3): 8 * 72; 4*(72 + 4 + 4 + 72)
    ("group_norm", "float[2,4,3,3] x, float[4] s, float[4] b",
     "y = GroupNormalization<num_groups=2>(x, s, b)", "GroupNormalization", "normalization",
     576, 608, 21),
    # --- softmax ----------------------------------------------------------------------------
    # 5 per element * 24 elements, whichever axis; 4*(24 + 24)
    ("softmax_13", "float[2,3,4] x", "y = Softmax<axis=1>(x)", "Softmax", "softmax", 120, 192),
    ("log_softmax", "float[2,3,4] x", "y = LogSoftmax(x)", "LogSoftmax", "softmax", 120, 192),
    # --- reduction --------------------------------------------------------------------------
    # ReduceMean over the last axis (axes input, opset 18): 24 adds + 6 divides;
    # bytes 4*24 + axes 8 + 4*6
    ("reduce_mean", "float[2,3,4] x", AXES_LAST + "y = ReduceMean(x, axes)", "ReduceMean",
     "reduction", 30, 128),
    # ArgMax over 10: one compare per element; 4*40 + int64 4*8
    ("argmax", "float[4,10] x", "y = ArgMax<axis=1, keepdims=0>(x)", "ArgMax", "reduction",
     40, 192),
    # TopK k=4 of 16: 48 elements * bit_length(4) = 3 compares; 4*48 + K 8 + 4*12 + 8*12
    ("topk", "float[3,16] x", "k = Constant<value = int64[1] {4}>()\ny, i = TopK(x, k)",
     "TopK", "reduction", 144, 344),
    # CumSum: one add per element; 4*24 + axis 8 + 4*24
    ("cumsum", "float[4,6] x", "a = Constant<value = int64 {1}>()\ny = CumSum(x, a)",
     "CumSum", "reduction", 24, 200),
    # --- pooling ----------------------------------------------------------------------------
    # MaxPool 2x2 stride 2: 32 outputs * 4 taps; 4*(128 + 32)
    ("maxpool", "float[1,2,8,8] x", "y = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x)",
     "MaxPool", "pooling", 128, 640),
    # AveragePool 3x3 stride 1 pad 1: 32 outputs * 9 adds + 32 divides; 4*(32 + 32)
    ("avgpool", "float[1,2,4,4] x",
     "y = AveragePool<kernel_shape=[3,3], pads=[1,1,1,1]>(x)", "AveragePool", "pooling",
     320, 256),
    # GlobalAveragePool: 36 adds + 4 divides; 4*(36 + 4)
    ("global_avgpool", "float[1,4,3,3] x", "y = GlobalAveragePool(x)", "GlobalAveragePool",
     "pooling", 40, 160),
    # Resize bilinear 4x4 -> 8x8 (2 resized dims): 3 lerps * 3 FLOPs per output * 64;
    # bytes 4*16 + scales 16 + 4*64
    ("resize_linear", "float[1,1,4,4] x",
     'sc = Constant<value = float[4] {1,1,2,2}>()\ny = Resize<mode="linear">(x, , sc)',
     "Resize", "pooling", 576, 336),
    # --- gather -----------------------------------------------------------------------------
    # embedding lookup: 6 ids of a 1000-row table read 6 rows, not the table:
    # ids 8*6 + rows read 4*96 + output 4*96 = 816
    ("gather_embedding", "float[1000,16] table, int64[2,3] ids", "y = Gather(table, ids)",
     "Gather", "gather", 0, 816),
    # ScatterND: data copied to the output, updates written in: 4*32 + 8*2 + 4*16 + 4*32
    ("scatter_nd", "float[4,8] d, int64[2,1] i, float[2,8] u", "y = ScatterND(d, i, u)",
     "ScatterND", "gather", 0, 336),
    # OneHot depth 5: 20 compare-selects; ids 8*4 + depth 8 + values 4*2 + out 4*20
    ("one_hot", "int64[4] ids, float[2] vals",
     "d = Constant<value = int64 {5}>()\ny = OneHot(ids, d, vals)", "OneHot", "gather",
     20, 128),
    # --- movement ---------------------------------------------------------------------------
    ("transpose", "float[2,3,4] x", "y = Transpose<perm=[2,0,1]>(x)", "Transpose", "movement",
     0, 192),  # 4*(24 + 24)
    # Slice reads only rows 0..1 (16 elements): 4*16 read + 4*16 written; starts and axes are
    # the same tensor, counted once: + 8 (s) + 8 (e)
    ("slice_partial", "float[4,8] x",
     "s = Constant<value = int64[1] {0}>()\ne = Constant<value = int64[1] {2}>()\n"
     "y = Slice(x, s, e, s)", "Slice", "movement", 0, 144),
    # Expand materializes: 4*8 read + shape 8*2 + 4*32 written
    ("expand", "float[1,8] x", "s = Constant<value = int64[2] {4,8}>()\ny = Expand(x, s)",
     "Expand", "movement", 0, 176),
    ("concat", "float[2,4] a, float[2,4] b", "y = Concat<axis=0>(a, b)", "Concat", "movement",
     0, 128),  # 4*(8 + 8 + 16)
    # Split [2,4] of 6 columns: input 4*24 + split 8*2 + outputs 4*(8 + 16)
    ("split", "float[4,6] x", "s = Constant<value = int64[2] {2,4}>()\ny, z = Split<axis=1>(x, s)",
     "Split", "movement", 0, 208),
    # TensorScatter (opset 24) writes 2 new positions into a (1,2,8,4) cache in place:
    # update 4*16 read + 4*16 written; the cache itself is not copied
    ("tensor_scatter", "float[1,2,8,4] c, float[1,2,2,4] u", "y = TensorScatter(c, u)",
     "TensorScatter", "movement", 0, 128, 24),
    # Trilu of a 4x4: 4*(16 + 16)
    ("trilu", "float[4,4] x", "y = Trilu(x)", "Trilu", "movement", 0, 128),
]


# (id, graph inputs, body, op under test, family, FLOPs, bytes[, opset (default 18)])
@pytest.mark.parametrize(("inputs", "body", "op", "family", "flops", "nbytes", "opset"),
                         [pytest.param(*c[1:7], c[7] if len(c) > 7 else 18, id=c[0])
                          for c in CASES])
def test_cost_table(inputs, body, op, family, flops, nbytes, opset):
    c = cost_of(inputs, body, op, opset)
    assert (c.family, c.flops, c.bytes) == (family, flops, nbytes)
    assert c.family in FAMILIES
    assert c.unit == ("matrix" if family in ("matmul", "conv", "attention") else "vector")


def test_families_are_all_covered():
    covered = {c[4] for c in CASES}
    # attention: its own file; unsupported / unshaped: estimates, not formulas;
    # collective: tilecast.parallel's kernels, no ONNX node
    assert covered == set(FAMILIES) - {"attention", "unsupported", "unshaped", "collective"}


@pytest.mark.parametrize(("inputs", "body", "op", "dims"), [
    # (2,8,16) @ (16,32): a linear layer, A's leading dims fold into m
    ("float[2,8,16] x, float[16,32] w", "y = MatMul(x, w)", "MatMul", MatmulDims(1, 16, 32, 16)),
    # (2,4,8,16) @ (2,4,16,8): b = 2*4 independent products (a batched GEMM)
    ("float[2,4,8,16] q, float[2,4,16,8] k", "y = MatMul(q, k)", "MatMul",
     MatmulDims(8, 8, 8, 16, batched=True)),
    # (1,8,16) @ (1,16,4): a batched product of batch 1 is still a batched GEMM
    ("float[1,8,16] q, float[1,16,4] k", "y = MatMul(q, k)", "MatMul",
     MatmulDims(1, 8, 4, 16, batched=True)),
    # 1-D vector @ matrix: a single row
    ("float[16] v, float[16,4] w", "y = MatMul(v, w)", "MatMul", MatmulDims(1, 1, 4, 16)),
    ("float[32,16] a, float[32,8] b", "y = Gemm<transA=1>(a, b)", "Gemm", MatmulDims(1, 16, 8, 32)),
    # implicit GEMM per group: (N*out) x (C/g*kh*kw) @ (C/g*kh*kw) x (M/g)
    ("float[1,8,16,16] x, float[16,4,3,3] w", "y = Conv<group=2, pads=[1,1,1,1]>(x, w)", "Conv",
     MatmulDims(2, 256, 8, 36)),
])
def test_matmul_dims(inputs, body, op, dims):
    c = cost_of(inputs, body, op)
    assert c.matmul == dims and c.unit == "matrix"


def test_fp16_and_cast_dtypes():
    assert cost_of("float16[4,64] x, float16[64,64] w", "y = MatMul(x, w)", "MatMul").dtype \
        == "float16"
    # Cast computes in (and writes) its output dtype
    assert cost_of("float[4,8] x", "y = Cast<to=10>(x)", "Cast").dtype == "float16"
    # Where's bool condition is not the compute dtype
    assert cost_of("bool[4] c, float16[4] a, float16[4] b", "y = Where(c, a, b)",
                   "Where").dtype == "float16"


def test_softmax_axis_semantics_changed_at_opset_13():
    x, body = "float[2,3,4] x", "y = Softmax(x)"
    # opset 11: flattened to 2-D at axis=1 -> 2 rows of 3*4
    old = cost_of(x, body, "Softmax", opset=11)
    # opset 13: along axis=-1 -> 6 rows of 4
    new = cost_of(x, body, "Softmax", opset=13)
    assert old.rows == RowDims(2, 12) and new.rows == RowDims(6, 4)
    assert old.flops == new.flops == 5 * 24
    assert cost_of(x, "y = Softmax<axis=1>(x)", "Softmax", opset=11).rows == RowDims(2, 12)
    assert cost_of(x, "y = Softmax<axis=1>(x)", "Softmax", opset=13).rows == RowDims(8, 3)


@pytest.mark.parametrize(("inputs", "body", "op", "rows"), [
    ("float[2,4,8] x, float[8] s", "y = LayerNormalization(x, s)", "LayerNormalization",
     RowDims(8, 8)),
    # axis=1: each of 2 rows normalizes 4*8 values
    ("float[2,4,8] x, float[4,8] s", "y = LayerNormalization<axis=1>(x, s)",
     "LayerNormalization", RowDims(2, 32)),
    ("float[2,3,5,5] x, float[3] s, float[3] b", "y = InstanceNormalization(x, s, b)",
     "InstanceNormalization", RowDims(6, 25)),
    ("float[2,3,4] x", AXES_LAST + "y = ReduceMax<keepdims=0>(x, axes)", "ReduceMax",
     RowDims(6, 4)),
    # reducing every axis (no axes input): one row of everything
    ("float[2,3,4] x", "y = ReduceSum(x)", "ReduceSum", RowDims(1, 24)),
])
def test_row_dims(inputs, body, op, rows):
    assert cost_of(inputs, body, op).rows == rows


def test_layer_norm_stats_outputs_are_counted():
    # Mean and InvStdDev outputs: 8 rows of float32 each on top of the plain case (576 bytes)
    c = cost_of("float[2,4,8] x, float[8] s, float[8] b",
                "y, m, r = LayerNormalization(x, s, b)", "LayerNormalization")
    assert c.bytes == 576 + 2 * 8 * 4


def test_mean_variance_norm_default_axes():
    # ONNX infers only its output type, so the exporter's value_info gives the shape here.
    text = """<ir_version: 10, opset_import: ["" : 18]>
g (float[2,3,4,4] x) => (float[2,3,4,4] y) { y = MeanVarianceNormalization(x) }"""
    node = build_graph(onnx.parser.parse_model(text)).nodes[0]
    c = REGISTRY.lookup("", node.op_type, 18).fn(node)
    # axes N, H, W: 3 rows of 2*4*4; mean 1 + variance 3 + normalize 2 = 6 per element
    assert (c.flops, c.bytes, c.rows) == (6 * 96, 4 * (96 + 96), RowDims(3, 32))


def test_non_zero_is_an_estimated_upper_bound():
    # the count is data-dependent: bounded by every element non-zero, 1 x 16 int64 indices
    c = cost_of("float[16] x", "y = NonZero(x)", "NonZero")
    assert c.estimated and c.bytes == 4 * 16 + 8 * 16


def test_gather_reads_rows_not_the_table():
    table = cost_of("float[50000,64] t, int64[1,1] ids", "y = Gather(t, ids)", "Gather")
    # one id: 8 + one 64-float row read + written
    assert table.bytes == 8 + 2 * 64 * 4


# X (n, c, *in) * W (k, c/g, *taps) -> ConvDims and the implicit GEMM (M = N*P*Q, N = K/g,
# K = C/g*R*S per group); output sizes from ONNX shape inference: 16x16, 3x3, stride 2,
# pad 1 -> 8x8. 1-D: h = p = r = 1; 3-D: depth folds into h, p and r.
@pytest.mark.parametrize("inputs, body, dims, mm", [
    ("float[2,8,16,16] x, float[16,8,3,3] w",
     "y = Conv<strides=[2,2], pads=[1,1,1,1]>(x, w)",
     ConvDims(2, 8, 16, 16, 16, 8, 8, 3, 3, stride=2, pad=1), MatmulDims(1, 128, 16, 72)),
    ("float[1,32,14,14] x, float[32,1,3,3] w",
     "y = Conv<group=32, pads=[1,1,1,1]>(x, w)",
     ConvDims(1, 32, 32, 14, 14, 14, 14, 3, 3, pad=1, groups=32), MatmulDims(32, 196, 1, 9)),
    ("float[4,64,56,56] x, float[256,64,1,1] w", "y = Conv(x, w)",
     ConvDims(4, 64, 256, 56, 56, 56, 56, 1, 1), MatmulDims(1, 4 * 56 * 56, 256, 64)),
    ("float[2,4,10] x, float[6,4,3] w", "y = Conv<dilations=[2]>(x, w)",
     ConvDims(2, 4, 6, 1, 10, 1, 6, 1, 3, dilation=2), MatmulDims(1, 12, 6, 12)),
    ("float[1,2,4,6,6] x, float[3,2,2,3,3] w", "y = Conv(x, w)",
     ConvDims(1, 2, 3, 24, 6, 12, 4, 6, 3), MatmulDims(1, 48, 3, 36)),
])
def test_conv_dims_and_implicit_gemm(inputs, body, dims, mm):
    c = cost_of(inputs, body, "Conv")
    assert c.conv == dims and c.matmul == mm
    assert c.conv.depthwise == (dims.groups == dims.c > 1)
