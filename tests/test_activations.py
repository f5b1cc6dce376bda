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
