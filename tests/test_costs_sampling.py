"""The formulas that completed the ONNX standard domain: sampling at computed coordinates,
signal processing, random generators, the two losses, Det, LRN, DeformConv, CPU-only ops.

Convention: 1 FMA = 2 FLOPs; bytes = each distinct tensor read or written once, dtype-aware
(float32 4 bytes, int64 8); gathered taps count up to their input once. Each row derives its
numbers beside it.
"""

from __future__ import annotations

import onnx
import onnx.defs
import onnx.parser
import pytest
from test_costs import cost_of

import tilecast
from tilecast.analyzer.registry import REGISTRY, STEPS, ZeroCost
from tilecast.analyzer.types import MatmulDims, RowDims

ONES64 = ",".join(["1.0"] * 64)

CASES = [
    # GridSample, X (2,3,8,8), grid (2,4,5,2) -> Y (2,3,4,5) = 120 outputs; linear, r = 2:
    # 3*(4-1) = 9 per output + 2*2 coordinate FLOPs at 2*4*5 = 40 positions -> 1080 + 160.
    # bytes: 120*4 taps*4 B = 1920 capped at X 1536, + grid 320 + Y 480
    ("grid_sample", "float[2,3,8,8] x, float[2,4,5,2] g", "y = GridSample(x, g)",
     "GridSample", 20, "pooling", 1240, 2336),
    # nearest: 1 per output; 120 taps*4 B = 480 < X -> 120 + 160 FLOPs, 480 + 320 + 480 bytes
    ("grid_sample_nearest", "float[2,3,8,8] x, float[2,4,5,2] g",
     'y = GridSample<mode="nearest">(x, g)', "GridSample", 20, "pooling", 280, 1280),
    # AffineGrid, theta (2,2,3), size [2,3,4,5] -> grid (2,4,5,2): 40 positions, r = 2:
    # 2r + r(2r+1) = 4 + 10 = 14 -> 560; bytes theta 48 + size 32 + grid 320
    ("affine_grid", "float[2,2,3] t",
     "s = Constant<value = int64[4] {2,3,4,5}>()\n y = AffineGrid(t, s)", "AffineGrid", 20,
     "pooling", 560, 400),
    # RoiAlign -> Y (3,8,7,7) = 1176 bins, sampling_ratio 0 -> 2: 4 samples * 10 + 1 divide
    # -> 47040 + 1176; taps 4*4704*4 B capped at X 8192, + rois 48 + indices 24 + Y 4704
    ("roi_align", "float[1,8,16,16] x, float[3,4] r, int64[3] b",
     "y = RoiAlign<output_height=7, output_width=7>(x, r, b)", "RoiAlign", 22, "pooling",
     48216, 12968),
    # sampling_ratio 1: 1176 * (10 + 1); taps 4*1176*4 = 18816 capped at 8192
    ("roi_align_ratio1", "float[1,8,16,16] x, float[3,4] r, int64[3] b",
     "y = RoiAlign<output_height=7, output_width=7, sampling_ratio=1>(x, r, b)", "RoiAlign",
     22, "pooling", 12936, 12968),
    # MaxRoiPool, 3 ROIs over X (1,8,16,16): each ROI taken as the whole map: 3*8*256 = 6144
    # compares; taps capped at X 8192 + rois 60 + Y 3*8*49*4 = 4704
    ("max_roi_pool", "float[1,8,16,16] x, float[3,5] r",
     "y = MaxRoiPool<pooled_shape=[7,7]>(x, r)", "MaxRoiPool", 22, "pooling", 6144, 12956),
    # MaxUnpool 2x2: X 512 + I 1024 + Y (1,8,8,8) 2048 bytes, no arithmetic
    ("max_unpool", "float[1,8,4,4] x, int64[1,8,4,4] i",
     "y = MaxUnpool<kernel_shape=[2,2], strides=[2,2]>(x, i)", "MaxUnpool", 22, "pooling",
     0, 3584),
    # LRN size 5 over (2,16,8,8) = 2048 elements: 2*5 + 4 = 14 each; X and Y 8192 bytes each
    ("lrn", "float[2,16,8,8] x", "y = LRN<size=5>(x)", "LRN", 17, "normalization",
     28672, 16384),
    # DFT of 4 real signals of 64, onesided -> (4,33,2): 5*64*6 / 2 = 960 each;
    # bytes X 1024 + Y 1056
    ("dft_real_onesided", "float[4,64,1] x", "y = DFT<onesided=1>(x)", "DFT", 17, "pooling",
     3840, 2080),
    # complex, full: 4 transforms of 64 at 5*64*6 = 1920; bytes 2048 + 2048
    ("dft_complex", "float[4,64,2] x", "y = DFT(x)", "DFT", 17, "pooling", 7680, 4096),
    # STFT, signal (2,400,1), step 64, window 64 -> frames (400-64)//64 + 1 = 6 per signal:
    # 12 * (960 + 64 window multiplies); bytes 3200 + step 8 + window 256 + Y 12*33*2*4
    # (onesided by default: 33 bins, which ONNX's own inference gets wrong; shape_rules.py)
    ("stft", "float[2,400,1] x",
     "st = Constant<value = int64 {64}>()\n w = Constant<value = float[64] {" + ONES64
     + "}>()\n y = STFT(x, st, w)", "STFT", 17, "pooling", 12288, 6632),
    # HannWindow(64): 4 per element; bytes size 8 + output 256
    ("hann_window", "float[1] x", "n = Constant<value = int64 {64}>()\n y = HannWindow(n)",
     "HannWindow", 17, "elementwise", 256, 264),
    # RandomUniformLike (4,8): 3 per element; writes 128 bytes, reads none of x
    ("random_uniform_like", "float[4,8] x", "y = RandomUniformLike(x)", "RandomUniformLike",
     17, "elementwise", 96, 128),
    # RandomNormal shape (4,8): 6 per element, 128 bytes written
    ("random_normal", "float[1] x", "y = RandomNormal<shape=[4,8]>()", "RandomNormal", 17,
     "elementwise", 192, 128),
    # Bernoulli (4,8): a draw (3) and a compare; reads p 128, writes 128
    ("bernoulli", "float[4,8] x", "y = Bernoulli(x)", "Bernoulli", 17, "elementwise", 128,
     256),
    # Multinomial, 4 rows of 10 classes, 3 samples: 4*2*10 + 12*(3 + log2 compares 4) = 164;
    # bytes 160 + int32 48
    ("multinomial", "float[4,10] x", "y = Multinomial<sample_size=3>(x)", "Multinomial", 17,
     "reduction", 164, 208),
    # SoftmaxCrossEntropyLoss, 8 rows of 10: log-softmax 5*80 + 3*8; bytes 320 + 64 + 4
    ("softmax_cross_entropy", "float[8,10] x, int64[8] l",
     "y = SoftmaxCrossEntropyLoss(x, l)", "SoftmaxCrossEntropyLoss", 17, "softmax", 424, 388),
    # NegativeLogLikelihoodLoss, 8 targets: 3 each; 8 gathered floats 32 + target 64 + loss 4
    ("nll_loss", "float[8,10] x, int64[8] l", "y = NegativeLogLikelihoodLoss(x, l)",
     "NegativeLogLikelihoodLoss", 17, "gather", 24, 100),
    # Det of 5 3x3 matrices: 5 * (2*27 // 3 + 3) = 105; bytes 180 + 20
    ("det", "float[5,3,3] x", "y = Det(x)", "Det", 17, "reduction", 105, 200),
    # ImageScaler (tiny YOLOv2, opset 7; ONNX no longer defines it): 192 elements, an FMA
    # each; X and Y 768 bytes; its shape comes from tilecast's rule, not ONNX
    ("image_scaler", "float[1,3,8,8] x", "y = ImageScaler<bias=[1.0,2.0,3.0], scale=0.5>(x)",
     "ImageScaler", 7, "elementwise", 384, 1536),
    # LinearAttention, B 2, T 16, 4 query heads over 2 KV heads, dk = 512/4 = 128,
    # dv = 256/2 = 128, gated_delta: per token 2*(5*16384 + 2*128) + 4*(2*16384 + 128)
    # = 295936, times 32 tokens. Bytes: q 65536, k, v, decay 32768 each, state 262144 in and
    # out, beta 256, output 65536
    ("linear_attention", "float[2,16,512] q, float[2,16,256] k, float[2,16,256] v, "
     "float[2,2,128,128] s, float[2,16,256] g, float[2,16,2] be",
     "y, ps = LinearAttention<q_num_heads=4, kv_num_heads=2>(q, k, v, s, g, be)",
     "LinearAttention", 27, "attention", 9469952, 753920),
    # "linear" without state or gates: per token 2*(2*16384) + 4*(2*16384 + 128) = 197120;
    # bytes q 65536 + k, v 32768 each + output 65536 + the new state 262144
    ("linear_attention_plain", "float[2,16,512] q, float[2,16,256] k, float[2,16,256] v",
     'y, ps = LinearAttention<q_num_heads=4, kv_num_heads=2, update_rule="linear">(q, k, v)',
     "LinearAttention", 27, "attention", 6307840, 458752),
    # CausalConvWithState, x (2,64,16), w (64,1,4), SiLU: 2*64 channels*32 positions*4 taps
    # = 16384, + 4 per output * 2048 = 8192; bytes x 8192, w 1024, y 8192, state 2*64*3*4
    ("causal_conv_state", "float[2,64,16] x, float[64,1,4] w",
     'y, ys = CausalConvWithState<activation="silu">(x, w)', "CausalConvWithState", 27,
     "conv", 24576, 18944),
]


@pytest.mark.parametrize("case, inputs, body, op, opset, family, flops, nbytes", CASES,
                         ids=[c[0] for c in CASES])
def test_flops_and_bytes(case, inputs, body, op, opset, family, flops, nbytes):
    c = cost_of(inputs, body, op, opset)
    assert (c.family, c.flops, c.bytes) == (family, flops, nbytes)


def test_row_kernels_keep_their_layout():
    loss = cost_of("float[8,10,3] x, int64[8,3] l", "y = SoftmaxCrossEntropyLoss(x, l)",
                   "SoftmaxCrossEntropyLoss", 17)
    assert loss.rows == RowDims(24, 10)  # a log-softmax over the classes of 8*3 positions
    assert cost_of("float[5,3,3] x", "y = Det(x)", "Det", 17).rows == RowDims(5, 9)


def test_deform_conv_is_columns_then_a_gemm():
    # X (1,4,8,8), W (6,4,3,3) -> Y (1,6,6,6): 1*4*9*36 = 1296 sampled taps at 9 FLOPs;
    # the GEMM: m = 36 positions, n = 6 channels, k = 4*9 = 36 -> 2*36*6*36 = 15552
    text = """<ir_version: 10, opset_import: ["" : 22]>
g (float[1,4,8,8] x, float[6,4,3,3] w, float[1,18,6,6] o) => (float[1,6,6,6] y) {
  y = DeformConv<kernel_shape=[3,3]>(x, w, o)
}"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    columns, gemm = f.kernels
    assert (columns.kernel.name, columns.kernel.cost.flops) == ("DeformConv_0.columns", 11664)
    assert (gemm.kernel.cost.matmul, gemm.kernel.cost.flops) == (MatmulDims(1, 36, 6, 36),
                                                                 15552)
    # the columns matrix (1296 floats) is written by the first kernel and read by the second
    assert columns.kernel.cost.bytes >= 1296 * 4 and gemm.kernel.cost.bytes >= 1296 * 4
    assert ("", "DeformConv") in STEPS


def test_string_ops_are_cpu_only():
    text = """<ir_version: 10, opset_import: ["" : 17]>
g (string[3] x) => (string[3] y) { y = StringNormalizer(x) }"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    assert (f.kernels, dict(f.zero_cost), f.incomplete) == ((), {"StringNormalizer": 1}, False)
    assert "CPU-only" in f.zero_cost_reasons[0].reason


# What still has no formula, and why: control flow (its subgraphs), sequences (no shapes),
# data-dependent output sizes (left unshaped, as after NonZero).
LEFT = {"If", "Loop", "Scan", "SequenceAt", "SequenceConstruct", "SequenceErase",
        "SequenceInsert", "SequenceMap", "ConcatFromSequence", "SplitToSequence",
        "NonMaxSuppression", "Unique", "Compress"}


def test_every_standard_op_has_a_formula_or_a_reason():
    latest = {s.name: s.since_version for s in onnx.defs.get_all_schemas()
              if s.domain in ("", "ai.onnx") and not s.deprecated}
    missing = {op for op, v in latest.items() if REGISTRY.lookup("", op, v) is None}
    assert missing == LEFT & set(latest)
    assert all(isinstance(REGISTRY.lookup("", op, 17), ZeroCost)
               for op in ("StringSplit", "TfIdfVectorizer", "RegexFullMatch"))


def test_onnx_still_reads_a_missing_onesided_as_zero():
    # The canary for shape_rules._stft_onesided: when an ONNX release infers the schema's
    # default (33 bins here), this fails and the correction must go, or it would halve again.
    text = ('<ir_version: 10, opset_import: ["" : 17]>\ng (float[2,400,1] x) => (y) {\n'
            " st = Constant<value = int64 {64}>()\n w = Constant<value = float[64] {"
            + ONES64 + "}>()\n y = STFT(x, st, w)\n}")
    model = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text), data_prop=True)
    dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims[2] == 64


def test_the_stateful_causal_conv_is_not_a_cudnn_call():
    # Both are depthwise convs on the memory-bound rule; only the library Conv takes cuDNN's
    # per-call host dispatch (learned/routing.NOT_LIBRARY_CONV).
    from tilecast.learned.routing import route

    text = """<ir_version: 11, opset_import: ["" : 27]>
g (float[2,64,16] x, float[64,1,4] w, float[2,64,19] xp) => (y, ys, z) {
  y, ys = CausalConvWithState(x, w)
  z = Conv<group=64>(xp, w)
}"""
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    assert [k.kernel.family for k in f.kernels] == ["conv", "conv"]
    assert route([k.kernel for k in f.kernels]).conv.tolist() == [False, True]
