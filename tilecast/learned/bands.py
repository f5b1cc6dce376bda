"""Error bands: how far a kernel's forecast lands from its measurement on a GPU the model
never saw, per learned family, from the leave-one-GPU-out folds.

Each fold of ``tilecast kernels-eval --cv logo`` trains without one GPU and forecasts that
GPU's kernels (``cv.logo``; conv on its held-out shapes, ``conv_train.logo_conv``). Pooled
over the folds, the ratio measured / forecast of those kernels has a distribution per family
and decade of forecast time; its ``(1 - LEVEL) / 2`` and ``(1 + LEVEL) / 2`` quantiles are
the cell's band. Each fold weighs the same in a cell, so a GPU with more rows does not set
it. Cells by size, not one band per family weighted by time: the sweeps' longest kernels
(multi-second GEMMs with reductions of 16,384 and more, which the P100 runs at 0.4x its
forecast) would set the matmul band (its 90 % quantile 3.5 weighted by time, 1.6 by kernel),
and such kernels are far longer than a model's GEMMs.

A forecast uses the band of the family its kernel was costed by, only for kernels of a kind
the folds scored: a trained dtype and vendor (no 16-bit or TF32 tensor-core GEMM), a cost
that is no estimate, the family's own model (not a reduction costed as a copy), and not held
by a physical rule (the native walks, bound by ``latency``). A GPU whose descriptors lie
outside the training GPUs' (the L4's power per FLOP, the H100's SM count) keeps its bands and
its ``extrapolated`` flag: reaching past the other GPUs is what each fold's held-out GPU did.
The bands ship beside the predictor (``error_bands.json``) and say which command made them; a
predictor without one forecasts without bands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .routing import Routed

LEVEL = 0.8  # the central share of the folds' kernels a band holds
BANDS_NAME = "error_bands.json"
BANDS_SCHEMA = 1
# Cells by the forecast's own time (what a forecast knows of a kernel), one per decade: a 20 us
# launch-bound kernel and a 50 ms GEMM err differently, and a model's kernels span both.
DECADE_EDGES_MS = (0.01, 0.1, 1.0, 10.0, 100.0)
# A cell needs this many kernels from at least MIN_FOLDS held-out GPUs; a kernel whose decade
# has no cell takes the nearest cell of its family.
MIN_ROWS, MIN_FOLDS = 100, 3


def decade(latency_ms: float | np.ndarray) -> np.ndarray:
    """Index of the decade cell of each forecast time (0: under 10 us)."""
    return np.searchsorted(DECADE_EDGES_MS, latency_ms, side="right")


@dataclass(frozen=True)
class Band:
    """measured / forecast of one family's kernels on unseen GPUs, for kernels forecast in one
    decade of time: ``low`` and ``high`` are the quantiles, ``rows`` the kernels behind them
    over ``folds`` held-out GPUs."""

    family: str
    decade: int
    low: float
    high: float
    rows: int
    folds: int

    def to_json(self) -> dict:
        return {"family": self.family, "decade": self.decade, "low": round(self.low, 4),
                "high": round(self.high, 4), "rows": self.rows, "folds": self.folds}


@dataclass(frozen=True)
class ErrorBands:
    level: float
    bands: tuple[Band, ...]
    protocol: str  # how they were made (the command)

    def cell(self, family: str, d: int) -> Band | None:
        """The band of ``family``'s kernels forecast in decade ``d``: its own cell, else the
        family's nearest (the lower on a tie); None when the family has none."""
        cells = [b for b in self.bands if b.family == family]
        return min(cells, key=lambda b: (abs(b.decade - d), b.decade), default=None)

    def to_json(self) -> dict:
        return {"schema": BANDS_SCHEMA, "level": self.level, "protocol": self.protocol,
                "decade_edges_ms": list(DECADE_EDGES_MS),
                "bands": [b.to_json() for b in self.bands]}


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest of ``values`` below which at least ``q`` of the weight lies (the inverse of
    the weighted distribution: no interpolation across a gap between sparse values)."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(int(np.searchsorted(cum, q)), len(cum) - 1)])


@dataclass
class BandCollector:
    """Gathers each fold's forecasts of its held-out GPU's kernels (``add``), then the bands:
    per family and decade cell, every fold with kernels in the cell weighs the same (a GPU with
    more rows does not set the band), its kernels equally."""

    cells: dict[tuple[str, int], list[np.ndarray]] = field(default_factory=dict)

    def add(self, family: np.ndarray, measured_ms: np.ndarray, forecast_ms: np.ndarray) -> None:
        ok = (forecast_ms > 0) & (measured_ms > 0)
        cell = decade(forecast_ms)
        for fam in sorted(set(family[ok].tolist())):
            for d in sorted(set(cell[ok & (family == fam)].tolist())):
                m = ok & (family == fam) & (cell == d)
                self.cells.setdefault((fam, int(d)), []).append(measured_ms[m] / forecast_ms[m])

    def bands(self, protocol: str, level: float = LEVEL) -> ErrorBands:
        out = []
        for (fam, d), parts in sorted(self.cells.items()):
            r = np.concatenate(parts)
            if len(r) < MIN_ROWS or len(parts) < MIN_FOLDS:
                continue
            w = np.concatenate([np.full(len(x), 1.0 / len(x)) for x in parts])
            lo, hi = (weighted_quantile(r, w, q) for q in ((1 - level) / 2, (1 + level) / 2))
            out.append(Band(fam, d, lo, hi, len(r), len(parts)))
        return ErrorBands(level, tuple(out), protocol)


def load_bands(path: Path) -> ErrorBands:
    """Read and validate an ``error_bands.json``; a bad field is named."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(data, dict) or data.get("schema") != BANDS_SCHEMA:
        raise ConfigError(f"{path}: field 'schema' must be {BANDS_SCHEMA}")
    level = data.get("level")
    if not isinstance(level, int | float) or not 0 < level < 1:
        raise ConfigError(f"{path}: field 'level' must be a number between 0 and 1")
    if data.get("decade_edges_ms") != list(DECADE_EDGES_MS):
        raise ConfigError(f"{path}: field 'decade_edges_ms' must be {list(DECADE_EDGES_MS)} "
                          "(regenerate it with this tilecast)")
    bands = []
    for i, b in enumerate(data.get("bands") or []):
        where = f"{path}: bands[{i}]"
        if not isinstance(b, dict) or not isinstance(b.get("family"), str):
            raise ConfigError(f"{where}: field 'family' must be a string")
        if not isinstance(b.get("decade"), int) or not 0 <= b["decade"] <= len(DECADE_EDGES_MS):
            raise ConfigError(f"{where}: field 'decade' must be an integer from 0 to "
                              f"{len(DECADE_EDGES_MS)}")
        lo, hi = b.get("low"), b.get("high")
        if not all(isinstance(x, int | float) and x > 0 for x in (lo, hi)) or lo > hi:
            raise ConfigError(f"{where}: fields 'low' <= 'high' must be positive numbers")
        bands.append(Band(b["family"], b["decade"], float(lo), float(hi),
                          int(b.get("rows", 0)), int(b.get("folds", 0))))
    return ErrorBands(float(level), tuple(bands), str(data.get("protocol", "")))


def bands_beside(artifact: Path) -> ErrorBands | None:
    """The bands shipped beside a predictor file, or None when it has none."""
    path = artifact.parent / BANDS_NAME
    return load_bands(path) if path.is_file() else None


def band_arrays(bands: ErrorBands | None, families: np.ndarray, scored: np.ndarray,
                latency_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of each kernel's band, NaN where none applies (module doc): ``families``
    from ``kernel_families``, ``scored`` where the kernel's dtype and vendor were trained and
    its cost is no estimate, ``latency_ms`` its forecast."""
    low, high = np.full(len(families), np.nan), np.full(len(families), np.nan)
    if bands is None:
        return low, high
    d = decade(latency_ms)
    for fam in {b.family for b in bands.bands}:
        for cell in range(len(DECADE_EDGES_MS) + 1):
            m = scored & (families == fam) & (d == cell)
            if m.any():
                b = bands.cell(fam, cell)
                low[m], high[m] = b.low, b.high
    return low, high


def kernel_families(routed: Routed, n: int) -> np.ndarray:
    """The family whose model alone costed each of ``n`` kernels; None for a kernel costed in
    parts of several families, or by a rule rather than its own model (a reduction as a copy,
    a dtype by its byte width), which no fold scored."""
    parts, out = np.zeros(n, dtype=np.int64), np.full(n, None, dtype=object)
    own = {}
    for fam, p in routed.parts.items():
        np.add.at(parts, p.kernel, 1)
        own[fam] = np.zeros(n, dtype=np.int64)
        np.add.at(own[fam], p.kernel[~(p.fallback | p.bytewise)], 1)
    for fam, count in own.items():
        out[(count == parts) & (parts > 0)] = fam
    return out
