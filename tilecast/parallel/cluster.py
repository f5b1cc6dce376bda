"""Cluster descriptions: GPUs per node, the intra-node fabric and the inter-node network.

A cluster describes one node type and its network; the layout's GPU count sets how many nodes
are used. JSON files are validated where they are read, like the device JSONs: every field is
checked and an error names the file and the bad field. Every number needs a source, except
link bandwidths left ``null``, which come from the device database (NVLink, xGMI, PCIe gen).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..device_db import Device, load_device
from ..errors import ConfigError, DeviceError

CLUSTERS_DIR = Path(__file__).with_name("clusters")
INTRA_FABRICS = ("nvswitch", "nvlink", "xgmi", "pcie")
INTER_FABRICS = ("infiniband", "roce", "ethernet", "none")
# PCIe x16 bandwidth per direction by generation, GB/s (PCI-SIG specifications: 8, 16, 32 GT/s
# per lane with 128b/130b encoding; x16 gives 15.75, 31.5, 63 GB/s).
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
_CLUSTER_KEYS = ("name", "description", "gpu", "gpus_per_node", "intra_node", "inter_node",
                 "sources")
_LINK_KEYS = ("fabric", "generation", "bandwidth_gbps", "latency_us")
_LINK_OPTIONAL = ("busbw_fraction",)
# A collective cannot sustain more than its link's rate; in-switch reduction (NVLink SHARP)
# reports a bus bandwidth above it, which the ring model here does not describe.
MAX_BUSBW_FRACTION = 1.0


@dataclass(frozen=True)
class Link:
    """One level of the network, per GPU: GB/s per direction and the per-hop latency."""

    fabric: str
    generation: str
    bandwidth_gbps: float  # GB/s per GPU per direction
    latency_us: float  # per hop (one ring step)
    # Share of ``bandwidth_gbps`` NCCL's collectives sustain on large messages (nccl-tests
    # bus bandwidth / link rate); 1.0 where no measurement is given.
    busbw_fraction: float = 1.0

    @property
    def busbw_gbps(self) -> float:
        return self.bandwidth_gbps * self.busbw_fraction


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    device: Device
    gpus_per_node: int
    intra: Link
    inter: Link
    sources: Mapping[str, str] = field(default_factory=dict)
    source_file: str = ""

    def nodes_for(self, gpus: int) -> int:
        return math.ceil(gpus / self.gpus_per_node)


def _err(origin: str, path: str, message: str) -> ConfigError:
    return ConfigError(f"cluster JSON {origin}: field '{path}' {message}")


def _positive(value: Any, path: str, origin: str, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        what = "an integer" if integer else "a number"
        raise _err(origin, path, f"must be {what}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _err(origin, path, f"must be a positive number, got {value!r}")
    return value


def _text(obj: Mapping[str, Any], key: str, path: str, origin: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _err(origin, path, f"must be a non-empty string, got {value!r}")
    return value


def _check_keys(obj: Any, keys: tuple[str, ...], prefix: str, origin: str,
                optional: tuple[str, ...] = ()) -> None:
    if not isinstance(obj, Mapping):
        raise _err(origin, prefix.rstrip(".") or "<top level>", "must be a JSON object")
    for key in obj:
        if key not in keys + optional:
            raise _err(origin, prefix + key,
                       f"is not a known field (known: {', '.join(keys + optional)})")
    for key in keys:
        if key not in obj:
            raise _err(origin, prefix + key, "is missing")


def device_link_gbps(device: Device, fabric: str) -> float | None:
    """GB/s per direction of ``device``'s own link for ``fabric``, from the device database
    (NVLink and xGMI figures there are totals over both directions)."""
    ic = device.interconnect
    if fabric in ("nvswitch", "nvlink") and ic.nvlink_gbps:
        return ic.nvlink_gbps / 2
    if fabric == "xgmi" and ic.xgmi_gbps:
        return ic.xgmi_gbps / 2
    if fabric == "pcie" and ic.pcie_gen in PCIE_X16_GBPS:
        return PCIE_X16_GBPS[ic.pcie_gen]
    return None


def _link(obj: Any, key: str, fabrics: tuple[str, ...], device: Device, sources: Mapping,
          origin: str) -> Link:
    _check_keys(obj, _LINK_KEYS, f"{key}.", origin, _LINK_OPTIONAL)
    fabric = _text(obj, "fabric", f"{key}.fabric", origin)
    if fabric not in fabrics:
        raise _err(origin, f"{key}.fabric", f"must be one of {', '.join(fabrics)}, got "
                                            f"{fabric!r}")
    bw = obj["bandwidth_gbps"]
    if bw is None:
        bw = device_link_gbps(device, fabric)
        if bw is None:
            raise _err(origin, f"{key}.bandwidth_gbps", f"is null but the device database has "
                       f"no {fabric} bandwidth for {device.name}: give the number")
    else:
        bw = _positive(bw, f"{key}.bandwidth_gbps", origin)
        _need_source(sources, f"{key}.bandwidth_gbps", origin)
    latency = _positive(obj["latency_us"], f"{key}.latency_us", origin)
    _need_source(sources, f"{key}.latency_us", origin)
    fraction = 1.0
    if obj.get("busbw_fraction") is not None:
        fraction = _positive(obj["busbw_fraction"], f"{key}.busbw_fraction", origin)
        if fraction > MAX_BUSBW_FRACTION:
            raise _err(origin, f"{key}.busbw_fraction", f"must be at most "
                       f"{MAX_BUSBW_FRACTION} (a share of the link rate), got {fraction!r}")
        _need_source(sources, f"{key}.busbw_fraction", origin)
    return Link(fabric, _text(obj, "generation", f"{key}.generation", origin), float(bw),
                float(latency), float(fraction))


def _need_source(sources: Mapping, path: str, origin: str) -> None:
    text = sources.get(path)
    if not isinstance(text, str) or not text.strip():
        raise _err(origin, path, "has no entry in 'sources' (say where it comes from)")


def parse_cluster(obj: Any, origin: str = "<dict>") -> Cluster:
    """Validate a cluster mapping (as read from JSON) and build the :class:`Cluster`."""
    _check_keys(obj, _CLUSTER_KEYS, "", origin)
    sources = obj["sources"]
    if not isinstance(sources, Mapping):
        raise _err(origin, "sources", "must be an object mapping field names to sources")
    try:
        device = load_device(_text(obj, "gpu", "gpu", origin))
    except DeviceError as exc:
        raise _err(origin, "gpu", f"names no known device ({exc})") from None
    gpn = int(_positive(obj["gpus_per_node"], "gpus_per_node", origin, integer=True))
    _need_source(sources, "gpus_per_node", origin)
    return Cluster(
        name=_text(obj, "name", "name", origin),
        description=_text(obj, "description", "description", origin), device=device,
        gpus_per_node=gpn,
        intra=_link(obj["intra_node"], "intra_node", INTRA_FABRICS, device, sources, origin),
        inter=_link(obj["inter_node"], "inter_node", INTER_FABRICS, device, sources, origin),
        sources=dict(sources), source_file=origin)


def load_cluster_file(path: str | Path) -> Cluster:
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cluster JSON {path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cluster JSON {path}: invalid JSON at line {exc.lineno}: "
                          f"{exc.msg}") from None
    return parse_cluster(obj, str(path))


def list_clusters() -> list[Cluster]:
    """The shipped presets, sorted by name."""
    return sorted((load_cluster_file(p) for p in CLUSTERS_DIR.glob("*.json")),
                  key=lambda c: c.name)


def load_cluster(name_or_path: str | Path | Cluster) -> Cluster:
    """A :class:`Cluster` from itself, a JSON path, or a preset name (dgx-a100, dgx-h100, ...)."""
    if isinstance(name_or_path, Cluster):
        return name_or_path
    text = str(name_or_path)
    if text.endswith(".json") or Path(text).is_file():
        return load_cluster_file(text)
    presets = {c.name: c for c in list_clusters()}
    if text.lower() in presets:
        return presets[text.lower()]
    raise ConfigError(f"unknown cluster {text!r}: presets are {', '.join(sorted(presets))} "
                      "(or give the path of a cluster JSON)")


def cluster_for_device(device: Device) -> Cluster:
    """The first preset (by name) whose nodes hold ``device``, e.g. the nodes the shared
    labels' 4-GPU runs ran on."""
    for c in list_clusters():
        if c.device.name == device.name:
            return c
    raise ConfigError(f"no cluster preset uses {device.name}: pass --cluster with a preset "
                      "name or a cluster JSON")
