"""GPU descriptions: the :class:`Device` value, its loader, and the shipped database (``gpus/``)."""

from __future__ import annotations

from .device import MATRIX_DTYPES, Device, Interconnect
from .loader import (
    list_devices,
    load_device,
    load_device_file,
    lowest_dram_latency_ns,
    lowest_l2_latency_ns,
    parse_device,
    resolve_name,
)

__all__ = [
    "MATRIX_DTYPES",
    "Device",
    "Interconnect",
    "list_devices",
    "load_device",
    "load_device_file",
    "lowest_dram_latency_ns",
    "lowest_l2_latency_ns",
    "parse_device",
    "resolve_name",
]
