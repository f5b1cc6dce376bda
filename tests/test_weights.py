"""A pass's weights stream from DRAM once they outgrow the L2 (analyzer/weights.py and the
learned predictor's ``_stream_weights``)."""

from __future__ import annotations

from dataclasses import replace

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import load_device
from tilecast.learned.predictor import default_predictor

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _graph(body: str, inits: str = "float[64, 16] w = {0.0}") -> onnx.ModelProto:
    return onnx.parser.parse_model(
        HEADER + f"g (float[32, 64] x, float[64, 16] u) => (float[32, 16] y) <{inits}> {{\n"
        + body + "\n}")


@pytest.mark.parametrize(("body", "inits", "weight"), [
    ("y = MatMul(x, w)", "float[64, 16] w = {0.0}", True),  # a layer's weight
    ("y = MatMul(x, u)", "float[64, 16] w = {0.0}", False),  # an activation
    # a weight stored transposed: the Transpose is folded at load, the GEMM reads the weight
    ("t = Transpose<perm = [1, 0]>(w)\n  y = MatMul(x, t)", "float[16, 64] w = {0.0}", True),
    # a weight cast by its own kernel (autocast): the GEMM reads that kernel's fresh output
    ("h = Cast<to = 10>(w)\n  xh = Cast<to = 10>(x)\n  yh = MatMul(xh, h)\n"
     "  y = Cast<to = 1>(yh)", "float[64, 16] w = {0.0}", False),
    ("y = Gemm(x, w)", "float[64, 16] w = {0.0}", True),
])
def test_gemm_operands_that_are_weights(body: str, inits: str, weight: bool) -> None:
    f = tilecast.analyze(_graph(body, inits), "v100", predictor="roofline")
    [mm] = [k.kernel.cost.matmul for k in f.kernels if k.kernel.family == "matmul"]
    assert mm.weight_b is weight


def test_the_input_gradient_reads_the_weight_and_the_weight_gradient_does_not() -> None:
    body = "s2 = Mul(x, s)\n  y = MatMul(s2, w)"  # s: a trained scale, so dX is needed
    f = tilecast.analyze(_graph(body, "float[64, 16] w = {0.0}, float[64] s = {0.0}"), "v100",
                         mode="training", predictor="roofline")
    dims = {k.kernel.cost.matmul.m: k.kernel.cost.matmul.weight_b for k in f.kernels
            if k.kernel.family == "matmul" and k.kernel.phase == "backward"}
    assert dims == {32: True, 64: False}  # dX = dY W^T (32 rows); dW = X^T dY (64 rows)


def _decode_gemm(name: str, n: int = 4096, weight: bool = True) -> Kernel:
    d = MatmulDims(1, 8, n, 4096, weight_b=weight)
    cost = OpCost("matmul", 2 * 8 * n * 4096, 2 * (8 * 4096 + 4096 * n + 8 * n), "float16",
                  "matrix", matmul=d, elements=8 * n)
    return Kernel(name, (name,), "MatMul", cost)


def _busy(kernels: list[Kernel], device) -> float:
    p = default_predictor().predict(kernels, device)[0]
    return p.gpu_ms - p.fixed_ms


def test_weights_stream_once_the_pass_outgrows_the_l2() -> None:
    # The L4's 48 MB L2 serves bytes faster than its 300 GB/s DRAM. A lone 32 MB weight stays
    # resident (a kernel benchmark); in a pass of eight such layers (256 MB of weights) the
    # next pass finds none of them there.
    l4 = load_device("l4")
    lone = _busy([_decode_gemm("a")], l4)
    streamed = _busy([_decode_gemm(str(i)) for i in range(8)], l4)
    assert streamed > 1.5 * lone
    # ... exactly as if its bytes missed the L2 for their size: a weight over twice the L2
    # misses in both readings, so its forecast does not depend on the pass.
    big = [_decode_gemm("big", n=16384)]  # 128 MB
    assert _busy(big, l4) == pytest.approx(_busy(big + [_decode_gemm("x")] * 3, l4))


def test_weights_that_fit_the_l2_together_stay_resident() -> None:
    # Two 16 MB weights (32 MB) fit the L4's 48 MB: the pass leaves them resident, as if they
    # were not weights at all.
    l4 = load_device("l4")
    pair = [_decode_gemm("a", n=2048), _decode_gemm("b", n=2048)]
    plain = [replace(k, cost=replace(k.cost, matmul=replace(k.cost.matmul, weight_b=False)))
             for k in pair]
    assert _busy(pair, l4) == _busy(plain, l4)
