"""Text/JSON views of the device database for ``tilecast devices``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .device import Device
from .loader import list_devices, load_device


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def device_dict(d: Device) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    out["aliases"] = list(d.aliases)
    out["supported_dtypes"] = list(d.supported_dtypes)
    out["sources"] = dict(sorted(d.sources.items()))
    out.pop("source_file", None)
    return out


def render_devices(fmt: str = "table") -> str:
    devs = list_devices()
    if fmt == "json":
        return json.dumps([device_dict(d) for d in devs], indent=2) + "\n"
    # The name column fits the longest name plus two spaces, so no name runs into the vendor.
    w = max(len(d.name) for d in devs) + 2
    head = (f"{'name':<{w}}{'vendor':<8}{'arch':<11}{'SMs/CUs':>8}{'fp32 TF':>9}{'bf16 TF':>9}"
            f"{'GB/s':>7}{'mem GB':>8}  memory")
    rows = [f"{d.name:<{w}}{d.vendor:<8}{d.arch:<11}{d.sm_count:>8}{_num(d.peak_tflops_fp32):>9}"
            f"{_num(d.peak_tflops_bf16_matrix):>9}{d.mem_bandwidth_gbps:>7g}"
            f"{d.memory_gb:>8g}  {d.memory_type or '-'}" for d in devs]
    return "\n".join([head, *rows]) + f"\n{len(devs)} devices (TFLOP/s dense, boost clock)\n"


def render_fields(data: dict[str, Any], width: int) -> str:
    """``key  value`` lines (a nested object as k=v pairs, a list comma-joined), then the
    ``sources`` entry of ``data`` one per line: the table view of ``devices show`` and
    ``clusters show``."""
    data = dict(data)
    sources = data.pop("sources")
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={_num(v) if not isinstance(v, str) else v}"
                              for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        lines.append(f"{key:<{width}}{value}")
    lines += ["", "sources:"] + [f"  {k}: {v}" for k, v in sources.items()]
    return "\n".join(lines) + "\n"


def render_device(name: str, fmt: str = "table") -> str:
    data = device_dict(load_device(name))
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return render_fields(data, 26)
