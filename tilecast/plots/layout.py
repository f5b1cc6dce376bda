"""Layout shared by the charts: the page, a titled bar chart, a legend."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .svg import PALETTE, Canvas, fmt_value, log_ticks, nice_ticks

WIDTH = 860
ROW_H = 22
LABEL_W = 250  # left column of bar charts: the bar's name
VALUE_W = 150  # right column: its value
PLOT = (90.0, 80.0, WIDTH - 40.0, 430.0)  # x0, y0 (top), x1, y1 (bottom) of an x-y plot
GREY = "#9a9a9a"  # what is not the point: a comparison's base, a batch past memory
BOUND_COLOURS = {"compute": PALETTE[0], "memory": PALETTE[1], "latency": PALETTE[3],
                 "overhead": PALETTE[4]}


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str  # what the value column says
    colour: str
    whisker: tuple[float, float] | None = None  # (low, high), on the value's scale


def bars(c: Canvas, top: float, title: str, items: Sequence[Bar]) -> float:
    """A titled horizontal bar chart from ``top``; returns the y below it. Labels are clipped
    to the 250 px column (~37 characters at 11 px); bar lengths are proportional to the
    values (the longest value or whisker spans the plot width)."""
    c.text(20, top + 16, title, size=14, weight="bold")
    span = max([b.value for b in items] + [b.whisker[1] for b in items if b.whisker] + [1e-30])
    # the value column takes what its longest text needs (11 px Helvetica: ~6.5 px a character)
    value_w = max([VALUE_W] + [6.5 * len(b.text) + 12 for b in items])
    plot_w = max(WIDTH - LABEL_W - value_w - 40, 120.0)
    y = top + 28
    for b in items:
        c.text(20 + LABEL_W - 8, y + 15, clip(b.label, 37), size=11, anchor="end")
        c.rect(20 + LABEL_W, y + 3, plot_w * b.value / span, ROW_H - 6, b.colour,
               title=f"{b.label}: {b.text}")
        if b.whisker:
            lo, hi = (20 + LABEL_W + plot_w * v / span for v in b.whisker)
            c.line(lo, y + ROW_H / 2, hi, y + ROW_H / 2, stroke="#333", width=1.5)
            for x in (lo, hi):
                c.line(x, y + 6, x, y + ROW_H - 6, stroke="#333", width=1.5)
        c.text(20 + LABEL_W + plot_w + 8, y + 15, b.text, size=11)
        y += ROW_H
    return y + 10


def header(c: Canvas, title: str, subtitle: str) -> float:
    c.text(20, 28, title, size=17, weight="bold")
    c.text(20, 48, subtitle, size=12, fill="#555")
    return 60


def legend(c: Canvas, y: float, items: Sequence[tuple[str, str]]) -> float:
    """Colour keys left to right, wrapping; returns the y below them."""
    x = 20.0
    for label, colour in items:
        width = 28 + 6.5 * len(label)  # 11 px Helvetica averages about 6 px a character
        if x > 20.0 and x + width > WIDTH - 20:
            x, y = 20.0, y + 18
        c.rect(x, y + 4, 12, 12, colour)
        c.text(x + 18, y + 14, label, size=11)
        x += width
    return y + 24


def axis(lo: float, hi: float, a: float, b: float, log: bool,
          ) -> tuple[Callable[[float], float], list[float]]:
    """A map from [lo, hi] onto [a, b] and its ticks, on a log scale where ``log``."""
    if log:
        ticks = log_ticks(lo, hi)
        t0, t1 = math.log(ticks[0]), math.log(ticks[-1])
        return (lambda v: a + (b - a) * (math.log(v) - t0) / (t1 - t0 or 1.0)), ticks
    ticks = nice_ticks(min(lo, 0.0), hi)
    t0, t1 = ticks[0], ticks[-1]
    return (lambda v: a + (b - a) * (v - t0) / (t1 - t0 or 1.0)), ticks


def axes(c: Canvas, plot: tuple[float, float, float, float], xs: Sequence[float],
         ys: Sequence[float], xlabel: str, ylabel: str,
         x_marks: Sequence[float] | None = None, log: bool | None = None,
         ) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """Grid, ticks and labels of an x-y plot over the values ``xs`` and ``ys``: each axis
    logarithmic where its values are positive and span 4x (x) or 20x (y) or more, or both as
    ``log`` says. ``x_marks``: tick at these values instead (a sweep's few sizes). Returns the
    two maps onto the page."""
    x0, y0, x1, y1 = plot
    log_x = min(xs) > 0 and (max(xs) >= 4 * min(xs) if log is None else log)
    log_y = min(ys) > 0 and (max(ys) >= 20 * min(ys) if log is None else log)
    fx, xt = axis(min(xs), max(xs), x0, x1, log_x)
    fy, yt = axis(min(ys), max(ys), y1, y0, log_y)
    for t in yt:
        c.line(x0, fy(t), x1, fy(t), stroke="#e3e3e3")
        c.text(x0 - 6, fy(t) + 4, fmt_value(t), size=10, anchor="end")
    for t in x_marks if x_marks and len(x_marks) <= 12 else xt:
        c.line(fx(t), y1, fx(t), y1 + 4)
        c.text(fx(t), y1 + 17, fmt_value(t), size=10, anchor="middle")
    c.line(x0, y1, x1, y1, stroke="#333")
    c.line(x0, y0, x0, y1, stroke="#333")
    c.text((x0 + x1) / 2, y1 + 34, xlabel, size=12, anchor="middle")
    c.text(20, y0 - 10, ylabel, size=12)
    return fx, fy
