"""Text and markdown tables of an :class:`EvalResult`."""

from __future__ import annotations

from .runner import EvalResult


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _setting(x) -> list[str]:
    return [x.dtype, x.runtime, x.math]


def render_table(res: EvalResult, markdown: bool = False) -> str:
    # dtype, runtime and math columns only where a label sets them (NeuSight's are fp32 eager)
    extra = any((r.dtype, r.runtime, r.math) != ("float32", "eager", "graph") for r in res.runs)
    cols = ["dtype", "runtime", "math"] if extra else []
    head = ["gpu", "model", "mode", "batch", "seq", "variant", *cols, "measured_ms",
            "predicted_ms", "error_pct", "paper_error_pct"]
    rows = [[r.gpu, r.model, r.mode, str(r.batch), str(r.seq), r.variant,
             *(_setting(r) if extra else []), f"{r.measured_ms:.1f}", f"{r.predicted_ms:.1f}",
             f"{r.error_pct:.1f}", _opt(r.paper_error_pct)] for r in res.runs]
    shead = ["gpu", "mode", "variant", *cols, "n", "tilecast_mape_pct", "paper_mape_pct",
             "n_paper"]
    srows = [[s.gpu, s.mode, s.variant, *(_setting(s) if extra else []), str(s.n),
              f"{s.mape_pct:.1f}", _opt(s.paper_mape_pct), str(s.n_paper)]
             for s in res.summary]
    out = [f"predictor: {res.predictor}", "", *_grid(head, rows, markdown), "",
           *_grid(shead, srows, markdown)]
    if res.skipped:
        out += ["", f"skipped ({len(res.skipped)}):"]
        out += [f"- {s.file}: {s.reason}" for s in res.skipped]
    return "\n".join(out) + "\n"


def _grid(head: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                *("| " + " | ".join(r) + " |" for r in rows)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head), *(fmt.format(*r) for r in rows)]
