"""Layout shared by the charts: the page, a titled bar chart, a legend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .svg import PALETTE, Canvas

WIDTH = 860
ROW_H = 22
LABEL_W = 250  # left column of bar charts: the bar's name
VALUE_W = 150  # right column: its value
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
    """A titled horizontal bar chart from ``top``; returns the y below it. Bar lengths are
    proportional to the values (the longest value or whisker spans the plot width)."""
    c.text(20, top + 16, title, size=14, weight="bold")
    span = max([b.value for b in items] + [b.whisker[1] for b in items if b.whisker] + [1e-30])
    plot_w = WIDTH - LABEL_W - VALUE_W - 40
    y = top + 28
    for b in items:
        c.text(20 + LABEL_W - 8, y + 15, clip(b.label, 40), size=11, anchor="end")
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
