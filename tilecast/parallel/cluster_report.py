"""Text/JSON views of the cluster presets for ``tilecast clusters``."""

from __future__ import annotations

import json
from typing import Any

from ..device_db.report import render_fields
from .cluster import Cluster, Link, list_clusters, load_cluster


def _link_dict(link: Link) -> dict[str, Any]:
    return {"fabric": link.fabric, "generation": link.generation,
            "bandwidth_gbps": link.bandwidth_gbps, "busbw_fraction": link.busbw_fraction,
            "busbw_gbps": round(link.busbw_gbps, 3), "latency_us": link.latency_us}


def cluster_dict(c: Cluster) -> dict[str, Any]:
    return {"name": c.name, "description": c.description, "gpu": c.device.name,
            "gpus_per_node": c.gpus_per_node, "intra_node": _link_dict(c.intra),
            "inter_node": _link_dict(c.inter), "sources": dict(sorted(c.sources.items())),
            "source_file": c.source_file}


def _link_text(link: Link) -> str:
    measured = (f" (NCCL {link.busbw_gbps:g})" if link.busbw_fraction != 1.0 else "")
    return f"{link.fabric} {link.bandwidth_gbps:g}{measured}"


def render_clusters(fmt: str = "table") -> str:
    clusters = list_clusters()
    if fmt == "json":
        return json.dumps([cluster_dict(c) for c in clusters], indent=2) + "\n"
    wn = max(len("name"), *(len(c.name) for c in clusters)) + 2
    wg = max(len("gpu"), *(len(c.device.name) for c in clusters)) + 2
    wi = max(len("intra-node GB/s"), *(len(_link_text(c.intra)) for c in clusters)) + 2
    head = f"{'name':<{wn}}{'gpu':<{wg}}{'gpus/node':>9}  {'intra-node GB/s':<{wi}}inter-node GB/s"
    rows = [f"{c.name:<{wn}}{c.device.name:<{wg}}{c.gpus_per_node:>9}  "
            f"{_link_text(c.intra):<{wi}}{_link_text(c.inter)}" for c in clusters]
    return "\n".join([head, *rows]) + (
        f"\n{len(clusters)} presets (GB/s per GPU per direction; NCCL: the bus bandwidth its "
        "collectives sustain, where measured)\n")


def render_cluster(name: str, fmt: str = "table") -> str:
    data = cluster_dict(load_cluster(name))
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return render_fields(data, 16)
