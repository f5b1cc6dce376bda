"""PyTorch's native NCHW batch-norm kernels: which calls run them, and how they launch.

PyTorch hands a batch norm to cuDNN unless its input or weight is bf16, or its input is fp16
with fp16 weights (``_select_batch_norm_backend`` in aten/src/ATen/native/Normalization.cpp:
``input.scalar_type() != kBFloat16 && weight.scalar_type() != kBFloat16 && (input.scalar_type()
!= kHalf || weight.scalar_type() == kFloat)``). So a bf16 model, a ``model.half()`` fp16 model
and bf16 autocast run the native kernels; fp32 and fp16 autocast (fp32 weights) run cuDNN.

The native kernels (aten/src/ATen/native/cuda/Normalization.cuh) read one element per thread
per loop step, without vector loads:

- ``batch_norm_collect_statistics_kernel`` and ``batch_norm_backward_kernel``: one block per
  channel of ``tf x (512 / tf)`` threads, ``tf = getNumThreads(spatial)`` (the smallest of 32,
  64, 128, 256, 512 that covers it); each thread walks ``ceil(n / (512 / tf)) x ceil(spatial /
  tf)`` elements. The backward walks its channel twice (the reduction, then dX): tilecast's
  ``dStats`` and ``dX`` kernels, one walk each.
- ``batch_norm_transform_input_kernel`` (the normalize pass): blocks ``(channels, min(262144 /
  channels, ceil(n / tb)))`` of ``tf x tb`` threads, ``tf = max(getNumThreads(spatial / 4),
  min(getNumThreads(spatial), 64))``, ``tb = max(64 / tf, 1)``.

Our H100's ResNet-50 bf16 training trace (datasets/h100-sxm5-80gb/traces) shows these grids and
blocks on all 53 batch norms (64x8, 256x2 and 512x1 threads; grids C and C x 128 at batch 128).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .runtime import PYTORCH_RUNTIMES
from .types import Kernel, NativeBatchNorm

MAX_BLOCK_SIZE = 512  # Normalization.cuh (CUDA; ROCm builds use 256)
TRANSFORM_BLOCKS = 256 * 1024  # the transform's cap on channels x batch blocks


@dataclass(frozen=True)
class Launch:
    """A native batch-norm kernel's launch: ``blocks`` of ``threads``, each thread loading
    ``steps`` elements one after another."""

    blocks: int
    threads: int
    steps: int


def _threads_for(n: int) -> int:
    """``getNumThreads``: the smallest of 32, 64, 128, 256, 512 that is >= n (512 past it)."""
    return next((t for t in (32, 64, 128, 256) if n <= t), MAX_BLOCK_SIZE)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def launch(bn: NativeBatchNorm) -> Launch:
    """The grid, block and per-thread walk PyTorch launches for ``bn``."""
    if bn.kernel == "per_channel":
        tf = _threads_for(bn.spatial)
        ty = max(1, MAX_BLOCK_SIZE // tf)
        return Launch(bn.channels, tf * ty, _ceil(bn.n, ty) * _ceil(bn.spatial, tf))
    tf = max(_threads_for(bn.spatial // 4), min(_threads_for(bn.spatial), 64))
    tb = max(64 // tf, 1)
    rows = max(1, min(TRANSFORM_BLOCKS // max(bn.channels, 1), _ceil(bn.n, tb)))
    return Launch(bn.channels * rows, tf * tb, _ceil(bn.n, rows * tb) * _ceil(bn.spatial, tf))


def runs_native(dtype: str, math: str, runtime: str) -> bool:
    """Whether PyTorch runs a batch norm of this dtype on its native kernels (module doc):
    bf16 always; fp16 unless autocast keeps the weights in fp32 (``amp-fp16``)."""
    if runtime not in PYTORCH_RUNTIMES:
        return False
    return dtype == "bfloat16" or (dtype == "float16" and math != "amp-fp16")


def select_backend(kernels: Sequence[Kernel], math: str, runtime: str) -> list[Kernel]:
    """The kernels with ``native_bn`` kept only where PyTorch runs its native kernels."""
    return [k if k.cost.native_bn is None or runs_native(k.dtype, math, runtime)
            else replace(k, cost=replace(k.cost, native_bn=None)) for k in kernels]
