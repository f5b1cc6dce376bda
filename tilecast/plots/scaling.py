"""A sweep as a chart: forecast time against an input size, one line per GPU, math mode and
runtime (bars where the sweep binds no size)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .layout import PLOT, WIDTH, Bar, axes, bars, clip, header, legend
from .svg import PALETTE, Canvas

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


def sweep_svg(s: Sweep) -> str:
    """Lines of forecast ms against the first dim the sweep varies (log axes where the values
    span 4x / 20x or more), each line's error band shaded; bars when no dim varies."""
    done = [r for r in s.rows if r.total_ms is not None]
    c = Canvas(WIDTH, 0)
    y = header(c, clip(f"{s.model}: forecast {s.mode} time per pass", 90),
               f"predictor {s.predictor}; lower is better; shaded or whiskers: error band")
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
        _lines(c, series, x)
        y = legend(c, PLOT[3] + 44, [(k, PALETTE[i % len(PALETTE)])
                                     for i, k in enumerate(series)])
    for r in (r for r in s.rows if r.total_ms is None):
        y += 16
        c.text(20, y, f"skipped {r.device} {r.math} {r.runtime}: {r.skipped}", size=11,
               fill="#555")
    c.height = y + 20
    return c.svg()


def _lines(c: Canvas, series: dict[str, list[SweepRow]], x: str) -> None:
    rows = [r for rs in series.values() for r in rs]
    xs = [dict(r.dims)[x] for r in rows]
    ys = [r.total_ms for r in rows] + [r.band_low_ms for r in rows if r.band_low_ms] + [
        r.band_high_ms for r in rows if r.band_high_ms]
    fx, fy = axes(c, PLOT, xs, ys, x, "ms", x_marks=sorted(set(xs)))
    for i, (key, rs) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        pts = [(fx(dict(r.dims)[x]), fy(r.total_ms)) for r in rs]
        if all(r.band_low_ms is not None for r in rs) and len(rs) > 1:
            upper = [(fx(dict(r.dims)[x]), fy(r.band_high_ms)) for r in rs]
            lower = [(fx(dict(r.dims)[x]), fy(r.band_low_ms)) for r in reversed(rs)]
            c.polygon(upper + lower, colour, 0.15)
        c.polyline(pts, colour, title=key)
        for (px, py), r in zip(pts, rs, strict=True):
            c.circle(px, py, 3, colour, title=f"{key}, {x}={dict(r.dims)[x]}: "
                                               f"{r.total_ms:.3f} ms")
