"""Convolutions as cuDNN runs them: the algorithm it picks and that algorithm's work (FLOPs,
DRAM bytes, tiles); ``features.conv_features`` turns them into the conv family's inputs.

cuDNN's forward algorithms (cuDNN API reference, ``cudnnConvolutionFwdAlgo_t``) and how the
recorded kernel names show them (``classify_kernels``):

- ``implicit_precomp_gemm``: implicit GEMM with precomputed offsets (``scudnn_128x64_...``
  tiles, ``computeOffsetsKernel``, ``precomputed_convolve_sgemm``). GEMM view: M = N*P*Q,
  N = K, K = C*R*S/groups; 2*M*N*K FLOPs, tiles of 128 x 64 outputs.
- ``implicit_gemm``: the plain implicit GEMM (``implicit_convolve_sgemm``) and the explicit
  im2col + SGEMM (``explicit_convolve_sgemm``, ``im2col4d``): the same FLOPs, slower kernels.
- ``winograd_nonfused``: F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural
  Networks", CVPR 2016): each 4x4 output tile takes (4+3-1)^2 = 36 multiplies per (c, k) pair
  instead of 4*4*3*3 = 144, a 4x cut. cuDNN runs it as four kernels: a data transform to
  36 x (T x C), a filter transform to 36 x (C x K), 36 batched SGEMMs (T x C) @ (C x K) (the
  recorded grids have z = 36) and an output transform; T = N * ceil(P/4) * ceil(Q/4). The
  transformed tensors go through DRAM: ``transform_bytes``.
- ``winograd``: the fused kernel (``scudnn_winograd_128x128``); counted as F(2x2, 3x3), 16
  multiplies instead of 36 (2.25x, Lavin & Gray), data and output transforms in registers.
  The filter is transformed first by its own kernel (``generateWinogradTilesKernel``): its
  4 x 4 tiles, 16 C K values, are written and read back (``transform_bytes``). A block computes
  32 output channels of 32 output tiles of 2 x 2, laid out as the name's ``tile<a><b><c>``
  says: a images x b x c tiles. Its recorded grids are ceil(N/a) * ceil(K/32) *
  ceil(P/2b) * ceil(Q/2c) blocks on every fused row of the five GPUs (``fused_block``).
  ``tile148`` runs on every GPU; Pascal's kernels (``maxwell_``) have five more layouts for
  small maps and the A100's one more. Training reads the layout from the names; a forecast
  uses ``tile148`` (docs/predictor.md, "Convolutions": cuDNN's pick among them did not
  follow from the shape).
- ``fft``: 32 x 32 FFT tiles (``fft2d_r2c_32x32``): (32-R+1)^2 outputs per tile, a complex
  multiply-add (8 FLOPs) per frequency bin (32 * 17) and (n, c, k), plus 5 N log2 N FLOPs per
  transform (Cooley-Tukey count) and the complex buffers through DRAM.

Tensor cores (fp16 / bf16 / TF32) run implicit GEMM on NHWC data; channels are padded to the
MMA's multiple (8 for fp16/bf16, 4 for TF32: NVIDIA Deep Learning Performance documentation,
"Convolutional Layers User's Guide", channels-in/out requirements), and an NCHW tensor is
transposed to NHWC and back (``nchwToNhwcKernel`` in the recorded names), costed as extra bytes.
Grouped and depthwise convolutions are routed to the memory-bound rule (``routing.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from . import tiles as tl

ALGORITHMS = ("implicit_precomp_gemm", "implicit_gemm", "winograd", "winograd_nonfused", "fft")
# Winograd and FFT in cuDNN need unit stride and dilation; these kernels cover 3x3 filters.
WINOGRAD_TAPS = 3
FFT_TILE = 32  # fft2d_r2c_32x32
COMPLEX_BYTES = 8  # complex64
IMPLICIT_TILE = (128, 64)  # scudnn_128x64, the most frequent recorded tile
# The plain implicit GEMM (``implicit_convolve_sgemm``, ``explicit_convolve_sgemm``) computes
# 32 x 32 output tiles with 64 threads: its recorded grids are ceil(N P Q / 32) x ceil(K / 32)
# (T4: N 4, C 93, K 1230, 5 x 5 -> 4 x 39; N 10, K 477, 17 x 17 -> 91 x 15). cuDNN's
# benchmark picks it for convs with few output tiles (7 % of those under 20 tiles of 128 x 64).
SMALL_TILE = (32, 32)
# The nonfused Winograd's 36 batched SGEMMs run a cuBLAS-class SIMT kernel (``*_sgemm_*_nn``)
# whose tile differs by GPU generation: the A100's 2,594 recorded rows all ran 128 x 128, the
# T4's mostly 128 x 64, the V100's 64 x 64 and 32 x 128. Training reads it from the names
# (``gemm_tile``); a forecast takes the tile table's pick for the batched product
# (``winograd_gemm_tiles``); 64 x 64 where neither is given.
WINOGRAD_GEMM_TILE = (64.0, 64.0)
WINOGRAD_POSITIONS = 36.0  # F(4x4, 3x3): (4 + 3 - 1)^2 transformed positions, one GEMM each
# The nonfused Winograd lays the batch out in groups of 16 images: its SGEMM's rows are
# ceil(N / 16) * 16 * ceil(P/4) * ceil(Q/4) on every one of the 9,848 recorded nonfused rows
# of the five GPUs (grid x = ceil(rows / tile side); with N itself: 44-61 % of them). A batch
# of 1 runs 16 images' GEMM, which is why cuDNN rarely picks it for small batches.
NONFUSED_BATCH_MULTIPLE = 16.0
FUSED_CHANNELS = 32  # output channels per fused Winograd block (recorded grids)
FUSED_TILES = 32  # 2 x 2 output tiles per fused block, whatever their layout
# tile148: 1 image x 4 x 8 tiles of 2 x 2 outputs (8 x 16 outputs), run by every GPU
FUSED_DEFAULT = (1.0, 4.0, 8.0)
# Kernels each algorithm launches (the recorded names: offsets + GEMM; tile generation + fused
# Winograd; data, filter, output transforms + SGEMM; FFT data, filter, product, inverse).
LAUNCHES = {"implicit_precomp_gemm": 2, "implicit_gemm": 1, "winograd": 2,
            "winograd_nonfused": 4, "fft": 4}
TC_CHANNEL_MULTIPLE = {"float16": 8, "bfloat16": 8, "tf32": 4}
# The algorithms a forecast chooses among, in tie-break order (``candidates``): the ones cuDNN
# runs on 95-98 % of the recorded convs of every GPU. FFT (0.1-4 %) and the plain implicit
# GEMM (1-3 %) are recorded too, and trained on, but not candidates: few rows of either lie
# near any given shape, so a forecast of them is an extrapolation the pick would trust.
CANDIDATES = ("implicit_precomp_gemm", "winograd", "winograd_nonfused")


def classify_kernels(kernels: str) -> str:
    """The cuDNN algorithm behind the ';'-separated kernel names one conv launched."""
    low = kernels.lower()
    if "winograd_nonfused" in low:
        return "winograd_nonfused"
    if "winograd" in low:
        return "winograd"
    if "fft" in low:
        return "fft"
    if any(s in low for s in ("implicit_convolve_sgemm", "explicit_convolve_sgemm", "im2col")):
        return "implicit_gemm"
    return "implicit_precomp_gemm"


_FUSED_NAME = re.compile(r"scudnn_winograd_\w*?tile(\d)(\d)(\d)")


def fused_block(kernels: str) -> tuple[float, float, float]:
    """The fused Winograd block a conv's kernel names show (``tile244n``: 2 images x 4 x 4
    tiles of 2 x 2 outputs), ``FUSED_DEFAULT`` where they show none or a layout that is not
    32 tiles (every recorded one is; another would be a kernel this model does not know)."""
    m = _FUSED_NAME.search(kernels)
    block = tuple(float(v) for v in m.groups()) if m else FUSED_DEFAULT
    return block if block[0] * block[1] * block[2] == FUSED_TILES else FUSED_DEFAULT


_GEMM_NAME = re.compile(r"sgemm_(\d+)x(\d+)")


def gemm_tile(kernels: str) -> tuple[float, float]:
    """The nonfused Winograd SGEMM's tile its kernel names show (``ampere_sgemm_128x128_nn``
    -> (128, 128)), ``WINOGRAD_GEMM_TILE`` where they show none."""
    m = _GEMM_NAME.search(kernels) if "winograd_nonfused" in kernels.lower() else None
    return (float(m.group(1)), float(m.group(2))) if m else WINOGRAD_GEMM_TILE


@dataclass(frozen=True)
class ConvColumns:
    """Dense convolutions as parallel float64 arrays (``ConvDims`` fields, one row each)."""

    n: np.ndarray
    c: np.ndarray
    k: np.ndarray
    h: np.ndarray
    w: np.ndarray
    p: np.ndarray
    q: np.ndarray
    r: np.ndarray
    s: np.ndarray
    stride: np.ndarray
    itemsize: np.ndarray
    dtype: np.ndarray  # str
    nhwc: np.ndarray  # bool: the tensors are channels-last already
    algo: np.ndarray | None = None  # str, one of ALGORITHMS per row (features need it)
    fused: np.ndarray | None = None  # (rows, 3) fused Winograd block: images, tile rows, cols
    epilogue_bytes: np.ndarray | None = None  # a fused epilogue's extra reads (a residual)
    # (rows, 2) the nonfused Winograd SGEMM's tile: rows covering the T transformed tiles,
    # columns covering the K output channels (the recorded grids: x = ceil(T / first))
    gemm_tile: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.n)


def take(cc: ConvColumns, idx: np.ndarray) -> ConvColumns:
    """The rows ``idx`` of ``cc`` (repeats allowed)."""
    return ConvColumns(**{f.name: None if getattr(cc, f.name) is None
                          else getattr(cc, f.name)[idx] for f in fields(cc)})


def eligible(cc: ConvColumns) -> dict[str, np.ndarray]:
    """Which algorithms cuDNN offers per row (Winograd: 3x3, unit stride; FFT: unit stride)."""
    unit = cc.stride == 1
    three = (cc.r == WINOGRAD_TAPS) & (cc.s == WINOGRAD_TAPS) & unit
    ones = np.ones(len(cc), dtype=bool)
    return {"implicit_precomp_gemm": ones, "implicit_gemm": ones, "winograd": three,
            "winograd_nonfused": three, "fft": unit & (cc.r <= FFT_TILE // 2)}


def candidates(cc: ConvColumns, picks: tuple[np.ndarray, np.ndarray] | None = None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, algorithm, nonfused SGEMM tile) triples: every ``CANDIDATES`` algorithm cuDNN
    offers for each row, rows in order and implicit precomp GEMM (offered for every conv)
    first; the nonfused Winograd once per tile of ``picks`` (``winograd_gemm_tiles``: (row,
    tile) pairs), else once on ``WINOGRAD_GEMM_TILE``.

    cuDNN's heuristics pick a fast algorithm among those it offers, so a forecast costs each
    candidate and keeps the fastest (``predictor._fastest``; docs/predictor.md,
    "Convolutions"). No candidate's features depend on the batch N, each forecast grows with
    it, and a larger N's tiles are among a smaller one's, so their minimum never falls with N."""
    ok = eligible(cc)
    allowed = np.stack([ok[a] for a in CANDIDATES], axis=1)  # (rows, candidates)
    row, which = np.nonzero(allowed)
    algo = np.asarray(CANDIDATES, dtype=object)[which]
    tile = np.broadcast_to(np.asarray(WINOGRAD_GEMM_TILE), (len(row), 2)).copy()
    if picks is None:
        return row, algo, tile
    nonfused = algo == "winograd_nonfused"
    keep_row, keep_algo, keep_tile = row[~nonfused], algo[~nonfused], tile[~nonfused]
    pick_row, pick_tile = picks
    mine = ok["winograd_nonfused"][pick_row]
    row = np.concatenate([keep_row, pick_row[mine]])
    algo = np.concatenate([keep_algo, np.full(int(mine.sum()), "winograd_nonfused", dtype=object)])
    tile = np.concatenate([keep_tile, pick_tile[mine]])
    order = np.argsort(row, kind="stable")  # rows in order, the tie-break order within
    return row[order], algo[order], tile[order]


@dataclass(frozen=True)
class AlgorithmWork:
    """What one algorithm does per row: FLOPs, DRAM bytes, thread blocks."""

    flops: np.ndarray
    bytes: np.ndarray
    transform_bytes: np.ndarray  # part of ``bytes`` beyond X, W and Y once
    tiles: np.ndarray
    # FLOPs one padded tile computes, fixed by the tile and the reduction (not the batch):
    # the algorithm's FLOPs count the padding of its own output tiles (Winograd's 4 x 4),
    # the GEMM tiles pad again over that (a P = 5 output is 2 x 2 Winograd tiles in one
    # 128-row GEMM tile), so this is not ``flops / tiles``.
    tile_flops: np.ndarray
    reduction: np.ndarray  # the reduction length of one tile's GEMM (C*R*S, or C)
    tile_m: np.ndarray  # rows and columns of the output tile its DRAM traffic is counted on
    tile_n: np.ndarray


def tensor_bytes(cc: ConvColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes of X (N C H W), W (K C R S) and Y (N K P Q) at the rows' dtype."""
    return (cc.itemsize * cc.n * cc.c * cc.h * cc.w, cc.itemsize * cc.k * cc.c * cc.r * cc.s,
            cc.itemsize * cc.n * cc.k * cc.p * cc.q)


def direct_flops(cc: ConvColumns) -> np.ndarray:
    """The direct convolution's FLOPs: 2 N K P Q C R S (1 FMA = 2 FLOPs)."""
    return 2.0 * cc.n * cc.k * cc.p * cc.q * cc.c * cc.r * cc.s


def _pad_to(x: np.ndarray, multiple: np.ndarray) -> np.ndarray:
    return np.ceil(x / multiple) * multiple


def _fused_outputs(cc: ConvColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images, output rows, output cols) of one fused Winograd block per row."""
    block = np.broadcast_to(np.asarray(FUSED_DEFAULT, dtype=np.float64), (len(cc), 3)) \
        if cc.fused is None else cc.fused
    return block[:, 0], 2.0 * block[:, 1], 2.0 * block[:, 2]


def algorithm_work(cc: ConvColumns, algo: np.ndarray, matrix_dtype: np.ndarray) -> AlgorithmWork:
    """FLOPs, bytes and tiles of each row under its algorithm (module docstring)."""
    mult = np.array([TC_CHANNEL_MULTIPLE.get(d, 1) for d in cc.dtype], dtype=np.float64)
    mult = np.where(matrix_dtype, mult, 1.0)
    c, k = _pad_to(cc.c, mult), _pad_to(cc.k, mult)
    x_b, w_b, y_b = tensor_bytes(cc)
    io = x_b + w_b + y_b + (0.0 if cc.epilogue_bytes is None else cc.epilogue_bytes)
    # NCHW tensors on the tensor-core path: X transposed in (read + write) and Y back out.
    transpose = np.where(matrix_dtype & ~cc.nhwc, 2 * (x_b + y_b), 0.0)
    m = cc.n * cc.p * cc.q
    flops = 2.0 * m * k * c * cc.r * cc.s
    extra = transpose.copy()
    small = algo == "implicit_gemm"
    tile_m = np.where(small, SMALL_TILE[0], IMPLICIT_TILE[0])
    tile_n = np.where(small, SMALL_TILE[1], IMPLICIT_TILE[1])
    tiles = np.ceil(m / tile_m) * np.ceil(cc.k / tile_n)
    tile_flops = 2.0 * tile_m * tile_n * c * cc.r * cc.s
    # Winograd and FFT multiply transformed tiles over the channels only.
    reduction = np.where(np.isin(algo, ("winograd", "winograd_nonfused", "fft")), c,
                         c * cc.r * cc.s)

    sel = algo == "winograd_nonfused"  # F(4x4, 3x3): alpha = 6, 36 batched GEMMs
    t4 = nonfused_rows(cc)
    a2 = WINOGRAD_POSITIONS
    gemm_io = a2 * (t4 * cc.c + cc.c * cc.k + t4 * cc.k)  # transformed operands and result
    wino_extra = cc.itemsize * 2 * gemm_io  # each written by a transform and read back
    flops = np.where(sel, 2.0 * a2 * t4 * cc.c * cc.k, flops)
    extra = np.where(sel, wino_extra, extra)
    wt = (np.broadcast_to(np.asarray(WINOGRAD_GEMM_TILE), (len(cc), 2))
          if cc.gemm_tile is None else cc.gemm_tile)
    tiles = np.where(sel, a2 * np.ceil(t4 / wt[:, 0]) * np.ceil(cc.k / wt[:, 1]), tiles)
    tile_flops = np.where(sel, 2.0 * wt[:, 0] * wt[:, 1] * cc.c, tile_flops)
    tile_m, tile_n = np.where(sel, wt[:, 0], tile_m), np.where(sel, wt[:, 1], tile_n)

    sel = algo == "winograd"  # fused F(2x2, 3x3): alpha = 4
    t2 = cc.n * np.ceil(cc.p / 2) * np.ceil(cc.q / 2)
    flops = np.where(sel, 2.0 * 16.0 * t2 * cc.c * cc.k, flops)
    img, rb, qb = _fused_outputs(cc)
    tiles = np.where(sel, np.ceil(cc.n / img) * np.ceil(cc.k / FUSED_CHANNELS)
                     * np.ceil(cc.p / rb) * np.ceil(cc.q / qb), tiles)
    # 32 channels of 32 tiles, 16 multiplies per (channel pair, 2 x 2 tile)
    tile_flops = np.where(sel, 2.0 * 16.0 * FUSED_CHANNELS * FUSED_TILES * cc.c, tile_flops)
    # the transformed filter (4 x 4 per channel pair), written by its kernel and read back
    extra = np.where(sel, cc.itemsize * 2.0 * 16.0 * cc.c * cc.k, extra)

    sel = algo == "fft"
    out_per_tile = np.maximum(FFT_TILE - cc.r + 1, 1.0)
    per_img = np.ceil(cc.p / out_per_tile) * np.ceil(cc.q / out_per_tile)
    bins = FFT_TILE * (FFT_TILE // 2 + 1)
    points = FFT_TILE * FFT_TILE
    transforms = cc.n * cc.c * per_img + cc.k * cc.c + cc.n * cc.k * per_img
    fft_flops = (8.0 * cc.n * cc.k * cc.c * per_img * bins
                 + 5.0 * points * np.log2(points) * transforms)
    flops = np.where(sel, fft_flops, flops)
    extra = np.where(sel, 2.0 * COMPLEX_BYTES * bins * transforms, extra)
    tiles = np.where(sel, np.ceil(cc.n * per_img * bins / IMPLICIT_TILE[0])
                     * np.ceil(cc.k / IMPLICIT_TILE[1]), tiles)
    # a complex multiply-add (8 FLOPs) per frequency bin of the tile, over the channels
    tile_flops = np.where(sel, 8.0 * IMPLICIT_TILE[0] * IMPLICIT_TILE[1] * c, tile_flops)
    return AlgorithmWork(flops, io + extra, extra, np.maximum(tiles, 1.0), tile_flops, reduction,
                         tile_m.astype(np.float64), tile_n.astype(np.float64))


def nonfused_rows(cc: ConvColumns) -> np.ndarray:
    """Rows T of the nonfused Winograd's SGEMMs: the batch in whole groups of 16 images, 4 x 4
    output tiles of each (``NONFUSED_BATCH_MULTIPLE``)."""
    images = np.ceil(cc.n / NONFUSED_BATCH_MULTIPLE) * NONFUSED_BATCH_MULTIPLE
    return images * np.ceil(cc.p / 4) * np.ceil(cc.q / 4)


def winograd_gemm_tiles(cc: ConvColumns, table: tl.TileTable, arch: str,
                        sm_count: float) -> tuple[np.ndarray, np.ndarray]:
    """(row, tile (., 2)) pairs: the tiles the tile table picks for each row's nonfused
    Winograd SGEMMs, the batched product of 36 (K x C) @ (C x T) in tilecast's (b, m, n, k),
    whose output columns (n = T) the tile's first side covers (as a matmul's ``tm`` covers
    n). The picks are the tree's for T at the largest power-of-two count of 16-image groups
    not above the batch's (``nonfused_rows``) and for that T doubled until past the tree's
    thresholds (``TileTable.growing_picks``): a larger N's picks are among a smaller one's, so
    the fastest candidate never falls with N.

    On the shared conv data the table's pick at the row's own T is what ran on 100 % of the
    A100 80GB's nonfused rows (no A100 80GB trained the table), 96 % of the T4's and 70 % of
    the V100's; Pascal's cuDNN runs 32 x 128 and 64 x 64 where its batched matmuls run
    128 x 64 (docs/predictor.md, "The nonfused SGEMM's tile")."""
    per_group = NONFUSED_BATCH_MULTIPLE * np.ceil(cc.p / 4) * np.ceil(cc.q / 4)
    groups = np.ceil(cc.n / NONFUSED_BATCH_MULTIPLE)
    t_ref = per_group * 2.0 ** np.floor(np.log2(np.maximum(groups, 1.0)))
    b, sms = np.full(len(cc), WINOGRAD_POSITIONS), np.full(len(cc), float(sm_count))
    row, tiles = table.growing_picks(arch, "nn", b, cc.k, t_ref, cc.c, sms)
    return row, np.stack(tl.split_tiles(tiles), axis=1)


def algorithm_strings(algo: np.ndarray) -> np.ndarray:
    """The "tile" a forecast shows for a conv: its cuDNN algorithm."""
    return np.asarray(algo, dtype=object)
