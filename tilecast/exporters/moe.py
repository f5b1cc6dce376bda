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

Top-k models (transformers' expert collections: Mixtral, Qwen-MoE, DeepSeek-V3, OLMoE, ...,
whose experts are 3-D parameters looped over with ``nonzero`` or grouped GEMMs with
data-dependent offsets) get the GShard form (Lepikhin et al. 2021): each expert has
``capacity = ceil(tokens x top_k / experts)`` slots, its mean share of the token choices
(balanced routing; choices beyond it are dropped; with fewer choices than experts, one
expert per choice runs, one slot each), filled in token order by a gather of the token
rows, and each token sums its choices' outputs, weighted by the router, gathered back.
The permutation is index gathers (bytes linear in the tokens), as Megatron-core's and
DeepSpeed's token dispatchers move tokens, not a one-hot matmul (FLOPs quadratic in them).
Each expert's weights become a 2-D parameter of their own, so every expert is a plain MLP
in the graph (``tilecast.parallel`` recognizes MoE layers by that structure).
"""

from __future__ import annotations

import types
from typing import Any

SWITCH_SPARSE_MLP = "SwitchTransformersSparseMLP"


# Per-expert parameters of transformers' expert collections (transformers.integrations.moe),
# each (experts, ...): split into one 2-D parameter per expert.
EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
                 "down_proj_bias")


def make_static(model: Any) -> int:
    """Re-bind every known dynamic MoE layer of ``model`` to its static form; return count."""
    count = 0
    for module in list(model.modules()):
        if type(module).__name__ == SWITCH_SPARSE_MLP:
            router = module.router
            # transformers casts the router to float32 on its first call; do it up front.
            router.classifier.to(router.dtype)
            module.forward = types.MethodType(_switch_forward, module)
            count += 1
        elif _is_expert_collection(module):
            _split_experts(module)
            module.forward = types.MethodType(_topk_forward, module)
            count += 1
    return count


def _is_expert_collection(module: Any) -> bool:
    """transformers' ``@use_experts_implementation`` classes: 3-D expert weights, a gate flag."""
    down = getattr(module, "down_proj", None)
    return (hasattr(module, "has_gate") and isinstance(getattr(module, "num_experts", None), int)
            and getattr(down, "ndim", 0) == 3 and down.shape[0] == module.num_experts)


def _split_experts(module: Any) -> None:
    import torch

    for name in EXPERT_PARAMS:
        p = getattr(module, name, None)
        if isinstance(p, torch.nn.Parameter) and p.shape[0] == module.num_experts:
            delattr(module, name)
            setattr(module, name, torch.nn.ParameterList(
                torch.nn.Parameter(torch.empty_like(p[e]), requires_grad=p.requires_grad)
                for e in range(module.num_experts)))


def _expert(self: Any, x: Any, e: int) -> Any:
    """Expert ``e`` of a collection on its slots (transformers' per-expert math)."""
    import torch

    def linear(v: Any, name: str) -> Any:
        w = getattr(self, name)[e]
        out = v @ w if self.is_transposed else torch.nn.functional.linear(v, w)
        return out + getattr(self, f"{name}_bias")[e] if self.has_bias else out

    out = linear(x, "gate_up_proj" if self.has_gate else "up_proj")
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = linear(out, "down_proj")
    return self.post_expert_norm(out) if getattr(self, "has_post_expert_norm", False) else out


def _topk_forward(self: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """(tokens, width) through ``num_experts`` experts of ``capacity`` slots, top-k routed."""
    import torch

    tokens, width = hidden.shape
    k = top_k_index.shape[-1]
    choices = tokens * k
    # With fewer choices than experts (decode at a small batch) only the chosen experts run,
    # at most one per choice: each choice gets an expert of its own (the most weights a
    # step can read), one slot each.
    experts = min(self.num_experts, choices)
    capacity = -(-choices // experts)
    choice = top_k_index.reshape(-1)  # (tokens * k,), token-major
    if experts < self.num_experts:
        dest = torch.arange(choices, device=hidden.device)
    else:
        onehot = torch.nn.functional.one_hot(choice, experts)
        position = ((torch.cumsum(onehot, 0) - 1) * onehot).sum(-1)
        # Slot of each choice in the flattened (experts * capacity) buffer; over capacity:
        # the spare zero row at the end.
        dest = torch.where(position < capacity, choice * capacity + position,
                           experts * capacity)
    source = torch.arange(choices, device=hidden.device) // k
    index = torch.full((experts * capacity + 1,), tokens, dtype=torch.long,
                       device=hidden.device).scatter(0, dest, source)[:-1]
    padded = torch.cat([hidden, hidden.new_zeros(1, width)])
    expert_in = padded[index].reshape(experts, capacity, width)
    outs = [_expert(self, expert_in[e], e) for e in range(experts)]
    expert_out = torch.cat([torch.stack(outs).reshape(experts * capacity, width),
                            hidden.new_zeros(1, width)])
    picked = expert_out[dest] * top_k_weights.reshape(-1, 1).to(hidden.dtype)
    return picked.reshape(tokens, k, width).sum(1)


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
