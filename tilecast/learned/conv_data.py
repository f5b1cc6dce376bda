"""Measured convolutions (``kernels/<vendor>/train/conv/<GPU>.csv``) -> conv family data.

One CSV row is one ``torch.nn.functional.conv2d`` call: columns ``B, Input_Channel,
Output_Channel, Kernel_Szie, Input_Size, Stride, Padding`` (square inputs and filters), its
``Latency`` in ms over the whole op (every kernel in ``Kernels``: transforms, transposes and
the GEMM), and the ';'-separated names of the kernels launched, from which the cuDNN
algorithm is read (``conv.classify_kernels``). ``tilecast collect`` adds ``Groups``,
``Channels_Last`` (0: NCHW, 1: NHWC) and ``dtype`` columns; rows with groups > 1 are not
modelled here (they are memory-bound, ``routing.py``).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..analyzer.types import DTYPE_SIZE
from . import conv as cv
from . import features as ft
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
    latency_ms: np.ndarray
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
    kernels: np.ndarray  # str: the recorded names

    def __len__(self) -> int:
        return len(self.latency_ms)

    def select(self, mask: np.ndarray) -> ConvSamples:
        return ConvSamples(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[ConvSamples]) -> ConvSamples:
        return ConvSamples(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                              for f in fields(ConvSamples)})

    def columns(self, algo: np.ndarray | None = None) -> cv.ConvColumns:
        return cv.ConvColumns(self.n, self.c, self.k, self.h, self.w, self.p, self.q, self.r,
                              self.s, self.stride, self.itemsize, self.dtype, self.nhwc, algo)


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
                "algo": cv.classify_kernels(kernels), "kernels": kernels}


def read_conv_csv(path: Path) -> ConvSamples | None:
    """One conv CSV -> samples (grouped rows and rows without a latency are skipped)."""
    cols: dict[str, list] = {f.name: [] for f in fields(ConvSamples)}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if (r.get("OPName") or "conv").strip() != "conv" or not r.get("Latency"):
                continue
            d = _row(r)
            if d is None:
                continue
            for key, value in d.items():
                cols[key].append(value)
    if not cols["device"]:
        return None
    out = {}
    for name, values in cols.items():
        kind = object if name in ("device", "dtype", "algo", "kernels") else (
            bool if name == "nhwc" else np.float64)
        out[name] = np.asarray(values, dtype=kind)
    return ConvSamples(**out)


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


def fit_algorithm_tree(s: ConvSamples, lookup: DeviceLookup = default_lookup,
                       seed: int = 0) -> tl.TileTree:
    """A decision tree from the recorded algorithms (features: dims, taps, stride, SMs,
    compute capability): the serving rule for the algorithm cuDNN picks."""
    from sklearn.tree import DecisionTreeClassifier

    dc = device_arrays(s, lookup)
    x = cv.tree_features(s.columns(), dc.sm_count, dc.arch)
    names = tuple(cv.ALGORITHMS)
    y = np.array([names.index(a) for a in s.algo])
    clf = DecisionTreeClassifier(max_depth=10, min_samples_leaf=10, random_state=seed)
    clf.fit(x, y)
    t = clf.tree_
    leaf = t.value[:, 0, :].argmax(axis=1)
    return tl.TileTree(np.where(t.children_left >= 0, t.feature, -1).astype(np.int64),
                       t.threshold.astype(np.float64), t.children_left.astype(np.int64),
                       t.children_right.astype(np.int64),
                       clf.classes_[leaf].astype(np.int64), names)


def conv_family_data(s: ConvSamples, tree: tl.TileTree | None,
                     lookup: DeviceLookup = default_lookup) -> FamilyData:
    """Conv features and latencies; algorithms from ``tree`` (the serving rule) or, when
    ``tree`` is None, the recorded ones (what cuDNN ran)."""
    dc = device_arrays(s, lookup)
    algo = s.algo if tree is None else cv.select_algorithms(tree, s.columns(), dc.sm_count,
                                                            dc.arch)
    f = ft.build_features("conv", s.columns(np.asarray(algo, dtype=object)), dc)
    return FamilyData(f, s.latency_ms, s.device, np.full(len(s), "conv", dtype=object),
                      np.asarray(algo, dtype=object))
