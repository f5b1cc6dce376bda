"""Casts that launch no kernel: one to the dtype its input has, and, under a graph runtime,
one the kernel producing its input writes.

A Cast to the dtype its input already has (Hugging Face's ``x.to(torch.float32)`` in an fp32
export, ``attn_weights.type(value.dtype)``) copies nothing: PyTorch's ``Tensor.to`` returns
the tensor itself, ONNX Runtime removes the node (its ``CastElimination`` rewrite) and the
compilers fold it. It is zero-cost under every runtime and mode, checked after autocast has
set each tensor's dtype (a cast that autocast gives a half input does convert).

Autocast (``--math amp-*``) and mixed-precision exports put a Cast after an fp32 row or
elementwise kernel, most often a LayerNorm's output cast to half for the next GEMM. Eager
PyTorch runs that cast as its own kernel (a read and a write of the whole tensor and a
launch); a graph compiler writes the producer's output in the cast dtype instead:
TorchInductor fuses the ``to(dtype)`` into the producer's pointwise epilogue, and TensorRT
and ONNX Runtime pick each layer's output precision. So under ``--runtime graph``, at
inference, the Casts of a costed row or elementwise kernel's output (past reshape views) are
zero-cost and that kernel writes one copy per cast dtype, as Inductor's multi-output kernels
do: autocast casts a LayerNorm's output once per projection that reads it (no activation
cast cache), and a compiler computes the half copy once (common subexpressions) while the
residual stream keeps the fp32 one. The kernel's own output write goes where nothing but
casts reads it. Casts of weights are folded at build already (``weights.fold_weight_casts``);
a Cast after a GEMM, a conv or an attention kernel stays a kernel (its library writes its
own output type).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from .analysis import NodeResult
from .costs.zero import NOOP_CAST, PASS_THROUGH
from .epilogues import DataReaders, costed

CAST_IN_PRODUCER = "written by its producer in the cast dtype (graph runtime)"
PRODUCERS = frozenset({"elementwise", "normalization", "softmax", "reduction"})


def drop_noop_casts(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    """Make each Cast to the dtype its input has zero-cost (module docstring)."""
    return tuple(replace(r, outcome="zero", cost=None, reason=NOOP_CAST)
                 if costed(r, "Cast", "CastLike") and r.node.input(0) is not None
                 and r.node.outputs and r.node.input(0).dtype == r.node.outputs[0].dtype
                 else r for r in results)


def _producer(r: NodeResult) -> bool:
    return r.outcome == "costed" and not r.node.domain and r.cost is not None \
        and r.cost.family in PRODUCERS and len(r.node.outputs) == 1 \
        and r.node.op_type not in ("Cast", "CastLike")


def _terminals(out: Sequence[NodeResult], readers: DataReaders, name: str) -> list[int]:
    """The nodes that read ``name``'s elements, past reshape views and no-op casts (-1 for a
    graph output)."""
    found: list[int] = []
    for j in readers.at.get(name, []):
        passes = j >= 0 and out[j].outcome == "zero" and out[j].reason in PASS_THROUGH \
            and len(out[j].node.outputs) == 1
        found += _terminals(out, readers, out[j].node.outputs[0].name) if passes else [j]
    return found


def _casts(out: Sequence[NodeResult], terminals: list[int]) -> list[int]:
    return [j for j in terminals if j >= 0 and costed(out[j], "Cast")
            and out[j].node.outputs and out[j].node.outputs[0].known]


def fuse_casts(results: Sequence[NodeResult], graph_outputs: Iterable[str] = ()
               ) -> tuple[NodeResult, ...]:
    """Make the Casts of a row or elementwise kernel's output zero-cost: the kernel writes
    one copy per cast dtype, and its own output only where something else reads it
    (module docstring)."""
    out = list(results)
    readers = DataReaders(out, graph_outputs)
    for p, r in enumerate(out):
        y = r.node.outputs[0] if _producer(r) else None
        terminals = _terminals(out, readers, y.name) if y is not None and y.known else []
        casts = _casts(out, terminals)
        if not casts:
            continue
        widths = {out[j].node.outputs[0].dtype: out[j].node.outputs[0].itemsize for j in casts}
        kept = len(casts) < len(terminals)  # a reader that is no cast needs the output
        delta = int(y.numel * sum(widths.values())) - (0 if kept else y.nbytes)
        out[p] = replace(r, cost=replace(r.cost, bytes=r.cost.bytes + delta))
        for j in casts:
            out[j] = replace(out[j], outcome="zero", cost=None, reason=CAST_IN_PRODUCER)
    return tuple(out)
