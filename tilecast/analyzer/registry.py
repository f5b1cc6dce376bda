"""The cost registry: one explicit table keyed by (domain, op_type) with opset ranges.

Every node gets exactly one of three outcomes:
- costed: a formula from ``analyzer/costs/`` returns an :class:`OpCost`;
- zero-cost: the op moves no data on the GPU (metadata only, e.g. Reshape); each has a reason;
- unsupported: no entry. Callers count it and give it a flagged bytes-only estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .types import NodeView, OpCost

CostFn = Callable[[NodeView], OpCost]
# An op that launches several kernels (an RNN's per-step GEMMs, an einsum's pairwise
# contractions): (name suffix, cost) per kernel, in launch order.
StepsFn = Callable[[NodeView], list[tuple[str, OpCost]]]
# Its backward, given the set of input names that need a gradient.
BackwardStepsFn = Callable[[NodeView, set[str]], list[tuple[str, OpCost]]]
ONNX_DOMAINS = ("", "ai.onnx")
MAX_OPSET = 10_000


def _norm_domain(domain: str) -> str:
    return "" if domain in ONNX_DOMAINS else domain


@dataclass(frozen=True)
class CostEntry:
    domain: str
    op_type: str
    fn: CostFn
    since: int = 1
    until: int = MAX_OPSET  # inclusive

    def covers(self, opset: int) -> bool:
        # opset 0 means "unknown": accept any entry for the op.
        return opset == 0 or self.since <= opset <= self.until


@dataclass(frozen=True)
class ZeroCost:
    domain: str
    op_type: str
    reason: str


class CostRegistry:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], list[CostEntry]] = {}
        self._zero: dict[tuple[str, str], ZeroCost] = {}

    def register(self, domain: str, op_type: str, fn: CostFn, *, since: int = 1,
                 until: int = MAX_OPSET) -> None:
        key = (_norm_domain(domain), op_type)
        if key in self._zero:
            raise ValueError(f"{key} is already registered as zero-cost")
        entries = self._entries.setdefault(key, [])
        for e in entries:
            if e.since <= until and since <= e.until:
                raise ValueError(f"cost formula for {key} opsets {since}-{until} overlaps "
                                 f"the one registered for {e.since}-{e.until}")
        entries.append(CostEntry(key[0], op_type, fn, since, until))

    def register_zero(self, domain: str, op_type: str, reason: str) -> None:
        key = (_norm_domain(domain), op_type)
        if key in self._zero or key in self._entries:
            raise ValueError(f"{key} is already registered")
        self._zero[key] = ZeroCost(key[0], op_type, reason)

    def lookup(self, domain: str, op_type: str, opset: int = 0) -> CostEntry | ZeroCost | None:
        key = (_norm_domain(domain), op_type)
        if key in self._zero:
            return self._zero[key]
        for e in self._entries.get(key, ()):
            if e.covers(opset):
                return e
        return None

    def entries(self) -> Iterator[CostEntry]:
        for es in self._entries.values():
            yield from es

    def zero_cost(self) -> Iterator[ZeroCost]:
        yield from self._zero.values()


REGISTRY = CostRegistry()
STEPS: dict[tuple[str, str], StepsFn] = {}
BACKWARD_STEPS: dict[tuple[str, str], BackwardStepsFn] = {}


def summed(steps: StepsFn, family: str) -> CostFn:
    """The node's one-line cost: its kernels' FLOPs and bytes added up (``STEPS`` keeps the
    kernels themselves; ``steps.expand_steps`` launches them)."""

    def fn(node: NodeView) -> OpCost:
        parts = [c for _, c in steps(node)]
        if len(parts) == 1:
            return parts[0]
        main = max(parts, key=lambda c: c.flops)
        return OpCost(family, sum(c.flops for c in parts), sum(c.bytes for c in parts),
                      main.dtype, unit=main.unit, elements=parts[-1].elements)

    return fn


def register_steps(op_type: str, steps: StepsFn, family: str, *, domain: str = "",
                   backward: BackwardStepsFn | None = None) -> None:
    """Register an op that launches several kernels: its summed cost, its steps and, when
    given, the kernels of its backward (training mode)."""
    REGISTRY.register(domain, op_type, summed(steps, family))
    STEPS[(_norm_domain(domain), op_type)] = steps
    if backward is not None:
        BACKWARD_STEPS[(_norm_domain(domain), op_type)] = backward


def cost(op_type: str, *, domain: str = "", since: int = 1,
         until: int = MAX_OPSET, registry: CostRegistry | None = None,
         ) -> Callable[[CostFn], CostFn]:
    """Decorator: ``@cost("MatMul")`` registers a formula in the global registry."""

    def deco(fn: CostFn) -> CostFn:
        (registry or REGISTRY).register(domain, op_type, fn, since=since, until=until)
        return fn

    return deco


def register_all(op_types: list[str] | tuple[str, ...], fn: CostFn, *, domain: str = "") -> None:
    """Register one formula (usually from a factory) for several op types."""
    for op in op_types:
        REGISTRY.register(domain, op, fn)
