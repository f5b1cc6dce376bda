"""Views: the Transpose/Split/Slice nodes a runtime runs without a copy kernel."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.forecast import Forecast
from tilecast.analyzer.views import (
    FOLDED_TRANSPOSE,
    VIEW_SPLIT,
    VIEW_TRANSPOSE,
    _gemm_reads_in_place,
)

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'

# Attention scores q @ k^T with k^T a last-two-dims Transpose: cuBLAS reads k transposed.
KT = HEADER + """
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k) => (float[2, 4, 8, 8] y) {
  kt = Transpose<perm = [0, 1, 3, 2]>(k)
  y = MatMul(q, kt)
}"""

# The same Transpose also feeds an Add: that consumer needs the transposed values: a copy.
KT_ALSO_ADD = HEADER + """
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 16, 8] b) => (float[2, 4, 8, 8] y,
    float[2, 4, 16, 8] z) {
  kt = Transpose<perm = [0, 1, 3, 2]>(k)
  y = MatMul(q, kt)
  z = Add(kt, b)
}"""

# permute(0, 2, 1, 3) before the output projection: PyTorch needs contiguous() there: a copy.
HEADS = HEADER + """
g (float[2, 4, 8, 16] a, float[64, 64] w) => (float[2, 8, 64] y) {
  p = Transpose<perm = [0, 2, 1, 3]>(a)
  s = Constant<value = int64[3] {2, 8, 64}>()
  r = Reshape(p, s)
  y = MatMul(r, w)
}"""

# A transpose that is a graph output is materialized.
KT_OUT = HEADER + """
g (float[2, 4, 8, 16] k) => (float[2, 4, 16, 8] kt) {
  kt = Transpose<perm = [0, 1, 3, 2]>(k)
}"""

# GPT-2's fused QKV: split(3 * 64, dim=-1) -> view(B, S, heads, head_dim) per chunk.
QKV = HEADER + """
g (float[2, 8, 192] x) => (float[2, 8, 4, 16] q, float[2, 8, 4, 16] k, float[2, 8, 4, 16] v) {
  sizes = Constant<value = int64[3] {64, 64, 64}>()
  a, b, c = Split<axis = 2>(x, sizes)
  s = Constant<value = int64[4] {2, 8, 4, 16}>()
  q = Reshape(a, s)
  k = Reshape(b, s)
  v = Reshape(c, s)
}"""

# Rotary's x[..., :8] sliced along the last dim, then multiplied (TensorIterator: strided ok).
SLICE_MUL = HEADER + """
g (float[2, 8, 16] x, float[2, 8, 8] c) => (float[2, 8, 8] y) {
  st = Constant<value = int64[1] {0}>()
  en = Constant<value = int64[1] {8}>()
  ax = Constant<value = int64[1] {-1}>()
  h = Slice(x, st, en, ax)
  y = Mul(h, c)
}"""

# A Split along a leading dim changes the outer shape: not a last-dim view here.
SPLIT_ROWS = HEADER + """
g (float[8, 16] x) => (float[4, 16] a, float[4, 16] b) {
  sizes = Constant<value = int64[2] {4, 4}>()
  p, q = Split<axis = 0>(x, sizes)
  a = Relu(p)
  b = Relu(q)
}"""

# Concat of a last-dim slice: torch.cat copies anyway, and Concat is not a strided consumer.
SLICE_CONCAT = HEADER + """
g (float[2, 8, 16] x) => (float[2, 8, 24] y) {
  st = Constant<value = int64[1] {0}>()
  en = Constant<value = int64[1] {8}>()
  ax = Constant<value = int64[1] {-1}>()
  h = Slice(x, st, en, ax)
  y = Concat<axis = -1>(h, x)
}"""


def _forecast(text: str, runtime: str = "eager") -> Forecast:
    return tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline",
                            runtime=runtime)


def _costed(f: Forecast) -> list[str]:
    return [k.kernel.op_type for k in f.kernels]


def _reasons(f: Forecast) -> dict[str, str]:
    return {z.op_type: z.reason for z in f.zero_cost_reasons}


@pytest.mark.parametrize("text, op, reason", [
    (KT, "Transpose", VIEW_TRANSPOSE),
    (QKV, "Split", VIEW_SPLIT),
    (SLICE_MUL, "Slice", VIEW_SPLIT),
])
def test_eager_views_are_zero_cost_with_a_reason(text, op, reason):
    f = _forecast(text)
    assert op not in _costed(f)
    assert _reasons(f)[op] == reason


@pytest.mark.parametrize("text, op", [
    (KT_ALSO_ADD, "Transpose"),  # one consumer needs the values
    (HEADS, "Transpose"),        # permute(0, 2, 1, 3) + contiguous(): a real copy
    (KT_OUT, "Transpose"),       # graph output
    (SPLIT_ROWS, "Split"),       # not along the last dim
    (SLICE_CONCAT, "Slice"),     # consumer not in the strided set
])
def test_real_copies_stay_costed(text, op):
    f = _forecast(text)
    assert op in _costed(f)
    assert op not in _reasons(f)


# A 2-D weight transposed for Gemm's C input (the bias): not an operand the GEMM can flag.
GEMM_C = HEADER + """
g (float[8, 16] a, float[16, 8] b, float[8, 8] c) => (float[8, 8] y) {
  ct = Transpose<perm = [1, 0]>(c)
  y = Gemm(a, b, ct)
}"""


@pytest.mark.parametrize("text, op", [
    (QKV, "Split"),             # XLA and TensorRT buffers are dense; ORT runs Split
    (SLICE_MUL, "Slice"),
    (KT_ALSO_ADD, "Transpose"),  # one consumer needs the values
    (KT_OUT, "Transpose"),       # graph output
    (GEMM_C, "Transpose"),       # feeds the bias, not an operand
])
def test_graph_runtime_keeps_the_copies(text, op):
    f = _forecast(text, runtime="graph")
    assert op in _costed(f)
    assert op not in _reasons(f)


def test_graph_runtime_folds_a_last_two_swap_into_the_gemm():
    # XLA's TransposeFolding, ORT's MatmulTransposeFusion, TensorRT's kTRANSPOSE operand.
    f = _forecast(KT, runtime="graph")
    assert "Transpose" not in _costed(f)
    assert _reasons(f)["Transpose"] == FOLDED_TRANSPOSE


def test_views_lower_the_eager_forecast():
    eager, graph = _forecast(QKV), _forecast(QKV, runtime="graph")
    assert len(eager.kernels) == len(graph.kernels) - 1


# GPT-2/BERT attention heads: permute(0, 2, 1, 3) of q and k, then k.transpose(-1, -2).
def _heads(batch: int) -> str:
    return HEADER + f"""
g (float[{batch}, 8, 4, 16] q, float[{batch}, 8, 4, 16] k) => (float[{batch}, 4, 8, 8] y) {{
  qp = Transpose<perm = [0, 2, 1, 3]>(q)
  kp = Transpose<perm = [0, 2, 1, 3]>(k)
  kt = Transpose<perm = [0, 1, 3, 2]>(kp)
  y = MatMul(qp, kt)
}}"""


@pytest.mark.parametrize("batch, costed", [
    # batch 1: the head dim is the only batch dim: a strided batched GEMM reads q and k^T
    (1, 0),
    # batch 2: torch.matmul's reshape to (B * heads, S, D) cannot merge B and heads (strides
    # S*H*D and D): it copies q and k once each; the last-two swap of k stays a view
    (2, 2),
])
def test_permuted_heads_are_views_only_where_matmul_can_fold_them(batch, costed):
    f = _forecast(_heads(batch))
    assert _costed(f).count("Transpose") == costed
    assert sum(z.count for z in f.zero_cost_reasons if z.reason == VIEW_TRANSPOSE) == 3 - costed


def test_graph_runtime_copies_permuted_heads_even_at_batch_1():
    # eager reads all three in place at batch 1; ORT's fusion takes last-two swaps only, so a
    # graph runtime runs the (0, 2, 1, 3) permutes of q and k and folds k's last-two swap
    f = _forecast(_heads(1), runtime="graph")
    assert _costed(f).count("Transpose") == 2
    assert sum(z.count for z in f.zero_cost_reasons if z.reason == FOLDED_TRANSPOSE) == 1


@pytest.mark.parametrize("shape, perm, in_place", [
    ((2, 4, 8, 16), (0, 1, 3, 2), True),   # last-two swap: op(B) = transposed
    ((2, 4, 8, 16), (0, 1, 2, 3), True),   # identity
    ((2, 8, 4, 16), (0, 2, 1, 3), False),  # batch strides 512 and 16 do not merge
    ((1, 8, 4, 16), (0, 2, 1, 3), True),   # batch 1: one batch dim left, rows stride 64 >= 16
    ((1, 8, 4, 16), (0, 2, 3, 1), True),   # k^T of the above: unit-stride rows, ld 64 >= 16
    ((4, 8, 16), (1, 0, 2), True),         # one batch dim (stride 16), rows ld 128 >= 16
    ((2, 3, 8, 16), (1, 0, 2, 3), False),  # batch dims swapped: strides 128, 384 do not merge
    ((2, 8, 16), (2, 1, 0), False),        # no unit stride in the matrix (strides 8, 128)
])
def test_gemm_reads_in_place(shape, perm, in_place):
    assert _gemm_reads_in_place(shape, perm) is in_place
