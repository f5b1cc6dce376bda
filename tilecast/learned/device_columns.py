"""Per-kernel device numbers the feature builder reads: peaks, bandwidth, caches, occupancy
limits and power headroom, one array per field so that one batch may mix GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..device_db.device import Device

# Occupancy limits per generation (CUDA occupancy tables: resident threads and blocks per SM;
# AMD CDNA: 40 wavefronts of 64 per CU). Registers and shared memory are not modelled here.
MAX_THREADS_PER_SM = {"maxwell": 2048, "pascal": 2048, "volta": 2048, "turing": 1024,
                      "ampere": 2048, "ada": 1536, "hopper": 2048, "blackwell": 2048,
                      "cdna1": 2560, "cdna2": 2560, "cdna3": 2560}
# Combined L1 / shared memory per SM in KiB (architecture whitepapers; Pascal: GP100's 24 KiB
# L1). Rows that outgrow it are re-read from L2 / DRAM by the multi-pass row kernels.
L1_KIB_PER_SM = {"maxwell": 24, "pascal": 24, "volta": 128, "turing": 96, "ampere": 192,
                 "ada": 128, "hopper": 256, "blackwell": 256, "cdna1": 16, "cdna2": 16,
                 "cdna3": 32}
MAX_BLOCKS_PER_SM = {"maxwell": 32, "pascal": 32, "volta": 32, "turing": 16, "ampere": 32,
                     "ada": 24, "hopper": 32, "blackwell": 32, "cdna1": 32, "cdna2": 32,
                     "cdna3": 32}


@dataclass(frozen=True)
class DeviceColumns:
    """Per-kernel device numbers (so one batch may mix GPUs, as training does)."""

    sm_count: np.ndarray
    peak_flops: np.ndarray  # FLOP/s for the kernel's dtype on its unit
    bandwidth: np.ndarray  # DRAM bytes/s
    l2_bytes: np.ndarray
    launch_s: np.ndarray
    clock_hz: np.ndarray
    max_threads_per_sm: np.ndarray
    max_blocks_per_sm: np.ndarray
    l1_bytes: np.ndarray  # per SM
    arch: np.ndarray  # str
    amd: np.ndarray  # 1.0 for AMD
    tensor_core: np.ndarray  # 1.0 where the kernel's dtype runs on matrix units
    watts_per_tflop: np.ndarray  # board power / peak fp32
    base_clock_ratio: np.ndarray  # base / boost clock
    fp32_issue_share: np.ndarray  # issue slots an FFMA stream takes at peak (none given: 0.5)


def uses_matrix_units(device: Device, dtype: str, unit: str) -> bool:
    """A matrix-unit peak above the vector peak means tensor / matrix cores do the work."""
    return unit == "matrix" and device.peak_tflops(dtype, "matrix") > device.peak_tflops_fp32


def device_columns(devices: Sequence[Device], which: np.ndarray, dtypes: np.ndarray,
                   units: np.ndarray) -> DeviceColumns:
    """Device numbers per kernel: kernel i runs on ``devices[which[i]]``."""
    which = np.asarray(which, dtype=np.int64)
    peak, tensor = np.empty(len(which)), np.zeros(len(which))
    # Distinct (device, dtype, unit) combinations are few: look each peak up once.
    todo = np.ones(len(which), dtype=bool)
    while todo.any():
        i = int(np.argmax(todo))
        key = (which[i], dtypes[i], units[i])
        mask = todo & (which == key[0]) & (dtypes == key[1]) & (units == key[2])
        dev = devices[key[0]]
        peak[mask] = dev.peak_tflops(key[1], key[2]) * 1e12
        tensor[mask] = float(dev.vendor == "nvidia" and uses_matrix_units(dev, key[1], key[2]))
        todo &= ~mask

    def col(fn) -> np.ndarray:
        return np.array([fn(d) for d in devices], dtype=np.float64)[which]

    return DeviceColumns(
        sm_count=col(lambda d: d.sm_count), peak_flops=peak,
        bandwidth=col(lambda d: d.mem_bandwidth_bytes_per_s),
        l2_bytes=col(lambda d: d.l2_cache_mb * 2**20),
        launch_s=col(lambda d: d.launch_overhead_us * 1e-6),
        clock_hz=col(lambda d: d.boost_clock_mhz * 1e6),
        max_threads_per_sm=col(lambda d: MAX_THREADS_PER_SM.get(d.arch, 2048)),
        max_blocks_per_sm=col(lambda d: MAX_BLOCKS_PER_SM.get(d.arch, 32)),
        l1_bytes=col(lambda d: L1_KIB_PER_SM.get(d.arch, 128) * 1024.0),
        arch=np.array([d.arch for d in devices], dtype=object)[which],
        amd=col(lambda d: float(d.vendor == "amd")), tensor_core=tensor,
        watts_per_tflop=col(_watts_per_tflop), base_clock_ratio=col(_base_clock_ratio),
        fp32_issue_share=col(lambda d: d.fp32_issue_share or 0.5))


# A GPU with no board power in its description is taken as one with ample headroom: the
# largest ratio among the database's datacenter parts with a datasheet power (P100 PCIe).
DEFAULT_WATTS_PER_TFLOP = 26.9


def _watts_per_tflop(d: Device) -> float:
    if not d.board_power_w:
        return DEFAULT_WATTS_PER_TFLOP
    return d.board_power_w / d.peak_tflops_fp32


def _base_clock_ratio(d: Device) -> float:
    return min(1.0, d.base_clock_mhz / d.boost_clock_mhz) if d.base_clock_mhz else 1.0
