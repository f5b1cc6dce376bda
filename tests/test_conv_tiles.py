"""The tiles of cuDNN's conv kernels: the nonfused Winograd SGEMM's tile (from the kernel names
in training, from the tile table in a forecast) and the FLOPs one padded tile computes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from tilecast.learned import conv as cv
from tilecast.learned import tiles as tl

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "neusight-asplos25"
needs_data = pytest.mark.skipif(not (DATA / "kernels/nvidia/train/conv").is_dir(),
                                reason="shared NeuSight conv data absent (../shared/datasets)")
NONFUSED = np.array(["winograd_nonfused"], dtype=object)


def _cols(n, c, k, hw, tile=None):
    one = np.ones(1)
    return cv.ConvColumns(*(v * one for v in (n, c, k, hw, hw, hw, hw, 3, 3, 1)),
                          itemsize=4.0 * one, dtype=np.array(["float32"], dtype=object),
                          nhwc=np.zeros(1, dtype=bool),
                          gemm_tile=None if tile is None else np.array([tile], dtype=float))


@pytest.mark.parametrize("kernels, tile", [
    (";void cudnn::winograd_nonfused::winogradforwarddata4x4<float, float>(x);"
     "ampere_sgemm_128x128_nn;void cudnn::winograd_nonfused::winogradforwardoutput4x4(x)",
     (128.0, 128.0)),
    (";void cudnn::winograd_nonfused::winogradforwarddata4x4<float, float>(x);"
     "volta_sgemm_32x128_nn", (32.0, 128.0)),
    # no SGEMM named, or not the nonfused algorithm: the default tile
    (";void cudnn::winograd_nonfused::winogradforwarddata4x4<float, float>(x)",
     cv.WINOGRAD_GEMM_TILE),
    (";void cudnn::cnn::im2col4d_kernel<float, long>(x);volta_sgemm_64x128_nn",
     cv.WINOGRAD_GEMM_TILE),
])
def test_nonfused_gemm_tile_from_kernel_names(kernels, tile):
    assert cv.gemm_tile(kernels) == tile


# N 55, C 1701, K 569 on 5 x 5 outputs (the A100 CSV's second row, grid 2 x 5 x 36):
# T = ceil(55/16) * 16 * ceil(5/4)^2 = 256 rows; 128 x 128 -> 36 * 2 * 5 = 360 blocks;
# 32 x 128 -> 36 * ceil(256/32) * ceil(569/128) = 36 * 8 * 5 = 1440.
@pytest.mark.parametrize("tile, blocks", [((128.0, 128.0), 360), ((32.0, 128.0), 1440),
                                          (None, 36 * 4 * 9)])
def test_nonfused_blocks_follow_the_gemm_tile(tile, blocks):
    work = cv.algorithm_work(_cols(55, 1701, 569, 5, tile), NONFUSED, np.zeros(1, dtype=bool))
    assert work.tiles[0] == blocks


# One padded tile's FLOPs are fixed by the tile and the channels, whatever the map: a 5 x 5
# output pads to 2 x 2 Winograd tiles (64 outputs for 25) inside the algorithm's FLOPs, and a
# GEMM tile does not pad that again. 128 x 128 nonfused: 2 * 128 * 128 * C; fused: 32
# channels x 32 tiles x 16 multiplies x C; implicit GEMM: 2 * 128 * 64 * C * 9.
@pytest.mark.parametrize("algo, per_tile", [
    ("winograd_nonfused", 2 * 128 * 128 * 96), ("winograd", 2 * 16 * 32 * 32 * 96),
    ("implicit_precomp_gemm", 2 * 128 * 64 * 96 * 9)])
@pytest.mark.parametrize("hw", [5, 8, 13, 56])
def test_a_padded_tile_computes_the_same_flops_on_any_map(algo, per_tile, hw):
    work = cv.algorithm_work(_cols(3, 96, 200, hw, (128.0, 128.0)),
                             np.array([algo], dtype=object), np.zeros(1, dtype=bool))
    assert work.tile_flops[0] == per_tile
    # the tiles hold at least the algorithm's FLOPs
    assert work.tiles[0] * work.tile_flops[0] >= work.flops[0]


def test_the_tile_table_picks_per_generation():
    """The shipped table: Ampere's batched SGEMM tree picks 128 x 128 for a large product, as
    every nonfused row of the A100 80GB ran; the pick is one of what the family ran."""
    from tilecast.device_db.loader import load_device

    table = tl.load_tile_table()
    cc = _cols(55, 1701, 569, 5)
    a100 = load_device("a100-pcie-80gb")
    row, tile = cv.winograd_gemm_tiles(cc, table, a100.arch, a100.sm_count)
    assert row.tolist() == [0] and tile.tolist() == [[128, 128]]
    v100 = load_device("v100-pcie-32gb")
    row, tile = cv.winograd_gemm_tiles(cc, table, v100.arch, v100.sm_count)
    assert (row == 0).all() and len(np.unique(tile, axis=0)) == len(tile)
    assert {f"{a:.0f}x{b:.0f}" for a, b in tile} <= set(table.tree_for("volta", "nn").tiles)


# A larger batch's tiles are among a smaller one's (the ladder starts at the largest power of
# two not above N and doubles T from there): N 3 -> {4, 8, ...} x T per image is inside
# N 2's {2, 4, 8, ...}; so the fastest candidate never falls with N, on every GPU.
@pytest.mark.parametrize("device", ["a100-pcie-80gb", "v100-pcie-32gb", "t4", "tesla-p4",
                                    "l4", "h100-sxm5-80gb"])
@pytest.mark.parametrize("hw, c, k", [(5, 1701, 569), (14, 256, 256), (56, 64, 64),
                                      (28, 128, 512)])
def test_a_larger_batchs_tiles_are_among_a_smaller_ones(device, hw, c, k):
    from tilecast.device_db.loader import load_device

    dev, table = load_device(device), tl.load_tile_table()
    seen = None
    for n in range(1, 40):
        _, tile = cv.winograd_gemm_tiles(_cols(n, c, k, hw), table, dev.arch, dev.sm_count)
        mine = {tuple(t) for t in tile.tolist()}
        assert seen is None or mine <= seen, (n, mine, seen)
        seen = mine


def test_the_predictor_serves_the_tile_table_pick():
    """Serving (``OnnxPredictor``) costs a nonfused conv on the tiles its tile table picks,
    as the protocol (``conv_data.fastest``) does: the A100's 128 x 128, and another table's
    pick changes the nonfused candidate's compute term and nothing else."""
    from tilecast.analyzer.types import ConvDims, Kernel, MatmulDims, OpCost
    from tilecast.device_db.loader import load_device
    from tilecast.learned.predictor import OnnxPredictor
    from tilecast.learned.routing import route

    pred = OnnxPredictor()
    if not pred.conv_model:
        pytest.skip("the shipped artifact has no conv family")
    a100 = load_device("a100-pcie-80gb")
    kernel = Kernel("c", ("c",), "Conv", OpCost(
        "conv", 2 * 55 * 569 * 25 * 1701 * 9, 4 * 55 * 25 * (1701 + 569), "float32",
        "matrix", matmul=MatmulDims(1, 55 * 25, 569, 1701 * 9),
        conv=ConvDims(55, 1701, 569, 5, 5, 5, 5, 3, 3, pad=1)))
    part = route([kernel], conv_model=True).parts["conv"]
    _, served = cv.winograd_gemm_tiles(part.columns, pred.tile_table, a100.arch, a100.sm_count)
    assert served.tolist() == [[128, 128]]
    shipped, labels, _ = pred._features("conv", part, a100)
    pred.tile_table = _OneTile("64x64")
    other, _, _ = pred._features("conv", part, a100)
    nonfused = labels == "winograd_nonfused"
    assert nonfused.sum() == 1 and len(labels) == 3
    # 128 x 128: 36 * 2 * 5 = 360 blocks, 4 waves of 2 * 128^2 * 1701 FLOPs on 108 SMs;
    # 64 x 64: 36 * 4 * 9 = 1296 blocks, 12 waves of a quarter of that: 0.75x the term
    ratio = other.compute_ms[nonfused] / shipped.compute_ms[nonfused]
    assert ratio == pytest.approx(0.75)
    assert np.array_equal(other.compute_ms[~nonfused], shipped.compute_ms[~nonfused])


class _OneTile:
    """A tile table whose tree picks one tile for every nonfused product."""

    def __init__(self, tile: str) -> None:
        self.tile = tile

    def growing_picks(self, arch, layout, b, m, n, k, sms):
        return np.arange(len(b)), np.full(len(b), self.tile, dtype=object)


@needs_data
def test_nonfused_tiles_and_batch_groups_reproduce_the_recorded_grids():
    """Every nonfused Winograd row of the five GPUs: the SGEMM tile its names show, over
    ceil(N / 16) * 16 images' 4 x 4 tiles, gives its recorded grid exactly (x = ceil(T /
    first side), y = ceil(K / second side), z = 36). With N itself for T, x is right on only
    44-61 % of the rows."""
    from test_learned_conv import recorded_work

    from tilecast.learned import conv_data as cd

    checked, plain = 0, 0
    for path in cd.conv_files([DATA]):
        with path.open(newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if "winograd_nonfused" in r["Kernels"]
                    and "sgemm" in r["Kernel Name"]]
        tile = np.array([cv.gemm_tile(r["Kernels"]) for r in rows])
        cc, work = recorded_work(rows, "winograd_nonfused", gemm_tile=tile)
        n, p = cc.n, cc.p
        x, y, z = (np.array([float(r[f"Grid {a}"]) for r in rows]) for a in "xyz")
        assert (work.tiles == x * y * z).all(), path.name
        assert (x == np.ceil(cv.nonfused_rows(cc) / tile[:, 0])).all(), path.name
        checked += len(rows)
        plain += int((x == np.ceil(n * np.ceil(p / 4) ** 2 / tile[:, 0])).sum())
    assert checked > 8000 and plain / checked < 0.65


# A batch of 1 to 16 runs one group of 16 images: the nonfused GEMM's FLOPs and its
# transformed bytes are those of 16 images (2 * 36 * 16 * 4 * C * K for a 5 x 5 map).
@pytest.mark.parametrize("n, images", [(1, 16), (15, 16), (16, 16), (17, 32), (48, 48)])
def test_nonfused_runs_whole_groups_of_16_images(n, images):
    work = cv.algorithm_work(_cols(n, 96, 200, 5), NONFUSED, np.zeros(1, dtype=bool))
    assert work.flops[0] == 2 * 36 * images * 4 * 96 * 200


@needs_data
def test_the_tile_table_knows_the_a100s_nonfused_tile_without_its_data():
    """No A100 80GB row trained the tile table (its Ampere trees are the A100 PCIe 40GB's
    matmul sweep), yet its pick is the tile every A100 80GB nonfused conv ran."""
    from tilecast.learned import conv_data as cd

    s = cd.load_conv([DATA])
    a100 = s.select((s.device == "NVIDIA A100 80GB PCIe") & (s.algo == "winograd_nonfused"))
    row, tile = a100.gemm_tile_picks()
    assert len(a100) > 2000 and np.array_equal(np.sort(row), np.arange(len(a100)))
    assert (tile == a100.gemm_tile[row]).all()
