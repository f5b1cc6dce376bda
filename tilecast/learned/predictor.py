"""Serving: the learned predictor on onnxruntime only (no torch).

All kernels of a graph are predicted with ONE ``InferenceSession.run`` (every family's inputs
at once). How analyzer kernels map to the trained families is in ``routing.py`` and
``docs/predictor.md``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..analyzer.predictor import Prediction
from ..analyzer.types import Kernel
from ..device_db.device import MATRIX_DTYPES, Device
from ..errors import PredictorError
from . import conv as cv
from . import features as ft
from . import row_tiles as rt
from . import simt, tensor_core
from . import tiles as tl
from .bands import band_arrays, bands_beside, kernel_families
from .device_columns import uses_matrix_units
from .export import ARTIFACT_NAME, SCHEMA_VERSION, TERMS, io_names
from .form import Q_HOST
from .latency_walk import hold_to_walk
from .routing import ConvParts, Parts, Routed, route

ARTIFACT = Path(__file__).parent / "artifacts" / ARTIFACT_NAME
# Families an artifact may lack: without a conv model, convs take the matmul model's
# implicit-GEMM view (flagged as a fallback; ``routing.py``).
OPTIONAL_FAMILIES = ("conv",)
# A kernel counts as clamped when a utilization is within this factor of the envelope floor.
CLAMP_MARGIN = 1.05
# A feature within this fraction of its training span outside the range is not extrapolation.
RANGE_TOLERANCE = 0.02


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


def _metadata(session, path: Path, families: Collection[str] | None = None) -> dict[str, str]:
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
    required = set(ft.FEATURES) - set(OPTIONAL_FAMILIES) if families is None else set(families)
    for family, expected in ft.FEATURES.items():
        if family not in required and family not in names:
            continue
        if tuple(names.get(family, ())) != expected:
            raise PredictorError(f"{path}: its {family!r} features {names.get(family)} differ "
                                 f"from this tilecast's; regenerate it ({tl.REGENERATE})")
    meta["tile_table"] = table
    return meta


class OnnxPredictor:
    """The learned, tile-based utilization predictor (one ONNX file, onnxruntime)."""

    name = "tilecast-mlp"

    def __init__(self, path: Path | str | None = None,
                 families: Collection[str] | None = None) -> None:
        """``families``: those the artifact must hold (default: every one but the optional
        conv); a partial artifact, as a leave-one-GPU-out run of a few families trains,
        forecasts the kernels of its families and refuses the others."""
        path = Path(path) if path is not None else ARTIFACT
        self.path = path / ARTIFACT_NAME if path.is_dir() else path
        self.session = _session(self.path)
        meta = _metadata(self.session, self.path, families)
        self.tile_table = tl.parse_tile_table(meta.pop("tile_table"), str(self.path))
        self.metadata = meta
        self.trained_dtypes = set(json.loads(meta.get("training_dtypes", '["float32"]')))
        self.trained_vendors = set(json.loads(meta.get("training_vendors", '["nvidia"]')))
        self.u_floor = {k: float(v) for k, v in json.loads(meta["u_floor"]).items()}
        self.host_dispatch_ms = {k: tuple(v) for k, v
                                 in json.loads(meta["host_dispatch_ms"]).items()}
        self.ranges = {fam: (np.asarray(lo), np.asarray(hi)) for fam, (lo, hi)
                       in json.loads(meta["feature_ranges"]).items()}
        self.conv_model = "conv" in self.ranges  # else convs take the matmul model's view
        self.bands = bands_beside(self.path)  # leave-one-GPU-out error bands, if shipped
        self.band_level = self.bands.level if self.bands is not None else None

    def predict(self, kernels: Sequence[Kernel], device: Device) -> list[Prediction]:
        routed = _stream_weights(route(kernels, conv_model=self.conv_model), device)
        feats = {fam: self._features(fam, p, device) for fam, p in self._held(routed).items()}
        outs = self._run(feats)
        self._simt_ceiling(feats, outs, device)
        feats, outs = _fastest(feats, outs)
        return hold_to_walk(self._collect(kernels, routed, feats, outs, device), kernels,
                            device)

    def _held(self, routed: Routed) -> dict[str, Parts | ConvParts]:
        """The routed parts, each of a family this artifact holds; a kernel of another family
        is an error (only a partial artifact lacks one)."""
        for fam, p in routed.parts.items():
            if fam not in self.ranges and len(p.kernel):
                raise PredictorError(f"{self.path} holds no {fam!r} model (it was trained on "
                                     f"{', '.join(sorted(self.ranges))} only): cannot forecast "
                                     f"{len(set(p.kernel.tolist()))} {fam} kernel(s)")
        return {fam: p for fam, p in routed.parts.items() if fam in self.ranges}

    def _simt_ceiling(self, feats: dict, outs: dict[str, np.ndarray], device: Device) -> None:
        """fp32 SIMT GEMM and conv candidates held to the GPU's sourced sustained rate
        (``simt.py``), before the fastest candidate is picked: the ceiling depends on the
        candidate's waves (matmul) and FLOPs (a conv's algorithm)."""
        if device.fp32_sustained_fraction is None:
            return
        for fam in simt.FAMILIES:
            if fam in feats:
                f = feats[fam][0]
                simt.hold_to_sustained(f, outs, io_names(fam), device.fp32_sustained_fraction,
                                       self._host_ms(fam, f, device))

    def _run(self, feats: dict) -> dict[str, np.ndarray]:
        feed = {}
        for fam, (f, *_) in feats.items():
            io = io_names(fam)
            feed[io["features"]] = f.x
            for term in TERMS:
                feed[io[term]] = getattr(f, term).astype(np.float32)
        keys = ("latency_ms", "gpu_ms", "u_compute", "u_memory", "fixed_ms")
        names = [io_names(fam)[k] for fam in feats for k in keys]
        return dict(zip(names, self.session.run(names, feed), strict=True))

    def _collect(self, kernels, routed, feats, outs, device) -> list[Prediction]:
        n = len(kernels)
        acc = {k: np.zeros(n) for k in ("latency", "gpu", "compute", "memory", "fixed",
                                         "host", "layout")}
        clamped = np.zeros(n, dtype=bool)
        tiles = np.full(n, None, dtype=object)
        forward = np.array([k.phase == "forward" for k in kernels], dtype=bool)
        for fam, (f, tile) in feats.items():
            p, io = routed.parts[fam], io_names(fam)
            u_c, u_m = outs[io["u_compute"]], outs[io["u_memory"]]
            terms = self._terms(fam, f, p, outs, device, routed.conv[p.kernel],
                                forward[p.kernel])
            for key, values in terms.items():
                np.add.at(acc[key], p.kernel, values)
            # Held at the envelope: the utilization of the term that dominates the kernel's
            # work is at the floor, and that work outweighs the fixed costs.
            c_busy, m_busy = terms["compute"], terms["memory"]
            u_dom = np.where(c_busy >= m_busy, u_c, u_m)
            at_floor = (u_dom <= self.u_floor[fam] * CLAMP_MARGIN) & (
                np.maximum(c_busy, m_busy) >= outs[io["fixed_ms"]])
            np.logical_or.at(clamped, p.kernel, at_floor)
            tiles[p.kernel[p.primary]] = tile[p.primary]
        fixed = np.maximum(acc["fixed"], acc["latency"] - acc["gpu"] + acc["fixed"])
        # cuDNN's layout transposes stream bytes: they count with the memory term.
        bound = bounds(acc["compute"], acc["memory"] + acc["layout"], fixed)
        extrapolated = self._extrapolated(routed, feats, device)
        # The folds scored trained dtypes and vendors with real costs (bands.py).
        scored = ~routed.estimated & np.isin(routed.dtype, list(self.trained_dtypes)) & (
            device.vendor in self.trained_vendors)
        low, high = band_arrays(self.bands, kernel_families(routed, n), scored, acc["latency"])
        return [Prediction(latency_ms=lat, bound=b, tile=t, extrapolated=e, gpu_ms=g,
                           clamped=c, host_ms=h, fixed_ms=fx, layout_ms=lay,
                           band=None if lo != lo else (lo, hi))  # NaN: no band
                for lat, b, t, e, g, c, h, fx, lay, lo, hi in zip(
                    acc["latency"].tolist(), bound.tolist(), tiles.tolist(),
                    extrapolated.tolist(), acc["gpu"].tolist(), clamped.tolist(),
                    acc["host"].tolist(), acc["fixed"].tolist(), acc["layout"].tolist(),
                    low.tolist(), high.tolist(), strict=True)]

    def _terms(self, family: str, f: ft.Features, p: Parts | ConvParts,
               outs: dict[str, np.ndarray], device: Device, conv: np.ndarray,
               forward: np.ndarray) -> dict[str, np.ndarray]:
        """Per-part latency, GPU, compute, memory, fixed and host ms: the graph's outputs, and
        for matrix-unit rows with no data the sourced sustained rate (``tensor_core.py``).
        ``conv``: the part is a convolution (its host dispatch is the conv call's);
        ``forward``: the part is a forward kernel (the k-step floor's rows)."""
        io = io_names(family)
        u_c, u_m = outs[io["u_compute"]], outs[io["u_memory"]]
        terms = {"latency": outs[io["latency_ms"]].astype(np.float64),
                 "gpu": outs[io["gpu_ms"]].astype(np.float64),
                 "compute": f.compute_ms / u_c, "memory": (f.dram_ms + f.cached_ms) / u_m,
                 "fixed": outs[io["fixed_ms"]], "host": self._host_ms(family, f, device),
                 "layout": np.zeros(len(f.x))}
        self._conv_dispatch(family, conv, terms, device)
        tc = self._matrix_units(family, f, p, device)
        if tc is not None:
            moved = tensor_core.nchw_transpose_bytes(p, tc, conv[tc], device.vendor)
            stream, transposes = self._stream_and_transposes(f, p, tc, moved, device)
            slow = tensor_core.load_width_slowdown(p, tc, conv[tc])
            padding = tensor_core.group_tile_padding(p, tc, conv[tc])
            chain = np.where(forward[tc], tensor_core.k_chain_ms(p, tc, device, conv[tc]), 0.0)
            s = tensor_core.sustained(f, tc, device.matrix_sustained_fraction, stream,
                                      terms["fixed"], terms["host"], transposes, slow, padding,
                                      chain)
            for key, values in (("latency", s.latency_ms), ("gpu", s.gpu_ms),
                                ("compute", s.compute_ms), ("memory", s.memory_ms),
                                ("layout", transposes)):
                terms[key][tc] = values
        return terms

    def _stream_and_transposes(self, f: ft.Features, p: Parts, tc: np.ndarray,
                               moved: np.ndarray, device: Device,
                               ) -> tuple[np.ndarray, np.ndarray]:
        """Streaming times of the rows ``tc``: their GEMM's bytes, split between DRAM and the
        L2 as the features have them, and the layout transposes' ``moved`` bytes from DRAM
        (0 where none), in one call of the elementwise model."""
        dtype, itemsize = p.dtype[tc], p.itemsize[tc]
        has = moved > 0
        dram = np.concatenate([f.dram_ms[tc], moved[has] / device.mem_bandwidth_gbps * 1e-6])
        cached = np.concatenate([f.cached_ms[tc], np.zeros(int(has.sum()))])
        both = self._stream_ms(dram, cached, np.concatenate([dtype, dtype[has]]),
                               np.concatenate([itemsize, itemsize[has]]), device)
        n = len(dtype)
        transposes = np.zeros(n)
        transposes[has] = both[n:]
        return both[:n], tensor_core.transposes_ms(transposes, device)

    def _stream_ms(self, dram_ms: np.ndarray, cached_ms: np.ndarray, dtype: np.ndarray,
                   itemsize: np.ndarray, device: Device) -> np.ndarray:
        """The busy time of the device's streaming kernels for bytes that take ``dram_ms``
        from DRAM and ``cached_ms`` from the L2 at peak, per row (``tensor_core.py``): the
        elementwise model on a copy of as many bytes."""
        n = len(dram_ms)
        dc = ft.device_columns([device], np.zeros(n, dtype=np.int64), dtype,
                               np.full(n, "vector", dtype=object))
        elements = np.maximum((dram_ms + cached_ms) * 1e-3 * dc.bandwidth / (2.0 * itemsize),
                              1.0)
        zeros = np.zeros(n)
        kc = ft.KernelColumns(zeros, 2.0 * elements * itemsize, itemsize, elements, zeros,
                              zeros, zeros, zeros, zeros, zeros, zeros, zeros)
        copy = replace(ft.build_features("elementwise", kc, dc), dram_ms=dram_ms,
                       cached_ms=cached_ms)
        io = io_names("elementwise")
        outs = self._run({fam: (copy if fam == "elementwise" else _empty(fam),)
                          for fam in self.ranges})
        return (outs[io["gpu_ms"]] - outs[io["fixed_ms"]]).astype(np.float64)

    def _matrix_units(self, family: str, f: ft.Features, p: Parts | ConvParts,
                      device: Device) -> np.ndarray | None:
        """Rows of the matmul family on matrix units in a dtype with no training data, on a
        GPU with a sourced sustained fraction (``tensor_core.py``); None when there are none."""
        if family != "matmul" or not len(f.x):
            return None
        mask = self._sustained_rows(p, device)
        return mask if mask.any() else None

    def _sustained_rows(self, p: Parts | ConvParts, device: Device) -> np.ndarray:
        """``_matrix_units`` on the parts: rows in an untrained matrix dtype on a GPU with a
        sourced sustained fraction (all False where the GPU has none)."""
        mask = np.zeros(len(p.dtype), dtype=bool)
        if device.matrix_sustained_fraction is None:
            return mask
        untrained = {d for d in MATRIX_DTYPES if d not in self.trained_dtypes}
        for dtype, unit in set(zip(p.dtype.tolist(), p.unit.tolist(), strict=True)):
            if dtype in untrained and uses_matrix_units(device, dtype, unit):
                mask |= (p.dtype == dtype) & (p.unit == unit)
        return mask

    def _conv_dispatch(self, family: str, conv: np.ndarray, terms: dict[str, np.ndarray],
                       device: Device) -> None:
        """A convolution costed by another family's model (a TF32 / fp16 / bf16 conv on the
        matmul model's implicit-GEMM view, a grouped conv as a copy, a backward conv) is still
        one cuDNN call on the host: it takes the conv family's learned dispatch time, so the
        host floor of an eager pass does not change with the math mode."""
        if family == "conv" or "conv" not in self.host_dispatch_ms or not conv.any():
            return
        nvidia, amd = self.host_dispatch_ms["conv"]
        host = np.where(conv, amd if device.vendor == "amd" else nvidia, terms["host"])
        smooth = tensor_core.smooth_max(host, terms["gpu"], Q_HOST)
        terms["latency"] = np.where(conv, smooth, terms["latency"])
        terms["host"] = host

    def _host_ms(self, family: str, f: ft.Features, device: Device) -> np.ndarray:
        """The eager per-op dispatch time the model learned for the family and vendor."""
        nvidia, amd = self.host_dispatch_ms[family]
        return np.full(len(f.x), amd if device.vendor == "amd" else nvidia)

    def _features(self, family: str, p: Parts | ConvParts, device: Device,
                  ) -> tuple[ft.Features, np.ndarray, np.ndarray | None]:
        """The family's features and tile labels; for matmuls one row per candidate
        configuration (``TileTable.candidates``) and the part each row belongs to."""
        n = len(p.kernel)
        dc = ft.device_columns([device], np.zeros(n, dtype=np.int64), p.dtype, p.unit)
        if isinstance(p, ConvParts):  # one row per candidate algorithm; _fastest keeps one
            picks = cv.winograd_gemm_tiles(p.columns, self.tile_table, device.arch,
                                           device.sm_count)
            row, algo, tile = cv.candidates(p.columns, picks)
            cols = replace(cv.take(p.columns, row), algo=algo, gemm_tile=tile)
            dc = ft.device_columns([device], np.zeros(len(row), dtype=np.int64), p.dtype[row],
                                   p.unit[row])
            return ft.build_features("conv", cols, dc), cv.algorithm_strings(algo), row
        if family == "matmul" and n:
            return self._matmul_features(p, device, dc)
        zeros = np.zeros(n)
        kc = ft.KernelColumns(p.flops, p.bytes, p.itemsize, p.elements, p.b, p.m, p.n, p.k,
                              p.rows, p.cols, zeros, zeros, reread_bytes=p.reread,
                              reread_slice=p.reread_slice, reread_operand=p.reread_operand,
                              cold_bytes=p.weight)
        return ft.build_features(family, kc, dc), row_tile_strings(family, kc, dc.amd), None

    def _matmul_features(self, p: Parts, device: Device, dc: ft.DeviceColumns,
                         ) -> tuple[ft.Features, np.ndarray, np.ndarray]:
        row, tile, split = self.tile_table.candidates(device.arch, p.layout, p.b, p.m, p.n,
                                                      p.k, dc.sm_count)
        # cuBLAS SIMT kernels take the fastest candidate. Tensor-core kernels (none in the
        # data: cuBLAS's tile family) and Tensile's keep one pick per part: on the MI100 and
        # MI210, the candidates made held-out Linears worse (10.5 -> 11.8 %, 12.6 -> 15.3).
        # Below the batch dimensions Tensile was measured at, its tree's pick is no evidence,
        # so those take the fastest candidate too, the picks of the measured sizes among them.
        # Rows the sourced sustained rate costs (AMD 16-bit) keep one pick: the learned form
        # that ranks candidates is not what costs them.
        own = np.arange(len(row)) < len(p.kernel)
        below = self.tile_table.below_evidence(device.arch, p.layout, p.b, p.m)
        sustained = self._sustained_rows(p, device)
        ranked = (dc.amd == 0) | (below & ~sustained)  # per part: AMD only below the sizes
        keep = own | ((dc.tensor_core[row] == 0) & ranked[row])
        row, tile, split = row[keep], tile[keep], split[keep]
        # Those rows below the measured sizes take the tensor-core tile rule, as NVIDIA's do.
        guessed = (below & sustained)[row]
        p = _take(p, row)
        dc = ft.device_columns([device], np.zeros(len(row), dtype=np.int64), p.dtype, p.unit)
        tc = (dc.tensor_core > 0) | guessed
        if tc.any():
            tile[tc], split[tc] = tl.tensor_core_tiles(p.b[tc], p.m[tc], p.n[tc],
                                                       dc.sm_count[tc])
            # Past the ridge point, fewer tiles than SMs split the reduction to fill them:
            # cuBLAS's splitKreduce_kernel and cuDNN's ReduceSplitK follow such GEMMs in the
            # H100 traces. Below it the GEMM streams its bytes, which partials would only add to.
            few = tc & (p.flops / dc.peak_flops >= p.bytes / dc.bandwidth)
            split[few] = tl.filling_split(p.b[few], p.m[few], p.n[few], p.k[few],
                                          dc.sm_count[few], tile[few])
        fused = tc & p.fused
        if fused.any():  # a fused attention CTA: 128 queries of one head, all of dv
            tile[fused], split[fused] = tl.fused_attention_tiles(p.m[fused]), 1.0
        tm, tn = tl.split_tiles(tile)
        kc = ft.KernelColumns(p.flops, p.bytes, p.itemsize, p.elements, p.b, p.m, p.n, p.k,
                              p.rows, p.cols, tm, tn, split, (p.layout == "tn").astype(float),
                              cold_bytes=p.weight)
        return ft.build_features("matmul", kc, dc), tl.tile_labels(tile, split), row

    def _extrapolated(self, routed: Routed, feats: dict, device: Device) -> np.ndarray:
        """Outside what the models were trained on: a feature beyond its training range (by
        more than rounding), a dtype or vendor with no data, an estimated cost, a convolution
        the conv model does not cost (grouped and depthwise: the data is dense convs only)."""
        out = routed.estimated | ~np.isin(routed.dtype, list(self.trained_dtypes))
        by_conv_model = np.zeros(len(out), dtype=bool)
        conv = routed.parts.get("conv")
        if isinstance(conv, ConvParts):
            by_conv_model[conv.kernel] = True
        out |= routed.conv & ~by_conv_model
        if device.vendor not in self.trained_vendors:
            out[:] = True
        for fam, (f, _) in feats.items():
            lo, hi = self.ranges[fam]
            span = np.maximum(hi - lo, 1e-6) * RANGE_TOLERANCE
            outside = ((f.x < lo - span) | (f.x > hi + span)).any(axis=1)
            p = routed.parts[fam]
            np.logical_or.at(out, p.kernel, outside & ~p.bytewise)
        mm = routed.parts.get("matmul")
        if isinstance(mm, Parts) and len(mm.kernel):  # a tile the measured sizes never chose
            guessed = self.tile_table.below_evidence(device.arch, mm.layout, mm.b, mm.m)
            np.logical_or.at(out, mm.kernel, guessed)
        return out


# The families whose parts carry bytes read once per pass (``Parts.weight``): GEMM weights,
# and the state a memory-bound kernel reads (a decode step's KV cache).
PASS_STATE = ("matmul", "elementwise")


def _stream_weights(routed: Routed, device: Device) -> Routed:
    """Weights and pass state come from DRAM when the kernels predicted together (a pass)
    read more of them than the L2 holds: none is left for the next pass (analyzer/weights.py).
    Otherwise they stay resident, as in the kernel benchmarks (a lone GEMM predicted again
    and again)."""
    parts = {f: routed.parts[f] for f in PASS_STATE}
    if sum(float(p.weight.sum()) for p in parts.values()) > device.l2_cache_mb * 2**20:
        return routed
    return replace(routed, parts=routed.parts | {f: replace(p, weight=p.weight * 0)
                                                 for f, p in parts.items()})


def _empty(family: str) -> ft.Features:
    """No rows of ``family`` (the graph takes every family's inputs on each run)."""
    none = np.zeros(0)
    return ft.Features(family, np.zeros((0, len(ft.FEATURES[family])), dtype=np.float32),
                       *(none for _ in range(8)))


def _take(p: Parts, idx: np.ndarray) -> Parts:
    return Parts(*(getattr(p, f.name)[idx] for f in fields(Parts)))


def _fastest(feats: dict, outs: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """One row per part: of a matmul's candidate configurations the one with the least GPU
    time, of a conv's candidate algorithms and tiles the one with the least latency, as the
    conv protocol ranks them (``conv_data.fastest``); ties: the first, the trees' own pick or
    implicit precomp GEMM. Why latency for convs: the ensemble's latency and GPU time are
    medians taken apart, so at a near-tie under a host floor the least GPU time need not be
    the least latency, and a batch of 64 1 x 1 convs was forecast 0.15 % under a batch of 8
    (a hypothesis example): each candidate's latency never falls with N, so their minimum
    does not either."""
    feats, outs = dict(feats), dict(outs)
    for fam, (f, labels, group) in list(feats.items()):
        if group is None:
            feats[fam] = (f, labels)
            continue
        io = io_names(fam)
        rank = outs[io["latency_ms" if fam == "conv" else "gpu_ms"]]
        order = np.lexsort((np.arange(len(group)), rank, group))
        pick = order[np.searchsorted(group[order], np.arange(group.max(initial=-1) + 1))]
        feats[fam] = (f.select(pick), labels[pick])
        for key in ("latency_ms", "gpu_ms", "u_compute", "u_memory", "fixed_ms"):
            outs[io[key]] = outs[io[key]][pick]
    return feats, outs


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


def row_tile_strings(family: str, kc: ft.KernelColumns,
                     amd: np.ndarray | float = 0.0) -> np.ndarray:
    """Block shapes of row / elementwise kernels: "rows per block x threads per block"
    (elementwise: "threads x elements per thread"); ``amd``: 1 for ROCm launches
    (``DeviceColumns.amd``)."""
    if family == "elementwise":
        per = np.maximum(rt.VECTOR_BYTES // np.maximum(kc.itemsize, 1), 1)
        return _strings(np.full(len(per), rt.ELEMENTWISE_THREADS), per)
    if family == "softmax":
        _, rpb, threads = rt.softmax_tiles(kc.rows, kc.cols, kc.itemsize, amd)
    else:
        _, rpb, threads = rt.layernorm_tiles(kc.rows)
    return _strings(rpb, threads)


@lru_cache(maxsize=1)
def default_predictor() -> OnnxPredictor:
    """The shipped artifact, loaded once."""
    return OnnxPredictor(ARTIFACT)
