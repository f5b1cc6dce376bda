"""PyTorch's own NCHW kernels that walk their elements one load per thread at a time: which
calls run them, and how they launch (aten/src/ATen/native/cuda).

**Batch norm.** PyTorch hands a batch norm to cuDNN unless its input or weight is bf16, or its
input is fp16 with fp16 weights (``_select_batch_norm_backend`` in
aten/src/ATen/native/Normalization.cpp: ``input.scalar_type() != kBFloat16 &&
weight.scalar_type() != kBFloat16 && (input.scalar_type() != kHalf || weight.scalar_type() ==
kFloat)``). So a bf16 model, a ``model.half()`` fp16 model and bf16 autocast run the native
kernels; fp32 and fp16 autocast (fp32 weights) run cuDNN. The native kernels
(Normalization.cuh) read one element per thread per loop step, without vector loads:

- ``batch_norm_collect_statistics_kernel`` and ``batch_norm_backward_kernel``: one block per
  channel of ``tf x (512 / tf)`` threads, ``tf = getNumThreads(spatial)`` (the smallest of 32,
  64, 128, 256, 512 that covers it); each thread walks ``ceil(n / (512 / tf)) x ceil(spatial /
  tf)`` elements. The backward walks its channel twice (the reduction, then dX).
- ``batch_norm_transform_input_kernel`` (the normalize pass): blocks ``(channels, min(262144 /
  channels, ceil(n / tb)))`` of ``tf x tb`` threads, ``tf = max(getNumThreads(spatial / 4),
  min(getNumThreads(spatial), 64))``, ``tb = max(64 / tf, 1)``.

**Max pool.** PyTorch runs every NCHW max pool itself (``max_pool_forward_nchw``,
DilatedMaxPool2d.cu): one thread per output in blocks of 256, each visiting its window's taps
in a loop whose bounds are known only at run time, one load after another.

**Depthwise conv.** PyTorch runs an NCHW 2-D depthwise conv (``groups`` = input channels)
itself (``conv_depthwise2d_forward_kernel``, DepthwiseConv2d.cu) unless ``use_cudnn_depthwise``
(Convolution.cpp) hands it to cuDNN, which it does only for fp16 input and weights with at
least 32 channels (and then by a table of shapes tilecast does not model: such a conv is
taken to be cuDNN's). One thread per output in blocks of 1024, each thread summing its
window's taps. Our H100 and H200 ran this kernel for every NCHW bf16 depthwise conv they
measured (163 rows, datasets/h100-sxm5-80gb, datasets/h200-sxm-141gb: grid ceil(outputs /
1024) x 1024 threads on every row), and cuDNN's NHWC kernels for the channels-last ones.

**The non-vectorized elementwise loop.** TensorIterator (ATen/native/cuda/CUDALoops.cuh,
``gpu_kernel_impl_nocast``) runs an elementwise op on 16-byte vectors only when every operand
is one contiguous run in the output's order. Otherwise (a broadcast tensor operand, the copy
of a permuted tensor) it launches ``elementwise_kernel<128, vt>``: blocks of 128 threads over
``128 vt`` outputs, each thread working out every operand's offset from its index and then
loading, computing and storing one output before the next, ``vt`` of them (``unroll_factor``:
2 for a result of 4 bytes or more, 4 below). The loads of the next output wait for the store
of this one (the compiler cannot prove the pointers apart), so each thread waits ``vt``
memory round trips in a row. Our H100's GPT-2 large trace at batch 4
(datasets/h100-sxm5-80gb/traces) runs the attention mask's add on it (163,840 blocks, 241 us
a layer) and the copies of the permuted heads (10,240 blocks, 23 us each).

**Per-channel kernels.** Around those walks the native batch norm launches small kernels over
its channels' fp32 statistics (``batch_norm_cuda`` in Normalization.cu): at inference it copies
the running mean into the saved mean and turns the running variance into ``1 / sqrt(var +
eps)`` before the transform; in training one kernel folds the batch statistics into the
running ones and inverts the variance, between the statistics and the transform.

Our H100's ResNet-50 traces (datasets/h100-sxm5-80gb/traces) show these grids and blocks on all
53 batch norms (64x8, 256x2 and 512x1 threads; grids C and C x 128 at batch 128) and on the max
pool (200,704 blocks of 256 for 256 x 64 x 56 x 56 outputs); and the per-channel kernels: 53
``direct_copy_kernel_cuda`` and 53 ``batch_norm_calc_invstd`` launches of one to four blocks
in each inference replay, 53 ``unrolled_elementwise_kernel_for_multi_outputs`` in the training
step. Replayed in a CUDA graph at batch 1 the two inference kernels take 1.4-2.2 us each, 0.20
of ResNet-50's 1.15 ms; in eager each costs the host a launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .params import STATS_OP
from .runtime import CHANNELS_LAST, PYTORCH_RUNTIMES
from .types import (
    DTYPE_SIZE,
    Kernel,
    NativeBatchNorm,
    NativeDepthwise,
    NativeLoop,
    NativePool,
    OpCost,
)

Native = NativeBatchNorm | NativePool | NativeDepthwise | NativeLoop

MAX_BLOCK_SIZE = 512  # Normalization.cuh (CUDA; ROCm builds use 256)
POOL_THREADS = 256  # DilatedMaxPool2d.cu's BLOCK_THREADS
DEPTHWISE_THREADS = 1024  # DepthwiseConv2d.cu's block (the recorded grids above)
LOOP_THREADS = 128  # launch_legacy_kernel<128, vt>: the non-vectorized loop's block
# use_cudnn_depthwise: fp16 convs with at least this many input channels may go to cuDNN.
CUDNN_DEPTHWISE_MIN_CHANNELS = 32
TRANSFORM_BLOCKS = 256 * 1024  # the transform's cap on channels x batch blocks
# One block per channel: walks over the channel of the statistics kernel ("per_channel", also
# a backward whose input needs no gradient: the reduction alone) and of the backward.
WALKS = {"per_channel": 1, "backward": 2}
STATS_DTYPE, STATS_BYTES = "float32", 4  # the statistics' accumulate type, for every input dtype


@dataclass(frozen=True)
class ChannelPass:
    """One per-channel kernel: the fp32 vectors of the channels it reads and writes, and its
    FLOPs per channel (1 FMA = 2)."""

    suffix: str
    op_type: str
    reads: int
    writes: int
    flops: int


# Inference: saved mean <- running mean; invstd <- 1 / sqrt(running var + eps) (an add and a
# reciprocal square root). Training: running mean and var <- momentum blends of themselves and
# the batch's (two FMAs each, the unbiased variance scaled first), invstd <- the batch's.
INFERENCE_PASSES = (ChannelPass("mean", "BatchNormMeanCopy", 1, 1, 0),
                    ChannelPass("invstd", "BatchNormInvstd", 1, 1, 2))
TRAINING_PASSES = (ChannelPass("update", "BatchNormUpdateStats", 4, 3, 11),)


@dataclass(frozen=True)
class Launch:
    """A native kernel's launch: ``blocks`` of ``threads``, each thread loading ``steps``
    elements one after another."""

    blocks: int
    threads: int
    steps: int


def _threads_for(n: int) -> int:
    """``getNumThreads``: the smallest of 32, 64, 128, 256, 512 that is >= n (512 past it)."""
    return next((t for t in (32, 64, 128, 256) if n <= t), MAX_BLOCK_SIZE)


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers."""
    return -(-a // b)


def loop_unroll(dtype: str) -> int:
    """``vt`` of the non-vectorized loop for a result of ``dtype`` (CUDALoops.cuh:
    ``sizeof(arg0_t) >= 4 ? 2 : 4``)."""
    return 2 if DTYPE_SIZE.get(dtype, 4) >= 4 else 4


def launch(native: Native, dtype: str = "float32") -> Launch:
    """The grid, block and per-thread walk PyTorch launches for ``native`` (``dtype``: the
    kernel's, which sets the non-vectorized loop's unroll)."""
    if isinstance(native, NativeLoop):
        vt = loop_unroll(dtype)
        return Launch(ceil_div(native.elements, LOOP_THREADS * vt), LOOP_THREADS, vt)
    if isinstance(native, NativeDepthwise):
        return Launch(ceil_div(native.outputs, DEPTHWISE_THREADS), DEPTHWISE_THREADS,
                      native.taps)
    if isinstance(native, NativePool):
        return Launch(ceil_div(native.threads, POOL_THREADS), POOL_THREADS, native.taps)
    if native.kernel in WALKS:
        tf = _threads_for(native.spatial)
        ty = max(1, MAX_BLOCK_SIZE // tf)
        return Launch(native.channels, tf * ty, WALKS[native.kernel] * ceil_div(native.n, ty)
                      * ceil_div(native.spatial, tf))
    tf = max(_threads_for(native.spatial // 4), min(_threads_for(native.spatial), 64))
    tb = max(64 // tf, 1)
    rows = max(1, min(TRANSFORM_BLOCKS // max(native.channels, 1), ceil_div(native.n, tb)))
    return Launch(native.channels * rows, tf * tb,
                  ceil_div(native.n, rows * tb) * ceil_div(native.spatial, tf))


def runs_native(native: Native, dtype: str, math: str, runtime: str,
                memory_format: str = "nchw") -> bool:
    """Whether PyTorch runs ``native`` on its own kernels (module doc): only under its own
    runtimes; a batch norm in bf16 always, in fp16 unless autocast keeps the weights in fp32
    (``amp-fp16``); a max pool always; a depthwise conv in fp32, bf16 and fp64, and in fp16 below
    cuDNN's 32 channels (autocast casts the weights too); integer convs never; the
    non-vectorized loop always. With channels-last activations (``memory_format``) cuDNN's
    NHWC kernels take the depthwise convs (our H100's channels-last rows) and the max pool
    is ``max_pool_forward_nhwc``, which walks the channels innermost; the batch norm stays
    PyTorch's (``select_backend``)."""
    if runtime not in PYTORCH_RUNTIMES:
        return False
    if memory_format == CHANNELS_LAST and isinstance(native, NativeDepthwise | NativePool):
        return False
    if isinstance(native, NativePool | NativeLoop):
        return True
    if isinstance(native, NativeDepthwise):
        if dtype == "float16":
            return native.channels < CUDNN_DEPTHWISE_MIN_CHANNELS
        return dtype in ("float32", "bfloat16", "float64")
    return dtype == "bfloat16" or (dtype == "float16" and math != "amp-fp16")


def select_backend(kernels: Sequence[Kernel], math: str, runtime: str,
                   memory_format: str = "nchw") -> list[Kernel]:
    """The kernels as PyTorch launches them: ``native`` kept only where PyTorch runs its own
    kernels (``runs_native``), and each native batch norm's per-channel kernels beside its
    walks (module doc): before an inference transform, after a training statistics pass.
    Under channels-last a batch norm PyTorch runs itself keeps its per-channel kernels
    (``batch_norm_cuda`` launches them whatever the layout), its walks becoming the
    ``batch_norm_*_channels_last_kernel`` ones, which read the channels innermost as an
    elementwise kernel does (``native`` dropped: not the NCHW walk)."""
    out: list[Kernel] = []
    with_stats: set[tuple[str, ...]] = set()  # nodes whose transform uses batch statistics
    for k in kernels:
        native = k.cost.native
        # A fused group's member (``Kernel.group``): a compiler writes the group's kernel.
        fused = isinstance(native, NativeLoop) and k.group is not None
        plain = replace(k, cost=replace(k.cost, native=None))
        if native is None:
            out.append(k)
        elif fused or not runs_native(native, k.dtype, math, runtime, memory_format):
            out.append(plain)
        else:
            channels_last_bn = memory_format == CHANNELS_LAST and isinstance(native,
                                                                             NativeBatchNorm)
            walk = plain if channels_last_bn else k
            if k.op_type == STATS_OP:
                with_stats.add(k.nodes)
                out += [walk, *channel_kernels(k, TRAINING_PASSES)]
            elif k.op_type == "BatchNormalization" and native.kernel == "transform" \
                    and k.nodes not in with_stats:
                out += [*channel_kernels(k, INFERENCE_PASSES), walk]
            else:
                out.append(walk)
    return out


def channel_kernels(k: Kernel, passes: Sequence[ChannelPass]) -> list[Kernel]:
    """The per-channel kernels of the native batch norm ``k`` (``k.cost.native`` set)."""
    ch = k.cost.native.channels
    return [replace(k, name=f"{k.name}.{p.suffix}", op_type=p.op_type, follow_on=True,
                    cost=OpCost("elementwise", p.flops * ch,
                                (p.reads + p.writes) * ch * STATS_BYTES, STATS_DTYPE,
                                elements=ch))
            for p in passes]
