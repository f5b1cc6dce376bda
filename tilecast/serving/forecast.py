"""A serving forecast: prefill, decode steps, latency per request and KV-cache memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..device_db import Device
from ..parallel.forecast import GIB, _r


@dataclass(frozen=True)
class DecodeStep:
    """One decode step: every sequence's next token, attending over ``context`` keys."""

    context: int
    latency_ms: float


@dataclass(frozen=True)
class GraphFloor:
    """The kernels of the first decode step forecast under the in-graph floor
    (``analyzer.forecast.GRAPH_FLOOR_US``; graph runtimes only), and their time."""

    kernels: int
    ms: float


@dataclass(frozen=True)
class ServingForecast:
    """``batch`` requests of ``prompt`` tokens each generating ``generate`` tokens.

    The first token comes out of the prefill; the other ``generate - 1`` each take a decode
    step, whose time grows with the context (``decode``: the steps forecast, the first, the
    middle and the last, or every step for short generations)."""

    model: str
    device: Device
    predictor: str
    runtime: str
    batch: int
    prompt: int
    generate: int
    prefill_ms: float
    decode: tuple[DecodeStep, ...]
    weights_bytes: float
    kv_bytes_per_token: float  # one token of one sequence, every attention layer (per GPU)
    extrapolated: bool = False  # a kernel outside the predictor's training data
    tp: int = 1  # GPUs the model is split over (weights, KV cache and times are per GPU)
    cluster: str | None = None  # the cluster preset of a tensor-parallel forecast
    layers: int = 0  # transformer layers forecast (the graph's, or --layers)
    # MoE layers: experts per layer, top-k, experts a decode step runs (experts.py); None: dense
    routing: dict[str, int | float] | None = None
    # Graph runtimes: the first decode step's kernels under the in-graph floor; None: none
    graph_floor: GraphFloor | None = None

    @property
    def ttft_ms(self) -> float:
        """Time to first token: the prefill."""
        return self.prefill_ms

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first: the mean decode step (None: one token)."""
        steps = self.decode
        if not steps:
            return None
        if len(steps) == self.generate - 1 or len(steps) < 3:
            return sum(s.latency_ms for s in steps) / len(steps)
        first, mid, last = (s.latency_ms for s in steps)  # Simpson's rule over the contexts
        return (first + 4 * mid + last) / 6

    @property
    def total_ms(self) -> float:
        """One request from prompt to its last token."""
        return self.prefill_ms + (self.generate - 1) * (self.tpot_ms or 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the whole batch."""
        return self.batch * self.generate / (self.total_ms * 1e-3)

    @property
    def kv_cache_bytes(self) -> float:
        """The batch's KV cache at the last token."""
        return self.batch * (self.prompt + self.generate) * self.kv_bytes_per_token

    @property
    def capacity_bytes(self) -> float:
        return self.device.memory_gb * GIB

    @property
    def fits(self) -> bool:
        """Weights and the full KV cache within the GPU's memory (activations excluded)."""
        return self.weights_bytes + self.kv_cache_bytes <= self.capacity_bytes

    @property
    def max_batch(self) -> int:
        """The most sequences of this length whose KV cache fits beside the weights."""
        per_sequence = (self.prompt + self.generate) * self.kv_bytes_per_token
        free = self.capacity_bytes - self.weights_bytes
        return max(int(free // per_sequence), 0) if per_sequence > 0 else 0

    def to_dict(self) -> dict[str, Any]:
        from .. import __version__

        tpot = self.tpot_ms
        return {
            "schema": 1, "kind": "serving", "tilecast_version": __version__,
            "model": self.model, "device": self.device.name, "predictor": self.predictor,
            "runtime": self.runtime, "tp": self.tp, "cluster": self.cluster,
            "layers": self.layers,
            "batch": self.batch, "prompt": self.prompt,
            "generate": self.generate, "prefill_ms": _r(self.prefill_ms),
            "ttft_ms": _r(self.ttft_ms), "tpot_ms": None if tpot is None else _r(tpot),
            "total_ms": _r(self.total_ms), "tokens_per_s": _r(self.tokens_per_s),
            "decode": [{"context": s.context, "latency_ms": _r(s.latency_ms)}
                       for s in self.decode],
            "memory": {"weights_gib": _r(self.weights_bytes / GIB),
                       "kv_cache_gib": _r(self.kv_cache_bytes / GIB),
                       "kv_bytes_per_token": _r(self.kv_bytes_per_token),
                       "capacity_gib": _r(self.capacity_bytes / GIB), "fits": self.fits,
                       "max_batch": self.max_batch},
            "experts": self.routing,
            "graph_floor": None if self.graph_floor is None else {
                "kernels": self.graph_floor.kernels, "ms": _r(self.graph_floor.ms)},
            "extrapolated": self.extrapolated,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"
