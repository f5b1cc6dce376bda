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

from ..analyzer.forecast import Forecast
from ..analyzer.pipeline import analyze, resolve_predictor
from ..analyzer.predictor import Predictor
from ..errors import ConfigError
from .label_programs import attention_for
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
    dtype: str = "float32"  # the label's: what the run measured and the forecast assumed
    runtime: str = "eager"
    math: str = "graph"


@dataclass(frozen=True)
class Summary:
    gpu: str
    mode: str
    variant: str
    n: int
    mape_pct: float
    paper_mape_pct: float | None  # over the cells of this row the paper reports
    n_paper: int = 0  # how many of the n cells have a published error
    dtype: str = "float32"
    runtime: str = "eager"
    math: str = "graph"


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


def cached_export(label: Label, cache: Path, progress: Progress | None = None, *,
                  batch: int | None = None, layers: int | None = None) -> Path:
    """Export the label's model at its batch and seq once; key: config hash, shape, task,
    train/eval tracing (training graphs keep their Dropout nodes, as the measured runs did) and
    the attention the labels recorded where it is not today's eager (``label_programs``).
    ``batch``/``layers`` override the label's batch and the config's depth (multi-GPU runs)."""
    from ..exporters import export_model

    batch = batch or label.batch
    task = label.task or task_for(label.config, label.mode)
    digest = hashlib.sha256(label.config.read_bytes()).hexdigest()[:12]
    trace = "train" if label.mode == "training" else "eval"
    depth = f"-L{layers}" if layers else ""
    attn = label.attn or attention_for(label.config)
    program = "" if attn == "eager" else f"-{attn}"
    path = cache / (f"{label.model}-{digest}-{task}-b{batch}-s{label.seq}-{label.dtype}-"
                    f"{trace}{depth}{program}.onnx")
    if not path.is_file():
        if progress:
            progress(f"exporting {label.model} ({task}, batch {batch}, seq {label.seq})")
        cache.mkdir(parents=True, exist_ok=True)
        export_model(str(label.config), batch=batch, seq=label.seq, task=task,
                     dtype=label.dtype, attn=attn, output=path, layers=layers,
                     train_mode=label.mode == "training")
    return path


def forecast_label(label: Label, predictor: Predictor, cache: Path,
                   progress: Progress | None = None) -> Forecast:
    """The forecast of a single-GPU (plain or fusion) label's run: its model exported (cached)
    at the label's shape and dtype, forecast under the label's runtime and math mode."""
    path = cached_export(label, cache, progress)
    return analyze(path, label.device, mode=label.mode, fusion=label.variant == "fusion",
                   predictor=predictor, runtime=label.runtime, math=label.math)


def _forecast_ms(label: Label, models_dir: Path, pred: Predictor, cache: Path,
                 progress: Progress | None) -> float:
    if label.variant in ("plain", "fusion"):
        return forecast_label(label, pred, cache, progress).total_ms
    from ..parallel import Layout, analyze_parallel, cluster_for_device
    from .distributed import EXPORT_LAYERS, config_layers, parse_variant

    d = parse_variant(label.variant, models_dir)
    path = cached_export(label, cache, progress, batch=d.per_rank_batch(label.batch),
                         layers=EXPORT_LAYERS)
    layout = Layout(dp=d.dp, tp=d.tp, pp=d.pp, microbatches=d.microbatches, zero=d.zero,
                    sequence_parallel=d.sequence_parallel, recompute=d.recompute)
    # Megatron's train step includes its Adam update (accelerate's optimizer.step() is a
    # no-op under Megatron-LM), so the forecast does too.
    f = analyze_parallel(path, layout, cluster=cluster_for_device(label.device),
                         predictor=pred, optimizer="adam", clip_grad=d.clip_grad,
                         layers=config_layers(label.config), fusion=d.fusion,
                         runtime=label.runtime, math=label.math)
    return f.step_ms


def _summaries(runs: list[Run]) -> tuple[Summary, ...]:
    groups: dict[tuple[str, ...], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.gpu, r.mode, r.variant, r.dtype, r.runtime, r.math)].append(r)
    out = []
    for (gpu, mode, variant, dtype, runtime, math_mode), rs in sorted(groups.items()):
        paper = [r for r in rs if r.paper_error_pct is not None]
        out.append(Summary(
            gpu, mode, variant, len(rs), round(sum(r.error_pct for r in rs) / len(rs), 2),
            round(sum(r.paper_error_pct for r in paper) / len(paper), 2) if paper else None,
            len(paper), dtype, runtime, math_mode))
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
        total_ms = _forecast_ms(label, models_dir, pred, cache, progress)
        err = abs(total_ms - label.measured_ms) / label.measured_ms * 100
        # NeuSight's published errors are for its fp32 eager runs only
        key = (label.gpu, label.model, label.mode, label.batch, label.variant)
        published = paper.get(key) if (label.dtype, label.runtime, label.math) == (
            "float32", "eager", "graph") else None
        runs.append(Run(label.gpu, label.model, label.mode, label.batch, label.seq,
                        label.variant, round(label.measured_ms, 4), round(total_ms, 4),
                        round(err, 2), published, label.dtype, label.runtime, label.math))
    return EvalResult(tuple(runs), _summaries(runs), tuple(skipped), pred.name)
