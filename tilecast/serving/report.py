"""Text renderings of a ServingForecast (table, markdown; JSON is ``to_json``)."""

from __future__ import annotations

from ..analyzer.forecast import GRAPH_FLOOR_EVIDENCE, GRAPH_FLOOR_US
from ..parallel.report import _table
from .forecast import GIB, ServingForecast


def _lines(f: ServingForecast) -> list[tuple[str, str]]:
    tpot = f.tpot_ms
    if tpot is None:
        decode = "none (one token per request: the prefill makes it)"
    else:
        steps = ", ".join(f"{s.latency_ms:.3f} ms at {s.context}" for s in f.decode)
        decode = f"{tpot:.3f} ms per token after the first ({steps} keys)"
    mem = (f"weights {f.weights_bytes / GIB:.2f} GiB + KV cache {f.kv_cache_bytes / GIB:.2f} "
           f"GiB ({f.kv_bytes_per_token:,.0f} bytes per token) of {f.capacity_bytes / GIB:.0f}"
           f" GiB: {'fits' if f.fits else 'does NOT fit'}; at most {f.max_batch:,} sequences "
           f"of {f.prompt + f.generate} tokens (activations not counted)")
    gpus = (f"{f.tp}, tensor parallel on {f.cluster} (times, weights and KV cache per GPU)"
            if f.tp > 1 else "1")
    return [("model", f.model), ("device", f.device.name), ("gpus", gpus),
            ("requests", f"batch {f.batch} x prompt {f.prompt} tokens, {f.generate} generated "
                         "each"),
            ("layers", str(f.layers)),
            ("predictor", f.predictor), ("runtime", f.runtime),
            ("prefill", f"{f.prefill_ms:.3f} ms (time to first token)"),
            ("decode", decode),
            ("request", f"{f.total_ms:.3f} ms to the last token; {f.tokens_per_s:,.1f} "
                        "generated tokens/s over the batch"),
            ("memory", mem),
            *([("experts", f"{f.routing['active_per_step']:.2f} of "
                           f"{f.routing['per_layer']:.0f} per MoE layer and decode step "
                           f"(top-{f.routing['top_k']:.0f}, uniform routing)")]
              if f.routing else []),
            *([("note", "extrapolated: some kernels lie outside the predictor's training "
                        "data (docs/serving.md)")] if f.extrapolated else []),
            *([("note", _floor_note(f))] if f.graph_floor is not None else [])]


def _floor_note(f: ServingForecast) -> str:
    g = f.graph_floor
    assert g is not None
    return (f"graph floor: {g.kernels:,} kernels of the first decode step are forecast under "
            f"{GRAPH_FLOOR_US} us each ({g.ms:.3f} ms); {GRAPH_FLOOR_EVIDENCE}, so the step "
            "is likely slower (docs/serving.md, \"Limits\")")


def render_serving(f: ServingForecast, fmt: str) -> str:
    if fmt == "json":
        return f.to_json()
    if fmt == "svg":
        from ..plots import serving_svg

        return serving_svg([f])
    prefix = "- " if fmt == "markdown" else ""
    return "".join(f"{prefix}{k:<10} {v}\n" for k, v in _lines(f))


SWEEP_COLUMNS = ("batch", "prefill_ms", "tpot_ms", "total_ms", "tokens_per_s", "kv_cache_gib",
                 "memory_gib", "fits")


def _sweep_row(f: ServingForecast) -> list[str]:
    tpot = "-" if f.tpot_ms is None else f"{f.tpot_ms:.3f}"
    return [str(f.batch), f"{f.prefill_ms:.3f}", tpot, f"{f.total_ms:.3f}",
            f"{f.tokens_per_s:.1f}", f"{f.kv_cache_bytes / GIB:.2f}",
            f"{(f.weights_bytes + f.kv_cache_bytes) / GIB:.2f}", "yes" if f.fits else "NO"]


def render_sweep(runs: list[ServingForecast], fmt: str) -> str:
    """One row per batch size: the latency / throughput trade-off and where memory ends."""
    if fmt == "svg":
        from ..plots import serving_svg

        return serving_svg(runs)
    if fmt == "json":
        import json

        return json.dumps({"schema": 1, "kind": "serving-sweep",
                           "runs": [f.to_dict() for f in runs]}, indent=2) + "\n"
    first = runs[0]
    on = f"{first.tp} x {first.device.name} (tp, {first.cluster})" if first.tp > 1 \
        else first.device.name
    head = (f"{first.model} on {on}: prompt {first.prompt} tokens, "
            f"{first.generate} generated, runtime {first.runtime}, predictor {first.predictor}"
            f"; at most {first.max_batch:,} sequences fit\n")
    md = fmt == "markdown"  # a blank line so that the table is not read as the heading's
    return head + ("\n" if md else "") + _table(SWEEP_COLUMNS, [_sweep_row(f) for f in runs], md)
