"""How many experts a decode step runs: a few tokens route to a few of a layer's experts.

The graph holds a mixture-of-experts layer in its capacity form (``exporters/moe.py``,
``parallel.experts``): every expert's GEMMs run on its share of the tokens, so every expert's
weights are read. In a prefill of thousands of tokens that is what happens; in a decode step
of ``batch`` new tokens, each picking ``k`` of ``E`` experts, an expert runs only when one of
them picks it: on average ``E (1 - (1 - k / E) ^ batch)`` experts run, each on
``batch k / active`` tokens (Mixtral 8x7B, top-2, one sequence: 2 of 8 experts). A step is
forecast at that expectation: each expert's kernels on the rows an active expert takes, their
time weighted by the share of steps in which the expert runs. ``k`` is read from the
capacity the graph gives each expert (``capacity = tokens x k / E``, Mixtral's export; for
Switch's fixed per-sequence capacity it is an upper bound, so the forecast errs slow).
Routing is taken as uniform: a trained router that favours some experts runs fewer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..analyzer.analysis import NodeResult
from ..parallel.experts import recognize_experts
from ..parallel.structure import Structure


@dataclass(frozen=True)
class Routing:
    """The experts of a decode step: per expert node, the share of steps it runs in; and per
    MoE layer, its experts, their top-k and how many run in a step on average."""

    shares: dict[int, float]
    experts: int = 0  # per MoE layer (the largest layer's; 0: a dense model)
    top_k: int = 0
    active: float = 0.0  # experts a layer runs per step, on average

    def to_dict(self) -> dict[str, int | float] | None:
        if not self.experts:
            return None
        return {"per_layer": self.experts, "top_k": self.top_k,
                "active_per_step": round(self.active, 6)}


def expert_routing(results: Sequence[NodeResult], s: Structure, graph_tokens: int,
                   batch: int) -> Routing:
    """How a decode step of ``batch`` tokens uses the graph's MoE layers (none: a dense
    model, every node runs)."""
    shares: dict[int, float] = {}
    experts = top_k = 0
    active = 0.0
    for g in recognize_experts(results, s):
        if not g.slots:
            continue
        e = g.experts
        k = min(e, max(1, round(e * g.slots / max(graph_tokens, 1))))
        share = 1.0 - (1.0 - k / e) ** batch
        for nodes in g.members:
            shares.update(dict.fromkeys(nodes, share))
        if e >= experts:
            experts, top_k, active = e, k, e * share
    return Routing(shares, experts, top_k, active)
