"""``compare``: two models or saved forecasts -> :class:`Comparison`, on one or more devices."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from .. import __version__
from ..analyzer.forecast import Forecast
from ..analyzer.graph import load_model
from ..analyzer.pipeline import analyze, resolve_predictor
from ..analyzer.predictor import Predictor
from ..device_db import Device, load_device
from ..errors import ConfigError, ModelLoadError
from .baseline import InputSpec, Saved, is_json_file, load_saved, model_inputs
from .compare import Comparison, compare_forecasts
from .threshold import Threshold, parse_threshold

Source = str | os.PathLike[str] | onnx.ModelProto | Forecast | Sequence[Forecast]
DeviceSpec = str | os.PathLike[str] | Device


@dataclass(frozen=True)
class Side:
    """One side of a comparison: an ONNX model to analyze, or saved forecasts."""

    label: str
    model: onnx.ModelProto | None = None
    saved: Saved | None = None
    inputs: tuple[InputSpec, ...] | None = None
    cache: dict[tuple[str, str], Forecast] = field(default_factory=dict, compare=False)


def open_side(source: Source, label: str | None = None) -> Side:
    if isinstance(source, onnx.ModelProto):
        return Side(label or source.graph.name or "<model>", model=source,
                    inputs=model_inputs(source))
    if isinstance(source, Forecast):
        source = [source]
    if isinstance(source, Sequence) and not isinstance(source, str):
        if not source:
            raise ConfigError("no forecast to compare (an empty list)")
        label = label or source[0].model
        return Side(label, saved=Saved(label, {(f.device.name, f.mode): f for f in source}))
    if not os.path.isfile(source):
        raise ModelLoadError(f"file not found: {source}")
    if is_json_file(source):
        saved = load_saved(source)
        return Side(label or str(source), saved=saved, inputs=saved.inputs)
    model = load_model(source)
    return Side(label or str(source), model=model, inputs=model_inputs(model))


@dataclass(frozen=True)
class Settings:
    mode: str = "inference"
    fusion: bool = False
    dims: Mapping[str, int] | None = None
    predictor: Predictor | None = None
    optimizer: str = "none"
    math: str = "graph"
    runtime: str = "eager"
    memory_format: str = "nchw"


def forecast_on(side: Side, device: Device, s: Settings) -> Forecast:
    """The side's forecast for ``device``: the saved one (checked) or a fresh analysis."""
    key = (device.name, s.mode)
    if key in side.cache:
        return side.cache[key]
    if side.saved is not None:
        f = _saved_forecast(side, device, s)
    else:
        assert side.model is not None and s.predictor is not None
        f = analyze(side.model, device, mode=s.mode, fusion=s.fusion, dims=s.dims or None,
                    predictor=s.predictor, optimizer=s.optimizer, math=s.math,
                    runtime=s.runtime, memory_format=s.memory_format)
    side.cache[key] = f
    return f


def _saved_forecast(side: Side, device: Device, s: Settings) -> Forecast:
    assert side.saved is not None
    f = side.saved.forecasts.get((device.name, s.mode))
    if f is None:
        held = ", ".join(f"{d} {m}" for d, m in side.saved.forecasts)
        raise ConfigError(f"{side.label} holds no {s.mode} forecast for {device.name} "
                          f"(it holds: {held})")
    if f.fusion != s.fusion:
        flag = "--fusion" if f.fusion else "--no-fusion"
        raise ConfigError(f"{side.label} was forecast {'with' if f.fusion else 'without'} "
                          f"fusion: compare with {flag}")
    return f


def _devices(spec: DeviceSpec | Sequence[DeviceSpec] | None, sides: Sequence[Side],
             ) -> list[Device]:
    if spec is None:
        names = [d for side in sides if side.saved for d in side.saved.devices]
        if not names:
            raise ConfigError("name at least one device to compare on (--device NAME)")
        spec = list(dict.fromkeys(names))
    elif isinstance(spec, (str, os.PathLike, Device)):
        spec = [spec]
    devices = [d if isinstance(d, Device) else load_device(d) for d in spec]
    return list({d.name: d for d in devices}.values())


def _settings(sides: Sequence[Side], mode: str, fusion: bool, dims: Mapping[str, int] | None,
              predictor: str | os.PathLike[str] | Predictor | None, optimizer: str,
              math: str | None = None, runtime: str | None = None,
              memory_format: str | None = None) -> Settings:
    saved = [f for side in sides if side.saved for f in side.saved.forecasts.values()]
    if predictor is None and saved and all(f.predictor == "roofline" for f in saved):
        predictor = "roofline"  # follow a roofline baseline rather than switch predictors
    if not dims and saved:
        dims = saved[0].dims  # analyze the model as the baseline was analyzed
    # Unless told otherwise, forecast the model under the baseline's math mode, runtime and
    # memory format.
    math = math or (saved[0].math if saved else "graph")
    runtime = runtime or (saved[0].runtime if saved else "eager")
    memory_format = memory_format or (saved[0].memory_format if saved else "nchw")
    pred = resolve_predictor(predictor) if any(s.model is not None for s in sides) else None
    return Settings(mode, fusion, dict(dims or {}), pred, optimizer, math, runtime,
                    memory_format)


def _warnings(base: Side, new: Side, s: Settings) -> list[str]:
    out = []
    if base.inputs is not None and new.inputs is not None and base.inputs != new.inputs:
        b = "; ".join(map(str, base.inputs)) or "none"
        n = "; ".join(map(str, new.inputs)) or "none"
        out.append(f"the models take different inputs: {base.label}: {b} -- {new.label}: {n}")
    for side in (base, new):
        saved = side.saved
        if saved and saved.tilecast_version not in (None, __version__):
            out.append(f"{side.label} was written by tilecast {saved.tilecast_version}, this is "
                       f"{__version__}: cost formulas may differ (refresh the baseline)")
        for f in saved.forecasts.values() if saved else ():
            if dict(f.dims) != dict(s.dims or {}):
                out.append(f"{side.label} was forecast with dims {dict(f.dims)}, the other "
                           f"side with {dict(s.dims or {})}")
                break
    return out


def _check_predictors(base: Side, new: Side, fb: Forecast, fn: Forecast) -> None:
    if fb.predictor != fn.predictor:
        raise ConfigError(
            f"{base.label} was forecast with predictor {fb.predictor!r} and {new.label} with "
            f"{fn.predictor!r}: pass the same --predictor to both, or refresh the baseline")
    for attr, flag in (("math", "--math"), ("runtime", "--runtime"),
                       ("memory_format", "--memory-format")):
        b, n, what = getattr(fb, attr), getattr(fn, attr), attr.replace("_", " ")
        if b != n:
            raise ConfigError(
                f"{base.label} was forecast with {what} {b!r} and {new.label} with {n!r}: "
                f"forecasts under different {what} settings are not comparable (pass the "
                f"same {flag} to both, or refresh the baseline)")


def compare_sides(base: Side, new: Side, devices: DeviceSpec | Sequence[DeviceSpec] | None = None,
                  *, mode: str = "inference", threshold: str | Threshold = "5%",
                  fusion: bool = False, dims: Mapping[str, int] | None = None,
                  predictor: str | os.PathLike[str] | Predictor | None = None,
                  optimizer: str = "none", top: int = 10, math: str | None = None,
                  runtime: str | None = None, memory_format: str | None = None) -> Comparison:
    limit = parse_threshold(threshold)
    devs = _devices(devices, (base, new))
    s = _settings((base, new), mode, fusion, dims, predictor, optimizer, math, runtime,
                  memory_format)
    results = []
    for dev in devs:
        fb, fn = forecast_on(base, dev, s), forecast_on(new, dev, s)
        _check_predictors(base, new, fb, fn)
        results.append(compare_forecasts(fb, fn, limit, top))
    return Comparison(base.label, new.label, limit, tuple(results),
                      tuple(_warnings(base, new, s)))


def compare(base: Source, new: Source, devices: DeviceSpec | Sequence[DeviceSpec] | None = None,
            *, mode: str = "inference", threshold: str | Threshold = "5%", fusion: bool = False,
            dims: Mapping[str, int] | None = None,
            predictor: str | os.PathLike[str] | Predictor | None = None,
            optimizer: str = "none", top: int = 10, math: str | None = None,
            runtime: str | None = None, memory_format: str | None = None) -> Comparison:
    """Compare the forecasts of ``base`` and ``new`` on each device.

    ``base`` and ``new`` are each an ONNX path or ``ModelProto`` (analyzed here), or a saved
    forecast: a JSON path (forecast, list, or baseline file), a :class:`Forecast` or a list of
    them. ``devices`` defaults to the devices of the saved side(s). ``predictor`` defaults to
    the saved side's when it is roofline, else the default predictor; ``dims`` default to the
    saved side's. ``threshold`` is ``"5%"``-style or ``"2ms"``-style; a device regresses when
    ``new`` is slower than ``base`` by more than it. ``top``: kernel changes kept per device.
    ``math`` / ``runtime`` / ``memory_format`` default to the saved side's (else graph /
    eager / nchw); forecasts made under different ones raise ``ConfigError``.
    """
    limit = parse_threshold(threshold)  # bad text fails before any analysis
    return compare_sides(open_side(base), open_side(new), devices, mode=mode,
                         threshold=limit, fusion=fusion, dims=dims, predictor=predictor,
                         optimizer=optimizer, top=top, math=math, runtime=runtime,
                         memory_format=memory_format)
