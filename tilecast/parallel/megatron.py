"""What Megatron-LM fuses: the forward groups and the hand-written kernels' own backward.

- Forward (``MEGATRON_FUSION``): elementwise chains such as bias-GeLU and bias-dropout-add are
  fused. The scale + mask + softmax kernel (``FusedScaleMaskSoftmax``) runs only on 16-bit
  inputs: ``is_kernel_available`` requires ``input_in_float16``, and an fp32 model falls back
  to ``forward_torch_softmax``, the mask (``masked_fill_``) and ``torch.nn.Softmax`` as kernels
  of their own.
- Saved tensors (``fused_internal``): a fused elementwise chain keeps its input for the
  backward, not its intermediates (Megatron's ``GeLUFunction`` saves the input and the bias
  and recomputes the rest; a compiler's partitioner recomputes cheap pointwise work too).
- Backward (``fused_backward``): that softmax kernel is a CUDA extension with its own backward
  (``scaled_masked_softmax_backward`` / ``scaled_upper_triang_masked_softmax_backward``): one
  row kernel reads dY and the saved probabilities and writes dX, scale included. Autograd's
  kernels for the group's nodes (dY * Y, the row kernel, the scale's and the mask's
  gradients) are not launched. The bias-GeLU and bias-dropout-add backward depend on the
  PyTorch version's jit fuser and stay node by node (docs/parallel.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..analyzer.analysis import NodeResult
from ..analyzer.fusion import FusionGroup, FusionRules
from ..analyzer.types import DTYPE_SIZE, Kernel, OpCost

SIXTEEN_BIT = frozenset({"float16", "bfloat16"})
MEGATRON_FUSION = FusionRules(softmax_prologue_dtypes=SIXTEEN_BIT, multi_reader=False)


class _Reads:
    """Who reads each tensor, to tell whether a tensor stays inside a fused group."""

    def __init__(self, results: Sequence[NodeResult], outputs: frozenset[str]) -> None:
        self.results, self.outputs = results, outputs
        self.readers: dict[str, list[int]] = {}
        for j, r in enumerate(results):
            for t in r.node.inputs:
                if t is not None:
                    self.readers.setdefault(t.name, []).append(j)

    def inside(self, name: str, kernels: set[int], views: set[int]) -> bool:
        """Only the group's kernels read ``name``, directly or through the group's views."""
        if name in self.outputs:
            return False
        return all(j in kernels or (j in views and all(
            self.inside(t.name, kernels, views) for t in self.results[j].node.outputs))
            for j in self.readers.get(name, ()))


def fused_internal(results: Sequence[NodeResult], groups: Sequence[FusionGroup],
                   outputs: frozenset[str]) -> frozenset[int]:
    """Costed nodes of fused groups whose outputs only other costed members read (through
    the group's views). Dropout is zero-cost in the graph, so fusion passes through it, but a
    training step runs it as a kernel of its own (training.dropout_kernels): not a member."""
    reads = _Reads(results, outputs)
    out: set[int] = set()
    for g in groups:
        kernels = {i for i in g.members if results[i].cost is not None}
        views = {i for i in g.members if results[i].cost is None
                 and results[i].node.op_type != "Dropout"}
        if len(kernels) > 1:
            out.update(i for i in kernels if all(reads.inside(t.name, kernels, views)
                                                 for t in results[i].node.outputs))
    return frozenset(out)


def _fused_softmax_grad(group: Kernel, softmax: NodeResult) -> Kernel:
    c, y = softmax.cost, softmax.node.outputs[0]
    nbytes = int(3 * y.numel * DTYPE_SIZE.get(y.dtype, 4))  # dY, Y in; dX out
    cost = OpCost("softmax", 2 * c.flops, nbytes, c.dtype, rows=c.rows, elements=y.numel)
    return Kernel(f"{softmax.node.name}.dX_fused", group.nodes, "ScaledMaskedSoftmaxGrad",
                  cost, "backward")


def fused_backward(kernels: Sequence[Kernel], forward: Sequence[Kernel],
                   results: Sequence[NodeResult]) -> list[Kernel]:
    """``kernels`` with each 16-bit softmax group's backward as Megatron's one kernel."""
    by_name = {r.node.name: r for r in results}
    out = list(kernels)
    for g in forward:
        if g.cost is None or g.cost.family != "softmax" or g.cost.dtype not in SIXTEEN_BIT:
            continue
        softmax = next((by_name[n] for n in g.nodes if by_name[n].cost is not None
                        and by_name[n].cost.family == "softmax"), None)
        members = set(g.nodes)
        spots = [i for i, k in enumerate(out) if k.phase == "backward" and k.nodes
                 and k.nodes[0] in members]
        if softmax is None or not spots:
            continue
        drop = set(spots)
        out = [*out[:spots[0]], _fused_softmax_grad(g, softmax),
               *(k for i, k in enumerate(out) if i > spots[0] and i not in drop)]
    return out
