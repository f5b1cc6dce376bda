"""Eager attention (MatMul, scale, mask, softmax, MatMul) runs as one fused attention kernel
under the graph runtime (TensorRT's fused attention, ONNX Runtime's attention fusion,
FlashAttention in the LLM engines); eager PyTorch, a CUDA-graph replay and training keep each
op a kernel."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.attention_fusion import FUSED_ATTENTION

# B 2, H 4, S 8, D 16 in fp32: Q, K, V (2, 4, 8, 16), a padding mask (2, 1, 1, 8)
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v, float[2, 1, 1, 8] m)
    => (float[2, 4, 8, 16] y) <float scale = {0.25}> {
  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  s = MatMul(q, kt)
"""
PLAIN = HEAD + """  t = Mul(s, scale)
  u = Add(t, m)
  p = Softmax <axis = -1> (u)
  y = MatMul(p, v)
}"""
# the casts Hugging Face's Llama writes around its softmax (here to the fp32 it has: no-ops)
CASTS = HEAD + """  t = Mul(s, scale)
  u = Add(t, m)
  h = Cast <to = 1> (u)
  p = Softmax <axis = -1> (h)
  pc = Cast <to = 1> (p)
  y = MatMul(pc, v)
}"""
# the probabilities are also a graph output: they must reach DRAM, so nothing fuses
SHARED = PLAIN.replace("=> (float[2, 4, 8, 16] y)", "=> (float[2, 4, 8, 16] y, "
                       "float[2, 4, 8, 8] p)")
# softmax over the queries, not the keys: not attention
AXIS2 = PLAIN.replace("Softmax <axis = -1>", "Softmax <axis = 2>")

# scores = 8 heads x 8 x 8 = 512: QK^T 2*512*16, PV 2*512*16, softmax and mask 7 per score
FLOPS = 2 * 512 * 16 * 2 + 7 * 512
# Q, K, V 4,096 bytes each, the mask 64, the output 4,096; the scores stay on chip
BYTES = 4 * 4096 + 64


def _run(text: str, runtime: str = "graph", mode: str = "inference"):
    return tilecast.analyze(onnx.parser.parse_model(text), "a100-sxm4-40gb",
                            predictor="roofline", runtime=runtime, mode=mode)


def _ops(f) -> list[str]:
    return [k.kernel.op_type for k in f.kernels]


def _fused(f) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == FUSED_ATTENTION)


# CASTS: both casts are to the fp32 the graph already has, so they copy nothing
# (cast_fusion.drop_noop_casts) and the chain walks past them as views
@pytest.mark.parametrize(("text", "members"), [(PLAIN, 5), (CASTS, 5)])
def test_graph_runtime_runs_eager_attention_as_one_kernel(text: str, members: int) -> None:
    f = _run(text)
    assert "Softmax" not in _ops(f) and _ops(f).count("Attention") == 1
    (att,) = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    assert att.cost.family == "attention"
    assert (att.cost.flops, att.cost.bytes) == (FLOPS, BYTES)
    mm = att.cost.matmul
    assert (mm.b, mm.m, mm.n, mm.k) == (8, 8, 8, 16)
    assert _fused(f) == members  # K's transpose (the kernel reads K), QK^T, scale, add, softmax


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_pytorch_runtimes_keep_each_op(runtime: str) -> None:
    f = _run(PLAIN, runtime=runtime)
    assert "Softmax" in _ops(f) and "Attention" not in _ops(f) and _fused(f) == 0


@pytest.mark.parametrize("text", [SHARED, AXIS2])
def test_a_chain_that_is_not_attention_alone_stays_apart(text: str) -> None:
    f = _run(text)
    assert "Softmax" in _ops(f) and _fused(f) == 0


# masked_fill(pad == 0, -inf) over a (2, 1, 1, 8) bool padding mask: Where(cond, fill, scores)
# or Where(keep, scores, fill); the kernel reads the condition (16 bytes) instead of an added
# float mask (64), the same 7 FLOPs per score
FILLS = PLAIN.replace("float[2, 1, 1, 8] m", "bool[2, 1, 1, 8] m, float[2, 4, 8, 8] x").replace(
    "<float scale = {0.25}>", "<float scale = {0.25}, float ninf = {-3.4e38}>")


@pytest.mark.parametrize(("where", "fused"), [
    ("u = Where(m, ninf, t)", True),
    ("u = Where(m, t, ninf)", True),
    ("u = Where(m, t, x)", False),  # a second tensor selected in: it would be read too
])
def test_a_masked_fill_of_the_scores_runs_in_the_kernel(where: str, fused: bool) -> None:
    f = _run(FILLS.replace("u = Add(t, m)", where))
    atts = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    if fused:
        assert [(a.cost.flops, a.cost.bytes) for a in atts] == [(FLOPS, 4 * 4096 + 16)]
        assert _fused(f) == 5
    else:
        assert atts == [] and "Softmax" in _ops(f)


# torch SDPA's math path as torch.onnx writes it: the probabilities zeroed where NaN (fully
# masked rows), Where(IsNaN(p), 0, p), before P @ V; the fused kernel does that itself
GUARD = ("  y = MatMul(p, v)", "  nan = IsNaN(p)\n  pg = Where(nan, zero, p)\n  y = MatMul(pg, v)")
GUARDED = PLAIN.replace("<float scale = {0.25}>", "<float scale = {0.25}, float zero = {0.0}>")


@pytest.mark.parametrize(("guard", "fused"), [
    (GUARD, 7),  # K's transpose, QK^T, scale, mask add, softmax, IsNaN, Where
    (("pg = Where(nan, zero, p)", "pg = Where(nan, v, p)"), 0),  # a tensor selected in
    (("y = MatMul(pg, v)", "y = MatMul(pg, v)\n  w = Not(nan)"), 0),  # the test read again
])
def test_the_nan_guard_on_the_probabilities_runs_in_the_kernel(guard, fused: int) -> None:
    text = GUARDED.replace(*GUARD).replace(*guard)
    if fused == 0 and "Not" in text:
        text = text.replace("=> (float[2, 4, 8, 16] y)", "=> (float[2, 4, 8, 16] y, "
                            "bool[2, 4, 8, 8] w)")
    f = _run(text)
    atts = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    assert _fused(f) == fused
    if fused:
        assert [(a.cost.flops, a.cost.bytes) for a in atts] == [(FLOPS, BYTES)]
    else:
        assert atts == [] and "Softmax" in _ops(f)


# torch's SDPA decomposition as torch.onnx's dynamo exporter writes it: sqrt(scale) on Q and
# on K^T before the product, and the boolean mask turned into 0 / -inf by a Where in every
# layer, then added. The kernel folds both scales into its score scale and builds the mask
# from the condition: it reads Q, K^T, V (4,096 bytes each) and the condition (16), as a
# masked_fill does, and writes the output (4,096)
SDPA = (PLAIN.replace("float[2, 1, 1, 8] m", "bool[2, 1, 1, 8] m")
        .replace("<float scale = {0.25}>",
                 "<float rs = {0.5}, float zero = {0.0}, float ninf = {-3.4e38}, "
                 "float[16] dim = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "
                 "1.0, 1.0, 1.0, 1.0}, float[8] key = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}>")
        .replace("  s = MatMul(q, kt)\n  t = Mul(s, scale)\n  u = Add(t, m)",
                 "  qs = Mul(q, rs)\n  ks = Mul(rs, kt)\n  s = MatMul(qs, ks)\n"
                 "  a = Where(m, zero, ninf)\n  u = Add(s, a)"))


def _outputs(text: str, *extra: str) -> str:
    return text.replace("=> (float[2, 4, 8, 16] y)", "=> (" + ", ".join(
        ("float[2, 4, 8, 16] y", *extra)) + ")")


@pytest.mark.parametrize(("text", "ops", "fused", "bytes_"), [
    # K's transpose, Mul q, Mul k, QK^T, Where, Add, Softmax: the kernel reads K
    (SDPA, ["Attention"], 7, 4 * 4096 + 16),
    # the scaled Q is also an output: it is written, and the kernel reads it
    (_outputs(SDPA, "float[2, 4, 8, 16] qs"), ["Mul", "Attention"], 6,
     4 * 4096 + 16),
    # the 0 / -inf mask is also an output: built once and read as floats (2 x 8 x 4 bytes)
    (_outputs(SDPA, "float[2, 1, 1, 8] a"), ["Where", "Attention"], 6,
     4 * 4096 + 64),
    # a scale per channel is not one value, nor is a per-key bias selected in: both stay
    # kernels, and the kernel reads the Where's floats
    (SDPA.replace("qs = Mul(q, rs)", "qs = Mul(q, dim)")
     .replace("Where(m, zero, ninf)", "Where(m, key, ninf)"),
     ["Mul", "Where", "Attention"], 5, 4 * 4096 + 64),
])
def test_sdpa_scales_and_mask_run_in_the_kernel(text: str, ops: list[str], fused: int,
                                                bytes_: int) -> None:
    f = _run(text)
    assert sorted(_ops(f)) == sorted(ops) and _fused(f) == fused
    (att,) = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    assert (att.cost.flops, att.cost.bytes) == (FLOPS, bytes_)


def test_training_keeps_each_op() -> None:
    # a trainable weight (a query projection) so that the step has something to train
    weights = "<float scale = {0.25}, float[16, 16] w = {0.0}>"
    text = (PLAIN.replace("<float scale = {0.25}>", weights)
            .replace("  s = MatMul(q, kt)", "  qw = MatMul(q, w)\n  s = MatMul(qw, kt)"))
    assert "Attention" in _ops(_run(text)) and "Softmax" in _ops(_run(text, mode="training"))


def test_fused_attention_is_faster_than_its_ops_on_long_sequences() -> None:
    # 16 heads of 64 over 2,048 tokens: the unfused chain writes and reads 268 MB of scores
    text = (PLAIN.replace("[2, 4, 8, 16]", "[1, 16, 2048, 64]")
            .replace("[2, 1, 1, 8]", "[1, 1, 1, 2048]"))
    graph, eager = _run(text), _run(text, runtime="cudagraph")
    assert graph.total_ms < 0.5 * eager.total_ms


def test_the_report_names_the_fused_nodes() -> None:
    from tilecast.report import render

    text = render(_run(PLAIN), "table")
    assert "in a fused attention kernel 5" in text
