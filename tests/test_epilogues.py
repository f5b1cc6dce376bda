"""Library epilogues under the graph runtime: a residual or bias add and a ReLU run inside the
conv kernel (cuDNN's fused conv-bias-activation, TensorRT's and XLA's fusions); eager
PyTorch and a CUDA-graph replay keep them as kernels."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.activations import FUSED_ACTIVATION
from tilecast.analyzer.epilogues import FUSED_EPILOGUE

HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 16, 32, 32] x) => (float[8, 16, 32, 32] y) <float[16, 16, 3, 3] w = {0.0},
    float[16] s = {1.0}, float[16] t = {0.0}, float[16] mu = {0.0}, float[16] var = {1.0},
    float[1, 16, 1, 1] bias = {0.0}, float[1, 1, 32, 32] plane = {0.0}> {
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
"""
X_BYTES = 8 * 16 * 32 * 32 * 4  # the residual the epilogue reads
# ResNet's block end: conv -> BN -> add the block input -> ReLU
RESIDUAL = HEAD + """  d = BatchNormalization(c, s, t, mu, var)
  e = Add(d, x)
  y = Relu(e)
}"""
BIAS = HEAD + "  e = Add(c, bias)\n  y = Relu(e)\n}"
PLANE = HEAD + "  e = Add(c, plane)\n  y = Relu(e)\n}"  # broadcast over N and C: not fusable
# the add's first operand is another conv made before this one: only the later conv fuses
TWO_CONVS = HEAD + """  c2 = Conv <pads = [1, 1, 1, 1]> (x, w)
  e = Add(c, c2)
  y = Relu(e)
}"""
SHARED = RESIDUAL.replace("float[8, 16, 32, 32] y)", "float[8, 16, 32, 32] y, "
                          "float[8, 16, 32, 32] e)")  # the pre-ReLU sum is also an output


def _run(text: str, runtime: str = "graph", mode: str = "inference", predictor="roofline"):
    return tilecast.analyze(onnx.parser.parse_model(text), "t4", predictor=predictor,
                            runtime=runtime, mode=mode)


def _ops(f) -> list[str]:
    return [k.kernel.op_type for k in f.kernels]


def _fused(f) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == FUSED_EPILOGUE)


@pytest.mark.parametrize("text, extra_bytes, fused", [
    (RESIDUAL, X_BYTES, 2),  # the block input is read in the epilogue
    (BIAS, 16 * 4, 2),  # one value per output channel
])
def test_graph_runtime_runs_the_add_and_relu_in_the_conv_epilogue(text, extra_bytes, fused):
    graph, eager = _run(text), _run(text, runtime="eager")
    assert _ops(graph) == ["Conv"] and _fused(graph) == fused
    conv, eager_conv = graph.kernels[0].kernel.cost, eager.kernels[0].kernel.cost
    assert conv.bytes - eager_conv.bytes == extra_bytes == conv.epilogue_bytes
    assert "Add" in _ops(eager) and "Relu" in _ops(eager)
    assert graph.total_ms < eager.total_ms


def test_a_broadcast_add_is_not_an_epilogue_and_the_relu_after_it_stays():
    assert _ops(_run(PLANE)) == ["Conv", "Add", "Relu"]


def test_only_the_conv_made_after_the_other_operand_fuses_the_add():
    f = _run(TWO_CONVS)
    assert _ops(f) == ["Conv", "Conv"] and _fused(f) == 2
    first, second = (k.kernel.cost for k in f.kernels)
    assert second.epilogue_bytes == X_BYTES and first.epilogue_bytes == 0


def test_a_sum_another_node_reads_is_written_and_its_relu_runs_alone():
    f = _run(SHARED)
    assert _ops(f) == ["Conv", "Relu"] and _fused(f) == 1


@pytest.mark.parametrize("runtime, mode", [("eager", "inference"), ("cudagraph", "inference"),
                                           ("graph", "training")])
def test_pytorch_kernels_and_training_keep_the_epilogue_ops(runtime, mode):
    assert {"Add", "Relu"} <= set(_ops(_run(RESIDUAL, runtime=runtime, mode=mode)))


def test_the_learned_conv_pays_for_the_residual_it_reads():
    # same conv, same ReLU: the residual's read reaches the conv model's bytes and adds time
    plain = _run(HEAD + "  y = Relu(c)\n}", predictor="learned")
    residual = _run(RESIDUAL, predictor="learned")
    assert _ops(plain) == _ops(residual) == ["Conv"]
    assert residual.kernels[0].latency_ms > plain.kernels[0].latency_ms > 0


GEMM = """
<ir_version: 9, opset_import: ["" : 20]>
g (float[256, 64] x, float[128, 64] q, float[64, 256] kt) => (float[256, 64] y) <
    float[64, 64] w = {0.0}, float[64] b = {0.0}, float c = {8.0},
    float[128, 1] mask = {0.0}> {
"""
# fc1: MatMul -> bias (folded into the GEMM at every runtime) -> GELU (cuBLASLt GELU_BIAS)
GEMM_GELU = GEMM + "  h = MatMul(x, w)\n  hb = Add(h, b)\n  y = Gelu(hb)\n}"
# an output projection: MatMul -> add the block input (beta C)
GEMM_RESIDUAL = GEMM + "  h = MatMul(x, w)\n  y = Add(h, x)\n}"
# attention scores: / sqrt(d) is alpha; a per-row mask is neither a bias (one value per
# column, which cuBLASLt's BIAS epilogue adds) nor a tensor of the output's shape
SCORES = GEMM.replace("float[256, 64] y)", "float[128, 256] y)") + """  s = MatMul(q, kt)
  t = Div(s, c)
  u = Add(t, mask)
  y = Softmax(u)
}"""
INVERSE = SCORES.replace("t = Div(s, c)", "t = Div(c, s)")  # c / s is no alpha


@pytest.mark.parametrize("text, ops, fused, epilogue_bytes", [
    (GEMM_GELU, ["MatMul"], 1, 0),
    (GEMM_RESIDUAL, ["MatMul"], 1, 256 * 64 * 4),
    (SCORES, ["MatMul", "Add", "Softmax"], 1, 0),
    (INVERSE, ["MatMul", "Div", "Add", "Softmax"], 0, 0),
])
def test_gemm_epilogues_take_alpha_beta_c_and_the_activation(text, ops, fused, epilogue_bytes):
    f = _run(text)
    assert _ops(f) == ops and _fused(f) == fused
    assert f.kernels[0].kernel.cost.epilogue_bytes == epilogue_bytes
    assert len(_run(text, runtime="eager").kernels) == len(ops) + fused


def test_a_conv_epilogue_takes_relu_but_not_gelu():
    gelu = HEAD.replace('"" : 17', '"" : 20') + "  y = Gelu(c)\n}"
    assert _ops(_run(gelu)) == ["Conv", "Gelu"]


def test_under_autocast_an_epilogue_reads_its_operand_at_the_dtype_autocast_gives_it():
    # the conv runs in fp16, the block input stays fp32: the sum promotes to fp32, which the
    # fp16 epilogue does not take, so the add and the ReLU after it stay kernels
    f = tilecast.analyze(onnx.parser.parse_model(RESIDUAL), "a100-sxm4-40gb",
                         predictor="roofline", runtime="graph", math="amp-fp16")
    assert [op for op in _ops(f) if op != "Cast"] == ["Conv", "Add", "Relu"]
    relu_only = tilecast.analyze(onnx.parser.parse_model(HEAD + "  y = Relu(c)\n}"),
                                 "a100-sxm4-40gb", predictor="roofline", runtime="graph",
                                 math="amp-fp16")
    assert [op for op in _ops(relu_only) if op != "Cast"] == ["Conv"]


# GPT-2's Conv1D as the legacy exporter writes it: the tokens flattened to 2-D for the GEMM
# and reshaped back before the residual add; a reshape moves no data, so the add still fuses
RESHAPED = """
<ir_version: 9, opset_import: ["" : 20]>
g (float[2, 128, 64] x) => (float[2, 128, 64] y) <float[64, 64] w = {0.0},
    int64[2] flat = {256, 64}, int64[3] back = {2, 128, 64}> {
  x2 = Reshape(x, flat)
  h = MatMul(x2, w)
  h3 = Reshape(h, back)
  y = Add(h3, x)
}"""


def test_an_epilogue_reaches_past_a_reshape_of_the_gemm_output():
    f = _run(RESHAPED)
    assert _ops(f) == ["MatMul"] and _fused(f) == 1
    assert f.kernels[0].kernel.cost.epilogue_bytes == 2 * 128 * 64 * 4
    assert _ops(_run(RESHAPED, runtime="eager")) == ["MatMul", "Add"]


# fc1 of an opset-17 export (no Gelu op): the GELU arrives as a chain of elementwise nodes,
# which activations.py fuses into one kernel that records what it computes
def _gemm_then(chain: str, opset: int = 17) -> str:
    head = GEMM.replace('"" : 20', f'"" : {opset}').replace(
        "float[128, 1] mask = {0.0}>", "float[128, 1] mask = {0.0}, float s2 = {1.4142135},"
        " float one = {1.0}, float half = {0.5}, float three = {3.0}, float k = {0.044715},"
        " float cap = {30.0}, float r = {0.7978846}>")
    return head + "  h = MatMul(x, w)\n  hb = Add(h, b)\n" + chain + "}"


ERF_GELU = ("  d = Div(hb, s2)\n  e = Erf(d)\n  a = Add(e, one)\n  m = Mul(hb, a)\n"
            "  y = Mul(m, half)\n")
TANH_GELU = ("  hh = Mul(half, hb)\n  p = Pow(hb, three)\n  m1 = Mul(k, p)\n  a1 = Add(hb, m1)\n"
             "  m2 = Mul(r, a1)\n  t = Tanh(m2)\n  a2 = Add(one, t)\n  y = Mul(hh, a2)\n")
# a logit soft cap, cap * tanh(x / cap): a fused Tanh chain that does not gate x, no GELU
SOFT_CAP = "  d = Div(hb, cap)\n  t = Tanh(d)\n  y = Mul(t, cap)\n"
SILU = "  s = Sigmoid(hb)\n  y = Mul(hb, s)\n"  # cuBLASLt has no SiLU epilogue


# (chain, opset, the kernels left, the chain's nodes before its last: fused into it at every
# opset under a graph runtime, activations.py)
@pytest.mark.parametrize("chain, opset, ops, inner", [
    (ERF_GELU, 17, ["MatMul"], 4),
    (TANH_GELU, 17, ["MatMul"], 7),
    (TANH_GELU, 20, ["MatMul"], 7),  # model code at opset 20: the graph runtime fuses it too
    (SOFT_CAP, 17, ["MatMul", "Mul"], 2),
    (SILU, 17, ["MatMul", "Mul"], 1),
])
def test_a_gemm_epilogue_takes_an_exporters_gelu_chain(chain, opset, ops, inner):
    f = _run(_gemm_then(chain, opset))
    assert _ops(f) == ops and f.zero_cost_by_reason()[FUSED_ACTIVATION] == inner
    assert _fused(f) == (1 if ops == ["MatMul"] else 0)  # the chain's one kernel
    # eager PyTorch at opset 17 runs F.gelu (or the soft cap, or F.silu) as one kernel
    assert _ops(_run(_gemm_then(chain, 17), runtime="eager")) == ["MatMul", "Mul"]
