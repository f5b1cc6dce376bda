"""Training mode: backward kernels derived by family with their real shapes."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast

LINEAR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[32, 64] x) => (float[32, 16] y) <float[64, 16] w = {0.0}> {
  y = MatMul(x, w)
}"""

MLP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 32] x) => (float[8, 32] y) <float[32, 32] w1 = {0.0}, float[32] b1 = {0.0}> {
  h = MatMul(x, w1)
  hb = Add(h, b1)
  a = Relu(hb)
  y = Add(a, x)
}"""


def _model(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


def test_linear_backward_is_exactly_the_weight_gradient_matmul():
    f = tilecast.analyze(_model(LINEAR), "v100", mode="training", predictor="roofline")
    bw = [k.kernel for k in f.kernels if k.kernel.family == "matmul"
          and k.kernel.phase == "backward"]
    # x is a graph input (no gradient): only dW = x^T . dY, (64 x 32) @ (32 x 16)
    assert [(k.cost.matmul.m, k.cost.matmul.n, k.cost.matmul.k) for k in bw] == [(64, 16, 32)]
    assert bw[0].flops == 2 * 64 * 16 * 32


def test_backward_of_linear_with_input_gradient_has_both_matmuls():
    text = LINEAR.replace("y = MatMul(x, w)", "x2 = Mul(x, s)\n  y = MatMul(x2, w)").replace(
        "w = {0.0}>", "w = {0.0}, float[64] s = {0.0}>")  # s: a per-channel scale
    f = tilecast.analyze(_model(text), "v100", mode="training", predictor="roofline")
    dims = sorted((k.kernel.cost.matmul.m, k.kernel.cost.matmul.n, k.kernel.cost.matmul.k)
                  for k in f.kernels if k.kernel.family == "matmul"
                  and k.kernel.phase == "backward")
    # dX = dY . W^T: (32 x 16) @ (16 x 64) -> m=32, n=64, k=16; dW = X^T . dY -> (64, 16, 32)
    assert dims == [(32, 64, 16), (64, 16, 32)]


def test_training_phases_and_accumulation():
    f = tilecast.analyze(_model(MLP), "a100-40gb", mode="training", predictor="roofline")
    phases = f.by_phase
    assert set(phases) == {"forward", "backward"}
    ops = [k.kernel.op_type for k in f.kernels if k.kernel.phase == "backward"]
    # the bias add is folded into the MatMul (addmm), so its gradient is the MatMul's dC: a
    # reduction of dY over the batch; Relu: one elementwise kernel; the residual Add passes
    # dY through; parameters w1 and b1 each accumulate into .grad once.
    bias_grad = [k.kernel for k in f.kernels if k.kernel.name.endswith(".dC")]
    assert len(bias_grad) == 1 and bias_grad[0].family == "reduction"
    assert "ReluGrad" in ops and "AddGrad" not in ops
    assert sum(op == "GradAccumulate" for op in ops) == 2
    f_inf = tilecast.analyze(_model(MLP), "a100-40gb", predictor="roofline")
    assert phases["forward"] == pytest.approx(f_inf.total_ms)


@pytest.mark.parametrize("optimizer, traffic", [("sgd", 5), ("adam", 7)])
def test_optimizer_step(optimizer, traffic):
    f = tilecast.analyze(_model(MLP), "a100-40gb", mode="training", optimizer=optimizer,
                         predictor="roofline")
    upd = [k.kernel for k in f.kernels if k.kernel.phase == "update"]
    # one update per parameter; bytes = traffic tensors of the parameter's size
    assert sorted(k.bytes for k in upd) == sorted([traffic * 32 * 4, traffic * 32 * 32 * 4])


def test_training_gpt2_has_no_unsupported_and_costs_more(gpt2_path):
    inf = tilecast.analyze(gpt2_path, "l4", predictor="roofline")
    train = tilecast.analyze(gpt2_path, "l4", mode="training", predictor="roofline")
    assert train.unsupported == {}
    assert train.by_phase["backward"] > inf.total_ms


DROPOUT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[16, 64] x) => (float[16, 64] y) <float[64, 64] w = {0.0}, float r = {0.1}> {
  h = MatMul(x, w)
  y = Dropout(h, r)
}"""


def test_dropout_costs_only_in_training():
    inf = tilecast.analyze(_model(DROPOUT), "t4", predictor="roofline")
    assert [k.kernel.op_type for k in inf.kernels] == ["MatMul"]
    train = tilecast.analyze(_model(DROPOUT), "t4", mode="training", predictor="roofline")
    drops = {k.kernel.op_type: k.kernel for k in train.kernels if "Dropout" in k.kernel.op_type}
    # forward: read h, write y, write a one-byte mask (16 x 64 elements)
    assert drops["Dropout"].bytes == 16 * 64 * (4 + 4 + 1)
    assert drops["DropoutGrad"].phase == "backward"
