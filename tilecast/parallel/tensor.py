"""Megatron-style tensor parallelism: the per-rank kernels of a recognized graph.

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism" (2019), section 3: the first linear of each block is split by columns (its output
width N / T: Q, K, V heads, MLP up), the second by rows (its contraction K / T: attention output
projection, MLP down); everything between them works on 1/T of the heads or features. The word
embedding and the LM head are split over the vocabulary. Per block, one all-reduce of the
block's output in the forward pass (after the row-parallel linear) and one of the block input's
gradient in the backward pass (before the column-parallel linear); one more each for the
embedding (forward) and the LM head (backward). With sequence parallelism (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022) each all-reduce becomes a
reduce-scatter plus an all-gather and the layer norms, dropouts and residual adds between the
blocks are split over the sequence as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..analyzer.analysis import NodeResult
from ..analyzer.types import Kernel, MatmulDims, OpCost, RowDims, TensorInfo
from ..errors import TilecastError
from .structure import EPILOGUE, PROLOGUE, Structure, trace_initializer


@dataclass(frozen=True)
class Roles:
    """What tensor parallelism does to each node (by index) and tensor (by name)."""

    column: frozenset[int]
    row: frozenset[int]
    split: frozenset[int]  # every FLOP and byte divided by T
    split_tensors: frozenset[str]  # parameters and activations held as 1/T per rank


def roles(results: Sequence[NodeResult], s: Structure, sequence_parallel: bool) -> Roles:
    column = {i for b in s.blocks for i in b.column}
    row = {b.row for b in s.blocks}
    split = {i for b in s.blocks for i in b.inner} | set(s.head_region)
    if s.lm_head is not None:
        column.add(s.lm_head)
    if sequence_parallel:  # norms, dropouts, residual adds between the blocks
        split |= {i for i in range(len(results)) if isinstance(s.segment(i), int)
                  and i not in column and i not in row}
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    casts: set[int] = set()  # autocast's casts of split weights: each rank casts its shard
    tensors = {t.name for i in split for t in results[i].node.outputs}
    for i in column:  # weight and bias of a column-parallel linear, and its output
        tensors.update(_weights(results, producer, results[i].node.inputs[1:], casts))
        tensors.update(t.name for t in results[i].node.outputs)
    for i in row:
        tensors.update(_weights(results, producer, results[i].node.inputs[1:2], casts))
    split |= casts
    for i in s.vocab_gathers:
        tensors.add(results[i].node.inputs[0].name)
    return Roles(frozenset(column), frozenset(row), frozenset(split), frozenset(tensors))


def _weights(results: Sequence[NodeResult], producer: Mapping[str, int],
             inputs: Sequence[TensorInfo | None], casts: set[int]) -> set[str]:
    """The initializers among ``inputs``, directly or behind zero-cost views and the casts
    ``torch.autocast`` inserts (``structure.trace_initializer``); those casts' indices go to
    ``casts``."""
    out = set()
    for t in inputs:
        src, seen = trace_initializer(results, producer, t)
        if src is not None:
            out.add(src.name)
            casts.update(seen)
    return out


def check_divisible(results: Sequence[NodeResult], s: Structure, tp: int) -> None:
    for b in s.blocks:
        if b.heads and b.heads % tp:
            raise TilecastError(f"tp={tp} does not divide the {b.heads} attention heads of "
                                f"the block at node '{results[b.row].node.name}'")
        for i in b.column:
            mm = results[i].cost.matmul
            if mm is not None and mm.n % tp:
                raise TilecastError(f"tp={tp} does not divide the output width {mm.n} of "
                                    f"node '{results[i].node.name}'")


def _volume(d: MatmulDims) -> int:
    return d.b * d.m * d.n * d.k


def _bytes(d: MatmulDims) -> int:
    return d.b * (d.m * d.k + d.k * d.n + d.m * d.n)


def scaled_reads(c: OpCost, num: int, den: int) -> OpCost:
    """``c``'s reads beyond its unique bytes on num / den of its output: a fused epilogue's
    residual, read once per output element, and a broadcast operand's re-reads, once per
    repeat of its broadcast dims (``costs/broadcast.py``: the repeats go with the token rows,
    the operand stays). Left as they were, a decode step's RMSNorm weight multiply kept the
    prompt's 4,095 re-reads of its 16 KB weight (67 MB) on 1 row."""
    r = c.reread
    if r is not None and r.operand_bytes > 0:
        repeats = max((r.bytes // r.operand_bytes + 1) * num // den, 1)
        r = replace(r, bytes=(repeats - 1) * r.operand_bytes) if repeats > 1 else None
    return replace(c, reread=r, epilogue_bytes=c.epilogue_bytes * num // max(den, 1))


def rescale_matmul(c: OpCost, d: MatmulDims) -> OpCost:
    """``c`` on new dims ``d``: FLOPs with the product's volume, bytes with its operands, a
    fused epilogue's residual with its output."""
    old = c.matmul
    out = scaled_reads(c, d.b * d.m * d.n, max(old.b * old.m * old.n, 1) if old else 1)
    # the operands' bytes scale with the operands, the residual with the output (scaled_reads)
    operands = (c.bytes - c.epilogue_bytes) * _bytes(d) // max(_bytes(old), 1)
    return replace(out, matmul=d, flops=c.flops * _volume(d) // max(_volume(old), 1),
                   bytes=operands + out.epilogue_bytes, elements=d.b * d.m * d.n)


def matmul_role(d: MatmulDims, fwd: MatmulDims) -> str:
    """Which product of a linear with forward dims ``fwd`` a kernel is: ``forward``, the
    input gradient ``dA`` = (b, m, k, n) or the weight gradient ``dB`` = (b, k, n, m)
    (training.py)."""
    if (d.m, d.n, d.k) == (fwd.m, fwd.n, fwd.k):
        return "forward"
    return "dA" if (d.m, d.n, d.k) == (fwd.m, fwd.k, fwd.n) else "dB"


def _divided(c: OpCost, tp: int) -> OpCost:
    mm = c.matmul
    if mm is not None:
        mm = replace(mm, b=mm.b // tp) if mm.b % tp == 0 else replace(mm, m=max(mm.m // tp, 1))
    rows = None if c.rows is None else RowDims(max(c.rows.rows // tp, 1), c.rows.cols)
    return replace(scaled_reads(c, 1, tp), flops=c.flops // tp, bytes=c.bytes // tp,
                   elements=c.elements // tp, matmul=mm, rows=rows)


def _linear(k: Kernel, fwd: MatmulDims, column: bool, tp: int) -> OpCost:
    """Split one kernel of a column- or row-parallel linear. The backward kernels permute the
    forward's dims (training.py: dA = (b, m, k, n), dB = (b, k, n, m)); the split dim is the
    forward's N (column) or K (row) wherever it went."""
    c, d = k.cost, k.cost.matmul
    if d is None:  # the bias gradient of a column-parallel linear
        return _divided(c, tp) if column else c
    role = matmul_role(d, fwd)
    if role == "forward":
        new = replace(d, n=d.n // tp) if column else replace(d, k=d.k // tp)
    elif role == "dA":
        new = replace(d, k=d.k // tp) if column else replace(d, n=d.n // tp)
    else:
        new = replace(d, n=d.n // tp) if column else replace(d, m=d.m // tp)
    return rescale_matmul(c, new)


def _rank_cost(k: Kernel, i: int | None, results: Sequence[NodeResult], r: Roles,
               tp: int, forward: Mapping[int, MatmulDims]) -> OpCost:
    if i is None:  # a gradient sum or an optimizer update of a tensor: split if it is
        return _divided(k.cost, tp) if k.name.rsplit(".", 1)[0] in r.split_tensors else k.cost
    if i in r.column or i in r.row:
        fwd = forward.get(i) or results[i].cost.matmul
        if fwd is not None and (k.family == "matmul" or k.cost.matmul is None):
            return _linear(k, fwd, i in r.column, tp)
        return k.cost
    return _divided(k.cost, tp) if i in r.split else k.cost


def shard_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult], r: Roles,
                  index: Mapping[str, int], tp: int,
                  forward: Mapping[int, MatmulDims] | None = None) -> list[Kernel]:
    """The kernels one tensor-parallel rank runs. ``forward`` overrides a linear's forward
    dims where an earlier step changed them (expert parallelism's longer expert rows)."""
    if tp == 1:
        return list(kernels)
    return [replace(k, cost=_rank_cost(k, index.get(k.nodes[0]) if k.nodes else None,
                                       results, r, tp, forward or {})) for k in kernels]


def segment_of(k: Kernel, s: Structure, index: Mapping[str, int],
               owner: Mapping[str, int]) -> int | str:
    """Layer (or PROLOGUE/EPILOGUE) of a kernel: its node's, or for a gradient sum / update
    of a tensor, that of the node that first reads the tensor."""
    if k.nodes and k.nodes[0] in index:
        return s.segment(index[k.nodes[0]])
    i = owner.get(k.name.rsplit(".", 1)[0])
    return s.segment(i) if i is not None else PROLOGUE


__all__ = ["Roles", "roles", "shard_kernels", "segment_of", "check_divisible", "matmul_role",
           "rescale_matmul", "scaled_reads", "EPILOGUE"]
