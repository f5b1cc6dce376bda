"""Forecast against measurement (``tilecast evaluate``): one point per labelled run on
log-log axes, the diagonal and the +-10 % and +-25 % lines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layout import WIDTH, axes, header, legend
from .svg import PALETTE, Canvas, log_ticks

if TYPE_CHECKING:  # the chart reads an EvalResult; nothing of it runs here
    from ..evaluation.runner import EvalResult, Run

SQUARE = (90.0, 80.0, 440.0, 430.0)  # equal scales: the diagonal is at 45 degrees
BANDS = ((0.10, "4 3"), (0.25, "1 3"))  # relative error, dash pattern


def _mape(runs: list[Run]) -> float:
    return sum(r.error_pct for r in runs) / len(runs)


def evaluation_svg(result: EvalResult) -> str:
    """Each run at (measured ms, forecast ms), coloured by GPU, with each GPU's MAPE in the
    legend; points on the diagonal are exact, the dashed lines mark 10 % and 25 % off."""
    runs = [r for r in result.runs if r.measured_ms > 0 and r.predicted_ms > 0]
    c = Canvas(WIDTH, 0)
    title = (f"Forecast against measured: {len(runs)} runs, MAPE {_mape(runs):.1f} %"
             if runs else "Forecast against measured: no runs")
    y = header(c, title, f"predictor {result.predictor}; log-log; dashed: 10 % and 25 % off")
    if runs:
        values = [r.measured_ms for r in runs] + [r.predicted_ms for r in runs]
        span = log_ticks(min(values), max(values))  # the lines run from edge to edge
        lo, hi = span[0], span[-1]
        fx, fy = axes(c, SQUARE, [lo, hi], [lo, hi], "measured ms", "forecast ms", log=True)
        for rel, dash in BANDS:  # y = f x, clipped to the square
            for f in (1 + rel, 1 / (1 + rel)):
                a, b = (lo, hi / f) if f > 1 else (lo / f, hi)
                c.line(fx(a), fy(a * f), fx(b), fy(b * f), stroke="#bbb", dash=dash)
        c.line(fx(lo), fy(lo), fx(hi), fy(hi), stroke="#555")
        gpus = list(dict.fromkeys(r.gpu for r in runs))
        for r in runs:
            colour = PALETTE[gpus.index(r.gpu) % len(PALETTE)]
            c.circle(fx(r.measured_ms), fy(r.predicted_ms), 3.5, colour,
                     title=f"{r.gpu} {r.model} {r.mode} b{r.batch} s{r.seq} {r.variant}: "
                           f"measured {r.measured_ms:.3f} ms, forecast {r.predicted_ms:.3f} "
                           f"ms ({r.error_pct:.1f} %)")
        keys = [(f"{g} (n {sum(r.gpu == g for r in runs)}, MAPE "
                 f"{_mape([r for r in runs if r.gpu == g]):.1f} %)", PALETTE[i % len(PALETTE)])
                for i, g in enumerate(gpus)]
        y = _key_column(c, keys) if len(keys) <= 16 else legend(c, SQUARE[3] + 44, keys)
        y = max(y, SQUARE[3] + 44)
    if result.skipped:
        y += 16
        n = len(result.skipped)
        c.text(20, y, f"{n} label{'s' if n > 1 else ''} skipped (the table output says why)",
               size=11, fill="#555")
    c.height = y + 20
    return c.svg()


def _key_column(c: Canvas, keys: list[tuple[str, str]]) -> float:
    """The legend beside the square plot, one GPU a line; returns the y below it."""
    x, y = SQUARE[2] + 40, SQUARE[1]
    for label, colour in keys:
        c.rect(x, y, 12, 12, colour)
        c.text(x + 18, y + 10, label, size=11)
        y += 20
    return y
