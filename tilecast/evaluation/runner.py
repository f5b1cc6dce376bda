"""Run the evaluation: export each labelled model (cached), forecast it, compare."""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..analyzer.pipeline import analyze, resolve_predictor
from ..analyzer.predictor import Predictor
from ..errors import ConfigError
from .labels import LAYOUT, Label, Skipped, discover_labels
from .published import load_published

# Heads used by the reference measurements (the paper's Hugging Face runs).
TASKS = {
    ("bert", "inference"): "sequence-classification", ("bert", "training"): "pretraining",
    ("gpt2", "inference"): "causal-lm", ("gpt2", "training"): "causal-lm",
    ("opt", "inference"): "causal-lm", ("opt", "training"): "causal-lm",
    ("switch_transformers", "inference"): "seq2seq",
    ("switch_transformers", "training"): "seq2seq",
}
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Run:
    gpu: str
    model: str
    mode: str
    batch: int
    seq: int
    variant: str
    measured_ms: float
    predicted_ms: float
    error_pct: float  # |predicted - measured| / measured, percent
    paper_error_pct: float | None


@dataclass(frozen=True)
class Summary:
    gpu: str
    mode: str
    variant: str
    n: int
    mape_pct: float
    paper_mape_pct: float | None  # over the cells of this row the paper reports
    n_paper: int = 0  # how many of the n cells have a published error


@dataclass(frozen=True)
class EvalResult:
    runs: tuple[Run, ...]
    summary: tuple[Summary, ...]
    skipped: tuple[Skipped, ...]
    predictor: str

    def to_dict(self) -> dict[str, Any]:
        return {"predictor": self.predictor, "runs": [asdict(r) for r in self.runs],
                "summary": [asdict(s) for s in self.summary],
                "skipped": [asdict(s) for s in self.skipped]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def default_cache_dir() -> Path:
    base = os.environ.get("TILECAST_CACHE") or Path.home() / ".cache" / "tilecast"
    return Path(base) / "exports"


def task_for(config: Path, mode: str) -> str:
    model_type = json.loads(config.read_text()).get("model_type", "")
    return TASKS.get((model_type, mode), "causal-lm" if mode == "training" else "base")


def cached_export(label: Label, cache: Path, progress: Progress | None = None) -> Path:
    """Export the label's model at its batch and seq once; key: config hash, shape, task, and
    train/eval tracing (training graphs keep their Dropout nodes, as the measured runs did)."""
    from ..exporters import export_model

    task = task_for(label.config, label.mode)
    digest = hashlib.sha256(label.config.read_bytes()).hexdigest()[:12]
    trace = "train" if label.mode == "training" else "eval"
    path = cache / (f"{label.model}-{digest}-{task}-b{label.batch}-s{label.seq}-float32-"
                    f"{trace}.onnx")
    if not path.is_file():
        if progress:
            progress(f"exporting {label.model} ({task}, batch {label.batch}, seq {label.seq})")
        cache.mkdir(parents=True, exist_ok=True)
        export_model(str(label.config), batch=label.batch, seq=label.seq, task=task,
                     dtype="float32", attn="eager", output=path,
                     train_mode=label.mode == "training")
    return path


def _summaries(runs: list[Run]) -> tuple[Summary, ...]:
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.gpu, r.mode, r.variant)].append(r)
    out = []
    for (gpu, mode, variant), rs in sorted(groups.items()):
        paper = [r for r in rs if r.paper_error_pct is not None]
        out.append(Summary(
            gpu, mode, variant, len(rs), round(sum(r.error_pct for r in rs) / len(rs), 2),
            round(sum(r.paper_error_pct for r in paper) / len(paper), 2) if paper else None,
            len(paper)))
    return tuple(out)


def _no_labels(labels_dir: Path, gpus: tuple[str, ...], skipped: list[Skipped]) -> str:
    """An evaluation of nothing must fail: a CI job pointed at the wrong folder never passes."""
    where = f"{labels_dir}" + (f" for GPU {', '.join(gpus)}" if gpus else "")
    why = (f"; {len(skipped)} file(s) skipped, first: {skipped[0].file}: {skipped[0].reason}"
           if skipped else "")
    return f"no label files in {where} (expected {LAYOUT}){why}"


def evaluate(labels_dir: Path, *, models_dir: Path | None = None,
             published_dir: Path | None = None, gpus: tuple[str, ...] = (),
             predictor: str | Predictor | None = None, cache_dir: Path | None = None,
             progress: Progress | None = None) -> EvalResult:
    models_dir = models_dir or labels_dir.parent / "models"
    labels, skipped = discover_labels(labels_dir, models_dir, gpus)
    if not labels:
        raise ConfigError(_no_labels(labels_dir, gpus, skipped))
    paper = load_published(published_dir) if published_dir else {}
    pred = resolve_predictor(predictor)
    cache = cache_dir or default_cache_dir()
    runs: list[Run] = []
    for i, label in enumerate(labels, 1):
        if progress:
            progress(f"[{i}/{len(labels)}] {label.gpu} {label.file.name}")
        path = cached_export(label, cache, progress)
        f = analyze(path, label.device, mode=label.mode, fusion=label.variant == "fusion",
                    predictor=pred)
        err = abs(f.total_ms - label.measured_ms) / label.measured_ms * 100
        key = (label.gpu, label.model, label.mode, label.batch, label.variant)
        runs.append(Run(label.gpu, label.model, label.mode, label.batch, label.seq,
                        label.variant, round(label.measured_ms, 4), round(f.total_ms, 4),
                        round(err, 2), paper.get(key)))
    return EvalResult(tuple(runs), _summaries(runs), tuple(skipped), pred.name)
