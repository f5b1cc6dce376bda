"""Render comparisons (one for ``tilecast compare``, one per model for ``tilecast gate``) as a
text table, markdown for a pull-request comment, or JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from .compare import Comparison, DeviceComparison, KernelChange

FORMATS = ("table", "json", "markdown")
# (model name or None for a plain comparison, its comparison)
Entry = tuple[str | None, Comparison]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _dms(x: float) -> str:
    return f"{x:+.4g}"


def _pct(p: float) -> str:
    return "new" if not math.isfinite(p) else f"{p:+.1f} %"


def verdict(entries: Sequence[Entry]) -> str:
    """One line: every regression, or ✅ with what moved."""
    def line(name: str | None, d: DeviceComparison) -> str:
        return f"{name}: {d.summary}" if name else d.summary

    pairs = [(name, d) for name, c in entries for d in c.devices]
    bad = [line(n, d) for n, d in pairs if d.regressed]
    if bad:
        return "❌ " + "; ".join(bad)
    moved = [line(n, d) for n, d in pairs if d.direction != "unchanged"]
    return "✅ no regression" + (f": {'; '.join(moved)}" if moved else "")


def _kernel_row(k: KernelChange) -> list[str]:
    name = k.name if k.status != "renamed" else f"{k.name} (was {k.base_name})"
    return [k.status, name, k.op_type, _ms(k.base_ms), _ms(k.new_ms), _dms(k.delta_ms)]


def _counts(d: DeviceComparison) -> str:
    return (f"{len(d.added)} kernels added, {len(d.removed)} removed, {d.renamed} renamed "
            f"({d.base_kernels} -> {d.new_kernels} kernels)")


# --- text -----------------------------------------------------------------------------------
def _grid(header: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, *rows)]


def _text_device(d: DeviceComparison) -> list[str]:
    fam = [[f.family, _ms(f.base_ms), _ms(f.new_ms), _dms(f.delta_ms), _pct(f.change_pct)]
           for f in d.by_family]
    lines = ["", f"{d.device} {d.mode} ({d.setting}) by family:"]
    lines += _grid(["family", "base ms", "new ms", "delta ms", "change"], fam, "  ")
    if d.top:
        lines.append("top kernel changes:")
        lines += _grid(["status", "kernel", "op", "base ms", "new ms", "delta ms"],
                       [_kernel_row(k) for k in d.top], "  ")
    return [*lines, _counts(d)]


def _text(entries: Sequence[Entry]) -> str:
    lines: list[str] = []
    for name, c in entries:
        lines += [f"model      {name}"] if name else []
        lines += [f"base       {c.base}", f"new        {c.new}", f"threshold  {c.threshold}", ""]
        rows = [[d.device, d.mode, _ms(d.base_ms), _ms(d.new_ms), _pct(d.change_pct),
                 "REGRESSED" if d.regressed else "ok"] for d in c.devices]
        lines += _grid(["device", "mode", "base ms", "new ms", "change", ""], rows)
        for d in c.devices:
            lines += _text_device(d)
        lines.append("")
    return "\n".join([*lines, verdict(entries)]) + "\n"


# --- markdown -------------------------------------------------------------------------------
_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def _md_table(header: list[str], rows: list[list[str]], aligns: str) -> list[str]:
    """``aligns``: one letter per column, l(eft), r(ight) or c(entre)."""
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    return ["| " + " | ".join(header) + " |",
            "| " + " | ".join(_ALIGN[a] for a in aligns) + " |",
            *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)]


def _md_device(name: str | None, d: DeviceComparison) -> list[str]:
    title = f"{name}: " if name else ""
    lines = ["<details>", f"<summary>{title}{d.device} {d.mode}: {_ms(d.base_ms)} → "
             f"{_ms(d.new_ms)} ms ({_pct(d.change_pct)}), {d.setting}</summary>", ""]
    fam = [[f.family, _ms(f.base_ms), _ms(f.new_ms), _dms(f.delta_ms), _pct(f.change_pct)]
           for f in d.by_family]
    lines += _md_table(["family", "base ms", "new ms", "Δ ms", "change"], fam, "lrrrr")
    if d.top:
        rows = [[r[1].join("``"), r[2], r[0], *r[3:]] for r in map(_kernel_row, d.top)]
        lines += ["", *_md_table(["kernel", "op", "status", "base ms", "new ms", "Δ ms"], rows,
                                 "lllrrr")]
    return [*lines, "", _counts(d) + ".", "", "</details>", ""]


def _markdown(entries: Sequence[Entry], title: str) -> str:
    lines = [f"### {title}", "", verdict(entries), ""]
    gate = any(name for name, _ in entries)
    header = (["model"] if gate else []) + ["device", "mode", "base ms", "new ms", "change", ""]
    rows = [([name or ""] if gate else []) + [d.device, d.mode, _ms(d.base_ms), _ms(d.new_ms),
                                              _pct(d.change_pct), "❌" if d.regressed else "✅"]
            for name, c in entries for d in c.devices]
    lines += _md_table(header, rows, ("l" if gate else "") + "llrrrc")
    for name, c in entries:
        lines += ["", f"`{c.base}` → `{c.new}`, threshold {c.threshold}", ""]
        lines += [f"> ⚠️ {w}" for w in c.warnings] + ([""] if c.warnings else [])
        for d in c.devices:
            lines += _md_device(name, d)
    return "\n".join(lines).rstrip() + "\n"


# --- entry points ---------------------------------------------------------------------------
def render(entries: Sequence[Entry], fmt: str, title: str = "tilecast latency comparison",
           ) -> str:
    if fmt == "svg":
        from ..plots import comparison_svg

        return comparison_svg([c for _, c in entries], [name for name, _ in entries])
    if fmt == "json":
        if len(entries) == 1 and entries[0][0] is None:
            return entries[0][1].to_json()
        data = {"schema": 1, "kind": "tilecast-gate",
                "regressed": any(c.regressed for _, c in entries), "verdict": verdict(entries),
                "models": [{"name": name, **c.to_dict()} for name, c in entries]}
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "markdown":
        return _markdown(entries, title)
    return _text(entries)
