"""Under the graph runtime a fused attention kernel reads its heads where the packed QKV
projection left them and writes its output in the layout the output projection reads: the
QKV Split and the head transposes around it are no copies (attention_layout.py)."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.attention_layout import LAYOUT_IN_KERNEL

# B 2, S 8, H 4, D 16 in fp32: GPT-2's layout. The packed projection (2, 8, 192) is split
# into Q, K, V (2, 8, 64), each viewed as (2, 8, 4, 16) and transposed to heads; the output
# (2, 4, 8, 16) is transposed back and viewed as (2, 8, 64).
PACKED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8, 192] x, float[2, 1, 1, 8] m) => (float[2, 8, 64] y)
    <int64[3] sp = {64, 64, 64}, int64[4] hs = {2, 8, 4, 16}, int64[3] os = {2, 8, 64},
     float scale = {0.25}> {
  q0, k0, v0 = Split <axis = 2> (x, sp)
  q1 = Reshape(q0, hs)
  k1 = Reshape(k0, hs)
  v1 = Reshape(v0, hs)
  q = Transpose <perm = [0, 2, 1, 3]> (q1)
  kt = Transpose <perm = [0, 2, 3, 1]> (k1)
  v = Transpose <perm = [0, 2, 1, 3]> (v1)
  s = MatMul(q, kt)
  t = Mul(s, scale)
  u = Add(t, m)
  p = Softmax <axis = -1> (u)
  o = MatMul(p, v)
  ot = Transpose <perm = [0, 2, 1, 3]> (o)
  y = Reshape(ot, os)
}"""
# a shape query reads no elements: the transpose it looks at still needs no copy
SHAPE = PACKED.replace("=> (float[2, 8, 64] y)", "=> (float[2, 8, 64] y, int64[4] n)") \
    .replace("  s = MatMul", "  n = Shape(q)\n  s = MatMul")
# Q viewed as (2, 8, 16, 4) and permuted so that D is no longer the contiguous axis: a copy
MOVED = PACKED.replace("q1 = Reshape(q0, hs)", "q1 = Reshape(q0, hq)") \
    .replace("<int64[3] sp", "<int64[4] hq = {2, 8, 16, 4}, int64[3] sp") \
    .replace("q = Transpose <perm = [0, 2, 1, 3]>", "q = Transpose <perm = [0, 3, 1, 2]>")
# V's heads are also a graph output: they reach DRAM, so their transpose and the Split stay
SHARED = PACKED.replace("=> (float[2, 8, 64] y)", "=> (float[2, 8, 64] y, float[2, 4, 8, 16] v)")

# Q, K, V 4,096 bytes each, the mask 64, the output 4,096, with or without the layout copies
KERNEL_BYTES = 4 * 4096 + 64


def _run(text: str, runtime: str = "graph"):
    return tilecast.analyze(onnx.parser.parse_model(text), "a100-sxm4-40gb",
                            predictor="roofline", runtime=runtime)


def _in_place(f) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == LAYOUT_IN_KERNEL)


@pytest.mark.parametrize(("text", "ops", "in_place"), [
    # the Split and the transposes of Q, V and the output; K^T's permute is part of the
    # fused kernel, which reads K (attention_layout.key_of)
    (PACKED, ["Attention"], 4),
    (SHAPE, ["Attention"], 4),
    # Q's permute is a copy, and so is the Split that feeds it
    (MOVED, ["Split", "Transpose", "Attention"], 2),
    (SHARED, ["Split", "Transpose", "Attention"], 2),  # Q and the output in place
])
def test_the_kernel_reads_and_writes_its_heads_in_place(text: str, ops: list[str],
                                                        in_place: int) -> None:
    f = _run(text)
    assert [k.kernel.op_type for k in f.kernels] == ops
    assert _in_place(f) == in_place
    attention = next(k.kernel for k in f.kernels if k.kernel.op_type == "Attention")
    assert attention.bytes == KERNEL_BYTES


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_pytorch_runtimes_keep_the_copies(runtime: str) -> None:
    f = _run(PACKED, runtime)
    assert _in_place(f) == 0 and "Transpose" in [k.kernel.op_type for k in f.kernels]


# An --attn sdpa export: Q, K, V (B, S, H, D) transposed to heads (K too: the op's K is
# (B, H, S, D)), and the output transposed back
SDPA_HEADS = """
<ir_version: 10, opset_import: ["" : 23]>
g (float16[1, 2048, 8, 64] q1, float16[1, 2048, 8, 64] k1, float16[1, 2048, 8, 64] v1)
  => (float16[1, 2048, 8, 64] y) <int64[4] hs = {1, 8, 2048, 64}> {
  q = Transpose <perm = [0, 2, 1, 3]> (q1)
  k = Transpose <perm = [0, 2, 1, 3]> (k1)
  v = Transpose <perm = [0, 2, 1, 3]> (v1)
  o = Attention(q, k, v)
  y = Transpose <perm = [0, 2, 1, 3]> (o)
}"""
# Q laid out so that its transpose moves the head dim
SDPA_EXPORT = SDPA_HEADS.replace("float16[1, 2048, 8, 64] q1", "float16[1, 64, 8, 2048] q1") \
    .replace("q = Transpose <perm = [0, 2, 1, 3]>", "q = Transpose <perm = [0, 2, 3, 1]>")


def test_an_onnx_attention_op_reads_its_heads_in_place() -> None:
    graph = _run(SDPA_HEADS)
    assert [k.kernel.op_type for k in graph.kernels] == ["Attention"] and _in_place(graph) == 4
    # the layouts cost nothing: the same op on heads laid out (B, H, S, D) takes as long
    bare = SDPA_HEADS.replace("[1, 2048, 8, 64]", "[1, 8, 2048, 64]").replace(
        "Transpose <perm = [0, 2, 1, 3]> ", "Identity")
    assert graph.total_ms == pytest.approx(_run(bare).total_ms, rel=1e-9)


# the dynamo exporter views the output back to the same dims before the transpose
VIEWED = SDPA_EXPORT.replace("y = Transpose <perm = [0, 2, 1, 3]> (o)",
                             "r = Reshape(o, hs)\n  y = Transpose <perm = [0, 2, 1, 3]> (r)")


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
@pytest.mark.parametrize("text", [SDPA_EXPORT, VIEWED])
def test_pytorch_sdpa_reads_strided_heads(runtime: str, text: str) -> None:
    # PyTorch's flash and memory-efficient SDPA kernels take Q, K, V at any strides but a
    # unit one on the head dim: the head transposes into the op are views (views.py), and
    # so is the transpose back of its (B, S, H, D) output; one that moves the head dim (Q
    # here) is a copy.
    f = _run(text, runtime)
    # unnamed nodes are named by position: q's transpose is node 0
    assert [(k.kernel.op_type, k.kernel.name) for k in f.kernels] == [
        ("Transpose", "Transpose_0"), ("Attention", "Attention_3")]
