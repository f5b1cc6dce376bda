"""One forecast as a chart: time by kernel family and the slowest kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layout import BOUND_COLOURS, WIDTH, Bar, bars, clip, header, legend
from .svg import PALETTE, Canvas

if TYPE_CHECKING:  # the chart reads a Forecast; nothing of it runs here
    from ..analyzer.forecast import Forecast


def _subtitle(f: Forecast) -> str:
    sub = (f"{f.mode}, math {f.math}, runtime {f.runtime}, predictor {f.predictor}, "
           f"{len(f.kernels)} kernels")
    band = f.band
    if band is None or band.covered_ms <= 0:
        return sub
    return (f"{sub}; {band.level:.0%} band {band.low_ms:.3f}-{band.high_ms:.3f} ms "
            f"(over {band.covered_share(f.total_ms):.0%} of the time)")


def forecast_svg(f: Forecast, top: int = 10) -> str:
    """Time by phase (a training step), by kernel family (ms and share) and the ``top``
    slowest kernels, each coloured by what bounds it; extrapolated kernels starred, an
    incomplete forecast said so."""
    total = f.total_ms
    c = Canvas(WIDTH, 0)
    y = header(c, clip(f"{f.model} on {f.device.name}: {total:.3f} ms", 90), _subtitle(f))

    def share(ms: float) -> str:
        return f"{ms:.3f} ms ({ms / total:.0%})" if total > 0 else f"{ms:.3f} ms"

    phases = f.by_phase
    if len(phases) > 1:  # a training step: forward, backward, optimizer update
        y = bars(c, y, "Time by phase", [Bar(ph, ms, share(ms), PALETTE[2])
                                         for ph, ms in phases.items()])
    families = sorted(f.by_family.items(), key=lambda kv: -kv[1])
    y = bars(c, y, "Time by kernel family",
             [Bar(fam, ms, share(ms), PALETTE[0]) for fam, ms in families])
    slowest = sorted(f.kernels, key=lambda k: -k.latency_ms)[:top]
    y = bars(c, y, f"Slowest {len(slowest)} kernels",
             [Bar(f"{k.kernel.name} ({k.kernel.op_type}){' *' if k.extrapolated else ''}",
                  k.latency_ms, f"{k.latency_ms:.4f} ms, {k.bound}",
                  BOUND_COLOURS.get(k.bound, PALETTE[7])) for k in slowest])
    y = legend(c, y, list(BOUND_COLOURS.items()))
    notes = ["* extrapolated: outside the data the predictor was validated on"]
    if f.incomplete:
        notes.append("incomplete: unsupported or unshaped ops (their work is an estimate)")
    for note in notes:
        y += 16
        c.text(20, y, note, size=11, fill="#555")
    c.height = y + 20
    return c.svg()
