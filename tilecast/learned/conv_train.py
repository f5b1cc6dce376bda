"""Train and evaluate the conv family (torch): the shipped model and the protocol.

Protocol: leave-one-GPU-out over the GPUs with conv data AND held-out shapes. A shape's hash
puts it in the held-out part on every GPU at once (``conv_data.heldout_shapes``), so for the
fold of GPU g the model trains on the other GPUs' training shapes (with the algorithms they
recorded) and is scored on g's held-out shapes under the serving rule (the fastest candidate
algorithm, ``conv_data.fastest``): neither the GPU nor the shape was ever seen. The roofline
(direct FLOPs and X + W + Y bytes, plus one launch) is scored on the same rows. Scores are
against the kernels' latencies (the harness drift taken out, ``conv_data``); the fold also
keeps tilecast's score against the latencies as the CSV recorded them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import conv as cv
from . import conv_data as cd
from . import tiles as tl
from .export import FamilyWeights
from .prepare import DeviceLookup, default_lookup, fit_tiles
from .train import Progress, TrainConfig, fit_family, log_ratio_error, predict_torch, to_weights

MAX_TRAIN_ROWS = 20_000  # seeded subsample above this: conv trains in well under a minute


@dataclass(frozen=True)
class ConvFold:
    """One leave-one-GPU-out fold on held-out shapes."""

    gpu: str
    n: int
    tilecast_mape_pct: float
    roofline_mape_pct: float
    algorithm_accuracy: float  # the forecast's pick (the fastest) vs the recorded kernels
    measured_mape_pct: float  # tilecast against the recorded latencies (drift left in)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ConvModel:
    weights: tuple[FamilyWeights, ...]  # one per ensemble member
    metadata: dict[str, str]  # conv_training_devices
    info: dict


def _subsample(s: cd.ConvSamples, seed: int) -> cd.ConvSamples:
    if len(s) <= MAX_TRAIN_ROWS:
        return s
    idx = np.random.default_rng(seed).choice(len(s), MAX_TRAIN_ROWS, replace=False)
    return s.select(np.sort(idx))


def fit_conv(train: cd.ConvSamples, config: TrainConfig, lookup: DeviceLookup = default_lookup,
             val: cd.ConvSamples | None = None, progress: Progress | None = None):
    """(model, its training data) fitted on ``train`` with the recorded algorithms (``val``,
    also with its recorded algorithms, only feeds the progress lines)."""
    train = _subsample(train, config.seed)
    data = cd.conv_family_data(train, lookup)
    vdata = cd.conv_family_data(val, lookup) if val is not None and len(val) else None
    return fit_family(data, config, vdata, progress), data


def forecast(model, s: cd.ConvSamples, lookup: DeviceLookup = default_lookup,
             table: tl.TileTable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ms, algorithm) of the serving rule on ``s``: the fastest candidate algorithm, the
    nonfused SGEMM tiles from ``table`` (default: the shipped tile table)."""
    return cd.fastest(s, lambda data: predict_torch(model, data), lookup, table)


TileTables = Callable[[str], "tl.TileTable | None"]


def fold_tile_tables(data_dirs: Sequence[Path | str],
                     lookup: DeviceLookup = default_lookup) -> TileTables:
    """The tile table of each conv fold: fit on the matmul sweeps of every GPU but the held-out
    one (the tile of a nonfused conv must not come from the held-out GPU's own kernels);
    None where the folders hold no matmul sweep (the shipped table then serves)."""
    from .dataset import load_kernels

    train = load_kernels(data_dirs, "train")
    train = train.select(train.family == "matmul")
    cache: dict[str, tl.TileTable | None] = {}

    def table(gpu: str) -> tl.TileTable | None:
        if gpu not in cache:
            rest = train.select(train.device != gpu)
            cache[gpu] = fit_tiles(rest, lookup) if len(rest) else None
        return cache[gpu]
    return table


def roofline_ms(s: cd.ConvSamples, lookup: DeviceLookup = default_lookup) -> np.ndarray:
    """Direct-convolution roofline on the same rows: max(2*N*K*P*Q*C*R*S / peak,
    (X + W + Y) bytes / bandwidth) plus one launch (the analyzer's ``RooflinePredictor``)."""
    cc = s.columns()
    flops, io = cv.direct_flops(cc), sum(cv.tensor_bytes(cc))
    dc = cd.device_arrays(s, lookup)
    return (np.maximum(flops / dc.peak_flops, io / dc.bandwidth) + dc.launch_s) * 1e3


def logo_conv(samples: cd.ConvSamples, config: TrainConfig | None = None,
              lookup: DeviceLookup = default_lookup, progress: Progress | None = None,
              collect: Callable[[np.ndarray, np.ndarray], None] | None = None,
              tables: TileTables | None = None) -> list[ConvFold]:
    """Every fold of the protocol (module docstring), one per GPU with conv data;
    ``collect(measured_ms, forecast_ms)`` receives each fold's held-out convs; ``tables``
    gives each fold's tile table (``fold_tile_tables``; None: the shipped one)."""
    config = config or TrainConfig()
    held = cd.heldout_shapes(samples)
    folds = []
    for gpu in sorted(set(samples.device.tolist())):
        train = samples.select((samples.device != gpu) & ~held)
        test = samples.select((samples.device == gpu) & held)
        if not len(test) or not len(train):
            continue
        model, _ = fit_conv(train, config, lookup)
        pred, algo = forecast(model, test, lookup, tables(gpu) if tables else None)
        if collect is not None:
            collect(test.latency_ms, pred)
        folds.append(ConvFold(gpu, len(test), log_ratio_error(pred, test.latency_ms),
                              log_ratio_error(roofline_ms(test, lookup), test.latency_ms),
                              float(np.mean(algo == test.algo)),
                              log_ratio_error(pred, test.measured_ms)))
        if progress:
            f = folds[-1]
            progress(f"conv LOGO {gpu}: tilecast {f.tilecast_mape_pct:.1f} %, roofline "
                     f"{f.roofline_mape_pct:.1f} % (n={f.n})")
    return folds


def average_folds(runs: Sequence[Sequence[ConvFold]]) -> list[ConvFold]:
    """Each GPU's fold averaged over runs that differ only in their training seed."""
    by_gpu: dict[str, list[ConvFold]] = {}
    for folds in runs:
        for f in folds:
            by_gpu.setdefault(f.gpu, []).append(f)
    return [replace(fs[0], **{k: float(np.mean([getattr(f, k) for f in fs])) for k in
                              ("tilecast_mape_pct", "roofline_mape_pct", "algorithm_accuracy",
                               "measured_mape_pct")})
            for fs in by_gpu.values()]


def train_conv(data_dirs: Sequence[Path | str], config: TrainConfig,
               lookup: DeviceLookup = default_lookup, progress: Progress | None = None,
               table: tl.TileTable | None = None) -> ConvModel | None:
    """The shipped conv model: every GPU with conv data, training shapes only (the held-out
    shapes are its validation, forecast with ``table``: the tile table trained beside it).
    None when the folders hold no conv CSVs."""
    samples = cd.load_conv(data_dirs)
    if samples is None:
        return None
    held = cd.heldout_shapes(samples)
    train, val = samples.select(~held), samples.select(held)
    model, data = fit_conv(train, config, lookup, val, progress)
    score = log_ratio_error(forecast(model, val, lookup, table)[0], val.latency_ms) if len(val) \
        else np.nan
    meta = {"conv_training_devices": json.dumps(sorted(set(samples.device.tolist())))}
    info = {"rows": len(data.latency_ms), "validation_mape_pct": float(score),
            "utilization_floor": model.u_floor,
            "host_dispatch_ms": dict(zip(("nvidia", "amd"), model.host_ms().round(5).tolist(),
                                         strict=True))}
    return ConvModel(to_weights(model, "conv"), meta, info)
