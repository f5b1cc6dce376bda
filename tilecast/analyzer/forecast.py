"""The forecast: kernels with predicted latencies, and the totals users read."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..device_db.device import Device
from ..errors import ConfigError, DeviceError
from .band import ForecastBand, forecast_band
from .types import DTYPE_SIZE, BroadcastReread, Kernel, MatmulDims, NativeDepthwise, OpCost

SCHEMA_VERSION = 1
PHASES = ("forward", "backward", "update")


def _r(x: float) -> float:
    # Fixed precision keeps JSON byte-identical across runs and platforms.
    return float(f"{x:.6g}")


# Tensor-core GEMM kernels load rows 16 bytes at a time (the cuBLAS documentation's Tensor
# Core usage rules: pointers and leading dimensions aligned to 16 bytes); otherwise cuBLAS
# falls back to kernels that load 1 or 2 elements at a time. On an H100 (datasets/h100-sxm5-
# 80gb/traces), GPT-2 Large's 4096 x 1280 -> 50257 bf16 LM head ran `cutlass_75_tensorop_
# bf16_s1688gemm_..._align1` for 5.46 ms, 8.2x its forecast, and BERT-Large's 4096 x 1024 ->
# 30522 one `cutlass_80_tensorop_bf16_s16816gemm_..._align2` for 1.02 ms, 3.2x. One GPU's
# measurements, so the forecast is not corrected, only flagged.
ROW_ALIGN_BYTES = 16


# Under a graph runtime a kernel is charged its busy time plus the in-graph launch (0.5 us),
# and a kernel of a few blocks comes out near that launch alone. No kernel ran that fast in a
# CUDA graph on either of our Hoppers: each family's smallest took 0.90 us (a 128-element
# add on the H100's chip with the H200's memory) to 6.6 us (a 4,096-wide layer norm)
# per launch (datasets/h100-sxm5-80gb and h200-sxm-141gb, traces/floor-sweep-eager.csv). Since
# stop 50 the runtime holds a queued kernel to two DRAM round trips (``runtime.lone_kernel_ms``),
# which keeps every shipped GPU above this; a kernel under it (a GPU whose vendor has no sourced
# latency) is flagged, not corrected (docs/predictor.md, "What one block costs inside a CUDA
# graph").
GRAPH_FLOOR_US = 0.9
GRAPH_FLOOR_EVIDENCE = ("in a CUDA graph our H100 and H200 ran each family's smallest kernel "
                        "in 0.9-6.6 us")


def below_graph_floor(latency_ms: float, runtime: str) -> bool:
    """A kernel's time in the pass under ``runtime`` is below ``GRAPH_FLOOR_US`` (graph
    runtimes only: eager charges the host's dispatch instead)."""
    return runtime != "eager" and latency_ms * 1e3 < GRAPH_FLOOR_US


def misaligned_gemm(kernel: Kernel) -> bool:
    """A 16- or 8-bit GEMM (the dtypes tensor cores take) with n or k, the lengths of the
    rows its operands and output are stored in, not a multiple of 16 bytes: cuBLAS loads its
    operands in narrower pieces (``learned.tensor_core.load_width_slowdown``)."""
    c = kernel.cost
    size = DTYPE_SIZE.get(c.dtype, 4)
    if kernel.op_type not in ("MatMul", "Gemm") or c.matmul is None or size >= 4:
        return False
    per_row = int(ROW_ALIGN_BYTES / size)
    return c.matmul.n % per_row != 0 or c.matmul.k % per_row != 0


@dataclass(frozen=True)
class KernelForecast:
    kernel: Kernel
    latency_ms: float
    bound: str
    tile: str | None = None
    extrapolated: bool = False
    clamped: bool = False  # held at the predictor's envelope (its utilization floor)
    # measured / forecast range of its family on unseen GPUs (analyzer/band.py); None: none
    band: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        k, c = self.kernel, self.kernel.cost
        return {
            "name": k.name, "nodes": list(k.nodes), "op_type": k.op_type, "family": k.family,
            "phase": k.phase, "dtype": k.dtype, "flops": k.flops, "bytes": k.bytes,
            "latency_ms": _r(self.latency_ms), "bound": self.bound, "tile": self.tile,
            "extrapolated": self.extrapolated, "clamped": self.clamped,
            "band": None if self.band is None else [_r(x) for x in self.band],
            "misaligned": misaligned_gemm(k), "estimated": c.estimated,
            "matmul": None if c.matmul is None else
            {"b": c.matmul.b, "m": c.matmul.m, "n": c.matmul.n, "k": c.matmul.k,
             **({"causal": True} if c.matmul.causal else {})},
            # A broadcast operand's extra reads, beyond ``bytes`` (costs/broadcast.py): how much
            # of them the GPU's L2 serves is the predictor's part of the latency.
            "reread": None if c.reread is None else
            {"bytes": c.reread.bytes, "slice_bytes": c.reread.slice_bytes,
             "operand_bytes": c.reread.operand_bytes},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "kernel") -> KernelForecast:
        """Read back one ``to_dict()`` entry. Static detail the JSON does not hold (matrix or
        vector unit, row dims, element count, fusion group id) keeps its default."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a JSON object")
        name = _field(data, "name", str, where)
        mm = data.get("matmul")
        if mm is not None and not (isinstance(mm, Mapping) and all(
                isinstance(mm.get(d), int) for d in "bmnk")
                and isinstance(mm.get("causal", False), bool)):
            raise ConfigError(f"{where}: field 'matmul' must be null or {{b, m, n, k}} ints "
                              "(and an optional causal bool)")
        rr = data.get("reread")
        fields = ("bytes", "slice_bytes", "operand_bytes")
        if rr is not None and not (isinstance(rr, Mapping) and all(
                isinstance(rr.get(f), int) for f in fields)):
            raise ConfigError(f"{where}: field 'reread' must be null or {{{', '.join(fields)}}} "
                              "ints")
        cost = OpCost(family=_field(data, "family", str, where),
                      flops=_field(data, "flops", int, where),
                      bytes=_field(data, "bytes", int, where),
                      dtype=str(data.get("dtype", "unknown")),
                      matmul=None if mm is None else MatmulDims(
                          mm["b"], mm["m"], mm["n"], mm["k"], causal=mm.get("causal", False)),
                      estimated=bool(data.get("estimated", False)),
                      reread=None if rr is None else BroadcastReread(*(rr[f] for f in fields)))
        kernel = Kernel(name, tuple(str(n) for n in data.get("nodes", (name,))),
                        _field(data, "op_type", str, where), cost,
                        phase=_field(data, "phase", str, where))
        band = data.get("band")
        if band is not None and not (isinstance(band, list) and len(band) == 2 and all(
                isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in band)):
            raise ConfigError(f"{where}: field 'band' must be null or [low, high] numbers > 0")
        return cls(kernel, float(_field(data, "latency_ms", float, where)),
                   _field(data, "bound", str, where), data.get("tile"),
                   bool(data.get("extrapolated", False)), bool(data.get("clamped", False)),
                   None if band is None else (float(band[0]), float(band[1])))


@dataclass(frozen=True)
class OpReason:
    """``count`` nodes of one op and the reason for their outcome: why they launch no GPU kernel
    (zero-cost: "host", "folded at load", a view) or why no formula costs them (unsupported:
    control flow, a generation loop, no formula in a domain)."""

    op_type: str
    reason: str
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"op_type": self.op_type, "reason": self.reason, "count": self.count}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> OpReason:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a JSON object")
        return cls(_field(data, "op_type", str, where), _field(data, "reason", str, where),
                   _field(data, "count", int, where))


ZeroCostOp = OpReason  # its name before unsupported nodes had reasons too


@dataclass(frozen=True)
class Forecast:
    """A model's forecast on one device. ``kernels`` are in launch order."""

    model: str
    device: Device
    mode: str
    predictor: str
    kernels: tuple[KernelForecast, ...]
    unsupported: Mapping[str, int] = field(default_factory=dict)  # op_type -> count
    zero_cost: Mapping[str, int] = field(default_factory=dict)
    fusion: bool = False
    dims: Mapping[str, int] = field(default_factory=dict)
    node_count: int = 0
    zero_cost_reasons: tuple[ZeroCostOp, ...] = ()
    math: str = "graph"  # the math mode assumed (analyzer/mathmode.py)
    runtime: str = "eager"  # the runtime assumed (analyzer/runtime.py)
    unshaped: Mapping[str, int] = field(default_factory=dict)  # op_type -> count
    unshaped_from: str = ""  # the node where shape propagation stopped (analysis.unshaped_root)
    unsupported_reasons: tuple[OpReason, ...] = ()
    band_level: float | None = None  # the predictor's error-band level (None: no bands)
    memory_format: str = "nchw"  # PyTorch's activation layout assumed (analyzer/runtime.py)

    @property
    def incomplete(self) -> bool:
        """Some node's work is an estimate, not a formula: an op with no cost formula
        (``unsupported``) or one whose shapes cannot be derived (``unshaped``)."""
        return bool(self.unsupported or self.unshaped)

    def zero_cost_by_reason(self) -> dict[str, int]:
        """Zero-cost node count per reason, most frequent first."""
        acc: Counter[str] = Counter()
        for z in self.zero_cost_reasons:
            acc[z.reason] += z.count
        return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def total_ms(self) -> float:
        return sum(k.latency_ms for k in self.kernels)

    @property
    def by_family(self) -> dict[str, float]:
        return self._sum_by(lambda k: k.kernel.family)

    @property
    def by_phase(self) -> dict[str, float]:
        return self._sum_by(lambda k: k.kernel.phase)

    @property
    def extrapolated(self) -> bool:
        return any(k.extrapolated for k in self.kernels)

    @property
    def band(self) -> ForecastBand | None:
        """Where the total lands if each kernel errs as its family did on unseen GPUs."""
        return forecast_band(self.kernels, self.band_level)

    @property
    def clamped_by_family(self) -> dict[str, int]:
        """Kernels the predictor's envelope held at its utilization floor, per family."""
        return dict(sorted(Counter(k.kernel.family for k in self.kernels if k.clamped).items()))

    @property
    def misaligned(self) -> tuple[KernelForecast, ...]:
        """Sub-4-byte matrix-unit GEMMs whose row length (n or k) is no multiple of 16 bytes
        (``misaligned_gemm``): cuBLAS cannot use its vectorized tensor-core kernels there, and
        tilecast forecasts them as if it could."""
        return tuple(k for k in self.kernels if misaligned_gemm(k.kernel))

    @property
    def latency_bound(self) -> tuple[KernelForecast, ...]:
        """Kernels held to their DRAM-latency walk: PyTorch's own NCHW batch-norm and max-pool
        kernels and its non-vectorized elementwise loop, whose threads wait on one load at a
        time (``learned.latency_walk``)."""
        return tuple(k for k in self.kernels if k.bound == "latency")

    @property
    def issue_bound(self) -> tuple[KernelForecast, ...]:
        """Kernels held to their instruction issue: PyTorch's own NCHW depthwise conv and its
        data gradient (``learned.native_issue``)."""
        return tuple(k for k in self.kernels
                     if k.bound == "compute" and isinstance(k.kernel.cost.native, NativeDepthwise))

    @property
    def below_graph_floor(self) -> tuple[KernelForecast, ...]:
        """Under a graph runtime, kernels forecast below ``GRAPH_FLOOR_US``: faster than any
        kernel measured inside a CUDA graph; their time is likely under-forecast."""
        return tuple(k for k in self.kernels if below_graph_floor(k.latency_ms, self.runtime))

    @property
    def unsupported_ms(self) -> float:
        return sum(k.latency_ms for k in self.kernels if k.kernel.cost.estimated)

    def _sum_by(self, key) -> dict[str, float]:
        acc: Counter[str] = Counter()
        for k in self.kernels:
            acc[key(k)] += k.latency_ms
        return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])))

    def top(self, n: int) -> list[KernelForecast]:
        return sorted(self.kernels, key=lambda k: (-k.latency_ms, k.kernel.name))[:n]

    def to_dict(self) -> dict[str, Any]:
        from .. import __version__

        band = self.band
        return {
            "schema": SCHEMA_VERSION, "tilecast_version": __version__, "model": self.model,
            "device": self.device.name, "mode": self.mode, "predictor": self.predictor,
            "math": self.math, "runtime": self.runtime, "memory_format": self.memory_format,
            "fusion": self.fusion, "dims": dict(sorted(self.dims.items())),
            "total_ms": _r(self.total_ms),
            "by_phase": {p: _r(v) for p, v in self.by_phase.items()},
            "by_family": {f: _r(v) for f, v in self.by_family.items()},
            "extrapolated": self.extrapolated,
            "band": None if band is None else {
                "level": band.level, "low_ms": _r(band.low_ms), "high_ms": _r(band.high_ms),
                "covered_ms": _r(band.covered_ms)},
            "nodes": self.node_count,
            "kernels": [k.to_dict() for k in self.kernels],
            "unsupported": dict(sorted(self.unsupported.items())),
            "unsupported_ms": _r(self.unsupported_ms),
            "unsupported_reasons": [z.to_dict() for z in self.unsupported_reasons],
            "unshaped": dict(sorted(self.unshaped.items())),
            "unshaped_from": self.unshaped_from,
            "incomplete": self.incomplete,
            "zero_cost": dict(sorted(self.zero_cost.items())),
            "zero_cost_reasons": [z.to_dict() for z in self.zero_cost_reasons],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, device: Device | None = None,
                  origin: str = "forecast JSON") -> Forecast:
        """Read back ``to_dict()`` output (schema 1). ``device`` overrides the device named in
        it, e.g. for a forecast made with a custom device JSON. Raises ``ConfigError`` naming
        the bad field, or ``DeviceError`` when the device is not in the database."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{origin}: a forecast must be a JSON object")
        from ..schemas import check
        from .forecast_schema import check_totals, check_version, forecast_schema

        check_version(data.get("schema"), origin)
        check(data, forecast_schema(), origin)
        kernels = _field(data, "kernels", list, origin)
        forecast = cls(
            model=_field(data, "model", str, origin),
            device=device or _known_device(_field(data, "device", str, origin), origin),
            mode=_field(data, "mode", str, origin),
            predictor=_field(data, "predictor", str, origin),
            kernels=tuple(KernelForecast.from_dict(k, f"{origin}: kernels[{i}]")
                          for i, k in enumerate(kernels)),
            unsupported=dict(data.get("unsupported") or {}),
            zero_cost=dict(data.get("zero_cost") or {}), fusion=bool(data.get("fusion")),
            dims=dict(data.get("dims") or {}), node_count=int(data.get("nodes", 0)),
            zero_cost_reasons=_reasons(data, "zero_cost_reasons", origin),
            unsupported_reasons=_reasons(data, "unsupported_reasons", origin),
            # Forecasts written before math modes and runtimes existed assumed these.
            math=str(data.get("math", "graph")), runtime=str(data.get("runtime", "eager")),
            memory_format=str(data.get("memory_format", "nchw")),  # written since stop 64
            unshaped=dict(data.get("unshaped") or {}),
            unshaped_from=str(data.get("unshaped_from", "")),
            band_level=_band_level(data, origin),
        )
        check_totals(data, forecast, origin)
        return forecast

    @classmethod
    def from_json(cls, text: str, *, device: Device | None = None,
                  origin: str = "forecast JSON") -> Forecast:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{origin} is not valid JSON (line {exc.lineno}: {exc.msg})"
                              ) from None
        return cls.from_dict(data, device=device, origin=origin)

    def to_dataframe(self):  # -> pandas.DataFrame (pandas is optional)
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Forecast.to_dataframe() needs pandas: pip install pandas"
                              ) from exc
        rows = [k.to_dict() for k in self.kernels]
        for r in rows:
            r["nodes"] = ",".join(r["nodes"])
            mm = r.pop("matmul") or {}
            for d in "bmnk":
                r[f"matmul_{d}"] = mm.get(d)
            r["matmul_causal"] = mm.get("causal", False) if mm else None
        return pd.DataFrame(rows)


def load_forecast(path: str | os.PathLike[str], *, device: Device | None = None) -> Forecast:
    """Read a forecast saved by ``tilecast analyze --format json`` (or ``Forecast.to_json``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read forecast {path}: {exc}") from None
    return Forecast.from_json(text, device=device, origin=str(path))


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list"}


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise ConfigError(f"{where}: field '{key}' is missing")
    value = data[key]
    ok = isinstance(value, (int, float) if kind is float else kind)
    if not ok or isinstance(value, bool):
        raise ConfigError(f"{where}: field '{key}' must be {_KIND_NAMES[kind]}, "
                          f"got {type(value).__name__} {value!r}")
    return value


def _reasons(data: Mapping[str, Any], key: str, origin: str) -> tuple[OpReason, ...]:
    """Optional (older forecasts lack it); when present, a list of OpReason objects."""
    if data.get(key) is None:
        return ()
    rows = _field(data, key, list, origin)
    return tuple(OpReason.from_dict(z, f"{origin}: {key}[{i}]") for i, z in enumerate(rows))


def _band_level(data: Mapping[str, Any], origin: str) -> float | None:
    band = data.get("band")
    if band is None:
        return None
    level = band.get("level") if isinstance(band, Mapping) else None
    if not isinstance(level, int | float) or isinstance(level, bool) or not 0 < level < 1:
        raise ConfigError(f"{origin}: field 'band' must be null or an object with a 'level' "
                          "between 0 and 1")
    return float(level)


def _known_device(name: str, origin: str) -> Device:
    from ..device_db import load_device

    try:
        return load_device(name)
    except DeviceError:
        raise DeviceError(f"{origin}: device {name!r} is not in the device database (load it "
                          "with device=load_device('path/to/device.json'))") from None
