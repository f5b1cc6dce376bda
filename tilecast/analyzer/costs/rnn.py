"""Recurrent layers (ONNX LSTM, GRU, RNN) as cuDNN runs them, per direction:

1. the input projection of every step at once: one GEMM (seq*batch x input) @ (input x G*H),
   with the bias (Wb + Rb) in its epilogue;
2. then, step after step (each needs the previous hidden state): a recurrent GEMM
   (batch x H) @ (H x G*H) and one elementwise kernel for the gates.

G gates: LSTM 4 (i, o, f, c), GRU 3 (z, r, h), RNN 1. Bidirectional layers run both directions.
Gate FLOPs per hidden unit (1 FMA = 2, sigmoid 3 as in elementwise.py, tanh 1):
- LSTM 19: 4 adds (input + recurrent part of each gate), 3 sigmoids (9), tanh of the cell
  input (1), c = f*c + i*g (a multiply and an FMA: 3), tanh(c) (1), h = o*tanh(c) (1).
- GRU 16: 2 adds (z, r), 2 sigmoids (6), n = tanh(Xn + r*(Rn + Rbn)) (add, multiply, add,
  tanh: 4), h = (1 - z)*n + z*h (subtract, multiply, FMA: 4).
- RNN 2: an add and the tanh.
Gate kernel bytes: it reads both projections of its gates (2 * G*H per batch row) and the
previous state, and writes h (LSTM also c).

Backward (training), per direction, as cuDNN's backward-data then backward-weights: per step
in reverse, a gate-gradient kernel (the gate FLOPs again; reads dh, the saved gates and state,
writes the gate gradients) and the recurrent data GEMM dh_prev = dgates (B x G*H) @ R
(G*H x H); then, over all steps at once, dX = dgates (S*B x G*H) @ W (G*H x I) when X needs a
gradient, dW = X^T (I x S*B) @ dgates, dR = H^T (H x S*B) @ dgates, and the bias gradient, a
column sum of dgates.
"""

from __future__ import annotations

from ..registry import register_steps
from ..types import MatmulDims, NodeView, OpCost, RowDims
from .common import attr_str, has_input, in_shape, main_dtype, require

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
GATE_FLOPS = {"LSTM": 19, "GRU": 16, "RNN": 2}
DIRECTIONS = {"forward": ("fwd",), "reverse": ("rev",), "bidirectional": ("fwd", "rev")}
STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}  # h and c for LSTM


def _gemm(d: MatmulDims, nbytes: float, dtype: str, bias: bool) -> OpCost:
    flops = 2 * d.b * d.m * d.n * d.k + (d.m * d.n if bias else 0)
    return OpCost("matmul", flops, int(nbytes), dtype, unit="matrix", matmul=d,
                  elements=d.m * d.n)


def _dims(node: NodeView) -> tuple[tuple[str, ...], int, int, int, int, int]:
    """(direction names, seq, batch, input, hidden, gates * hidden), checked."""
    x, w = in_shape(node, 0), in_shape(node, 1)  # W: (dirs, G*H, input)
    g = GATES[node.op_type]
    dirs, gh, inp = w
    h = node.attr("hidden_size") or gh // g
    require(node, gh == g * h and len(x) == 3 and x[2] == inp,
            f"W {list(w)} does not match {g} gates of hidden_size {h} over X {list(x)}")
    seq, batch = (x[1], x[0]) if node.attr("layout", 0) else (x[0], x[1])
    names = DIRECTIONS.get(attr_str(node, "direction", "forward"), ())
    require(node, len(names) == dirs, f"direction does not match {dirs} weight directions")
    return names, seq, batch, inp, h, gh


def rnn_steps(node: NodeView) -> list[tuple[str, OpCost]]:
    names, seq, batch, inp, h, gh = _dims(node)
    op, states = node.op_type, STATES[node.op_type]
    dtype, size = main_dtype(node), node.inputs[0].itemsize
    bias = has_input(node, 3)
    out: list[tuple[str, OpCost]] = []
    for name in names:
        proj = MatmulDims(1, seq * batch, gh, inp)
        proj_bytes = size * (seq * batch * inp + gh * inp + seq * batch * gh + (2 * gh if bias
                                                                               else 0))
        out.append((f"{name}.input_gemm", _gemm(proj, proj_bytes, dtype, bias)))
        rec = MatmulDims(1, batch, gh, h)
        rec_bytes = size * (batch * h + gh * h + batch * gh)
        gate_bytes = size * batch * (2 * gh + 2 * states * h)
        gates = OpCost("elementwise", GATE_FLOPS[op] * batch * h, int(gate_bytes), dtype,
                       elements=batch * h)
        for t in range(seq):
            out.append((f"{name}.t{t}.gemm", _gemm(rec, rec_bytes, dtype, False)))
            out.append((f"{name}.t{t}.gates", gates))
    return out


def rnn_backward(node: NodeView, need: set[str]) -> list[tuple[str, OpCost]]:
    names, seq, batch, inp, h, gh = _dims(node)
    op, states = node.op_type, STATES[node.op_type]
    dtype, size = main_dtype(node), node.inputs[0].itemsize
    sb = seq * batch
    gates = OpCost("elementwise", GATE_FLOPS[op] * batch * h,
                   int(size * batch * (2 * gh + 2 * states * h)), dtype, elements=batch * gh)
    dh = _gemm(MatmulDims(1, batch, h, gh), size * (batch * gh + gh * h + batch * h), dtype,
               False)
    out: list[tuple[str, OpCost]] = []
    for name in names:
        for t in reversed(range(seq)):
            out += [(f"{name}.t{t}.dgates", gates), (f"{name}.t{t}.dh", dh)]
        if node.inputs[0].name in need:
            out.append((f"{name}.dX", _gemm(MatmulDims(1, sb, inp, gh),
                                            size * (sb * gh + gh * inp + sb * inp), dtype,
                                            False)))
        for label, k in (("dW", inp), ("dR", h)):
            out.append((f"{name}.{label}", _gemm(MatmulDims(1, k, gh, sb),
                                                 size * (k * sb + sb * gh + k * gh), dtype,
                                                 False)))
        if has_input(node, 3):
            out.append((f"{name}.dB", OpCost("reduction", sb * gh, int(size * (sb + 2) * gh),
                                             dtype, rows=RowDims(gh, sb), elements=2 * gh)))
    return out


for _op in GATES:
    register_steps(_op, rnn_steps, "matmul", backward=rnn_backward)
