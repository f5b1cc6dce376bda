"""Pair the kernels of two forecasts of (nearly) the same model.

Three passes, each over the kernels the earlier passes left unpaired, in launch order:
1. the same kernel name;
2. the same name stem (trailing exporter counters such as ``_87`` dropped) and signature;
3. the same signature alone, for renamed nodes.
The signature is (op_type, family, phase, flops, bytes): two kernels with equal signatures do
the same work, so pairing them never hides a cost change.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from ..analyzer.forecast import KernelForecast

# A counter an exporter or builder appended to a node name ("MatMul_87", "/attn/MatMul_1.dA").
_COUNTER = re.compile(r"_\d+(?=$|[./])")


def signature(k: KernelForecast) -> tuple[str, str, str, int, int]:
    kernel = k.kernel
    return (kernel.op_type, kernel.family, kernel.phase, kernel.flops, kernel.bytes)


def name_stem(name: str) -> str:
    return _COUNTER.sub("", name)


@dataclass(frozen=True)
class Matching:
    """Indices into the base and new kernel sequences."""

    pairs: tuple[tuple[int, int], ...]  # (base index, new index), in new launch order
    removed: tuple[int, ...]  # base kernels with no partner
    added: tuple[int, ...]  # new kernels with no partner


_PASSES: tuple[Callable[[KernelForecast], Hashable], ...] = (
    lambda k: k.kernel.name,
    lambda k: (name_stem(k.kernel.name), signature(k)),
    signature,
)


def match_kernels(base: Sequence[KernelForecast], new: Sequence[KernelForecast]) -> Matching:
    free_base = list(range(len(base)))
    free_new = list(range(len(new)))
    pairs: list[tuple[int, int]] = []
    for key in _PASSES:
        waiting: dict[Hashable, deque[int]] = {}
        for j in free_new:
            waiting.setdefault(key(new[j]), deque()).append(j)
        still_free = []
        for i in free_base:
            queue = waiting.get(key(base[i]))
            if queue:
                pairs.append((i, queue.popleft()))
            else:
                still_free.append(i)
        taken = {j for _, j in pairs}
        free_base, free_new = still_free, [j for j in free_new if j not in taken]
    pairs.sort(key=lambda p: p[1])
    return Matching(tuple(pairs), tuple(free_base), tuple(free_new))
