"""Does the predictor err the same way on a GPU's sweep GEMMs and on its networks' GEMMs?

    python benchmarks/sweep_vs_labels.py [--data ../shared/datasets/neusight-asplos25]
                                         [--predictor default]

Per GPU, the geometric mean of forecast / measured over two sets of GEMMs that share almost
no shape: the kernel sweep (`kernels/`, every bmm and linear of the train and eval splits that
takes at least 0.2 ms; mostly random, unaligned dims) and the end-to-end labels' per-node CSVs
(the forward matmuls of every run, as `tilecast evaluate --by-family` matches them; the
networks' aligned, regular dims). Their quotient (labels / sweep) is 1 when a kernel-level gain
carries to end to end. Above 1, the networks' GEMMs are forecast slower, relative to what was
measured, than the sweep's. Two causes mix in it:

- the two measurements disagree on the same GEMM (the sweep times kernels back to back, the
  labels one node at a time): `benchmarks/data_consistency.py` measures this on exact shapes;
- the predictor errs differently on the networks' shapes than on the sweep's (a tile, layout
  or kernel the networks' shapes get and the random sweep shapes rarely do).

Dividing this script's quotient by data_consistency.py's sweep / label median leaves the
second. Why: the L4's kernel-level and end-to-end errors move in opposite directions under
every matmul change tried (docs/predictor.md). Nothing here is fitted; the forecasts reuse the
export cache of benchmarks/accuracy.py.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "neusight-asplos25"
sys.path.insert(0, str(REPO))

from tilecast.analyzer.pipeline import resolve_predictor  # noqa: E402
from tilecast.device_db import load_device  # noqa: E402
from tilecast.errors import ConfigError  # noqa: E402
from tilecast.evaluation.by_family import evaluate_by_family  # noqa: E402
from tilecast.learned.dataset import KernelSamples, load_kernels  # noqa: E402
from tilecast.learned.evaluate import load_eval, predict_by_device, report_family  # noqa: E402
from tilecast.learned.prepare import default_lookup  # noqa: E402

MIN_SWEEP_MS = 0.2  # throughput-bound kernels, like the networks' GEMMs


def geo(values: list[float] | np.ndarray) -> float:
    return math.exp(float(np.mean(np.log(values)))) if len(values) else math.nan


def sweep_ratios(data: Path, predictor) -> dict[str, tuple[float, int]]:
    """Per GPU: geometric mean forecast / measured over its sweep GEMMs, and their count."""
    parts = [load_kernels([data], "train"), load_eval([data])]
    with contextlib.suppress(ConfigError):  # a copy without the AMD kernels
        parts.append(load_kernels([data], "train", "amd"))
    samples = KernelSamples.concat(parts)
    keep = np.isin(report_family(samples.op), ["matmul", "linear"])
    samples = samples.select(keep & (samples.latency_ms >= MIN_SWEEP_MS))
    ratio = predict_by_device(predictor, samples, default_lookup) / samples.latency_ms
    return {load_device(gpu).name: (geo(ratio[samples.device == gpu]),
                                    int((samples.device == gpu).sum()))
            for gpu in set(samples.device)}


def label_ratios(data: Path, predictor) -> dict[str, tuple[float, int]]:
    """Per GPU: geometric mean over its runs of forward-matmul forecast / measured."""
    result = evaluate_by_family(data / "labels", predictor=predictor,
                                progress=lambda m: print(m, file=sys.stderr))
    per_gpu: dict[str, list[float]] = defaultdict(list)
    for run in result.runs:
        per_gpu[load_device(run.gpu).name] += [
            row.ratio for row in run.rows
            if row.phase == "forward" and row.family == "matmul" and row.ratio]
    return {gpu: (geo(v), len(v)) for gpu, v in per_gpu.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--predictor", default="default")
    args = ap.parse_args()
    if not (args.data / "kernels").is_dir():
        sys.exit(f"Error: no kernels/ under {args.data} (the shared NeuSight dataset)")
    predictor = resolve_predictor(args.predictor)
    sweep = sweep_ratios(args.data, predictor)
    labels = label_ratios(args.data, predictor)
    print(f"{'GPU':<24}{'board W':>8}{'sweep f/m':>11}{'n':>7}{'labels f/m':>12}{'runs':>6}"
          f"{'labels/sweep':>14}")
    watts = {gpu: load_device(gpu).board_power_w or 0 for gpu in set(sweep) & set(labels)}
    for gpu in sorted(watts, key=watts.get):
        (s, n), (lab, runs) = sweep[gpu], labels[gpu]
        print(f"{gpu:<24}{watts[gpu]:>8g}{s:>11.2f}{n:>7}{lab:>12.2f}{runs:>6}{lab / s:>14.2f}")
    print(f"\nf/m: forecast / measured (geometric mean; sweep GEMMs >= {MIN_SWEEP_MS} ms, labels:"
          " forward matmuls per run). labels/sweep above 1: the networks' GEMMs are forecast"
          " slower, relative to their measurements, than the sweep's (see the docstring).")


if __name__ == "__main__":
    main()
