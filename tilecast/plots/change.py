"""A comparison (``tilecast compare`` / ``gate``) as a chart: per device, each family's time
before and after, and the kernels that changed most, slower to the right."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .layout import GREY, LABEL_W, ROW_H, WIDTH, clip, header, legend
from .svg import PALETTE, Canvas

if TYPE_CHECKING:  # the chart reads Comparisons; nothing of them runs here
    from ..gate.compare import Comparison, DeviceComparison

BASE, SLOWER, FASTER = GREY, PALETTE[3], PALETTE[2]  # grey, vermillion, bluish green
VALUE_W = 210


def _families(c: Canvas, y: float, d: DeviceComparison) -> float:
    """Two bars per family, base (grey) above new (vermillion if slower, green if faster)."""
    c.text(20, y + 16, "Time by kernel family, base and new", size=13, weight="bold")
    y += 26
    rows = sorted(d.by_family, key=lambda f: -max(f.base_ms, f.new_ms))
    span = max([max(f.base_ms, f.new_ms) for f in rows] + [1e-30])
    plot_w = WIDTH - LABEL_W - VALUE_W - 40
    for f in rows:
        c.text(20 + LABEL_W - 8, y + 15, clip(f.family, 37), size=11, anchor="end")
        colour = SLOWER if f.delta_ms > 0 else FASTER if f.delta_ms < 0 else BASE
        c.rect(20 + LABEL_W, y + 3, plot_w * f.base_ms / span, 7, BASE,
               title=f"{f.family} base: {f.base_ms:.4f} ms")
        c.rect(20 + LABEL_W, y + 11, plot_w * f.new_ms / span, 7, colour,
               title=f"{f.family} new: {f.new_ms:.4f} ms")
        pct = "" if f.base_ms <= 0 else f" ({f.change_pct:+.1f} %)"
        c.text(20 + LABEL_W + plot_w + 8, y + 15, f"{f.base_ms:.3f} -> {f.new_ms:.3f} ms{pct}",
               size=11)
        y += ROW_H
    return y + 8


def _kernels(c: Canvas, y: float, d: DeviceComparison) -> float:
    """The largest kernel changes as bars from a centre line: faster left, slower right."""
    changed = [k for k in d.top if k.delta_ms != 0]
    if not changed:
        return y
    c.text(20, y + 16, f"Largest kernel changes ({len(changed)})", size=13, weight="bold")
    y += 26
    span = max(abs(k.delta_ms) for k in changed)
    half = (WIDTH - LABEL_W - VALUE_W - 40) / 2
    mid = 20 + LABEL_W + half
    top = y
    for k in changed:
        c.text(20 + LABEL_W - 8, y + 15, clip(f"{k.name} ({k.op_type})", 37), size=11,
               anchor="end")
        w = half * abs(k.delta_ms) / span
        colour = SLOWER if k.delta_ms > 0 else FASTER
        c.rect(mid if k.delta_ms > 0 else mid - w, y + 4, w, ROW_H - 8, colour,
               title=f"{k.name}: {k.status}, {k.delta_ms:+.4f} ms")
        c.text(20 + LABEL_W + 2 * half + 8, y + 15, f"{k.delta_ms:+.4f} ms, {k.status}",
               size=11)
        y += ROW_H
    c.line(mid, top, mid, y, stroke="#333")
    return y + 8


def _device(c: Canvas, y: float, d: DeviceComparison) -> float:
    verdict = "REGRESSED" if d.regressed else "within threshold"
    c.text(20, y + 18, f"{d.summary}: {verdict}", size=14, weight="bold",
           fill=SLOWER if d.regressed else "#222")
    c.text(20, y + 36, f"{d.base_ms:.3f} -> {d.new_ms:.3f} ms; {d.setting}; kernels "
           f"{d.base_kernels} -> {d.new_kernels} ({len(d.added)} added, {len(d.removed)} "
           f"removed, {d.renamed} renamed)", size=11, fill="#555")
    return _kernels(c, _families(c, y + 44, d), d)


def comparison_svg(comparisons: Sequence[Comparison],
                   names: Sequence[str | None] | None = None) -> str:
    """Every device of every comparison, one under the other; ``names``: a gate's model names,
    one per comparison, each shown above its devices."""
    c = Canvas(WIDTH, 0)
    if not comparisons:
        c.text(20, 40, "nothing was compared", size=13)
        c.height = 60
        return c.svg()
    first = comparisons[0]
    y = header(c, f"{clip(first.base, 40)} -> {clip(first.new, 40)}"
               if len(comparisons) == 1 else f"{len(comparisons)} models compared",
               f"threshold {first.threshold}; vermillion: slower, green: faster, grey: base")
    for cmp, name in zip(comparisons, names or [None] * len(comparisons), strict=True):
        if name:
            y += 24
            c.text(20, y, f"model {name}: {clip(cmp.base, 45)} -> {clip(cmp.new, 45)}",
                   size=15, weight="bold")
        for w in cmp.warnings:
            y += 16
            c.text(20, y, clip(f"warning: {w}", 135), size=11, fill=SLOWER)
        for d in cmp.devices:
            y = _device(c, y + 10, d)
    y = legend(c, y, [("base", BASE), ("new, slower", SLOWER), ("new, faster", FASTER)])
    c.height = y + 10
    return c.svg()
