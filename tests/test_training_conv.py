"""A dense conv's backward as cuDNN runs it: dgrad and wgrad as implicit GEMMs with the
forward's FLOPs (analyzer/training.py, ``_conv_grad_gemms``)."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast

CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[32, 64, 56, 56] x) => (float[32, 128, 28, 28] y)
  <float[64, 64, 1, 1] v = {0.0}, float[128, 64, 3, 3] w = {0.0}> {
  h = Conv(x, v)
  y = Conv<pads = [1, 1, 1, 1], strides = [2, 2]>(h, w)
}"""
DEPTHWISE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[32, 64, 56, 56] x) => (float[32, 64, 56, 56] y)
  <float[64, 64, 1, 1] v = {0.0}, float[64, 1, 3, 3] w = {0.0}> {
  h = Conv(x, v)
  y = Conv<pads = [1, 1, 1, 1], group = 64>(h, w)
}"""


def _grads(text: str, device: str = "v100-sxm2-32gb", predictor: str = "roofline"):
    # the second conv: the first one trains, so its input needs a gradient (dX) too
    f = tilecast.analyze(onnx.parser.parse_model(text), device, mode="training",
                         predictor=predictor)
    fwd = [k for k in f.kernels if k.kernel.op_type == "Conv"][1]
    return fwd, {k.kernel.name.rsplit(".", 1)[1]: k for k in f.kernels
                 if k.kernel.op_type == "ConvGrad" and k.kernel.name.startswith(fwd.kernel.name)}


def test_dgrad_and_wgrad_are_implicit_gemms_with_the_forwards_flops() -> None:
    # forward: 2 N K P Q C R S = 2 x 32 x 128 x 28^2 x 64 x 9 = 3.70 GFLOP
    fwd, grads = _grads(CONV)
    dx, dw = grads["dX"].kernel.cost, grads["dW"].kernel.cost
    # dX (32, 64, 56, 56): m = N H W, n = C, k = K R S P Q / (H W) = 128 x 9 / 4 = 288
    assert (dx.matmul.m, dx.matmul.n, dx.matmul.k) == (32 * 56 * 56, 64, 288)
    # dW (128, 64, 3, 3): m = K, n = C R S, k = N P Q
    assert (dw.matmul.m, dw.matmul.n, dw.matmul.k) == (128, 64 * 9, 32 * 28 * 28)
    for c in (dx, dw):
        assert 2 * c.matmul.m * c.matmul.n * c.matmul.k == fwd.kernel.flops == c.flops


def test_a_grouped_convs_backward_stays_memory_bound() -> None:
    _, grads = _grads(DEPTHWISE)
    assert all(k.kernel.cost.matmul is None for k in grads.values())


@pytest.mark.parametrize("device", ["v100-sxm2-32gb", "t4", "a100-sxm4-40gb", "h100"])
def test_the_backward_costs_about_twice_the_forward(device: str) -> None:
    # two GEMMs of the forward's FLOPs each: 1.5-4x the forward (wgrad's long reduction and
    # dgrad's tiles differ from the forward's); it was 5-10x at a flat 27 TFLOP/s before
    fwd, grads = _grads(CONV, device, predictor="learned")
    ratio = sum(k.latency_ms for k in grads.values()) / fwd.latency_ms
    assert 1.5 < ratio < 4.0
