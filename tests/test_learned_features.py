"""Features, tiles and kernel-name parsing of the learned predictor (no data, no torch)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilecast.device_db.loader import load_device
from tilecast.learned import features as ft
from tilecast.learned import row_tiles as rt
from tilecast.learned import tiles as tl


def _columns(n: int = 5, seed: int = 0) -> ft.KernelColumns:
    rng = np.random.default_rng(seed)
    b, m, nn, k = (np.floor(2 ** rng.uniform(0, 11, n)) for _ in range(4))
    rows, cols = np.floor(2 ** rng.uniform(0, 14, n)), np.floor(2 ** rng.uniform(0, 13, n))
    return ft.KernelColumns(
        flops=2 * b * m * nn * k, bytes=4 * b * (m * k + k * nn + m * nn), itemsize=np.full(n, 4.0),
        elements=rows * cols, b=b, m=m, n=nn, k=k, rows=rows, cols=cols,
        tile_m=np.full(n, 128.0), tile_n=np.full(n, 64.0))


def _device_columns(n: int, name: str = "NVIDIA L4") -> ft.DeviceColumns:
    dtypes, units = np.full(n, "float32", dtype=object), np.full(n, "vector", dtype=object)
    return ft.device_columns([load_device(name)], np.zeros(n, dtype=np.int64), dtypes, units)


def test_every_feature_is_named_with_units() -> None:
    for family, names in ft.FEATURES.items():
        assert len(names) == len(set(names)), family
        assert all(name in ft.UNITS for name in names), family
        assert ft.BUILDERS[family] is not None


TERMS = ("compute_ms", "dram_ms", "cached_ms", "waves", "launch_ms")
# Families built from KernelColumns (conv takes ConvColumns: tests/test_learned_conv.py).
KERNEL_FAMILIES = sorted(set(ft.FEATURES) - {"conv"})
UNBOUNDED = ("operands_per_element", "rows_per_block", "tile_intensity", "amd",
             "layout_tn", "tensor_core")


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_features_deterministic_finite_and_ordered(family: str) -> None:
    kc, dc = _columns(), _device_columns(5)
    a, b = ft.build_features(family, kc, dc), ft.build_features(family, kc, dc)
    assert a.names == ft.FEATURES[family]
    assert a.x.dtype == np.float32 and a.x.shape == (5, len(a.names))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.compute_ms, b.compute_ms)
    assert np.isfinite(a.x).all()
    assert all((getattr(a, t) >= 0).all() and np.isfinite(getattr(a, t)).all() for t in TERMS)
    assert np.allclose(a.launch_ms, 0.005)  # the device database's 5 us
    bounded = [i for i, n in enumerate(a.names) if "log2" not in n and n not in UNBOUNDED]
    assert (a.x[:, bounded] >= 0).all() and (a.x[:, bounded] <= 1 + 1e-6).all()


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_model_inputs_do_not_depend_on_size(family: str) -> None:
    # Monotonicity rests on this: growing a kernel changes its work terms, never ``x``
    # (rows for row kernels; batch for matmul and elementwise, at a fixed tile).
    kc = _columns()
    big = ft.KernelColumns(**{**kc.__dict__, "b": kc.b * 3, "rows": kc.rows * 3,
                              "elements": kc.elements * 3, "flops": kc.flops * 3,
                              "bytes": kc.bytes * 3})
    small, large = (ft.build_features(family, c, _device_columns(5)) for c in (kc, big))
    assert np.array_equal(small.x, large.x)
    for t in ("compute_ms", "dram_ms", "waves"):
        assert (getattr(large, t) >= getattr(small, t)).all(), t
    assert (large.dram_ms + large.cached_ms >= small.dram_ms + small.cached_ms).all()


def _elementwise(elements: float, device: str = "NVIDIA A100 SXM4 40GB") -> ft.Features:
    kc = ft.KernelColumns(
        flops=np.array([elements]), bytes=np.array([12.0 * elements]), itemsize=np.array([4.0]),
        elements=np.array([elements]), b=np.ones(1), m=np.ones(1), n=np.ones(1), k=np.ones(1),
        rows=np.ones(1), cols=np.array([elements]), tile_m=np.zeros(1), tile_n=np.zeros(1))
    return ft.build_features("elementwise", kc, _device_columns(1, device))


def test_a_partly_filled_streaming_wave_costs_its_share() -> None:
    # A100 SXM4: 108 SMs x 16 resident 128-thread blocks = 1,728 blocks of 512 fp32 per wave.
    capacity = 108 * 16 * 512
    full, half, one = (_elementwise(e) for e in (capacity, capacity / 2, 128))
    assert full.waves[0] == 1.0 and half.waves[0] == pytest.approx(0.5)
    assert one.waves[0] == pytest.approx(1 / 1728)  # one block of 1,728
    assert half.wave_ms[0] == pytest.approx(full.wave_ms[0] / 2)
    # Past one wave, the tail wave still counts whole (the learned per-wave costs).
    assert _elementwise(capacity + 512).waves[0] == 2.0
    # Layer norm's and matmul's waves stay whole: a lone long-row block or GEMM tile is not
    # held to a share of the DRAM bandwidth (docs/predictor.md, "Partly filled waves").
    one_row = ft.KernelColumns(**{**_columns(1).__dict__, "b": np.ones(1), "m": np.ones(1),
                                  "rows": np.ones(1)})
    for family in ("layernorm", "matmul"):
        assert ft.build_features(family, one_row, _device_columns(1)).waves[0] == 1.0, family


def test_tiny_streaming_kernels_wave_terms_do_not_name_the_gpu() -> None:
    # 128 elements: one block on any GPU, so its per-wave terms are a few thousandths of a
    # wave everywhere, and its wave bytes one block's (6 kB: 19 ns at a T4's 320 GB/s), not a
    # whole wave of each GPU's SMs x resident blocks (P100: 896 blocks, 7.5 us).
    for name in ("Tesla P100 PCIe 16GB", "Tesla T4", "NVIDIA H100 SXM5 80GB"):
        f = _elementwise(128, name)
        assert f.waves[0] < 0.01 and f.wave_ms[0] < 5e-5, name


def test_roofline_terms_follow_the_device() -> None:
    kc = _columns(1)
    l4 = ft.build_features("matmul", kc, _device_columns(1, "NVIDIA L4"))
    t4 = ft.build_features("matmul", kc, _device_columns(1, "Tesla T4"))
    # FLOPs / peak and bytes / bandwidth, in ms: L4 30.3 TFLOP/s, 300 GB/s.
    assert l4.roof_compute_ms[0] == pytest.approx(kc.flops[0] / 30.3e12 * 1e3)
    assert l4.roof_memory_ms[0] == pytest.approx(kc.bytes[0] / 300e9 * 1e3)
    assert t4.roof_compute_ms[0] > l4.roof_compute_ms[0]
    # Whole waves of whole tiles: never less than the plain roofline.
    assert l4.compute_ms[0] >= l4.roof_compute_ms[0]


def test_fp16_changes_itemsize_feature_and_peak() -> None:
    kc = _columns(1)
    dev = load_device("NVIDIA A100 80GB PCIe")
    cols = [ft.device_columns([dev], np.zeros(1, dtype=np.int64), np.array([dt], dtype=object),
                              np.array(["matrix"], dtype=object)) for dt in ("float32", "float16")]
    assert cols[1].peak_flops[0] > 10 * cols[0].peak_flops[0]  # tensor cores vs fp32 SIMT
    half = ft.KernelColumns(**{**kc.__dict__, "itemsize": np.array([2.0])})
    f = ft.build_features("matmul", half, cols[1])
    assert f.x[0, f.names.index("log2_itemsize_bytes")] == pytest.approx(1.0)


@pytest.mark.parametrize(("name", "tile"), [
    ("ampere_sgemm_128x64_nn", (128, 64)),
    ("volta_sgemm_32x32_sliced1x4_tn", (32, 32)),
    ("maxwell_sgemm_128x64_nn", (128, 64)),
    ("sgemm_32x32x32_NN_vec", (32, 32)),
    ("sgemm_128x128x8_NT_vec", (128, 128)),
    ("void cutlass::Kernel<cutlass_80_simt_sgemm_256x128_8x4_tn_align1>(...)", (256, 128)),
    ("cudnn_infer_ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", (128, 128)),
    ("cutlass_80_tensorop_s1688gemm_tilesize128x256x16_stage3", (128, 256)),
    ("Cijk_Ailk_Bljk_SB_MT128x64x16_MI32x32x2x1_SE_1LDSB0", (128, 64)),
    ("void at::native::vectorized_elementwise_kernel<4, ...>", None),
])
def test_parse_tile(name: str, tile: tuple[int, int] | None) -> None:
    assert tl.parse_tile(name) == tile


@pytest.mark.parametrize(("name", "family"), [
    ("ampere_sgemm_128x64_nn", "ampere"), ("volta_sgemm_64x64_nn", "volta"),
    ("maxwell_sgemm_128x64_tn", "maxwell"), ("sgemm_32x32x32_NN", None)])
def test_kernel_family(name: str, family: str | None) -> None:
    assert tl.kernel_family(name) == family


@pytest.mark.parametrize(("rows", "cols", "blocks", "threads"), [
    # Grids recorded in the NeuSight data (softmax_warp_forward: 128-thread blocks, 4 rows
    # per block above 128 columns, 8 at or below; cunn_SoftMaxForward: a block per row).
    (127, 168, 32, 128), (223, 114, 28, 128), (77, 3, 2, 128),
    (32768, 1600, 32768, 256), (32768, 10240, 32768, 512), (100, 1025, 100, 128),
    (100, 1033, 100, 256), (100, 2065, 100, 512),
])
def test_softmax_tiles_match_recorded_grids(rows: int, cols: int, blocks: int,
                                            threads: int) -> None:
    got_blocks, _, got_threads = rt.softmax_tiles(np.array([rows]), np.array([cols]),
                                                  np.array([4.0]))
    assert (got_blocks[0], got_threads[0]) == (blocks, threads)


@pytest.mark.parametrize(("cols", "cuda", "rocm"), [
    # cunn_SoftMaxForward's block: CUDA's recorded launches take the power of two below half
    # of cols / 4; every recorded MI100 / MI210 launch takes 1024 threads. Warp-kernel rows
    # (up to 1024 fp32 columns) are the same rule on both.
    (1600, 256, 1024), (4000, 512, 1024), (1000, 128, 128),
])
def test_softmax_block_threads_by_vendor(cols: int, cuda: int, rocm: int) -> None:
    args = np.array([64.0]), np.array([float(cols)]), np.array([4.0])
    assert rt.softmax_tiles(*args)[2][0] == cuda
    assert rt.softmax_tiles(*args, amd=np.array([1.0]))[2][0] == rocm


def test_elementwise_and_layernorm_tiles() -> None:
    # add of 127 x 168 fp32: ceil(21336 / 512) = 42 blocks (recorded grid 42).
    blocks, per_block = rt.elementwise_tiles(np.array([127 * 168]), np.array([4.0]))
    assert (blocks[0], per_block[0]) == (42, 512)
    blocks, _ = rt.elementwise_tiles(np.array([127 * 168]), np.array([2.0]))  # 8 fp16 / thread
    assert blocks[0] == 21
    assert rt.layernorm_tiles(np.array([60]))[0][0] == 60


def test_tile_tree_round_trip_and_prediction() -> None:
    tree = tl.TileTree(np.array([0, -1, -1]), np.array([5.0, 0, 0]), np.array([1, -1, -1]),
                       np.array([2, -1, -1]), np.array([0, 0, 1]), ("64x64", "128x128"))
    x = np.array([[4.0], [6.0]])
    assert list(tree.predict(x)) == ["64x64", "128x128"]
    again = tl.TileTree.from_json(tree.to_json())
    assert list(again.predict(x)) == ["64x64", "128x128"]


def test_tile_table_uses_nearest_older_generation() -> None:
    leaf = tl.TileTree(np.array([-1]), np.zeros(1), np.array([-1]), np.array([-1]),
                       np.array([0]), ("128x128",))
    one = tl.TileTree(np.array([-1]), np.zeros(1), np.array([-1]), np.array([-1]),
                      np.array([0]), ("1",))
    table = tl.TileTable({"ampere/nn": leaf, "ampere/tn": leaf, "ampere/nn/split": one,
                          "ampere/tn/split": one}, {})
    x = tl.tree_features(np.array([8]), np.array([512]), np.array([512]), np.array([64]),
                         np.array([58]))
    tiles, splits = table.select("ada", np.array(["nn"], dtype=object), x)
    assert tiles[0] == "128x128" and splits[0] == 1
    assert table.tree_for("hopper", "tn") is leaf


def _one_split_table(feature: int, threshold: float, tiles: tuple[str, str]) -> tl.TileTable:
    """Ampere trees for both layouts: ``tiles[0]`` up to ``threshold`` on tree input
    ``feature``, ``tiles[1]`` above; never split-K."""
    tree = tl.TileTree(np.array([feature, -1, -1]), np.array([threshold, 0, 0]),
                       np.array([1, -1, -1]), np.array([2, -1, -1]), np.array([0, 0, 1]), tiles)
    one = tl.TileTree(np.array([-1]), np.zeros(1), np.array([-1]), np.array([-1]),
                      np.array([0]), ("1",))
    return tl.TileTable({"ampere/nn": tree, "ampere/tn": tree, "ampere/nn/split": one,
                         "ampere/tn/split": one}, {})


def test_a_family_without_measurements_takes_its_vendors_newest_older_one() -> None:
    # Without an Ampere tree (the A100 held out), an Ampere or Ada GPU takes Volta's, not the
    # AMD Tensile tree that sorts first; an AMD GPU keeps cdna; a table of one vendor serves
    # the other (a user's partial table).
    base = _one_split_table(1, 9.0, ("64x64", "128x128")).trees
    volta, cdna = base["ampere/tn"], _one_split_table(1, 9.0, ("96x96", "128x160")).trees
    table = tl.TileTable({"volta/tn": volta, "cdna/tn": cdna["ampere/tn"]}, {})
    assert table.tree_for("ampere", "tn") is volta and table.tree_for("ada", "tn") is volta
    assert table.tree_for("cdna3", "tn") is cdna["ampere/tn"]
    only_amd = tl.TileTable({"cdna/tn": cdna["ampere/tn"]}, {})
    assert only_amd.tree_for("hopper", "tn") is cdna["ampere/tn"]


def test_tile_candidates_climb_the_batch_ladder() -> None:
    # One tree on log2_m (feature 1): 64x64 up to m = 2^9, 128x128 above; split always 1. A
    # linear of 100 rows gets its own pick, then 128x128 from 800 rows (100 x 2^3) up; a
    # linear of 4096 rows has only 128x128. A batched product of two climbs its batch, not
    # its rows: its 100 rows never pass the threshold. Linear (tn) rows double m, batched
    # (nn) rows b; a lone nn product (b = 1: a Gemm with B stored k x n) both, so it meets
    # 128x128 at 800 rows too (its rows rung comes before row 0's in the rung order).
    table = _one_split_table(1, 9.0, ("64x64", "128x128"))
    ones = np.ones(4)
    row, tile, split = table.candidates(
        "ampere", np.array(["tn", "tn", "nn", "nn"], dtype=object), np.array([1, 1, 2, 1]),
        np.array([100, 4096, 100, 100]), 512 * ones, 512 * ones, 108 * ones)
    assert list(row) == [0, 1, 2, 3, 3, 0]
    assert list(tile) == ["64x64", "128x128", "64x64", "64x64", "128x128", "128x128"]
    assert list(split) == [1] * 6


def test_tile_candidates_descend_the_reduction_ladder() -> None:
    # One tree on log2_k (feature 3): 128x64 up to k = 2^15, 128x32 above (the Ampere trees'
    # switch on Linears of 32,768+ input features). k = 2^16 also gets 128x64, the pick for
    # its halved reduction; k = 2^10 lies below the threshold and has its own pick only.
    table = _one_split_table(3, 15.0, ("128x64", "128x32"))
    ones = np.ones(2)
    row, tile, _ = table.candidates("ampere", np.array(["tn", "tn"], dtype=object), ones,
                                    1280 * ones, 5120 * ones, np.array([2**16, 2**10]),
                                    58 * ones)
    assert list(row) == [0, 1, 0] and list(tile) == ["128x32", "128x64", "128x64"]


@pytest.mark.parametrize("m, k", [(16, 2**16), (100, 3000), (1000, 50272), (4096, 64)])
def test_a_larger_batch_has_no_candidate_the_smaller_lacks(m: int, k: int) -> None:
    # The shipped trees: each candidate of 2m rows is one of m rows' (both ladders), so the
    # fastest of them cannot be faster at 2m than at m (tests/test_predictor_properties.py)
    from tilecast.learned.predictor import default_predictor

    table = default_predictor().tile_table
    for arch in ("maxwell", "volta", "ampere", "cdna2"):  # cdna: below 512 rows, filling splits
        got = {}
        for rows in (m, 2 * m):
            _, tile, split = table.candidates(arch, np.array(["tn"], dtype=object), np.ones(1),
                                              np.array([rows]), np.array([768]),
                                              np.array([k]), np.array([80]))
            got[rows] = set(zip(tile.tolist(), split.tolist(), strict=True))
        assert got[2 * m] <= got[m], (arch, got)


def test_tile_labels_parse_back() -> None:
    labels = tl.tile_labels(np.array(["128x64", "32x32"], dtype=object), np.array([3.0, 1.0]))
    assert list(labels) == ["128x64/3", "32x32"]
    tiles, splits = tl.parse_labels(labels)
    assert list(tiles) == ["128x64", "32x32"] and list(splits) == [3.0, 1.0]


def test_tile_table_schema_is_checked() -> None:
    from tilecast.errors import PredictorError

    with pytest.raises(PredictorError, match="schema"):
        tl.parse_tile_table({"schema": 999, "tree_features": list(tl.TREE_FEATURES)}, "x")
    table = _one_split_table(1, 9.0, ("64x64", "128x128")).to_json()
    table["trees"]["ampere/tn"]["x_lo"] = [0.0, 9.0]  # one value per tree input, not 2
    with pytest.raises(PredictorError, match="malformed"):
        tl.parse_tile_table(table, "x")


def _ranged(tree: tl.TileTree, lo: list[float], hi: list[float]) -> tl.TileTree:
    return dataclasses.replace(tree, x_lo=np.array(lo), x_hi=np.array(hi))


def test_tile_table_keeps_each_trees_input_range_and_reads_a_table_without_it() -> None:
    table = _one_split_table(1, 9.0, ("64x64", "128x128"))
    lo, hi = [0.0, 9.0, 9.0, 9.0, 6.0, -2.0], [0.0, 16.0, 16.0, 16.0, 7.0, 11.0]
    ranged = tl.TileTable({k: _ranged(t, lo, hi) for k, t in table.trees.items()}, {})
    back = tl.parse_tile_table(ranged.to_json(), "x")
    assert list(back.trees["ampere/tn"].x_lo) == lo and list(back.trees["ampere/tn"].x_hi) == hi
    old = table.to_json() | {"schema": 2}  # no x_lo / x_hi: every row counts as evidenced
    assert tl.parse_tile_table(old, "x").trees["ampere/tn"].x_lo is None
    assert not tl.parse_tile_table(old, "x").below_evidence(
        "ampere", np.array(["tn"], dtype=object), np.ones(1), np.array([4.0])).any()


# Trained linears start at 2^9 = 512 rows, batched products at a batch of 2^3 = 8: a linear
# of 511 rows and a product of batch 7 lie below; 512 rows, batch 8 and more do not.
@pytest.mark.parametrize(("layout", "b", "m", "below"), [
    ("tn", 1, 511, True), ("tn", 1, 512, False), ("tn", 1, 65536, False),
    ("nn", 7, 4096, True), ("nn", 8, 16, False),
])
def test_rows_below_the_measured_batch_dimension_are_found(layout: str, b: int, m: int,
                                                           below: bool) -> None:
    table = _one_split_table(1, 9.0, ("64x64", "128x128"))
    lo, hi = [3.0, 9.0, 0.0, 0.0, 6.0, -9.0], [16.0] * 6
    lo_tn = [0.0, *lo[1:]]  # a linear layer's batch is 1: its rows are the batch dimension
    trees = {k: _ranged(t, lo_tn if "tn" in k else lo, hi) for k, t in table.trees.items()}
    got = tl.TileTable(trees, {}).below_evidence("ampere", np.array([layout], dtype=object),
                                                 np.array([b]), np.array([m]))
    assert got[0] == below


# The fewest slices for one block per SM, each slice at least 64 long:
#   (tile "64x32": 64 across the n output columns, 32 down the m rows)
#   1 tile (32 x 16 output) on 304 SMs, K = 802,816: ceil(304 / 1) = 304
#   30 tiles (960 rows) on 304 SMs: ceil(304 / 30) = 11;  K = 200 caps it at floor(200 / 64) = 3
#   400 tiles on 108 SMs: 1 (already a wave)
@pytest.mark.parametrize(("m", "n", "k", "sms", "want"), [
    (32, 16, 802816, 304, 304.0), (960, 16, 200704, 304, 11.0), (960, 16, 200, 304, 3.0),
    (12800, 64, 4096, 108, 1.0),
])
def test_filling_split_table(m: int, n: int, k: int, sms: int, want: float) -> None:
    got = tl.filling_split(np.ones(1), np.array([m]), np.array([n]), np.array([k]),
                           np.array([sms]), np.array(["64x32"], dtype=object))
    assert got[0] == want


def test_only_guessed_rows_get_a_filling_split() -> None:
    # Trees fit on 512+ rows that never split: a 64-row linear (below) also gets 64x64 with
    # the split that fills 108 SMs, ceil(108 / 1) = 108 (64 x 64 output: one tile); a
    # 1024-row one (16 tiles) keeps its own pick only.
    table = _one_split_table(1, 9.0, ("64x64", "128x128"))
    lo, hi = [0.0, 9.0, 0.0, 0.0, 0.0, -9.0], [16.0] * 6
    table = tl.TileTable({k: _ranged(t, lo, hi) for k, t in table.trees.items()}, {})
    tn = np.array(["tn"], dtype=object)
    row, tile, split = table.candidates("ampere", tn, np.ones(1), np.array([64]),
                                        np.array([64]), np.array([65536]), np.array([108]))
    assert ("64x64", 108.0) in set(zip(tile.tolist(), split.tolist(), strict=True))
    _, _, split = table.candidates("ampere", tn, np.ones(1), np.array([1024]), np.array([64]),
                                   np.array([65536]), np.array([108]))
    assert set(split.tolist()) == {1.0}


# blocks = b * ceil(n / tm) * ceil(m / tn) against 108 SMs (A100): the largest tile with at
# least one block per SM, else 64x64; 128x128 instead of 256x128 when its whole waves hold
# less work (waves x tile area). No split here (the predictor adds it past the ridge point).
@pytest.mark.parametrize(("b", "m", "n", "want"), [
    (1, 8192, 8192, "256x128"),  # 2048 blocks: 19 waves x 32768 = 622592; 128x128: 38 x 16384
    (1, 1024, 1024, "128x64"),  # 256x128: 4 x 8 = 32; 128x128: 64; 128x64: 8 x 16 = 128
    (1, 256, 256, "64x64"),  # 128x64: 2 x 4 = 8 < 108: no tile fills a wave
    (64, 256, 256, "128x128"),  # 256x128: 128 blocks, 2 waves x 32768; 128x128: 3 x 16384
    (1, 4096, 4096, "256x128"),  # 512 blocks, 5 x 32768 = 10 x 16384: a tie keeps the larger
])
def test_tensor_core_tiles_table(b: int, m: int, n: int, want: str) -> None:
    from tilecast.learned.tiles import tensor_core_tiles

    tiles, splits = tensor_core_tiles(np.array([b]), np.array([m]), np.array([n]),
                                      np.array([108]))
    assert (tiles[0], splits[0]) == (want, 1.0)


# SIMT SGEMM issue bound (features._issue_bound): per k-step a thread issues its micro-tile's
# FFMAs, 2 x fragment / 4 sixteen-byte LDS and (tm + tn) / threads / 2 staging LDG + STS.
#   128x128, 256 threads: 64 FFMA, other 2*8/4 + 256/256/2 = 4.5 -> 68.5 / 64 = 1.0703
#   32x32, 128 threads:    8 FFMA, other 2*sqrt(8)/4 + 64/128/2 = 1.664 -> 9.664 / 8 = 1.208
# A GPU at fp32_issue_share 0.5 (V100, A100) has a spare slot for them: 1.0.
@pytest.mark.parametrize(("device", "tile", "want"), [
    ("NVIDIA L4", (128, 128), 68.5 / 64),
    ("h100-sxm5-80gb", (32, 32), (8 + 2 * 8**0.5 / 4 + 0.25) / 8),
    ("a100-pcie-80gb", (128, 128), 1.0),
    ("a100-pcie-80gb", (32, 32), 1.0),
    ("amd-instinct-mi100", (128, 128), 1.0),  # Tensile kernels: not cuBLAS's SIMT threads
    ("NVIDIA L4", (1, 1), 1.0),  # no tile (features clamp a missing tile to 1 x 1)
])
def test_issue_bound_of_simt_sgemm(device: str, tile: tuple[int, int], want: float) -> None:
    dc = _device_columns(1, device)
    got = ft._issue_bound(np.array([float(tile[0])]), np.array([float(tile[1])]), dc)
    assert got[0] == pytest.approx(want)


def test_issue_bound_leaves_tensor_cores_alone() -> None:
    dc = ft.device_columns([load_device("NVIDIA L4")], np.zeros(1, dtype=np.int64),
                           np.array(["float16"], dtype=object), np.array(["matrix"], dtype=object))
    assert dc.tensor_core[0] == 1.0
    assert ft._issue_bound(np.array([128.0]), np.array([128.0]), dc)[0] == 1.0


# cyclic_kept: all kept up to half the cache, none at the whole cache, linear between
# (192 KiB cache): 64 KiB -> 1;  144 KiB -> (192 - 144) / 96 = 0.5;  192 KiB -> 0;  256 -> 0
@pytest.mark.parametrize(("resident_kib", "want"), [(64, 1.0), (96, 1.0), (144, 0.5),
                                                    (192, 0.0), (256, 0.0)])
def test_a_cache_keeps_a_cyclic_working_set_only_while_it_is_small(resident_kib: int,
                                                                   want: float) -> None:
    got = ft.cyclic_kept(np.array([resident_kib * 1024.0]), np.array([192 * 1024.0]))
    assert got[0] == pytest.approx(want)


def _softmax_rows(n: int, cols: list[float]) -> ft.KernelColumns:
    rows, cols_ = np.full(n, 65536.0), np.array(cols)
    return ft.KernelColumns(flops=5 * rows * cols_, bytes=8 * rows * cols_,
                            itemsize=np.full(n, 4.0), elements=rows * cols_, b=np.zeros(n),
                            m=np.zeros(n), n=np.zeros(n), k=np.zeros(n), rows=rows, cols=cols_,
                            tile_m=np.zeros(n), tile_n=np.zeros(n))


def _rereads(f: ft.Features, kc: ft.KernelColumns, dc: ft.DeviceColumns
             ) -> tuple[np.ndarray, np.ndarray]:
    """(L2, DRAM) re-read ms: cached_ms and dram_ms less the first pass's L2 hits and misses."""
    hits = ft.l2_hits(kc.bytes, dc.l2_bytes)
    return (f.cached_ms - hits / dc.bandwidth * 1e3,
            f.dram_ms - (kc.bytes - hits) / dc.bandwidth * 1e3)


def test_wide_softmax_rows_are_read_again_from_the_l2_while_it_holds_them() -> None:
    # L4 (128 KiB L1, 3 blocks of 512 threads per SM): 2048 fp32 columns (3 x 8 KiB) stay in
    # the L1; 16384 (3 x 64 KiB = 192 KiB) do not, and all 58 SMs hold 58 x 192 KiB = 10.9 MiB,
    # under half the 48 MiB L2: both extra passes are read from the L2 (cached_ms).
    dc = _device_columns(2, "NVIDIA L4")
    kc = _softmax_rows(2, [2048.0, 16384.0])
    l2, dram = _rereads(ft.build_features("softmax", kc, dc), kc, dc)
    assert l2[0] == pytest.approx(0.0)
    assert l2[1] == pytest.approx(2 * 65536 * 16384 * 4 / dc.bandwidth[1] * 1e3)
    assert dram == pytest.approx(0.0)


@pytest.mark.parametrize(("gpu", "kept"), [
    # A100 (4 blocks of 512 threads, 256 KiB per SM > its 192 KiB L1): 108 x 256 KiB = 27 MiB
    # of a 40 MiB L2: (40 - 27) / 20 = 0.65 re-read from the L2, 0.35 from DRAM.
    ("a100-pcie-80gb", (40 - 27) / 20),
    # T4 (2 blocks of 512 threads, 128 KiB per SM > its 96 KiB L1): 40 x 128 KiB = 5 MiB, more
    # than its 4 MiB L2: all from DRAM.
    ("t4", 0.0)])
def test_softmax_re_reads_beyond_half_the_l2_go_to_dram(gpu: str, kept: float) -> None:
    dc = _device_columns(1, gpu)
    kc = _softmax_rows(1, [16384.0])
    l2, dram = _rereads(ft.build_features("softmax", kc, dc), kc, dc)
    rereads_ms = 2 * 65536 * 16384 * 4 / dc.bandwidth * 1e3
    assert l2 == pytest.approx(kept * rereads_ms)
    assert dram == pytest.approx((1 - kept) * rereads_ms)
