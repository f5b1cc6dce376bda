"""Multi-kernel ops: ONNX LSTM / GRU / RNN per step as cuDNN runs them, Einsum pairwise.

Convention: 1 FMA = 2 FLOPs; float32 = 4 bytes. Each row derives its numbers beside it.
"""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.registry import REGISTRY, STEPS, CostEntry
from tilecast.analyzer.types import MatmulDims, NodeView

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _graph(inputs: str, body: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER + f"g ({inputs}) => (sink) {{\n{body}\n"
                                            " sink = Identity(y)\n}")


def _node(inputs: str, body: str, op: str) -> NodeView:
    return next(n for n in build_graph(_graph(inputs, body)).nodes if n.op_type == op)


RNN_CASES = [
    # LSTM, X (seq 5, batch 2, input 3), hidden 4, G = 4 gates, bias:
    #   input GEMM M = 5*2, N = 16, K = 3: 2*10*16*3 + bias 10*16 = 1120 FLOPs,
    #     bytes 4*(X 30 + W 48 + out 160 + B 32) = 1080
    #   per step GEMM M = 2, N = 16, K = 4: 2*2*16*4 = 256, bytes 4*(h 8 + R 64 + out 32) = 416
    #   per step gates 19 * 2*4 = 152, bytes 4*2*(2*16 + 2 states*2*4) = 384
    #   total 1120 + 5*(256 + 152) = 3160 FLOPs in 1 + 2*5 = 11 kernels
    ("lstm", "float[5,2,3] x, float[1,16,3] w, float[1,16,4] r, float[1,32] b",
     "y, h, c = LSTM<hidden_size = 4>(x, w, r, b)", "LSTM",
     3160, 11, ("fwd.input_gemm", MatmulDims(1, 10, 16, 3), 1120, 1080),
     ("fwd.t0.gemm", MatmulDims(1, 2, 16, 4), 256, 416)),
    # GRU bidirectional, X (4, 1, 2), hidden 3, G = 3, no bias; per direction:
    #   input GEMM 2*4*9*2 = 144; per step GEMM 2*1*9*3 = 54 and gates 16 * 1*3 = 48
    #   -> 144 + 4*(54 + 48) = 552, two directions 1104 FLOPs in 2*(1 + 2*4) = 18 kernels
    ("gru_bidirectional", "float[4,1,2] x, float[2,9,2] w, float[2,9,3] r",
     'y, h = GRU<hidden_size = 3, direction = "bidirectional">(x, w, r)', "GRU",
     1104, 18, ("rev.input_gemm", MatmulDims(1, 4, 9, 2), 144, 4 * (8 + 18 + 36)),
     ("rev.t3.gates", None, 48, 4 * 1 * (2 * 9 + 2 * 3))),
    # RNN reverse, batch-first layout: X (batch 2, seq 3, input 4), hidden 5, G = 1:
    #   input GEMM 2*6*5*4 = 240; per step GEMM 2*2*5*5 = 100 and tanh + add 2 * 2*5 = 20
    #   -> 240 + 3*120 = 600 FLOPs in 1 + 2*3 = 7 kernels
    ("rnn_reverse_batch_first", "float[2,3,4] x, float[1,5,4] w, float[1,5,5] r",
     'y, h = RNN<hidden_size = 5, direction = "reverse", layout = 1>(x, w, r)', "RNN",
     600, 7, ("rev.input_gemm", MatmulDims(1, 6, 5, 4), 240, 4 * (24 + 20 + 30)),
     ("rev.t1.gemm", MatmulDims(1, 2, 5, 5), 100, 4 * (10 + 25 + 10))),
]

EINSUM_CASES = [
    # bhid,bhjd->bhij: one batched matmul b = 6, m = 4, n = 5, k = 8: 2*6*4*5*8 = 1920;
    # bytes 4*(192 + 240 + 120) = 2208
    ("bmm", "float[2,3,4,8] a, float[2,3,5,8] b", "bhid,bhjd->bhij", 1920, 2208,
     ["contract1"]),
    # ij,jk,kl->il with i2 j3 k4 l5, left to right:
    #   (ij, jk) -> ik: m 2, n 4, k 3: 2*2*4*3 = 48, bytes 4*(6 + 12 + 8) = 104
    #   (ik, kl) -> il: m 2, n 5, k 4: 2*2*5*4 = 80, bytes 4*(8 + 20 + 10) = 152
    #   (the old one-loop count was 3 operands * 120 points = 360)
    ("three_operands", "float[2,3] a, float[3,4] b, float[4,5] c", "ij,jk,kl->il", 128, 256,
     ["contract1", "contract2"]),
    # ijk,jl->il: k appears only in the first operand: summed there first (24 adds,
    # bytes 4*(24 + 6) = 120), then (ij, jl) -> il: 2*2*5*3 = 60, bytes 4*(6 + 15 + 10) = 124
    ("summed_inside", "float[2,3,4] a, float[3,5] b", "ijk,jl->il", 84, 244,
     ["sum0", "contract1"]),
    # attention-like bqd,bkd,bkv->bqv with b2 q8 k8 d4 v4:
    #   (bqd, bkd) -> bqk: batch 2, m 8, n 8, k 4: 1024 FLOPs, bytes 4*(64 + 64 + 128) = 1024
    #   (bqk, bkv) -> bqv: batch 2, m 8, n 4, k 8: 1024 FLOPs, bytes 4*(128 + 64 + 64) = 1024
    ("three_batched", "float[2,8,4] q, float[2,8,4] k, float[2,8,4] v", "bqd,bkd,bkv->bqv",
     2048, 2048, ["contract1", "contract2"]),
    # ij->ji: a permutation, one copy: 4*(6 + 6)
    ("transpose", "float[2,3] a", "ij->ji", 0, 48, ["copy"]),
]


def _steps(node: NodeView) -> dict:
    return dict(STEPS[(node.domain, node.op_type)](node))


@pytest.mark.parametrize("name, inputs, body, op, flops, n_kernels, first, other",
                         RNN_CASES, ids=[c[0] for c in RNN_CASES])
def test_rnn_kernels(name, inputs, body, op, flops, n_kernels, first, other):
    node = _node(inputs, body, op)
    entry = REGISTRY.lookup("", op, 17)
    assert isinstance(entry, CostEntry)
    assert entry.fn(node).flops == flops
    steps = _steps(node)
    assert len(steps) == n_kernels
    for suffix, dims, f, nbytes in (first, other):
        assert (steps[suffix].matmul, steps[suffix].flops, steps[suffix].bytes) == (dims, f,
                                                                                   nbytes)


@pytest.mark.parametrize("name, inputs, eq, flops, nbytes, kernels", EINSUM_CASES,
                         ids=[c[0] for c in EINSUM_CASES])
def test_einsum_pairwise(name, inputs, eq, flops, nbytes, kernels):
    names = ", ".join(t.split()[-1] for t in inputs.split(", "))
    node = _node(inputs, f'y = Einsum<equation = "{eq}">({names})', "Einsum")
    steps = _steps(node)
    assert list(steps) == kernels
    assert sum(c.flops for c in steps.values()) == flops
    assert sum(c.bytes for c in steps.values()) == nbytes
    cost = REGISTRY.lookup("", "Einsum", 17).fn(node)
    assert (cost.flops, cost.bytes) == (flops, nbytes)


def test_forecast_launches_every_step():
    model = _graph(RNN_CASES[0][1], RNN_CASES[0][2])
    f = tilecast.analyze(model, "l4", predictor="roofline")
    names = [k.kernel.name for k in f.kernels if k.kernel.op_type == "LSTM"]
    assert len(names) == 11 and names[0].endswith("fwd.input_gemm")
    assert names[1:3] == [names[0].replace("input_gemm", "t0.gemm"),
                          names[0].replace("input_gemm", "t0.gates")]
    assert sum(k.kernel.flops for k in f.kernels if k.kernel.op_type == "LSTM") == 3160


def test_rnn_weight_that_does_not_match_is_a_shape_error():
    with pytest.raises(tilecast.TilecastError, match="hidden_size"):
        tilecast.analyze(_graph("float[5,2,3] x, float[1,12,3] w, float[1,16,4] r",
                                "y, h, c = LSTM<hidden_size = 4>(x, w, r)"), "l4",
                         predictor="roofline")


def test_lstm_backward_kernels():
    # The LSTM row above trained (X is a graph input: no dX). Per step in reverse: the gate
    # gradients (19 * 2*4 = 152 FLOPs) and dh_prev = dgates (2 x 16) @ R (16 x 4): 2*2*4*16 =
    # 256; then over all 10 rows: dW = X^T (3 x 10) @ dgates (10 x 16): 2*3*16*10 = 960,
    # dR = H^T (4 x 10) @ dgates: 2*4*16*10 = 1280, dB a column sum of 10 x 16.
    model = onnx.parser.parse_model(
        HEADER + "g (float[5,2,3] x) => (float[5,1,2,4] y) <float[1,16,3] w = {0.0}, "
        "float[1,16,4] r = {0.0}, float[1,32] b = {0.0}> {\n"
        "y, h, c = LSTM<hidden_size = 4>(x, w, r, b)\n}")
    f = tilecast.analyze(model, "l4", mode="training", predictor="roofline")
    bw = {k.kernel.name.split(".", 1)[1]: k.kernel for k in f.kernels
          if k.kernel.op_type == "LSTMGrad"}
    assert len(bw) == 2 * 5 + 3 and "fwd.dX" not in bw
    assert (bw["fwd.t4.dgates"].flops, bw["fwd.t4.dh"].cost.matmul) == (152,
                                                                       MatmulDims(1, 2, 4, 16))
    assert (bw["fwd.dW"].cost.matmul, bw["fwd.dW"].flops) == (MatmulDims(1, 3, 16, 10), 960)
    assert (bw["fwd.dR"].cost.matmul, bw["fwd.dR"].flops) == (MatmulDims(1, 4, 16, 10), 1280)
    assert bw["fwd.dB"].family == "reduction"
