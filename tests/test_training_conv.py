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


BIASED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[8, 16, 56, 56] x) => (float16[8, 64, 56, 56] y)
  <float16[16, 16, 1, 1] v = {0}, float16[64, 16, 1, 1] w = {0}, float16[64] b = {0}> {
  h = Conv(x, v)
  y = Conv(h, w, b)
}"""


def test_a_bias_is_no_step_of_the_gradients_reduction() -> None:
    # a 1x1 conv 16 -> 64 with a bias: forward 2 x 8 x 56^2 x 64 x 16 MACs + 8 x 64 x 56^2
    # bias adds. dX (8 x 56^2) x 16 reduces over exactly K = 64 (it read 66 when the bias was
    # taken for multiply-adds) and does the MACs only; a pointwise dX, like its forward, runs
    # on NCHW as it stands: no layout transposes on the H100.
    fwd, grads = _grads(BIASED, "h100-sxm5-80gb", predictor="learned")
    macs = 8 * 56 * 56 * 64 * 16
    dx, dw = grads["dX"].kernel.cost, grads["dW"].kernel.cost
    assert (dx.matmul.m, dx.matmul.n, dx.matmul.k) == (8 * 56 * 56, 16, 64)
    assert fwd.kernel.cost.flops == 2 * macs + 8 * 64 * 56 * 56
    assert dx.flops == dw.flops == 2 * macs
    from tilecast.device_db import load_device
    from tilecast.learned.predictor import default_predictor

    p = default_predictor().predict([grads["dX"].kernel], load_device("h100-sxm5-80gb"))[0]
    assert p.layout_ms == 0.0
