"""A mask the graph builds as a causal one limits a fused attention kernel to the visible
pairs (analyzer/causal.py): an eager attention chain under the graph runtime and an ONNX
Attention op with such a mask cost what an ``is_causal`` kernel costs; any other mask, and
the PyTorch runtimes, count every pair."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.causal import CausalMask
from tilecast.analyzer.graph import build_graph, load_model

RAMP_Q = "int64[1, 1, 8, 1] qi = {0, 1, 2, 3, 4, 5, 6, 7}"
RAMP_KV = "int64[1, 1, 1, 8] ki = {0, 1, 2, 3, 4, 5, 6, 7}"
# Hugging Face's eager mask: visible = (kv <= q) & (zeros == zeros); 0 there, fp32 min else
HF_MASK = """  le = LessOrEqual(ki, qi)
  eq = Equal(z0, z1)
  vis = And(le, eq)
  m = Where(vis, zero, low)
"""


def _model(mask: str, inits: str = f"{RAMP_Q}, {RAMP_KV}", inputs: str = "") -> str:
    # B 2, H 4, S 8, D 16 fp32 (as tests/test_attention_fusion.py): Q K^T, scale, mask, P V
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v{inputs})
  => (float[2, 4, 8, 16] y)
  <{inits}, int64[1, 1, 8, 1] z0 = {{0, 0, 0, 0, 0, 0, 0, 0}},
   int64[1, 1, 1, 8] z1 = {{0, 0, 0, 0, 0, 0, 0, 0}}, float zero = {{0.0}},
   float low = {{-3.4e38}}, float scale = {{0.25}}, int64 three = {{3}}> {{
{mask}  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  s = MatMul(q, kt)
  t = Mul(s, scale)
  u = Add(t, m)
  p = Softmax <axis = -1> (u)
  y = MatMul(p, v)
}}"""


def _attention(text: str, runtime: str = "graph"):
    f = tilecast.analyze(onnx.parser.parse_model(text), "a100-sxm4-40gb", predictor="roofline",
                         runtime=runtime)
    return [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]


def _masks(text: str) -> dict[str, CausalMask]:
    m = load_model(onnx.parser.parse_model(text))
    return dict(build_graph(m).causal_masks)


# 8 (batch x heads) x visible pairs; QK^T and PV 2 * 16 FLOPs each per pair, the softmax 6
# (the mask is not read: the kernel masks by index, as an is_causal kernel does)
def _flops(pairs: int) -> int:
    return 8 * pairs * (2 * 16 * 2 + 6)


ALL_PAIRS = 8 * 64 * (2 * 16 * 2 + 7)  # every pair of 8 x 8, the mask added to each (7 per score)
CAUSAL = 8 * 9 // 2  # query i sees keys 0..i: 36 of 64
# the same mask from Range ops: arange(8) unsqueezed onto the query and the key axes
RANGE_MASK = """  r = Range(r0, r8, r1)
  qa = Unsqueeze(r, ax_q)
  ka = Unsqueeze(r, ax_kv)
""" + HF_MASK.replace("(ki, qi)", "(ka, qa)")
RANGE_INITS = ("int64 r0 = {0}, int64 r8 = {8}, int64 r1 = {1}, "
               "int64[3] ax_q = {0, 1, 3}, int64[3] ax_kv = {0, 1, 2}")
# a sliding window of 3 keys: also kv > q - 3; query i sees min(i + 1, 3) keys: 1 + 2 + 3 * 6
WINDOW_MASK = """  qm = Sub(qi, three)
  gt = Greater(ki, qm)
  le = LessOrEqual(ki, qi)
  vis = And(le, gt)
  m = Where(vis, zero, low)
"""


@pytest.mark.parametrize(("mask", "inits", "pairs"), [
    (HF_MASK, f"{RAMP_Q}, {RAMP_KV}", CAUSAL),
    (RANGE_MASK, RANGE_INITS, CAUSAL),
    (HF_MASK.replace("LessOrEqual(ki, qi)", "GreaterOrEqual(qi, ki)"),
     f"{RAMP_Q}, {RAMP_KV}", CAUSAL),  # q >= kv: the same band written the other way
    (WINDOW_MASK, f"{RAMP_Q}, {RAMP_KV}", 1 + 2 + 3 * 6),
])
def test_a_causal_mask_limits_the_fused_kernel_to_the_visible_pairs(mask: str, inits: str,
                                                                   pairs: int) -> None:
    (att,) = _attention(_model(mask, inits))
    assert att.cost.flops == _flops(pairs)
    assert att.cost.bytes == 4 * 4096  # Q, K, V and Y: the mask's bytes are not read


@pytest.mark.parametrize("mask", [
    HF_MASK.replace("LessOrEqual(ki, qi)", "GreaterOrEqual(ki, qi)"),  # keys after the query
    HF_MASK.replace("LessOrEqual", "Less"),  # the diagonal hidden: not is_causal's alignment
    HF_MASK.replace("Where(vis, zero, low)", "Where(vis, zero, lowish)"),  # nothing hidden
    HF_MASK.replace("Where(vis, zero, low)", "Where(vis, low, zero)"),  # the band hidden
])
def test_any_other_mask_counts_every_pair(mask: str) -> None:
    text = _model(mask, f"{RAMP_Q}, {RAMP_KV}, float lowish = {{-1.0}}")
    assert "m" not in _masks(text)
    (att,) = _attention(text)
    assert att.cost.flops == ALL_PAIRS


# masks from Trilu over constant splats: PyTorch's square subsequent mask (triu of -inf above
# the diagonal), a boolean tril, and a tril of ones compared with 0 selecting -inf
FULL = "  full = ConstantOfShape <value = float[1] {-3.4e38}> (s88)\n"
ONES = "  ones = ConstantOfShape <value = float[1] {1.0}> (s88)\n"
TRILU_INITS = f"{RAMP_Q}, {RAMP_KV}, int64[2] s88 = {{8, 8}}, int64 one = {{1}}"


@pytest.mark.parametrize(("mask", "pairs"), [
    (FULL + "  m = Trilu <upper = 1> (full, one)\n", CAUSAL),
    ("  yes = ConstantOfShape <value = bool[1] {1}> (s88)\n  vis = Trilu <upper = 0> (yes)\n"
     "  m = Where(vis, zero, low)\n", CAUSAL),
    (ONES + "  tri = Trilu <upper = 0> (ones)\n  hid = Equal(tri, zero)\n"
     "  m = Where(hid, low, zero)\n", CAUSAL),
    (FULL + "  m = Trilu <upper = 1> (full)\n", None),  # the diagonal hidden too
    (FULL + "  m = Trilu <upper = 0> (full, one)\n", None),  # the past hidden
])
def test_a_trilu_mask(mask: str, pairs: int | None) -> None:
    (att,) = _attention(_model(mask, TRILU_INITS))
    assert att.cost.flops == (ALL_PAIRS if pairs is None else _flops(pairs))


def test_a_ramp_with_batch_copies_is_still_a_ramp() -> None:
    # Hugging Face's index tensors carry the batch: (4, 1, 8, 1) holds arange(8) four times
    q4 = "int64[4, 1, 8, 1] qi = {" + ", ".join(["0, 1, 2, 3, 4, 5, 6, 7"] * 4) + "}"
    masks = _masks(_model(HF_MASK, f"{q4}, {RAMP_KV}"))
    assert masks["m"] == masks["vis"] == CausalMask(0)  # the additive mask and its boolean


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_pytorch_runtimes_run_the_ops_as_written(runtime: str) -> None:
    assert _attention(_model(HF_MASK), runtime) == []  # no fusion, so every pair (MatMul)


# an --attn sdpa export: ONNX Attention (opset 23) with the boolean causal mask as input 3
SDPA = f"""
<ir_version: 10, opset_import: ["" : 23]>
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v) => (float[2, 4, 8, 16] y)
  <{RAMP_Q}, {RAMP_KV}> {{
  vis = LessOrEqual(ki, qi)
  y = Attention(q, k, v, vis)
}}"""


@pytest.mark.parametrize(("runtime", "flops"), [
    ("graph", _flops(CAUSAL)),  # the graph runtime's kernel skips the hidden pairs
    ("eager", ALL_PAIRS),  # PyTorch's SDPA with an explicit mask computes every pair
])
def test_an_attention_op_with_a_causal_mask(runtime: str, flops: int) -> None:
    (att,) = _attention(SDPA, runtime)
    assert att.cost.flops == flops


def test_an_attention_op_with_a_sliding_window_mask() -> None:
    # the window mask above as the op's boolean mask: query i sees min(i + 1, 3) keys
    text = SDPA.replace("  vis = LessOrEqual(ki, qi)\n", WINDOW_MASK.replace(
        "  m = Where(vis, zero, low)\n", ""))
    text = text.replace(f"{RAMP_KV}>", f"{RAMP_KV}, int64 three = {{3}}>")
    (att,) = _attention(text)
    assert att.cost.flops == _flops(1 + 2 + 3 * 6)


def test_the_weightless_reader_keeps_position_vectors_and_drops_weights() -> None:
    # 2,048 int64 positions are 16 kB (over the 4 kB weight limit): kept, a causal mask of a
    # 2,048-token prompt is read from them; a float or int8 tensor of that size is dropped
    import numpy as np
    from onnx import helper, numpy_helper

    from tilecast.analyzer.weightless import has_data

    tensors = [numpy_helper.from_array(np.arange(2048, dtype=np.int64), "pos"),
               numpy_helper.from_array(np.zeros(4096, np.float32), "w"),
               numpy_helper.from_array(np.zeros(16384, np.int8), "q")]
    g = helper.make_graph([], "g", [], [], initializer=tensors)
    kept = {t.name: has_data(t) for t in load_model(helper.make_model(g)).graph.initializer}
    assert kept == {"pos": True, "w": False, "q": False}


# a padding mask from the graph's attention_mask and'ed with the band, or filled into the
# additive band mask (transformers' two ways): at most the band is visible, so a kernel that
# skips what is outside it computes the band's pairs whatever the padding holds
PAD = "  le = LessOrEqual(ki, qi)\n  pad = Unsqueeze(am, ax)\n"


@pytest.mark.parametrize(("mask", "pairs"), [
    ("  vis = And(le, pad)\n  m = Where(vis, zero, low)\n", CAUSAL),
    ("  vis = And(pad, le)\n  m = Where(vis, zero, low)\n", CAUSAL),  # either operand order
    ("  band = Where(le, zero, low)\n  off = Not(pad)\n  m = Where(off, low, band)\n", CAUSAL),
    ("  vis = Or(le, pad)\n  m = Where(vis, zero, low)\n", None),  # Or may show any pair
    ("  band = Where(le, zero, low)\n  m = Where(pad, zero, band)\n", None),  # shows padding
])
def test_a_band_and_ed_with_a_padding_mask_is_at_most_the_band(mask: str,
                                                               pairs: int | None) -> None:
    text = _model(PAD + mask, f"{RAMP_Q}, {RAMP_KV}, int64[2] ax = {{1, 2}}", ", bool[2, 8] am")
    (att,) = _attention(text)
    assert att.cost.flops == (ALL_PAIRS if pairs is None else _flops(pairs))


# a decoder with 4 cached positions: the queries sit at positions past .. past + 7, past read
# from the cache input's shape; query i sees the 4 cached keys and the new ones up to it
WITH_PAST = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 8, 16] q, float[2, 4, 4, 16] past, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v,
   float[2, 4, 4, 16] pv) => (float[2, 4, 8, 16] y)
  <int64[1, 1, 1, 12] ki = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, int64 two = {2},
   int64 eight = {8}, int64 one = {1}, int64[3] ax = {0, 1, 3}, float zero = {0.0},
   float low = {-3.4e38}, float scale = {0.25}> {
  shp = Shape(past)
  p0 = Gather(shp, two)
  p1 = Add(p0, eight)
  r = Range(p0, p1, one)
  qi = Unsqueeze(r, ax)
  le = LessOrEqual(ki, qi)
  m = Where(le, zero, low)
  kc = Concat <axis = 2> (past, k)
  vc = Concat <axis = 2> (pv, v)
  kt = Transpose <perm = [0, 1, 3, 2]> (kc)
  s = MatMul(q, kt)
  t = Mul(s, scale)
  u = Add(t, m)
  pr = Softmax <axis = -1> (u)
  y = MatMul(pr, vc)
}"""


def test_a_mask_over_cached_keys_is_causal_bottom_right() -> None:
    (att,) = _attention(WITH_PAST)
    assert _masks(WITH_PAST)["m"] == CausalMask(0)
    assert att.cost.flops == 8 * sum(4 + i + 1 for i in range(8)) * (2 * 16 * 2 + 6)


def test_a_causal_kernel_says_so_in_every_output() -> None:
    from tilecast.report import render_table

    f = tilecast.analyze(onnx.parser.parse_model(SDPA), "a100-sxm4-40gb", predictor="roofline",
                         runtime="graph")
    (k,) = [k for k in f.kernels if k.kernel.op_type == "Attention"]
    assert k.to_dict()["matmul"] == {"b": 8, "m": 8, "n": 8, "k": 16, "causal": True}
    back = tilecast.Forecast.from_json(f.to_json(), device=f.device)
    assert [x.kernel.cost.matmul for x in back.kernels] == [k.kernel.cost.matmul]
    assert "B8 M8 N8 K16 causal" in render_table(f)
    eager = tilecast.analyze(onnx.parser.parse_model(SDPA), "a100-sxm4-40gb",
                             predictor="roofline")  # every pair: no label, no JSON key
    (att,) = [k for k in eager.kernels if k.kernel.op_type == "Attention"]  # after the
    assert att.to_dict()["matmul"] == {"b": 8, "m": 8, "n": 8, "k": 16}  # mask's conversion


# nanoGPT's masked_fill over a registered tril buffer (a 16 x 16 block, sliced to the 8
# tokens): scores.masked_fill(bias[:, :, a:a+8, c:c+8] == 0, -inf), then the softmax
FILLED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v) => (float[2, 4, 8, 16] y)
  <float[1, 1, 16, 16] bias = {{{tril}}}, int64[1] a = {{{a}}}, int64[1] a8 = {{{a8}}},
   int64[1] c = {{{c}}}, int64[1] c8 = {{{c8}}}, int64[1] rows = {{2}}, int64[1] cols = {{3}},
   float zero = {{0.0}}, float ninf = {{-3.4e38}}, float scale = {{0.25}}> {{
  r = Slice(bias, a, a8, rows)
  b = Slice(r, c, c8, cols)
  hid = Equal(b, zero)
  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  s = MatMul(q, kt)
  t = Mul(s, scale)
  u = Where(hid, ninf, t)
  p = Softmax <axis = -1> (u)
  y = MatMul(p, v)
}}"""
TRIL16 = ", ".join("1.0" if j <= i else "0.0" for i in range(16) for j in range(16))


@pytest.mark.parametrize(("a", "c", "pairs"), [
    (0, 0, CAUSAL),  # nanoGPT: the top-left block
    (4, 4, CAUSAL),  # the same band further down the diagonal
    (4, 0, None),  # rows 4.. against keys 0..: each query sees 4 more keys, not is_causal's
])
def test_scores_filled_outside_a_sliced_tril_buffer(a: int, c: int, pairs: int | None) -> None:
    text = FILLED.format(tril=TRIL16, a=a, a8=a + 8, c=c, c8=c + 8)
    atts = _attention(text)
    if pairs is None:  # not causal: every pair, the (1, 1, 8, 8) bool condition read once
        assert [(x.cost.flops, x.cost.bytes) for x in atts] == [(ALL_PAIRS, 4 * 4096 + 64)]
    else:
        assert [x.cost.flops for x in atts] == [_flops(pairs)]
        assert atts[0].cost.bytes == 4 * 4096  # neither the buffer nor a mask read


ZERO_MASK = "  nil = Constant <value = float {0.0}> ()\n  m = Expand(nil, four)\n"  # all visible
BIASED = ("u = Add(t, m)", "tb = Add(t, pb)\n  u = Add(tb, m)")


@pytest.mark.parametrize(("mask", "pairs"), [(HF_MASK, CAUSAL), (ZERO_MASK, None)])
def test_a_position_bias_and_a_mask_both_added(mask: str, pairs: int | None) -> None:
    # T5's relative position bias (1, 4, 8, 8), then the mask: one kernel reading the bias
    # (one FLOP per score); a causal mask limits it to the visible pairs, unread
    text = _model(mask, f"{RAMP_Q}, {RAMP_KV}, int64[4] four = {{1, 1, 8, 8}}",
                  ", float[1, 4, 8, 8] pb").replace(*BIASED)
    (att,) = _attention(text)
    bias = 4 * 8 * 8 * 4
    if pairs is None:  # every pair, both the bias and the zero mask (1, 1, 8, 8) read
        assert (att.cost.flops, att.cost.bytes) == (8 * 64 * (64 + 6 + 2), 4 * 4096 + bias + 256)
    else:
        assert (att.cost.flops, att.cost.bytes) == (8 * pairs * (64 + 6 + 1), 4 * 4096 + bias)


# T5's decoder: the position bias filled with a very negative value outside the band, then
# added: a causal kernel that still reads the bias (and adds it: one FLOP per score)
T5_BIAS = "  m = Where(le, pb, low)\n"


def test_a_position_bias_filled_outside_the_band() -> None:
    text = _model("  le = LessOrEqual(ki, qi)\n" + T5_BIAS, inputs=", float[1, 4, 8, 8] pb")
    (att,) = _attention(text)
    assert (att.cost.flops, att.cost.bytes) == (8 * CAUSAL * (64 + 6 + 1), 4 * 4096 + 4 * 256)
    sdpa = SDPA.replace("vis = LessOrEqual(ki, qi)",
                        "le = LessOrEqual(ki, qi)\n" + T5_BIAS + "  vis = Identity(m)")
    sdpa = sdpa.replace("float[2, 4, 8, 16] v)", "float[2, 4, 8, 16] v, float[1, 4, 8, 8] pb)")
    (op,) = _attention(sdpa.replace(f"{RAMP_KV}>", f"{RAMP_KV}, float low = {{-3.4e38}}>"))
    assert op.cost.flops == 8 * CAUSAL * (64 + 6 + 1)  # the op reads the biased mask too
