"""Recognize transformer layers in an analyzed graph from its structure, never its names.

- Attention: a Softmax (or a fused attention node) whose input comes, through elementwise and
  data-movement nodes only, from one activation x activation MatMul (Q K^T), whose output feeds
  one more (probs x V); the Q, K and V operands trace back to weighted MatMuls (the column-
  parallel projections, possibly one fused QKV, possibly through a per-head norm of Q and K
  or the slice writes that assemble them) and the probs x V result flows to one weighted
  MatMul (the row-parallel output projection).
- MLP: a weighted MatMul whose input traces back, through elementwise nodes only (the
  activation), to weighted MatMuls (up, and gate where there is one): column then row.
- LM head: a weighted MatMul outside every block whose output width equals the row count of a
  Gather table (the word embedding): both are split over the vocabulary.
- Layers: one attention block and the MLP after it (an encoder-decoder layer holds two
  attention blocks). Nodes before the first layer are the prologue, after the last the
  epilogue.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..analyzer.analysis import NodeResult
from ..analyzer.mathmode import AUTOCAST_REASON
from ..analyzer.types import TensorInfo

# Families a walk may not cross: they end a linear chain (weights, rows, gathers, ...).
STOP = {"matmul", "conv", "attention", "softmax", "normalization", "gather", "reduction",
        "pooling", "unsupported"}
PROLOGUE, EPILOGUE = "prologue", "epilogue"
# What may sit between the Q, K and V projections and the attention core besides views and
# elementwise ops: a per-head norm of Q and K (QK-norm: Qwen3, OLMo 2, Gemma 3; a decomposed
# RMSNorm's mean is a reduction) and slice writes that assemble Q and K from parts
# (DeepSeek's MLA: the rotary part written into each head, an index_put / ScatterND).
QKV_PASS = frozenset({"normalization", "reduction", "gather"})


@dataclass(frozen=True)
class Block:
    kind: str  # attention | mlp
    column: tuple[int, ...]  # node indices of the column-parallel weighted matmuls
    row: int  # node index of the row-parallel weighted matmul
    inner: frozenset[int]  # nodes between them, split across tensor-parallel ranks
    heads: int  # attention heads (0 for an MLP)
    # Attention core, from Q K^T to probs x V (selective recomputation reruns it); its last
    # node's output (the context) is the block's and is kept.
    core: frozenset[int] = frozenset()
    core_out: int = -1

    @property
    def start(self) -> int:
        return min(self.column)


@dataclass(frozen=True)
class Structure:
    blocks: tuple[Block, ...]
    layer_starts: tuple[int, ...]  # node index where each layer begins
    last_index: int  # node index of the last layer's last row-parallel matmul
    lm_head: int | None
    head_region: frozenset[int]  # nodes after the LM head (vocabulary-parallel)
    vocab_gathers: tuple[int, ...]
    warnings: tuple[str, ...]

    @property
    def layers(self) -> int:
        return len(self.layer_starts)

    def segment(self, index: int) -> int | str:
        """Layer number of node ``index``, or PROLOGUE / EPILOGUE."""
        if not self.layer_starts or index < self.layer_starts[0]:
            return PROLOGUE
        if index > self.last_index:
            return EPILOGUE
        layer = 0
        for i, start in enumerate(self.layer_starts):
            if index >= start:
                layer = i
        return layer


def trace_initializer(results: Sequence[NodeResult], producer: Mapping[str, int],
                      t: TensorInfo | None) -> tuple[TensorInfo | None, tuple[int, ...]]:
    """The initializer behind ``t`` (``t`` itself, or reached up through zero-cost
    single-input views such as Transpose and Identity, and through the casts autocast
    inserts: analyzer.mathmode), or None; and the indices of those casts."""
    casts: list[int] = []
    while t is not None and not t.is_initializer and t.name in producer:
        j = producer[t.name]
        r = results[j]
        if len(r.node.inputs) != 1 or (r.cost is not None and r.reason != AUTOCAST_REASON):
            return None, ()
        if r.reason == AUTOCAST_REASON:
            casts.append(j)
        t = r.node.inputs[0]
    return (t, tuple(casts)) if t is not None and t.is_initializer else (None, ())


class Walker:
    def __init__(self, results: Sequence[NodeResult]) -> None:
        self.results = results
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(results):
            for t in r.node.outputs:
                self.producer[t.name] = i
            for t in r.node.inputs:
                if t is not None:
                    self.consumers[t.name].append(i)

    def family(self, i: int) -> str | None:
        c = self.results[i].cost
        return None if c is None else c.family

    def weight(self, i: int) -> TensorInfo | None:
        """The 2-D initializer operand of a matmul node (directly or through a transpose)."""
        for t in self.results[i].node.inputs[:2]:
            src, _ = trace_initializer(self.results, self.producer, t)
            if src is not None and src.shape and len(src.shape) == 2:
                return src
        return None

    def is_weighted(self, i: int) -> bool:
        return self.family(i) == "matmul" and self.weight(i) is not None

    def up(self, tensors: Sequence[TensorInfo | None], skip: frozenset[int] = frozenset(),
           passable: frozenset[str] = frozenset()) -> tuple[set[int], bool]:
        """Matmul nodes reached walking up through pass-through nodes (and nodes of the
        ``passable`` families); False if a STOP node other than a matmul (and not in
        ``skip``) was met."""
        found, clean, seen = set(), True, set(skip)
        stack = [t.name for t in tensors if t is not None and not t.is_initializer]
        while stack:
            name = stack.pop()
            i = self.producer.get(name)
            if i is None or i in seen:
                continue
            seen.add(i)
            fam = self.family(i)
            if fam == "matmul":
                found.add(i)
            elif fam in STOP and fam not in passable:
                clean = False
            else:
                stack.extend(t.name for t in self.results[i].node.inputs
                             if t is not None and not t.is_initializer)
        return found, clean

    def down(self, i: int) -> set[int]:
        """Matmul nodes reached walking down from node ``i``'s outputs through pass-through
        nodes (softmax, dropout, reshapes, elementwise)."""
        found, seen = set(), set()
        stack = [t.name for t in self.results[i].node.outputs]
        while stack:
            for j in self.consumers.get(stack.pop(), ()):
                if j in seen:
                    continue
                seen.add(j)
                fam = self.family(j)
                if fam == "matmul":
                    found.add(j)
                elif fam not in STOP:
                    stack.extend(t.name for t in self.results[j].node.outputs)
        return found

    def descendants(self, i: int) -> frozenset[int]:
        out: set[int] = set()
        stack = [t.name for t in self.results[i].node.outputs]
        while stack:
            for j in self.consumers.get(stack.pop(), ()):
                if j not in out:
                    out.add(j)
                    stack.extend(t.name for t in self.results[j].node.outputs)
        return frozenset(out)

    def between(self, sources: Sequence[int], sink: int) -> frozenset[int]:
        """Nodes on a path from the ``sources``' outputs to ``sink``'s inputs."""
        fwd: set[int] = set()
        stack = [t.name for s in sources for t in self.results[s].node.outputs]
        while stack:
            for j in self.consumers.get(stack.pop(), ()):
                if j not in fwd and j < sink:
                    fwd.add(j)
                    stack.extend(t.name for t in self.results[j].node.outputs)
        back: set[int] = set()
        stack = [t.name for t in self.results[sink].node.inputs if t is not None]
        while stack:
            i = self.producer.get(stack.pop())
            if i is not None and i not in back and i > min(sources):
                back.add(i)
                stack.extend(t.name for t in self.results[i].node.inputs if t is not None)
        return frozenset(fwd & back)


def _attention(w: Walker, core: int) -> Block | None:
    """The attention block around a Softmax or fused attention node ``core``, or None."""
    node = w.results[core].node
    if w.family(core) == "attention":
        qkv_inputs, out_from = node.inputs, core
        nodes = frozenset({core})
    else:
        # The scores may also meet a mask branch (cumsum, gathers over the attention mask):
        # only the matmul found matters here.
        qk, _ = w.up(node.inputs[:1])
        if len(qk) != 1 or any(w.is_weighted(i) for i in qk):
            return None
        (qk_i,) = qk
        av = w.down(core)
        if len(av) != 1 or any(w.is_weighted(i) for i in av):
            return None
        (av_i,) = av
        qkv_inputs, out_from = (*w.results[qk_i].node.inputs,
                                *w.results[av_i].node.inputs), av_i
        nodes = w.between([qk_i], av_i) | {qk_i, av_i}
    # The probs operand of probs x V leads back to the core itself: not a stop.
    proj, clean = w.up(qkv_inputs, frozenset({core}), QKV_PASS)
    if not proj or not clean or not all(w.is_weighted(i) for i in proj):
        return None
    out = w.down(out_from)
    if len(out) != 1 or not all(w.is_weighted(i) for i in out):
        return None
    (row,) = out
    shape = node.outputs[0].shape or ()
    heads = shape[-3] if len(shape) >= 3 else 0
    return Block("attention", tuple(sorted(proj)), row, w.between(sorted(proj), row), heads,
                 nodes, out_from)


def _mlp(w: Walker, row: int, used: set[int]) -> Block | None:
    node = w.results[row].node
    weight = w.weight(row)
    acts = [t for t in node.inputs[:2] if t is not None and t is not weight
            and not t.is_initializer]
    ups, clean = w.up(acts[:1])
    if not ups or not clean or ups & used or not all(w.is_weighted(i) for i in ups):
        return None
    return Block("mlp", tuple(sorted(ups)), row, w.between(sorted(ups), row), 0)


def _layer_starts(blocks: Sequence[Block]) -> tuple[int, ...]:
    """An attention block after an MLP opens a layer. An MLP after an MLP opens one only in a
    model without attention (a plain MLP stack); in a transformer it is a head (BERT's pooler
    and classifier) and stays in the last layer."""
    attention = any(b.kind == "attention" for b in blocks)
    starts, has_mlp = [], True
    for b in blocks:
        if b.kind == "attention" and has_mlp:
            starts.append(b.start)
            has_mlp = False
        elif b.kind == "mlp":
            if not starts or (has_mlp and not attention):
                starts.append(b.start)
            has_mlp = True
    return tuple(starts)


def _vocab(w: Walker, blocks: Sequence[Block], used: set[int]
           ) -> tuple[int | None, tuple[int, ...]]:
    tables: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(w.results):
        data = r.node.input(0)
        if w.family(i) == "gather" and data is not None and data.is_initializer and data.shape:
            tables[data.shape[0]].append(i)
    # the LM head follows the last attention block (a pooler/classifier may come after it)
    last = max((b.row for b in blocks if b.kind == "attention"), default=-1)
    for i in range(len(w.results) - 1, last, -1):
        weight = w.weight(i) if w.family(i) == "matmul" else None
        if weight is None or i in used:
            continue
        width = w.results[i].node.outputs[0].shape[-1]
        if width in tables:
            return i, tuple(tables[width])
    return None, ()


def recognize(results: Sequence[NodeResult]) -> Structure:
    """Find the attention and MLP blocks, layers, LM head and word embedding of a graph."""
    w = Walker(results)
    blocks: list[Block] = []
    for i in range(len(results)):
        if w.family(i) in ("softmax", "attention"):
            b = _attention(w, i)
            if b is not None and all(b.row != o.row for o in blocks):
                blocks.append(b)
    used = {j for b in blocks for j in (*b.column, b.row)}
    for i in range(len(results)):
        if i not in used and w.is_weighted(i):
            b = _mlp(w, i, used)
            if b is not None:
                blocks.append(b)
                used.update((*b.column, b.row))
    blocks.sort(key=lambda b: b.start)
    warnings = []
    if not any(b.kind == "attention" for b in blocks):
        warnings.append("no attention pattern (Q/K/V projections -> softmax(QK^T)V -> output "
                        "projection) was recognized")
    lm_head, gathers = _vocab(w, blocks, used)
    if lm_head is None:
        warnings.append("no LM head / word embedding pair (a final weighted MatMul as wide as "
                        "a Gather table) was recognized: they stay replicated")
    head = w.descendants(lm_head) if lm_head is not None else frozenset()
    return Structure(tuple(blocks), _layer_starts(blocks),
                     max((b.row for b in blocks), default=-1), lm_head, head, gathers,
                     tuple(warnings))


def node_index(results: Sequence[NodeResult]) -> Mapping[str, int]:
    return {r.node.name: i for i, r in enumerate(results)}
