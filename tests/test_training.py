"""Training mode: backward kernels derived by family with their real shapes."""

from __future__ import annotations

import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.cli import main

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


# h = x.w is read by Relu, Tanh and the Add: three gradients meet at h. The weight w is also
# read twice (tied, like GPT-2's wte/lm_head).
SHARED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 32] x) => (float[8, 32] y) <float[32, 32] w = {0.0}> {
  h = MatMul(x, w)
  a = Relu(h)
  t = Tanh(h)
  s = Add(a, t)
  u = Add(s, h)
  y = MatMul(u, w)
}"""


def test_gradient_sums_are_apart_from_the_grad_accumulation():
    f = tilecast.analyze(_model(SHARED), "a100-40gb", mode="training", predictor="roofline")
    names = {k.kernel.name: k.kernel.op_type for k in f.kernels if k.kernel.phase == "backward"}
    sums = sorted(n for n, op in names.items() if op == "GradSum")
    accs = sorted(n for n, op in names.items() if op == "GradAccumulate")
    # autograd's input buffer adds k-1 gradients of a k-times-read tensor: h (3 reads) -> 2,
    # w (2 reads) -> 1; only the parameter w then runs grad += new (the labels' acc_latency).
    assert sums == ["h.grad_sum0", "h.grad_sum1", "w.grad_sum0"]
    assert accs == ["w.grad_acc"]


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


def test_the_harness_runs_dropout_backward_as_three_kernels():
    # The per-node harness calls grad_fn with grad mode on: grad * (mask.type_as(grad) * scale).
    from tilecast.analyzer.predictor import RooflinePredictor
    from tilecast.device_db import load_device
    from tilecast.evaluation.by_family import alone_ms
    from tilecast.evaluation.harness import timed_alone

    f = tilecast.analyze(_model(DROPOUT), "t4", mode="training", predictor=RooflinePredictor())
    (grad,) = [k.kernel for k in f.kernels if k.kernel.op_type == "DropoutGrad"]
    # a step: read dY (4 B), the bool mask (1 B), write dX (4 B) per element
    assert grad.bytes == 1024 * 9
    parts = timed_alone(grad)
    # cast the mask (1 + 4 B), scale it (4 + 4), multiply by dY (4 + 4 + 4): 25 B per element
    assert [(k.name.rsplit(".", 1)[1], k.bytes) for k in parts] == [
        ("mask_cast", 1024 * 5), ("mask_scale", 1024 * 8), ("mul", 1024 * 12)]
    assert all(k.family == "elementwise" and k.phase == "backward" for k in parts)
    others = [k.kernel for k in f.kernels if k.kernel.op_type != "DropoutGrad"]
    assert all(timed_alone(k) == (k,) for k in others)
    device = load_device("t4")
    alone = alone_ms(RooflinePredictor(), f, device)
    i = [k.kernel for k in f.kernels].index(grad)
    assert alone[i] == pytest.approx(sum(
        p.latency_ms for p in RooflinePredictor().predict(list(parts), device)))


ROWS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 8, 16] x) => (float[4, 8, 16] y) <float[16, 16] w = {0.0}> {
  h = MatMul(x, w)
  y = OP(h)
}"""


@pytest.mark.parametrize("op, kernels", [
    # PyTorch forms dY * Y first (read dY and Y, write tmp: 3 tensors), then the row kernel
    # reads tmp and Y and writes dX (3 more): 512 fp32 elements = 2 kB per tensor.
    ("Softmax", [("dY_Y", "elementwise", 3 * 2048), ("dX", "softmax", 3 * 2048)]),
    # LogSoftmax's row kernel reads dY and Y directly.
    ("LogSoftmax", [("dX", "softmax", 3 * 2048)]),
])
def test_softmax_backward_is_the_kernels_pytorch_runs(op, kernels):
    f = tilecast.analyze(_model(ROWS.replace("OP", op)), "a100-40gb", mode="training",
                         predictor="roofline")
    bw = [k.kernel for k in f.kernels if k.kernel.op_type == f"{op}Grad"]
    assert [(k.name.rsplit(".", 1)[1], k.family, k.bytes) for k in bw] == kernels
    assert all(k.phase == "backward" for k in bw)


# --- which initializers train -------------------------------------------------------------
def _param_names(text: str) -> set[str]:
    f = tilecast.analyze(_model(text), "t4", mode="training", optimizer="sgd",
                         predictor="roofline")
    return {k.kernel.name.rsplit(".", 1)[0] for k in f.kernels if k.kernel.phase == "update"}


CONV_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 16, 8, 8] x) => (float[8, 16, 8, 8] y)
  <float[16, 16, 3, 3] w = {0.0}, float[16] s = {1.0}, float[16] b = {0.0},
   float[16] mean = {0.0}, float[16] var = {1.0}> {
  c = Conv<pads = [1, 1, 1, 1]>(x, w)
  n = BatchNormalization(c, s, b, mean, var)
  y = Relu(n)
}"""

# Rotary-style table computed from constants (folded at load), a constant additive mask, an
# embedding table read with runtime ids, and one linear layer.
TABLES = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64[2, 16] ids) => (float[2, 16, 8] y)
  <float[100, 8] emb = {0.0}, float[16, 1] pos = {0.0}, float[1, 8] inv_freq = {1.0},
   float[16, 8] mask = {0.0}, float[8, 8] w = {0.0}> {
  x = Gather(emb, ids)
  freqs = MatMul(pos, inv_freq)
  cos = Cos(freqs)
  xr = Mul(x, cos)
  xm = Add(xr, mask)
  y = MatMul(xm, w)
}"""


@pytest.mark.parametrize("text, params", [
    # BatchNorm trains scale and shift; running mean and variance are statistics
    (CONV_BN, {"w", "s", "b"}),
    # the embedding table and the weight; not inv_freq (its MatMul is folded at load), the
    # cos table or the mask
    (TABLES, {"emb", "w"}),
    # the per-channel scale of the residual MLP (float[64] s): a decomposed norm's scale
    (LINEAR.replace("y = MatMul(x, w)", "x2 = Mul(x, s)\n  y = MatMul(x2, w)").replace(
        "w = {0.0}>", "w = {0.0}, float[64] s = {0.0}>"), {"w", "s"}),
])
def test_trainable_parameters(text, params):
    assert _param_names(text) == params


def test_batch_norm_trains_on_batch_statistics():
    f = tilecast.analyze(_model(CONV_BN), "t4", mode="training", predictor="roofline")
    k = {(kf.kernel.op_type, kf.kernel.phase, kf.kernel.family): kf.kernel for kf in f.kernels}
    n = 8 * 16 * 8 * 8
    stats = k[("BatchNormStats", "forward", "reduction")]
    # one read of x, mean and variance written per channel (float32); sum + FMA per element
    assert (stats.flops, stats.bytes) == (3 * n, 4 * n + 2 * 16 * 4)
    norm = k[("BatchNormalization", "forward", "elementwise")]
    # the normalize pass reads x again and writes y: subtract, scale, FMA per element
    assert (norm.flops, norm.bytes) == (4 * n, 2 * 4 * n + 4 * 16 * 4)
    # backward, one kernel as PyTorch's and cuDNN's: a reduction of dY and dY * x_hat per
    # channel (x, dY, 2 FMAs per element), then the dX pass (x, dY and the statistics read
    # again, dX written, ~5 ops per element)
    grad = k[("BatchNormalizationGrad", "backward", "reduction")]
    assert (grad.flops, grad.bytes) == (9 * n, (2 * 4 * n + 2 * 16 * 4) + (3 * 4 * n + 2 * 16 * 4))
    assert not any(key[0] == "BatchNormalizationGrad" and key[2] == "elementwise" for key in k)


QDQ = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 16] x) => (float[4, 8] y) <int8[16, 8] wq = {0}, float s = {0.1}, int8 z = {0}> {
  xq = QuantizeLinear(x, s, z)
  xd = DequantizeLinear(xq, s, z)
  wd = DequantizeLinear(wq, s, z)
  y = MatMul(xd, wd)
}"""
NO_WEIGHTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 16] x) => (float[4, 16] y) {
  y = Relu(x)
}"""


@pytest.mark.parametrize("text, why", [(QDQ, "quantized"), (NO_WEIGHTS, "no trainable weight")])
def test_graphs_that_cannot_train_are_an_error(text, why, tmp_path):
    with pytest.raises(tilecast.TilecastError, match=why):
        tilecast.analyze(_model(text), "t4", mode="training", predictor="roofline")
    path = tmp_path / "g.onnx"
    onnx.save(_model(text), path)
    out = CliRunner().invoke(main, ["analyze", str(path), "--device", "t4", "--mode",
                                    "training"])
    assert out.exit_code == 2
    assert [line for line in out.output.splitlines() if line] == [
        next(line for line in out.output.splitlines() if line.startswith("Error:"))]
    assert why in out.output


POSITIONS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 8] x) => (float[4, 16] y)
  <float[32, 8] wpe = {0.0}, int64[4] pos = {0, 1, 2, 3}, float[16, 8] wte = {0.0}> {
  p = Gather(wpe, pos)
  h = Add(x, p)
  wt = Transpose(wte)
  y = MatMul(h, wt)
}"""


def test_folded_weight_lookups_run_again_when_training():
    # Inference: the position lookup at constant positions and the tied weight's transpose are
    # folded at load. Training: the weights change every step, so the lookup runs (and gets
    # a backward); the transpose stays a free view of the trained table.
    inf = tilecast.analyze(_model(POSITIONS), "t4", predictor="roofline")
    assert [k.kernel.op_type for k in inf.kernels] == ["Add", "MatMul"]
    f = tilecast.analyze(_model(POSITIONS), "t4", mode="training", optimizer="sgd",
                         predictor="roofline")
    ops = [(k.kernel.op_type, k.kernel.phase) for k in f.kernels]
    assert ("Gather", "forward") in ops and ("GatherGrad", "backward") in ops
    assert ("Transpose", "forward") not in ops
    assert _param_names(POSITIONS) == {"wpe", "wte"}


GELU_TANH = """
<ir_version: 8, opset_import: ["" : 20]>
g (float[4, 16] x) => (float[4, 16] y) <float[16, 16] w = {0.0}, float three = {3.0},
                                        float half = {0.5}> {
  h = MatMul(x, w)
  p = Pow(h, three)
  s = Mul(half, h)
  y = Mul(s, p)
}"""


def test_elementwise_gradients_are_the_kernels_pytorch_runs():
    f = tilecast.analyze(_model(GELU_TANH), "a100-40gb", mode="training", predictor="roofline")
    got = sorted((k.kernel.op_type, k.kernel.name.rsplit(".", 1)[1], k.kernel.bytes)
                 for k in f.kernels if k.kernel.op_type in ("MulGrad", "PowGrad"))
    t = 64 * 4  # one [4, 16] fp32 tensor; eager PyTorch's gradients (derivatives.yaml):
    assert got == [
        ("MulGrad", "d0", 3 * t),  # y = s * p: dS = dY * p reads dY and p, writes dS
        ("MulGrad", "d1", 2 * t + 4),  # s = 0.5 * h: dH = dY * 0.5 reads dY (and the scalar)
        ("MulGrad", "d1", 3 * t),  # y = s * p: dP = dY * s
        # p = h^3: pow_backward's dY * (3 * h.pow(2)): the power, the scale, the product
        ("PowGrad", "d0", 3 * t), ("PowGrad", "d0_pow", 2 * t), ("PowGrad", "d0_scale", 2 * t)]


CLAMP = """
<ir_version: 8, opset_import: ["" : 20]>
g (float[4, 16] x) => (float[4, 16] y) <float[16, 16] w = {0.0}, float floor = {-1.0}> {
  h = MatMul(x, w)
  y = Max(h, floor)
}"""


def test_max_gradient_is_the_five_kernels_pytorch_runs():
    f = tilecast.analyze(_model(CLAMP), "a100-40gb", mode="training", predictor="roofline")
    got = sorted((k.kernel.name.rsplit(".", 1)[1], k.kernel.bytes)
                 for k in f.kernels if k.kernel.op_type == "MaxGrad")
    t, n = 64 * 4, 64  # one [4, 16] fp32 tensor; n one-byte mask elements. derivatives.yaml,
    assert got == [  # maximum: where(self == other, grad / 2, grad).masked_fill_(self < other, 0)
        ("d0", n + 2 * t),  # masked_fill_: reads the mask and the select, writes in place
        ("d0_compare", t + 4 + n),  # self < other: reads h and the scalar, writes a mask
        ("d0_eq", t + 4 + n),  # self == other
        ("d0_half", 2 * t),  # grad / 2
        ("d0_select", n + 3 * t)]  # where(mask, grad / 2, grad)


CAUSAL = """
<ir_version: 8, opset_import: ["" : 20]>
g (float[4, 16] x) => (float[4, 16] y) <float[16, 16] w = {0.0}, bool[4, 16] keep = {1},
                                        float floor = {-1.0}> {
  h = MatMul(x, w)
  s = Div(h, floor)
  y = Where(keep, s, floor)
}"""


def test_where_and_div_gradients_read_what_pytorch_reads():
    f = tilecast.analyze(_model(CAUSAL), "a100-40gb", mode="training", predictor="roofline")
    got = sorted((k.kernel.op_type, k.kernel.bytes) for k in f.kernels
                 if k.kernel.op_type in ("WhereGrad", "DivGrad"))
    t, n = 64 * 4, 64  # one [4, 16] fp32 tensor; n one-byte condition elements.
    assert got == [("DivGrad", 2 * t + 4),  # grad / other: dY and the scalar divisor
                   ("WhereGrad", n + 2 * t)]  # where(condition, grad, 0); floor: no gradient


RELU6 = """
<ir_version: 8, opset_import: ["" : 20]>
g (float[4, 16] x) => (float[4, 16] y, float[4, 16] z) <float[16, 16] w = {0.0},
                                                        float lo = {0.0}, float hi = {6.0}> {
  h = MatMul(x, w)
  y = Clip(h, lo, hi)
  z = Clip(h, lo)
}"""


def test_clip_gradient_is_clamp_backward():
    f = tilecast.analyze(_model(RELU6), "a100-40gb", mode="training", predictor="roofline")
    got = sorted((k.kernel.name, k.kernel.bytes)
                 for k in f.kernels if k.kernel.op_type == "ClipGrad")
    t, n = 64 * 4, 64  # one [4, 16] fp32 tensor; n one-byte mask elements. clamp_backward:
    assert got == [
        # y = Clip(h, 0, 6): where((h >= 0).logical_and_(h <= 6), dY, 0)
        ("Clip_1.d0", n + 2 * t), ("Clip_1.d0_and", 3 * n),
        ("Clip_1.d0_bound0", t + n), ("Clip_1.d0_bound1", t + n),
        # z = Clip(h, 0): where(h >= 0, dY, 0)
        ("Clip_2.d0", n + 2 * t), ("Clip_2.d0_bound0", t + n)]


CLIP6 = """
<ir_version: 7, opset_import: ["" : 10]>
g (float[4, 16] x) => (float[4, 16] y) <float[16, 16] w = {0.0}> {
  h = MatMul(x, w)
  y = Clip<min = 0.0, max = 6.0>(h)
}"""


def test_clip_before_opset_11_reads_its_bounds_from_attributes():
    f = tilecast.analyze(_model(CLIP6), "a100-40gb", mode="training", predictor="roofline")
    # both bounds: two compares, the and, the select (as Clip_1 above)
    assert [k.kernel.name for k in f.kernels if k.kernel.op_type == "ClipGrad"] == [
        "Clip_1.d0_bound0", "Clip_1.d0_bound1", "Clip_1.d0_and", "Clip_1.d0"]


def test_an_anonymous_input_dim_trains_to_a_flagged_finite_step():
    # An unnamed input dim leaves the activations unshaped. Their gradients were costed from
    # the shapes' -1 placeholder: negative element counts, and a NaN the eager runtime's
    # running clock spread to every later kernel. They are flagged estimates now.
    model = _model(MLP.replace("y = Add(a, x)", "y = Add(a, hb)"))  # hb: two gradients to sum
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = ""
    f = tilecast.analyze(model, "h100", mode="training")
    assert f.incomplete and f.total_ms > 0 and f.total_ms == f.total_ms
    assert all(min(k.kernel.flops, k.kernel.bytes, k.kernel.cost.elements) >= 0
               for k in f.kernels)
    sums = [k for k in f.kernels if k.kernel.op_type == "GradSum"]
    assert sums and all(k.kernel.cost.estimated for k in sums)
