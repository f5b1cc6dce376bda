"""A causal mask a fused attention kernel applies by index costs nothing to build
(mask_builders.py): torch.onnx's spelling of ``is_causal=True`` under eager PyTorch, and any
causal mask built from positions alone under a graph runtime. A mask a model passes as
``attn_mask`` stays an explicit mask under eager PyTorch: every pair, its kernels kept."""

from __future__ import annotations

import pytest
from attention_helpers import attention, ops, reasons, run

from tilecast.analyzer.attention_fusion import SDPA_CALL
from tilecast.analyzer.costs.zero import SHAPE_ONLY
from tilecast.analyzer.mask_builders import CAUSAL_BY_INDEX

# B 2, H 4, S 16 (bound at analysis: a mask of constants alone is folded at load, and one of
# up to 100 elements is host arithmetic, fold.py), D 16 in fp32, sqrt(1 / sqrt(16)) = 0.5 on
# Q and on K^T. torch.onnx's TorchScript symbolic for is_causal=True: ones(L, S) with L, S
# read from Q's and K's shapes, tril, == 0, filled with -inf (0 elsewhere), added to the
# scores
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, S, 4, 16] qp, float[2, S, 4, 16] kp, float[2, S, 4, 16] vp) => (float[2, S, 4, 16] y)
    <float half = {0.5}, float one = {1.0}, float zero = {0.0}, float ninf = {-3.4e38},
     bool yes = {1}, int64[1] m2 = {-2}, int64[1] m1 = {-1}> {
  q = Transpose <perm = [0, 2, 1, 3]> (qp)
  k = Transpose <perm = [0, 2, 1, 3]> (kp)
  v = Transpose <perm = [0, 2, 1, 3]> (vp)
  qsh = Shape(q)
  ksh = Shape(k)
  ql = Slice(qsh, m2, m1)
  kl = Slice(ksh, m2, m1)
  size = Concat <axis = 0> (ql, kl)
"""
IS_CAUSAL = """  ones = Expand(one, size)
  tri = Trilu <upper = 0> (ones)
  hid = Equal(tri, zero)
  cm = Where(hid, ninf, zero)
"""
# the model's own tril of a boolean ones(L, S), passed as attn_mask: torch.onnx turns a
# boolean mask into 0 / -inf with Where(mask, 0, -inf)
OWN_MASK = """  ones = Expand(yes, size)
  tri = Trilu <upper = 0> (ones)
  cm = Where(tri, zero, ninf)
"""
TAIL = """  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  qs = Mul(q, half)
  ks = Mul(kt, half)
  s = MatMul(qs, ks)
  u = Add(s, cm)
  p = Softmax <axis = -1> (u)
  o = MatMul(p, v)
  y = Transpose <perm = [0, 2, 1, 3]> (o)
}"""
# per head (B x H = 8 of them) 1 + 2 + ... + 16 = 136 visible pairs of 256; two products of
# 2 x 16 FLOPs per pair, softmax 6 per pair, and the mask's add 1 per pair where it is read
CAUSAL_FLOPS = 8 * 136 * (2 * 2 * 16 + 6)
EVERY_PAIR_FLOPS = 8 * 256 * (2 * 2 * 16 + 6 + 1)
QKV_OUT_BYTES = 4 * 2 * 16 * 4 * 16 * 4  # Q, K, V and the output, fp32
MASK_BYTES = 16 * 16 * 4  # the (16, 16) fp32 mask


@pytest.mark.parametrize("runtime", ["eager", "cudagraph", "graph"])
def test_exported_is_causal_is_one_causal_kernel_and_no_mask(runtime: str) -> None:
    f = run(HEAD + IS_CAUSAL + TAIL, runtime)
    assert ops(f) == ["Attention"]
    att = attention(f)
    assert att.cost.matmul.causal and att.cost.flops == CAUSAL_FLOPS
    assert att.cost.bytes == QKV_OUT_BYTES  # the kernel masks by index: no mask read
    # Expand, Trilu, Equal and Where (a member of the fused chain under the graph runtime)
    assert reasons(f, CAUSAL_BY_INDEX) == (4 if runtime != "graph" else 3)


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_a_mask_the_model_passes_stays_under_pytorch(runtime: str) -> None:
    f = run(HEAD + OWN_MASK + TAIL, runtime)
    # PyTorch builds the mask (ones, tril, the boolean-to-additive conversion) and its
    # kernel reads it for every pair
    assert ops(f) == ["Attention", "Expand", "Trilu", "Where"]
    att = attention(f)
    assert not att.cost.matmul.causal and att.cost.flops == EVERY_PAIR_FLOPS
    assert att.cost.bytes == QKV_OUT_BYTES + MASK_BYTES
    assert reasons(f, CAUSAL_BY_INDEX) == 0


def test_a_graph_runtime_drops_any_causal_mask_it_applies_by_index() -> None:
    f = run(HEAD + OWN_MASK + TAIL, "graph")
    assert ops(f) == ["Attention"] and attention(f).cost.flops == CAUSAL_FLOPS
    assert reasons(f, CAUSAL_BY_INDEX) == 2  # Expand, Trilu (the Where is in the chain)


def test_a_mask_builder_read_elsewhere_stays() -> None:
    # the tril is also a graph output: it is written whatever the kernel reads
    text = (HEAD + IS_CAUSAL + TAIL).replace(
        "=> (float[2, S, 4, 16] y)", "=> (float[2, S, 4, 16] y, float[S, S] tri)")
    f = run(text)
    assert ops(f) == ["Attention", "Expand", "Trilu"]
    assert attention(f).cost.flops == CAUSAL_FLOPS
    assert reasons(f, CAUSAL_BY_INDEX) == 2  # Equal, Where


def test_a_padding_mask_and_ed_in_is_built_under_a_graph_runtime() -> None:
    # the band and'ed with a padding mask read from an input: the kernel skips what lies
    # outside the band, but the padding is data: the And that combines them stays
    text = (HEAD + OWN_MASK.replace("cm = Where(tri, zero, ninf)",
                                    "vis = And(tri, pad)\n  cm = Where(vis, zero, ninf)")
            + TAIL).replace("float[2, S, 4, 16] vp)",
                            "float[2, S, 4, 16] vp, bool[2, 1, 1, S] pad)")
    f = run(text, "graph")
    assert "And" in ops(f) and attention(f).cost.matmul.causal
    assert reasons(f, CAUSAL_BY_INDEX) == 0


# the TorchScript exporter's optimizer merges K's heads permute into K^T's (0, 2, 3, 1): the
# (B, H, S, D) K it still writes is read by the mask's Shape alone
MERGED = (HEAD + IS_CAUSAL + TAIL).replace(
    "  kt = Transpose <perm = [0, 1, 3, 2]> (k)", "  kt = Transpose <perm = [0, 2, 3, 1]> (kp)")


@pytest.mark.parametrize(("runtime", "members"), [
    ("eager", 5),  # Mul, Mul, QK^T, Add, Softmax
    ("graph", 7),  # ... and the K^T Transpose, the Where
])
def test_a_transpose_only_a_shape_reads_is_no_kernel(runtime: str, members: int) -> None:
    f = run(MERGED, runtime)
    assert ops(f) == ["Attention"]
    assert reasons(f, SHAPE_ONLY) == 1
    if runtime == "eager":
        assert reasons(f, SDPA_CALL) == members + 1  # the merged K^T permute
