"""The one feature builder shared by training and serving (numpy, vectorized).

Every kernel gets its roofline work time, the device's launch overhead and a row of
dimensionless features. The model (``model.py``) predicts the utilization of the work part,
``u_work`` in (0, 1), and a fixed cost of at least one launch overhead:

    work = max(t_compute, t_memory)
    t_compute = FLOPs / peak (for the kernel's dtype and unit)
    t_memory = DRAM bytes / DRAM bandwidth
    latency = launch * (1 + softplus(z_fixed)) + work / sigmoid(z_work)

so ``utilization = (work + launch) / latency`` lies in (0, 1] by construction.

Size enters the features only through bounded ratios (1/waves, wave efficiency, overhead and
L2 fractions), so kernels far larger than the training shapes map inside the training range.
Feature names carry their units; ``FEATURES[family]`` is the order of the model's input columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..device_db.device import Device
from . import tiles as tl

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

# Roofline-relative terms, plus two device descriptors (SM count, L2 size). Without the
# descriptors the MLP fingerprints GPUs through the roofline ratios (compute_fraction moves
# with bandwidth), and a 25 % faster memory made half the matmuls *slower*; with them, and a
# smaller net, predictions move with the device as physics says. Bandwidth-per-SM and
# ridge-point descriptors extrapolated badly in leave-one-GPU-out validation.
_COMMON = ("compute_fraction", "inv_waves", "wave_efficiency", "sm_fill", "l2_fit",
           "log2_itemsize_bytes", "log2_sms", "log2_l2_mb")
_ROW = ("log2_cols", "log2_threads", "thread_use", "inv_elems_per_thread", "l1_fit",
        "lane_efficiency")
FEATURES: dict[str, tuple[str, ...]] = {
    "matmul": _COMMON + ("log2_tile_m", "log2_tile_n", "tile_compute_fraction",
                         "pad_efficiency", "log2_k"),
    "elementwise": _COMMON + ("operands_per_element", "log2_flops_per_element"),
    "softmax": _COMMON + _ROW,
    "layernorm": _COMMON + _ROW,
    # Convolutions (``conv.py`` builds them: cuDNN's algorithm, its FLOPs and transform bytes).
    # The device enters through the roofline terms, waves and its power limits: SM count, L2
    # size and L2 fit made the A100 (40 MiB L2, 108 SMs) extrapolate in leave-one-GPU-out.
    "conv": tuple(f for f in _COMMON if f not in ("l2_fit", "log2_sms", "log2_l2_mb")) + (
        "algo_implicit_precomp_gemm", "algo_implicit_gemm", "algo_winograd",
                       "algo_winograd_nonfused", "algo_fft", "log2_work_reduction",
                       "transform_fraction", "pad_efficiency", "log2_reduction_len",
                       "log2_out_channels", "log2_out_pixels", "log2_taps", "log2_stride",
                       "log2_watts_per_tflop", "base_over_boost"),
}
COMMON_FEATURES = _COMMON
UNITS: dict[str, str] = {
    "compute_fraction": "t_compute / (t_compute + t_memory) (1)",
    "inv_waves": "1 / waves; waves = ceil(tiles / (SMs * resident tiles per SM)) (1)",
    "wave_efficiency": "tiles / (waves * SMs * resident tiles per SM) (1)",
    "sm_fill": "min(1, tiles / SMs) (1)",
    "l2_fit": "min(1, L2 bytes / kernel bytes) (1)",
    "log2_itemsize_bytes": "log2 of the dtype's bytes per element (fp32: 2)",
    "log2_sms": "log2 of the SM (CU) count", "log2_l2_mb": "log2 of the L2 size in MiB",
    "log2_tile_m": "log2(tile rows / 128)", "log2_tile_n": "log2(tile cols / 128)",
    "tile_compute_fraction": "per-SM roofline of one tile: compute / (compute + memory) (1)",
    "pad_efficiency": "M*N / (padded M * padded N) (1); conv: outputs / tile-padded outputs",
    "log2_k": "log2 of the reduction length K (elements)",
    "operands_per_element": "bytes / (elements * itemsize) (tensors moved per element)",
    "log2_flops_per_element": "log2(1 + FLOPs / elements)",
    "log2_cols": "log2 of the row length (elements)",
    "log2_threads": "log2(threads per block / 128)",
    "thread_use": "min(1, elements per block / threads per block) (1)",
    "inv_elems_per_thread": "1 / max(1, elements per block / threads per block) (1)",
    "l1_fit": "min(1, L1 bytes per SM / bytes of the rows resident on an SM) (1)",
    "lane_efficiency": "row elements / elements the block's vector loop covers (1)",
    **{f"algo_{a}": f"1 when cuDNN runs {a} (algorithm tree), else 0" for a in (
        "implicit_precomp_gemm", "implicit_gemm", "winograd", "winograd_nonfused", "fft")},
    "log2_work_reduction": "log2(algorithm FLOPs / direct 2*N*K*P*Q*C*R*S FLOPs)",
    "transform_fraction": "transform / transpose DRAM bytes over all DRAM bytes (1)",
    "log2_reduction_len": "log2(C*R*S), the implicit GEMM's K",
    "log2_out_channels": "log2 of K (output channels)",
    "log2_out_pixels": "log2(P*Q), output pixels per image",
    "log2_taps": "log2(R*S), filter taps", "log2_stride": "log2 of the stride",
    "log2_watts_per_tflop": "log2(board power W / fp32 peak TFLOP/s): power headroom",
    "base_over_boost": "base clock / boost clock (1 where no base clock is published)",
}


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


def device_columns(devices: Sequence[Device], which: np.ndarray, dtypes: np.ndarray,
                   units: np.ndarray) -> DeviceColumns:
    """Device numbers per kernel: kernel i runs on ``devices[which[i]]``."""
    which = np.asarray(which, dtype=np.int64)
    peak = np.empty(len(which))
    # Distinct (device, dtype, unit) combinations are few: look each peak up once.
    todo = np.ones(len(which), dtype=bool)
    while todo.any():
        i = int(np.argmax(todo))
        key = (which[i], dtypes[i], units[i])
        mask = todo & (which == key[0]) & (dtypes == key[1]) & (units == key[2])
        peak[mask] = devices[key[0]].peak_tflops(key[1], key[2]) * 1e12
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
        arch=np.array([d.arch for d in devices], dtype=object)[which])


@dataclass(frozen=True)
class KernelColumns:
    """Per-kernel costs (float64 arrays); dims that do not apply are 0."""

    flops: np.ndarray
    bytes: np.ndarray
    itemsize: np.ndarray
    elements: np.ndarray
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    tile_m: np.ndarray  # matmul tile chosen by tiles.py (0 elsewhere)
    tile_n: np.ndarray
    split_k: np.ndarray | None = None  # matmul reduction slices (grid z); None: 1


@dataclass(frozen=True)
class Features:
    family: str
    x: np.ndarray  # float32 (n, len(FEATURES[family]))
    work_ms: np.ndarray  # float64 (n,): max(compute_ms, memory_ms)
    launch_ms: np.ndarray  # float64 (n,): the device's launch overhead
    compute_ms: np.ndarray  # the roofline terms, for the bound classification
    memory_ms: np.ndarray

    @property
    def t_ref_ms(self) -> np.ndarray:
        """The roofline bound including launch: latency >= t_ref_ms by construction."""
        return self.work_ms + self.launch_ms

    @property
    def names(self) -> tuple[str, ...]:
        return FEATURES[self.family]


def _safe_log2(a: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(a, 1e-30))


def _common(kc: KernelColumns, dc: DeviceColumns, tiles: np.ndarray, slots: np.ndarray,
            compute_s: np.ndarray, traffic: np.ndarray | None = None,
            ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Shared columns; ``traffic``: DRAM bytes when they exceed the unique bytes."""
    memory_s = (kc.bytes if traffic is None else traffic) / dc.bandwidth
    capacity = dc.sm_count * slots
    waves = np.maximum(np.ceil(tiles / capacity), 1.0)
    cols = {
        "compute_fraction": compute_s / np.maximum(compute_s + memory_s, 1e-30),
        "inv_waves": 1.0 / waves,
        "wave_efficiency": tiles / (waves * capacity),
        "sm_fill": np.minimum(1.0, tiles / dc.sm_count),
        "l2_fit": np.minimum(1.0, dc.l2_bytes / np.maximum(kc.bytes, 1.0)),
        "log2_itemsize_bytes": _safe_log2(kc.itemsize),
        "log2_sms": _safe_log2(dc.sm_count),
        "log2_l2_mb": _safe_log2(dc.l2_bytes / 2**20),
    }
    return cols, dc.launch_s, memory_s


def _finish(family: str, cols: dict[str, np.ndarray], launch_s: np.ndarray,
            compute_s: np.ndarray, memory_s: np.ndarray) -> Features:
    x = np.stack([cols[name] for name in FEATURES[family]], axis=1).astype(np.float32)
    return Features(family, x, np.maximum(compute_s, memory_s) * 1e3, launch_s * 1e3,
                    compute_s * 1e3, memory_s * 1e3)


def matmul_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    tm, tn = np.maximum(kc.tile_m, 1.0), np.maximum(kc.tile_n, 1.0)
    b, m, n, k = (np.maximum(a, 1.0) for a in (kc.b, kc.m, kc.n, kc.k))
    split = np.ones_like(k) if kc.split_k is None else np.maximum(kc.split_k, 1.0)
    # cuBLAS is column-major: PyTorch's row-major C = A B runs as C^T = B^T A^T, so the
    # kernel's tile rows (tm) cover N and its columns (tn) cover M (the grids confirm it);
    # split-K launches `split` slices of the reduction per output tile (grid z).
    tiles = b * np.ceil(n / tm) * np.ceil(m / tn) * split
    k = np.ceil(k / split)  # the reduction length one thread block walks
    tile_flops = 2.0 * tm * tn * k
    per_sm_peak = dc.peak_flops / dc.sm_count
    # The plain roofline, not a wave-quantized one: cuBLAS splits K across extra blocks for
    # small outputs (the grids in the data show it), so tile counts only feed the features.
    compute_s = kc.flops / dc.peak_flops
    cols, launch_s, memory_s = _common(kc, dc, tiles, np.ones_like(tiles), compute_s)
    tile_c = tile_flops / per_sm_peak
    tile_m_s = kc.itemsize * (tm * k + tn * k + tm * tn) / (dc.bandwidth / dc.sm_count)
    cols.update({
        "log2_tile_m": np.log2(tm / 128), "log2_tile_n": np.log2(tn / 128),
        "tile_compute_fraction": tile_c / (tile_c + tile_m_s),
        "pad_efficiency": m * n / (np.ceil(n / tm) * tm * np.ceil(m / tn) * tn),
        "log2_k": np.log2(k),
    })
    return _finish("matmul", cols, launch_s, compute_s, memory_s)


def elementwise_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    elements = np.maximum(kc.elements, 1.0)
    blocks, _ = tl.elementwise_tiles(elements, kc.itemsize)
    slots = _slots(dc, np.full_like(blocks, tl.ELEMENTWISE_THREADS))
    compute_s = kc.flops / dc.peak_flops
    cols, launch_s, memory_s = _common(kc, dc, blocks, slots, compute_s)
    cols.update({
        "operands_per_element": kc.bytes / (elements * np.maximum(kc.itemsize, 1e-3)),
        "log2_flops_per_element": np.log2(1.0 + kc.flops / elements),
    })
    return _finish("elementwise", cols, launch_s, compute_s, memory_s)


def _slots(dc: DeviceColumns, threads: np.ndarray) -> np.ndarray:
    """Blocks resident per SM by the thread and block limits."""
    return np.maximum(np.minimum(np.floor(dc.max_threads_per_sm / threads),
                                 dc.max_blocks_per_sm), 1.0)


def _row_features(family: str, kc: KernelColumns, dc: DeviceColumns, blocks: np.ndarray,
                  rows_per_block: np.ndarray, threads: np.ndarray, covered: np.ndarray,
                  extra_reads: np.ndarray) -> Features:
    """Row kernels. ``covered``: elements per row the block's (padded) loop walks;
    ``extra_reads``: passes over the input beyond the first, paid in DRAM traffic for the
    part of the resident rows that L1 cannot hold."""
    cols_ = np.maximum(kc.cols, 1.0)
    compute_s = kc.flops / dc.peak_flops
    slots = _slots(dc, threads)
    resident_rows = np.maximum(np.minimum(slots, blocks / dc.sm_count), 1.0) * rows_per_block
    l1_fit = np.minimum(1.0, dc.l1_bytes / (resident_rows * cols_ * kc.itemsize))
    input_bytes = kc.rows * cols_ * kc.itemsize
    traffic = kc.bytes + extra_reads * (1.0 - l1_fit) * input_bytes
    cols, launch_s, memory_s = _common(kc, dc, blocks, slots, compute_s, traffic)
    per_thread = cols_ * rows_per_block / threads
    cols.update({
        "log2_cols": np.log2(cols_), "log2_threads": np.log2(threads / 128),
        "thread_use": np.minimum(1.0, per_thread),
        "inv_elems_per_thread": 1.0 / np.maximum(per_thread, 1.0),
        "l1_fit": l1_fit,
        "lane_efficiency": cols_ / np.maximum(covered, cols_),
    })
    return _finish(family, cols, launch_s, compute_s, memory_s)


def _vector_loop(cols: np.ndarray, threads: np.ndarray, itemsize: np.ndarray) -> np.ndarray:
    """Elements a block-per-row loop of 16-byte vectors covers (whole strides of the block)."""
    stride = threads * np.maximum(tl.VECTOR_BYTES // np.maximum(itemsize, 1), 1)
    return np.ceil(np.maximum(cols, 1.0) / stride) * stride


def softmax_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    blocks, rpb, threads = tl.softmax_tiles(kc.rows, kc.cols, kc.itemsize)
    # The warp kernel pads each row to a power of two; the block kernel to whole strides.
    covered = np.where(rpb > 1, 2.0 ** np.ceil(np.log2(np.maximum(kc.cols, 1.0))),
                       _vector_loop(kc.cols, threads, kc.itemsize))
    # Block kernel: max, sum of exp and write each walk the row; the warp kernel keeps the row
    # in registers.
    extra = np.where(rpb > 1, 0.0, 2.0)
    return _row_features("softmax", kc, dc, blocks, rpb, threads, covered, extra)


def layernorm_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    blocks, rpb, threads = tl.layernorm_tiles(kc.rows)
    covered = _vector_loop(kc.cols, threads, kc.itemsize)
    # Welford statistics pass, then the normalize pass re-reads the row.
    return _row_features("layernorm", kc, dc, blocks, rpb, threads, covered,
                         np.ones_like(blocks))


# Public names for the family modules that build their own columns (conv.py).
common_columns = _common
finish = _finish

BUILDERS = {"matmul": matmul_features, "elementwise": elementwise_features,
            "softmax": softmax_features, "layernorm": layernorm_features}


def build_features(family: str, kc: KernelColumns, dc: DeviceColumns) -> Features:
    """Features of one family's kernels (the model's input columns, in ``FEATURES`` order)."""
    return BUILDERS[family](kc, dc)
