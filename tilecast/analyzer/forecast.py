"""The forecast: kernels with predicted latencies, and the totals users read."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..device_db.device import Device
from .types import Kernel

SCHEMA_VERSION = 1
PHASES = ("forward", "backward", "update")


def _r(x: float) -> float:
    # Fixed precision keeps JSON byte-identical across runs and platforms.
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class KernelForecast:
    kernel: Kernel
    latency_ms: float
    bound: str
    tile: str | None = None
    extrapolated: bool = False

    def to_dict(self) -> dict[str, Any]:
        k, c = self.kernel, self.kernel.cost
        return {
            "name": k.name, "nodes": list(k.nodes), "op_type": k.op_type, "family": k.family,
            "phase": k.phase, "dtype": k.dtype, "flops": k.flops, "bytes": k.bytes,
            "latency_ms": _r(self.latency_ms), "bound": self.bound, "tile": self.tile,
            "extrapolated": self.extrapolated, "estimated": c.estimated,
            "matmul": None if c.matmul is None else
            {"b": c.matmul.b, "m": c.matmul.m, "n": c.matmul.n, "k": c.matmul.k},
        }


@dataclass(frozen=True)
class Forecast:
    """A model's forecast on one device. ``kernels`` are in launch order."""

    model: str
    device: Device
    mode: str
    predictor: str
    kernels: tuple[KernelForecast, ...]
    unsupported: Mapping[str, int] = field(default_factory=dict)  # op_type -> count
    zero_cost: Mapping[str, int] = field(default_factory=dict)
    fusion: bool = False
    dims: Mapping[str, int] = field(default_factory=dict)
    node_count: int = 0

    @property
    def total_ms(self) -> float:
        return sum(k.latency_ms for k in self.kernels)

    @property
    def by_family(self) -> dict[str, float]:
        return self._sum_by(lambda k: k.kernel.family)

    @property
    def by_phase(self) -> dict[str, float]:
        return self._sum_by(lambda k: k.kernel.phase)

    @property
    def extrapolated(self) -> bool:
        return any(k.extrapolated for k in self.kernels)

    @property
    def unsupported_ms(self) -> float:
        return sum(k.latency_ms for k in self.kernels if k.kernel.cost.estimated)

    def _sum_by(self, key) -> dict[str, float]:
        acc: Counter[str] = Counter()
        for k in self.kernels:
            acc[key(k)] += k.latency_ms
        return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])))

    def top(self, n: int) -> list[KernelForecast]:
        return sorted(self.kernels, key=lambda k: (-k.latency_ms, k.kernel.name))[:n]

    def to_dict(self) -> dict[str, Any]:
        from .. import __version__

        return {
            "schema": SCHEMA_VERSION, "tilecast_version": __version__, "model": self.model,
            "device": self.device.name, "mode": self.mode, "predictor": self.predictor,
            "fusion": self.fusion, "dims": dict(sorted(self.dims.items())),
            "total_ms": _r(self.total_ms),
            "by_phase": {p: _r(v) for p, v in self.by_phase.items()},
            "by_family": {f: _r(v) for f, v in self.by_family.items()},
            "extrapolated": self.extrapolated,
            "nodes": self.node_count,
            "kernels": [k.to_dict() for k in self.kernels],
            "unsupported": dict(sorted(self.unsupported.items())),
            "unsupported_ms": _r(self.unsupported_ms),
            "zero_cost": dict(sorted(self.zero_cost.items())),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False) + "\n"

    def to_dataframe(self):  # -> pandas.DataFrame (pandas is optional)
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Forecast.to_dataframe() needs pandas: pip install pandas"
                              ) from exc
        rows = [k.to_dict() for k in self.kernels]
        for r in rows:
            r["nodes"] = ",".join(r["nodes"])
            mm = r.pop("matmul") or {}
            for d in "bmnk":
                r[f"matmul_{d}"] = mm.get(d)
        return pd.DataFrame(rows)
