"""The kernels of one KV-cached decode step, derived from the prefill graph's kernels.

A decode step runs every token-wise kernel (embedding, linears, norms, elementwise, LM head)
on one new token per sequence: from a graph of ``prompt`` tokens per sequence, the
context-parallel split at cp = prompt (``parallel.context``: 1/cp of the tokens), so every
linear runs on ``batch`` rows.

Each attention core (Q K^T through probs x V) becomes one fused decode-attention kernel per
layer, as serving engines run it (PagedAttention in vLLM, Kwon et al., SOSP 2023;
FlashDecoding): the new token's query against every cached key. Its work is memory-bound: it
reads the layer's cached K and V over ``context`` tokens (as projected, before a grouped-query
repeat) plus the query and writes the output, with 4 x heads x context x head-dim FLOPs per
sequence, so it is costed by its bytes (the predictor's memory-bound rule), not as three
eager GEMM kernels with one-row tiles. Writing the new token's K and V into the cache is one
small copy per layer (a paged cache's slot write; Hugging Face's eager ``DynamicCache``
concatenates, copying the whole cache every step, which is not modelled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..analyzer.analysis import NodeResult
from ..analyzer.types import DTYPE_SIZE, Kernel, OpCost
from ..parallel.context import context_kernels, kv_bytes
from ..parallel.rows import scale_rows
from ..parallel.structure import Block, Structure


def _attention(results: Sequence[NodeResult], b: Block, prompt: int, context: int,
               layer: int) -> list[Kernel]:
    """The fused decode attention of block ``b`` over ``context`` cached tokens, and the
    cache write of the new token's K and V."""
    out = results[b.core_out].node.outputs[0]  # (batch, heads, prompt, head dim) values
    per_token = out.numel // prompt  # batch x heads x head dim
    cache = kv_bytes(results, b)  # every sequence's K and V over the prompt
    size = DTYPE_SIZE.get(out.dtype, 4)
    nbytes = cache * context // prompt + 2 * per_token * size
    attend = OpCost("attention", 4 * per_token * context, int(nbytes), out.dtype,
                    elements=per_token * context)
    new = max(cache // prompt, 1)  # one token's K and V: read, then written to the cache
    write = OpCost("movement", 0, 2 * new, out.dtype, elements=max(int(new // size), 1))
    return [Kernel(f"decode_attention.{layer}", (), "DecodeAttention", attend),
            Kernel(f"kv_cache.write.{layer}", (), "KVCacheWrite", write)]


def prefill_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                    prompt: int) -> list[Kernel]:
    """The prefill's kernels: the forward pass, with the LM head and what follows it on the
    last token of each sequence only (generation needs no other logits; Hugging Face
    ``generate`` passes ``logits_to_keep=1`` and serving engines do the same)."""
    if s.lm_head is None:
        return list(kernels)
    head = {s.lm_head, *s.head_region}
    index = {r.node.name: i for i, r in enumerate(results)}
    out = []
    for k in kernels:
        i = index.get(k.nodes[0]) if k.nodes else None
        out.append(replace(k, cost=scale_rows(k.cost, None if k.cost.matmul is None
                                              else k.cost.matmul, 1, prompt))
                   if i in head else k)
    return out


def decode_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                   prompt: int, context: int) -> list[Kernel]:
    """The kernels of the decode step whose query attends over ``context`` keys, from the
    kernels of a forward pass over ``prompt`` tokens per sequence, in launch order."""
    index = {r.node.name: i for i, r in enumerate(results)}
    blocks = [b for b in s.blocks if b.kind == "attention" and b.core]
    owner = {i: n for n, b in enumerate(blocks) for i in b.core}
    step, done = [], set()
    for k in context_kernels(kernels, results, index, prompt, {}):
        i = index.get(k.nodes[0]) if k.nodes else None
        if i not in owner:
            step.append(k)
        elif owner[i] not in done:  # the core's first kernel: the fused attention instead
            done.add(owner[i])
            step.extend(_attention(results, blocks[owner[i]], prompt, context, owner[i]))
    return step


__all__ = ["decode_kernels", "prefill_kernels"]
