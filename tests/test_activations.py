"""Decomposed activations (analyzer/activations.py): one kernel, as PyTorch runs F.gelu."""

from __future__ import annotations

import onnx
import pytest

import tilecast
from tilecast.analyzer.activations import FUSED_ACTIVATION

# The legacy torch.onnx export of F.gelu (erf form): Div, Erf, Add, Mul, Mul.
GELU = """<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 1024] x) => (float[64, 1024] y) <float s2 = {1.4142135}, float one = {1.0},
                                              float half = {0.5}> {
  d = Div(x, s2)
  e = Erf(d)
  a = Add(e, one)
  m = Mul(x, a)
  y = Mul(m, half)
}"""


def _forecast(text: str) -> tilecast.Forecast:
    return tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")


def test_decomposed_gelu_is_one_kernel_reading_x_once() -> None:
    f = _forecast(GELU)
    assert len(f.kernels) == 1
    k = f.kernels[0].kernel
    # reads x (64 * 1024 fp32) once, writes y once: 2 * 262144 bytes; FLOPs of the 5 nodes
    assert k.bytes == 2 * 64 * 1024 * 4
    assert k.flops == 5 * 64 * 1024
    assert f.zero_cost_by_reason()[FUSED_ACTIVATION] == 4


@pytest.mark.parametrize("extra", [
    "  z = Relu(e)\n",  # an intermediate read outside the chain
    "",  # (control: the plain chain fuses)
])
def test_chain_with_outside_reader_is_not_fused(extra: str) -> None:
    text = GELU.replace("(float[64, 1024] y)", "(float[64, 1024] y, float[64, 1024] z)")
    tail = extra or "  z = Relu(x)\n"
    text = text.replace("  y = Mul(m, half)\n", "  y = Mul(m, half)\n" + tail)
    f = _forecast(text)
    fused = FUSED_ACTIVATION in f.zero_cost_by_reason()
    assert fused == (extra == "")


# Hugging Face's NewGELUActivation (GPT-2) as Python writes it:
# 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3)))): eight nodes.
NEW_GELU = """<ir_version: 8, opset_import: ["" : OPSET]>
g (float[64, 1024] x) => (float[64, 1024] y) <float three = {3.0}, float k = {0.044715},
                       float c = {0.7978846}, float one = {1.0}, float half = {0.5}> {
  h = Mul(half, x)
  p = Pow(x, three)
  m1 = Mul(k, p)
  a1 = Add(x, m1)
  m2 = Mul(c, a1)
  t = Tanh(m2)
  a2 = Add(one, t)
  y = Mul(h, a2)
}"""
# The legacy torch.onnx export of F.gelu(approximate="tanh"): x * x * x, nine nodes.
LEGACY_TANH_GELU = """<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 1024] x) => (float[64, 1024] y) <float k = {0.044715}, float c = {0.7978846},
                                              float one = {1.0}, float half = {0.5}> {
  sq = Mul(x, x)
  cube = Mul(x, sq)
  m1 = Mul(k, cube)
  a1 = Add(x, m1)
  inner = Mul(c, a1)
  t = Tanh(inner)
  a2 = Add(one, t)
  xm = Mul(x, a2)
  y = Mul(half, xm)
}"""
SILU = """<ir_version: 8, opset_import: ["" : 20]>
g (float[64, 1024] x) => (float[64, 1024] y) {
  s = Sigmoid(x)
  y = Mul(x, s)
}"""


def _kernels(text: str, runtime: str) -> list[tilecast.analyzer.types.Kernel]:
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline",
                         runtime=runtime)
    return [k.kernel for k in f.kernels]


@pytest.mark.parametrize("text, runtime, kernels", [
    # opset 17 has no Gelu op: a tanh-GELU chain may be the exporter's F.gelu, one kernel
    # (the whole chain, also where x + 0.044715 x^3 reads x twice)
    (NEW_GELU.replace("OPSET", "17"), "eager", 1),
    (LEGACY_TANH_GELU, "eager", 1),
    # opset 20 writes F.gelu as Gelu: the chain is model code, eight kernels in eager PyTorch;
    # a graph runtime fuses it
    (NEW_GELU.replace("OPSET", "20"), "eager", 8),
    (NEW_GELU.replace("OPSET", "20"), "graph", 1),
    (GELU.replace('"" : 17', '"" : 20'), "eager", 5),
    # SiLU has no ONNX op before opset 24: F.silu, one kernel at any opset
    (SILU, "eager", 1),
])
def test_which_chains_are_one_kernel(text: str, runtime: str, kernels: int) -> None:
    ks = _kernels(text, runtime)
    assert len(ks) == kernels
    if kernels == 1:  # reads x once, writes y once
        assert ks[0].bytes == 2 * 64 * 1024 * 4
