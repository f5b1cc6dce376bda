"""The gate's configuration: ``tilecast.toml``, or a ``[tool.tilecast]`` table in
``pyproject.toml``, checked into the user's repository. See docs/ci-gate.md.

Every error names the file and the key (``tilecast.toml: models[1].threshold: ...``).
Relative paths are relative to the configuration file's directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyzer.mathmode import MATH_MODES
from ..analyzer.pipeline import MODES
from ..analyzer.runtime import MEMORY_FORMATS, RUNTIMES
from ..analyzer.training import OPTIMIZERS
from ..device_db import Device, load_device
from ..errors import ConfigError, DeviceError
from .threshold import Threshold, parse_threshold

CONFIG_NAMES = ("tilecast.toml", "pyproject.toml")
DEFAULT_BASELINE_DIR = ".tilecast"
# Keys a model and the top level share; a model's value overrides the top level's.
SHARED_KEYS = ("devices", "mode", "threshold", "fusion", "optimizer", "dims", "math", "runtime",
               "memory_format")
TOP_KEYS = frozenset({*SHARED_KEYS, "models", "predictor", "baseline_dir", "top"})
EXPORT_KEYS: dict[str, type] = {"batch": int, "seq": int, "task": str, "dtype": str,
                                "attn": str, "layers": int}
MODEL_KEYS = frozenset({*SHARED_KEYS, *EXPORT_KEYS, "name", "path", "export", "baseline"})


@dataclass(frozen=True)
class ModelSpec:
    """One gated model: an ONNX ``path``, or an ``export`` (zoo name or model config) with
    ``export_options`` for ``tilecast.exporters.export_model``."""

    name: str
    baseline: str  # as written in the config (relative to the config's directory)
    devices: tuple[Device, ...]
    threshold: Threshold
    mode: str = "inference"
    path: str | None = None
    export: str | None = None
    export_options: Mapping[str, Any] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    fusion: bool = False
    optimizer: str = "none"
    math: str = "graph"
    runtime: str = "eager"
    memory_format: str = "nchw"


@dataclass(frozen=True)
class GateConfig:
    source: Path  # the configuration file
    models: tuple[ModelSpec, ...]
    predictor: str | None = None  # None: follow the baseline (see tilecast.compare)
    top: int = 10

    @property
    def root(self) -> Path:
        return self.source.parent

    def resolve(self, relative: str) -> Path:
        return self.root / relative


def find_config(cwd: str | os.PathLike[str] = ".") -> Path:
    """``tilecast.toml`` in ``cwd``, else ``pyproject.toml`` when it has ``[tool.tilecast]``."""
    here = Path(cwd)
    if (here / "tilecast.toml").is_file():
        return here / "tilecast.toml"
    pyproject = here / "pyproject.toml"
    if pyproject.is_file() and "tilecast" in _read_toml(pyproject).get("tool", {}):
        return pyproject
    raise ConfigError(f"no tilecast.toml, nor a [tool.tilecast] table in pyproject.toml, in "
                      f"{here.resolve()} (pass --config FILE; see docs/ci-gate.md)")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def load_config(path: str | os.PathLike[str] | None = None) -> GateConfig:
    """Read and validate the gate configuration (``None``: :func:`find_config` in the cwd)."""
    source = Path(path) if path is not None else find_config()
    doc = _read_toml(source)
    origin = source.name
    if source.name == "pyproject.toml":
        doc, origin = doc.get("tool", {}).get("tilecast"), f"{source.name} [tool.tilecast]"
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: no [tool.tilecast] table")
    return _parse(doc, source, origin)


class _Table:
    """A TOML table being validated: typed getters that name ``origin`` and the key."""

    def __init__(self, data: Mapping[str, Any], origin: str, where: str,
                 known: frozenset[str]) -> None:
        self.data, self.origin, self.where = data, origin, where
        for key in data:
            if key not in known:
                raise self.error(key, f"unknown key (known: {', '.join(sorted(known))})")

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.origin}: {self.where}{key}: {message}")

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.data.get(key, default)
        if value is not None and (not isinstance(value, kind) or
                                  (kind is int and isinstance(value, bool))):
            raise self.error(key, f"must be {_KIND_NAMES[kind]}, got {value!r}")
        return value

    def require(self, key: str, kind: type) -> Any:
        if key not in self.data:
            raise self.error(key, "is missing")
        return self.get(key, kind)


_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list",
               dict: "a table"}


def _parse(doc: Mapping[str, Any], source: Path, origin: str) -> GateConfig:
    top = _Table(doc, origin, "", TOP_KEYS)
    models = top.require("models", list)
    if not models:
        raise top.error("models", "must list at least one model ([[models]] tables)")
    count = top.get("top", int, 10)
    if count < 0:
        raise top.error("top", f"must be >= 0, got {count}")
    baseline_dir = top.get("baseline_dir", str, DEFAULT_BASELINE_DIR)
    specs = tuple(_model(m, i, top, baseline_dir) for i, m in enumerate(models))
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{origin}: models: two models are named {name!r} (set 'name')")
    return GateConfig(source, specs, top.get("predictor", str), count)


def _model(data: Any, i: int, top: _Table, baseline_dir: str) -> ModelSpec:
    if not isinstance(data, Mapping):
        raise top.error(f"models[{i}]", "must be a table ([[models]])")
    t = _Table(data, top.origin, f"models[{i}].", MODEL_KEYS)
    path, export = t.get("path", str), t.get("export", str)
    if (path is None) == (export is None):
        raise t.error("path", "give exactly one of 'path' (an ONNX file) or 'export' (a zoo "
                              "name or model config)")
    options = {k: t.get(k, kind) for k, kind in EXPORT_KEYS.items() if k in data}
    if options and export is None:
        raise t.error(next(iter(options)), "only applies to 'export' models")
    name = t.get("name", str) or Path(path or export or "").stem
    return ModelSpec(
        name=name, baseline=t.get("baseline", str) or f"{baseline_dir}/{name}.json",
        devices=_devices(t if "devices" in data else top),
        threshold=_threshold(t if "threshold" in data else top),
        mode=_choice(t if "mode" in data else top, "mode", MODES),
        path=path, export=export, export_options=options,
        dims=_dims(t if "dims" in data else top),
        fusion=bool((t if "fusion" in data else top).get("fusion", bool, False)),
        optimizer=_choice(t if "optimizer" in data else top, "optimizer", OPTIMIZERS),
        math=_choice(t if "math" in data else top, "math", MATH_MODES),
        runtime=_choice(t if "runtime" in data else top, "runtime", RUNTIMES),
        memory_format=_choice(t if "memory_format" in data else top, "memory_format",
                              MEMORY_FORMATS),
    )


def _devices(t: _Table) -> tuple[Device, ...]:
    names = t.require("devices", list)
    if not names:
        raise t.error("devices", "must name at least one device")
    out = []
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise t.error(f"devices[{i}]", f"must be a device name, got {name!r}")
        try:
            out.append(load_device(name))
        except DeviceError as exc:
            raise DeviceError(f"{t.origin}: {t.where}devices[{i}]: {exc}") from None
    return tuple(out)


def _threshold(t: _Table) -> Threshold:
    try:
        return parse_threshold(t.data.get("threshold", "5%"))
    except ConfigError as exc:
        raise t.error("threshold", str(exc)) from None


def _choice(t: _Table, key: str, allowed: tuple[str, ...]) -> str:
    value = t.get(key, str, allowed[0])
    if value not in allowed:
        raise t.error(key, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _dims(t: _Table) -> dict[str, int]:
    dims = t.get("dims", dict, {})
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise t.error(f"dims.{name}", f"must be a positive integer, got {value!r}")
    return dict(dims)
