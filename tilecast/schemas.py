"""JSON Schemas of the files tilecast writes and reads, generated from the dataclasses.

One source of truth: each reader's module builds its schema from the dataclass that writes the
file (``forecast_schema()`` in ``analyzer/forecast_schema.py``, ``baseline_schema()`` in
``gate/baseline.py``, ``device_schema()`` in ``device_db/loader.py``) with :func:`schema_of`,
and validates what it reads with :func:`check`. The copies under ``docs/schemas/`` are for other
tools; a test fails when they drift. Regenerate them with::

    python -m tilecast.schemas --write

Numbers: JSON has no NaN or infinity, so :func:`check` rejects non-finite numbers everywhere
(Python's ``json`` module would otherwise accept ``NaN``); numbers are non-negative unless the
schema says otherwise (``minimum`` is written into every generated numeric schema).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, TilecastError

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "docs" / "schemas"
REGENERATE = "python -m tilecast.schemas --write"
_NONE = type(None)


# ---------------------------------------------------------------------------------------------
# Generation: Python type hints (and a sample value where the JSON flattens a dataclass)
# ---------------------------------------------------------------------------------------------
def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return "null"


def _with_null(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if kind is None:
        return schema
    kinds = kind if isinstance(kind, list) else [kind]
    return {**schema, "type": [*kinds, "null"] if "null" not in kinds else kinds}


def schema_of(hint: Any, sample: Any = None) -> dict[str, Any]:
    """JSON Schema of a value with type ``hint`` (``sample``, when given, is that value as the
    writer serializes it: it decides for dataclasses written in another form, e.g. a Device
    written by name)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not _NONE]
        inner = schema_of(rest[0], sample) if len(rest) == 1 else {
            "type": sorted({schema_of(a)["type"] for a in rest})}
        return _with_null(inner) if _NONE in args else inner
    if sample is not None and hint is not Any and _json_type(sample) != _kind(hint) and not (
            _kind(hint) == "number" and _json_type(sample) == "integer"):
        return schema_of(type(sample), sample)  # e.g. Device -> its name
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer", "minimum": 0}
    if hint is float:
        return {"type": "number", "minimum": 0}
    if hint is str:
        return {"type": "string"}
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        item = args[0] if args else Any
        first = sample[0] if isinstance(sample, (list, tuple)) and sample else None
        return {"type": "array", "items": schema_of(item, first)}
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": schema_of(value)}
    if dataclasses.is_dataclass(hint) and isinstance(sample, Mapping):
        # A nested record as written: its fields without a default are required.
        needed = [f.name for f in dataclasses.fields(hint) if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING]
        return record_schema(hint, sample, required=needed)
    if dataclasses.is_dataclass(hint):
        # No sample shows how it is written (its to_dict may rename or derive keys): an object,
        # unconstrained, rather than a guess that could refuse valid files. Give the reader's
        # sample forecast a value for it to describe it fully.
        return {"type": "object", "description": f"a {hint.__name__}"}
    if sample is not None and hint is Any:
        return schema_of(type(sample), sample)
    return {}  # Any: no constraint


def _kind(hint: Any) -> str:
    if dataclasses.is_dataclass(hint):
        return "object"
    for py, kind in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if hint is py:
            return kind
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list, Sequence):
        return "array"
    if origin in (dict, Mapping):
        return "object"
    return _json_type(None) if hint is _NONE else "any"


def hints_of(*classes: type) -> dict[str, Any]:
    """Field and property type hints of ``classes`` (first class wins on a shared name)."""
    out: dict[str, Any] = {}
    for cls in reversed(classes):
        out.update(typing.get_type_hints(cls))
        for name, attr in vars(cls).items():
            fget = getattr(attr, "fget", None) or getattr(attr, "func", None)
            if fget is not None and "return" in getattr(fget, "__annotations__", {}):
                out[name] = typing.get_type_hints(fget)["return"]
    return out


def record_schema(cls: type, sample: Mapping[str, Any] | None = None, *,
                  hints: Mapping[str, Any] | None = None, required: Sequence[str] = (),
                  extra: bool = True) -> dict[str, Any]:
    """Object schema of a dataclass: its keys are ``sample``'s (what ``to_dict`` writes) or the
    fields', each typed by the hint of the same name in ``hints`` (default: ``cls``'s fields
    and properties). Keys outside ``required`` are optional, so fields added later do not
    invalidate older files of the same schema version."""
    hints = dict(hints or hints_of(cls))
    keys = list(sample) if sample is not None else [f.name for f in dataclasses.fields(cls)]
    props = {k: schema_of(hints.get(k, Any), None if sample is None else sample[k])
             for k in keys}
    return {"type": "object", "properties": props,
            "required": [k for k in required if k in props],
            "additionalProperties": extra}


# ---------------------------------------------------------------------------------------------
# Validation over the generated dicts (the subset of JSON Schema generation emits)
# ---------------------------------------------------------------------------------------------
_ARTICLE = {"number": "a number", "integer": "an integer", "string": "a string",
            "boolean": "true or false", "object": "an object", "array": "a list"}


def _describe(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    kinds = schema.get("type", "any")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    text = " or ".join(_ARTICLE.get(k, k) for k in kinds)
    if "minimum" in schema:
        text += f" >= {schema['minimum']}"
    if "exclusiveMinimum" in schema:
        text += f" > {schema['exclusiveMinimum']}"
    return text


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return _json_type(value) == kind


def _errors(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    """The first violation as "field 'path' must be ..., got ...", else None."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    where = f"field '{path}'" if path else "the top level"
    text = json.dumps(value)[:60] if _json_safe(value) else repr(value)
    got = f"got {type(value).__name__} {text}"
    if kinds is not None and not any(_type_ok(value, k) for k in kinds):
        return f"{where} must be {_describe(schema)}, {got}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value}"
    if isinstance(value, str) and len(value.strip()) < schema.get("minLength", 0):
        return f"{where} must be a non-empty string, {got}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be {_describe(schema)}, {got}"
    if "const" in schema and value != schema["const"]:
        return f"{where} must be {_describe(schema)}, {got}"
    low, above = schema.get("minimum", -math.inf), schema.get("exclusiveMinimum", -math.inf)
    if _json_type(value) in ("integer", "number") and (value < low or value <= above):
        return f"{where} must be {_describe(schema)}, {got}"
    if isinstance(value, Mapping):
        return _object_errors(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            err = _errors(item, schema["items"], f"{path}[{i}]")
            if err:
                return err
    return None


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _object_errors(value: Mapping[str, Any], schema: Mapping[str, Any], path: str) -> str | None:
    props = schema.get("properties", {})
    prefix = f"{path}." if path else ""
    for key in schema.get("required", ()):
        if key not in value:
            return f"field '{prefix}{key}' is missing"
    extra = schema.get("additionalProperties", True)
    names = schema.get("propertyNames", {}).get("enum")
    for key, item in value.items():
        if names is not None and key not in names:
            return f"field '{prefix}{key}' is not one of the allowed names"
        sub = props.get(key, extra if isinstance(extra, Mapping) else None)
        if sub is None and extra is False:
            known = ", ".join(sorted(props))
            return f"field '{prefix}{key}' is not a known field (known: {known})"
        if sub:
            err = _errors(item, sub, f"{prefix}{key}")
            if err:
                return err
    return None


def check(data: Any, schema: Mapping[str, Any], origin: str,
          error: type[TilecastError] = ConfigError) -> None:
    """Raise ``error("<origin>: field 'kernels[3].latency_ms' must be number >= 0, got ...")``
    at the first place ``data`` breaks ``schema``."""
    message = _errors(data, schema, "")
    if message:
        raise error(f"{origin}: {message}")


# ---------------------------------------------------------------------------------------------
# The published files
# ---------------------------------------------------------------------------------------------
def published() -> dict[str, dict[str, Any]]:
    """File name -> schema, for every published schema (imports the readers lazily: this
    module stays importable from any layer)."""
    from .analyzer.forecast_schema import forecast_schema
    from .device_db.schema import device_schema
    from .gate.baseline import baseline_schema

    schemas: list[Callable[[], dict[str, Any]]] = [forecast_schema, baseline_schema, device_schema]
    out = {}
    for make in schemas:
        schema = make()
        out[f"{schema['title']}.v{schema['version']}.schema.json"] = schema
    return out


def render(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """Names of published schema files missing from or different in ``directory``."""
    out = []
    for name, schema in published().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(schema):
            out.append(name)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilecast.schemas",
                                 description="Write or check docs/schemas/*.schema.json.")
    ap.add_argument("--write", action="store_true", help="regenerate the files")
    ap.add_argument("--dir", type=Path, default=SCHEMA_DIR)
    args = ap.parse_args(argv)
    if args.write:
        args.dir.mkdir(parents=True, exist_ok=True)
        for name, schema in published().items():
            (args.dir / name).write_text(render(schema), encoding="utf-8")
            print(f"wrote {args.dir / name}")
        return 0
    bad = stale(args.dir)
    for name in bad:
        print(f"{args.dir / name} is out of date: run {REGENERATE}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
