"""The values a distributed forecast returns: per-stage ranks, collectives, memory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ..analyzer.forecast import KernelForecast
from ..analyzer.types import Kernel, OpCost
from .cluster import Cluster
from .layout import Layout
from .run import TrainingRun

GIB = 2**30  # HBM capacities are binary: an "80GB" A100 reports 81920 MiB


def _r(x: float) -> float:
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class CollectiveForecast:
    """One kind of collective a rank runs: ``count`` times per step, each ``latency_ms``."""

    name: str
    op: str  # all-reduce | reduce-scatter | all-gather | send-recv | all-to-all
    group: str  # tp | cp | ep | dp | edp (experts' data-parallel ranks) | pp
    phase: str  # forward | backward | update
    bytes: int  # per call and rank
    ranks: int
    count: int  # calls per step
    latency_ms: float  # per call
    algorithm: str
    link: str
    exposed: bool  # False where it overlaps compute (DDP buckets during the backward)
    stage: int = 0

    @property
    def total_ms(self) -> float:
        return self.count * self.latency_ms

    def kernel(self, dtype: str = "float32") -> KernelForecast:
        """The collective as a kernel of family ``collective`` (bytes: per rank and call)."""
        op_type = "".join(w.capitalize() for w in self.op.split("-"))
        k = Kernel(self.name, (), op_type, OpCost("collective", 0, self.bytes, dtype),
                   self.phase if self.phase in ("forward", "backward", "update") else "update")
        return KernelForecast(k, self.latency_ms, "communication", None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(family="collective", latency_ms=_r(self.latency_ms),
                 total_ms=_r(self.total_ms))
        return d


@dataclass(frozen=True)
class Memory:
    """Bytes one GPU of a stage holds at its peak."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def to_dict(self) -> dict[str, Any]:
        return {"weights_gib": _r(self.weights / GIB), "gradients_gib": _r(self.gradients / GIB),
                "optimizer_gib": _r(self.optimizer / GIB),
                "activations_gib": _r(self.activations / GIB), "total_gib": _r(self.total / GIB),
                "capacity_gib": _r(self.capacity / GIB), "fits": self.fits}


@dataclass(frozen=True)
class RankForecast:
    """One pipeline stage (every tensor- and data-parallel rank of it is alike)."""

    stage: int
    layers: tuple[int, int]  # [first, last) transformer layers
    compute_ms: float  # kernels, all microbatches (recomputation included)
    exposed_comm_ms: float  # tensor-parallel + pipeline send/recv + exposed data-parallel
    bubble_ms: float
    update_ms: float  # optimizer step and gradient clipping
    step_ms: float
    flops: float  # per rank and step
    memory: Memory

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "layers": list(self.layers),
                "compute_ms": _r(self.compute_ms), "exposed_comm_ms": _r(self.exposed_comm_ms),
                "bubble_ms": _r(self.bubble_ms), "update_ms": _r(self.update_ms),
                "step_ms": _r(self.step_ms), "tflop": _r(self.flops / 1e12),
                "memory": self.memory.to_dict()}


@dataclass(frozen=True)
class ParallelForecast:
    model: str
    cluster: Cluster
    layout: Layout
    predictor: str
    layers: int  # transformer layers forecast (after replication)
    graph_layers: int  # layers in the analyzed graph
    microbatch: int  # samples per microbatch (the graph's batch)
    ranks: tuple[RankForecast, ...]
    collectives: tuple[CollectiveForecast, ...]
    warnings: tuple[str, ...] = ()
    runtime: str = "eager"  # how each rank issues its kernels (analyzer.runtime)
    experts: int = 0  # experts per MoE layer of the graph (0: a dense model)
    sequence: int = 0  # the attention's query length (0: no attention recognized)
    run: TrainingRun | None = None  # a whole run at this step (``run.plan_run``), if asked
    peak_tflops: float = 0.0  # per-GPU peak of the GEMMs' dtype (0: unknown)
    math: str = "graph"  # the arithmetic (analyzer.mathmode.MATH_MODES)
    memory_format: str = "nchw"  # PyTorch's activation layout (analyzer.runtime)

    @property
    def step_ms(self) -> float:
        return max(r.step_ms for r in self.ranks)

    @property
    def global_batch(self) -> int:
        return self.microbatch * self.layout.microbatches * self.layout.dp

    @property
    def fits(self) -> bool:
        return all(r.memory.fits for r in self.ranks)

    @property
    def tflops_per_gpu(self) -> float:
        """Achieved TFLOP/s per GPU: every rank's kernel FLOPs over the step time."""
        mean = sum(r.flops for r in self.ranks) / len(self.ranks)
        return mean / (self.step_ms * 1e-3) / 1e12

    @property
    def flops_utilization(self) -> float | None:
        """Achieved TFLOP/s over the peak of the GEMMs' dtype (recomputation counted, as
        Narayanan et al. count it); None where the peak is unknown."""
        return self.tflops_per_gpu / self.peak_tflops if self.peak_tflops > 0 else None

    def kernels(self, stage: int = 0) -> tuple[KernelForecast, ...]:
        """The collectives of one stage as kernels of family ``collective``."""
        return tuple(c.kernel() for c in self.collectives if c.stage == stage)

    def to_dict(self) -> dict[str, Any]:
        from .. import __version__

        c = self.cluster
        return {
            "schema": 1, "kind": "parallel", "tilecast_version": __version__,
            "model": self.model, "cluster": c.name, "device": c.device.name,
            "gpus": self.layout.gpus, "nodes": c.nodes_for(self.layout.gpus),
            "layout": {"dp": self.layout.dp, "tp": self.layout.tp, "pp": self.layout.pp,
                       "cp": self.layout.cp, "cp_comm": self.layout.cp_comm,
                       "ep": self.layout.ep,
                       "microbatches": self.layout.microbatches, "zero": self.layout.zero,
                       "sequence_parallel": self.layout.sequence_parallel,
                       "recompute": self.layout.recompute,
                       "virtual_stages": self.layout.virtual_stages,
                       "overlap_grad_reduce": self.layout.overlap_grad_reduce},
            "predictor": self.predictor, "runtime": self.runtime, "math": self.math,
            "memory_format": self.memory_format, "layers": self.layers,
            "graph_layers": self.graph_layers, "experts": self.experts,
            "sequence": self.sequence,
            "microbatch": self.microbatch,
            "global_batch": self.global_batch, "step_ms": _r(self.step_ms),
            "tflops_per_gpu": _r(self.tflops_per_gpu), "peak_tflops": _r(self.peak_tflops),
            "flops_utilization": (_r(self.flops_utilization)
                                  if self.flops_utilization is not None else None),
            "fits_memory": self.fits,
            "ranks": [r.to_dict() for r in self.ranks],
            "collectives": [x.to_dict() for x in self.collectives],
            "warnings": list(self.warnings),
            "run": self.run.to_dict() if self.run is not None else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"
