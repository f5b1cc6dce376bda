"""The result of comparing two forecasts: per device, per family and per kernel changes."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..analyzer.forecast import Forecast, KernelForecast
from .matching import match_kernels
from .threshold import Threshold


def _r(x: float) -> float:
    # The precision of forecast JSON: a saved forecast and a fresh one of the same model compare
    # exactly equal, not a few 1e-7 ms apart.
    return float(f"{x:.6g}")


def _pct(base_ms: float, new_ms: float) -> float:
    if base_ms > 0:
        return 100.0 * (new_ms - base_ms) / base_ms
    return 0.0 if new_ms == base_ms else math.inf


def _json_pct(pct: float) -> float | None:
    return _r(pct) if math.isfinite(pct) else None


@dataclass(frozen=True)
class KernelChange:
    """One kernel before and after. ``base_ms`` is None for an added kernel, ``new_ms`` for a
    removed one; ``base_name`` differs from ``name`` when the node was renamed."""

    name: str
    op_type: str
    family: str
    phase: str
    base_ms: float | None
    new_ms: float | None
    base_name: str | None = None

    @property
    def delta_ms(self) -> float:
        return (self.new_ms or 0.0) - (self.base_ms or 0.0)

    @property
    def status(self) -> str:
        """added, removed, renamed, changed or same."""
        if self.base_ms is None:
            return "added"
        if self.new_ms is None:
            return "removed"
        if self.base_name not in (None, self.name):
            return "renamed"
        return "same" if self.delta_ms == 0 else "changed"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base_name": self.base_name, "op_type": self.op_type,
                "family": self.family, "phase": self.phase, "status": self.status,
                "base_ms": self.base_ms, "new_ms": self.new_ms,
                "delta_ms": _r(self.delta_ms)}


class _Delta:
    """delta_ms and change_pct of anything with base_ms and new_ms."""

    base_ms: float
    new_ms: float

    @property
    def delta_ms(self) -> float:
        return self.new_ms - self.base_ms

    @property
    def change_pct(self) -> float:
        return _pct(self.base_ms, self.new_ms)


@dataclass(frozen=True)
class FamilyChange(_Delta):
    family: str
    base_ms: float
    new_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "base_ms": _r(self.base_ms), "new_ms": _r(self.new_ms),
                "delta_ms": _r(self.delta_ms), "change_pct": _json_pct(self.change_pct)}


@dataclass(frozen=True)
class DeviceComparison(_Delta):
    """Base and new forecasts of one device. ``top`` holds the kernel changes with the largest
    absolute effect (added and removed kernels included); ``regressed`` applies ``threshold``."""

    device: str
    mode: str
    base_ms: float
    new_ms: float
    threshold: Threshold
    regressed: bool
    by_family: tuple[FamilyChange, ...]
    top: tuple[KernelChange, ...]
    added: tuple[KernelChange, ...]
    removed: tuple[KernelChange, ...]
    renamed: int = 0
    base_kernels: int = 0
    new_kernels: int = 0
    math: str = "graph"  # both sides' (the caller refuses to compare different ones)
    runtime: str = "eager"
    memory_format: str = "nchw"

    @property
    def setting(self) -> str:
        """``math graph, eager runtime``: what both forecasts assumed (the memory format
        where it is channels-last)."""
        layout = "" if self.memory_format == "nchw" else f", {self.memory_format}"
        return f"math {self.math}, {self.runtime} runtime{layout}"

    @property
    def direction(self) -> str:
        return "slower" if self.delta_ms > 0 else "faster" if self.delta_ms < 0 else "unchanged"

    @property
    def summary(self) -> str:
        """``NVIDIA L4 inference is 12.3 % slower (threshold 5 %)``."""
        what = f"{self.device} {self.mode}"
        if self.direction == "unchanged":
            return f"{what} is unchanged"
        size = (f"{abs(self.change_pct):.1f} %" if self.threshold.unit == "%" else
                f"{abs(self.delta_ms):.4g} ms ({abs(self.change_pct):.1f} %)")
        return f"{what} is {size} {self.direction} (threshold {self.threshold})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "mode": self.mode, "math": self.math,
            "runtime": self.runtime, "memory_format": self.memory_format,
            "base_ms": _r(self.base_ms),
            "new_ms": _r(self.new_ms), "delta_ms": _r(self.delta_ms),
            "change_pct": _json_pct(self.change_pct), "threshold": self.threshold.text,
            "regressed": self.regressed, "base_kernels": self.base_kernels,
            "new_kernels": self.new_kernels, "renamed": self.renamed,
            "by_family": [f.to_dict() for f in self.by_family],
            "top": [k.to_dict() for k in self.top],
            "added": [k.to_dict() for k in self.added],
            "removed": [k.to_dict() for k in self.removed],
        }


@dataclass(frozen=True)
class Comparison:
    """``base`` and ``new`` forecast on each device; ``regressed`` when any device regressed."""

    base: str
    new: str
    threshold: Threshold
    devices: tuple[DeviceComparison, ...]
    warnings: tuple[str, ...] = ()

    @property
    def regressed(self) -> bool:
        return any(d.regressed for d in self.devices)

    @property
    def verdict(self) -> str:
        """One line: ``❌ NVIDIA L4 inference is 12.3 % slower (threshold 5 %)`` or ``✅ ...``."""
        from .report import verdict

        return verdict([(None, self)])

    def device(self, name: str) -> DeviceComparison:
        for d in self.devices:
            if d.device == name:
                return d
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": "tilecast-comparison", "base": self.base, "new": self.new,
                "threshold": self.threshold.text, "regressed": self.regressed,
                "verdict": self.verdict, "warnings": list(self.warnings),
                "devices": [d.to_dict() for d in self.devices]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False) + "\n"


def _change(k: KernelForecast, base_ms: float | None, new_ms: float | None,
            base_name: str | None = None) -> KernelChange:
    kernel = k.kernel
    return KernelChange(kernel.name, kernel.op_type, kernel.family, kernel.phase, base_ms,
                        new_ms, base_name)


def _by_family(base: Sequence[KernelForecast], new: Sequence[KernelForecast],
               ) -> tuple[FamilyChange, ...]:
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    for acc, kernels in ((before, base), (after, new)):
        for k in kernels:
            acc[k.kernel.family] += _r(k.latency_ms)
    changes = [FamilyChange(f, before[f], after[f]) for f in set(before) | set(after)]
    return tuple(sorted(changes, key=lambda c: (-abs(c.delta_ms), c.family)))


def compare_forecasts(base: Forecast, new: Forecast, threshold: Threshold,
                      top: int = 10) -> DeviceComparison:
    """Compare two forecasts of one device (the caller checks they are comparable)."""
    b, n = base.kernels, new.kernels
    m = match_kernels(b, n)
    paired = [_change(n[j], _r(b[i].latency_ms), _r(n[j].latency_ms), b[i].kernel.name)
              for i, j in m.pairs]
    added = tuple(_change(n[j], None, _r(n[j].latency_ms)) for j in m.added)
    removed = tuple(_change(b[i], _r(b[i].latency_ms), None) for i in m.removed)
    moved = [c for c in (*paired, *added, *removed) if c.delta_ms != 0]
    moved.sort(key=lambda c: (-abs(c.delta_ms), c.name))
    base_ms = sum(_r(k.latency_ms) for k in b)
    new_ms = sum(_r(k.latency_ms) for k in n)
    return DeviceComparison(
        device=new.device.name, mode=new.mode, base_ms=base_ms, new_ms=new_ms,
        threshold=threshold, regressed=threshold.exceeded(base_ms, new_ms),
        by_family=_by_family(b, n), top=tuple(moved[:top]), added=added, removed=removed,
        renamed=sum(c.status == "renamed" for c in paired), base_kernels=len(b),
        new_kernels=len(n), math=new.math, runtime=new.runtime,
        memory_format=new.memory_format)
