"""The one feature builder shared by training and serving (numpy, vectorized).

The latency of a kernel is a fixed, physically monotone form (``model.py``) whose few
coefficients a small MLP predicts from SIZE-INDEPENDENT features. Every size-dependent
quantity enters only through non-negative "work terms" that never decrease as the kernel
grows, so a forecast can never fall when the batch, rows, elements or M/N/K grow:

    compute_ms  FLOPs at the peak, as whole waves of thread blocks x the FLOPs of one block
                (matmul: waves x 2 tm tn ceil(K / split) / per-SM peak)
    dram_ms     bytes that miss the L2, at the DRAM bandwidth
    cached_ms   bytes that hit the L2 (a working set that stays resident between runs), at the
                DRAM bandwidth (the model scales them down)
    wave_ms     whole waves x the bytes of a full wave of blocks, at the DRAM bandwidth: a
                partly filled wave takes about as long as a full one (latency-bound blocks);
                for the streaming families (``STREAMING``) a first wave the blocks only
                partly fill counts the share they fill
    waves       waves of thread blocks (a per-wave prologue/epilogue cost), counted the same way
    launch_ms   the device's launch overhead

The MLP input ``x`` holds what does not change with size: the tile or block shape, the
dtype's width, operands and FLOPs per element, and device descriptors. Feature names carry
their units; ``FEATURES[family]`` is the order of the model's input columns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import conv as cv
from . import row_tiles as rt
from . import tiles as tl
from .device_columns import (  # noqa: F401 (re-exported: features.device_columns etc.)
    DEFAULT_WATTS_PER_TFLOP,
    L1_KIB_PER_SM,
    MAX_BLOCKS_PER_SM,
    MAX_THREADS_PER_SM,
    SUSTAINED_CLOCK_SHARE,
    DeviceColumns,
    conv_lane_share,
    device_columns,
    sustained_clock,
)

# Split-K writes each slice's partial output tile and reduces them: (split - 1) extra fp32
# partial outputs written and read back (cuBLAS accumulates split-K partials in fp32).
SPLIT_PARTIAL_ITEMSIZE = 4.0

# Device descriptors (size-independent). Bandwidth-per-SM and ridge-point descriptors
# extrapolated badly in leave-one-GPU-out validation (docs/predictor.md).
_DEVICE = ("log2_sms", "log2_l2_mb", "log2_itemsize_bytes", "amd", "log2_watts_per_tflop",
           "base_clock_ratio")
# The conv MLP sees no device but the dtype width and the vendor: the GPU reaches it through
# the work terms alone (peak and SMs in whole waves, the sustained clock and FP32 lanes,
# bandwidth, the L2). Its data covers five GPUs, and there every descriptor named the GPU:
# the A100 PCIe 40GB (12.8 W/TFLOP, base / boost 0.54, no conv data) sat between the T4 and
# the P4 on power and clock and took their throttled rates even on 1x1 convs that keep 8 of
# its 108 SMs busy (1.3x the A100 PCIe 80GB's time on one chip at one boost clock).
# Leave-one-GPU-out on held-out conv shapes (fold means, seeds 0, 3 and 6, the fastest
# candidate algorithm, clocks in the compute term, the 0.4 quantile): with SM count and L2
# size still in 16.5 %, without the L2 16.2, without the SMs 16.2, without both 15.5; the
# median fit then 15.1 (docs/predictor.md, "Convolutions", "Which quantile").
_CONV_DEVICE = ("log2_itemsize_bytes", "amd")
_ROW = ("log2_cols", "log2_threads", "rows_per_block", "lane_efficiency", "l1_rows")
# What the fixed-cost and per-wave setup heads may not see: the matmul tile and layout (a
# tile switch must not change them), and for the fixed cost the device too (tiny kernels cost
# the same launch and block latency on every GPU).
# The conv algorithm is the same kind of switch (its launches still count, via launch_ms).
SETUP_EXCLUDED = frozenset({"log2_tile_m", "log2_tile_n", "tile_intensity", "log2_split",
                            "layout_tn", "log2_work_reduction",
                            *(f"algo_{a}" for a in cv.ALGORITHMS)})
FIXED_EXCLUDED = SETUP_EXCLUDED | {"log2_sms", "log2_l2_mb", "amd", "log2_watts_per_tflop",
                                   "base_clock_ratio"}
FEATURES: dict[str, tuple[str, ...]] = {
    "matmul": _DEVICE + ("log2_tile_m", "log2_tile_n", "tile_intensity", "log2_split",
                         "layout_tn", "tensor_core"),
    "elementwise": _DEVICE + ("operands_per_element", "log2_flops_per_element"),
    "softmax": _DEVICE + _ROW,
    "layernorm": _DEVICE + _ROW,
    # Dense convolutions (``conv.py``: cuDNN's algorithm and its work).
    "conv": _CONV_DEVICE + tuple(f"algo_{a}" for a in cv.ALGORITHMS) + (
        "log2_work_reduction", "log2_taps", "log2_stride", "channel_efficiency"),
}
UNITS: dict[str, str] = {
    "log2_sms": "log2 of the SM (CU) count", "log2_l2_mb": "log2 of the L2 size in MiB",
    "log2_itemsize_bytes": "log2 of the dtype's bytes per element (fp32: 2)",
    "amd": "1 for AMD GPUs (ROCm libraries), 0 for NVIDIA",
    "log2_watts_per_tflop": "log2(board power W / peak fp32 TFLOP/s): power headroom per FLOP",
    "base_clock_ratio": "base / boost clock: how far the clock may fall under sustained load "
                        "(1 where the datasheet gives no base clock)",
    "log2_tile_m": "log2(tile rows / 128)", "log2_tile_n": "log2(tile cols / 128)",
    "tile_intensity": "FLOPs per byte one k-step of a tile loads: 2 tm tn / ((tm + tn) itemsize)"
                      " / 64",
    "log2_split": "log2 of the split-K slices (grid z)",
    "layout_tn": "1 for a linear layer's weight layout (transposed B), 0 for a batched matmul",
    "tensor_core": "1 when the kernel runs on tensor / matrix cores, 0 on SIMT units",
    "operands_per_element": "(bytes less a broadcast operand) / (elements * itemsize): "
                            "tensors streamed per element",
    "log2_flops_per_element": "log2(1 + FLOPs / elements), a copy read as 1 FLOP / element",
    "log2_cols": "log2 of the row length (elements)",
    "log2_threads": "log2(threads per block / 128)",
    "rows_per_block": "rows one block handles / 8 (warp-per-row kernels handle several)",
    "lane_efficiency": "row elements / elements the block's vector loop covers (1)",
    "l1_rows": "min(1, L1 bytes per SM / bytes of one row) (1)",
    **{f"algo_{a}": f"1 when cuDNN runs {a} (conv.py), else 0" for a in cv.ALGORITHMS},
    "log2_work_reduction": "log2(algorithm FLOPs / direct 2 K P Q C R S FLOPs), per image",
    "log2_taps": "log2(R * S), filter taps", "log2_stride": "log2 of the stride",
    "channel_efficiency": "C K / (C K padded to the tensor-core multiple) (1)",
}


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
    tile_m: np.ndarray  # matmul tile (0 elsewhere)
    tile_n: np.ndarray
    split_k: np.ndarray | None = None  # matmul reduction slices (grid z); None: 1
    layout_tn: np.ndarray | None = None  # matmul: 1 for a linear layer's layout; None: 0
    # Bytes that come from DRAM whatever the L2 holds: a model's weights, or a decode step's
    # KV cache, when its pass reads more such bytes than the L2 keeps (analyzer/weights.py,
    # OpCost.state_bytes); None: 0 (a kernel benchmark). Matmul and elementwise read it.
    cold_bytes: np.ndarray | None = None
    # Elementwise: a broadcast operand's extra reads, the slice of it one repeat reads, and
    # its own bytes (analyzer/costs/broadcast.py); None: 0 (the sweep's rows broadcast nothing).
    reread_bytes: np.ndarray | None = None
    reread_slice: np.ndarray | None = None
    reread_operand: np.ndarray | None = None


@dataclass(frozen=True)
class Features:
    """One family's model inputs: size-independent ``x`` and the monotone work terms (ms)."""

    family: str
    x: np.ndarray  # float32 (n, len(FEATURES[family]))
    compute_ms: np.ndarray  # FLOPs at the peak, in whole waves of blocks where blocks tile
    dram_ms: np.ndarray  # bytes that miss the L2, at the DRAM bandwidth
    cached_ms: np.ndarray  # bytes that hit the L2, at the DRAM bandwidth
    wave_ms: np.ndarray  # waves (whole, or a first wave's share) of full-block bytes / bandwidth
    waves: np.ndarray
    launch_ms: np.ndarray
    roof_compute_ms: np.ndarray  # the plain roofline terms (bound labels, utilization)
    roof_memory_ms: np.ndarray

    @property
    def t_ref_ms(self) -> np.ndarray:
        """The roofline bound including launch: latency >= t_ref_ms by construction."""
        return np.maximum(self.roof_compute_ms, self.roof_memory_ms) + self.launch_ms

    @property
    def names(self) -> tuple[str, ...]:
        return FEATURES[self.family]

    def select(self, mask: np.ndarray) -> Features:
        return Features(self.family, *(getattr(self, f)[mask] for f in (
            "x", "compute_ms", "dram_ms", "cached_ms", "wave_ms", "waves", "launch_ms",
            "roof_compute_ms", "roof_memory_ms")))


def _log2(a: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(a, 1e-30))


def _device_x(kc: KernelColumns, dc: DeviceColumns) -> dict[str, np.ndarray]:
    return {"log2_sms": _log2(dc.sm_count), "log2_l2_mb": _log2(dc.l2_bytes / 2**20),
            "log2_itemsize_bytes": _log2(kc.itemsize), "amd": dc.amd,
            "log2_watts_per_tflop": _log2(dc.watts_per_tflop),
            "base_clock_ratio": dc.base_clock_ratio}


def l2_hits(traffic: np.ndarray, l2_bytes: np.ndarray) -> np.ndarray:
    """Bytes served by the L2 when the kernel runs again on the same tensors (as the
    measurements and a model's layers do): all of a working set that fits, none of one twice
    the L2's size, linearly between. Misses (traffic - hits) never decrease as traffic grows."""
    return np.where(traffic <= l2_bytes, traffic, np.maximum(0.0, 2.0 * l2_bytes - traffic))


# Families whose blocks stream through DRAM together: the blocks of a wave share its
# bandwidth, so a first wave that is only partly filled costs its share of a full one (its
# per-wave setup and its bytes). Before, one block was charged a whole wave of every SM's
# resident blocks, and the device-aware setup head made that a GPU's identity: a 128-element
# add took 0.03 us of GPU time on a T4 and 9.3 on a P100, which a CUDA graph exposes. Layer
# norm and matmul keep whole waves: the data prices their partly filled waves (a lone
# long-row block, a GEMM tile) as full ones (docs/predictor.md, "Partly filled waves").
STREAMING = frozenset({"elementwise", "softmax"})


def _finish(family: str, x: dict[str, np.ndarray], kc: KernelColumns, dc: DeviceColumns,
            compute_s: np.ndarray, traffic: np.ndarray, blocks: np.ndarray,
            slots: np.ndarray, block_bytes: np.ndarray,
            rereads: np.ndarray | float = 0.0,
            dram_rereads: np.ndarray | float = 0.0,
            cold: np.ndarray | None = None) -> Features:
    """Split the traffic at the L2, count waves, stack ``x`` in ``FEATURES`` order.
    ``block_bytes``: DRAM bytes of one full block (fixed by the block shape, not the size);
    ``rereads``: bytes a block reads again soon after its first read, served by the L2;
    ``dram_rereads``: such bytes the L2 no longer holds, read again from DRAM; ``cold``:
    bytes of the traffic that miss the L2 whatever its size (``KernelColumns.cold_bytes``)."""
    warm = traffic if cold is None else traffic - np.minimum(cold, traffic)
    hits = l2_hits(warm, dc.l2_bytes)
    capacity = dc.sm_count * slots
    waves = np.maximum(np.ceil(blocks / capacity), 1.0)
    if family in STREAMING:  # the first wave counts the share of it the blocks fill
        waves = np.where(blocks < capacity, np.maximum(blocks, 1.0) / capacity, waves)
    cols = np.stack([x[name] for name in FEATURES[family]], axis=1).astype(np.float32)
    return Features(family, cols, compute_s * 1e3,
                    (traffic - hits + dram_rereads) / dc.bandwidth * 1e3,
                    (hits + rereads) / dc.bandwidth * 1e3,
                    waves * capacity * block_bytes / dc.bandwidth * 1e3,
                    waves, dc.launch_s * 1e3, kc.flops / dc.peak_flops * 1e3,
                    kc.bytes / dc.bandwidth * 1e3)


def matmul_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    tm, tn = np.maximum(kc.tile_m, 1.0), np.maximum(kc.tile_n, 1.0)
    b, m, n, k = (np.maximum(a, 1.0) for a in (kc.b, kc.m, kc.n, kc.k))
    split = np.ones_like(k) if kc.split_k is None else np.maximum(kc.split_k, 1.0)
    # cuBLAS is column-major: PyTorch's row-major C = A B runs as C^T = B^T A^T, so the
    # kernel's tile rows (tm) cover N and its columns (tn) cover M (the grids confirm it);
    # split-K launches `split` slices of the reduction per output tile (grid z).
    blocks = b * np.ceil(n / tm) * np.ceil(m / tn) * split
    slots = np.ones_like(blocks)  # one SGEMM block per SM (their register use allows one)
    waves = np.maximum(np.ceil(blocks / dc.sm_count), 1.0)
    block_flops = 2.0 * tm * tn * np.ceil(k / split)
    compute_s = waves * block_flops / (dc.peak_flops / dc.sm_count) * _issue_bound(tm, tn, dc)
    partials = (split - 1.0) * 2.0 * b * m * n * SPLIT_PARTIAL_ITEMSIZE
    x = _device_x(kc, dc) | {
        "log2_tile_m": np.log2(tm / 128), "log2_tile_n": np.log2(tn / 128),
        "tile_intensity": 2.0 * tm * tn / ((tm + tn) * np.maximum(kc.itemsize, 0.5)) / 64.0,
        "log2_split": np.log2(split),
        "layout_tn": np.zeros_like(b) if kc.layout_tn is None else kc.layout_tn,
        "tensor_core": dc.tensor_core}
    block_bytes = kc.itemsize * ((tm + tn) * np.ceil(k / split) + tm * tn)
    return _finish("matmul", x, kc, dc, compute_s, kc.bytes + partials, blocks, slots,
                   block_bytes, cold=kc.cold_bytes)


def _issue_bound(tm: np.ndarray, tn: np.ndarray, dc: DeviceColumns) -> np.ndarray:
    """How much longer a SIMT SGEMM's FFMAs take when issue slots run out (>= 1).

    Per k-step a thread issues its micro-tile's FFMAs plus shared-memory loads of its A and B
    fragments (16-byte LDS) and its share of the global-to-shared staging (16-byte LDG + STS).
    A GPU whose FP32 lanes take every issue slot at peak (``fp32_issue_share`` 1: GA10x, Ada,
    Hopper) cannot hide those other instructions; at 0.5 (Pascal to A100) they use spare slots.
    """
    threads = tl.sgemm_threads(tm, tn)
    outputs = tm * tn / threads  # per thread
    fragment = np.sqrt(outputs)  # a x b micro-tile, a = b (8x8, 4x4, ~2x4)
    other = 2.0 * fragment / 4.0 + (tm + tn) / threads / 2.0
    need = dc.fp32_issue_share * (outputs + other) / outputs
    # Only cuBLAS's SIMT tiles (32x32 and up); a matmul without a tile is left alone.
    simt = (dc.tensor_core == 0) & (dc.amd == 0) & (tm >= 32) & (tn >= 32)
    return np.where(simt, np.maximum(1.0, need), 1.0)


def _slots(dc: DeviceColumns, threads: np.ndarray) -> np.ndarray:
    """Blocks resident per SM by the thread and block limits."""
    return np.maximum(np.minimum(np.floor(dc.max_threads_per_sm / threads),
                                 dc.max_blocks_per_sm), 1.0)


# A copy (a movement or gather kernel on the copy rule: no FLOPs) reads as the cheapest ops the
# sweep measured, ReLU and a scalar add: one FLOP per element and as memory-bound as a copy.
# The exported model clamps the input to its training range anyway, so this changes no
# forecast; it keeps a plain copy from reading as outside the data (``extrapolated``). Every
# training row does one FLOP per element or more.
COPY_FLOPS_PER_ELEMENT = 1.0


def elementwise_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    elements = np.maximum(kc.elements, 1.0)
    blocks, per_block = rt.elementwise_tiles(elements, kc.itemsize)
    slots = _slots(dc, np.full_like(blocks, rt.ELEMENTWISE_THREADS))
    # What a block loads and stores per element: each operand once, a broadcast one included
    # (its repeats come from a cache or DRAM, but every element still loads it). Unique bytes
    # fall per element as a broadcast operand repeats more ([b, h, s, s] + [b, 1, s, s]:
    # 2 + 1/h tensors' worth), which made a one-wave kernel with more heads forecast faster
    # (to 1 % on the MI250; tests/test_predictor_properties.py).
    moved = kc.bytes + (0.0 if kc.reread_bytes is None else kc.reread_bytes)
    block_bytes = per_block * moved / elements
    x = _device_x(kc, dc) | {
        "operands_per_element": streams_per_element(kc, elements),
        "log2_flops_per_element": np.log2(1.0 + np.maximum(kc.flops / elements,
                                                           COPY_FLOPS_PER_ELEMENT))}
    return _finish("elementwise", x, kc, dc, kc.flops / dc.peak_flops, kc.bytes, blocks, slots,
                   block_bytes, 0.0, broadcast_misses(kc, dc), cold=kc.cold_bytes)


def streams_per_element(kc: KernelColumns, elements: np.ndarray) -> np.ndarray:
    """Tensors a kernel streams per output element, in its dtype's width: bytes / (elements *
    itemsize), a broadcast operand left out. Counted in, it is a fraction of a stream (2 + 1/h
    for a [b, 1, s, s] mask over h heads) that shrinks as the heads grow, and that moved the
    utilization the model reads: more heads were forecast faster (P100, 2 -> 4 heads at s =
    64: -0.25 %). Its repeats are charged to the work terms instead (``broadcast_misses``).
    Counting it as a whole third stream was monotone too, but read a two-stream kernel as a
    three-stream add: BERT's mask add went from 0.95 to 1.21x of its measured time on the
    P100, 1.00 to 1.12x on the V100. The training rows broadcast nothing: their inputs are
    unchanged."""
    nbytes = kc.bytes if kc.reread_operand is None else kc.bytes - kc.reread_operand
    return nbytes / (elements * np.maximum(kc.itemsize, 1e-3))


def broadcast_misses(kc: KernelColumns, dc: DeviceColumns) -> np.ndarray | float:
    """DRAM bytes of a broadcast operand's repeated reads, at least: the share of each repeated
    slice that lies beyond the L2 (no cache holds more than itself). A lower bound: OPT's
    16.8 MB mask slice is read again from DRAM on the 40-48 MB L2s of the A100 and L4 as well,
    as their measured times show, while GPT-2's 1 MB bool mask stays in a 2 MB L2; no rule
    of the L2 size alone separates the two (analyzer/costs/broadcast.py). Monotone: the
    extra bytes grow with the repeats and a larger slice keeps a smaller share."""
    if kc.reread_bytes is None or kc.reread_slice is None:
        return 0.0
    return reread_misses(kc.reread_bytes, kc.reread_slice, dc.l2_bytes)


def reread_misses(reread_bytes, slice_bytes, l2_bytes):
    """The DRAM share of a broadcast operand's repeats (``broadcast_misses``): the part of each
    repeated slice beyond the L2 (numpy arrays or floats)."""
    return reread_bytes * np.maximum(0.0, 1.0 - l2_bytes / np.maximum(slice_bytes, 1.0))


CYCLIC_KEEP_ALL = 0.5  # of a cache: a cyclic working set up to this share is all kept


def cyclic_kept(working_set_bytes: np.ndarray, cache_bytes: np.ndarray) -> np.ndarray:
    """Share of a cyclic working set a cache still holds when its readers come round again.

    Row kernels walk their rows start to end, pass after pass, and an LRU cache evicts such a
    set before it comes round once the set outgrows the cache; between two passes the rest of
    the traffic (first reads of new rows, the outputs written) takes room as well. So: all
    kept up to half the cache, none at the whole cache, linear between. One rule at both
    levels: the L1 with one SM's resident rows, the L2 with all SMs' resident rows.
    16384-column fp32 softmax rows, past every L1: the L4 holds 11 MiB of them on its SMs in a
    48 MiB L2 and streams them at its full rate; an A100 27 MiB in 40 MiB, at 0.56x its rate
    for 8192 columns (held-out shapes). The choice of half was made by the protocol
    (docs/predictor.md, "what the L1 and the L2 keep").
    """
    return np.clip((cache_bytes - working_set_bytes) / ((1.0 - CYCLIC_KEEP_ALL) * cache_bytes),
                   0.0, 1.0)


STREAMED_PER_ROW = 2.0  # a row kernel reads each row and writes it: two row lengths of bytes


def _row_features(family: str, kc: KernelColumns, dc: DeviceColumns, blocks: np.ndarray,
                  rows_per_block: np.ndarray, threads: np.ndarray, covered: np.ndarray,
                  extra_reads: np.ndarray, cyclic: bool = False) -> Features:
    """Row kernels. ``covered``: elements per row the block's (padded) loop walks;
    ``extra_reads``: passes over the input beyond the first; what the L1 does not keep of
    the resident rows is read again from the L2 (the block read it moments before).
    ``cyclic``: the L1 keeps ``cyclic_kept`` of the rows, the L2 ``cyclic_kept`` of all SMs'
    resident rows; the rest is read again from DRAM. Otherwise the L1
    keeps the share of the rows that fits and the L2 serves every re-read."""
    cols_ = np.maximum(kc.cols, 1.0)
    slots = _slots(dc, threads)
    resident_rows = np.maximum(slots, 1.0) * rows_per_block
    row_bytes = cols_ * kc.itemsize
    resident = resident_rows * row_bytes
    if cyclic:
        kept = cyclic_kept(resident, dc.l1_bytes)
        in_l2 = cyclic_kept(dc.sm_count * resident, dc.l2_bytes)
    else:
        kept, in_l2 = np.minimum(1.0, dc.l1_bytes / resident), np.ones_like(resident)
    rereads = extra_reads * (1.0 - kept) * kc.rows * row_bytes
    # Padded lanes do the work of real ones: FLOPs scale with the covered row length.
    compute_s = kc.flops * np.maximum(covered, cols_) / cols_ / dc.peak_flops
    x = _device_x(kc, dc) | {
        "log2_cols": np.log2(cols_), "log2_threads": np.log2(threads / 128),
        "rows_per_block": rows_per_block / 8.0,
        "lane_efficiency": cols_ / np.maximum(covered, cols_),
        "l1_rows": np.minimum(1.0, dc.l1_bytes / row_bytes)}
    # One block streams its rows in and out. The row kernel's other operands (a layer norm's
    # scale and shift) are read once per kernel and then found in the L2 by every block:
    # spread over the rows (bytes / rows), they made a block's bytes, and with them the
    # wave term, fall as rows were added (a 1,024-wide layer norm forecast 1.2 % faster at 8
    # rows than at 1 on an A10).
    block_bytes = rows_per_block * STREAMED_PER_ROW * row_bytes
    return _finish(family, x, kc, dc, compute_s, kc.bytes, blocks, slots, block_bytes,
                   rereads * in_l2, rereads * (1.0 - in_l2))


def _vector_loop(cols: np.ndarray, threads: np.ndarray, itemsize: np.ndarray) -> np.ndarray:
    """Elements a block-per-row loop of 16-byte vectors covers (whole strides of the block)."""
    stride = threads * np.maximum(rt.VECTOR_BYTES // np.maximum(itemsize, 1), 1)
    return np.ceil(np.maximum(cols, 1.0) / stride) * stride


def softmax_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    blocks, rpb, threads = rt.softmax_tiles(kc.rows, kc.cols, kc.itemsize, dc.amd)
    # The warp kernel pads each row to a power of two; the block kernel to whole strides.
    covered = np.where(rpb > 1, 2.0 ** np.ceil(np.log2(np.maximum(kc.cols, 1.0))),
                       _vector_loop(kc.cols, threads, kc.itemsize))
    # Block kernel: max, sum of exp and write each walk the row; the warp kernel keeps the row
    # in registers.
    extra = np.where(rpb > 1, 0.0, 2.0)
    # The cyclic re-read rules are chosen by the protocol for softmax only: softmax
    # leave-one-GPU-out (held-out shapes) 19.9 -> 11.1 %, held-out training GPUs 13.8 -> 8.6 %;
    # on layer norm they made both worse (docs/predictor.md, "what the L1 and the L2 keep").
    return _row_features("softmax", kc, dc, blocks, rpb, threads, covered, extra, cyclic=True)


def layernorm_features(kc: KernelColumns, dc: DeviceColumns) -> Features:
    blocks, rpb, threads = rt.layernorm_tiles(kc.rows)
    covered = _vector_loop(kc.cols, threads, kc.itemsize)
    # Welford statistics pass, then the normalize pass re-reads the row.
    return _row_features("layernorm", kc, dc, blocks, rpb, threads, covered,
                         np.ones_like(blocks))


def conv_features(cc: cv.ConvColumns, dc: DeviceColumns) -> Features:
    """Dense convolutions run with ``cc.algo``: the algorithm's FLOPs in whole waves of its
    padded tiles (one tile per SM, as SGEMM) at the SM's rate under the sustained clock and
    lane shares, its DRAM bytes (X, W, Y and the transforms), and one launch per kernel the
    algorithm runs. ``x`` does not depend on the batch N."""
    algo = cc.algo if cc.algo is not None else np.full(len(cc), ALGO_DEFAULT, dtype=object)
    matrix = dc.tensor_core > 0
    work = cv.algorithm_work(cc, algo, matrix)
    # per image, over one whole group of the nonfused Winograd's 16-image batch layout
    group = cv.NONFUSED_BATCH_MULTIPLE
    image = cv.algorithm_work(replace(cc, n=np.full(len(cc), group)), algo, matrix)
    direct = group * 2.0 * cc.k * cc.p * cc.q * cc.c * cc.r * cc.s
    tile_m, tile_n = work.tile_m, work.tile_n
    per_tile = work.tile_flops  # one padded tile's FLOPs (independent of N)
    waves = np.maximum(np.ceil(work.tiles / dc.sm_count), 1.0)
    busy = np.minimum(work.tiles / dc.sm_count, 1.0)
    rate = dc.peak_flops / dc.sm_count * sustained_clock(dc, busy) * conv_lane_share(dc)
    compute_s = waves * per_tile / rate
    mult = np.array([cv.TC_CHANNEL_MULTIPLE.get(d, 1) for d in cc.dtype], dtype=np.float64)
    mult = np.where(matrix, mult, 1.0)
    padded = np.ceil(cc.c / mult) * np.ceil(cc.k / mult) * mult**2
    zeros = np.zeros(len(cc))
    kc = KernelColumns(work.flops, work.bytes, cc.itemsize, cc.n * cc.k * cc.p * cc.q,
                       *(zeros for _ in range(8)))
    x = _device_x(kc, dc) | {f"algo_{a}": (algo == a).astype(np.float64)
                             for a in cv.ALGORITHMS} | {
        "log2_work_reduction": np.log2(image.flops / np.maximum(direct, 1.0)),
        "log2_taps": np.log2(cc.r * cc.s), "log2_stride": np.log2(cc.stride),
        "channel_efficiency": cc.c * cc.k / padded}
    block_bytes = cc.itemsize * ((tile_m + tile_n) * work.reduction + tile_m * tile_n)
    f = _finish("conv", x, kc, dc, compute_s, work.bytes, work.tiles, np.ones_like(waves),
                block_bytes)
    launches = np.array([cv.LAUNCHES.get(a, 1) for a in algo], dtype=np.float64)
    return replace(f, launch_ms=f.launch_ms * launches)


ALGO_DEFAULT = "implicit_precomp_gemm"  # what cuDNN offers for every conv
BUILDERS = {"matmul": matmul_features, "elementwise": elementwise_features,
            "softmax": softmax_features, "layernorm": layernorm_features,
            "conv": conv_features}


def build_features(family: str, kc: KernelColumns | cv.ConvColumns,
                   dc: DeviceColumns) -> Features:
    """Features of one family's kernels (the model's input columns, in ``FEATURES`` order)."""
    return BUILDERS[family](kc, dc)
