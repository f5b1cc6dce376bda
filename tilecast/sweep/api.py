"""One model forecast on several GPUs and input sizes (``tilecast sweep``)."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import onnx

from ..analyzer.forecast import Forecast
from ..analyzer.graph import build_graph, load_model
from ..analyzer.mathmode import MATH_MODES, check_math
from ..analyzer.pipeline import analyze, resolve_predictor
from ..analyzer.predictor import Predictor
from ..analyzer.runtime import check_runtime
from ..device_db import Device, load_device
from ..errors import TilecastError

SCHEMA_VERSION = 1

def is_batch_dim(name: str) -> bool:
    """A dim whose name says batch (batch, batch_size, Batch...): the samples a forecast
    serves, for samples/s."""
    return "batch" in name.lower()


def _batch(point: tuple[tuple[str, int], ...]) -> int | None:
    """The value of the first bound batch dim (``is_batch_dim``)."""
    return next((v for k, v in point if is_batch_dim(k)), None)


@dataclass(frozen=True)
class SweepRow:
    """One (GPU, math mode, runtime, input dims) forecast; ``total_ms`` is None where the GPU
    cannot run the math mode (``skipped`` says why, as ``tilecast analyze`` would)."""

    device: str
    math: str
    runtime: str
    dims: tuple[tuple[str, int], ...]  # the input dims bound for this row, in sweep order
    total_ms: float | None
    speedup: float | None  # the sweep's first forecast at the same dims / this one
    samples_per_s: float | None  # batch x 1000 / total_ms where a dim named *batch* is bound
    top_family: str | None  # the kernel family with the most time
    top_family_share: float | None
    compute_bound_share: float | None  # share of the time in compute-bound kernels
    kernels: int
    extrapolated_kernels: int  # outside the predictor's training data
    incomplete: bool  # unsupported or unshaped ops (their work is an estimate)
    skipped: str | None = None
    # the forecast's error band (analyzer/band.py); None where the predictor ships none
    band_low_ms: float | None = None
    band_high_ms: float | None = None


@dataclass(frozen=True)
class Sweep:
    """Rows GPU-major, then math mode, runtime and each dim grid point (the last dim varies
    fastest)."""

    model: str
    mode: str
    predictor: str
    rows: tuple[SweepRow, ...]
    memory_format: str = "nchw"  # one for every row (analyzer/runtime.py)

    def to_dict(self) -> dict[str, Any]:
        from .. import __version__

        rows = [asdict(r) | {"dims": dict(r.dims)} for r in self.rows]
        return {"schema": SCHEMA_VERSION, "kind": "sweep", "tilecast_version": __version__,
                "model": self.model, "mode": self.mode, "predictor": self.predictor,
                "memory_format": self.memory_format, "rows": rows}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _grid(dims: Mapping[str, Sequence[int]] | None) -> list[tuple[tuple[str, int], ...]]:
    names = list(dims or {})
    for name in names:
        if not dims[name]:
            raise TilecastError(f"sweep: --dim {name} has no value")
    return [tuple(zip(names, values, strict=True))
            for values in itertools.product(*(dims[n] for n in names))]


def _row(f: Forecast, point: tuple[tuple[str, int], ...], first_ms: float | None) -> SweepRow:
    total = f.total_ms
    families = f.by_family
    top = next(iter(families), None)
    compute = sum(k.latency_ms for k in f.kernels if k.bound == "compute")
    batch = _batch(point)

    def share(ms: float) -> float | None:
        return round(ms / total, 4) if total > 0 else None

    band = f.band
    return SweepRow(
        device=f.device.name, math=f.math, runtime=f.runtime, dims=point,
        total_ms=round(total, 6),
        speedup=round(first_ms / total, 4) if first_ms and total > 0 else None,
        samples_per_s=round(batch * 1000.0 / total, 2) if batch and total > 0 else None,
        top_family=top, top_family_share=share(families[top]) if top else None,
        compute_bound_share=share(compute), kernels=len(f.kernels),
        extrapolated_kernels=sum(k.extrapolated for k in f.kernels), incomplete=f.incomplete,
        band_low_ms=None if band is None else round(band.low_ms, 6),
        band_high_ms=None if band is None else round(band.high_ms, 6))


def _skipped(device: str, math: str, runtime: str, point: tuple[tuple[str, int], ...],
             reason: str) -> SweepRow:
    return SweepRow(device=device, math=math, runtime=runtime, dims=point, total_ms=None,
                    speedup=None, samples_per_s=None, top_family=None, top_family_share=None,
                    compute_bound_share=None, kernels=0, extrapolated_kernels=0,
                    incomplete=False, skipped=reason)


def _names(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(dict.fromkeys(value))
    if not names:
        raise TilecastError(f"sweep: give at least one {what}")
    return names


def sweep(model: str | os.PathLike[str] | onnx.ModelProto,
          devices: Sequence[str | os.PathLike[str] | Device],
          dims: Mapping[str, Sequence[int]] | None = None, *, mode: str = "inference",
          fusion: bool = False, predictor: str | os.PathLike[str] | Predictor | None = None,
          optimizer: str = "none", math: str | Sequence[str] = "graph",
          runtime: str | Sequence[str] = "eager", memory_format: str = "nchw") -> Sweep:
    """Forecast ``model`` on every device, under every math mode and runtime given, at every
    combination of ``dims`` values; ``memory_format`` (nchw or channels-last) holds for all.

    >>> s = sweep("model.onnx", ["l4", "h100"], {"batch": [1, 8, 32]})  # doctest: +SKIP
    >>> [(r.device, dict(r.dims)["batch"], r.total_ms) for r in s.rows]  # doctest: +SKIP
    """
    if not devices:
        raise TilecastError("sweep: give at least one device")
    devs = [load_device(d) for d in devices]  # a typo fails before any forecast runs
    maths, runtimes = _names(math, "math mode"), _names(runtime, "runtime")
    for mm in maths:  # a name no GPU knows is an error, not a row per GPU
        if mm not in MATH_MODES:
            raise TilecastError(f"unknown math mode {mm!r}: choose one of {', '.join(MATH_MODES)}")
    for rt in runtimes:
        check_runtime(rt, memory_format)
    proto, pred, points = load_model(model), resolve_predictor(predictor), _grid(dims)
    if isinstance(model, onnx.ModelProto):
        label = model.graph.name or "<in-memory model>"
    else:
        label = str(model)
    if points[0]:  # the dim names are the graph's (a typo fails before any forecast runs)
        build_graph(proto, dict(points[0]))
    first: dict[tuple[tuple[str, int], ...], float] = {}
    rows = []
    for dev, mm, rt in itertools.product(devs, maths, runtimes):
        try:
            check_math(mm, dev)
        except TilecastError as exc:
            rows += [_skipped(dev.name, mm, rt, p, str(exc)) for p in points]
            continue
        for p in points:
            f = analyze(proto, dev, mode=mode, fusion=fusion, dims=dict(p), predictor=pred,
                        optimizer=optimizer, math=mm, runtime=rt, memory_format=memory_format)
            rows.append(_row(f, p, first.setdefault(p, f.total_ms)))
    if all(r.skipped for r in rows):
        raise TilecastError(f"sweep: no GPU given can run what was asked ({rows[0].skipped})")
    return Sweep(label, mode, pred.name, tuple(rows), memory_format)
