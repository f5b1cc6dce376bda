"""The kernels of one KV-cached decode step, derived from the prefill graph's kernels.

A decode step runs every token-wise kernel (embedding, linears, norms, elementwise, LM head)
on one new token per sequence: from a graph of ``prompt`` tokens per sequence, every kernel
on 1 / prompt of its token rows (the context-parallel split of ``parallel`` at cp = prompt,
``parallel.rows.scale_rows``), so every linear runs on ``batch`` rows. Another batch than the
graph's scales every kernel's rows, and each attention's batch x heads, the same way.

Each attention core (Q K^T through probs x V) becomes one fused decode-attention kernel per
layer, as serving engines run it (PagedAttention in vLLM, Kwon et al., SOSP 2023;
FlashDecoding): the new token's query against every cached key. Its work is memory-bound: it
reads the layer's cached K and V over ``context`` tokens (as projected, before a grouped-query
repeat) plus the query and writes the output, with 4 x heads x context x head-dim FLOPs per
sequence, so it is costed by its bytes (the predictor's memory-bound rule), not as three
eager GEMM kernels with one-row tiles. The cache is pass state (``OpCost.state_bytes``): a
layer's K and V were last read a whole step ago, with every other layer's weights and cache
streamed since, so they come from DRAM once the step's weights and caches outgrow the L2,
however small one layer's cache is (before, a 38 MB cache on the L4's 48 MB L2 read as
resident). Writing the new token's K and V into the cache is one
small copy per layer (a paged cache's slot write; Hugging Face's eager ``DynamicCache``
concatenates, copying the whole cache every step, which is not modelled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction

from ..analyzer.analysis import NodeResult
from ..analyzer.types import DTYPE_SIZE, Kernel, OpCost
from ..parallel.context import kv_bytes
from ..parallel.rows import scale_rows
from ..parallel.structure import Block, Structure
from ..parallel.tensor import rescale_matmul


def _index(results: Sequence[NodeResult]) -> dict[str, int]:
    return {r.node.name: i for i, r in enumerate(results)}


def _node(k: Kernel, index: dict[str, int]) -> int | None:
    return index.get(k.nodes[0]) if k.nodes else None


def _rows(k: Kernel, num: int, den: int) -> Kernel:
    """``k`` on num / den times its token rows (a product's M, another kernel's rows)."""
    return replace(k, cost=scale_rows(k.cost, k.cost.matmul, num, den))


def _attention(results: Sequence[NodeResult], b: Block, prompt: int, context: int,
               layer: int, sequences: Fraction) -> list[Kernel]:
    """The fused decode attention of block ``b`` over ``context`` cached tokens, and the
    cache write of the new token's K and V; ``sequences``: the batch over the graph's."""
    out = results[b.core_out].node.outputs[0]  # (batch, heads, prompt, head dim) values
    per_token = int(out.numel // prompt * sequences)  # batch x heads x head dim
    cache = int(kv_bytes(results, b) * sequences)  # every sequence's prompt K and V
    size = DTYPE_SIZE.get(out.dtype, 4)
    cached = cache * context // prompt  # K and V over the context: last read a step ago
    # FlashDecoding (FlashAttention's KV-cache kernel, the default decode attention of vLLM and
    # SGLang on Ampere and newer) runs Q K^T and P V as tensor-core MMAs: the matrix peak.
    attend = OpCost("attention", 4 * per_token * context, int(cached + 2 * per_token * size),
                    out.dtype, unit="matrix", elements=per_token * context,
                    state_bytes=int(cached))
    new = max(cache // prompt, 1)  # one token's K and V: read, then written to the cache
    write = OpCost("movement", 0, 2 * new, out.dtype, elements=max(int(new // size), 1))
    core = (results[min(b.core)].node.name,)  # the layer's: repeated with it (--layers)
    return [Kernel(f"decode_attention.{layer}", core, "DecodeAttention", attend),
            Kernel(f"kv_cache.write.{layer}", core, "KVCacheWrite", write)]


def prefill_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                    prompt: int, batch: int, graph_batch: int) -> list[Kernel]:
    """The prefill's kernels for ``batch`` sequences, from the graph's ``graph_batch``: every
    kernel on batch / graph_batch times its work (an attention core's products on that many
    more batch x heads, the rest on that many more rows), and the LM head and what follows it
    on the last token of each sequence only (generation needs no other logits; Hugging Face
    ``generate`` passes ``logits_to_keep=1`` and serving engines do the same). One
    tensor-parallel rank's kernels scale the same way."""
    index = _index(results)
    core = frozenset(i for blk in s.blocks for i in blk.core)
    head = {s.lm_head, *s.head_region} if s.lm_head is not None else set()
    out = []
    for k in kernels:
        i, d = _node(k, index), k.cost.matmul
        if i in core and d is not None and d.b * batch % graph_batch == 0:
            k = replace(k, cost=rescale_matmul(k.cost, replace(d, b=d.b * batch // graph_batch)))
        elif batch != graph_batch:
            k = _rows(k, batch, graph_batch)
        out.append(_rows(k, 1, prompt) if i in head else k)
    return out


def decode_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                   prompt: int, context: int, batch: int, graph_batch: int,
                   tp: int = 1, shares: Mapping[int, float] | None = None) -> list[Kernel]:
    """The kernels of the decode step of ``batch`` sequences whose query attends over
    ``context`` keys, from the kernels of a forward pass over ``graph_batch`` sequences of
    ``prompt`` tokens, in launch order: every token-wise kernel on ``batch`` rows, each
    attention core as one fused decode-attention kernel and a cache write (over 1/tp of the
    heads on a tensor-parallel rank, whose other kernels ``kernels`` already are). An
    expert's kernels (``shares``: node -> the share of steps its expert runs, ``experts.py``)
    take the rows of an expert that runs: 1 / share of its share of the tokens."""
    index = _index(results)
    blocks = [b for b in s.blocks if b.kind == "attention" and b.core]
    owner = {i: n for n, b in enumerate(blocks) for i in b.core}
    sequences = Fraction(batch, graph_batch * tp)
    step, done = [], set()
    for k in kernels:
        i = _node(k, index)
        if shares and i in shares:
            share = Fraction(shares[i]).limit_denominator(1 << 16)
            step.append(_rows(k, batch * share.denominator,
                              graph_batch * prompt * share.numerator))
        elif i not in owner:
            step.append(_rows(k, batch, graph_batch * prompt))
        elif owner[i] not in done:  # the core's first kernel: the fused attention instead
            done.add(owner[i])
            step.extend(_attention(results, blocks[owner[i]], prompt, context, owner[i],
                                   sequences))
    return step


__all__ = ["decode_kernels", "prefill_kernels"]
