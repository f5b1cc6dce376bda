"""Serving: the learned predictor on onnxruntime only (no torch).

All kernels of a graph are predicted with ONE ``InferenceSession.run`` (every family's inputs
at once). How analyzer kernels map to the trained families is in ``routing.py`` and
``docs/predictor.md``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..analyzer.predictor import Prediction
from ..analyzer.types import Kernel
from ..device_db.device import Device
from ..errors import PredictorError
from . import conv as cv
from . import features as ft
from . import tiles as tl
from .export import ARTIFACT_NAME, SCHEMA_VERSION, io_names
from .routing import ConvParts, Parts, Routed, route

# Families every artifact has; "conv" is optional (an artifact without it serves convs through
# the matmul model on their implicit-GEMM view, flagged as a fallback).
REQUIRED_FAMILIES = ("matmul", "elementwise", "softmax", "layernorm")

ARTIFACT = Path(__file__).parent / "artifacts" / ARTIFACT_NAME


def _session(path: Path):
    import onnxruntime as ort

    if not path.is_file():
        raise PredictorError(f"learned predictor file {path} does not exist")
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # tiny MLPs: threads cost more than they save
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # truncated or not ONNX
        raise PredictorError(f"cannot load the learned predictor {path}: {exc}") from exc


def _metadata(session, path: Path) -> dict[str, str]:
    meta = dict(session.get_modelmeta().custom_metadata_map)
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise PredictorError(
            f"{path} has predictor schema version {meta.get('schema_version')!r}; this tilecast "
            f"reads version {SCHEMA_VERSION!r}: regenerate it ({tl.REGENERATE})")
    try:
        names = json.loads(meta["feature_names"])
        table = json.loads(meta["tile_table"])
    except (KeyError, ValueError) as exc:
        raise PredictorError(f"{path}: metadata lacks a valid {exc}") from exc
    for family in dict.fromkeys((*REQUIRED_FAMILIES, *names)):
        if tuple(names.get(family, ())) != ft.FEATURES.get(family):
            raise PredictorError(f"{path}: its {family!r} features {names.get(family)} differ "
                                 f"from this tilecast's; regenerate it ({tl.REGENERATE})")
    meta["tile_table"] = table
    return meta


class OnnxPredictor:
    """The learned, tile-based utilization predictor (one ONNX file, onnxruntime)."""

    name = "tilecast-mlp"

    def __init__(self, path: Path | str | None = None) -> None:
        path = Path(path) if path is not None else ARTIFACT
        self.path = path / ARTIFACT_NAME if path.is_dir() else path
        self.session = _session(self.path)
        meta = _metadata(self.session, self.path)
        self.tile_table = tl.parse_tile_table(meta.pop("tile_table"), str(self.path))
        self.metadata = meta
        self.trained_dtypes = set(json.loads(meta.get("training_dtypes", '["float32"]')))
        self.trained_vendors = set(json.loads(meta.get("training_vendors", '["nvidia"]')))
        self.conv = _conv_metadata(meta, str(self.path))

    def predict(self, kernels: Sequence[Kernel], device: Device) -> list[Prediction]:
        routed = route(kernels, conv_model=self.conv is not None)
        feats = {fam: self._conv_features(p, device) if isinstance(p, ConvParts)
                 else self._features(fam, p, device) for fam, p in routed.parts.items()}
        feed = {}
        for fam, (f, _) in feats.items():
            io = io_names(fam)
            feed[io["features"]] = f.x
            feed[io["work_ms"]] = f.work_ms.astype(np.float32)
            feed[io["launch_ms"]] = f.launch_ms.astype(np.float32)
        names = [io_names(fam)[k] for fam in feats for k in ("latency_ms", "fixed_ms")]
        outs = dict(zip(names, self.session.run(names, feed), strict=True))
        n = len(kernels)
        acc = {k: np.zeros(n) for k in ("latency", "compute", "memory", "fixed")}
        tiles = np.full(n, None, dtype=object)
        for fam, (f, tile) in feats.items():
            p, io = routed.parts[fam], io_names(fam)
            for key, values in (("latency", outs[io["latency_ms"]]), ("compute", f.compute_ms),
                                ("memory", f.memory_ms), ("fixed", outs[io["fixed_ms"]])):
                np.add.at(acc[key], p.kernel, values)
            tiles[p.kernel[p.primary]] = tile[p.primary]
        bound = bounds(acc["compute"], acc["memory"], acc["fixed"])
        extrapolated = self._extrapolated(routed, device, feats)
        return list(map(Prediction, acc["latency"].tolist(), bound.tolist(), tiles.tolist(),
                        extrapolated.tolist()))

    def _features(self, family: str, p: Parts, device: Device) -> tuple[ft.Features, np.ndarray]:
        n = len(p.kernel)
        dc = ft.device_columns([device], np.zeros(n, dtype=np.int64), p.dtype, p.unit)
        tm, tn, split = np.zeros(n), np.zeros(n), np.ones(n)
        tile = np.empty(0, dtype=object)
        if family == "matmul" and n:
            x = tl.tree_features(p.b, p.m, p.n, p.k, dc.sm_count)
            tile, split = self.tile_table.select(device.arch, p.layout, x)
            tm, tn = tl.split_tiles(tile)
        kc = ft.KernelColumns(p.flops, p.bytes, p.itemsize, p.elements, p.b, p.m, p.n, p.k,
                              p.rows, p.cols, tm, tn, split)
        f = ft.build_features(family, kc, dc)
        tile = tl.tile_labels(tile, split) if family == "matmul" else row_tile_strings(family, kc)
        return f, tile

    def _conv_features(self, p: ConvParts, device: Device) -> tuple[ft.Features, np.ndarray]:
        n = len(p.kernel)
        units = np.full(n, "vector", dtype=object)
        units[np.isin(p.dtype, list(cv.TC_CHANNEL_MULTIPLE))] = "matrix"
        dc = ft.device_columns([device], np.zeros(n, dtype=np.int64), p.dtype, units)
        tree, _ = self.conv  # type: ignore[misc]
        algo = cv.select_algorithms(tree, p.columns, dc)
        power = cv.power_columns([device], np.zeros(n, dtype=np.int64))
        return cv.conv_features(p.columns, dc, algo, power), cv.algorithm_strings(algo)

    def _extrapolated(self, routed: Routed, device: Device,
                      feats: dict[str, tuple[ft.Features, np.ndarray]] | None = None,
                      ) -> np.ndarray:
        """Outside what the models were trained and validated on."""
        out = routed.estimated | ~np.isin(routed.dtype, list(self.trained_dtypes))
        if device.vendor not in self.trained_vendors:
            out[:] = True
        for p in routed.parts.values():
            out[p.kernel[p.fallback]] = True
        if self.conv is not None and feats is not None and "conv" in feats:
            _, (lo, hi) = self.conv
            x = feats["conv"][0].x
            outside = ((x < lo - 1e-3) | (x > hi + 1e-3)).any(axis=1)
            out[routed.parts["conv"].kernel[outside]] = True
        return out


def _conv_metadata(meta: dict[str, str], origin: str,
                   ) -> tuple[tl.TileTree, tuple[np.ndarray, np.ndarray]] | None:
    """(algorithm tree, (lo, hi) training range of the conv features), or None when the
    artifact has no conv family."""
    if "conv" not in json.loads(meta.get("families", "[]")):
        return None
    try:
        tree = tl.TileTree.from_json(json.loads(meta["conv_algorithm_tree"]))
        rng = json.loads(meta["conv_feature_range"])
        lo = np.array(rng["lo"], dtype=np.float32)
        hi = np.array(rng["hi"], dtype=np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise PredictorError(f"{origin}: conv metadata lacks a valid {exc}; regenerate it "
                             f"({tl.REGENERATE})") from exc
    return tree, (lo, hi)


def bounds(compute_ms: np.ndarray, memory_ms: np.ndarray, fixed_ms: np.ndarray) -> np.ndarray:
    """``classify_bound`` vectorized: "overhead" when the fixed part exceeds both terms."""
    out = np.where(compute_ms >= memory_ms, "compute", "memory").astype(object)
    out[fixed_ms >= np.maximum(compute_ms, memory_ms)] = "overhead"
    return out


def _strings(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """"AxB" for integer pairs, formatting each distinct pair once."""
    if not len(a):
        return np.empty(0, dtype=object)
    code = np.asarray(a, dtype=np.int64) * (1 << 32) + np.asarray(b, dtype=np.int64)
    uniq, inverse = np.unique(code, return_inverse=True)
    names = np.array([f"{x >> 32}x{x & 0xFFFFFFFF}" for x in uniq.tolist()], dtype=object)
    return names[inverse.reshape(-1)]


def row_tile_strings(family: str, kc: ft.KernelColumns) -> np.ndarray:
    """Block shapes of row / elementwise kernels: "rows per block x threads per block"
    (elementwise: "threads x elements per thread")."""
    if family == "elementwise":
        per = np.maximum(tl.VECTOR_BYTES // np.maximum(kc.itemsize, 1), 1)
        return _strings(np.full(len(per), tl.ELEMENTWISE_THREADS), per)
    if family == "softmax":
        _, rpb, threads = tl.softmax_tiles(kc.rows, kc.cols, kc.itemsize)
    else:
        _, rpb, threads = tl.layernorm_tiles(kc.rows)
    return _strings(rpb, threads)


@lru_cache(maxsize=1)
def default_predictor() -> OnnxPredictor:
    """The shipped artifact, loaded once."""
    return OnnxPredictor(ARTIFACT)
