"""A forecast's error band: where its total lands if each kernel errs as its family did on GPUs
the predictor never saw (the learned predictor's bands, ``learned/bands.py``).

A kernel with a band ``(low, high)`` (measured / forecast quantiles of its family) spans
``latency x low`` to ``latency x high``. The kernels of one forecast share a GPU, and the
folds' errors are mostly that GPU's level (docs/predictor.md, "Error bands"), so the kernels
are taken to err together: the total's band is the sum of the kernels' bands, with no
averaging out between them. Kernels without a band (extrapolated, held by a physical rule, or
from a predictor that ships none) keep their forecast at both ends and are reported as the
share the band does not cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .forecast import KernelForecast


@dataclass(frozen=True)
class ForecastBand:
    level: float  # the central share of the folds' kernel time each kernel band holds
    low_ms: float
    high_ms: float
    covered_ms: float  # forecast time of the kernels that have a band

    def covered_share(self, total_ms: float) -> float:
        return self.covered_ms / total_ms if total_ms > 0 else 0.0



def forecast_band(kernels: Sequence[KernelForecast], level: float | None) -> ForecastBand | None:
    """The band of the kernels' total (module doc); None when the predictor has no bands."""
    if level is None:
        return None
    low = high = covered = 0.0
    for k in kernels:
        if k.band is not None:
            lo, hi = k.band
            low, high, covered = low + k.latency_ms * lo, high + k.latency_ms * hi, \
                covered + k.latency_ms
        else:
            low, high = low + k.latency_ms, high + k.latency_ms
    return ForecastBand(level, low, high, covered)
