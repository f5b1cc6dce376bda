"""Per-kernel device numbers the feature builder reads: peaks, bandwidth, caches, occupancy
limits and power headroom, one array per field so that one batch may mix GPUs; and the shares
of the nominal fp32 rate a conv kernel gets (the sustained clock, the FP32 lanes)."""

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
    fp32_sustained: np.ndarray  # sourced SGEMM share of the fp32 peak (nan: none sourced)


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
        fp32_issue_share=col(lambda d: d.fp32_issue_share or 0.5),
        fp32_sustained=col(lambda d: d.fp32_sustained_fraction or np.nan))


# A GPU with no board power in its description is taken as one with ample headroom: the
# largest ratio among the database's datacenter parts with a datasheet power (P100 PCIe).
DEFAULT_WATTS_PER_TFLOP = 26.9


def _watts_per_tflop(d: Device) -> float:
    if not d.board_power_w:
        return DEFAULT_WATTS_PER_TFLOP
    return d.board_power_w / d.peak_tflops_fp32


def _base_clock_ratio(d: Device) -> float:
    return min(1.0, d.base_clock_mhz / d.boost_clock_mhz) if d.base_clock_mhz else 1.0


# Of the gap between the boost and the base clock, the share a GPU gives up when every SM is
# busy (``sustained_clock``). Chosen by leave-one-GPU-out on the conv data (fold means over
# seeds 0, 3 and 6, each fold's tile table without its GPU; stop 55, once a padded tile's
# FLOPs were counted once): 0.5 13.55 %, 0.6 13.12, 0.65 13.08, 0.7 13.20 (seeds 0 and 3:
# 0.25 15.55, 0.75 13.50, 1 (the base clock) 17.69); again once the nonfused Winograd ran
# whole groups of 16 images: 0.5 12.62, 0.6 12.19, 0.65 12.19, 0.7 12.36 (kept). It puts a T4
# at 0.94 GHz under load (boost 1.59, base 0.585). Stop 35 had chosen 0.5 the same way (16.2
# against 16.3 at 0.6).
SUSTAINED_CLOCK_SHARE = 0.65


def sustained_clock(dc: DeviceColumns, busy: np.ndarray) -> np.ndarray:
    """The clock, as a share of the boost clock, that a kernel keeping ``busy`` of the SMs
    (0-1) runs at: board power and heat pull a fully busy chip part of the way from the boost
    towards the base clock (the guaranteed one at the board's power), a few SMs not at all.

    Why a work term and not only a feature: the MLP's inputs are clamped to their training
    range, so a held-out GPU beyond it (the T4's base / boost 0.37, below every other conv
    GPU) could not be told apart; scaling the compute term carries the datasheet clocks to
    any GPU. Monotone: ``busy`` never falls as the kernel grows, so the compute term it
    scales never does either. GPUs without a base clock (AMD here) keep the boost clock."""
    return 1.0 - SUSTAINED_CLOCK_SHARE * (1.0 - dc.base_clock_ratio) * busy


def conv_lane_share(dc: DeviceColumns) -> np.ndarray:
    """The share of the nominal fp32 peak an SM gives cuDNN's SGEMM-class conv kernels.

    Every GPU with conv data issues one FP32 warp instruction per partition per clock to 16
    lanes (``fp32_issue_share`` 0.5), and the model learned its utilization there. GA10x,
    Ada, Hopper and Blackwell SMs double the lanes (share 1.0); a SIMT GEMM uses them only as
    far as that GPU's measured SGEMM rate shows (``fp32_sustained_fraction``: L4 0.367, L40S
    0.512, H100 SXM 0.774), one datapath (0.5) where none is sourced. The L4's own kernels put
    it that low on a lone SM, where neither power nor bandwidth binds: on held-out batched
    SGEMMs of under 58 blocks, one per SM on both GPUs, the A100s take 0.89-0.94x the L4's
    time, where its nominal per-SM peak is 2.9x theirs (0.367 of it: 1.06x)."""
    rate = np.where(np.isnan(dc.fp32_sustained), 0.5, dc.fp32_sustained)
    doubled = (dc.fp32_issue_share > 0.5) & (dc.amd == 0)  # AMD CUs: another issue model
    return np.where(doubled, rate, 1.0)
