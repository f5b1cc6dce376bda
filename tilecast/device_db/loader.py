"""Load and validate device descriptions.

Three ways in: a :class:`Device` (returned as is), a path to a JSON file (the tilecast schema of
``gpus/*.json`` or the older NeuSight format), or a name resolved against the shipped database's
names and aliases. Every JSON is validated where it is read; errors name the file and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import DeviceError
from .device import ARCHS, GENERIC_ARCH, MEMORY_TYPES, Device, Interconnect

GPUS_DIR = Path(__file__).with_name("gpus")
VENDORS = ("nvidia", "amd", "cpu")  # cpu: `tilecast collect --device cpu` test runs
# ONNX element types by their lower-case names (onnx.TensorProto.DataType, FLOAT as "float32").
ONNX_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
    "float8e5m2fnuz", "float4e2m1", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "bool", "complex64", "complex128",
})
# Per-launch overhead for files that carry none (NeuSight JSON); see docs/devices.md.
DEFAULT_LAUNCH_OVERHEAD_US = 5.0
DEFAULT_LAUNCH_SOURCE = "tilecast default (the file gives no launch overhead; see docs/devices.md)"

_NAME_SEPARATORS = re.compile(r"[\s_\-]+")
_NUMERIC_KINDS = ("int", "float", "opt_int", "opt_float")
_REQUIRED_IN_JSON = {"sources"}  # has a default in Device, but every file must say its sources
DEVICE_SCHEMA_VERSION = 1  # an optional top-level "schema" key; absent means 1
_OLD_ARCH_NAMES = {"unknown": GENERIC_ARCH}  # before 0.1.0's schemas: migrated on read


# ---------------------------------------------------------------------------------------------
# Schema, derived from the dataclasses so that a new field cannot be forgotten here.
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Field:
    path: str  # dotted: "interconnect.pcie_gen"
    kind: str  # int | float | opt_int | opt_float | str | str_list | interconnect | sources
    required: bool


def _kind_of(hint: Any) -> str:
    if hint in (int, float, str):
        return hint.__name__
    args = typing.get_args(hint)
    if type(None) in args:
        base = next(a for a in args if a is not type(None))
        return f"opt_{base.__name__}"
    if typing.get_origin(hint) is tuple:
        return "str_list"
    if hint is Interconnect:
        return "interconnect"
    if typing.get_origin(hint) is Mapping:
        return "sources"
    raise TypeError(f"no JSON kind for type {hint!r}")  # a new Device field needs a kind


def _fields_of(cls: type, prefix: str = "") -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "source_file":  # set by the loader, never read from JSON
            continue
        required = f.name in _REQUIRED_IN_JSON or (
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        out.append(_Field(prefix + f.name, _kind_of(hints[f.name]), required))
    return tuple(out)


DEVICE_FIELDS = _fields_of(Device)
INTERCONNECT_FIELDS = _fields_of(Interconnect, "interconnect.")
NUMERIC_FIELDS = tuple(
    f.path for f in DEVICE_FIELDS + INTERCONNECT_FIELDS if f.kind in _NUMERIC_KINDS
)
# Fields that need a source when set: every number, and the facts read from a datasheet.
SOURCED_FIELDS = (*NUMERIC_FIELDS, "memory_type")


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------
def _error(origin: str, path: str, message: str) -> DeviceError:
    return DeviceError(f"device JSON {origin}: field '{path}' {message}")


def _check_keys(obj: Mapping[str, Any], fields: Iterable[_Field], prefix: str, origin: str) -> None:
    known = {f.path[len(prefix):] for f in fields}
    for key in obj:
        if key not in known:
            listing = ", ".join(sorted(known))
            raise _error(origin, prefix + key, f"is not a known field (known: {listing})")


def _check_number(value: Any, kind: str, path: str, origin: str) -> int | float | None:
    if value is None and kind.startswith("opt_"):
        return None
    want_int = kind.endswith("int")
    ok_type = isinstance(value, int) if want_int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        what = "an integer" if want_int else "a number"
        raise _error(origin, path, f"must be {what}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _error(origin, path, f"must be a positive number, got {value!r}")
    return int(value) if want_int else float(value)


def _check_value(field: _Field, value: Any, origin: str) -> Any:
    if field.kind in _NUMERIC_KINDS:
        return _check_number(value, field.kind, field.path, origin)
    if field.kind == "opt_str" and value is None:
        return None
    if field.kind in ("str", "opt_str"):
        if not isinstance(value, str) or not value.strip():
            raise _error(origin, field.path, f"must be a non-empty string, got {value!r}")
        return value
    if field.kind == "str_list":
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise _error(origin, field.path, f"must be a list of non-empty strings, got {value!r}")
        return tuple(value)
    return value  # interconnect / sources: checked by their own functions


def _check_object(obj: Any, fields: tuple[_Field, ...], prefix: str, origin: str) -> dict:
    if not isinstance(obj, Mapping):
        where = f"field '{prefix.rstrip('.')}'" if prefix else "the top level"
        raise DeviceError(f"device JSON {origin}: {where} must be a JSON object")
    _check_keys(obj, fields, prefix, origin)
    out = {}
    for field in fields:
        name = field.path[len(prefix):]
        if name not in obj:
            if field.required:
                raise _error(origin, field.path, "is missing")
            continue
        out[name] = _check_value(field, obj[name], origin)
    return out


def _check_sources(sources: Any, values: Mapping[str, Any], origin: str) -> dict[str, str]:
    """Every numeric value (and memory_type) needs a source; every source must name one."""
    if not isinstance(sources, Mapping):
        raise _error(origin, "sources", "must be an object mapping field names to sources")
    for key, text in sources.items():
        if key not in SOURCED_FIELDS:
            raise _error(origin, f"sources.{key}", "is not a numeric field or memory_type")
        if not isinstance(text, str) or not text.strip():
            raise _error(origin, f"sources.{key}", f"must be a non-empty string, got {text!r}")
    for path in SOURCED_FIELDS:
        if values.get(path) is not None and path not in sources:
            raise _error(origin, path, "has no entry in 'sources' (say where it comes from)")
    return dict(sources)


def _check_enums(values: Mapping[str, Any], origin: str) -> None:
    if values["vendor"] not in VENDORS:
        allowed = ", ".join(VENDORS)
        raise _error(origin, "vendor", f"must be one of {allowed}, got {values['vendor']!r}")
    if values["arch"] not in ARCHS:
        raise _error(origin, "arch", f"must be one of {', '.join(ARCHS)}, got "
                     f"{values['arch']!r} ('generic' for another GPU: see docs/devices.md)")
    memory = values.get("memory_type")
    if memory is not None and memory not in MEMORY_TYPES:
        raise _error(origin, "memory_type", f"must be one of {', '.join(MEMORY_TYPES)}, got "
                     f"{memory!r}")
    for dtype in values.get("supported_dtypes", ()):
        if dtype not in ONNX_DTYPES:
            raise _error(origin, "supported_dtypes", f"has {dtype!r}, not an ONNX dtype name "
                         "(e.g. float32, float16, bfloat16, float8e4m3fn, int8)")


_FRACTION_FIELDS = ("fp32_issue_share", "matrix_sustained_fraction", "fp32_sustained_fraction")


def _check_physical(values: Mapping[str, Any], origin: str) -> None:
    for name in _FRACTION_FIELDS:
        if values.get(name) is not None and values[name] > 1:
            raise _error(origin, name, f"is a fraction and must be <= 1, got {values[name]!r}")
    base = values.get("base_clock_mhz")
    if base is not None and base > values["boost_clock_mhz"]:
        raise _error(origin, "base_clock_mhz", f"({base}) must not exceed boost_clock_mhz "
                     f"({values['boost_clock_mhz']})")


def parse_device(obj: Any, origin: str = "<dict>") -> Device:
    """Validate a tilecast-schema mapping (as read from JSON) and build the :class:`Device`."""
    obj = _migrate(obj, origin)
    values = _check_object(obj, DEVICE_FIELDS, "", origin)
    link = _check_object(
        values.get("interconnect", {}), INTERCONNECT_FIELDS, "interconnect.", origin
    )
    flat = {**values, **{f"interconnect.{k}": v for k, v in link.items()}}
    values["sources"] = _check_sources(values["sources"], flat, origin)
    _check_enums(values, origin)
    _check_physical(values, origin)
    from ..schemas import check  # last, the published schema itself (same field table)
    from .schema import device_schema

    check(obj, device_schema(), f"device JSON {origin}", DeviceError)
    values["interconnect"] = Interconnect(**link)
    return Device(**values, source_file=origin)


def _migrate(obj: Any, origin: str) -> Any:
    """Drop the optional ``schema`` key (refusing other versions) and rename old arch values."""
    if not isinstance(obj, Mapping):
        return obj
    obj = dict(obj)
    version = obj.pop("schema", DEVICE_SCHEMA_VERSION)
    if version != DEVICE_SCHEMA_VERSION or isinstance(version, bool):
        raise _error(origin, "schema", f"is {version!r}; this tilecast reads device schema "
                     f"{DEVICE_SCHEMA_VERSION} (docs/schemas/device.v1.schema.json)")
    if isinstance(obj.get("arch"), str) and obj["arch"] in _OLD_ARCH_NAMES:
        obj["arch"] = _OLD_ARCH_NAMES[obj["arch"]]
    return obj


# ---------------------------------------------------------------------------------------------
# The older NeuSight format (ASPLOS'25 artifact): Device, Dev_Mem, Mem_Bw, Num_Sm, ...
# ---------------------------------------------------------------------------------------------
_LEGACY_FIELDS = {  # NeuSight key -> (tilecast field, scale to tilecast units)
    "Dev_Mem": ("memory_gb", 1.0),
    "Mem_Bw": ("mem_bandwidth_gbps", 1.0),
    "Num_Sm": ("sm_count", 1.0),
    "Core_Per_SM": ("cores_per_sm", 1.0),
    "Freq": ("boost_clock_mhz", 1.0),
    "L2Cache": ("l2_cache_mb", 1.0),
    "SingleFLOPs": ("peak_tflops_fp32", 1e-3),  # GFLOP/s -> TFLOP/s
    "SingleFLOPsVEC": ("peak_tflops_fp32", 1e-3),
    "SingleFLOPsMM": ("peak_tflops_fp32_matrix", 1e-3),
}
_LEGACY_REQUIRED = ("Device", "Dev_Mem", "Mem_Bw", "Num_Sm", "Core_Per_SM", "Freq", "L2Cache")


def is_legacy(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "Device" in obj and "Num_Sm" in obj


def _vendor_from_name(name: str, origin: str) -> str:
    words = set(_normalize(name).split())
    if words & {"amd", "instinct", "radeon"}:
        return "amd"
    if words & {"nvidia", "tesla", "geforce", "quadro"}:
        return "nvidia"
    raise _error(origin, "Device", f"{name!r}: cannot tell the vendor (no NVIDIA/Tesla/AMD in it)")


def _legacy_number(obj: Mapping[str, Any], key: str, origin: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(origin, key, f"must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _error(origin, key, f"must be a positive number, got {value!r}")
    return float(value)


def _from_legacy(obj: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Convert a NeuSight mapping to the tilecast schema (checked again by parse_device)."""
    for key in obj:
        if key != "Device" and key not in _LEGACY_FIELDS:
            raise _error(origin, key, "is not a NeuSight device field")
    missing = [k for k in _LEGACY_REQUIRED if k not in obj]
    if not ("SingleFLOPs" in obj or "SingleFLOPsVEC" in obj):
        missing.append("SingleFLOPs")
    if missing:
        raise _error(origin, missing[0], "is missing (NeuSight format)")
    name = obj["Device"]
    if not isinstance(name, str) or not name.strip():
        raise _error(origin, "Device", f"must be a non-empty string, got {name!r}")
    out: dict[str, Any] = {
        "name": name, "vendor": _vendor_from_name(name, origin), "arch": _known_arch(name),
        "launch_overhead_us": DEFAULT_LAUNCH_OVERHEAD_US,
    }
    sources = {"launch_overhead_us": DEFAULT_LAUNCH_SOURCE}
    for key, (field, scale) in _LEGACY_FIELDS.items():
        if key in obj:
            value = _legacy_number(obj, key, origin) * scale
            out[field] = round(value) if field in ("sm_count", "cores_per_sm") else value
            sources[field] = f"NeuSight device JSON {origin} ('{key}')"
    out["sources"] = sources
    return out


def _known_arch(name: str) -> str:
    """Architecture of the shipped device of that name, else "generic"."""
    device = _database().index.get(_normalize(name))
    return device.arch if device else GENERIC_ARCH


# ---------------------------------------------------------------------------------------------
# Files and the shipped database
# ---------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeviceError(f"device JSON {path}: cannot read it ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DeviceError(
            f"device JSON {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc


def load_device_file(path: str | Path) -> Device:
    """Load one device JSON (tilecast schema or NeuSight format)."""
    path = Path(path)
    obj = _read_json(path)
    if is_legacy(obj):
        obj = _from_legacy(obj, str(path))
    return parse_device(obj, str(path))


def _normalize(name: str) -> str:
    """Case-insensitive key in which spaces, underscores and hyphens are interchangeable."""
    return _NAME_SEPARATORS.sub(" ", name.strip().lower()).strip()


@dataclasses.dataclass(frozen=True)
class _Database:
    devices: tuple[Device, ...]  # sorted by vendor, then name
    index: Mapping[str, Device]  # normalized name or alias -> device


def build_index(devices: Iterable[Device]) -> dict[str, Device]:
    """Normalized names and aliases -> device; raises on duplicate names or colliding aliases."""
    index: dict[str, Device] = {}
    names: dict[str, Device] = {}
    for device in devices:
        if device.name in names:
            raise DeviceError(f"device database: name '{device.name}' is used by both "
                              f"{names[device.name].source_file} and {device.source_file}")
        names[device.name] = device
        for label in (device.name, *device.aliases):
            other = index.setdefault(_normalize(label), device)
            if other is not device:
                raise DeviceError(f"device database: '{label}' ({device.source_file}) collides "
                                  f"with a name or alias of '{other.name}' ({other.source_file})")
    return index


@functools.lru_cache(maxsize=1)
def _database() -> _Database:
    devices = [load_device_file(p) for p in sorted(GPUS_DIR.glob("*.json"))]
    index = build_index(devices)
    return _Database(tuple(sorted(devices, key=lambda d: (d.vendor, d.name))), index)


def list_devices() -> list[Device]:
    """Every shipped device, sorted by vendor then name."""
    return list(_database().devices)


def _lowest_sourced(field_name: str, vendor: str) -> float | None:
    known = [getattr(d, field_name) for d in _database().devices
             if d.vendor == vendor and getattr(d, field_name) is not None]
    return min(known) if known else None


def lowest_dram_latency_ns(vendor: str) -> float | None:
    """The shortest sourced DRAM latency among the shipped GPUs of ``vendor`` (None if none
    has one): a lower bound for every GPU of that vendor."""
    return _lowest_sourced("dram_latency_ns", vendor)


def lowest_l2_latency_ns(vendor: str) -> float | None:
    """The shortest sourced L2 hit latency among the shipped GPUs of ``vendor`` (None if none
    has one): a lower bound for a GPU of that vendor with no measurement of its own."""
    return _lowest_sourced("l2_latency_ns", vendor)


def _close_matches(name: str, limit: int = 6) -> list[str]:
    """Names containing the query first (shortest first: "a100" -> the A100s), then difflib's."""
    index = _database().index
    query = _normalize(name)
    containing = sorted((k for k in index if query and query in k), key=len)
    similar = difflib.get_close_matches(query, list(index), n=10, cutoff=0.5)
    return list(dict.fromkeys(index[k].name for k in containing + similar))[:limit]


def resolve_name(name: str) -> str:
    """Canonical name of the shipped device called ``name`` (a name or alias, any case; spaces,
    underscores and hyphens interchangeable). Unknown names raise with the closest matches."""
    device = _database().index.get(_normalize(name))
    if device is not None:
        return device.name
    matches = _close_matches(name)
    if matches:
        hint = "did you mean: " + ", ".join(repr(m) for m in matches) + "?"
    else:
        hint = "known devices: " + ", ".join(d.name for d in _database().devices)
    raise DeviceError(f"unknown device '{name}'; {hint} (or give a path to a device JSON file)")


def _looks_like_path(text: str) -> bool:
    return text.lower().endswith(".json") or Path(text).is_file()


def load_device(name_or_path: str | Path | Device) -> Device:
    """A :class:`Device` from itself, a JSON file path, or a shipped device's name or alias."""
    if isinstance(name_or_path, Device):
        return name_or_path
    if isinstance(name_or_path, Path):
        return load_device_file(name_or_path)
    if not isinstance(name_or_path, str):
        raise DeviceError(f"expected a device name, JSON path or Device, got {name_or_path!r}")
    if _looks_like_path(name_or_path):
        return load_device_file(name_or_path)
    return _database().index[_normalize(resolve_name(name_or_path))]
