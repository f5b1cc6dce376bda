"""An unpadded batch's attention masks (padding.py): Hugging Face's SDPA path checks the
``attention_mask`` input for padding and, finding none, passes SDPA no mask (``is_causal`` in
a decoder). Under eager PyTorch the masks built from that input cost nothing then, the call
runs causal or unmasked, and one reduction checks the input; a graph runtime builds them."""

from __future__ import annotations

import onnx.parser
import pytest
from attention_helpers import attention, ops, reasons, run

import tilecast
from tilecast.analyzer.padding import UNPADDED

# B 2, H 4, S 16 (bound at analysis), D 16 in fp32, an SDPA call as torch.onnx writes it
# (sqrt(1 / sqrt(16)) = 0.5 on Q and on K^T), the mask ``a`` added to its scores
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, S, 4, 16] qp, float[2, S, 4, 16] kp, float[2, S, 4, 16] vp, int64[2, S] am)
    => (float[2, S, 4, 16] y)
    <float half = {0.5}, float one = {1.0}, float zero = {0.0}, float ninf = {-3.4e38},
     int64 i0 = {0}, int64 i1 = {1}, int64[1] ax0 = {0}, int64[2] ax12 = {1, 2},
     int64[1] ax1 = {1}, int64[1] at1 = {1}, int64[1] at2 = {2}> {
  q = Transpose <perm = [0, 2, 1, 3]> (qp)
  k = Transpose <perm = [0, 2, 1, 3]> (kp)
  v = Transpose <perm = [0, 2, 1, 3]> (vp)
  pad = Cast <to = 9> (am)
  pad4 = Unsqueeze(pad, ax12)
"""
SDPA = """  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  qs = Mul(q, half)
  ks = Mul(kt, half)
  s = MatMul(qs, ks)
  u = Add(s, a)
  p = Softmax <axis = -1> (u)
  o = MatMul(p, v)
  y = Transpose <perm = [0, 2, 1, 3]> (o)
}"""
# an encoder's mask: the padding alone, (2, 1, 1, S), to 0 / -inf
ENCODER = HEAD + "  a = Where(pad4, zero, ninf)\n" + SDPA
# the legacy additive form: (1 - mask) * min
LEGACY = HEAD + """  fm = Cast <to = 1> (pad4)
  inv = Sub(one, fm)
  a = Mul(inv, ninf)
""" + SDPA
# a decoder's: key position <= query position, and'ed with the padding, (2, 1, S, S)
DECODER_MASK = """  sh = Shape(qp)
  n = Gather <axis = 0> (sh, i1)
  pos = Range(i0, n, i1)
  kv = Unsqueeze(pos, ax0)
  qi = Unsqueeze(pos, ax1)
  band = LessOrEqual(kv, qi)
  vis = And(band, pad4)
  a = Where(vis, zero, ninf)
"""
DECODER = HEAD + DECODER_MASK + SDPA
# hand-written attention (the scores scaled, Hugging Face's eager attention): no SDPA call
HAND = DECODER.replace("  qs = Mul(q, half)\n  ks = Mul(kt, half)\n  s = MatMul(qs, ks)",
                       "  s0 = MatMul(q, kt)\n  s = Mul(s0, half)")
# per head (B x H = 8): 256 pairs, or 1 + ... + 16 = 136 visible; two products of 2 x 16
# FLOPs per pair, softmax 6, the mask's add 1 where it is read
EVERY_PAIR = 8 * 256 * (2 * 2 * 16 + 6)
CAUSAL = 8 * 136 * (2 * 2 * 16 + 6)
QKV_OUT_BYTES = 4 * 2 * 16 * 4 * 16 * 4


@pytest.mark.parametrize(("text", "flops", "builders"), [
    # the views between them (Unsqueeze) stay views
    (ENCODER, EVERY_PAIR, 2),  # Cast, Where: unmasked
    (LEGACY, EVERY_PAIR, 4),  # Cast, Cast, Sub, Mul
    (DECODER, CAUSAL, 4),  # Cast, LessOrEqual, And, Where (the Range is host-side): causal
])
@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_an_unpadded_batch_passes_sdpa_no_mask(text: str, flops: int, builders: int,
                                               runtime: str) -> None:
    f = run(text, runtime)
    # a CUDA-graph capture cannot read a check back (a host sync): its model is called
    # without an attention mask, which Hugging Face skips unchecked
    assert ops(f) == (["Attention", "ReduceSum"] if runtime == "eager" else ["Attention"])
    att = attention(f)
    assert att.cost.flops == flops and att.cost.bytes == QKV_OUT_BYTES
    assert att.cost.matmul.causal is (flops == CAUSAL)
    assert reasons(f, UNPADDED) == builders


def test_one_reduction_checks_the_input_first() -> None:
    f = run(DECODER)
    check = f.kernels[0].kernel
    assert (check.op_type, check.name) == ("ReduceSum", "am/padding_check")
    assert check.cost.bytes == 2 * 16 * 8 + 8  # the (2, 16) int64 input, one int64 out


def test_a_graph_runtime_builds_the_padding_mask() -> None:
    # the engine computes the mask from whatever the input holds: its kernels stay
    f = run(ENCODER, "graph")
    assert "Cast" in ops(f) and "ReduceSum" not in ops(f)
    assert reasons(f, UNPADDED) == 0


def test_hand_written_attention_builds_its_mask_under_eager() -> None:
    # Hugging Face skips masks for SDPA only: its eager attention adds the mask it builds
    f = run(HAND)
    assert "Attention" not in ops(f) and "ReduceSum" not in ops(f)
    assert {"Cast", "LessOrEqual", "And", "Where"} <= set(ops(f))
    assert reasons(f, UNPADDED) == 0


def test_a_mask_read_elsewhere_is_still_built() -> None:
    # the boolean mask is also a graph output: written whatever the kernel reads
    text = DECODER.replace("=> (float[2, S, 4, 16] y)",
                           "=> (float[2, S, 4, 16] y, bool[2, 1, S, S] vis)")
    f = run(text)
    assert attention(f).cost.matmul.causal
    assert {"Cast", "LessOrEqual", "And"} <= set(ops(f)) and "Where" not in ops(f)


# ONNX Attention (opset 23, an ``--attn sdpa`` export) given the padding as a boolean mask:
# no conversion kernel and no mask read once it is not passed
OP = """
<ir_version: 10, opset_import: ["" : 23]>
g (float[2, 4, S, 16] q, float[2, 4, S, 16] k, float[2, 4, S, 16] v, int64[2, S] am)
    => (float[2, 4, S, 16] y) <int64[2] ax12 = {1, 2}> {
  pad = Cast <to = 9> (am)
  pad4 = Unsqueeze(pad, ax12)
  y = Attention(q, k, v, pad4)
}"""


@pytest.mark.parametrize(("runtime", "kernels"), [
    ("eager", ["Attention", "ReduceSum"]),
    ("graph", ["Attention", "Cast"]),  # the engine's kernel reads the boolean mask
])
def test_an_onnx_attention_s_padding_mask(runtime: str, kernels: list[str]) -> None:
    f = run(OP, runtime)
    assert ops(f) == kernels
    att = attention(f)
    assert not att.cost.matmul.causal
    read = QKV_OUT_BYTES + (2 * 16 if runtime == "graph" else 0)  # (2, 1, 1, 16) bool
    assert att.cost.bytes == read


def test_only_the_mask_s_input_is_checked() -> None:
    # a second rank-2 integer input that reaches no mask (token ids): not checked
    text = DECODER.replace("int64[2, S] am)", "int64[2, S] am, int64[2, S] ids)").replace(
        "=> (float[2, S, 4, 16] y)", "=> (float[2, S, 4, 16] y, float[2, S] e)").replace(
        "  pad = Cast", "  e = Cast <to = 1> (ids)\n  pad = Cast")
    f = run(text)
    assert [k.kernel.name for k in f.kernels if k.kernel.op_type == "ReduceSum"] == \
        ["am/padding_check"]


# a prompt of S = 16 queries after T - S = 16 cached keys (T = 32 keys): the band is
# bottom-right aligned, and Hugging Face builds the mask (it skips one only for as many
# queries as keys, or one query)
CACHED = (DECODER.replace("float[2, S, 4, 16] kp, float[2, S, 4, 16] vp, int64[2, S] am",
                          "float[2, T, 4, 16] kp, float[2, T, 4, 16] vp, int64[2, T] am")
          .replace("  pos = Range(i0, n, i1)\n  kv = Unsqueeze(pos, ax0)\n"
                   "  qi = Unsqueeze(pos, ax1)",
                   "  shk = Shape(kp)\n  nk = Gather <axis = 0> (shk, i1)\n  first = Sub(nk, n)\n"
                   "  qpos = Range(first, nk, i1)\n  kpos = Range(i0, nk, i1)\n"
                   "  kv = Unsqueeze(kpos, ax0)\n  qi = Unsqueeze(qpos, ax1)"))


def test_a_prompt_after_cached_keys_keeps_its_mask() -> None:
    f = tilecast.analyze(onnx.parser.parse_model(CACHED), "a100-sxm4-40gb",
                         predictor="roofline", dims={"S": 16, "T": 32})
    att = attention(f)
    assert not att.cost.matmul.causal and (att.cost.matmul.m, att.cost.matmul.n) == (16, 32)
    assert "ReduceSum" not in ops(f) and reasons(f, UNPADDED) == 0


@pytest.mark.parametrize("text", [ENCODER, LEGACY, DECODER])
def test_the_downstream_pass_agrees_with_a_full_one(text: str) -> None:
    from tilecast.analyzer.causal import abstract_values
    from tilecast.analyzer.graph import build_graph

    model = onnx.parser.parse_model(text)
    nodes = build_graph(model, {"S": 16}).nodes
    base = abstract_values(model, nodes)
    assert abstract_values(model, nodes, ones=("am",), base=base) == \
        abstract_values(model, nodes, ones=("am",))


def test_a_mask_hiding_every_pair_is_no_skipped_mask() -> None:
    # the input's ones taken as what to hide: all ones would hide every pair, which is no
    # mask Hugging Face drops, so it is built and read as exported
    f = run(ENCODER.replace("pad = Cast <to = 9> (am)", "pad = Equal(am, i0)"))
    assert "ReduceSum" not in ops(f) and reasons(f, UNPADDED) == 0
    assert attention(f).cost.bytes > QKV_OUT_BYTES
