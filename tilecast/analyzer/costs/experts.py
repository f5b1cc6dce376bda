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


def _share(node: NodeView, i: int, touched: int, experts: int) -> int:
    """Bytes of the touched experts' part of input ``i`` (0 when absent)."""
    return nbytes(node, node.inputs[i]) * touched // experts if has_input(node, i) else 0


def moe_steps(layout: Layout):
    def steps(node: NodeView) -> list[tuple[str, OpCost]]:
        x, probs = in_shape(node, 0), in_shape(node, 1)
        hidden, tokens, experts = x[-1], prod(x[:-1]), probs[-1]
        k = node.attr("k", 1)
        act = attr_str(node, "activation_type", "relu")
        require(node, 0 < k <= experts and act in ACTIVATION,
                f"k={k} of {experts} experts, activation {act!r}")
        f1 = in_shape(node, layout.fc1)[1]
        has_fc3 = has_input(node, layout.fc3)
        inter = in_shape(node, layout.fc3)[1] if has_fc3 else \
            f1 // 2 if act in GATED else f1
        routed = tokens * k
        touched = min(experts, routed)
        rows = -(-routed // touched)
        item, dtype = node.inputs[0].itemsize, node.inputs[0].dtype
        extras = sum(_share(node, i, touched, experts) for i in layout.extras)

        def gemm(n: int, red: int, weight: int) -> OpCost:
            d = MatmulDims(touched, rows, n, red, batched=True, weight_b=True)
            moved = int(routed * (red + n) * item) + _share(node, weight, touched, experts)
            return OpCost("matmul", 2 * touched * rows * n * red, moved, dtype, unit="matrix",
                          matmul=d, elements=routed * n)

        select = math.ceil(math.log2(k + 1))
        fc1 = gemm(f1, hidden, layout.fc1)
        # the router writes k expert indices (int64) and weights (fp32) per token: 12 bytes
        out = [("router", OpCost("reduction", tokens * experts * (SOFTMAX + select),
                                 nbytes(node, node.inputs[1]) + routed * 12, dtype,
                                 rows=RowDims(tokens, experts), elements=routed)),
               ("fc1", replace(fc1, bytes=fc1.bytes + extras))]  # biases, scales with fc1
        if has_fc3:
            out.append(("fc3", gemm(inter, hidden, layout.fc3)))
        act_in = routed * (f1 + (inter if has_fc3 else 0))
        out += [("activation", OpCost("elementwise", routed * inter * ACTIVATION[act],
                                      int((act_in + routed * inter) * item), dtype,
                                      elements=routed * inter)),
                ("fc2", gemm(hidden, inter, layout.fc2)),
                ("combine", OpCost("elementwise", 2 * routed * hidden,
                                   int((routed + tokens) * hidden * item), dtype,
                                   elements=tokens * hidden))]
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
