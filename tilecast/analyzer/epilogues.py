"""Library-kernel epilogues under a graph runtime: the scale, add and activation after a Conv
or a GEMM run inside that kernel, not as kernels of their own.

Graph compilers hand these to the libraries' fused forms:

- cuDNN's ``cudnnConvolutionBiasActivationForward``: y = act(alpha1 conv(x) + alpha2 z +
  bias), with ReLU (or identity). TensorRT's "Layer Fusion Catalog" lists a Convolution
  followed by ReLU, and a Convolution followed by an ElementWise sum that does not
  broadcast; XLA's cuDNN fused-convolution rewrite builds the same call.
- cuBLASLt's matmul: D = alpha A B + beta C, then its epilogue (``cublasLtEpilogue_t``:
  BIAS, RELU, GELU and their _BIAS forms; hipBLASLt has the same). XLA's GEMM rewrite folds a
  scalar scale into alpha, an add of a tensor of the output's shape into C (beta = 1), and a
  bias and a ReLU or GELU into the epilogue.

PyTorch's eager kernels, and a CUDA-graph replay of them, run each op alone, so only the
``graph`` runtime fuses, and only at inference (training keeps the pre-activation).

Pattern, each step optional and in this order, every intermediate read by the next step
alone (reshape views between them are passed through): [scale by a scalar constant: GEMMs]
-> [Add of a residual of the output's shape or a bias, one value per output channel (Conv)
or column (GEMM)] -> [ReLU; GELU for GEMMs, as the op or as an exporter's erf or tanh chain
that ``activations.py`` fused into one kernel].

Cost: the library kernel's work, plus reading the add's operand in its epilogue
(``OpCost.epilogue_bytes``, also in ``bytes``). It writes one output, the last fused node's;
the fused nodes read and write nothing of their own and become zero-cost with
:data:`FUSED_EPILOGUE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .analysis import NodeResult, readers_of
from .costs.zero import PASS_THROUGH, SHAPE_ONLY
from .fusion import METADATA_READERS
from .types import TensorInfo

FUSED_EPILOGUE = "fused into a Conv or GEMM epilogue (graph runtime)"


@dataclass(frozen=True)
class _Library:
    """What one library kernel's epilogue takes."""

    scale: bool  # a scalar multiplier (alpha)
    activations: frozenset[str]
    channel_axis: int  # the axis a bias runs along (-1: the last)


LIBRARIES = {"Conv": _Library(False, frozenset({"Relu"}), 1),
             "MatMul": _Library(True, frozenset({"Relu", "Gelu"}), -1),
             "Gemm": _Library(True, frozenset({"Relu", "Gelu"}), -1)}


def costed(r: NodeResult, *op_types: str) -> bool:
    return r.node.op_type in op_types and not r.node.domain and r.outcome == "costed"


def _activation(r: NodeResult, names: frozenset[str]) -> bool:
    """An activation the library takes: its ONNX op, or a decomposed chain fused into one
    kernel that computes it (``NodeResult.activation``: an exporter's erf or tanh GELU)."""
    return costed(r, *names) or (r.outcome == "costed" and r.activation in names)


def other_operand(step: NodeResult, y: TensorInfo) -> TensorInfo | None:
    """The binary step's operand that is not ``y`` (None unless there is exactly one)."""
    ins = step.node.inputs
    others = [t for t in ins if t is not None and t.name != y.name]
    return others[0] if len(ins) == 2 and len(others) == 1 and others[0].known else None


def _scale(step: NodeResult, y: TensorInfo) -> bool:
    """Mul by, or Div (y / s) by, one constant value: cuBLAS's alpha."""
    s = other_operand(step, y)
    if s is None or s.numel != 1 or not s.is_initializer:
        return False
    return step.node.op_type == "Mul" or step.node.inputs[0].name == y.name


def _operand(add: NodeResult, y: TensorInfo, lib: _Library, produced_at: dict[str, int],
             at: int) -> TensorInfo | None:
    """The add's operand when the epilogue can read it: a tensor of the output's shape made
    before the library kernel runs (a residual), or one value per output channel (a bias)."""
    z = other_operand(add, y)
    if z is None or not y.known or z.dtype != y.dtype or produced_at.get(z.name, -1) > at:
        return None  # a broadcast, a cast, or made after the kernel (it could not read it)
    channels = y.shape[lib.channel_axis] if len(y.shape) > 1 else 0
    same = tuple(z.shape) == tuple(y.shape)
    return z if same or (z.numel == channels and channels > 0) else None


class SoleReaders:
    """Who reads each tensor (``analysis.readers_of``: graph outputs count as readers)."""

    def __init__(self, results: Sequence[NodeResult], graph_outputs: Iterable[str]) -> None:
        self.at = readers_of(results, graph_outputs)

    def sole(self, name: str) -> int | None:
        """The index of the one node that reads ``name`` once, if no other reads it."""
        only = self.at.get(name, [])
        return only[0] if len(only) == 1 and only[0] >= 0 else None

    def through_views(self, name: str, out: list[NodeResult],
                      views: list[int]) -> tuple[int | None, TensorInfo | None]:
        """The one reader of ``name`` past any reshape views (a 2-D GEMM's output reshaped
        back to 3-D: the same elements), collecting the views' indices in ``views``; and the
        tensor that reader reads."""
        j, y = self.sole(name), None
        while j is not None and out[j].outcome == "zero" and out[j].reason in PASS_THROUGH \
                and len(out[j].node.outputs) == 1:
            views.append(j)
            y = out[j].node.outputs[0]
            j = self.sole(y.name)
        return j, y


class DataReaders(SoleReaders):
    """Who reads each tensor's elements: shape queries (``Shape``, ``Size``) read none, nor
    does a Transpose only they read (``SHAPE_ONLY``), so they do not keep a tensor alive for
    a kernel that would otherwise write it in place."""

    def __init__(self, results: Sequence[NodeResult], graph_outputs: Iterable[str]) -> None:
        super().__init__(results, graph_outputs)
        self.at = {name: [i for i in found if i < 0 or not _reads_no_data(results[i])]
                   for name, found in self.at.items()}


def _reads_no_data(r: NodeResult) -> bool:
    return r.node.op_type in METADATA_READERS or r.outcome == "zero" and r.reason == SHAPE_ONLY


def _chain(i: int, out: list[NodeResult], readers: SoleReaders, produced_at: dict[str, int],
           ) -> tuple[list[int], list[int], TensorInfo, TensorInfo | None]:
    """(the nodes library kernel ``i`` can fuse, the views between them, the tensor it then
    writes, the add's operand it reads)."""
    lib = LIBRARIES[out[i].node.op_type]
    y, chain, operand, views = out[i].node.outputs[0], [], None, []
    steps = (("scale", lib.scale), ("add", True), ("act", True))
    for kind, allowed in steps:
        passed: list[int] = []
        j, seen = readers.through_views(y.name, out, passed)
        if j is None or not allowed:
            continue
        step, at = out[j], seen or y
        if kind == "scale" and not (costed(step, "Mul", "Div") and _scale(step, at)):
            continue
        if kind == "add":
            operand = _operand(step, at, lib, produced_at, i) if costed(step, "Add") else None
            if operand is None:
                continue
        if kind == "act" and not _activation(step, lib.activations):
            continue
        chain.append(j)
        views += passed
        y = step.node.outputs[0]
    return chain, views, y, operand


def fuse_epilogues(results: Sequence[NodeResult],
                   graph_outputs: Iterable[str] = ()) -> tuple[NodeResult, ...]:
    """Inference under a graph runtime: a Conv or GEMM absorbs its epilogue (module
    docstring)."""
    readers = SoleReaders(results, graph_outputs)
    produced_at = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    out = list(results)
    for i, lib_node in enumerate(results):
        if not costed(lib_node, *LIBRARIES) or len(lib_node.node.outputs) != 1:
            continue
        chain, views, y, operand = _chain(i, out, readers, produced_at)
        if not chain:
            continue
        read = operand.nbytes if operand is not None else 0
        flops = sum(out[j].cost.flops for j in chain)
        cost = replace(lib_node.cost, flops=lib_node.cost.flops + flops,
                       bytes=lib_node.cost.bytes + read, epilogue_bytes=read)
        out[i] = replace(lib_node, node=replace(lib_node.node, outputs=(y,)), cost=cost)
        for j in chain:
            out[j] = NodeResult(replace(out[j].node, inputs=(), outputs=()), "zero", None,
                                FUSED_EPILOGUE)
        for j in views:  # still views, of tensors the fused kernel no longer writes
            out[j] = replace(out[j], node=replace(out[j].node, inputs=(), outputs=()))
    return tuple(out)
