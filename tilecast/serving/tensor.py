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


@dataclass(frozen=True)
class TensorPlan:
    """What one of ``tp`` ranks holds and sends, per token of one sequence."""

    tp: int
    cluster: Cluster | None
    allreduce_bytes: tuple[int, ...]  # each row-parallel output, one token (all layers)
    logits_bytes: int  # one token's logits (gathered over the vocabulary-parallel ranks)
    weights_bytes: float  # this rank's share of the parameters

    def comm_ms(self, tokens: int, sequences: int) -> float:
        """The exposed collectives of a pass over ``tokens`` rows whose ``sequences`` last
        tokens produce logits."""
        if self.tp == 1 or self.cluster is None:
            return 0.0
        span = group_span(self.tp, 1, self.cluster.gpus_per_node)
        ms = sum(collective_cost("all-reduce", b * tokens, span, self.cluster).latency_ms
                 for b in self.allreduce_bytes)
        if self.logits_bytes:
            ms += collective_cost("all-gather", self.logits_bytes * sequences, span,
                                  self.cluster).latency_ms
        return ms


def plan_tensor(kernels: Sequence[Kernel], results: Sequence[NodeResult], s: Structure,
                tp: int, cluster: Cluster | None, graph_tokens: int,
                ) -> tuple[list[Kernel], TensorPlan]:
    """Each rank's kernels and the plan; tp = 1 leaves the kernels whole."""
    params = parameters(results)
    if tp == 1:
        whole = float(sum(t.nbytes for t in params.values()))
        return list(kernels), TensorPlan(1, cluster, (), 0, whole)
    check_divisible(results, s, tp)
    r = roles(results, s, sequence_parallel=False)
    index = {res.node.name: i for i, res in enumerate(results)}
    ranked = shard_kernels(kernels, results, r, index, tp)
    outputs = [results[i].node.outputs[0] for i in sorted(r.row)]
    per_token = tuple(int(t.nbytes // graph_tokens) for t in outputs)
    logits = results[s.lm_head].node.outputs[0] if s.lm_head is not None else None
    weights = sum(t.nbytes / (tp if name in r.split_tensors else 1)
                  for name, t in params.items())
    return ranked, TensorPlan(tp, cluster, per_token,
                              int(logits.nbytes // graph_tokens) if logits is not None else 0,
                              float(weights))
