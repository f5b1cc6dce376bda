"""A small SVG canvas and the axis arithmetic the charts share (no plotting library)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

FONT = "font-family='Helvetica, Arial, sans-serif'"
# Series colours: a colour-blind-safe qualitative palette (Okabe & Ito, "Color Universal
# Design", 2008), in its published order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000")


def _n(x: float) -> str:
    """A coordinate, short: 2 decimals, no trailing zeros."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


@dataclass
class Canvas:
    """Elements appended in paint order; ``svg()`` closes the document."""

    width: float
    height: float
    parts: list[str] = field(default_factory=list)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str = "",
             opacity: float = 1.0) -> None:
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<rect x='{_n(x)}' y='{_n(y)}' width='{_n(max(w, 0.0))}' "
                          f"height='{_n(max(h, 0.0))}' fill='{fill}' "
                          f"fill-opacity='{_n(opacity)}'>{tip}</rect>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#999",
             width: float = 1.0, dash: str = "") -> None:
        dashes = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<line x1='{_n(x1)}' y1='{_n(y1)}' x2='{_n(x2)}' y2='{_n(y2)}' "
                          f"stroke='{stroke}' stroke-width='{_n(width)}'{dashes}/>")

    def polyline(self, points: Sequence[tuple[float, float]], stroke: str,
                 title: str = "") -> None:
        pts = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<polyline points='{pts}' fill='none' stroke='{stroke}' "
                          f"stroke-width='2'>{tip}</polyline>")

    def polygon(self, points: Sequence[tuple[float, float]], fill: str,
                opacity: float) -> None:
        pts = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        self.parts.append(f"<polygon points='{pts}' fill='{fill}' fill-opacity='{_n(opacity)}' "
                          "stroke='none'/>")

    def circle(self, x: float, y: float, r: float, fill: str, title: str = "") -> None:
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<circle cx='{_n(x)}' cy='{_n(y)}' r='{_n(r)}' fill='{fill}'>"
                          f"{tip}</circle>")

    def text(self, x: float, y: float, s: str, size: float = 12, anchor: str = "start",
             weight: str = "normal", fill: str = "#222") -> None:
        self.parts.append(f"<text x='{_n(x)}' y='{_n(y)}' font-size='{_n(size)}' {FONT} "
                          f"text-anchor={quoteattr(anchor)} font-weight={quoteattr(weight)} "
                          f"fill='{fill}'>{escape(s)}</text>")

    def svg(self) -> str:
        head = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{_n(self.width)}' "
                f"height='{_n(self.height)}' viewBox='0 0 {_n(self.width)} {_n(self.height)}'>")
        back = "<rect width='100%' height='100%' fill='white'/>"
        return "\n".join([head, back, *self.parts, "</svg>"]) + "\n"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round linear ticks covering [lo, hi]: steps of 1, 2 or 5 x 10^k."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    n = int(math.ceil((hi - first) / step - 1e-9))
    return [first + i * step for i in range(n + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks per decade covering [lo, hi] (both > 0); whole decades past 4 of them."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if b - a > 4 else (1, 2, 5)
    ticks = [m * 10.0 ** e for e in range(a, b + 1) for m in mults]
    inside = [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
    below = [t for t in ticks if t < lo] if not inside or inside[0] > lo * (1 + 1e-9) else []
    above = [t for t in ticks if t > hi] if not inside or inside[-1] < hi * (1 - 1e-9) else []
    return ([below[-1]] if below else []) + inside + ([above[0]] if above else [])


def fmt_value(x: float) -> str:
    """A tick label: 3 significant digits, thousands separated."""
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"
