"""An LLM serving forecast as a chart: a request's phases, or the latency / throughput curve
over batch sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .layout import GREY, PLOT, WIDTH, Bar, axes, bars, clip, header
from .svg import PALETTE, Canvas

if TYPE_CHECKING:  # the chart reads ServingForecasts; nothing of them runs here
    from ..serving.forecast import ServingForecast

PAST_MEMORY = GREY


def _on(f: ServingForecast) -> str:
    return f"{f.tp} x {f.device.name} (tp)" if f.tp > 1 else f.device.name


def _request(c: Canvas, y: float, f: ServingForecast) -> float:
    """One batch size: TTFT, the decode steps and the whole request, as bars."""
    decode = (f.generate - 1) * (f.tpot_ms or 0.0)
    tpot = "" if f.tpot_ms is None else f", {f.tpot_ms:.3f} ms per token"
    return bars(c, y, f"One request (batch {f.batch})", [
        Bar("time to first token (prefill)", f.ttft_ms, f"{f.ttft_ms:.3f} ms", PALETTE[0]),
        Bar(f"{f.generate - 1} decode steps", decode, f"{decode:.3f} ms{tpot}", PALETTE[1]),
        Bar("request, prompt to last token", f.total_ms, f"{f.total_ms:.3f} ms", PALETTE[2])])


def _curve(c: Canvas, runs: Sequence[ServingForecast]) -> float:
    """Throughput (x) against time per output token (y), a point per batch size in batch
    order; the batches whose KV cache does not fit beside the weights are grey."""
    timed = [f for f in runs if f.tpot_ms is not None]
    fx, fy = axes(c, PLOT, [f.tokens_per_s for f in timed], [f.tpot_ms for f in timed],
                  "generated tokens per second (whole batch)", "ms per output token")
    pts = [(fx(f.tokens_per_s), fy(f.tpot_ms)) for f in timed]
    c.polyline(pts, PALETTE[0], title="batch sizes in order")
    for (x, y), f in zip(pts, timed, strict=True):
        colour = PALETTE[0] if f.fits else PAST_MEMORY
        c.circle(x, y, 4, colour, title=f"batch {f.batch}: {f.tokens_per_s:,.0f} tokens/s, "
                                         f"{f.tpot_ms:.3f} ms per token, TTFT "
                                         f"{f.ttft_ms:.3f} ms" + ("" if f.fits else
                                                                  ", KV cache does not fit"))
        c.text(x + 6, y - 6, f"b={f.batch}", size=10, fill=colour)
    return PLOT[3] + 44


def serving_svg(runs: Sequence[ServingForecast]) -> str:
    """``tilecast serve``'s forecast: one batch size as the request's phases; several as the
    latency / throughput curve (a decode-free generation of one token: phases only)."""
    first = runs[0]
    c = Canvas(WIDTH, 0)
    y = header(c, clip(f"{first.model} on {_on(first)}: serving", 90),
               f"prompt {first.prompt} tokens, {first.generate} generated, runtime "
               f"{first.runtime}, predictor {first.predictor}; at most {first.max_batch:,} "
               "sequences fit")
    if len(runs) == 1 or all(f.tpot_ms is None for f in runs):
        for f in runs:
            y = _request(c, y, f)
    else:
        y = _curve(c, runs)
    past = [f.batch for f in runs if not f.fits]
    if past:
        y += 16
        c.text(20, y, f"grey: batch {', '.join(map(str, past))} does not fit (weights and KV "
               "cache past the GPU's memory)", size=11, fill="#555")
    c.height = y + 20
    return c.svg()
