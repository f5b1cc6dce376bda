"""Sanity of forecasts across the zoo: more batch must never forecast faster (issue 17).

    python benchmarks/sanity.py [--models a,b] [--devices l4,t4] [--layers 2] [--quiet]
                                [--runtime eager|graph|cudagraph] [--fusion]

Exports every zoo model at batch 1, 2, 4, ..., 256 with ``--layers`` layers (default 2, so the
whole run stays under 10 minutes on 2 cores; exports are cached in ``--cache``), forecasts
each export on every device in the database in fp32 (the graph's dtypes), fp16 and bf16
(``--math amp-fp16`` / ``amp-bf16`` on the fp32 export; bf16 only where the GPU has bf16 tensor
cores), prints the totals per batch and asserts that

- no forecast decreases as the batch grows (model, device, precision fixed), and
- no kernel exceeds its envelope (the predictor's per-kernel ceiling; see
  :func:`envelope_violations`, a hook until the predictor exposes it).

``--runtime`` picks how the host issues the kernels (default eager; ``graph`` also folds BN
and fuses Conv and GEMM epilogues, docs/math-and-runtimes.md). The envelope holds each
kernel's GPU time, so it is checked under eager only. ``--fusion`` forecasts a compiler's
fusion groups (``tilecast analyze --fusion``).

Exit status 1 when an assertion fails; every violation is listed with the kernel whose
forecast dropped the most between the two batches.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tilecast
from tilecast.analyzer.forecast import Forecast

BATCHES = tuple(2**i for i in range(9))  # 1 .. 256
PRECISIONS = {"fp32": "graph", "fp16": "amp-fp16", "bf16": "amp-bf16"}


@dataclass
class Tally:
    rows: dict[tuple[str, str, str], dict[int, Forecast]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    envelope_checked: bool = True
    envelope: list[str] = field(default_factory=list)


def envelope_violations(f: Forecast) -> list[str] | None:
    """Kernels outside their envelope. The learned predictor's latency form bounds every
    kernel between the roofline and its utilization floor's ceiling by construction
    (tilecast/learned/model.py), so a kernel can only be held AT the floor, which
    ``KernelForecast.clamped`` flags; those are listed (not failures), and a kernel faster
    than its roofline (which the form excludes) would be a violation."""
    from tilecast.analyzer.predictor import roofline_times_ms

    bad = []
    l2_bytes = f.device.l2_cache_mb * 2**20
    for k in f.kernels:
        compute_ms, memory_ms = roofline_times_ms(k.kernel, f.device)
        # A working set within twice the L2 may be served from it, faster than DRAM.
        # Winograd / FFT convolutions do fewer multiplies than the direct count in FLOPs.
        compute_floor = 0.0 if k.kernel.family == "conv" else compute_ms
        floor = max(compute_floor, 0.0 if k.kernel.bytes <= 2 * l2_bytes else memory_ms)
        if k.latency_ms < floor * 0.999 and f.runtime == "eager":
            bad.append(f"{k.kernel.name}: {k.latency_ms:.4g} ms below its roofline "
                       f"{floor:.4g} ms")
    return bad


def export_all(models: list[str], layers: int, cache: Path) -> dict[tuple[str, int], Path]:
    from tilecast.exporters import export_model

    out: dict[tuple[str, int], Path] = {}
    for name in models:
        for batch in BATCHES:
            path = cache / f"{name}-b{batch}-l{layers}.onnx"
            if not path.exists():
                try:
                    export_model(name, batch=batch, layers=layers, output=path)
                except tilecast.TilecastError as exc:
                    print(f"skip {name} batch {batch}: {exc}", file=sys.stderr)
                    continue
            out[(name, batch)] = path
    return out


def forecast_all(files: dict[tuple[str, int], Path], devices: list[tilecast.Device],
                 predictor: tilecast.Predictor, tally: Tally, runtime: str = "eager",
                 fusion: bool = False) -> None:
    import onnx

    for (name, batch), path in sorted(files.items()):
        model = onnx.load(path, load_external_data=False)
        for dev in devices:
            for precision, math in PRECISIONS.items():
                if math == "amp-bf16" and not dev.peak_tflops_bf16_matrix:
                    continue  # autocast refuses bf16 there (see docs/math-and-runtimes.md)
                f = tilecast.analyze(model, dev, predictor=predictor, math=math,
                                     runtime=runtime, fusion=fusion)
                tally.rows.setdefault((name, dev.name, precision), {})[batch] = f
                bad = envelope_violations(f)
                if bad is None:
                    tally.envelope_checked = False
                else:
                    tally.envelope += [f"{name} b{batch} {dev.name} {precision}: {b}"
                                       for b in bad]


def _biggest_drop(small: Forecast, big: Forecast) -> str:
    before = {k.kernel.name: k for k in small.kernels}
    drops = [(before[k.kernel.name].latency_ms - k.latency_ms, k) for k in big.kernels
             if k.kernel.name in before]
    if not drops:
        return "-"
    drop, k = max(drops, key=lambda d: d[0])
    return (f"{k.kernel.name} ({k.kernel.op_type}, {k.kernel.family}, {k.kernel.dtype}): "
            f"{before[k.kernel.name].latency_ms:.4g} -> {k.latency_ms:.4g} ms")


def monotonicity_violations(tally: Tally) -> list[str]:
    out = []
    for (name, device, precision), by_batch in sorted(tally.rows.items()):
        batches = sorted(by_batch)
        for a, b in zip(batches[:-1], batches[1:], strict=True):
            fa, fb = by_batch[a], by_batch[b]
            if fb.total_ms < fa.total_ms:
                out.append(f"{name} {device} {precision}: batch {a} {fa.total_ms:.4g} ms > "
                           f"batch {b} {fb.total_ms:.4g} ms; largest kernel drop "
                           f"{_biggest_drop(fa, fb)}")
    return out


def render(tally: Tally, runtime: str = "eager") -> str:
    w = max([12, *(len(name) + 2 for name, _, _ in tally.rows)])
    head = f"{'model':<{w}}{'device':<30}{'prec':<6}" + "".join(f"{'b' + str(b):>10}"
                                                              for b in BATCHES)
    lines = [head]
    for (name, device, precision), by_batch in sorted(tally.rows.items()):
        cells, last = [], 0.0
        for b in BATCHES:
            f = by_batch.get(b)
            if f is None:
                cells.append(f"{'-':>10}")
                continue
            mark = "<" if f.total_ms < last else " "
            cells.append(f"{f.total_ms:>9.4g}{mark}")
            last = f.total_ms
        lines.append(f"{name:<{w}}{device[:29]:<30}{precision:<6}" + "".join(cells))
    return "\n".join(lines) + f"\n(ms per forward pass, {runtime} runtime; '<': faster " \
                              "than the batch before it)\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--devices", help="comma-separated devices (default: all)")
    parser.add_argument("--layers", type=int, default=2, help="layers per export (default 2)")
    parser.add_argument("--predictor", default="default", help="default, learned, roofline")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "TILECAST_CACHE", Path.home() / ".cache" / "tilecast")) / "sanity")
    parser.add_argument("--quiet", action="store_true", help="print only the violations")
    parser.add_argument("--runtime", default="eager", choices=("eager", "graph", "cudagraph"))
    parser.add_argument("--fusion", action="store_true",
                        help="forecast fused execution (a compiler's fusion groups)")
    args = parser.parse_args()
    from tilecast.analyzer.pipeline import resolve_predictor
    from tilecast.exporters import list_zoo

    models = args.models.split(",") if args.models else [e.name for e in list_zoo()]
    devices = ([tilecast.load_device(d) for d in args.devices.split(",")] if args.devices
               else list(tilecast.list_devices()))
    args.cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    files = export_all(models, args.layers, args.cache)
    exported = time.perf_counter()
    tally = Tally()
    forecast_all(files, devices, resolve_predictor(args.predictor), tally, args.runtime,
                 args.fusion)
    if not args.quiet:
        print(render(tally, args.runtime))
    mono = monotonicity_violations(tally)
    pairs = sum(max(len(v) - 1, 0) for v in tally.rows.values())
    print(f"{len(files)} exports ({exported - start:.0f} s), {len(tally.rows)} series, "
          f"{sum(len(v) for v in tally.rows.values())} forecasts "
          f"({time.perf_counter() - exported:.0f} s); predictor {args.predictor}, "
          f"{args.runtime} runtime{', fused' if args.fusion else ''}")
    print(f"monotonicity: {len(mono)} of {pairs} batch doublings forecast faster")
    for line in mono:
        print(f"  {line}")
    if args.runtime != "eager":
        print("envelope: checked under eager only (it bounds each kernel's GPU time)")
    elif tally.envelope_checked:
        print(f"envelope: {len(tally.envelope)} kernels over their ceiling")
        for line in tally.envelope:
            print(f"  {line}")
    else:
        print("envelope: NOT CHECKED (no per-kernel envelope in this tilecast: see the "
              "envelope_violations hook)")
    return 1 if mono or tally.envelope else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except tilecast.TilecastError as exc:
        sys.exit(f"Error: {exc}")
