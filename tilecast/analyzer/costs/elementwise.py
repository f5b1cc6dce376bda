"""Elementwise ops: FLOPs per output element times output elements; bytes = inputs + outputs.

Counting rule (see types.py): +, -, *, /, compare, select, convert and each special function
(exp, log, sqrt, erf, tanh, sin, cos, ...) count 1 -- special functions are SFU instructions or
short polynomials, and these kernels are memory-bound on GPUs anyway. Composite activations count
the arithmetic of their defining formula on top; each number below says how.
Broadcast inputs count once at their own size in ``bytes``; what a kernel reads again when a
broadcast dim repeats is recorded beside it (``broadcast.py``). The work is per output element.
A standard op that broadcasts a tensor operand is also marked as PyTorch runs it: on its
non-vectorized loop (``types.NativeLoop``, ``analyzer.native``), kept only under PyTorch's
runtimes.
"""

from __future__ import annotations

from dataclasses import replace

from ..registry import CostFn, register_all
from ..types import NativeLoop, NodeView, OpCost
from .broadcast import broadcast_reread, broadcasts_a_tensor
from .common import (
    attr_str,
    has_input,
    in_shape,
    io_bytes,
    itemsize,
    out_shape,
    prod,
    unique_bytes,
    vector_cost,
)

MS = "com.microsoft"
GELU_ERF = 5  # 0.5 * x * (1 + erf(x / sqrt2)): scale, erf, add, mul, mul
GELU_TANH = 9  # 0.5x(1 + tanh(c(x + 0.044715x^3))): x^2, FMA (2), *x, *c, tanh, +1, *x, *0.5
SIGMOID = 3  # 1 / (1 + exp(-x)): exp (negation folds into it), add, divide


def _cost(node: NodeView, flops_per_element: int, *, out_dtype: bool = False,
          loop: bool = True) -> OpCost:
    n = prod(out_shape(node))
    dtype = node.outputs[0].dtype if out_dtype else None
    cost = vector_cost(node, "elementwise", flops_per_element * n, io_bytes(node),
                       dtype=dtype, elements=n)
    # Only a standard op is one TensorIterator kernel in PyTorch (a contrib op is another
    # runtime's fused kernel).
    native = NativeLoop(n) if loop and not node.domain and broadcasts_a_tensor(node) else None
    return replace(cost, reread=broadcast_reread(node), native=native)


def elementwise(flops_per_element: int, *, out_dtype: bool = False,
                loop: bool = True) -> CostFn:
    """Factory. ``out_dtype``: the compute dtype is the output's (casts); ``loop``: PyTorch
    runs the op as a TensorIterator kernel, on its non-vectorized loop where a tensor operand
    is broadcast (not its quantization kernels)."""

    def fn(node: NodeView) -> OpCost:
        return _cost(node, flops_per_element, out_dtype=out_dtype, loop=loop)

    return fn


def variadic(extra_per_element: int = 0) -> CostFn:
    """Factory for Sum/Max/Min/Mean over n inputs: n - 1 binary ops per element, plus extra."""

    def fn(node: NodeView) -> OpCost:
        n_in = sum(1 for t in node.inputs if t is not None)
        return _cost(node, max(n_in - 1, 0) + extra_per_element)

    return fn


ONE_OP = (  # a single add / compare / select / convert / special function per element
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Sign", "Floor", "Ceil", "Round",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
    "IsNaN", "IsInf", "Where", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "BitwiseNot", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Tanh", "Sin", "Cos", "Tan",
    "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
)
register_all(ONE_OP, elementwise(1))
register_all(("Cast", "CastLike"), elementwise(1, out_dtype=True))
register_all(("Sum", "Max", "Min"), variadic())
register_all(("Mean",), variadic(1))  # the sum, then one divide
register_all(("Pow",), elementwise(3))  # exp(y * log(x))
register_all(("Clip", "LeakyRelu", "PRelu", "ThresholdedRelu"), elementwise(2))  # compare + op
register_all(("Sigmoid",), elementwise(SIGMOID))
register_all(("Softsign",), elementwise(3))  # x / (1 + |x|)
register_all(("Softplus",), elementwise(3))  # log(1 + exp(x))
register_all(("Shrink",), elementwise(3))  # two compares and a subtract/add
register_all(("HardSigmoid",), elementwise(4))  # max(0, min(1, alpha * x + beta)): FMA + 2
register_all(("HardSwish",), elementwise(5))  # x * HardSigmoid(x)
register_all(("Elu", "Celu"), elementwise(4))  # x < 0 ? alpha * (exp(x) - 1) : x
register_all(("Selu",), elementwise(5))  # Elu plus the gamma scale
register_all(("Mish",), elementwise(5))  # x * tanh(softplus(x)): softplus 3, tanh, mul
register_all(("Swish",), elementwise(SIGMOID + 2))  # x * sigmoid(alpha * x)
register_all(("SwiGLU",), elementwise(SIGMOID + 3))  # a * sigmoid(alpha * a) * b
register_all(("DequantizeLinear",), elementwise(2, loop=False))  # (x - zero_point) * scale
# ONNX's experimental ops of opsets 1-9, removed from the standard since but still in older
# model zoo graphs (tiny YOLOv2's ImageScaler) and run by ONNX Runtime:
register_all(("ImageScaler", "Affine"), elementwise(2))  # scale * x + bias: an FMA
register_all(("Scale",), elementwise(1))
register_all(("ScaledTanh",), elementwise(3))  # alpha * tanh(beta * x)
register_all(("ParametricSoftplus",), elementwise(4))  # alpha * log(1 + exp(beta * x))
register_all(("QuantizeLinear",), elementwise(4, loop=False))  # divide, round, zero pt, saturate
register_all(("DynamicQuantizeLinear",), elementwise(6, loop=False))  # min/max (2) + quantize
register_all(("Gelu",), elementwise(GELU_ERF), domain=MS)
register_all(("QuickGelu",), elementwise(SIGMOID + 2), domain=MS)  # x * sigmoid(alpha * x)
register_all(("BiasGelu",), elementwise(GELU_ERF + 1), domain=MS)  # bias add, then erf Gelu
register_all(("BiasAdd",), elementwise(2), domain=MS)  # X + bias + skip


def gelu(node: NodeView) -> OpCost:
    """ONNX Gelu (opset 20): exact erf form, or the tanh approximation."""
    tanh = attr_str(node, "approximate", "none") == "tanh"
    return _cost(node, GELU_TANH if tanh else GELU_ERF)


def fast_gelu(node: NodeView) -> OpCost:
    """com.microsoft FastGelu: the tanh approximation, plus an add for the optional bias."""
    return _cost(node, GELU_TANH + (1 if has_input(node, 1) else 0))


register_all(("Gelu",), gelu)
register_all(("FastGelu",), fast_gelu, domain=MS)

ROTARY = 3  # x * cos + rotate_half(x) * sin: two multiplies and an add per element


def rotary(cos_index: int, pos_index: int) -> CostFn:
    """Factory for RotaryEmbedding. X is (B, S, hidden) or (B, heads, S, head); only the cache
    rows at the tokens' positions are read (cos and sin), not the whole cache."""

    def fn(node: NodeView) -> OpCost:
        x = in_shape(node, 0)
        tokens = x[0] * (x[1] if len(x) == 3 else x[2])
        cache = in_shape(node, cos_index)
        rows = min(prod(cache[:-1]), tokens)
        cache_bytes = 2 * int(rows * cache[-1] * itemsize(node, cos_index))
        others = unique_bytes(node, (node.input(0), node.input(pos_index), *node.outputs))
        n = prod(out_shape(node))
        return vector_cost(node, "elementwise", ROTARY * n, others + cache_bytes, elements=n)

    return fn


register_all(("RotaryEmbedding",), rotary(1, 3))  # X, cos_cache, sin_cache, position_ids
register_all(("RotaryEmbedding",), rotary(2, 1), domain=MS)  # input, position_ids, cos, sin
# Qwen2-VL's multimodal rotary: the same inputs, its sections of the head rotated alike
register_all(("MRotaryEmbedding",), rotary(2, 1), domain=MS)


# FLOPs per output element of an activation ONNX Runtime fuses into a Conv, Gemm or MatMul, by
# its ``activation`` attribute (counted as above: sigmoid 3, compare-and-select 2).
ACTIVATION_FLOPS = {"Relu": 1, "Tanh": 1, "Sigmoid": SIGMOID, "LeakyRelu": 2, "Clip": 2,
                    "HardSigmoid": 4, "Elu": 4, "Selu": 5, "Softplus": 3, "Softsign": 3,
                    "ThresholdedRelu": 2, "ScaledTanh": 3, "ParametricSoftplus": 4}
# An activation name not in ACTIVATION_FLOPS (a newer ORT): the costliest listed.
UNKNOWN_ACTIVATION = max(ACTIVATION_FLOPS.values())


def activation_flops(node: NodeView) -> int:
    """The fused activation's FLOPs per output element (0 when none)."""
    name = attr_str(node, "activation", "")
    return ACTIVATION_FLOPS.get(name, UNKNOWN_ACTIVATION) if name else 0
