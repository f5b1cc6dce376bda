"""From per-layer costs to per-stage ranks: pipeline, tensor- and data-parallel collectives,
optimizer step and memory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..analyzer.types import DTYPE_SIZE
from .cluster import Cluster
from .collectives import Span, collective_cost, group_span
from .forecast import GIB, CollectiveForecast, Memory, RankForecast
from .layout import Layout
from .schedule import balanced_stages, one_f_one_b, overlapped_allreduce
from .segments import Segment

MB = 2**20  # DDP's bucket_cap_mb is in MiB
# Optimizer state bytes per parameter beyond weights and gradients (Rajbhandari et al.,
# "ZeRO", SC'20, section 3.1: mixed-precision Adam keeps an fp32 master copy, momentum and
# variance = 12 bytes; in fp32 the weights are the master copy: momentum + variance = 8).
OPTIMIZER_BYTES = {("adam", True): 12, ("adam", False): 8, ("sgd", True): 8,
                   ("sgd", False): 4, ("none", True): 4, ("none", False): 0}


def _stage(units: Sequence[Segment]) -> Segment:
    out = Segment()
    for u in units:
        out.add(u)
    return out


def _priced(group: str, ranks: int, phase: str, calls: Sequence[tuple[str, float]],
            where: Span, layout: Layout, cl: Cluster, stage: int) -> list[CollectiveForecast]:
    """One microbatch's ``calls`` (op, bytes per rank) of one phase, priced on ``where`` and
    counted per step (M microbatches); marked exposed."""
    return [CollectiveForecast(f"{group}.{phase}.{op}.{int(nbytes)}", op, group, phase,
                               int(nbytes), ranks, n * layout.microbatches, c.latency_ms,
                               c.algorithm, c.link, True, stage)
            for (op, nbytes), n in sorted(Counter(calls).items())
            for c in (collective_cost(op, nbytes, where, cl),)]


def _sync_collectives(seg: Segment, layout: Layout, cl: Cluster, stage: int
                      ) -> list[CollectiveForecast]:
    """The collectives inside a microbatch's forward and backward, which the next kernel
    waits for: tensor-parallel all-reduces (or reduce-scatter / all-gather) and the MoE
    layers' all-to-alls. Expert-parallel ranks are data-parallel ranks, tp x cp apart."""
    out = []
    for group, ranks, span, fwd, bwd in (
            ("tp", layout.tp, group_span(layout.tp, 1, cl.gpus_per_node), seg.tp_fwd,
             seg.tp_bwd),
            ("ep", layout.ep, group_span(layout.ep, layout.tp * layout.cp, cl.gpus_per_node),
             seg.ep_fwd, seg.ep_bwd)):
        for phase, calls in (("forward", fwd), ("backward", bwd)):
            out.extend(_priced(group, ranks, phase, calls, span, layout, cl, stage))
    return out


def _expert_share(seg: Segment) -> float:
    """The experts' share of a stage's parameters (reduced and sharded over dp / ep)."""
    return seg.expert_param_bytes / seg.param_bytes if seg.param_bytes else 0.0


def _in_flight(layout: Layout, stage: int) -> float:
    """Microbatches whose activations stage ``stage`` holds at its peak, in whole-stage
    units. 1F1B (Narayanan et al., SC'21): p - stage. Interleaved over v chunks, Megatron-LM's
    warm-up runs (p - stage - 1) x 2 + (v - 1) x p chunk forwards before the first backward
    (schedules.py), so one more chunk of 1/v of the stage is held: on the first stage
    p (1 + (p - 1) / (p v)), the factor of Korthikanti et al. 2022, section 4.2.3."""
    p, v = layout.pp, layout.virtual_stages
    if v == 1:
        return p - stage
    return ((p - stage - 1) * 2 + (v - 1) * p + 1) / v


def _memory(seg: Segment, layout: Layout, cl: Cluster, stage: int, mixed: bool,
            optimizer: str, layers: int) -> Memory:
    z = layout.zero

    def sharded(total: float, expert: float, from_stage: int) -> float:
        """Dense parameters sharded over dp, experts over dp / ep, from ZeRO ``from_stage``."""
        if z < from_stage:
            return total
        return (total - expert) / layout.replicas + expert / layout.expert_dp

    weights = sharded(seg.param_bytes, seg.expert_param_bytes, 3)
    grads = sharded(seg.param_bytes, seg.expert_param_bytes, 2)
    opt = sharded(seg.param_elems, seg.expert_param_elems, 1) \
        * OPTIMIZER_BYTES[(optimizer, mixed)]
    in_flight = min(layout.microbatches, _in_flight(layout, stage))
    if layout.recompute == "full":  # layer inputs kept, one layer's activations rebuilt
        per_mb = seg.hidden_bytes * layers + seg.activation_bytes / max(layers, 1)
    elif layout.recompute == "selective":  # the attention cores' activations dropped
        per_mb = seg.activation_bytes - seg.core_activation_bytes
    else:
        per_mb = seg.activation_bytes
    return Memory(weights, grads, opt, per_mb * in_flight, cl.device.memory_gb * GIB)


def _grad_reduction_end(seg: Segment, bwd_ms: float, layers: Sequence[Segment],
                        layout: Layout, cost_ms: Callable[[float], float]
                        ) -> tuple[float, int]:
    """(when the last gradient reduction ends, ms from the start of the backward; buckets)."""
    if not layout.overlap_grad_reduce:  # the whole buffer, once the backward is done
        return bwd_ms + cost_ms(seg.param_bytes), 1
    # The backward visits the layers last to first; its tensor-parallel all-reduces and
    # recomputation stretch it evenly, so kernel time is scaled to the whole backward.
    scale = bwd_ms / max(sum(u.bwd_ms for u in layers), 1e-12)
    grads, t = [], 0.0
    for u in reversed(layers):
        t += u.bwd_ms * scale
        grads.append((t, u.param_bytes))
    end, buckets, _ = overlapped_allreduce(grads, layout.bucket_mb * MB, cost_ms)
    return end, buckets


def _dp(seg: Segment, bwd_ms: float, layers: Sequence[Segment], layout: Layout, cl: Cluster,
        stage: int) -> tuple[float, list[CollectiveForecast]]:
    """Exposed data-parallel time after the last backward and its collectives. Dense
    gradients are reduced over the dp ranks; experts' over the dp / ep ranks that hold the
    same experts (group ``edp``), one after the other in each bucket. With context
    parallelism the cp ranks of a replica hold the same weights and join the reduction."""
    if layout.replicas == 1:
        return 0.0, []
    share = _expert_share(seg)
    groups = [("dp", layout.replicas, group_span(layout.replicas, layout.tp, cl.gpus_per_node),
               1.0 - share),
              ("edp", layout.expert_dp, group_span(layout.expert_dp, layout.tp * layout.cp
                                                   * layout.ep, cl.gpus_per_node), share)]
    groups = [g for g in groups if g[3] > 0 and g[1] > 1]
    op = "all-reduce" if layout.zero == 0 else "reduce-scatter"

    def cost(o: str, nbytes: float) -> float:
        return sum(collective_cost(o, nbytes * part, span, cl).latency_ms
                   for _, _, span, part in groups)

    end, buckets = _grad_reduction_end(seg, bwd_ms, layers, layout, lambda b: cost(op, b))
    colls = []
    for group, ranks, span, part in groups:
        bucket = seg.param_bytes * part / max(buckets, 1)
        c = collective_cost(op, bucket, span, cl)
        colls.append(CollectiveForecast(f"{group}.grad.{op}", op, group, "backward",
                                        int(bucket), ranks, buckets, c.latency_ms,
                                        c.algorithm, c.link, not layout.overlap_grad_reduce,
                                        stage))
    exposed = max(0.0, end - bwd_ms)
    if layout.zero >= 1:  # the updated shards are gathered back
        for group, ranks, span, part in groups:
            ag = collective_cost("all-gather", seg.param_bytes * part, span, cl)
            colls.append(CollectiveForecast(f"{group}.param.all-gather", "all-gather", group,
                                            "update", int(seg.param_bytes * part), ranks, 1,
                                            ag.latency_ms, ag.algorithm, ag.link, True, stage))
            exposed += ag.latency_ms
    if layout.zero >= 3:  # FSDP gathers each layer's weights again in forward and backward
        fwd = seg.fwd_ms * layout.microbatches
        exposed += max(0.0, cost("all-gather", seg.param_bytes) * layout.microbatches - fwd)
    return exposed, colls


def _recomputed(seg: Segment, layout: Layout) -> tuple[float, float]:
    """(ms, FLOPs) of forward work the backward runs again, per microbatch."""
    if layout.recompute == "full":
        return seg.fwd_ms, seg.fwd_flops
    if layout.recompute == "selective":
        return seg.core_fwd_ms, seg.core_fwd_flops
    return 0.0, 0.0


def _context(seg: Segment, layout: Layout, cl: Cluster, stage: int
             ) -> tuple[float, float, list[CollectiveForecast]]:
    """(exposed forward ms, exposed backward ms, collectives) of one microbatch's
    context-parallel exchanges. Ring: each step's send/recv runs under the attention of the
    chunk at hand, so only what the attention cannot cover is exposed; a ring that crosses
    nodes is paced by its network hop. All-to-all: every call is exposed."""
    if layout.cp == 1:
        return 0.0, 0.0, []
    span = group_span(layout.cp, layout.tp, cl.gpus_per_node)
    ring = layout.cp_comm == "ring"
    where = Span(2, 2 if span.nodes == 1 else 1) if ring else span
    exposed, colls = {}, []
    for phase, calls, hide in (("forward", seg.cp_fwd, seg.core_fwd_ms),
                               ("backward", seg.cp_bwd, seg.core_bwd_ms)):
        priced = _priced("cp", layout.cp, phase, calls, where, layout, cl, stage)
        total = sum(c.count // layout.microbatches * c.latency_ms for c in priced)
        exposed[phase] = max(0.0, total - hide) if ring else total
        colls.extend(replace(c, exposed=exposed[phase] > 0) for c in priced)
    return exposed["forward"], exposed["backward"], colls


def _stage_time(seg: Segment, i: int, layout: Layout, cl: Cluster
                ) -> tuple[float, float, float, list[CollectiveForecast]]:
    """(forward ms, backward ms, per-step communication ms, collectives) of one microbatch
    on stage ``i``: tensor-parallel collectives and MoE all-to-alls are synchronous, so
    they add to the compute, as does what the attention leaves exposed of a
    context-parallel ring; the stage sends activations forward and gradients back."""
    M = layout.microbatches
    colls = _sync_collectives(seg, layout, cl, i)
    tp_f = sum(c.total_ms for c in colls if c.phase == "forward")
    tp_b = sum(c.total_ms for c in colls if c.phase == "backward")
    if layout.recompute == "full":  # the forward runs again, its all-reduces too
        tp_b += tp_f
        bwd = seg.bwd_ms + seg.fwd_ms + tp_b / M
    else:  # selective: the attention cores again (no collective inside them)
        bwd = seg.bwd_ms + _recomputed(seg, layout)[0] + tp_b / M
    fwd = seg.fwd_ms + tp_f / M
    ring_f, ring_b, ring = _context(seg, layout, cl, i)
    colls.extend(ring)
    ring_b += ring_f if layout.recompute != "none" else 0.0  # the rerun attention's exchange
    fwd, bwd = fwd + ring_f, bwd + ring_b
    tp_f, tp_b = tp_f + ring_f * M, tp_b + ring_b * M
    # each of the v chunks on a GPU sends forward and back (the first and last chunk once)
    v = layout.virtual_stages
    sends = 2 * v - (i == 0) - (i == layout.pp - 1) if layout.pp > 1 else 0
    p2p = collective_cost("send-recv", seg.hidden_bytes,
                          group_span(2, layout.tp * layout.replicas, cl.gpus_per_node), cl)
    if sends:
        colls.append(CollectiveForecast(
            "pp.activation.send-recv", "send-recv", "pp", "forward", int(seg.hidden_bytes),
            2, sends * M, p2p.latency_ms, p2p.algorithm, p2p.link, True, i))
    return fwd, bwd + sends * p2p.latency_ms, tp_f + tp_b + sends * p2p.latency_ms * M, colls


def build_stages(units: Sequence[Segment], layout: Layout, cl: Cluster, clip_ms_per_byte,
                 dtype: str, optimizer: str) -> tuple[list[RankForecast], list]:
    cuts = balanced_stages([u.fwd_ms + u.bwd_ms for u in units], layout.pp)
    stages = [_stage(units[a:b]) for a, b in cuts]
    mixed = DTYPE_SIZE.get(dtype, 4) < 4
    collectives: list[CollectiveForecast] = []
    times = [_stage_time(seg, i, layout, cl) for i, seg in enumerate(stages)]
    pipe = one_f_one_b([f + b for f, b, _, _ in times], layout.microbatches,
                       layout.virtual_stages)
    ranks = []
    for i, (seg, (a, b)) in enumerate(zip(stages, cuts, strict=True)):
        _fwd, bwd, comm, colls = times[i]
        collectives.extend(colls)
        dp_exposed, dp_colls = _dp(seg, bwd, units[a:b], layout, cl, i)
        collectives.extend(dp_colls)
        update = seg.update_ms
        if layout.zero >= 1:  # each rank updates its shard: dense 1 / dp, experts 1 / (dp/ep)
            share = _expert_share(seg)
            update *= (1.0 - share) / layout.replicas + share / layout.expert_dp
        if clip_ms_per_byte is not None:
            update += clip_ms_per_byte * seg.param_bytes
        flops = (seg.fwd_flops + seg.bwd_flops + _recomputed(seg, layout)[1]) \
            * layout.microbatches
        ranks.append(RankForecast(
            i, (a, b), pipe.busy_ms[i] - comm, comm + dp_exposed,
            pipe.total_ms - pipe.busy_ms[i], update, pipe.total_ms + dp_exposed + update,
            flops, _memory(seg, layout, cl, i, mixed, optimizer, b - a)))
    return ranks, collectives
