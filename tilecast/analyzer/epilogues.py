"""Conv epilogues under a graph runtime: a residual or bias add and a ReLU after a Conv run
inside the conv kernel, not as kernels of their own.

Graph compilers lower ``act(conv(x) + z + bias)`` to one fused convolution: cuDNN's fused
form (``cudnnConvolutionBiasActivationForward``: y = act(alpha1 conv(x) + alpha2 z + bias),
ReLU or identity), TensorRT's layer fusions (NVIDIA TensorRT documentation, "Layer Fusion
Catalog": a Convolution followed by ReLU; a Convolution followed by an ElementWise sum that
does not broadcast) and XLA's cuDNN fused-convolution rewrite. PyTorch's eager kernels and
a CUDA-graph replay of them run each op alone, so only the ``graph`` runtime fuses.

What the fused kernel costs: the conv's work, plus reading ``z`` (or the bias) in its
epilogue. The conv still writes one output, now the last fused node's; the add and the ReLU
read and write nothing of their own. Each fused node becomes zero-cost with
:data:`FUSED_EPILOGUE`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from .analysis import NodeResult
from .types import TensorInfo

FUSED_EPILOGUE = "fused into the Conv's epilogue (graph runtime)"


def _costed(r: NodeResult, op_type: str) -> bool:
    return r.node.op_type == op_type and not r.node.domain and r.outcome == "costed"


def _epilogue_operand(add: NodeResult, y: TensorInfo, produced_at: dict[str, int],
                      conv_at: int) -> TensorInfo | None:
    """The add's other operand when cuDNN's epilogue can read it: a tensor of the conv
    output's shape made before the conv runs (a residual), or one value per output channel
    (a bias). None for anything else (a broadcast the fused form does not take)."""
    others = [t for t in add.node.inputs if t is not None and t.name != y.name]
    if len(others) != 1 or len(add.node.inputs) != 2 or not others[0].known or not y.known:
        return None
    z = others[0]
    if produced_at.get(z.name, -1) > conv_at or z.dtype != y.dtype:
        return None  # made after the conv (its kernel could not read it), or a cast
    channels = y.shape[1] if len(y.shape) > 1 else 0
    same = tuple(z.shape) == tuple(y.shape)
    return z if same or (z.numel == channels and channels > 0) else None


class _Readers:
    """Who reads each tensor, and how often (graph outputs count as readers)."""

    def __init__(self, results: Sequence[NodeResult], graph_outputs: Iterable[str]) -> None:
        self.uses = Counter(t.name for r in results for t in r.node.inputs if t is not None)
        self.uses.update(graph_outputs)
        self.at: dict[str, list[int]] = defaultdict(list)
        for j, r in enumerate(results):
            for t in r.node.inputs:
                if t is not None:
                    self.at[t.name].append(j)

    def sole(self, name: str) -> int | None:
        """The index of the one node that reads ``name``, if exactly one does."""
        only = self.at[name]
        return only[0] if self.uses[name] == 1 and len(only) == 1 else None


def _chain(i: int, out: list[NodeResult], readers: _Readers, produced_at: dict[str, int],
           ) -> tuple[list[int], TensorInfo, TensorInfo | None]:
    """(the nodes Conv ``i`` can fuse, the tensor it then writes, the add's operand)."""
    y, chain, operand = out[i].node.outputs[0], [], None
    j = readers.sole(y.name)
    if j is not None and _costed(out[j], "Add"):
        operand = _epilogue_operand(out[j], y, produced_at, i)
        if operand is not None:
            chain.append(j)
            y = out[j].node.outputs[0]
            j = readers.sole(y.name)
    if j is not None and _costed(out[j], "Relu"):
        chain.append(j)
        y = out[j].node.outputs[0]
    return chain, y, operand


def fuse_conv_epilogues(results: Sequence[NodeResult],
                        graph_outputs: Iterable[str] = ()) -> tuple[NodeResult, ...]:
    """Inference under a graph runtime: Conv [-> Add(z)] [-> Relu] becomes the Conv alone
    when each intermediate has that one reader (module docstring)."""
    readers = _Readers(results, graph_outputs)
    produced_at = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    out = list(results)
    for i, conv in enumerate(results):
        if not _costed(conv, "Conv") or len(conv.node.outputs) != 1:
            continue
        chain, y, operand = _chain(i, out, readers, produced_at)
        if not chain:
            continue
        read = operand.nbytes if operand is not None else 0
        flops = sum(out[j].cost.flops for j in chain)
        cost = replace(conv.cost, flops=conv.cost.flops + flops, bytes=conv.cost.bytes + read,
                       epilogue_bytes=read)
        out[i] = replace(conv, node=replace(conv.node, outputs=(y,)), cost=cost)
        for j in chain:
            out[j] = NodeResult(replace(out[j].node, inputs=(), outputs=()), "zero", None,
                                FUSED_EPILOGUE)
    return tuple(out)
