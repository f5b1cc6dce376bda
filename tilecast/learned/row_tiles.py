"""Thread blocks of PyTorch's native elementwise and row kernels (softmax, layer norm).

These kernels fix their block shape from the problem, not the GPU, so a closed-form rule
stands where matmuls have the learned tile table (``tiles.py``); the recorded launch grids of
the shared data check each rule (``tests/test_learned_train.py``).
"""

from __future__ import annotations

import numpy as np

# PyTorch 2.x native kernels: 128 threads per block; the vectorized elementwise kernel moves 16
# bytes per thread (4 fp32), layer norm's vectorized kernel handles one row per block.
ELEMENTWISE_THREADS = 128
VECTOR_BYTES = 16
ROW_THREADS = 128
SOFTMAX_WARP_MAX_BYTES = 4096  # rows up to 1024 fp32 use the warp-per-row softmax
SOFTMAX_MAX_BLOCK = 1024
WARP = 32


def elementwise_tiles(elements: np.ndarray, itemsize: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, elements per block) of PyTorch's vectorized elementwise kernel."""
    per_block = ELEMENTWISE_THREADS * np.maximum(VECTOR_BYTES // np.maximum(itemsize, 1), 1)
    return np.ceil(np.maximum(elements, 1) / per_block), per_block.astype(np.float64)


def _next_pow2(x: np.ndarray) -> np.ndarray:
    return 2.0 ** np.ceil(np.log2(np.maximum(x, 1)))


def softmax_tiles(rows: np.ndarray, cols: np.ndarray, itemsize: np.ndarray,
                  amd: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, rows per block, threads per block) of PyTorch's softmax forward.

    Short rows: ``softmax_warp_forward`` (a warp, or part of one, per row; two rows per warp up
    to 128 columns; 128-thread blocks). Long rows: ``cunn_SoftMaxForward``, one block per row:
    with CUDA the largest power of two below half of cols / ILP (ILP: 16-byte vectors), at
    least a warp; with ROCm (``amd`` 1) always the 1024-thread maximum, as every recorded
    MI100 / MI210 launch of it has (``Block x`` 1024 on all 700 rows per GPU above 1024
    columns, where CUDA's launches on the same shapes have 256 or 512).
    """
    rows, cols = np.asarray(rows, np.float64), np.asarray(cols, np.float64)
    warp_kernel = cols * itemsize <= SOFTMAX_WARP_MAX_BYTES
    pow2 = _next_pow2(cols)
    lanes = np.minimum(pow2, WARP)
    rows_per_block_w = (ROW_THREADS / lanes) * np.where(pow2 <= 128, 2, 1)
    ilp = np.maximum(VECTOR_BYTES // np.maximum(itemsize, 1), 1)
    max_block = np.minimum(np.floor(cols / ilp), SOFTMAX_MAX_BLOCK)
    threads_b = np.maximum(_next_pow2(np.maximum(np.floor(max_block / 2), 1)), WARP)
    threads_b = np.where(np.asarray(amd) > 0, SOFTMAX_MAX_BLOCK, threads_b)
    rows_per_block = np.where(warp_kernel, rows_per_block_w, 1.0)
    threads = np.where(warp_kernel, ROW_THREADS, threads_b)
    return np.ceil(rows / rows_per_block), rows_per_block, threads


def layernorm_tiles(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, rows per block, threads): one 128-thread block per row."""
    rows = np.asarray(rows, np.float64)
    return np.maximum(rows, 1), np.ones_like(rows), np.full_like(rows, ROW_THREADS)
