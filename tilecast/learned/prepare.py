"""Measured samples -> (features, latency) per family, for training and evaluation.

Serving builds the same ``KernelColumns`` from analyzer kernels (``predictor.py``); both go
through ``features.build_features``, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..device_db.device import Device
from . import features as ft
from . import tiles as tl
from .dataset import KernelSamples

DeviceLookup = Callable[[str], Device]
# "conv" trains from its own CSVs (conv_train.py), on every GPU that has them.
TRAINED_FAMILIES = ("matmul", "elementwise", "softmax", "layernorm", "conv")
# GPUs of the training split (the paper's): only these rows train, whatever the folders hold.
TRAIN_DEVICES = ("Tesla P4", "Tesla P100-PCIE-16GB", "Tesla T4", "Tesla V100-PCIE-32GB",
                 "NVIDIA A100-PCIE-40GB", "AMD Instinct MI100", "AMD Instinct MI210")
TRAIN_VENDORS = ("nvidia", "amd")


def default_lookup(name: str) -> Device:
    from ..device_db.loader import load_device

    return load_device(name)


@dataclass(frozen=True)
class FamilyData:
    """One family's rows: features, measured latency, and which GPU each row ran on."""

    features: ft.Features
    latency_ms: np.ndarray
    device: np.ndarray  # str, the CSV's Device column
    op: np.ndarray  # str, the CSV's OPName
    tile: np.ndarray  # str, the tile the features used

    def select(self, mask: np.ndarray) -> FamilyData:
        return FamilyData(self.features.select(mask), self.latency_ms[mask], self.device[mask],
                          self.op[mask], self.tile[mask])


def resolve_devices(names: np.ndarray, lookup: DeviceLookup) -> tuple[list[Device], np.ndarray]:
    """Unique devices and each row's index into them."""
    unique = sorted(set(names.tolist()))
    return [lookup(n) for n in unique], np.searchsorted(np.array(unique, dtype=object), names)


def matmul_tree_inputs(s: KernelSamples, devices: list[Device],
                       which: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kernel family per row, layout per row, tree features) of matmul samples."""
    fam = np.array([tl.ARCH_FAMILY.get(devices[i].arch, "ampere") for i in which],
                   dtype=object)
    layout = np.where(s.op == "linear", "tn", "nn").astype(object)
    sms = np.array([devices[i].sm_count for i in which], dtype=np.float64)
    return fam, layout, tl.tree_features(s.b, s.m, s.n, s.k, sms)


def measured_tiles(s: KernelSamples) -> np.ndarray:
    """The output tile each sample's kernel ran with, from its name (``ampere_sgemm_128x64_tn``
    -> "128x64"); "128x128" where the name carries none (0.4 % of the rows)."""
    out = []
    for name in s.kernel_name:
        tile = tl.parse_tile(name)
        out.append(f"{tile[0]}x{tile[1]}" if tile else "128x128")
    return np.array(out, dtype=object)


def fit_tiles(s: KernelSamples, lookup: DeviceLookup = default_lookup) -> tl.TileTable:
    """The tile table from the matmul rows of ``s`` (their measured tiles)."""
    s = s.select(s.family == "matmul")
    devices, which = resolve_devices(s.device, lookup)
    fam, layout, x = matmul_tree_inputs(s, devices, which)
    tiles = measured_tiles(s)
    observed: dict[str, dict[str, int]] = {}
    for dev, op, tile in zip(s.device, s.op, tiles, strict=True):
        counts = observed.setdefault(f"{dev}/{op}", {})
        counts[tile] = counts.get(tile, 0) + 1
    return tl.fit_tile_table(fam, layout, x, tiles, s.split_k.astype(np.float64), observed)


def family_data(s: KernelSamples, family: str, table: tl.TileTable | None = None,
                lookup: DeviceLookup = default_lookup) -> FamilyData:
    """Features of one family's samples. Matmul tiles and split-K come from the kernel names
    and grids (what cuBLAS ran: training) or, given a ``table``, from its trees (the serving
    rule: evaluation of what users get)."""
    s = s.select(s.family == family)
    devices, which = resolve_devices(s.device, lookup)
    n = len(s)
    tm, tn, split = np.zeros(n), np.zeros(n), np.ones(n)
    tile = np.full(n, "", dtype=object)
    if family == "matmul":
        if table is None:
            tile, split = measured_tiles(s), s.split_k.astype(np.float64)
        else:
            fam, layout, x = matmul_tree_inputs(s, devices, which)
            for i, dev in enumerate(devices):
                mask = which == i
                tile[mask], split[mask] = table.select(dev.arch, layout[mask], x[mask])
        tm, tn = tl.split_tiles(tile)
    units = np.full(n, "matrix" if family == "matmul" else "vector", dtype=object)
    dc = ft.device_columns(devices, which, s.dtype, units)
    f = np.float64
    kc = ft.KernelColumns(s.flops.astype(f), s.bytes.astype(f), s.itemsize.astype(f),
                          s.elements.astype(f), s.b.astype(f), s.m.astype(f), s.n.astype(f),
                          s.k.astype(f), s.rows.astype(f), s.cols.astype(f), tm, tn, split,
                          (s.op == "linear").astype(f))
    return FamilyData(ft.build_features(family, kc, dc), s.latency_ms, s.device, s.op, tile)
