"""Render a :class:`Forecast` as a text table, markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from functools import partial

from .analyzer.attention_fusion import FUSED_ATTENTION, SDPA_CALL
from .analyzer.costs.zero import CPU_ONLY
from .analyzer.epilogues import FUSED_EPILOGUE
from .analyzer.fold import FOLDED, HOST
from .analyzer.forecast import GRAPH_FLOOR_EVIDENCE, GRAPH_FLOOR_US, Forecast, KernelForecast
from .analyzer.mask_builders import CAUSAL_BY_INDEX
from .analyzer.padding import UNPADDED
from .analyzer.qdq import FUSED_DQ
from .analyzer.rewrites import FOLDED_BIAS
from .analyzer.runtime import FOLDED_BN, GRAPH_KERNEL_LAUNCH_US, HOST_DISPATCH_US

# Short labels of the zero-cost reasons the table names; the rest are views and metadata ops.
ZERO_COST_LABELS = {HOST: HOST, FOLDED: FOLDED, FUSED_DQ: "QDQ fused",
                    FOLDED_BIAS: "bias in GEMM epilogue", FOLDED_BN: "BN folded into Conv",
                    FUSED_EPILOGUE: "in Conv/GEMM epilogue", CPU_ONLY: "CPU-only",
                    FUSED_ATTENTION: "in a fused attention kernel",
                    SDPA_CALL: "in an SDPA kernel",
                    CAUSAL_BY_INDEX: "causal mask applied by index",
                    UNPADDED: "padding mask of an unpadded batch"}
FORMATS = ("table", "json", "csv", "markdown")
CSV_FIELDS = ("name", "op_type", "family", "phase", "dtype", "flops", "bytes", "latency_ms",
              "bound", "tile", "extrapolated", "estimated", "nodes", "math", "runtime",
              "memory_format")
MATH_TEXT = {"graph": "the graph's dtypes", "tf32": "fp32 matmul/conv on TF32 tensor cores",
             "tf32-conv": "fp32 convs on TF32 tensor cores, matmuls in fp32 (PyTorch 1.12+)",
             "amp-fp16": "autocast to float16, casts costed",
             "amp-bf16": "autocast to bfloat16, casts costed"}
RUNTIME_TEXT = {"eager": f"host queue: per-op dispatch as measured (learned predictor) or "
                         f"{HOST_DISPATCH_US:g} us per kernel",
                "graph": f"CUDA-graph style, {GRAPH_KERNEL_LAUNCH_US:g} us per kernel, "
                         "BN folded, scale/add/activation in Conv and GEMM epilogues at inference",
                "cudagraph": f"torch.cuda.graphs replay of the eager kernels, "
                             f"{GRAPH_KERNEL_LAUNCH_US:g} us per kernel"}
LAYOUT_TEXT = {"nchw": "cuDNN's NCHW <-> NHWC transposes around tensor-core convs costed",
               "channels-last": "tensor-core convs run without layout transposes"}


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _dims(k: KernelForecast) -> str:
    c = k.kernel.cost
    if c.matmul is not None:
        m = c.matmul
        return f"B{m.b} M{m.m} N{m.n} K{m.k}" + (" causal" if m.causal else "")
    if c.rows is not None:
        return f"{c.rows.rows}x{c.rows.cols}"
    return f"{human(c.elements)} el" if c.elements else ""


def _flag(k: KernelForecast) -> str:
    return ("!" if k.kernel.cost.estimated else "") + ("*" if k.extrapolated else "")


def _layout_line(f: Forecast) -> list[str]:
    """The memory format, where it can matter: a model with convs under a PyTorch runtime
    (the graph runtime's compiler picks NHWC itself), or when the user chose channels-last."""
    convs = any(k.kernel.family == "conv" for k in f.kernels)
    if f.memory_format == "nchw" and not (convs and f.runtime != "graph"):
        return []
    text = ("the compiler picks NHWC for tensor-core convs" if f.runtime == "graph"
            else LAYOUT_TEXT.get(f.memory_format, "?"))
    return [f"layout     {f.memory_format} ({text})"]


def _header_lines(f: Forecast) -> list[str]:
    d = f.device
    units = "CUs" if d.vendor == "amd" else "SMs"  # AMD's name for its compute units
    mode = f.mode + (" (fused)" if f.fusion else "")
    dims = " ".join(f"{k}={v}" for k, v in sorted(f.dims.items()))
    lines = [f"model      {f.model}" + (f"  [{dims}]" if dims else ""),
             f"device     {d.name} ({d.arch}, {d.sm_count} {units}, "
             f"{d.mem_bandwidth_gbps:g} GB/s)",
             f"mode       {mode}",
             f"math       {f.math} ({MATH_TEXT.get(f.math, '?')})",
             f"runtime    {f.runtime} ({RUNTIME_TEXT.get(f.runtime, '?')})",
             *_layout_line(f),
             f"predictor  {f.predictor}",
             f"total      {f.total_ms:.3f} ms over {len(f.kernels)} kernels "
             f"({f.node_count} nodes)"]
    band = f.band
    if band is not None:
        lines.append(f"band       {band.low_ms:.3f}-{band.high_ms:.3f} ms ({band.level:.0%} "
                     "error bands of unseen GPUs' kernels, over "
                     f"{band.covered_share(f.total_ms):.0%} of the time)")
    if len(f.by_phase) > 1:
        lines.append("phases     " + ", ".join(f"{p} {v:.3f} ms" for p, v in f.by_phase.items()))
    return lines


def _envelope_lines(f: Forecast) -> list[str]:
    clamped = f.clamped_by_family
    if not clamped:
        return []
    fams = ", ".join(f"{fam} {n}" for fam, n in clamped.items())
    return [f"envelope: {sum(clamped.values())} kernels held at the utilization floor ({fams})"]


def _alignment_lines(f: Forecast) -> list[str]:
    bad = f.misaligned
    if not bad:
        return []
    ms = sum(k.latency_ms for k in bad)
    first = bad[0].kernel.cost.matmul
    return [f"alignment: {len(bad)} 16/8-bit GEMM(s), {ms:.3f} ms, with rows that are no "
            f"multiple of 16 bytes (e.g. {first.m} x {first.k} -> {first.n}): cuBLAS loads "
            "their operands in 2- or 4-byte pieces instead of 16, so their compute is "
            "forecast 8x or 4x an aligned GEMM's; padding the dim to a multiple of 16 bytes "
            "avoids it"]


def _flagged(kernels: tuple, line: Callable[[int, float], str]) -> list[str]:
    """One line about ``kernels`` (their count and ms), or none when there are none."""
    return [line(len(kernels), sum(k.latency_ms for k in kernels))] if kernels else []


# Kernels held to a floor of PyTorch's own NCHW kernels: (label, why), one line each.
_NATIVE_FLOORS = (
    ("latency", "bound by DRAM latency: PyTorch runs them on its own kernels, one load per "
                "thread at a time (NCHW batch norm in bf16 or with fp16 weights, max pool; "
                "elementwise ops with a broadcast tensor operand and permuted copies on its "
                "non-vectorized loop); fp16 autocast hands batch norm to cuDNN "
                "(docs/predictor.md, \"Batch norm and max pool on PyTorch's native kernels\", "
                "\"PyTorch's non-vectorized elementwise loop\")"),
    ("issue", "bound by instruction issue: PyTorch runs NCHW depthwise convs on its own kernel "
              "(fp32, bf16; fp16 below 32 channels), one thread per output; counts measured on "
              "Hopper (docs/predictor.md, \"Depthwise and grouped convs\")"),
)


def _native_floor_lines(f: Forecast) -> list[str]:
    held = {"latency": f.latency_bound, "issue": f.issue_bound}
    return [line for label, why in _NATIVE_FLOORS
            for line in _flagged(held[label], partial(_held_line, label, why))]


def _held_line(label: str, why: str, n: int, ms: float) -> str:
    return f"{label}: {n} kernels, {ms:.3f} ms, {why}"


def _graph_floor_lines(f: Forecast) -> list[str]:
    return _flagged(f.below_graph_floor, lambda n, ms: (
        f"graph floor: {n} of {len(f.kernels)} kernels forecast under {GRAPH_FLOOR_US} us each "
        f"({ms:.3f} ms); {GRAPH_FLOOR_EVIDENCE}, so these are likely low (docs/predictor.md, "
        "\"What one block costs inside a CUDA graph\")"))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"


def _unsupported_lines(f: Forecast) -> list[str]:
    lines = [f"unsupported ops: {_counts(dict(f.unsupported))}"]
    lines += [f"  {r.op_type} x{r.count}: {r.reason}" for r in f.unsupported_reasons]
    if f.unshaped:
        lines.append(f"unshaped ops: {_counts(dict(f.unshaped))} (shapes cannot be derived)")
        if f.unshaped_from:
            lines.append(f"  (first stopped at {f.unshaped_from})")
    if f.incomplete:
        lines.append(f"  (bytes-only memory-bound estimates, marked !: {f.unsupported_ms:.3f} "
                     "ms of the total; the forecast is incomplete)")
    return (lines + _envelope_lines(f) + _alignment_lines(f) + _native_floor_lines(f)
            + _graph_floor_lines(f))


def _zero_cost_lines(f: Forecast) -> list[str]:
    """Nodes that launch no GPU kernel: host-side shape arithmetic and load-time folding by
    name, the views and metadata ops (each reason is listed in the JSON) together."""
    by_reason = f.zero_cost_by_reason()
    if not by_reason:
        return []
    named = [(ZERO_COST_LABELS[r], n) for r, n in by_reason.items() if r in ZERO_COST_LABELS]
    other = sum(n for r, n in by_reason.items() if r not in ZERO_COST_LABELS)
    parts = [f"{r} {n}" for r, n in named] + ([f"views and metadata {other}"] if other else [])
    return [f"zero-cost nodes: {sum(by_reason.values())} ({', '.join(parts)})"]


def render_table(f: Forecast, top: int = 10) -> str:
    out = _header_lines(f) + ["", f"{'family':<14}{'ms':>12}{'share':>9}"]
    total = f.total_ms or 1.0
    for fam, ms in f.by_family.items():
        out.append(f"{fam:<14}{ms:>12.3f}{ms / total:>8.1%}")
    out += ["", f"top {top} kernels",
            f"{'kernel':<34}{'op_type':<18}{'dims':<30}{'FLOPs':>10}{'bytes':>10}"
            f"{'ms':>10}  {'bound':<9}tile"]
    for k in f.top(top):
        name = k.kernel.name if len(k.kernel.name) <= 33 else k.kernel.name[:30] + "..."
        out.append(f"{name:<34}{k.kernel.op_type[:17]:<18}{_dims(k)[:29]:<30}"
                   f"{human(k.kernel.flops):>10}{human(k.kernel.bytes, 'B'):>10}"
                   f"{k.latency_ms:>10.4f}  {k.bound:<9}{k.tile or '-'}{_flag(k)}")
    out += [""] + _unsupported_lines(f) + _zero_cost_lines(f)
    if f.extrapolated:
        out.append("* extrapolated: outside the data the predictor was validated on "
                   "(e.g. a dtype with no training data)")
    return "\n".join(out) + "\n"


def render_markdown(f: Forecast, top: int = 10) -> str:
    out = [f"### tilecast forecast: {f.total_ms:.3f} ms on {f.device.name} "
           f"({f.mode}, math {f.math}, {f.runtime} runtime)", ""]
    out += [f"- {line}" for line in _header_lines(f)] + ["", "| family | ms | share |",
                                                          "|---|---:|---:|"]
    total = f.total_ms or 1.0
    out += [f"| {fam} | {ms:.3f} | {ms / total:.1%} |" for fam, ms in f.by_family.items()]
    out += ["", "| kernel | op_type | dims | ms | bound | tile |", "|---|---|---|---:|---|---|"]
    out += [f"| `{k.kernel.name}` | {k.kernel.op_type} | {_dims(k)} | {k.latency_ms:.4f} | "
            f"{k.bound} | {k.tile or '-'}{_flag(k)} |" for k in f.top(top)]
    out += [""] + _unsupported_lines(f) + _zero_cost_lines(f)
    return "\n".join(out) + "\n"


def render_csv(f: Forecast) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for k in f.kernels:
        row = k.to_dict()
        row["nodes"] = ";".join(row["nodes"])
        row["math"], row["runtime"], row["memory_format"] = f.math, f.runtime, f.memory_format
        w.writerow(row)
    return buf.getvalue()


def render(f: Forecast, fmt: str, top: int = 10) -> str:
    if fmt == "svg":
        from .plots import forecast_svg

        return forecast_svg(f, top)
    if fmt == "json":
        return f.to_json()
    if fmt == "csv":
        return render_csv(f)
    if fmt == "markdown":
        return render_markdown(f, top)
    return render_table(f, top)
