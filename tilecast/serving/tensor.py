"""Tensor-parallel serving: a model too large for one GPU split over ``tp`` GPUs of a node.

Megatron-style, as vLLM and TensorRT-LLM shard a decoder (``parallel.tensor``: the same
structural recognition and roles as training): the Q/K/V and MLP up projections are
column-parallel, the attention output and MLP down projections row-parallel, the heads (and
their KV cache) split across ranks, the LM head vocabulary-parallel. Each row-parallel output
is all-reduced over the tp GPUs, twice per layer, in the prefill and in every decode step;
the last tokens' logits are all-gathered. Collectives take ``parallel.collectives``'
alpha-beta costs on the cluster's links and are exposed (the next layer waits for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..analyzer.analysis import NodeResult
from ..analyzer.params import parameters
from ..analyzer.types import Kernel
from ..parallel.cluster import Cluster
from ..parallel.collectives import collective_cost, group_span
from ..parallel.structure import Structure
from ..parallel.tensor import check_divisible, roles, shard_kernels
from .depth import Depth


@dataclass(frozen=True)
class TensorPlan:
    """What one of ``tp`` ranks holds and sends, per token of one sequence."""

    tp: int
    cluster: Cluster | None
    allreduce_bytes: tuple[int, ...]  # each row-parallel output, one token (graph's layers)
    logits_bytes: int  # one token's logits (gathered over the vocabulary-parallel ranks)
    weights_bytes: float  # this rank's share of the parameters (all layers)
    depth: Depth = Depth(1, 1)  # layers forecast from the graph's (``depth.py``)
    layer_of: tuple[int | str, ...] = ()  # the segment of each row-parallel output

    def comm_ms(self, tokens: int, sequences: int) -> float:
        """The exposed collectives of a pass over ``tokens`` rows whose ``sequences`` last
        tokens produce logits."""
        if self.tp == 1 or self.cluster is None:
            return 0.0
        span = group_span(self.tp, 1, self.cluster.gpus_per_node)
        ms = sum(self.depth.times(seg) * collective_cost("all-reduce", b * tokens, span,
                                                         self.cluster).latency_ms
                 for b, seg in zip(self.allreduce_bytes, self.layer_of, strict=True))
        if self.logits_bytes:
            ms += collective_cost("all-gather", self.logits_bytes * sequences, span,
                                  self.cluster).latency_ms
        return ms


def plan_tensor(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                tp: int, cluster: Cluster | None, graph_tokens: int,
                depth: Depth | None = None) -> tuple[list[Kernel], TensorPlan]:
    """Each rank's kernels and the plan; tp = 1 leaves the kernels whole. ``depth``: the
    layers forecast from the graph's (their weights and all-reduces repeat)."""
    depth = depth or Depth(s.layers, s.layers)
    if tp == 1:
        return list(kernels), TensorPlan(1, cluster, (), 0, _weights(results, s, depth))
    check_divisible(results, s, tp)
    r = roles(results, s, sequence_parallel=False)
    index = {res.node.name: i for i, res in enumerate(results)}
    ranked = shard_kernels(kernels, results, r, index, tp)
    rows = sorted(r.row)
    per_token = tuple(int(results[i].node.outputs[0].nbytes // graph_tokens) for i in rows)
    logits = results[s.lm_head].node.outputs[0] if s.lm_head is not None else None
    return ranked, TensorPlan(tp, cluster, per_token,
                              int(logits.nbytes // graph_tokens) if logits is not None else 0,
                              _weights(results, s, depth, r.split_tensors, tp), depth,
                              tuple(s.segment(i) for i in rows))


def _weights(results: Sequence[NodeResult], s: Structure, depth: Depth,
             split: frozenset[str] = frozenset(), tp: int = 1) -> float:
    """One rank's parameter bytes: a split tensor's 1/tp, a layer's ``depth`` times (a
    parameter belongs where it is first read)."""
    params = parameters(results)
    first: dict[str, int] = {}
    for i, r in enumerate(results):
        for t in r.node.inputs:
            if t is not None and t.name in params:
                first.setdefault(t.name, i)
    return float(sum(t.nbytes / (tp if name in split else 1)
                     * depth.times(s.segment(first.get(name, 0)))
                     for name, t in params.items()))
