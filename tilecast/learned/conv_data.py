"""Measured convolutions (``kernels/<vendor>/train/conv/<GPU>.csv``) -> conv family data.

One CSV row is one ``torch.nn.functional.conv2d`` call: columns ``B, Input_Channel,
Output_Channel, Kernel_Szie, Input_Size, Stride, Padding`` (square inputs and filters), its
``Latency`` in ms over the whole op (every kernel in ``Kernels``: transforms, transposes and
the GEMM), and the ';'-separated names of the kernels launched, from which the cuDNN
algorithm is read (``conv.classify_kernels``). ``latency_ms`` is the recorded latency less the
file's harness drift (``sweep_drift``: time the measuring loop added as the sweep went on);
``measured_ms`` is what the CSV says. ``tilecast collect`` adds ``Groups``,
``Channels_Last`` (0: NCHW, 1: NHWC) and ``dtype`` columns; rows with groups > 1 are not
modelled here (they are memory-bound, ``routing.py``).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from ..analyzer.types import DTYPE_SIZE
from . import conv as cv
from . import features as ft
from . import sweep_drift as sd
from . import tiles as tl
from .dataset import COLLECT_DTYPES
from .prepare import DeviceLookup, FamilyData, default_lookup, resolve_devices

HELDOUT_SHAPE_FRACTION = 0.2  # shapes whose hash falls here never train (any GPU)
_INT_COLS = {"n": "B", "c": "Input_Channel", "k": "Output_Channel", "r": "Kernel_Szie",
             "h": "Input_Size", "stride": "Stride", "pad": "Padding"}


@dataclass(frozen=True)
class ConvSamples:
    """Measured dense convolutions as parallel numpy columns."""

    device: np.ndarray  # str
    latency_ms: np.ndarray  # the kernel's: measured less the harness drift
    dtype: np.ndarray  # str, ONNX dtype names
    itemsize: np.ndarray
    n: np.ndarray  # float64 dims (ConvDims names)
    c: np.ndarray
    k: np.ndarray
    h: np.ndarray
    w: np.ndarray
    p: np.ndarray
    q: np.ndarray
    r: np.ndarray
    s: np.ndarray
    stride: np.ndarray
    pad: np.ndarray
    nhwc: np.ndarray  # bool
    algo: np.ndarray  # str: the algorithm the recorded kernel names show
    fused: np.ndarray  # (rows, 3): the fused Winograd block the names show (conv.fused_block)
    gemm_tile: np.ndarray  # (rows, 2): the nonfused Winograd SGEMM tile (conv.gemm_tile)
    kernels: np.ndarray  # str: the recorded names
    position: np.ndarray  # the row's place in its CSV: 0 first, 1 last (the measuring order)
    drift_ms: np.ndarray  # the harness drift taken out of latency_ms (sweep_drift)

    @property
    def measured_ms(self) -> np.ndarray:
        """The latency as the CSV recorded it."""
        return self.latency_ms + self.drift_ms

    def __len__(self) -> int:
        return len(self.latency_ms)

    def select(self, mask: np.ndarray) -> ConvSamples:
        return ConvSamples(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[ConvSamples]) -> ConvSamples:
        return ConvSamples(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                              for f in fields(ConvSamples)})

    def as_served(self) -> ConvSamples:
        """The rows as a forecast sees them: the shape, not the fused Winograd block that ran
        (every kernel family has ``conv.FUSED_DEFAULT``; docs/predictor.md, "Convolutions");
        the nonfused SGEMM tiles are the tile table's (``fastest``)."""
        return replace(self, fused=np.tile(np.asarray(cv.FUSED_DEFAULT, dtype=np.float64),
                                           (len(self), 1)))

    def gemm_tile_picks(self, lookup: DeviceLookup = default_lookup,
                        table: tl.TileTable | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(row, tile) pairs: the nonfused SGEMM tiles ``table`` (default: the shipped one)
        picks for each row on its GPU (``conv.winograd_gemm_tiles``)."""
        table = table or tl.load_tile_table()
        cc, rows, tiles = self.columns(), [], []
        for name in sorted(set(self.device.tolist())):
            idx = np.nonzero(self.device == name)[0]
            dev = lookup(name)
            row, tile = cv.winograd_gemm_tiles(cv.take(cc, idx), table, dev.arch, dev.sm_count)
            rows.append(idx[row])
            tiles.append(tile)
        return np.concatenate(rows), np.concatenate(tiles)

    def columns(self, algo: np.ndarray | None = None) -> cv.ConvColumns:
        return cv.ConvColumns(self.n, self.c, self.k, self.h, self.w, self.p, self.q, self.r,
                              self.s, self.stride, self.itemsize, self.dtype, self.nhwc, algo,
                              self.fused, gemm_tile=self.gemm_tile)


def _num(row: dict[str, str], key: str, default: float) -> float:
    value = (row.get(key) or "").strip()
    return float(value) if value else default


def _row(r: dict[str, str]) -> dict | None:
    if int(_num(r, "Groups", 1)) != 1:
        return None
    d = {key: _num(r, col, 1.0 if key in ("stride", "r") else 0.0)
         for key, col in _INT_COLS.items()}
    dil = _num(r, "Dilation", 1)
    d["w"], d["s"] = d["h"], d["r"]
    d["p"] = d["q"] = (d["h"] + 2 * d["pad"] - dil * (d["r"] - 1) - 1) // d["stride"] + 1
    if min(d["n"], d["c"], d["k"], d["p"]) < 1:
        return None
    raw = (r.get("Dtype") or r.get("dtype") or "float32").strip()
    dtype = COLLECT_DTYPES.get(raw, raw)
    kernels = r.get("Kernels") or r.get("Kernel Name") or ""
    return d | {"device": r["Device"].strip(), "latency_ms": float(r["Latency"]),
                "dtype": dtype, "itemsize": float(DTYPE_SIZE.get(dtype, 4)),
                "nhwc": _num(r, "Channels_Last", 0) == 1,
                "algo": cv.classify_kernels(kernels), "kernels": kernels,
                "fused": cv.fused_block(kernels), "gemm_tile": cv.gemm_tile(kernels)}


def read_conv_csv(path: Path, drift: bool = True) -> ConvSamples | None:
    """One conv CSV -> samples (grouped rows and rows without a latency are skipped), with the
    file's harness drift taken out of ``latency_ms`` unless ``drift`` is False."""
    cols: dict[str, list] = {f.name: [] for f in fields(ConvSamples)}
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    place = sd.positions(len(rows))
    for i, r in enumerate(rows):
        if (r.get("OPName") or "conv").strip() != "conv" or not r.get("Latency"):
            continue
        d = _row(r)
        if d is None:
            continue
        for key, value in (d | {"position": place[i], "drift_ms": 0.0}).items():
            cols[key].append(value)
    if not cols["device"]:
        return None
    out = {}
    for name, values in cols.items():
        kind = object if name in ("device", "dtype", "algo", "kernels") else (
            bool if name == "nhwc" else np.float64)
        out[name] = np.asarray(values, dtype=kind)
    s = ConvSamples(**out)
    return without_drift(s) if drift else s


def without_drift(s: ConvSamples) -> ConvSamples:
    """``s`` (one file's rows) with each GPU's harness drift taken out of ``latency_ms``."""
    drift = np.zeros(len(s))
    for gpu in set(s.device.tolist()):
        m = s.device == gpu
        drift[m] = file_drift(s.select(m))[0]
    return replace(s, latency_ms=s.measured_ms - drift, drift_ms=drift)


def file_drift(s: ConvSamples) -> tuple[np.ndarray, sd.DriftFit]:
    """The harness drift of one file's rows against a baseline per algorithm and dtype that
    knows the shape (log N, C, K, output size, filter size, stride) but not the position."""
    dims = np.column_stack([np.log2(np.maximum(v, 1.0)) for v in
                            (s.n, s.c, s.k, s.p, s.r, s.stride)])
    groups = np.array([f"{a}/{d}" for a, d in zip(s.algo, s.dtype, strict=True)], dtype=object)
    measured = s.measured_ms
    return sd.drift_ms(measured, sd.shape_baseline_ms(dims, groups, measured), s.position)


def conv_files(roots: Iterable[Path | str], vendor: str = "nvidia") -> list[Path]:
    out = []
    for root in roots:
        root = Path(root)
        base = root / "kernels" if (root / "kernels").is_dir() else root
        out += sorted((base / vendor / "train" / "conv").glob("*.csv"))
    return out


def load_conv(roots: Iterable[Path | str], vendors: Sequence[str] = ("nvidia",),
              ) -> ConvSamples | None:
    """Every measured dense conv under the roots, or None when there is none."""
    parts = [p for v in vendors for f in conv_files(roots, v)
             if (p := read_conv_csv(f)) is not None]
    return ConvSamples.concat(parts) if parts else None


def heldout_shapes(s: ConvSamples, fraction: float = HELDOUT_SHAPE_FRACTION) -> np.ndarray:
    """True for rows whose shape (dims, stride, pad, dtype) hashes into the held-out part:
    a shape is held out on every GPU at once, so no GPU ever trains on it."""
    out = np.zeros(len(s), dtype=bool)
    for i in range(len(s)):
        key = ",".join(str(v) for v in (s.n[i], s.c[i], s.k[i], s.h[i], s.r[i], s.stride[i],
                                         s.pad[i], s.dtype[i]))
        digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
        out[i] = digest / 2.0**64 < fraction
    return out


def device_arrays(s: ConvSamples, lookup: DeviceLookup) -> ft.DeviceColumns:
    """Device numbers per row (tensor-core dtypes on the matrix units)."""
    devices, which = resolve_devices(s.device, lookup)
    return ft.device_columns(devices, which, s.dtype, conv_units(s.dtype))


def conv_units(dtype: np.ndarray) -> np.ndarray:
    """"matrix" for the dtypes cuDNN runs on tensor cores, else "vector"."""
    matrix = np.array([d in cv.TC_CHANNEL_MULTIPLE for d in dtype], dtype=bool)
    return np.where(matrix, "matrix", "vector").astype(object)


def conv_family_data(s: ConvSamples, lookup: DeviceLookup = default_lookup,
                     algo: np.ndarray | None = None) -> FamilyData:
    """Conv features and latencies under ``algo`` (default: the recorded algorithms, what
    cuDNN ran; training always uses those)."""
    dc = device_arrays(s, lookup)
    algo = np.asarray(s.algo if algo is None else algo, dtype=object)
    f = ft.build_features("conv", s.columns(algo), dc)
    return FamilyData(f, s.latency_ms, s.device, np.full(len(s), "conv", dtype=object), algo)


def fastest(s: ConvSamples, predict_ms: Callable[[FamilyData], np.ndarray],
            lookup: DeviceLookup = default_lookup,
            table: tl.TileTable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(forecast ms, algorithm) per row: the fastest of the candidate algorithms cuDNN offers
    (``conv.candidates``), each forecast by ``predict_ms``; the serving rule
    (``predictor._fastest``), for the torch models of training and the protocol; ``table``
    picks the nonfused SGEMM tiles (``ConvSamples.as_served``)."""
    s = s.as_served()
    row, algo, tile = cv.candidates(s.columns(), s.gemm_tile_picks(lookup, table))
    ms = predict_ms(conv_family_data(replace(s.select(row), gemm_tile=tile), lookup, algo))
    best = np.full(len(s), np.inf)
    pick = np.full(len(s), "", dtype=object)
    for name in cv.CANDIDATES:  # in tie-break order: the first of equals stays
        mine = algo == name
        own = np.full(len(s), np.inf)  # the algorithm's fastest tile per row
        np.minimum.at(own, row[mine], ms[mine])
        better = own < best
        best[better], pick[better] = own[better], name
    return best, pick
