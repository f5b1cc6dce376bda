"""Do forecasts grow with the batch as the measured steps do? Per label pair, printed per GPU.

    python benchmarks/batch_scaling.py [--data ../shared/datasets/neusight-asplos25]
                                       [--predictor default]

Every pair of labels that differ only in the batch (same GPU, model, mode, sequence and
variant, multi-GPU layouts included) gives a measured ratio (larger-batch step / smaller-batch
step) and tilecast's forecast ratio. Their quotient says how the forecast scales:

- below 1: the forecast grows too slowly with the batch, so a GPU looks too slow on small
  batches or too fast on large ones (fixed and per-wave costs too high, or the large kernels'
  utilization too high);
- above 1: the forecast grows too fast.

Why: a level error (every batch off by the same factor) and a scaling error need different
fixes, and an end-to-end MAPE mixes them. The sign flip of the H100 multi-GPU rows (batch 4
over-forecast, batch 16 under) is a scaling error of this kind (docs/predictor.md, "Open
causes"). Nothing here is fitted; the forecasts reuse benchmarks/accuracy.py's export cache.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "neusight-asplos25"
sys.path.insert(0, str(REPO))

from tilecast.evaluation.runner import Run, evaluate  # noqa: E402


def pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """(smaller batch, larger batch) for every two runs that differ only in the batch."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.gpu, r.model, r.mode, r.seq, r.variant)].append(r)
    out = []
    for group in groups.values():
        group.sort(key=lambda r: r.batch)
        out.extend((a, b) for i, a in enumerate(group) for b in group[i + 1:]
                   if b.batch > a.batch)
    return out


def scaling_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for a, b in pairs(runs):
        measured = b.measured_ms / a.measured_ms
        forecast = b.predicted_ms / a.predicted_ms
        rows.append({"gpu": a.gpu, "model": a.model, "mode": a.mode, "variant": a.variant,
                     "batches": f"{a.batch}->{b.batch}", "measured_ratio": measured,
                     "forecast_ratio": forecast, "quotient": forecast / measured})
    return sorted(rows, key=lambda r: (r["gpu"], r["mode"], r["variant"], r["model"]))


def print_report(rows: list[dict]) -> None:
    print(f"{'gpu':24s} {'model':11s} {'mode':9s} {'variant':7s} {'batches':8s} "
          f"{'measured':>8s} {'forecast':>8s} {'fc/meas':>7s}")
    for r in rows:
        print(f"{r['gpu']:24s} {r['model']:11s} {r['mode']:9s} {r['variant']:7s} "
              f"{r['batches']:8s} {r['measured_ratio']:8.2f} {r['forecast_ratio']:8.2f} "
              f"{r['quotient']:7.2f}")
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_gpu[r["gpu"]].append(r["quotient"])
    print("\nper GPU: geometric mean of forecast ratio / measured ratio (pairs)")
    for gpu, qs in sorted(by_gpu.items()):
        gmean = math.exp(statistics.fmean(math.log(q) for q in qs))
        print(f"  {gpu:24s} {gmean:5.2f}  ({len(qs)}; {min(qs):.2f}-{max(qs):.2f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--predictor", default="default")
    args = ap.parse_args(argv)
    labels = args.data / "labels"
    if not labels.is_dir():
        print(f"Error: no labels/ under {args.data} (the shared NeuSight dataset)",
              file=sys.stderr)
        return 2
    res = evaluate(labels, predictor=args.predictor)
    rows = scaling_rows(list(res.runs))
    if not rows:
        print("Error: no two labels differ only in the batch", file=sys.stderr)
        return 1
    print_report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
