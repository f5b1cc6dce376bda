"""Head layouts a fused attention kernel reads and writes in place under a graph runtime.

Exporters lay attention out the way PyTorch's ``matmul`` wants it: the packed QKV projection
is split, each part reshaped to (B, S, H, D) and transposed to (B, H, S, D) (K to
(B, H, D, S) for the first product), and the (B, H, S, D) output transposed back before the
output projection. A fused attention kernel reads each head's rows wherever they lie, one
stride per axis, so long as the head dim stays contiguous: FlashAttention's native layout
is (batch, seqlen, nheads, headdim), ONNX Runtime's MultiHeadAttention takes query, key
and value as (B, S, H x D) or one packed (B, S, H, 3, D) tensor and writes (B, S, H x D)
(its transformer optimizer folds these Reshape / Transpose nodes and the QKV Split into
the op), and TensorRT and XLA assign the layouts around their attention kernels. So under
``--runtime graph``, at inference:

- a Transpose whose only data reader is a fused attention kernel's Q, K or V and that keeps
  the head dim contiguous (the last axis of its input is the operand's head-dim axis) is
  read in place by the kernel;
- a Transpose that alone reads the kernel's output (past reshape views) and keeps the head
  dim last is written in place by it;
- a Split whose every part reaches (past views) such a Transpose or the kernel itself is a
  set of strided slices the kernel reads.

Bytes do not move: the kernel reads the same elements, so its cost stands; the copies go.
Shape queries (``Shape``, ``Size``) read no elements and do not keep a tensor alive.
Everything else (a rotary embedding or a GQA repeat between the transpose and the kernel,
a transpose that moves the head dim) stays a kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from .analysis import NodeResult
from .epilogues import DataReaders, SoleReaders, costed
from .types import NodeView, TensorInfo
from .views import is_perm

# Reshapes and Transposes torch.onnx writes to build K^T from K: one Transpose (TorchScript
# exporter), Reshape to 3-D -> Transpose -> Reshape back (dynamo exporter).
MAX_KEY_STEPS = 3
LAYOUT_IN_KERNEL = "layout read or written in place by a fused attention kernel (graph runtime)"
# The operand axis that holds the head dim, per input slot of a fused attention node: Q and V
# are (.., S, D); K is (.., D, S) in a fused eager chain (the first product's K^T) and
# (.., S, D) in an ONNX Attention op.
CHAIN_SLOTS = {0: -1, 1: -2, 2: -1}
OP_SLOTS = {0: -1, 1: -1, 2: -1}


def _perm(node: NodeView) -> list[int] | None:
    t = node.input(0)
    if t is None or t.shape is None:
        return None
    rank = len(t.shape)
    perm = node.attr("perm") or list(range(rank - 1, -1, -1))
    return list(perm) if is_perm(perm, rank) else None  # a malformed graph's may not be


def _keeps(node: NodeView, axis: int) -> bool:
    """Does the Transpose put its input's last (contiguous) axis at output ``axis``?"""
    perm = _perm(node)
    return perm is not None and perm[axis] == len(perm) - 1


def _past_views(readers: DataReaders, out: list[NodeResult], name: str) -> int | None:
    """The one data reader of ``name`` past reshape views."""
    return readers.through_views(name, out, [])[0]


def _in_place(results: list[NodeResult], readers: DataReaders, produced_at: dict[str, int],
              i: int, slots: dict[int, int]) -> set[int]:
    """The Transposes attention kernel ``i`` reads or writes in place."""
    found: set[int] = set()
    node = results[i].node
    for slot, axis in slots.items():
        t = node.input(slot)
        p = produced_at.get(t.name) if t is not None else None
        if p is not None and costed(results[p], "Transpose") and readers.sole(t.name) == i \
                and _keeps(results[p].node, axis):
            found.add(p)
    y = node.outputs[0] if node.outputs else None
    j = _past_views(readers, results, y.name) if y is not None and y.shape else None
    if j is not None and costed(results[j], "Transpose") and _keeps(results[j].node, -1) \
            and tuple(results[j].node.inputs[0].shape[-1:]) == tuple(y.shape[-1:]):
        found.add(j)  # a view that regroups the head dim would move what "last" means
    return found


def _strided_split(results: list[NodeResult], readers: DataReaders, r: NodeResult,
                   kernels: set[int], absorbed: set[int]) -> bool:
    """Does every part of Split ``r`` reach an absorbed Transpose or a kernel's input?"""
    return costed(r, "Split") and bool(r.node.outputs) and all(
        t is not None and _past_views(readers, results, t.name) in absorbed | kernels
        for t in r.node.outputs)


def read_in_place(results: Sequence[NodeResult], graph_outputs: Iterable[str] = ()
                  ) -> tuple[NodeResult, ...]:
    """Make the layout copies around each fused attention kernel zero-cost (module
    docstring). A kernel is an ``Attention`` node: a fused eager chain (``fuse_attention``,
    K^T as its second input) or an ONNX Attention op."""
    out = list(results)
    readers = DataReaders(out, graph_outputs)
    produced_at = {t.name: i for i, r in enumerate(out) for t in r.node.outputs}
    kernels = {i for i, r in enumerate(out) if costed(r, "Attention")}
    absorbed: set[int] = set()
    for i in kernels:
        slots = CHAIN_SLOTS if out[i].node.attr("k_transposed") else OP_SLOTS
        absorbed |= _in_place(out, readers, produced_at, i, slots)
    splits = {j for j, r in enumerate(out) if _strided_split(out, readers, r, kernels, absorbed)}
    for j in absorbed | splits:
        out[j] = replace(out[j], outcome="zero", cost=None, reason=LAYOUT_IN_KERNEL)
    return tuple(out)


def key_of(kt: TensorInfo, out: list[NodeResult], readers: SoleReaders,
         produced_at: Mapping[str, int]) -> tuple[TensorInfo, tuple[int, ...]] | None:
    """K, and the nodes that build the first product's K^T from it: back from K^T through
    Reshapes that keep the last two dims and one Transpose that brings its input's last
    (contiguous, head-dim) axis to the K^T's rows (``MAX_KEY_STEPS`` in all), each result read
    by the next step alone; None otherwise. The TorchScript exporter's last-two swap may be
    merged with the heads' permute into one (0, 2, 3, 1): K is then the (B, S, H, D)
    projection itself, which the kernel reads in place."""
    if kt.shape is None or len(kt.shape) < 2:
        return None
    want = (*kt.shape[:-2], kt.shape[-1], kt.shape[-2])
    t, steps, found = kt, [], False
    while len(steps) < MAX_KEY_STEPS and not (found and tuple(t.shape) == want):
        p = produced_at.get(t.name)
        x = out[p].node.inputs[0] if p is not None and out[p].node.inputs else None
        if x is None or out[p].node.domain or x.shape is None or len(x.shape) < 2 \
                or readers.sole(t.name) is None:
            break
        node = out[p].node
        if not found and node.op_type == "Transpose" and is_perm(node.attr("perm"), len(x.shape)) \
                and node.attr("perm")[-2] == len(x.shape) - 1:
            found = True
        elif not (node.op_type == "Reshape" and tuple(x.shape[-2:]) == tuple(t.shape[-2:])):
            break
        steps.append(p)
        t = x
    ok = found and t.known and t.numel == kt.numel and t.shape[-1] == kt.shape[-2]
    return (t, tuple(steps)) if ok else None
