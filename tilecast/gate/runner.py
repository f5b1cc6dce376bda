"""``tilecast gate``: compare each configured model with its committed baseline, or rewrite the
baselines (``--update-baseline``)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..analyzer.graph import load_model
from ..analyzer.pipeline import analyze, resolve_predictor
from ..analyzer.predictor import Predictor
from ..errors import ConfigError, ExportError, TilecastError
from .api import Side, compare_sides, open_side
from .baseline import baseline_text, load_saved, model_inputs
from .compare import Comparison
from .config import GateConfig, ModelSpec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class GateResult:
    """One comparison per configured model, in configuration order."""

    config: str
    entries: tuple[tuple[str, Comparison], ...]

    @property
    def regressed(self) -> bool:
        return any(c.regressed for _, c in self.entries)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{name}: {w}" for name, c in self.entries for w in c.warnings)


def _export(config: GateConfig, spec: ModelSpec, workdir: Path) -> onnx.ModelProto:
    try:
        from ..exporters import export_model  # torch: only for configs that export
    except ImportError as exc:
        raise ExportError(f"model {spec.name!r} is exported from {spec.export!r}, which needs "
                          f"the export extra: pip install torch==2.13.0 'tilecast[export]' "
                          f"({exc})") from None
    assert spec.export is not None
    local = config.resolve(spec.export)  # a model config file beside the gate config
    source = str(local) if local.is_file() else spec.export
    out = workdir / f"{spec.name}.onnx"
    result = export_model(source, output=out, **spec.export_options)
    if isinstance(result, onnx.ModelProto):
        return result
    return load_model(result if isinstance(result, (str, os.PathLike)) else out)


def _label(spec: ModelSpec) -> str:
    if spec.path is not None:
        return spec.path
    options = ", ".join(f"{k}={v}" for k, v in spec.export_options.items())
    return f"{spec.export} ({options})" if options else str(spec.export)


def _model(config: GateConfig, spec: ModelSpec, workdir: Path) -> onnx.ModelProto:
    if spec.path is not None:
        return load_model(config.resolve(spec.path))
    return _export(config, spec, workdir)


def _gate_model(config: GateConfig, spec: ModelSpec, workdir: Path) -> Comparison:
    path = config.resolve(spec.baseline)
    if not path.is_file():
        raise ConfigError(f"no baseline at {spec.baseline}: create it with `tilecast gate "
                          "--update-baseline` and commit it")
    saved = load_saved(path)
    base = Side(spec.baseline, saved=saved, inputs=saved.inputs)
    new = open_side(_model(config, spec, workdir), _label(spec))
    return compare_sides(base, new, spec.devices, mode=spec.mode, threshold=spec.threshold,
                         fusion=spec.fusion, dims=spec.dims, predictor=config.predictor,
                         optimizer=spec.optimizer, top=config.top, math=spec.math,
                         runtime=spec.runtime, memory_format=spec.memory_format)


def _in_model(name: str, exc: TilecastError) -> TilecastError:
    return type(exc)(f"model {name!r}: {exc}")


def run_gate(config: GateConfig, progress: Progress | None = None) -> GateResult:
    """Compare every configured model with its baseline."""
    entries = []
    with tempfile.TemporaryDirectory(prefix="tilecast-gate-") as tmp:
        for spec in config.models:
            if progress:
                progress(f"gate: {spec.name} on {', '.join(d.name for d in spec.devices)}")
            try:
                entries.append((spec.name, _gate_model(config, spec, Path(tmp))))
            except TilecastError as exc:
                raise _in_model(spec.name, exc) from None
    return GateResult(str(config.source), tuple(entries))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        # mkstemp makes the file private; a baseline is meant to be committed and shared.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _baseline(config: GateConfig, spec: ModelSpec, workdir: Path,
              predictor: Predictor) -> str:
    model, label = _model(config, spec, workdir), _label(spec)
    forecasts = [dataclasses.replace(
        analyze(model, dev, mode=spec.mode, fusion=spec.fusion, dims=spec.dims or None,
                predictor=predictor, optimizer=spec.optimizer, math=spec.math,
                runtime=spec.runtime, memory_format=spec.memory_format), model=label)
        for dev in spec.devices]
    return baseline_text(forecasts, label, model_inputs(model))


def update_baselines(config: GateConfig, progress: Progress | None = None) -> tuple[Path, ...]:
    """Forecast every configured model and (re)write its baseline file."""
    predictor = resolve_predictor(config.predictor)
    written = []
    with tempfile.TemporaryDirectory(prefix="tilecast-gate-") as tmp:
        for spec in config.models:
            if progress:
                progress(f"baseline: {spec.name} on {', '.join(d.name for d in spec.devices)}")
            try:
                text = _baseline(config, spec, Path(tmp), predictor)
            except TilecastError as exc:
                raise _in_model(spec.name, exc) from None
            path = config.resolve(spec.baseline)
            _write(path, text)
            written.append(path)
    return tuple(written)
