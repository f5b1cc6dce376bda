"""Regression thresholds: a relative change (``5%``) or an absolute one (``2ms``, ``500us``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ConfigError

_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(%|ms|us|µs|s)\s*$")
_TO_MS = {"ms": 1.0, "us": 1e-3, "µs": 1e-3, "s": 1e3}


@dataclass(frozen=True)
class Threshold:
    """How much slower the new forecast may be before it counts as a regression.

    ``unit`` is "%" (``value`` in percent of the base latency) or "ms" (``value`` in
    milliseconds). A change equal to the threshold passes; only a larger slow-down fails.
    """

    value: float
    unit: str  # "%" | "ms"

    def exceeded(self, base_ms: float, new_ms: float) -> bool:
        delta = new_ms - base_ms
        if self.unit == "ms":
            return delta > self.value
        if base_ms <= 0:
            return delta > 0
        return 100.0 * delta / base_ms > self.value

    @property
    def text(self) -> str:
        """Canonical form, as it is parsed back: ``5%``, ``2ms``."""
        return f"{self.value:g}{self.unit}"

    def __str__(self) -> str:
        return f"{self.value:g} {self.unit}"


def parse_threshold(spec: str | Threshold) -> Threshold:
    """``"5%"`` -> 5 percent; ``"2ms"``, ``"0.5 ms"``, ``"500us"`` -> absolute milliseconds."""
    if isinstance(spec, Threshold):
        return spec
    match = _PATTERN.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ConfigError(f"threshold {spec!r}: write a percentage like '5%' or a time like "
                          "'2ms' or '500us'")
    value, unit = float(match.group(1)), match.group(2)
    if not math.isfinite(value):
        raise ConfigError(f"threshold {spec!r} is not a finite number")
    if unit == "%":
        return Threshold(value, "%")
    return Threshold(value * _TO_MS[unit], "ms")
