"""Saved forecasts: one forecast JSON (``tilecast analyze --format json``), a JSON list of them,
or a baseline file written by ``tilecast gate --update-baseline``::

    {"schema": 1, "kind": "tilecast-baseline", "tilecast_version": "0.1.0",
     "model": "models/encoder.onnx",
     "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [8, 128]}],
     "forecasts": [<forecast schema 1>, ...]}

one forecast per (device, mode). ``inputs`` lets a later comparison warn when the model's
inputs changed. Baselines are written one kernel per line, so that git diffs stay readable.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from .. import __version__
from ..analyzer.forecast import SCHEMA_VERSION, Forecast
from ..analyzer.forecast_schema import forecast_schema
from ..analyzer.types import DTYPES
from ..errors import ConfigError

BASELINE_KIND = "tilecast-baseline"


@dataclass(frozen=True)
class InputSpec:
    """One graph input: symbolic dims stay strings."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape)}

    def __str__(self) -> str:
        shape = "?" if self.shape is None else "[" + ", ".join(map(str, self.shape)) + "]"
        return f"{self.name} {self.dtype} {shape}"


def model_inputs(model: onnx.ModelProto) -> tuple[InputSpec, ...]:
    """The inputs a caller feeds (graph inputs that are not initializers)."""
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in weights:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in tt.shape.dim) if tt.HasField("shape") else None
        specs.append(InputSpec(vi.name, DTYPES.get(tt.elem_type, ("unknown", 0))[0], dims))
    return tuple(specs)


@dataclass(frozen=True)
class Saved:
    """Forecasts read from one file, keyed by (device name, mode)."""

    origin: str
    forecasts: Mapping[tuple[str, str], Forecast]
    inputs: tuple[InputSpec, ...] | None = None
    tilecast_version: str | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for d, _ in self.forecasts))


def _inputs_from(data: Any, origin: str) -> tuple[InputSpec, ...] | None:
    if data is None:
        return None
    try:
        return tuple(InputSpec(str(i["name"]), str(i["dtype"]),
                               None if i["shape"] is None else tuple(i["shape"])) for i in data)
    except (TypeError, KeyError) as exc:
        raise ConfigError(f"{origin}: field 'inputs' must be a list of "
                          f"{{name, dtype, shape}} objects ({exc})") from None


def saved_from_data(data: Any, origin: str) -> Saved:
    """Accept a forecast object, a list of them, or a baseline object."""
    inputs, version = None, None
    if isinstance(data, Mapping) and "forecasts" in data:
        if data.get("schema") != SCHEMA_VERSION or isinstance(data.get("schema"), bool):
            found = "no 'schema' field" if "schema" not in data else f"schema {data['schema']!r}"
            raise ConfigError(f"{origin}: found baseline {found}; tilecast {__version__} reads "
                              f"schema {SCHEMA_VERSION} (re-create it: tilecast gate "
                              "--update-baseline)")
        from ..schemas import check

        check(data, baseline_schema(), origin)
        items, inputs = data["forecasts"], _inputs_from(data.get("inputs"), origin)
        version = data.get("tilecast_version")
    elif isinstance(data, Mapping):
        items, version = [data], data.get("tilecast_version")
    else:
        items = data
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{origin}: expected a forecast, a list of forecasts or a baseline "
                          "with a non-empty 'forecasts' list")
    forecasts: dict[tuple[str, str], Forecast] = {}
    for i, item in enumerate(items):
        where = origin if len(items) == 1 else f"{origin}: forecasts[{i}]"
        f = Forecast.from_dict(item, origin=where)
        key = (f.device.name, f.mode)
        if key in forecasts:
            raise ConfigError(f"{where}: a second {f.mode} forecast for {f.device.name}")
        forecasts[key] = f
        version = version or (item.get("tilecast_version") if isinstance(item, Mapping) else None)
    return Saved(origin, forecasts, inputs, version)


def load_saved(path: str | os.PathLike[str]) -> Saved:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return saved_from_data(data, str(path))


def is_json_file(path: str | os.PathLike[str]) -> bool:
    """A forecast/baseline JSON rather than an ONNX protobuf (which never starts with { or [).
    A ``.json`` name counts as JSON whatever it holds, so an empty or truncated saved forecast
    is reported as one, not parsed as a model."""
    if str(path).lower().endswith(".json"):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return str(path).endswith(".json")
    return head[:1] in (b"{", b"[")


def baseline_text(forecasts: Sequence[Forecast], model: str,
                  inputs: Sequence[InputSpec] | None) -> str:
    """The baseline file: byte-identical for the same forecasts, one kernel per line."""
    lines = ["{", f'  "schema": {SCHEMA_VERSION},', f'  "kind": "{BASELINE_KIND}",',
             f'  "tilecast_version": {json.dumps(__version__)},',
             f'  "model": {json.dumps(model)},',
             '  "inputs": ' + (json.dumps([i.to_dict() for i in inputs])
                               if inputs is not None else "null") + ",",
             '  "forecasts": [']
    for n, f in enumerate(forecasts):
        data = f.to_dict()
        kernels = data.pop("kernels")
        head = json.dumps(data, ensure_ascii=False)[:-1]  # reopen the object for "kernels"
        body = ",\n".join(f"      {json.dumps(k, ensure_ascii=False)}" for k in kernels)
        end = "," if n < len(forecasts) - 1 else ""
        lines.append(f'    {head}, "kernels": [\n{body}\n    ]}}{end}')
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def baseline_schema() -> dict[str, Any]:
    """JSON Schema of a baseline file (``baseline_text``), generated from :class:`InputSpec`
    and the forecast schema."""
    from ..schemas import DRAFT, record_schema

    forecast = {k: v for k, v in forecast_schema().items()
                if k not in ("$schema", "$id", "title", "version", "description")}
    return {
        "$schema": DRAFT, "$id": f"urn:tilecast:baseline:v{SCHEMA_VERSION}",
        "title": "baseline", "version": SCHEMA_VERSION,
        "description": "tilecast gate --update-baseline; generated by `python -m "
                       "tilecast.schemas --write` from gate/baseline.py",
        "type": "object",
        "properties": {
            "schema": {"const": SCHEMA_VERSION}, "kind": {"const": BASELINE_KIND},
            "tilecast_version": {"type": "string"}, "model": {"type": "string"},
            "inputs": {"type": ["array", "null"],
                       "items": record_schema(InputSpec, required=("name", "dtype", "shape"))},
            "forecasts": {"type": "array", "items": forecast},
        },
        "required": ["schema", "kind", "forecasts"], "additionalProperties": True,
    }
