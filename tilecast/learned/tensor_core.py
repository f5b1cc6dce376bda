"""Matrix-unit GEMMs with no training data: their compute at the GPU's sourced sustained rate.

Every NVIDIA training kernel is an fp32 SIMT GEMM (AMD's fp32 matrix-core kernels are trained
too). For a matmul on tensor / matrix cores in a dtype the data does not hold (fp16, bf16, TF32,
int8, fp8), the learned compute utilization, per-wave setup and per-wave operand traffic are
those of SIMT tiles applied to a tensor-core peak: the wave-traffic term alone held an 8192^3
fp16 GEMM to 41 % of the H100's peak and 52-65 % of the A100's, where vendor BLAS sustains 81 %
and 77 % (``Device.matrix_sustained_fraction``, sourced per GPU, docs/devices.md). So those
kernels take the physics instead, the learned parts that do not depend on the math unit kept:

    busy_ms = max(smax4(compute / sustained_fraction, stream_ms), chain_ms)
    gpu_ms  = fixed_ms + busy_ms

``chain_ms`` is a lone CTA's reduction loop, one L2 round trip per k-step (``k_chain_ms``,
stop 57): what a GEMM with a wave or less of tiles cannot go below.

``stream_ms`` is the time the device's streaming kernels take for the GEMM's DRAM bytes (the
learned elementwise model's busy time for a copy of that many bytes, read from DRAM): cuBLAS's
tensor-core kernels load their operands with multi-stage asynchronous copies, and a
memory-bound one (a decode step's few rows against a weight matrix) streams the weights as a
copy does. The fp32 SIMT GEMMs the matmul model learned its memory utilization from run such
shapes on one block per SM at 35-46 % of the DRAM bandwidth (the shared data's linears with
at most 16 rows), which is not what these kernels do.

``compute`` is, for a compute-bound GEMM (arithmetic intensity at or above the GPU's ridge
point), its FLOPs in whole waves of cuBLAS's tensor-core tiles at the matrix peak (tile
quantization stays); for a memory-bound one, its plain FLOPs: cuBLAS serves few rows with
small-M tiles and split-K that keep every SM busy, so a 128-row tile is never padded from 8
rows. A GEMM's intensity only grows with M, N or K, so it crosses from the second rule to the
first once, to a compute term at least as large: the forecast stays monotone. ``fixed_ms`` is
the model's (learned from launches). ``u <= 1`` keeps it above the roofline. GPUs without a
sourced fraction keep the learned form; the kernels stay ``extrapolated`` either way (no
measured 16-bit kernel; issue 13 replaces this with data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analyzer.forecast import ROW_ALIGN_BYTES
from ..analyzer.runtime import GRAPH_KERNEL_LAUNCH_US, lone_kernel_ms
from ..device_db.device import Device
from ..device_db.loader import lowest_l2_latency_ns
from .features import Features
from .form import P_BUSY, Q_HOST
from .routing import Parts


@dataclass(frozen=True)
class Sustained:
    """The physics forecast of the rows a mask selects (arrays over those rows)."""

    gpu_ms: np.ndarray
    latency_ms: np.ndarray
    compute_ms: np.ndarray  # the compute term: compute_ms / sustained_fraction, or the k loop
    memory_ms: np.ndarray  # the memory term: the DRAM bytes' streaming time


def smooth_max(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """(a^p + b^p)^(1/p), the form's smooth maximum, computed without overflow."""
    top = np.maximum(np.maximum(a, b), 1e-30)
    return top * ((a / top) ** p + (b / top) ** p) ** (1.0 / p)


def nchw_transpose_bytes(p: Parts, mask: np.ndarray, conv: np.ndarray,
                         vendor: str) -> np.ndarray:
    """Bytes cuDNN's layout transposes move around an NCHW tensor-core convolution, one per row
    of ``mask`` (``conv``: the row is a convolution's implicit GEMM, m = N P Q, n = K,
    k = C R S). The matrix-unit kernels run on NHWC: a bf16 NCHW conv on an H100 launches
    ``nchwToNhwcKernel`` for X and W before the GEMM and ``nhwcToNchwKernel`` for Y after it
    (datasets/h100-sxm5-80gb: 186 of 221 NCHW rows that are not 1x1 stride 1, and every
    3x3 and strided conv of ResNet-50's batch-1 trace; no channels-last row): each of its
    tensors is read and written once more, ``2 x bytes``, by a kernel of its own
    (``LAYOUT_KERNELS``, ``transposes_ms``). A training step's gradients run the
    same way (stop 48's lease, NCHW dense rows that are not 1x1 stride 1: 45 of 45 data
    gradients transpose dY and W in and dX out, 42 of 45 weight gradients X and dY in and dW
    out), so the rule needs no telling which operand is the weight. (Until stop 48 it
    counted X and Y only, "W is small beside them"; at batch 1 W is the largest of the
    three, and a weight gradient's n x k operand, X's im2col, is no tensor at all.)

    A 1x1 stride-1 conv is a GEMM on NCHW as it stands (Y_n = W X_n) and runs without them
    (40 of 44 forward rows; 18 of 22 data and 15 of 22 weight gradients): it is the conv
    whose activation besides the output holds exactly m k elements (forward: X; data
    gradient: dY; weight gradient: dY, with X the n x k operand), the conv's bytes holding X,
    W and Y and maybe a bias of n elements. An ONNX Conv is NCHW. NVIDIA only: no AMD 16-bit
    conv was measured. A compiled runtime picks NHWC and runs none (``runtime._graph``)."""
    if vendor != "nvidia":
        return np.zeros(int(mask.sum()))
    # b: a grouped conv's groups, one implicit GEMM each (77 of 78 NCHW tensor-core grouped
    # rows on our H100 and H200 transpose too; every channels-last one runs without).
    b, itemsize, nbytes = p.b[mask], p.itemsize[mask], p.bytes[mask]
    y = itemsize * b * p.m[mask] * p.n[mask]
    x = np.maximum(nbytes - itemsize * b * p.n[mask] * p.k[mask] - y, 0.0)
    pointwise = np.abs(x - itemsize * b * p.m[mask] * p.k[mask]) <= itemsize * b * p.n[mask]
    return np.where(conv & ~pointwise, 2.0 * nbytes, 0.0)


# The layout kernels around an NCHW conv: X and W in, Y out (a gradient: its two inputs in,
# its output out). Which tensor is which does not matter: each is its own launch.
LAYOUT_KERNELS = 3


def transposes_ms(stream_ms: np.ndarray, device: Device) -> np.ndarray:
    """The time the layout transposes add in series, per row (``stream_ms``: the streaming
    time of all their bytes, 0 where none run): each is a kernel of its own, so together they
    take at least ``LAYOUT_KERNELS`` queued kernels' shortest time, and each adds a gap to the
    next kernel (``analyzer.runtime``). At batch 1 that is most of it: ResNet-50's replay on
    our H100 runs 60 of them at 1.8-2.3 us each, where their bytes stream in a few hundred
    ns."""
    floor = LAYOUT_KERNELS * (lone_kernel_ms(device) + GRAPH_KERNEL_LAUNCH_US * 1e-3)
    return np.where(stream_ms > 0, np.maximum(stream_ms, floor), 0.0)


# cuDNN's tensor-core grouped conv kernel: one group's implicit GEMM per CTA tile of 64 x 64
# x 64 (M x N x K), `sm80_xmma_fprop_implicit_gemm_indexed_..._tilesize64x64x64` on 113 of
# the 121 H100 rows with 4+ channels per group (the rest 128 x 64 x 64).
GROUP_TILE = 64


def group_tile_padding(p: Parts, mask: np.ndarray, conv: np.ndarray) -> np.ndarray:
    """For each row of ``mask`` that is a grouped conv's batched implicit GEMM (a conv with b
    groups > 1): the MMA work its tiles do over its FLOPs, every one of m, n and k rounded up
    to ``GROUP_TILE``; 0 elsewhere. A group of 16 output channels fills a quarter of a tile's
    columns: the H100's 32-group convs sustain 124 TFLOP/s of useful work with 16 channels per
    group (3 x 3), 40 with 8 and 9-20 with 4, about their tiles' fill (1 / 5.3, 1 / 14, 1 / 28)
    times a dense conv's rate."""
    def up(x: np.ndarray) -> np.ndarray:
        return np.ceil(x / GROUP_TILE) * GROUP_TILE

    m, n, k = p.m[mask], p.n[mask], p.k[mask]
    grouped = conv & (p.b[mask] > 1)
    padded = up(m) * up(n) * up(k) / np.maximum(m * n * k, 1.0)
    return np.where(grouped, padded, 0.0)


def load_width_slowdown(p: Parts, mask: np.ndarray, conv: np.ndarray) -> np.ndarray:
    """For each row of ``mask``: 16 bytes over the widest load the rows of its operands allow
    (the largest power of two dividing n x itemsize and k x itemsize, at most 16), 1 where that
    is 16. cuBLAS serves a 16- or 8-bit GEMM whose rows are no multiple of 16 bytes with CUTLASS
    kernels of narrower loads (`cutlass_80_tensorop_*` for 4-byte rows, `cutlass_75_tensorop_*`
    for 2-byte ones on our H100 and H200), so each operand takes 16 / width as many loads,
    and the main loop as long: 4x and 8x. Measured / forecast as aligned there
    (datasets/h100-sxm5-80gb and h200-sxm-141gb, 54 Linears each): 2.6-3.3x on 4-byte rows
    (BERT's 30522-wide head), 6.0-9.0x on 2-byte rows (50257, 32001). Convolutions (cuDNN
    pads channels) and fused attention (head dims of 64 and 128) are left out, as are 4-byte
    dtypes (the 16-byte rule for 16- and 8-bit GEMMs, ``analyzer.forecast.misaligned_gemm``)."""
    # ROW_ALIGN_BYTES: a tensor-core GEMM's 16-byte operand loads (LDG.128, cp.async of 16).
    itemsize = p.itemsize[mask]

    def widest(elements: np.ndarray) -> np.ndarray:
        b = np.maximum((elements * itemsize).astype(np.int64), 1)
        return np.minimum(b & -b, ROW_ALIGN_BYTES)  # the lowest set bit: 2^j dividing b

    width = np.minimum(widest(p.n[mask]), widest(p.k[mask]))
    keep = conv | p.fused[mask] | (itemsize >= 4)
    return np.where(keep, 1.0, ROW_ALIGN_BYTES / width)


def sustained(f: Features, mask: np.ndarray, fraction: float, stream_ms: np.ndarray,
              fixed_ms: np.ndarray, host_ms: np.ndarray,
              transposes_ms: np.ndarray | float = 0.0,
              slowdown: np.ndarray | float = 1.0,
              group_padding: np.ndarray | float = 0.0,
              chain_ms: np.ndarray | float = 0.0) -> Sustained:
    """Latency of the matrix-unit rows ``mask`` of the matmul family at ``fraction`` of the
    matrix peak, their DRAM bytes at the streaming time ``stream_ms`` (one per masked row),
    with the model's fixed cost and host dispatch; ``transposes_ms``: layout passes that run
    before and after the GEMM (``nchw_transpose_bytes``), added in series; ``slowdown``: the
    compute term's factor for narrower operand loads (``load_width_slowdown``);
    ``group_padding``: where positive, a grouped conv's MMA work over its FLOPs
    (``group_tile_padding``), which replaces the tile-wave count; ``chain_ms``: the reduction
    loop's floor on the busy time (``k_chain_ms``), counted as compute: it is the k loop."""
    memory_bound = f.roof_memory_ms[mask] >= f.roof_compute_ms[mask]
    compute = np.where(memory_bound, f.roof_compute_ms[mask], f.compute_ms[mask])
    compute = np.where(group_padding > 0, f.roof_compute_ms[mask] * group_padding, compute)
    compute = compute / fraction
    compute = compute * slowdown
    busy = smooth_max(compute, stream_ms, P_BUSY)
    compute = np.where(chain_ms > busy, chain_ms, compute)
    gpu = fixed_ms[mask] + np.maximum(busy, chain_ms) + transposes_ms
    return Sustained(gpu, smooth_max(host_ms[mask], gpu, Q_HOST), compute, stream_ms)


# A tensor-core k-step loads a 128-byte slice of each operand row: 64 deep in 16 bits (the
# `64x3`, `64x4`, `_64x16_` k-tiles of the H100's cuDNN and nvjet kernels), 32 in TF32. The
# deepest tile in common use, so the fewest steps: the chain below is a lower bound.
K_TILE_BYTES = 128
# cuBLAS splits a long reduction over few output tiles: of our H100's and H200's 16-bit
# nvjet linears on under half the SMs' worth of tiles, none under 41 k-steps ran a `splitK`
# kernel (264 rows), every one of 48 steps or more did (187), 11 of 31 between; the longest
# unsplit loop was 40 steps. So a GEMM's floor counts at most that many steps: past them the
# kernel runs slices (13 steps or more), which its streaming or compute term then bounds.
# Convolutions keep their whole loop: cuDNN ran ResNet-50's 72-step batch-1 convs unsplit.
CUBLAS_UNSPLIT_STEPS = 40


def l2_latency_ns(device: Device) -> float | None:
    """The device's sourced L2 hit latency, or the shortest sourced for its vendor (a lower
    bound) where its own chip is not measured; None where no GPU of the vendor is."""
    own = device.l2_latency_ns
    return own if own is not None else lowest_l2_latency_ns(device.vendor)


def k_chain_ms(p: Parts, mask: np.ndarray, device: Device, conv: np.ndarray) -> np.ndarray:
    """The shortest time a CTA takes for its reduction loop, per row of ``mask``: one L2
    round trip per ``K_TILE_BYTES`` k-step, ``ceil(k / depth) x Device.l2_latency_ns``. With
    a wave or less of tiles nothing hides the loop: ResNet-50's batch-1 GEMMs in our H100's
    CUDA-graph replay take 11.3-11.5 us at k = 4,608 (72 steps, 157 ns each against the
    board's 134 ns L2 latency), 7.6-7.8 us at 2,304 and 6.2-6.7 at 1,152, where the streaming
    and compute terms give 1.2-3 us whatever k (docs/predictor.md, "The reduction loop of a
    small tensor-core GEMM"). A floor on the busy time, not an addend: a GEMM of many waves
    is held by its compute or streaming term, which then exceed one CTA's loop. ``conv``: the
    row is a convolution (cuDNN, its whole loop); a GEMM's (cuBLAS) counts at most
    ``CUBLAS_UNSPLIT_STEPS``, since cuBLAS splits longer ones. cuDNN's own split 7 x 7 convs
    over 512 channels (k = 25,088) beat the floor by up to 38 %; every collected linear of our
    Hoppers takes 4.7x its floor or more.
    The predictor takes it for forward kernels only: a backward pass's weight gradients
    reduce over the batch's pixels or tokens (k = 401,408 for a ResNet-50 3 x 3 conv at
    batch 128), which cuDNN and cuBLAS split across the SMs; unsplit, the floor put our
    H100's conv weight gradients at 105 % MAPE against 66 %. NVIDIA only: no AMD 16-bit GEMM
    was measured. Fused attention rows are left out (their loop runs over keys, not ``k``)."""
    ns = l2_latency_ns(device)
    if device.vendor != "nvidia" or ns is None:
        return np.zeros(int(mask.sum()))
    steps = np.ceil(p.k[mask] / (K_TILE_BYTES / p.itemsize[mask]))
    steps = np.where(conv, steps, np.minimum(steps, CUBLAS_UNSPLIT_STEPS))
    return np.where(p.fused[mask], 0.0, steps * ns * 1e-6)
