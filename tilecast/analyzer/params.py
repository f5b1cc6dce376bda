"""Which initializers a training step trains, and whether a graph can be trained at all.

A parameter is a float initializer that a parametric op consumes as a weight, directly or
through views of it (a tied embedding's Transpose, a Reshape, a Cast):
MatMul / Gemm / Conv / RNN weights and biases, normalization scales and shifts, embedding tables
(the data input of a Gather with runtime indices), and per-channel affine vectors (an elementwise
Mul / Add by a vector along the last dim: a decomposed RMSNorm's scale, layer scale).
Not parameters: BatchNorm running mean / variance, masks, scalars, and tables computed from
constants (rotary cos / sin, position tables): those are outputs of folded nodes, not
initializers, and no parametric op reads them as a weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..errors import UnsupportedModelError
from .analysis import NodeResult, cost_node
from .fold import FOLDED, HOST
from .graph import Graph
from .types import DTYPE_SIZE, Kernel, NodeView, OpCost, TensorInfo

MS = "com.microsoft"
# (domain, op_type) -> the input positions that hold weights.
WEIGHT_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "MatMul"): (0, 1, 2),  # input 2: the bias the addmm rewrite attaches
    ("", "Gemm"): (0, 1, 2), ("", "Einsum"): tuple(range(8)),
    ("", "Conv"): (1, 2), ("", "ConvTranspose"): (1, 2),
    ("", "LSTM"): (1, 2, 3), ("", "GRU"): (1, 2, 3), ("", "RNN"): (1, 2, 3),
    ("", "LayerNormalization"): (1, 2), ("", "RMSNormalization"): (1,),
    ("", "SimplifiedLayerNormalization"): (1,),
    ("", "BatchNormalization"): (1, 2),  # not 3, 4: running mean and variance
    ("", "InstanceNormalization"): (1, 2), ("", "GroupNormalization"): (1, 2),
    ("", "PRelu"): (1,), ("", "Gather"): (0,),
    (MS, "FusedMatMul"): (0, 1), (MS, "Attention"): (1, 2), (MS, "LayerNormalization"): (1, 2),
    (MS, "SimplifiedLayerNormalization"): (1,), (MS, "SkipLayerNormalization"): (2, 3, 4),
    (MS, "SkipSimplifiedLayerNormalization"): (2, 3),
    (MS, "EmbedLayerNormalization"): (2, 3, 4, 5, 6),
    ("", "DeformConv"): (1, 3), ("", "CausalConvWithState"): (1, 2),
    (MS, "FusedConv"): (1, 2), (MS, "NhwcConv"): (1, 2), (MS, "NhwcFusedConv"): (1, 2),
    (MS, "FusedGemm"): (0, 1, 2), (MS, "TransposeMatMul"): (0, 1),
    (MS, "FusedMatMulActivation"): (0, 1), (MS, "GemmFastGelu"): (1, 2),
    (MS, "GroupNorm"): (1, 2), (MS, "SkipGroupNorm"): (1, 2, 4),
    (MS, "MoE"): (2, 3, 4, 5, 6, 7),  # the experts' weights and biases; not the router's
    (MS, "TorchEmbedding"): (0,),
}
OFF_GPU = (FOLDED, HOST)
AFFINE = frozenset({"Mul", "Add"})
VIEWS = frozenset({"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity",
                   "Cast"})
FREE_VIEWS = VIEWS - {"Cast"}  # a cast of a weight is a real kernel (autocast re-casts)
QUANTIZED = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "QAttention",
    "QEmbedLayerNormalization", "QGemm", "QLinearAdd", "QLinearMul", "MatMulNBits",
    "DynamicQuantizeMatMul", "QOrderedMatMul",
})
FLOAT_PREFIXES = ("float", "bfloat")
STATS_FLOPS = 3  # sum and sum of squares (an add and an FMA) per element
NORMALIZE_FLOPS = 4  # subtract mean, times 1/std, then the scale-and-shift FMA


def _affine_vector(node: NodeView, t: TensorInfo) -> bool:
    """A vector along the activation's last dim (shape (C,) or (1, .., 1, C))."""
    y = node.outputs[0] if node.outputs else None
    return (t.known and y is not None and y.known and len(y.shape) > 0 and t.numel > 1
            and t.shape[-1] == y.shape[-1] == t.numel)


def _weight_positions(node: NodeView) -> tuple[int, ...]:
    if not node.domain and node.op_type in AFFINE:
        return tuple(i for i, t in enumerate(node.inputs)
                     if t is not None and _affine_vector(node, t))
    return WEIGHT_INPUTS.get((node.domain, node.op_type), ())


def parameters(results: Sequence[NodeResult]) -> dict[str, TensorInfo]:
    """The trained initializers by name, in the order the graph first reads them."""
    producer = {t.name: r.node for r in results for t in r.node.outputs if t.name}
    params: dict[str, TensorInfo] = {}
    for r in results:
        node = r.node
        lookup = node.op_type == "Gather" and not node.domain
        if r.outcome == "zero" and r.reason in OFF_GPU and not lookup:
            # All-constant operands: not a layer (a MatMul of rotary frequencies by constant
            # positions). An embedding read at constant positions still is one.
            continue
        for i in _weight_positions(node):
            t = node.input(i)
            while t is not None and not t.is_initializer and t.name in producer:
                src = producer[t.name]  # look through views of a weight
                t = src.input(0) if src.op_type in VIEWS and not src.domain else None
            if (t is not None and t.is_initializer and t.dtype.startswith(FLOAT_PREFIXES)
                    and t.known and t.numel > 1):
                params.setdefault(t.name, t)
    return params


def unfold_trained(graph: Graph, results: Sequence[NodeResult], params: dict[str, TensorInfo],
                   ) -> tuple[list[NodeResult], list[NodeResult]]:
    """(results, re-costed nodes). Weights change every training step, so a node folded at
    load that computes from a parameter runs again each step (a position-embedding lookup at
    constant positions); views of a weight stay free (PyTorch reads them as strided views)."""
    derived, out, rerun = set(params), list(results), []
    for i, r in enumerate(results):
        if not any(t is not None and t.name in derived for t in r.node.inputs):
            continue
        derived.update(t.name for t in r.node.outputs if t.name)
        free = r.node.op_type in FREE_VIEWS and not r.node.domain
        if r.outcome == "zero" and r.reason == FOLDED and not free:
            again = cost_node(graph, r.node)
            if again.cost is not None:
                out[i] = again
                rerun.append(again)
    return out, rerun


def check_trainable(results: Sequence[NodeResult]) -> None:
    """Raise when ``--mode training`` cannot apply to the graph as given."""
    quant = [r.node for r in results if r.node.op_type in QUANTIZED]
    if quant:
        ops = sorted({n.op_type for n in quant})
        raise UnsupportedModelError(
            f"--mode training: the graph is quantized ({len(quant)} quantized nodes: "
            f"{', '.join(ops)}; first '{quant[0].name}'); integer weights get no gradients. "
            "Forecast training on the float model")
    if not parameters(results):
        raise UnsupportedModelError(
            "--mode training: the graph has no trainable weight (no float initializer read "
            "as a MatMul/Gemm/Conv weight, normalization scale or embedding table)")


STATS_OP = "BatchNormStats"  # the training pass that computes a batch norm's batch statistics


def batch_norm_training(forward: Sequence[Kernel]) -> list[Kernel]:
    """Each BatchNormalization kernel becomes its two training passes: per-channel batch
    statistics (read x, write mean and variance) and the normalize pass (read x, write y),
    which the same op launches (``follow_on``: no second host dispatch)."""
    out: list[Kernel] = []
    for k in forward:
        c = k.cost
        if k.op_type != "BatchNormalization" or c.rows is None:
            out.append(k)
            continue
        ch, n = c.rows.rows, c.rows.rows * c.rows.cols
        xb, stats = int(n * DTYPE_SIZE.get(c.dtype, 4)), 2 * ch * 4
        walk = None if c.native is None else replace(c.native, kernel="per_channel")
        out.append(replace(k, name=f"{k.name}.stats", op_type=STATS_OP,
                           cost=OpCost("reduction", STATS_FLOPS * n, xb + stats, c.dtype,
                                       rows=c.rows, elements=2 * ch, native=walk)))
        out.append(replace(k, follow_on=True,
                           cost=OpCost("elementwise", NORMALIZE_FLOPS * n, 2 * xb + 2 * stats,
                                       c.dtype, elements=n, native=c.native)))
    return out
