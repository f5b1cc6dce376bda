"""A sweep as a chart: forecast time against an input size, one line per GPU, math mode and
runtime (bars where the sweep binds no size)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..sweep.api import is_batch_dim
from .layout import PLOT, WIDTH, Bar, axes, bars, clip, header, legend
from .svg import PALETTE, Canvas, fmt_value

if TYPE_CHECKING:
    from ..sweep.api import Sweep, SweepRow


def _x_dim(rows: Sequence[SweepRow]) -> str | None:
    """The first bound dim that takes two values or more: the chart's x axis."""
    names = list(dict.fromkeys(k for r in rows for k, _ in r.dims))
    return next((n for n in names if len({dict(r.dims).get(n) for r in rows}) > 1), None)


def _series(rows: Sequence[SweepRow], x: str) -> dict[str, list[SweepRow]]:
    out: dict[str, list[SweepRow]] = {}
    for r in rows:
        rest = ",".join(f"{k}={v}" for k, v in r.dims if k != x)
        key = ", ".join(p for p in (r.device, r.math, r.runtime, rest) if p)
        out.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda r: dict(r.dims)[x]) for k, v in out.items()}


@dataclass(frozen=True)
class Measure:
    """What a panel plots of each row: its value and error band, and the axis label."""

    label: str
    value: Callable[[SweepRow], float]
    band: Callable[[SweepRow], tuple[float, float] | None]


LATENCY = Measure("ms per pass", lambda r: r.total_ms,
                  lambda r: None if r.band_low_ms is None else (r.band_low_ms, r.band_high_ms))
# samples/s = batch x 1000 / ms, so the band's slow end is the throughput's low end
THROUGHPUT = Measure("samples / s", lambda r: r.samples_per_s,
                     lambda r: None if r.band_low_ms is None else (
                         r.samples_per_s * r.total_ms / r.band_high_ms,
                         r.samples_per_s * r.total_ms / r.band_low_ms))
GAP = 400.0  # the throughput panel sits this far below the latency one


def sweep_svg(s: Sweep) -> str:
    """Lines of forecast ms against the first dim the sweep varies (log axes where the values
    span 4x / 20x or more), each line's error band shaded, and under them samples/s where
    that dim is the batch; bars when no dim varies."""
    done = [r for r in s.rows if r.total_ms is not None]
    c = Canvas(WIDTH, 0)
    y = header(c, clip(f"{s.model}: forecast {s.mode} time per pass", 90),
               f"predictor {s.predictor}; lower ms is better; shaded or whiskers: error band")
    x = _x_dim(done)
    if not done:
        y += 30
        c.text(20, y, "no forecast: every row was skipped", size=13)
    elif x is None:
        y = bars(c, y, "Total per configuration", [
            Bar(f"{r.device}, {r.math}, {r.runtime}", r.total_ms, f"{r.total_ms:.3f} ms",
                PALETTE[i % len(PALETTE)],
                None if r.band_low_ms is None else (r.band_low_ms, r.band_high_ms))
            for i, r in enumerate(done)])
    else:
        series = _series(done, x)
        _lines(c, series, x, LATENCY, PLOT)
        bottom = PLOT[3]
        if all(r.samples_per_s for r in done) and is_batch_dim(x):
            x0, y0, x1, y1 = PLOT
            bottom = y1 + GAP
            _lines(c, series, x, THROUGHPUT, (x0, y0 + GAP, x1, bottom))
        y = legend(c, bottom + 44, [(k, PALETTE[i % len(PALETTE)])
                                    for i, k in enumerate(series)])
    for r in (r for r in s.rows if r.total_ms is None):
        y += 16
        c.text(20, y, f"skipped {r.device} {r.math} {r.runtime}: {r.skipped}", size=11,
               fill="#555")
    c.height = y + 20
    return c.svg()


def _lines(c: Canvas, series: dict[str, list[SweepRow]], x: str, m: Measure,
           plot: tuple[float, float, float, float]) -> None:
    rows = [r for rs in series.values() for r in rs]
    xs = [dict(r.dims)[x] for r in rows]
    bands = [b for b in map(m.band, rows) if b is not None]
    ys = [m.value(r) for r in rows] + [v for b in bands for v in b]
    fx, fy = axes(c, plot, xs, ys, x, m.label, x_marks=sorted(set(xs)))
    for i, (key, rs) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(fx(dict(r.dims)[x]), fy(m.value(r))) for r in rs]
        row_bands = [m.band(r) for r in rs]
        if len(rs) > 1 and all(b is not None for b in row_bands):
            upper = [(fx(dict(r.dims)[x]), fy(b[1])) for r, b in zip(rs, row_bands, strict=True)]
            lower = [(fx(dict(r.dims)[x]), fy(b[0]))
                     for r, b in zip(reversed(rs), reversed(row_bands), strict=True)]
            c.polygon(upper + lower, colour, 0.15)
        c.polyline(pts, colour, title=f"{key} ({m.label})")
        for (px, py), r in zip(pts, rs, strict=True):
            c.circle(px, py, 3, colour, title=f"{key}, {x}={dict(r.dims)[x]}: "
                                               f"{fmt_value(m.value(r))} {m.label}")
