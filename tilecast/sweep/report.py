"""Renderings of a Sweep: table, markdown, CSV (JSON is ``Sweep.to_json``)."""

from __future__ import annotations

import csv
import io

from ..parallel.report import _table
from .api import Sweep, SweepRow

COLUMNS = ("device", "math", "runtime", "dims", "total_ms", "band_ms", "speedup",
           "samples_per_s", "top_family", "compute_bound", "extrapolated", "note")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f} %"


def _cells(r: SweepRow) -> list[str]:
    dims = ",".join(f"{k}={v}" for k, v in r.dims) or "-"
    if r.total_ms is None:
        return [r.device, r.math, r.runtime, dims, "-", "-", "-", "-", "-", "-", "-",
                r.skipped or ""]
    note = "incomplete: unsupported or unshaped ops" if r.incomplete else ""
    top = f"{r.top_family} {_pct(r.top_family_share)}" if r.top_family else "-"
    band = "-" if r.band_low_ms is None else f"{r.band_low_ms:.3f}-{r.band_high_ms:.3f}"
    return [r.device, r.math, r.runtime, dims, f"{r.total_ms:.3f}", band,
            "-" if r.speedup is None else f"{r.speedup:.2f}x",
            "-" if r.samples_per_s is None else f"{r.samples_per_s:,.1f}", top,
            _pct(r.compute_bound_share), f"{r.extrapolated_kernels}/{r.kernels}", note]


CSV_FIELDS = ("total_ms", "band_low_ms", "band_high_ms", "speedup", "samples_per_s",
              "top_family", "top_family_share", "compute_bound_share", "kernels",
              "extrapolated_kernels", "incomplete", "skipped")


def _csv(s: Sweep) -> str:
    names = list(dict.fromkeys(k for r in s.rows for k, _ in r.dims))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["device", "math", "runtime", *names, *CSV_FIELDS])
    for r in s.rows:
        dims = dict(r.dims)
        values = [getattr(r, f) for f in CSV_FIELDS]
        writer.writerow([r.device, r.math, r.runtime, *(dims[n] for n in names),
                         *("" if v is None else v for v in values)])
    return out.getvalue()


def render_sweep(s: Sweep, fmt: str) -> str:
    """One row per (GPU, math mode, runtime, dims): the forecast, its speedup over the first
    forecast at the same dims, and what the time goes to."""
    if fmt == "json":
        return s.to_json()
    if fmt == "svg":  # a chart: ms against the first dim the sweep varies
        from ..plots import sweep_svg

        return sweep_svg(s)
    if fmt == "csv":  # raw values, one column per dim
        return _csv(s)
    rows = [_cells(r) for r in s.rows]
    first = next((r for r in s.rows if r.total_ms is not None), None)
    base = f"{first.device}, math {first.math}, runtime {first.runtime}" if first else "-"
    layout = "" if s.memory_format == "nchw" else f", {s.memory_format} activations"
    head = (f"{s.model}: {s.mode}, predictor {s.predictor}{layout}; speedup against {base} at "
            "the same dims\n")
    md = fmt == "markdown"
    return head + ("\n" if md else "") + _table(COLUMNS, rows, md)
