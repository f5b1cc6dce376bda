"""ONNX Runtime contrib ops: the mirrors of standard ops (``analyzer/mirrors.py``) costed by the
standard formula, plus their fused epilogue and the inputs the standard op does not read; and
the contrib ops with formulas of their own (Stable Diffusion's norms, quantized embeddings,
aliases of FusedMatMul and MatMulNBits, CDist, Inverse, GatedRMSNorm).
"""

from __future__ import annotations

from dataclasses import replace

from ..mirrors import MIRRORS, MS, Mirror
from ..registry import REGISTRY, CostEntry, CostFn
from ..types import NodeView, OpCost, RowDims
from .common import (
    attr_str,
    in_shape,
    io_bytes,
    out_shape,
    prod,
    require,
    unique_bytes,
    unsupported_error,
    vector_cost,
)
from .elementwise import GELU_ERF, GELU_TANH, SIGMOID, activation_flops
from .matmul import fused_matmul  # noqa: F401  (registers what the aliases reuse)
from .normalization import LAYER_NORM, RMS_NORM, norm_cost

# A QLinear op dequantizes each input element it reads ((q - zero point) * scale: 2) and
# quantizes each output (divide, round, add the zero point, saturate: 4).
DEQUANTIZE, REQUANTIZE = 2, 4
# FLOPs per output element each mirror adds to its standard op's formula.
EPILOGUE = {
    "QGemm": REQUANTIZE,
    "DynamicQuantizeMatMul": DEQUANTIZE + 1,  # the product dequantized, the bias added
    "GemmFastGelu": 1 + GELU_TANH,  # the bias, then the tanh GELU
    **{op: 2 * DEQUANTIZE + REQUANTIZE for op in ("QLinearAdd", "QLinearMul", "QLinearWhere")},
    **{op: DEQUANTIZE + REQUANTIZE for op in (
        "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
        "QLinearSoftmax", "QLinearReduceMean", "QLinearConcat")},
    "MulInteger": 2,  # both zero points subtracted
    "ComplexMul": 2,  # (re, im): 4 multiplies and 2 adds per complex output, 3 per float
    "ComplexMulConj": 2,
    "BiasSoftmax": 1,  # the bias add
    "SwiGLU": SIGMOID + 1,  # silu(gate) * up: Mul's multiply, then x * sigmoid(x)
    "ScaledSiLU": SIGMOID + 2,  # scale * x * sigmoid(alpha x): Mul's, then alpha and x * s
}
# A residual input the op adds to every output when given (an add each): FusedConv's Z.
RESIDUAL = {"FusedConv": 3}


def mirrored(m: Mirror, epilogue: int) -> CostFn:
    """Factory: the standard formula on the inputs the standard op reads, then the epilogue
    per output element, and the bytes of every other input and output (a FusedConv's residual
    ``Z``, the scales and zero points of a QLinear op)."""

    def fn(node: NodeView) -> OpCost:
        picked = [node.input(i) for i in m.inputs]
        if m.variadic_from is not None:
            picked += list(node.inputs[m.variadic_from::m.variadic_step])
        view = replace(node, op_type=m.op_type, domain="", inputs=tuple(picked),
                       outputs=node.outputs[:m.outputs], opset=m.opset,
                       attrs={k: v for k, v in node.attrs.items() if k not in m.drop})
        entry = REGISTRY.lookup("", m.op_type, m.opset)
        if not isinstance(entry, CostEntry):
            raise unsupported_error(node, f"no formula for the mirrored {m.op_type}")
        cost = entry.fn(view)
        names = {t.name for t in (*picked, *node.outputs[:m.outputs]) if t is not None}
        rest = unique_bytes(node, [t for t in (*node.inputs, *node.outputs[m.outputs:])
                                   if t is not None and t.name not in names])
        residual = node.op_type in RESIDUAL and node.input(RESIDUAL[node.op_type]) is not None
        per_output = epilogue + residual + activation_flops(node)
        return replace(cost, flops=cost.flops + per_output * prod(out_shape(node)),
                       bytes=cost.bytes + rest)

    return fn


for (_domain, _op), _mirror in MIRRORS.items():
    REGISTRY.register(_domain, _op, mirrored(_mirror, EPILOGUE.get(_op, 0)))


def group_norm_nhwc(node: NodeView) -> OpCost:
    """GroupNorm / SkipGroupNorm (Stable Diffusion's UNet after ORT's optimizer): X (N, H, W,
    C) with ``channels_last`` (default 1), else (N, C, H, W); ``groups`` rows per image, each
    of C / groups channels over H x W. A layer norm per row (8), SiLU when ``activation`` is 1
    (SIGMOID + 1), SkipGroupNorm's skip and bias adds (2)."""
    x = in_shape(node, 0)
    groups = node.attr("groups")
    channels = x[-1] if node.attr("channels_last", 1) else x[1]
    require(node, bool(groups) and channels % groups == 0, f"bad groups={groups}")
    per = LAYER_NORM + (SIGMOID + 1 if node.attr("activation", 0) else 0)
    per += 2 if node.op_type == "SkipGroupNorm" else 0
    rows = x[0] * groups
    return norm_cost(node, rows, prod(x) // rows, per)


def bias_split_gelu(node: NodeView) -> OpCost:
    """X (N, S, 2 D), bias (2 D) -> Y (N, S, D) = (left + bias) * gelu(right + bias): two bias
    adds, an erf GELU and a multiply per output."""
    n = prod(out_shape(node))
    return vector_cost(node, "elementwise", (2 + GELU_ERF + 1) * n, io_bytes(node), elements=n)


def gather_block_quantized(node: NodeView) -> OpCost:
    """data (V, D packed ``bits`` wide), indices, scales [, zero points] -> (*indices, D): the
    rows the indices pick, dequantized ((q - zero point) * scale: 2 per output). Reads the
    picked packed rows and their ``block_size`` scales (and zero points), not the table."""
    out = node.outputs[0]
    n = prod(out_shape(node))
    blocks = -(-n // max(node.attr("block_size", 128), 1))
    side = [t for t in (node.input(2), node.input(3)) if t is not None]
    read = int(n * node.attr("bits", 4) / 8) + sum(int(blocks * t.itemsize) for t in side)
    return vector_cost(node, "gather", 2 * n, read + unique_bytes(node, (node.input(1), out)),
                       dtype=out.dtype, elements=n)


def inverse(node: NodeView) -> OpCost:
    """X (..., M, M) -> its inverses: Gauss-Jordan, 2 M^3 FLOPs per matrix (LU 2/3 M^3 and
    the triangular inverses and product 4/3 M^3; Golub and Van Loan, 3.2)."""
    x = in_shape(node, 0)
    require(node, len(x) >= 2 and x[-1] == x[-2], f"X {list(x)} is not square matrices")
    m, batch = x[-1], prod(x[:-2])
    return vector_cost(node, "reduction", batch * 2 * m**3, io_bytes(node),
                       rows=RowDims(batch, m * m))


def cdist(node: NodeView) -> OpCost:
    """A (N, D), B (M, D) -> (N, M) distances: per pair and dim a subtract and an FMA (3),
    then a square root per pair (euclidean) or none (sqeuclidean)."""
    a, b = in_shape(node, 0), in_shape(node, 1)
    pairs = a[0] * b[0]
    root = 1 if attr_str(node, "metric", "sqeuclidean") == "euclidean" else 0
    return vector_cost(node, "reduction", pairs * (3 * a[1] + root), io_bytes(node),
                       rows=RowDims(pairs, a[1]))


def with_activation(entry: CostEntry) -> CostFn:
    """Factory: a contrib matmul's formula with its fused activation per output."""

    def fn(node: NodeView) -> OpCost:
        cost = entry.fn(node)
        return replace(cost, flops=cost.flops + activation_flops(node) * prod(out_shape(node)))

    return fn


_FUSED_MATMUL = REGISTRY.lookup(MS, "FusedMatMul", 1)
_N_BITS = REGISTRY.lookup(MS, "MatMulNBits", 1)
assert isinstance(_FUSED_MATMUL, CostEntry) and isinstance(_N_BITS, CostEntry)
REGISTRY.register(MS, "TransposeMatMul", _FUSED_MATMUL.fn)
REGISTRY.register(MS, "FusedMatMulActivation", with_activation(_FUSED_MATMUL))
REGISTRY.register(MS, "MatMulBnb4", _N_BITS.fn)
REGISTRY.register(MS, "CDist", cdist)
def gated_rms_norm(node: NodeView) -> OpCost:
    """Mamba2 / gated DeltaNet outputs: Y = rms_norm(X) * scale * act(gate), each row the
    trailing C = len(scale) elements: the RMS norm (4), the gate's SiLU (SIGMOID + 1) or
    sigmoid, and the multiply by it (1)."""
    x, c = in_shape(node, 0), prod(in_shape(node, 1))
    require(node, c > 0 and prod(x) % c == 0, f"scale of {c} does not divide X {list(x)}")
    gate = SIGMOID + (attr_str(node, "activation", "silu") in ("silu", "swish"))
    return norm_cost(node, prod(x) // c, c, RMS_NORM + gate + 1)


REGISTRY.register(MS, "GatedRMSNorm", gated_rms_norm)
REGISTRY.register(MS, "GroupNorm", group_norm_nhwc)
REGISTRY.register(MS, "SkipGroupNorm", group_norm_nhwc)
REGISTRY.register(MS, "BiasSplitGelu", bias_split_gelu)
REGISTRY.register(MS, "GatherBlockQuantized", gather_block_quantized)
REGISTRY.register(MS, "Inverse", inverse)
