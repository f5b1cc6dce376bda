"""ONNX Runtime's fused mixture-of-experts ops (com.microsoft MoE, QMoE) as the kernels they
launch: the router's top-k, a grouped GEMM per expert projection, the activation and the
weighted combine.

Each token goes to ``k`` experts, so T tokens make T k expert rows, spread over the
``touched = min(E, T k)`` experts that receive any (an even spread, the routers' balancing
aim). Only touched experts' weights are read: a decode step of one token reads k experts'
weights, a long prefill all E.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..registry import register_steps
from ..types import MatmulDims, NodeView, OpCost, RowDims
from .common import attr_str, has_input, in_shape, nbytes, prod, require
from .elementwise import GELU_ERF, GELU_TANH, SIGMOID
from .softmax import SOFTMAX

MS = "com.microsoft"
# FLOPs per intermediate element of each activation_type; the gated ones (swiglu, geglu)
# multiply the activated gate by the up projection (+1).
ACTIVATION = {"identity": 0, "relu": 1, "relu2": 2, "gelu": GELU_ERF, "silu": SIGMOID + 1,
              "swiglu": SIGMOID + 2, "geglu": GELU_TANH + 1}
GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class Layout:
    """Input positions of one op's weights (and of what travels with them)."""

    fc1: int
    fc2: int
    fc3: int
    extras: tuple[int, ...]  # biases, scales, zero points: read for touched experts only


MOE = Layout(fc1=2, fc2=4, fc3=6, extras=(3, 5, 7))
QMOE = Layout(fc1=2, fc2=5, fc3=8, extras=(3, 4, 6, 7, 9, 10, 11, 12, 13))


@dataclass(frozen=True)
class Routing:
    """One MoE call's sizes: T tokens of ``hidden``, each sent to ``k`` of ``experts``; fc1's
    ``f1`` outputs per row (gate and up when fused), ``inter`` after the activation."""

    tokens: int
    hidden: int
    experts: int
    k: int
    act: str
    f1: int
    inter: int
    fc3: bool

    @property
    def routed(self) -> int:
        return self.tokens * self.k

    @property
    def touched(self) -> int:
        return min(self.experts, self.routed)

    @property
    def rows(self) -> int:
        return -(-self.routed // self.touched)


def routing(node: NodeView, layout: Layout) -> Routing:
    x, probs = in_shape(node, 0), in_shape(node, 1)
    k, experts = node.attr("k", 1), probs[-1]
    act = attr_str(node, "activation_type", "relu")
    require(node, 0 < k <= experts and act in ACTIVATION,
            f"k={k} of {experts} experts, activation {act!r}")
    f1, fc3 = in_shape(node, layout.fc1)[1], has_input(node, layout.fc3)
    inter = in_shape(node, layout.fc3)[1] if fc3 else f1 // 2 if act in GATED else f1
    return Routing(prod(x[:-1]), x[-1], experts, k, act, f1, inter, fc3)


def _share(node: NodeView, i: int, r: Routing) -> int:
    """Bytes of the touched experts' part of input ``i`` (0 when absent)."""
    return nbytes(node, node.inputs[i]) * r.touched // r.experts if has_input(node, i) else 0


def _gemm(node: NodeView, r: Routing, n: int, red: int, weight: int) -> OpCost:
    """One projection: a grouped GEMM of ``r.rows`` rows per touched expert, reading the
    routed rows, the touched experts' weights, writing the products."""
    item = node.inputs[0].itemsize
    d = MatmulDims(r.touched, r.rows, n, red, batched=True, weight_b=True)
    moved = int(r.routed * (red + n) * item) + _share(node, weight, r)
    return OpCost("matmul", 2 * r.touched * r.rows * n * red, moved, node.inputs[0].dtype,
                  unit="matrix", matmul=d, elements=r.routed * n)


def moe_steps(layout: Layout):
    def steps(node: NodeView) -> list[tuple[str, OpCost]]:
        r = routing(node, layout)
        item, dtype = node.inputs[0].itemsize, node.inputs[0].dtype
        extras = sum(_share(node, i, r) for i in layout.extras)  # biases, scales: with fc1
        fc1 = _gemm(node, r, r.f1, r.hidden, layout.fc1)
        select = math.ceil(math.log2(r.k + 1))
        # the router writes k expert indices (int64) and weights (fp32) per token: 12 bytes
        out = [("router", OpCost("reduction", r.tokens * r.experts * (SOFTMAX + select),
                                 nbytes(node, node.inputs[1]) + r.routed * 12, dtype,
                                 rows=RowDims(r.tokens, r.experts), elements=r.routed)),
               ("fc1", replace(fc1, bytes=fc1.bytes + extras))]
        if r.fc3:
            out.append(("fc3", _gemm(node, r, r.inter, r.hidden, layout.fc3)))
        act_in = r.routed * (r.f1 + (r.inter if r.fc3 else 0))
        out += [("activation", OpCost("elementwise", r.routed * r.inter * ACTIVATION[r.act],
                                      int((act_in + r.routed * r.inter) * item), dtype,
                                      elements=r.routed * r.inter)),
                ("fc2", _gemm(node, r, r.hidden, r.inter, layout.fc2)),
                ("combine", OpCost("elementwise", 2 * r.routed * r.hidden,
                                   int((r.routed + r.tokens) * r.hidden * item), dtype,
                                   elements=r.tokens * r.hidden))]
        return out

    return steps


def moe_backward(layout: Layout):
    """Training: the forward kernels in reverse, each with its input gradient (the same work);
    each expert GEMM also with its weight gradient (the same grouped GEMM, transposed) when
    that weight trains."""
    forward = moe_steps(layout)
    weights = {"fc1": layout.fc1, "fc2": layout.fc2, "fc3": layout.fc3}

    def steps(node: NodeView, need: set[str]) -> list[tuple[str, OpCost]]:
        out = []
        # fc1's input gradient is the op's dX, the router's is that of router_probs: only when
        # those inputs need one
        ends = {"fc1": node.inputs[0].name, "router": node.inputs[1].name}
        for suffix, c in reversed(forward(node)):
            if suffix not in ends or ends[suffix] in need:
                out.append((f"{suffix}.dX", c))
            w = node.input(weights[suffix]) if suffix in weights else None
            if w is not None and w.name in need:
                out.append((f"{suffix}.dW", c))
        return out

    return steps


register_steps("MoE", moe_steps(MOE), "matmul", domain=MS, backward=moe_backward(MOE))
register_steps("QMoE", moe_steps(QMOE), "matmul", domain=MS)  # inference only: int weights
