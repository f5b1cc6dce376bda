"""Text and markdown tables of a :class:`ByFamilyResult` (``tilecast evaluate --by-family``)."""

from __future__ import annotations

from .by_family import ByFamilyResult, FamilyRow, RunFamilies
from .report import _grid

HEAD = ["phase", "family", "measured_ms", "predicted_ms", "pred/meas", "nodes", "kernels"]


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _row(r: FamilyRow) -> list[str]:
    return [r.phase, r.family, f"{r.measured_ms:.2f}", f"{r.predicted_ms:.2f}", _ratio(r.ratio),
            str(r.nodes), str(r.kernels)]


def _run_header(run: RunFamilies) -> str:
    share = run.kernel_ms / run.e2e_ms * 100 if run.e2e_ms else 0.0
    return (f"{run.gpu} {run.model} {run.mode} batch {run.batch} seq {run.seq}: "
            f"measured step {run.e2e_ms:.1f} ms, per-node kernels {run.kernel_ms:.1f} ms "
            f"({share:.0f} %), no-kernel nodes {run.host_ms:.1f} ms, step - kernels "
            f"{run.gap_ms:+.1f} ms; forecast {run.predicted_ms:.1f} ms "
            f"({run.zero_cost_nodes} zero-cost ONNX nodes)")


def _phase_line(run: RunFamilies) -> list[str]:
    parts = [f"{p.phase} {p.step_ms:.1f} ms (per-node {p.nodes_ms:.1f} ms, "
             f"{'-' if p.ratio is None else f'{p.ratio:.2f}x'}; forecast {p.forecast_ms:.1f} ms)"
             for p in run.phases]
    return [f"measured passes: {'; '.join(parts)}"] if parts else []


def render_by_family(res: ByFamilyResult, markdown: bool = False) -> str:
    out = [f"predictor: {res.predictor}"]
    for run in res.runs:
        out += ["", _run_header(run), *_phase_line(run),
                *_grid(HEAD, [_row(r) for r in run.rows], markdown)]
        if run.unclassified:
            out.append(f"unclassified fx targets: {', '.join(run.unclassified)}")
    thead = ["gpu", "mode", "phase", "family", "measured_ms", "predicted_ms", "pred/meas",
             "runs"]
    trows = [[t.gpu, t.mode, t.phase, t.family, f"{t.measured_ms:.1f}", f"{t.predicted_ms:.1f}",
              _ratio(t.ratio), str(t.runs)] for t in res.totals]
    out += ["", "all runs, per GPU and mode:", *_grid(thead, trows, markdown)]
    if res.skipped:
        out += ["", f"skipped ({len(res.skipped)}):"]
        out += [f"- {s.file}: {s.reason}" for s in res.skipped]
    return "\n".join(out) + "\n"
