"""Static (padded-capacity) mixture-of-experts layers, so MoE graphs export with fixed shapes.

transformers' Switch Transformers layer picks each expert's tokens with ``nonzero`` and
boolean indexing: data-dependent shapes that cannot be traced on the meta device (and would
give no static cost anyway). Here each sparse MLP is re-bound to the Switch Transformer
paper's formulation: every expert processes exactly ``capacity`` token slots per sequence
(capacity = min(config.expert_capacity, seq)), filled by a dispatch matmul and scattered back
by a combine matmul weighted by the router probability. Routing math is transformers' router
(float32 router, top-1, cumulative-sum priority, tokens over capacity dropped), restated
without its ``self.classifier = self.classifier.to(...)``: a module mutation inside forward
that torch.export's non-strict tracer rejects (it then falls back to the ~4x slower strict
dynamo trace).
"""

from __future__ import annotations

import types
from typing import Any

SWITCH_SPARSE_MLP = "SwitchTransformersSparseMLP"


def make_static(model: Any) -> int:
    """Re-bind every known dynamic MoE layer of ``model`` to its static form; return count."""
    count = 0
    for module in model.modules():
        if type(module).__name__ == SWITCH_SPARSE_MLP:
            router = module.router
            # transformers casts the router to float32 on its first call; do it up front.
            router.classifier.to(router.dtype)
            module.forward = types.MethodType(_switch_forward, module)
            count += 1
    return count


def _switch_forward(self: Any, hidden: Any) -> Any:
    """Top-1 routing to ``num_experts`` experts of ``capacity`` slots per sequence."""
    import torch

    batch, seq, width = hidden.shape
    experts = self.router.num_experts
    capacity = min(int(self.router.expert_capacity), seq)
    expert_index, priority, router_probs = _route(self.router, hidden)
    # Slot of each token in its expert's buffer (-1: not routed / dropped).
    slot = priority * expert_index - 1
    slots = torch.arange(capacity, device=hidden.device)
    dispatch = (slot.unsqueeze(-1) == slots).to(hidden.dtype).reshape(batch, seq, -1)
    expert_in = torch.matmul(dispatch.transpose(1, 2), hidden)  # (batch, E*C, width)
    expert_in = expert_in.reshape(batch, experts, capacity, width).transpose(0, 1)
    expert_in = expert_in.reshape(experts, batch * capacity, width)
    outs = [self.experts[f"expert_{e}"](expert_in[e]) for e in range(experts)]
    expert_out = torch.stack(outs).reshape(experts, batch, capacity, width).transpose(0, 1)
    combine = dispatch * router_probs.to(hidden.dtype)  # (batch, seq, E*C)
    return torch.matmul(combine, expert_out.reshape(batch, experts * capacity, width))


def _route(router: Any, hidden: Any) -> tuple[Any, Any, Any]:
    """transformers' SwitchTransformersTop1Router.forward (eval), minus the module mutation.

    Returns the one-hot expert choice with over-capacity tokens masked out, each token's
    priority (1-based position among its expert's tokens) and the chosen probability.
    """
    import torch

    logits = router.classifier(hidden.to(router.dtype))
    probs = torch.softmax(logits, dim=-1, dtype=router.dtype).to(hidden.dtype)
    index = torch.nn.functional.one_hot(torch.argmax(probs, dim=-1), router.num_experts)
    priority = torch.cumsum(index, dim=-2)
    index = index * (priority <= router.expert_capacity)
    return index, priority, torch.max(probs, dim=-1).values.unsqueeze(-1)
