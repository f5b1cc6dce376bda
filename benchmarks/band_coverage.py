"""How often a measured end-to-end step lands inside its forecast's error band.

    python benchmarks/band_coverage.py [LABELS_DIR ...] [--predictor default]

Default: the shared labels (../shared/datasets/neusight-asplos25/labels) and our own
(datasets/*/labels-*). Each single-GPU label (plain or fusion) is forecast as `tilecast
evaluate` does (cached exports) and its measured step compared with the forecast's band
(analyzer/band.py). Prints, per GPU and mode: labels, how many fall inside, below and above
the band, the band's mean width (high / low) and how much of the forecast it covers. Nothing
here tunes the bands: they come from the leave-one-GPU-out kernel folds alone.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tilecast.analyzer.pipeline import resolve_predictor  # noqa: E402
from tilecast.evaluation.labels import discover_labels  # noqa: E402
from tilecast.evaluation.runner import default_cache_dir, forecast_label  # noqa: E402

SHARED = REPO.parent / "shared" / "datasets" / "neusight-asplos25" / "labels"
# A band over less of the forecast than this is no test of the bands: counted as "no band".
MIN_COVERED = 0.5


def label_dirs(args: list[Path]) -> list[Path]:
    if args:
        return args
    return ([SHARED] if SHARED.is_dir() else []) + sorted(REPO.glob("datasets/*/labels-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", nargs="*", type=Path)
    ap.add_argument("--predictor", default="default")
    args = ap.parse_args()
    pred = resolve_predictor(args.predictor)
    rows: dict[tuple[str, str], list[tuple[str, float, float]]] = defaultdict(list)
    outside: list[str] = []
    for root in label_dirs(args.labels):
        labels, _ = discover_labels(root, root.parent / "models")
        for label in labels:
            if label.variant not in ("plain", "fusion"):
                continue
            f = forecast_label(label, pred, default_cache_dir())
            band = f.band
            if band is None:
                raise SystemExit(f"Error: predictor {pred.name!r} ships no error bands")
            where = "in" if band.low_ms <= label.measured_ms <= band.high_ms else (
                "below" if label.measured_ms < band.low_ms else "above")
            if band.covered_share(f.total_ms) < MIN_COVERED:
                where = "none"
            rows[(label.gpu, f"{label.mode} {label.dtype} {label.runtime}")].append(
                (where, band.high_ms / band.low_ms, band.covered_share(f.total_ms)))
            if where in ("below", "above"):
                outside.append(f"- {label.gpu} {label.file.name} ({label.math}): measured "
                               f"{label.measured_ms:.1f} ms, band {band.low_ms:.1f}-"
                               f"{band.high_ms:.1f} over {band.covered_share(f.total_ms):.0%}")
    print(f"predictor {pred.name}; band level {band.level:.0%} of the folds' kernel time\n")
    print("| gpu | labels | n | inside | below | above | no band | width (high / low) | "
          "covered |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    tally = defaultdict(int)
    for (gpu, kind), runs in sorted(rows.items()):
        n = {w: sum(r[0] == w for r in runs) for w in ("in", "below", "above", "none")}
        for w, c in n.items():
            tally[w] += c
        width = sum(r[1] for r in runs) / len(runs)
        cover = sum(r[2] for r in runs) / len(runs)
        print(f"| {gpu} | {kind} | {len(runs)} | {n['in']} | {n['below']} | {n['above']} | "
              f"{n['none']} | {width:.2f} | {cover:.0%} |")
    tested = tally["in"] + tally["below"] + tally["above"]
    print(f"\n{tally['in']} of {tested} labels with a band over half their forecast or more "
          f"inside it ({tally['in'] / max(tested, 1):.0%}); {tally['below']} below, "
          f"{tally['above']} above; {tally['none']} labels without (16-bit and TF32 math)")
    print("\n".join(["", "outside their band:", *outside]) if outside else "")


if __name__ == "__main__":
    main()
