"""Render a :class:`ParallelForecast` (or an auto-search ranking) as table, json, csv, markdown."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from .forecast import GIB, ParallelForecast

RANK_COLUMNS = ("stage", "layers", "compute_ms", "exposed_comm_ms", "bubble_ms", "update_ms",
                "step_ms", "memory_gib", "fits")
COLL_COLUMNS = ("name", "group", "op", "phase", "bytes", "ranks", "count", "latency_ms",
                "total_ms", "algorithm", "link", "exposed", "stage")


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _rank_rows(f: ParallelForecast) -> list[list[str]]:
    return [[str(r.stage), f"{r.layers[0]}-{r.layers[1] - 1}", f"{r.compute_ms:.3f}",
             f"{r.exposed_comm_ms:.3f}", f"{r.bubble_ms:.3f}", f"{r.update_ms:.3f}",
             f"{r.step_ms:.3f}", f"{r.memory.total / GIB:.2f}", "yes" if r.memory.fits else "NO"]
            for r in f.ranks]


def _coll_rows(f: ParallelForecast) -> list[list[str]]:
    return [[c.name, c.group, c.op, c.phase, str(c.bytes), str(c.ranks), str(c.count),
             f"{c.latency_ms:.4f}", f"{c.total_ms:.3f}", c.algorithm, c.link,
             "yes" if c.exposed else "overlapped", str(c.stage)] for c in f.collectives]


def _table(header: Sequence[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), *(fmt.format(*r) for r in rows)]) + "\n"


def _split_lines(f: ParallelForecast) -> list[tuple[str, str]]:
    """What context and expert parallelism put on one rank."""
    lay, out = f.layout, []
    if lay.cp > 1:
        out.append(("sequence", f"{f.sequence} tokens, {f.sequence // lay.cp} per rank "
                                f"(cp {lay.cp})"))
    if f.experts:
        out.append(("experts", f"{f.experts} per MoE layer, {f.experts // lay.ep} per rank "
                               f"(ep {lay.ep})"))
    return out


def _utilization(f: ParallelForecast) -> str:
    u = f.flops_utilization
    return "" if u is None else f", {u * 100:.1f} % of the {f.peak_tflops:g} TFLOP/s peak"


def _summary(f: ParallelForecast) -> list[tuple[str, str]]:
    c, lay = f.cluster, f.layout
    m = max(f.ranks, key=lambda r: r.memory.total).memory
    return [("model", f.model), ("cluster", f"{c.name}: {c.description}"),
            ("device", c.device.name), ("gpus", f"{lay.gpus} ({_nodes(c.nodes_for(lay.gpus))})"),
            ("layout", lay.label()), ("layers", f"{f.layers} (graph: {f.graph_layers})"),
            ("batch", f"global {f.global_batch} = microbatch {f.microbatch} x "
                      f"{lay.microbatches} x dp {lay.dp}"),
            *_split_lines(f),
            ("predictor", f.predictor), ("runtime", f.runtime), ("math", f.math),
            *([("memory format", f.memory_format)] if f.memory_format != "nchw" else []),
            ("step", f"{f.step_ms:.3f} ms"),
            ("throughput", f"{f.tflops_per_gpu:.1f} TFLOP/s per GPU" + _utilization(f)),
            *([("run", f.run.summary())] if f.run is not None else []),
            ("memory", f"{m.total / GIB:.2f} GiB of {m.capacity / GIB:.0f} GiB per GPU "
                       f"(weights {m.weights / GIB:.2f}, grads {m.gradients / GIB:.2f}, "
                       f"optimizer {m.optimizer / GIB:.2f}, activations "
                       f"{m.activations / GIB:.2f})")]


def render_parallel(f: ParallelForecast, fmt: str) -> str:
    if fmt == "json":
        return f.to_json()
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(("record", *COLL_COLUMNS))
        for row in _coll_rows(f):
            w.writerow(("collective", *row))
        w.writerow(("record", *RANK_COLUMNS))
        for row in _rank_rows(f):
            w.writerow(("rank", *row))
        return buf.getvalue()
    md = fmt == "markdown"
    head = "\n".join(f"{'- ' if md else ''}{k:<10} {v}" for k, v in _summary(f)) + "\n"
    warn = "".join(f"warning: {w}\n" for w in f.warnings)
    return (head + "\nper rank (one row per pipeline stage)\n"
            + _table(RANK_COLUMNS, _rank_rows(f), md)
            + "\ncollectives (family collective)\n" + _table(COLL_COLUMNS, _coll_rows(f), md)
            + ("\n" + warn if warn else ""))


def render_ranking(found: Sequence[ParallelForecast], fmt: str) -> str:
    """The layouts that fit in memory, fastest first; the others are named after the table
    (all of them, with their ``fits`` flag, in JSON)."""
    if fmt == "json":
        import json

        return json.dumps([f.to_dict() for f in found], indent=2) + "\n"
    days = bool(found) and all(f.run is not None for f in found)
    header = ("rank", "layout", "step_ms", "tflops_per_gpu", "memory_gib",
              *(("run_days",) if days else ()))
    fit = [f for f in found if f.fits]
    rows = [[str(i), f.layout.label(), f"{f.step_ms:.3f}", f"{f.tflops_per_gpu:.1f}",
             f"{max(r.memory.total for r in f.ranks) / GIB:.2f}",
             *([f"{f.run.days:.2f}"] if days and f.run is not None else [])]
            for i, f in enumerate(fit, 1)]
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([header, *rows])
        return buf.getvalue()
    out = _table(header, rows, fmt == "markdown") if rows else "no layout fits in memory\n"
    over = [f"{f.layout.label()} ({max(r.memory.total for r in f.ranks) / GIB:.1f} GiB)"
            for f in found if not f.fits]
    if over:
        cap = found[0].ranks[0].memory.capacity / GIB
        out += f"\ndo not fit in {cap:.0f} GiB per GPU: " + ", ".join(over) + "\n"
    return out
