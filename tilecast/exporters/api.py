"""``export_model``: the one call behind ``tilecast export`` (zoo name or config -> .onnx)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError
from .hf import check_options, load_config
from .zoo import ZooEntry, zoo_entry

Progress = Callable[[str], None]
# Image models built in plain torch by this package (model_type -> module of exporters/).
IMAGE_TYPES = {"tilecast-resnet": "resnet", "tilecast-mobilenetv3": "mobilenet"}


@dataclass(frozen=True)
class ExportResult:
    """What was written: the file, the resolved model and its graph's size."""

    path: Path
    source: str  # zoo name or config path
    architecture: str
    task: str
    dtype: str
    attn: str
    inputs: Mapping[str, tuple[int, ...]]
    nodes: int
    op_counts: Mapping[str, int]
    parameters: int  # elements of the weight placeholders (never materialized)
    file_bytes: int
    seconds: float

    def summary(self) -> str:
        """One line for humans, e.g. for the CLI."""
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.inputs.items())
        return (f"wrote {self.path} ({self.file_bytes / 1e6:.1f} MB): {self.architecture} "
                f"{self.task} {self.dtype} attn={self.attn}, {shapes}; {self.nodes} nodes, "
                f"{self.parameters / 1e9:.2f}B parameters (not materialized), "
                f"{self.seconds:.1f} s")


@dataclass(frozen=True)
class _Source:
    label: str
    config: dict[str, Any]
    entry: ZooEntry | None


@dataclass(frozen=True)
class BuiltModel:
    """A zoo model or config built at one shape: what ``export_model`` traces and
    ``tilecast collect-labels`` runs."""

    module: Any
    inputs: Mapping[str, Any]
    task: str  # resolved
    batch: int
    seq: int | None  # None for image models
    source: str  # zoo name or config path, as given
    name: str  # zoo name or config file stem
    config: Mapping[str, Any]
    image: bool  # a tilecast image model (no transformer depth keys)


def build_module(name_or_config: str | Path | Mapping[str, Any], *, batch: int | None = None,
                 seq: int | None = None, task: str = "auto", dtype: str = "float32",
                 attn: str = "eager", layers: int | None = None, device: str = "meta",
                 progress: Progress | None = None) -> BuiltModel:
    """Resolve, validate and build a zoo model or config on ``device`` (meta: shapes only,
    nothing allocated; a real device: random weights) with its example inputs there."""
    check_options(batch=batch, seq=seq, task=task, dtype=dtype, attn=attn, layers=layers)
    source = _resolve(name_or_config)
    batch, seq, task = _defaults(source, batch, seq, task)
    if progress:
        progress(f"building {source.label} ({task}, {dtype}) on the {device} device")
    module, inputs, task = _build(source, batch=batch, seq=seq, task=task, dtype=dtype,
                                  attn=attn, layers=layers, device=device)
    return BuiltModel(module, inputs, task, batch, seq, source.label,
                      default_output(source).stem, source.config, _is_image(source.config))


def export_model(name_or_config: str | Path | Mapping[str, Any], *, batch: int | None = None,
                 seq: int | None = None, task: str = "auto", dtype: str = "float32",
                 attn: str = "eager", layers: int | None = None,
                 output: str | Path | None = None, progress: Progress | None = None,
                 train_mode: bool = False) -> ExportResult:
    """Export a zoo model (by name) or a Hugging Face config (path or dict) to ``output``.

    ``batch``/``seq`` default to the zoo entry's; a config file needs them (image models
    ignore ``seq``). ``output`` defaults to ``<name>.onnx`` in the current folder. The file
    is written atomically: on any failure no output is left. Bad input raises ExportError
    with one clear message; ``progress`` is called with a short phase description.
    ``train_mode`` traces in training mode (Dropout nodes kept) for training forecasts.
    """
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    built = build_module(name_or_config, batch=batch, seq=seq, task=task, dtype=dtype,
                         attn=attn, layers=layers, progress=say)
    module, inputs, task = built.module, dict(built.inputs), built.task
    say("tracing with torch.export and converting to ONNX")
    from ._graph import finalize, write_atomic
    from .torch_export import export_program

    program = export_program(module, inputs, train_mode=train_mode)
    say("folding shape arithmetic and inferring shapes")
    proto = finalize(program.model)
    path = Path(output) if output is not None else Path(f"{built.name}.onnx")
    say(f"writing {path}")
    data = proto.SerializeToString()
    path = write_atomic(data, path)
    return ExportResult(
        path, built.source, type(module).__name__, task, dtype, attn,
        {k: tuple(v.shape) for k, v in inputs.items()}, len(proto.graph.node),
        dict(Counter(n.op_type for n in proto.graph.node).most_common()),
        _parameters(proto), len(data), round(time.perf_counter() - started, 2))


def default_output(source: _Source) -> Path:
    """``<zoo name>.onnx`` or ``<config file stem>.onnx`` in the current folder."""
    if source.entry is not None:
        return Path(f"{source.entry.name}.onnx")
    stem = Path(source.label).stem if source.label.endswith(".json") else "model"
    return Path(f"{stem}.onnx")


def timed_progress(echo: Callable[[str], None]) -> Progress:
    """A ``progress`` callback that prefixes each phase with the elapsed seconds."""
    start = time.perf_counter()
    return lambda msg: echo(f"[{time.perf_counter() - start:5.1f} s] {msg}")


def _resolve(name_or_config: str | Path | Mapping[str, Any]) -> _Source:
    if isinstance(name_or_config, Mapping):
        return _Source("<config dict>", dict(name_or_config), None)
    text = str(name_or_config)
    path = Path(text)
    if path.suffix.lower() == ".json" or path.is_file() or "/" in text:
        return _Source(text, load_config(path), None)
    entry = zoo_entry(text)
    return _Source(entry.name, entry.config(), entry)


def _defaults(source: _Source, batch: int | None, seq: int | None, task: str,
              ) -> tuple[int, int | None, str]:
    entry = source.entry
    if entry is not None:
        return batch or entry.batch, seq or entry.seq, entry.task if task == "auto" else task
    if batch is None:
        raise ExportError(f"batch is required for a config file ({source.label})")
    if seq is None and not _is_image(source.config):
        raise ExportError(f"seq is required for a text model config ({source.label})")
    return batch, seq, task


def _is_image(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") in IMAGE_TYPES or "image_size" in config


def _build(source: _Source, *, batch: int, seq: int | None, task: str, dtype: str, attn: str,
           layers: int | None, device: str = "meta") -> tuple[Any, dict[str, Any], str]:
    """(module, example inputs, resolved task) for a HF config or a tilecast image model
    (``IMAGE_TYPES``), on the meta device (exporting) or a real one (``collect.labels``)."""
    image = IMAGE_TYPES.get(source.config.get("model_type", ""))
    if image is not None:
        if task not in ("auto", "image-classification"):
            raise ExportError(f"task {task!r} is not supported by {source.label}; "
                              f"supported: image-classification")
        from .torch_export import require_torch

        require_torch()
        import importlib

        builder = importlib.import_module(f".{image}", __package__)
        module, inputs = builder.build(source.config, dtype=dtype, batch=batch, layers=layers,
                                       device=device)
        return module, inputs, "image-classification"
    from .hf import prepare

    prepared = prepare(source.config, batch=batch, seq=seq or 1, task=task, dtype=dtype,
                       attn=attn, layers=layers, device=device)
    return prepared.module, dict(prepared.inputs), prepared.task


def _parameters(proto: Any) -> int:
    """Elements held by the weight placeholders (a shared weight's alias counted once)."""
    total, seen = 0, set()
    for init in proto.graph.initializer:
        key = tuple((e.key, e.value) for e in init.external_data)
        if init.data_location == 1 and key not in seen:  # 1 = TensorProto.EXTERNAL
            seen.add(key)
            n = 1
            for d in init.dims:
                n *= d
            total += n
    return total
