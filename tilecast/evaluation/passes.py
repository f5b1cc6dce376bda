"""Training labels pass by pass: the measured forward and backward beside tilecast's and the
paper's forecast of each.

A training label's JSON records its forward (``fw_latency``) and its backward with the
gradient accumulation (``bwall_latency``); the paper's ``published/summary.csv`` holds
NeuSight's forecast of each pass (``neusight_all_fw_latency``, ``neusight_all_bwall_latency``).
Comparing the passes shows what a step total hides: on the A100 80GB five of eight runs
measure a forward 1.37-1.61x the sum of its per-node timings (``evaluate --by-family``), and a
forecast slow on the backward meets such a step by compensation (docs/predictor.md).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..analyzer.pipeline import resolve_predictor
from ..analyzer.predictor import Predictor
from ..errors import ConfigError
from .labels import discover_labels, measured_passes
from .runner import Progress, default_cache_dir, forecast_label

PassKey = tuple[str, str, int, int]  # gpu dir, model stem, batch, seq
SUMMARY_COLUMNS = ("model_name", "seqlen", "batch", "device", "mode",
                   "neusight_all_fw_latency", "neusight_all_bwall_latency")


@dataclass(frozen=True)
class PassRun:
    """One single-GPU training label, pass by pass (ms)."""

    gpu: str
    model: str
    batch: int
    seq: int
    measured_fw_ms: float
    measured_bw_ms: float  # backward and gradient accumulation (the label's bwall)
    predicted_fw_ms: float
    predicted_bw_ms: float  # tilecast's backward-phase kernels (accumulation included)
    paper_fw_ms: float | None
    paper_bw_ms: float | None

    def error_pct(self, which: str) -> tuple[float, float | None]:
        """(tilecast, paper) signed error of one pass, ``which`` = "fw" or "bw", percent."""
        measured = getattr(self, f"measured_{which}_ms")
        paper = getattr(self, f"paper_{which}_ms")
        ours = (getattr(self, f"predicted_{which}_ms") / measured - 1) * 100
        return ours, None if paper is None else (paper / measured - 1) * 100


def load_paper_passes(published_dir: Path) -> dict[PassKey, tuple[float, float]]:
    """NeuSight's (forward, backward) forecast per training run, from ``summary.csv``."""
    path = published_dir / "summary.csv"
    if not path.is_file():
        return {}
    out: dict[PassKey, tuple[float, float]] = {}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in SUMMARY_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, 2):
            if row["mode"] != "train" or not row["neusight_all_fw_latency"]:
                continue
            try:
                key = (row["device"], row["model_name"], int(row["batch"]), int(row["seqlen"]))
                out[key] = (float(row["neusight_all_fw_latency"]),
                            float(row["neusight_all_bwall_latency"]))
            except ValueError as exc:
                raise ConfigError(f"{path}: line {line}: {exc}") from None
    return out


def evaluate_passes(labels_dir: Path, *, models_dir: Path | None = None,
                    published_dir: Path | None = None, gpus: tuple[str, ...] = (),
                    predictor: str | Predictor | None = None, cache_dir: Path | None = None,
                    progress: Progress | None = None) -> tuple[PassRun, ...]:
    """Every single-GPU training label whose JSON records both passes."""
    models_dir = models_dir or labels_dir.parent / "models"
    labels, _ = discover_labels(labels_dir, models_dir, gpus)
    paper = load_paper_passes(published_dir) if published_dir else {}
    pred, cache = resolve_predictor(predictor), cache_dir or default_cache_dir()
    out = []
    for label in labels:
        if label.mode != "training" or label.variant != "plain":
            continue
        measured = measured_passes(label)
        if len(measured) < 2:
            continue
        if progress:
            progress(f"passes: {label.gpu} {label.file.name}")
        phases = forecast_label(label, pred, cache, progress).by_phase
        fw, bw = paper.get((label.gpu, label.model, label.batch, label.seq), (None, None))
        out.append(PassRun(label.gpu, label.model, label.batch, label.seq,
                           measured["forward"], measured["backward"],
                           round(phases.get("forward", 0.0), 4),
                           round(phases.get("backward", 0.0), 4), fw, bw))
    return tuple(out)
