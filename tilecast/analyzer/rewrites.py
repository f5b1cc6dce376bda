"""Launch-level rewrites: map ONNX nodes onto the kernels the framework really launches.

- Linear bias: exporters split a 3-D ``nn.Linear`` into MatMul + Add(bias), but PyTorch runs
  it as one ``addmm`` (the bias is the GEMM's epilogue / beta input), not a GEMM plus an
  elementwise pass over the output. The Add becomes zero-cost and the MatMul takes the bias
  as its third input (like Gemm), so training mode derives the bias gradient from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .analysis import NodeResult

FOLDED_BIAS = "bias add folded into the preceding MatMul (PyTorch's addmm epilogue)"


def _is_weight(t, results: tuple[NodeResult, ...], producer: dict[str, int]) -> bool:
    """An initializer, or an Identity of one (the legacy exporter dedupes equal weights, e.g.
    the zero biases of a model built from its config, into Identity nodes)."""
    for _ in range(8):
        if t.is_initializer:
            return True
        i = producer.get(t.name)
        node = results[i].node if i is not None else None
        if node is None or node.op_type != "Identity" or node.domain or not node.inputs:
            return False
        t = node.inputs[0]
    return False


def _bias_operand(add: NodeResult, mm_out: str, n: int, results: tuple[NodeResult, ...],
                  producer: dict[str, int]):
    others = [t for t in add.node.inputs if t is not None and t.name != mm_out]
    if len(others) != 1:
        return None
    bias = others[0]
    return bias if bias.shape == (n,) and _is_weight(bias, results, producer) else None


def fold_linear_bias(results: tuple[NodeResult, ...]) -> tuple[NodeResult, ...]:
    uses = Counter(t.name for r in results for t in r.node.inputs if t is not None)
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    out = list(results)
    for j, add in enumerate(results):
        if add.node.op_type != "Add" or add.node.domain or add.outcome != "costed":
            continue
        for t in add.node.inputs:
            i = producer.get(t.name) if t is not None else None
            mm = results[i] if i is not None else None
            if (mm is None or mm.node.op_type != "MatMul" or mm.outcome != "costed"
                    or mm.cost.matmul is None or uses[t.name] != 1 or len(mm.node.inputs) > 2):
                continue
            bias = _bias_operand(add, t.name, mm.cost.matmul.n, results, producer)
            if bias is None or add.node.outputs[0].shape != t.shape:
                continue
            node = replace(mm.node, inputs=(*mm.node.inputs, bias), outputs=add.node.outputs)
            cost = replace(mm.cost, flops=mm.cost.flops + add.node.outputs[0].numel,
                           bytes=mm.cost.bytes + bias.nbytes)
            out[i] = NodeResult(node, "costed", cost)
            # The Add keeps its place (and name) in the report but no longer reads or writes
            # anything: its output is now the MatMul's.
            out[j] = NodeResult(replace(add.node, inputs=(), outputs=()), "zero", None,
                                FOLDED_BIAS)
            break
    return tuple(out)
