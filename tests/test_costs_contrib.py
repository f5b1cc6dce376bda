"""ONNX Runtime contrib ops (com.microsoft): the mirrors of standard ops, shaped by the standard
op's inference and costed by its formula plus their epilogue; and the contrib ops of their own.

Convention: 1 FMA = 2 FLOPs; bytes = each distinct tensor read or written once (float32 4,
uint8 / int8 1, int32 4, int64 8). Each row derives its numbers beside it.
"""

from __future__ import annotations

import onnx.parser
import pytest
from test_costs import cost_of

import tilecast
from tilecast.analyzer.costs.contrib import EPILOGUE, RESIDUAL
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.mirrors import MIRRORS
from tilecast.analyzer.registry import REGISTRY, CostEntry
from tilecast.analyzer.types import MatmulDims
from tilecast.report import render

QA = "float sa, uint8 za"  # a QLinear input's scale and zero point: 5 bytes
CASES = [
    # FusedConv + Relu + residual Z: Y (1,16,16,16) = 4096; 2*256*16*72 + 4096 bias + 4096
    # Relu + 4096 adds of Z; bytes X 8192 + W 4608 + B 64 + Y 16384 + Z 16384
    ("fused_conv", "float[1,8,16,16] x, float[16,8,3,3] w, float[16] b, float[1,16,16,16] z",
     'y = com.microsoft.FusedConv<activation="Relu", pads=[1,1,1,1]>(x, w, b, z)',
     "FusedConv", "conv", 602112, 45632),
    # FusedGemm + LeakyRelu: 2*4*32*16 + 128 bias + 2*128; bytes 256 + 2048 + 128 + 512
    ("fused_gemm", "float[4,16] a, float[32,16] b, float[32] c",
     'y = com.microsoft.FusedGemm<activation="LeakyRelu", activation_alpha=0.1, transB=1>'
     "(a, b, c)", "FusedGemm", "matmul", 4480, 2944),
    # QLinearAdd, 16 outputs: add 1 + dequantize 2 x 2 + requantize 4; bytes 3 x 16 + 15
    ("qlinear_add", f"uint8[2,8] a, {QA}, uint8[2,8] b, float sb, uint8 zb, float sc, "
     "uint8 zc", "y = com.microsoft.QLinearAdd(a, sa, za, b, sb, zb, sc, zc)", "QLinearAdd",
     "elementwise", 144, 63),
    # QLinearGlobalAveragePool over (1,8,7,7): 392 adds + 8 divides + 8 x (2 + 4); 392 + 8 +
    # two scales and zero points 10
    ("qlinear_global_avg", f"uint8[1,8,7,7] x, {QA}, float s2, uint8 z2",
     "y = com.microsoft.QLinearGlobalAveragePool(x, sa, za, s2, z2)",
     "QLinearGlobalAveragePool", "pooling", 448, 410),
    # QLinearSoftmax over 4 rows of 10: 5 + 2 + 4 per element; bytes 40 + 40 + 10
    ("qlinear_softmax", f"uint8[4,10] x, {QA}, float s2, uint8 z2",
     "y = com.microsoft.QLinearSoftmax<axis=-1, opset=13>(x, sa, za, s2, z2)",
     "QLinearSoftmax", "softmax", 440, 90),
    # QLinearConcat of (2,8) and (2,4) -> (2,12): 24 outputs x (2 + 4); bytes 16 + 8 + 24 + 15
    ("qlinear_concat", f"float sy, uint8 zy, uint8[2,8] a, {QA}, uint8[2,4] b, float sb, "
     "uint8 zb", "y = com.microsoft.QLinearConcat<axis=1>(sy, zy, a, sa, za, b, sb, zb)",
     "QLinearConcat", "movement", 144, 63),
    # QGemm uint8 (4,16) x int8 (16,8) + int32 bias -> uint8 (4,8): 2*4*8*16 + 32 bias + 32 x
    # requantize 4; bytes 64 + 128 + 32 + 32 + scales and zero points 15
    ("qgemm", f"uint8[4,16] a, {QA}, int8[16,8] b, float sb, int8 zb, int32[8] c, float sy, "
     "uint8 zy", "y = com.microsoft.QGemm(a, sa, za, b, sb, zb, c, sy, zy)", "QGemm",
     "matmul", 1184, 271),
    # com.microsoft DequantizeLinear, int8 (4,8) -> float: 2 per element; 32 + 4 + 128
    ("ms_dequantize", "int8[4,8] x, float s", "y = com.microsoft.DequantizeLinear(x, s)",
     "DequantizeLinear", "elementwise", 64, 164),
    # TorchEmbedding: 6 rows of 16 floats gathered: ids 48 + 2 x 384
    ("torch_embedding", "float[100,16] w, int64[2,3] i",
     "y = com.microsoft.TorchEmbedding(w, i)", "TorchEmbedding", "gather", 0, 816),
    # GroupNorm, channels last (2,8,8,32), 4 groups, SiLU: 8 rows of 512, 8 + 4 per element;
    # bytes X and Y 16384 each + gamma and beta 128 each
    ("group_norm", "float[2,8,8,32] x, float[32] g, float[32] b",
     "y = com.microsoft.GroupNorm<groups=4, activation=1, epsilon=0.00001>(x, g, b)",
     "GroupNorm", "normalization", 49152, 33024),
    # SkipGroupNorm without SiLU: 8 + skip add + bias add; X, skip, Y, S 16384 each + 256
    ("skip_group_norm", "float[2,8,8,32] x, float[32] g, float[32] b, float[2,8,8,32] sk",
     "y, s = com.microsoft.SkipGroupNorm<groups=4, activation=0, epsilon=0.00001>(x, g, b, sk)",
     "SkipGroupNorm", "normalization", 40960, 65792),
    # BiasSplitGelu (2,64,640) -> (2,64,320) = 40960: 2 bias adds + GELU 5 + multiply;
    # bytes X 327680 + bias 2560 + Y 163840
    ("bias_split_gelu", "float[2,64,640] x, float[640] b",
     "y = com.microsoft.BiasSplitGelu(x, b)", "BiasSplitGelu", "elementwise", 327680, 494080),
    # GatherBlockQuantized, int4 rows of 64 packed in 32 bytes, 10 ids -> (2,5,64) = 640:
    # 2 each; 320 packed bytes + 20 blocks of 32 x 4-byte scales + ids 80 + Y 2560
    ("gather_block_quantized", "uint8[1000,32] d, int64[2,5] i, float[1000,2] s",
     "y = com.microsoft.GatherBlockQuantized<bits=4, block_size=32>(d, i, s)",
     "GatherBlockQuantized", "gather", 1280, 3040),
    # Inverse of 5 4x4 matrices: 2 * 64 each; bytes 320 + 320
    ("inverse", "float[5,4,4] x", "y = com.microsoft.Inverse(x)", "Inverse", "reduction", 640,
     640),
    # GemmFastGelu (4,16) @ (16,32) + bias: 2*4*32*16 + 128 x (bias 1 + GELU 9);
    # bytes 256 + 2048 + 512 + bias 128
    ("gemm_fast_gelu", "float[4,16] x, float[16,32] w, float[32] b",
     "y = com.microsoft.GemmFastGelu(x, w, b)", "GemmFastGelu", "matmul", 5376, 2944),
    # BiasSoftmax, rows from axis 1 of (2,4,8): 2 rows of 32, softmax 5 + bias 1 per element;
    # bytes data 256 + bias 256 + output 256
    ("bias_softmax", "float[2,4,8] x, float[2,4,8] b", "y = com.microsoft.BiasSoftmax(x, b)",
     "BiasSoftmax", "softmax", 384, 768),
    # SwiGLU (4,8): silu(gate) * up, 1 + 3 + 1 per element; bytes 3 x 128
    ("swiglu", "float[4,8] g, float[4,8] u", "y = com.microsoft.SwiGLU(g, u)", "SwiGLU",
     "elementwise", 160, 384),
    # TransposeMatMul = FusedMatMul: (2,4,8) @ (2,16,8)^T: 2*2*4*16*8; 4*(64 + 256 + 128)
    ("transpose_matmul", "float[2,4,8] a, float[2,16,8] b",
     "y = com.microsoft.TransposeMatMul<transB=1>(a, b)", "TransposeMatMul", "matmul", 2048,
     1792),
    # FusedMatMulActivation: the same + Sigmoid 3 per output (2*4*16 = 128)
    ("fused_matmul_activation", "float[2,4,8] a, float[2,16,8] b",
     'y = com.microsoft.FusedMatMulActivation<transB=1, activation="Sigmoid">(a, b)',
     "FusedMatMulActivation", "matmul", 2432, 1792),
    # NhwcConv, X (1,16,16,8) channels last, W transposed to (16,3,3,8), pad 1 -> Y
    # (1,16,16,16): the implicit GEMM of the NCHW conv, 2*256*16*72 + 4096 bias adds;
    # bytes X 8192 + W 4608 + B 64 + Y 16384
    ("nhwc_conv", "float[1,16,16,8] x, float[16,3,3,8] w, float[16] b",
     "y = com.microsoft.NhwcConv<pads=[1,1,1,1]>(x, w, b)", "NhwcConv", "conv", 593920,
     29248),
    # the weight left in Conv's layout (16,8,3,3), stride 2 -> Y (1,8,8,16): 2*64*16*72
    ("nhwc_conv_nchw_weight", "float[1,16,16,8] x, float[16,8,3,3] w",
     "y = com.microsoft.NhwcConv<pads=[1,1,1,1], strides=[2,2]>(x, w)", "NhwcConv", "conv",
     147456, 8192 + 4608 + 4096),
    # NhwcMaxPool 3x3 stride 2 pad 1 over uint8 (1,16,16,8) -> (1,8,8,8): 512 outputs x 9
    # compares; bytes 2048 + 512
    ("nhwc_max_pool", "uint8[1,16,16,8] x",
     "y = com.microsoft.NhwcMaxPool<kernel_shape=[3,3], strides=[2,2], pads=[1,1,1,1]>(x)",
     "NhwcMaxPool", "pooling", 4608, 2560),
    # MatMulBnb4 (bitsandbytes NF4), A (2,64) @ 64 x 32 packed in 1024 bytes: 2*2*32*64;
    # bytes A 512 + B 1024 + absmax 32 floats 128 + Y 256
    ("matmul_bnb4", "float[2,64] a, uint8[1024] b, float[32] m",
     "y = com.microsoft.MatMulBnb4<K=64, N=32, block_size=64, quant_type=1>(a, b, m)",
     "MatMulBnb4", "matmul", 8192, 1920),
    # com.microsoft LinearAttention = ONNX's (opset 27) with a state window: "linear", B 2,
    # T 16, Hq 4 over Hkv 2, dk = dv = 128: per token 2*(2*16384) + 4*(2*16384 + 128), times
    # 32 tokens; bytes q 65536 + k, v 32768 each + output 65536 + the new state 262144
    ("ms_linear_attention", "float[2,16,512] q, float[2,16,256] k, float[2,16,256] v",
     'y, ps = com.microsoft.LinearAttention<q_num_heads=4, kv_num_heads=2, '
     'update_rule="linear">(q, k, v)', "LinearAttention", "attention", 6307840, 458752),
    # GatedRMSNorm, X (2,16,256) in rows of the scale's 128: RMS 4 + SiLU 4 + multiply 1 per
    # element; bytes X, gate, Y 32768 each + scale 512
    ("gated_rms_norm", "float[2,16,256] x, float[128] sc, float[2,16,256] gt",
     "y = com.microsoft.GatedRMSNorm(x, sc, gt)", "GatedRMSNorm", "normalization", 73728,
     98816),
    # MRotaryEmbedding (Qwen2-VL), X (2,4,64), 3-axis positions (3,2,4), caches (128,16):
    # 3 per element of 512; bytes X 2048 + positions 192 + Y 2048 + 8 cache rows x 16 x 2
    ("mrotary", "float[2,4,64] x, int64[3,2,4] p, float[128,16] c, float[128,16] s",
     "y = com.microsoft.MRotaryEmbedding<num_heads=4>(x, p, c, s)", "MRotaryEmbedding",
     "elementwise", 1536, 5312),
    # CDist (6,4) x (5,4) -> (6,5): 30 pairs x (3 x 4 + sqrt); bytes 96 + 80 + 120
    ("cdist", "float[6,4] a, float[5,4] b", 'y = com.microsoft.CDist<metric="euclidean">(a, b)',
     "CDist", "reduction", 390, 296),
]


@pytest.mark.parametrize("case, inputs, body, op, family, flops, nbytes", CASES,
                         ids=[c[0] for c in CASES])
def test_flops_and_bytes(case, inputs, body, op, family, flops, nbytes):
    c = cost_of(inputs, body, op, 17)
    assert (c.family, c.flops, c.bytes) == (family, flops, nbytes)


@pytest.mark.parametrize("inputs, body, shape, dtype", [
    # the standard op's inference: Conv with pads -> 16x16; Gemm transB -> (4, 32)
    ("float[1,8,16,16] x, float[16,8,3,3] w, float[16] b",
     'y = com.microsoft.FusedConv<activation="Relu", pads=[1,1,1,1]>(x, w, b)',
     (1, 16, 16, 16), "float32"),
    # quantized data the standard op refuses (uint8 pooling): inferred on float, typed uint8
    (f"uint8[1,8,7,7] x, {QA}, float s2, uint8 z2",
     "y = com.microsoft.QLinearGlobalAveragePool(x, sa, za, s2, z2)", (1, 8, 1, 1), "uint8"),
    ("float[2,64,640] x, float[640] b", "y = com.microsoft.BiasSplitGelu(x, b)",
     (2, 64, 320), "float32"),
    ("uint8[1000,32] d, int64[2,5] i, float[1000,2] s",
     "y = com.microsoft.GatherBlockQuantized<bits=4, block_size=32>(d, i, s)", (2, 5, 64),
     "float32"),
    # ceil_mode: (16 - 3) / 2 rounded up, + 1 = 8 (7 rounded down)
    ("uint8[1,16,16,8] x",
     "y = com.microsoft.NhwcMaxPool<kernel_shape=[3,3], strides=[2,2], ceil_mode=1>(x)",
     (1, 8, 8, 8), "uint8"),
])
def test_shapes_come_from_the_standard_op(inputs, body, shape, dtype):
    text = (f'<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
            f"g ({inputs}) => (sink) {{\n{body}\n sink = Identity(y)\n}}")
    y = next(n for n in build_graph(onnx.parser.parse_model(text)).nodes
             if n.domain).outputs[0]
    assert (y.shape, y.dtype) == (shape, dtype)


def test_channels_last_is_not_mirrored():
    # NHWC data is not the standard op's layout: no shape, so the node is reported unshaped
    text = f"""<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (uint8[1,7,7,8] x, {QA}, float s2, uint8 z2) => (y) {{
  y = com.microsoft.QLinearGlobalAveragePool<channels_last=1>(x, sa, za, s2, z2)
}}"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    assert dict(f.unshaped) == {"com.microsoft::QLinearGlobalAveragePool": 1}


def test_every_mirror_has_a_formula_and_a_standard_formula():
    for (domain, op), mirror in MIRRORS.items():
        assert isinstance(REGISTRY.lookup(domain, op, 1), CostEntry), op
        assert isinstance(REGISTRY.lookup("", mirror.op_type, mirror.opset), CostEntry), op
    mirrored = {op for _, op in MIRRORS}
    assert set(EPILOGUE) | set(RESIDUAL) <= mirrored  # none for an op never mirrored


@pytest.mark.parametrize("domain, op, shown", [
    ("com.microsoft", "BeamSearch", "generation loop"),
    ("com.microsoft", "EPContext", "precompiled engine"),
    ("com.microsoft.nchwc", "Conv", "ORT_ENABLE_EXTENDED"),
])
def test_opaque_contrib_ops_say_why(domain, op, shown):
    text = f"""<ir_version: 8, opset_import: ["" : 17, "{domain}" : 1]>
g (float[2,8] x) => (y) {{ y = {domain}.{op}(x) }}"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    assert dict(f.unsupported) == {f"{domain}::{op}": 1}
    (reason,) = f.unsupported_reasons  # in the API, the JSON and the table alike
    assert (reason.op_type, reason.count, shown in reason.reason) == (f"{domain}::{op}", 1, True)
    assert tilecast.Forecast.from_json(f.to_json()).unsupported_reasons == f.unsupported_reasons
    assert f"  {domain}::{op} x1: " in render(f, "table", 3)


MOE = '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'


def _moe_kernels(tokens: int, body: str, inputs: str) -> dict[str, tilecast.KernelForecast]:
    text = MOE + f"g (float16[1,{tokens},64] x, float16[{tokens},8] p, {inputs}) => (y) {{\n" \
                 f"  y = {body}\n}}"
    f = tilecast.analyze(onnx.parser.parse_model(text), "h100", predictor="roofline")
    assert not f.incomplete
    return {k.kernel.name.split(".")[-1]: k for k in f.kernels}


FP16_EXPERTS = "float16[8,256,64] w1, float16[8,64,128] w2"
SWIGLU = 'com.microsoft.MoE<k=2, activation_type="swiglu", swiglu_fusion=1>(x, p, w1, "", w2)'


def test_moe_prefill_reads_every_expert():
    # 16 tokens x k 2 = 32 expert rows over 8 experts: all touched, 4 rows each.
    # fc1: 8 x (4 x 64) @ (64 x 256) = 2*8*4*256*64; its weights 8*256*64*2 bytes all read;
    # swiglu fused: inter = 256 / 2 = 128, then fc2 8 x (4 x 128) @ (128 x 64)
    k = _moe_kernels(16, SWIGLU, FP16_EXPERTS)
    assert list(k) == ["router", "fc1", "activation", "fc2", "combine"]
    assert k["fc1"].kernel.cost.matmul == MatmulDims(8, 4, 256, 64, batched=True,
                                                      weight_b=True)
    assert k["fc1"].kernel.cost.flops == 2 * 8 * 4 * 256 * 64
    assert k["fc1"].kernel.cost.bytes == 32 * (64 + 256) * 2 + 8 * 256 * 64 * 2
    assert k["fc2"].kernel.cost.matmul.k == 128


def test_moe_decode_reads_only_the_chosen_experts():
    # 1 token x k 2: 2 of 8 experts touched, one row each: a quarter of each weight read
    k = _moe_kernels(1, SWIGLU, FP16_EXPERTS)
    assert k["fc1"].kernel.cost.matmul == MatmulDims(2, 1, 256, 64, batched=True,
                                                      weight_b=True)
    assert k["fc1"].kernel.cost.bytes == 2 * (64 + 256) * 2 + 8 * 256 * 64 * 2 // 4


def test_qmoe_reads_the_packed_weights():
    # 4-bit experts: fc1 (8, 256, 64 / 2 bytes), fc2 (8, 64, 128 / 2), fp16 scales per row;
    # the FLOPs are the fp16 model's, the weight bytes a quarter of them
    body = ('com.microsoft.QMoE<k=2, activation_type="swiglu", swiglu_fusion=1, '
            'expert_weight_bits=4>(x, p, w1, s1, "", w2, s2)')
    inputs = "uint8[8,256,32] w1, float16[8,256] s1, uint8[8,64,64] w2, float16[8,64] s2"
    q, f = _moe_kernels(16, body, inputs), _moe_kernels(16, SWIGLU, FP16_EXPERTS)
    assert q["fc1"].kernel.cost.flops == f["fc1"].kernel.cost.flops
    assert q["fc1"].kernel.cost.bytes == 32 * (64 + 256) * 2 + 8 * 256 * 32 + (8 * 256 + 8 * 64) * 2


def test_moe_trains_its_experts():
    # backward: each expert GEMM's input and weight gradients (its own work each); the
    # router's and the op input's gradients only when they are needed (both graph inputs here)
    import numpy as np
    from onnx import numpy_helper

    model = onnx.parser.parse_model(
        MOE + "g (float[1,8,64] x, float[8,4] p) => (y) <float[4,256,64] w1, "
        "float[4,64,128] w2> {\n  y = com.microsoft.MoE<k=2, activation_type=\"swiglu\", "
        "swiglu_fusion=1>(x, p, w1, \"\", w2)\n}")
    model.graph.initializer.extend(numpy_helper.from_array(np.zeros(s, np.float32), n)
                                   for n, s in (("w1", (4, 256, 64)), ("w2", (4, 64, 128))))
    f = tilecast.analyze(model, "l4", mode="training", predictor="roofline")
    backward = [k.kernel.name.split(".", 1)[1] for k in f.kernels if ".d" in k.kernel.name]
    assert backward == ["combine.dX", "fc2.dX", "fc2.dW", "activation.dX", "fc1.dW"]


@pytest.mark.parametrize("inputs, weights, body", [
    ("float[1,8,16,16] x", {"w": (16, 8, 3, 3), "b": (16,)},
     'com.microsoft.FusedConv<activation="Relu", pads=[1,1,1,1]>(x, w, b)'),
    ("float[1,16,16,8] x", {"w": (16, 3, 3, 8)}, "com.microsoft.NhwcConv<pads=[1,1,1,1]>(x, w)"),
    ("float[2,8,8,32] x", {"w": (32,), "b": (32,)},
     "com.microsoft.GroupNorm<groups=4, activation=1, epsilon=0.00001>(x, w, b)"),
    ("float[1,4,8,8] x, float[1,18,6,6] o", {"w": (6, 4, 3, 3)},
     "DeformConv<kernel_shape=[3,3]>(x, w, o)"),
    ("float[2,64,16] x", {"w": (64, 1, 4)}, "CausalConvWithState(x, w)"),
])
def test_new_parametric_ops_train_their_weights(inputs, weights, body):
    # params.WEIGHT_INPUTS knows their weights: a training step accumulates each one's gradient
    import numpy as np
    from onnx import numpy_helper

    outs = "y, ys" if body.startswith("Causal") else "y"
    decl = ", ".join(f"float[{','.join(map(str, s))}] {n}" for n, s in weights.items())
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 27, "com.microsoft" : 1]>\n'
        f"g ({inputs}) => (y) <{decl}> {{\n  {outs} = {body}\n}}")
    model.graph.initializer.extend(numpy_helper.from_array(np.zeros(s, np.float32), n)
                                   for n, s in weights.items())
    f = tilecast.analyze(model, "l4", mode="training", predictor="roofline")
    assert {f"{n}.grad_acc" for n in weights} <= {k.kernel.name for k in f.kernels}


def test_a_mirror_copies_attributes_it_cannot_remake():
    # an empty ints attribute has no type to re-make it from its value: copied as it is, the
    # standard op's inference refuses it and the node is unshaped (was a ValueError traceback)
    from onnx import AttributeProto, helper
    from onnx import TensorProto as T

    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft",
                            activation="Relu")
    node.attribute.append(AttributeProto(name="pads", type=AttributeProto.INTS))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 8, 16, 16]),
                      helper.make_tensor_value_info("w", T.FLOAT, [16, 8, 3, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    f = tilecast.analyze(model, "l4", predictor="roofline")
    assert dict(f.unshaped) == {"com.microsoft::FusedConv": 1}
