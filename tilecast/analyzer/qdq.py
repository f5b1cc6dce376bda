"""QDQ graphs as ONNX Runtime and TensorRT run them: int8 matmuls and convolutions.

A quantizer writes ``x -> QuantizeLinear -> DequantizeLinear -> Conv`` for activations and
``int8 weight -> DequantizeLinear -> Conv`` for weights. The runtimes do not execute that
float Conv: ONNX Runtime's QDQ selectors (``QDQSelectorActionTransformer``) and TensorRT's
explicit-quantization fusion turn the node unit into an int8 kernel reading the int8
activation and the int8 weight.

- The weight DequantizeLinear has only constant inputs: :mod:`fold` already folds it.
- A Conv / ConvTranspose / MatMul / Gemm whose two operands are both dequantized 8-bit
  tensors is re-costed on those 8-bit tensors (dtype int8: the int8 matrix peak and 1-byte
  operands); a dequantized bias is read at its int32 size. Its output stays as the graph
  writes it (float): the following QuantizeLinear remains a real elementwise kernel.
- The same holds for a residual Add / Mul of two dequantized 8-bit tensors (ONNX Runtime's
  QLinearAdd / QLinearMul node units): it reads the 1-byte inputs.
- An activation DequantizeLinear all of whose consumers became int8 kernels is fused into
  them: zero-cost. One that also feeds a float op still runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from .analysis import NodeResult
from .registry import REGISTRY, CostEntry
from .types import TensorInfo

FUSED_DQ = "fused into int8 kernel (QDQ)"
INT8_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul"})
INT8_DTYPES = frozenset({"int8", "uint8"})
OPERANDS = (0, 1)
BIAS = 2


def _dq_sources(results: Sequence[NodeResult]) -> dict[str, TensorInfo]:
    """DequantizeLinear output name -> its quantized input, for every DQ in the graph."""
    out = {}
    for r in results:
        n = r.node
        if n.op_type == "DequantizeLinear" and not n.domain and n.inputs and n.inputs[0]:
            out[n.outputs[0].name] = n.inputs[0]
    return out


def _int8_view(r: NodeResult, src: dict[str, TensorInfo]):
    """The node reading its 8-bit sources instead of the dequantized floats, or None."""
    n = r.node
    if r.outcome != "costed" or n.domain or n.op_type not in INT8_OPS:
        return None
    ops = [n.input(i) for i in OPERANDS]
    if any(t is None or src.get(t.name) is None or src[t.name].dtype not in INT8_DTYPES
           for t in ops):
        return None
    ins = list(n.inputs)
    for i in (*OPERANDS, BIAS):
        t = n.input(i)
        if t is not None and t.name in src:
            ins[i] = src[t.name]
    return replace(n, inputs=tuple(ins))


def fuse_qdq(results: tuple[NodeResult, ...], where: Sequence[str | None],
             ) -> tuple[NodeResult, ...]:
    src = _dq_sources(results)
    if not src:
        return results
    out = list(results)
    int8_readers: set[int] = set()
    for i, r in enumerate(results):
        view = _int8_view(r, src)
        if view is None:
            continue
        entry = REGISTRY.lookup(view.domain, view.op_type, view.opset)
        if isinstance(entry, CostEntry):
            out[i] = NodeResult(view, "costed", entry.fn(view))
            int8_readers.add(i)
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(results):
        for t in r.node.inputs:
            if t is not None:
                consumers[t.name].append(i)
    for i, r in enumerate(results):
        n = r.node
        if n.op_type != "DequantizeLinear" or n.domain or where[i] is not None:
            continue
        users = consumers.get(n.outputs[0].name, [])
        if users and all(u in int8_readers for u in users) and r.outcome == "costed":
            out[i] = NodeResult(n, "zero", None, FUSED_DQ)
    return tuple(out)
