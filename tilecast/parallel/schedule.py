"""Time models: balanced pipeline stages, the 1F1B schedule, and DDP's bucketed gradient
all-reduce overlapped with the backward pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


def balanced_stages(costs: Sequence[float], stages: int) -> list[tuple[int, int]]:
    """Split ``costs`` (per layer, in order) into ``stages`` contiguous [first, last) ranges
    minimizing the largest stage sum (the classic linear-partition dynamic programme)."""
    n = len(costs)
    if stages > n:
        raise ValueError(f"{stages} pipeline stages need at least {stages} layers, got {n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                v = max(best[s - 1][i], prefix[j] - prefix[i])
                if v < best[s][j]:
                    best[s][j], cut[s][j] = v, i
    out, j = [], n
    for s in range(stages, 0, -1):
        i = cut[s][j]
        out.append((i, j))
        j = i
    return out[::-1]


@dataclass(frozen=True)
class PipelineTime:
    total_ms: float  # first forward to last backward, all microbatches
    busy_ms: tuple[float, ...]  # per stage: microbatches x its own work


def one_f_one_b(stage_ms: Sequence[float], microbatches: int, virtual: int = 1
                ) -> PipelineTime:
    """1F1B (Narayanan et al., SC'21, section 2.2): the first microbatch crosses every stage,
    then the slowest stage sets the pace for the other M-1. With equal stages this is
    (M + P - 1) x t, a bubble fraction of (P - 1) / (M + P - 1). Interleaved over ``virtual``
    model chunks per GPU (section 2.2.2) the fill and drain cross chunks of 1/v of a stage:
    M x t + (P - 1) x t / v."""
    top = max(stage_ms)
    total = microbatches * top + (sum(stage_ms) - top) / virtual
    return PipelineTime(total, tuple(microbatches * t for t in stage_ms))


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    fill = (stages - 1) / virtual
    return fill / (microbatches + fill)


def overlapped_allreduce(grads: Sequence[tuple[float, float]], bucket_bytes: float,
                         cost_ms: Callable[[float], float]) -> tuple[float, int, float]:
    """DDP: gradients fill buckets in the order the backward produces them; a bucket's
    all-reduce starts when its last gradient is ready and the previous bucket's is done.

    ``grads``: (ready time in ms from the start of the backward, bytes), in backward order.
    Returns (time the last all-reduce ends, number of buckets, total all-reduce ms)."""
    end, buckets, spent, fill, ready = 0.0, 0, 0.0, 0.0, 0.0
    for t, nbytes in grads:
        fill += nbytes
        ready = t
        if fill >= bucket_bytes:
            d = cost_ms(fill)
            end, spent, buckets, fill = max(end, ready) + d, spent + d, buckets + 1, 0.0
    if fill > 0:
        d = cost_ms(fill)
        end, spent, buckets = max(end, ready) + d, spent + d, buckets + 1
    return end, buckets, spent
