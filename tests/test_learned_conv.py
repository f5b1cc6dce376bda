"""The conv family: cuDNN algorithms from kernel names, their work, size-independent
features and monotone work terms, routing, serving from a trained artifact, and the shared
conv data."""

from __future__ import annotations

import csv
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import parser

import tilecast
from tilecast.analyzer.types import ConvDims, Kernel, MatmulDims, OpCost
from tilecast.learned import conv as cv

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "neusight-asplos25"
needs_data = pytest.mark.skipif(not (DATA / "kernels/nvidia/train/conv").is_dir(),
                                reason="shared NeuSight conv data absent (../shared/datasets)")


# Real recorded kernel lists (the shared data's `Kernels` column, argument lists trimmed).
@pytest.mark.parametrize("kernels, algo", [
    (";void cudnn::winograd_nonfused::winogradforwarddata4x4<float, float>(x);"
     "void cudnn::winograd_nonfused::winogradforwardfilter4x4<float, float>(x);"
     "ampere_sgemm_128x128_nn;void cudnn::winograd_nonfused::winogradforwardoutput4x4<float, "
     "float>(x)", "winograd_nonfused"),
    (";void cudnn::winograd::generateWinogradTilesKernel<0, float, float>(x);"
     "cudnn_infer_ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "winograd"),
    (";void cask_cudnn_infer::computeOffsetsKernel<false, false>(x);"
     "cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1", "implicit_precomp_gemm"),
    (";void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, "
     "true>(int)", "implicit_gemm"),
    (";void cudnn::cnn::im2col4d_kernel<float, long>(x);volta_sgemm_64x64_nn",
     "implicit_gemm"),
    (";void fft2d_r2c_32x32<float, false, 0u, false>(x);volta_gcgemm_64x32_nt;"
     "void fft2d_c2r_32x32<float, false, false, 0u, false, false>(x)", "fft"),
])
def test_algorithm_from_kernel_names(kernels, algo):
    assert cv.classify_kernels(kernels) == algo


def _cols(n, c, k, hw, r=3, stride=1, dtype="float32"):
    p = (hw + 2 * (r // 2) - r) // stride + 1
    one = np.ones(1)
    size = {"float32": 4.0, "float16": 2.0}[dtype]
    return cv.ConvColumns(*(v * one for v in (n, c, k, hw, hw, p, p, r, r, stride)),
                          itemsize=size * one, dtype=np.array([dtype], dtype=object),
                          nhwc=np.zeros(1, dtype=bool))


# 8x8 outputs (multiples of 4 and 2): direct 2*N*K*P*Q*C*9; F(4x4,3x3) does 36 multiplies
# per 4x4 tile instead of 144 (4x fewer), F(2x2,3x3) 16 per 2x2 tile instead of 36 (2.25x).
# The nonfused GEMM runs whole groups of 16 images: a batch of 2 costs 8x, so 4 / 8.
@pytest.mark.parametrize("algo, ratio", [("implicit_precomp_gemm", 1.0), ("implicit_gemm", 1.0),
                                         ("winograd_nonfused", 0.5), ("winograd", 2.25)])
def test_algorithm_flops(algo, ratio):
    cc = _cols(2, 64, 64, 8)
    work = cv.algorithm_work(cc, np.array([algo], dtype=object), np.zeros(1, dtype=bool))
    direct = 2 * 2 * 64 * 8 * 8 * 64 * 9
    assert work.flops[0] == pytest.approx(direct / ratio)
    io = 4 * (2 * 64 * 64 + 64 * 64 * 9 + 2 * 64 * 64)
    # Winograd moves transformed operands through DRAM (non-fused: all three; fused: the
    # filter's 4x4 tiles); the GEMMs do not.
    assert (work.bytes[0] > io) == algo.startswith("winograd")
    assert work.bytes[0] - work.transform_bytes[0] == pytest.approx(io)


# A fused Winograd block: 32 output channels x 32 tiles of 2x2 outputs as the name's
# tile<a><b><c> lays them out (a images x b x c tiles). N 38, K 326, 3x3 map (the first row of
# the P4 CSV, grid 209): tile244 -> ceil(38/2) * ceil(3/8) * ceil(3/8) * ceil(326/32) = 19 * 11
# = 209; tile148 -> 38 * ceil(3/8) * ceil(3/16) * 11 = 418; tile418 -> 10 * ceil(3/2) * 1 * 11
# = 220 (2x2 tiles: a map of 3 needs two rows of them).
@pytest.mark.parametrize("name, block, blocks", [
    ("cudnn_infer_maxwell_scudnn_winograd_128x128_ldg1_ldg4_relu_tile244n_nt_v1",
     (2.0, 4.0, 4.0), 209),
    (";void cudnn::winograd::generatewinogradtileskernel<1, float, float>(x);cudnn_infer_"
     "maxwell_scudnn_winograd_128x128_ldg1_ldg4_mobile_relu_tile148t_nt_v1", (1.0, 4.0, 8.0), 418),
    ("cudnn_infer_maxwell_scudnn_winograd_128x128_ldg1_ldg4_relu_tile418n_nt_v1",
     (4.0, 1.0, 8.0), 220),
    ("cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1", cv.FUSED_DEFAULT, 418),  # none shown
    # not 32 tiles: a layout the model does not know is read as the default
    ("cudnn_infer_maxwell_scudnn_winograd_128x128_ldg1_ldg4_relu_tile444n_nt_v1",
     cv.FUSED_DEFAULT, 418),
])
def test_fused_winograd_block_from_kernel_names(name, block, blocks):
    assert cv.fused_block(name) == block
    cc = replace(_cols(38, 893, 326, 3), fused=np.array([block]))
    work = cv.algorithm_work(cc, np.array(["winograd"], dtype=object), np.zeros(1, dtype=bool))
    assert work.tiles[0] == blocks
    # useful outputs / computed: 38 * 326 * 3 * 3 over blocks * 32 channels * 128 outputs
    # one block: 32 channels x 32 tiles of 2 x 2, 16 multiplies per (channel pair, tile)
    assert work.tile_flops[0] == 2 * 16 * 32 * 32 * 893
    assert work.tiles[0] * work.tile_flops[0] >= work.flops[0]
    assert work.flops[0] == pytest.approx(2 * 16 * 38 * 2 * 2 * 893 * 326)  # no padding
    # X + W + Y once, plus the 4x4-transformed filter written and read back (2 * 16 C K)
    io = 4 * (38 * 893 * 9 + 326 * 893 * 9 + 38 * 326 * 9)
    assert work.bytes[0] == pytest.approx(io + 4 * 2 * 16 * 893 * 326)


def test_tensor_core_path_pads_channels_and_transposes_nchw():
    """fp16 tensor cores: C=3 pads to 8 (FLOPs x 8/3); NCHW X and Y transposed in and out."""
    cc = _cols(1, 3, 64, 32, r=7, stride=2, dtype="float16")
    algo = np.array(["implicit_precomp_gemm"], dtype=object)
    tc = cv.algorithm_work(cc, algo, np.ones(1, dtype=bool))
    simt = cv.algorithm_work(cc, algo, np.zeros(1, dtype=bool))
    assert tc.flops[0] == pytest.approx(simt.flops[0] * 8 / 3)
    x, y = 2 * 3 * 32 * 32, 2 * 64 * 16 * 16
    assert tc.transform_bytes[0] == pytest.approx(2 * (x + y))


def test_winograd_and_fft_only_where_cudnn_offers_them():
    ok = cv.eligible(cv.ConvColumns(
        *(np.array(v, dtype=np.float64) for v in ([1, 1, 1], [8] * 3, [8] * 3, [16] * 3,
                                                  [16] * 3, [16, 8, 16], [16, 8, 16],
                                                  [3, 3, 1], [3, 3, 1], [1, 2, 1])),
        itemsize=np.full(3, 4.0), dtype=np.array(["float32"] * 3, dtype=object),
        nhwc=np.zeros(3, dtype=bool)))
    assert ok["winograd"].tolist() == [True, False, False]  # 3x3 s1 / 3x3 s2 / 1x1
    assert ok["fft"].tolist() == [True, False, True]


def _filters(r, stride) -> cv.ConvColumns:
    n = len(r)
    return cv.ConvColumns(*(np.asarray(v, dtype=np.float64) for v in (
        [1] * n, [8] * n, [8] * n, [16] * n, [16] * n, [16] * n, [16] * n, r, r, stride)),
        itemsize=np.full(n, 4.0), dtype=np.array(["float32"] * n, dtype=object),
        nhwc=np.zeros(n, dtype=bool))


def test_candidates_are_the_frequent_algorithms_cudnn_offers():
    # 3x3 stride 1: implicit precomp GEMM first, then both Winograds; 1x1 and strided convs:
    # implicit precomp GEMM only (FFT and the plain implicit GEMM are never candidates).
    row, algo, _ = cv.candidates(_filters([3, 1, 3], [1, 1, 2]))
    assert row.tolist() == [0, 0, 0, 1, 2]
    assert algo.tolist() == ["implicit_precomp_gemm", "winograd", "winograd_nonfused",
                             "implicit_precomp_gemm", "implicit_precomp_gemm"]


def test_the_fastest_candidate_is_kept_first_on_ties():
    from tilecast.learned import conv_data as cd

    s = cd.ConvSamples(**{f.name: np.zeros(3) for f in fields(cd.ConvSamples)})
    cc = _filters([3, 3, 1], [1, 1, 1])
    s = replace(s, **{name: getattr(cc, name) for name in ("n", "c", "k", "h", "w", "p", "q",
                                                           "r", "s", "stride", "itemsize")},
                dtype=cc.dtype, nhwc=cc.nhwc, device=np.array(["Tesla T4"] * 3, dtype=object))
    # candidate rows: (0 ipg, 0 wino, 0 nonfused, 1 ipg, 1 wino, 1 nonfused, 2 ipg)
    ms = np.array([3.0, 1.0, 2.0, 5.0, 5.0, 6.0, 4.0])
    best, algo = cd.fastest(s, lambda data: ms if len(data.latency_ms) == len(ms) else None,
                            table=_Picks(("64x64",)))
    assert best.tolist() == [1.0, 5.0, 4.0]
    assert algo.tolist() == ["winograd", "implicit_precomp_gemm", "implicit_precomp_gemm"]
    # two nonfused tiles per row: (0 ipg, 0 wino, 0 nonfused 64x64, 0 nonfused 128x128, ...):
    # the algorithm's fastest tile is what it competes with
    ms = np.array([3.0, 2.0, 4.0, 1.5, 5.0, 5.0, 0.5, 9.0, 4.0])
    best, algo = cd.fastest(s, lambda data: ms if len(data.latency_ms) == len(ms) else None,
                            table=_Picks(("64x64", "128x128")))
    assert best.tolist() == [1.5, 0.5, 4.0]
    assert algo.tolist() == ["winograd_nonfused", "winograd_nonfused", "implicit_precomp_gemm"]


class _Picks:
    """A tile table whose tree picks these nonfused SGEMM tiles for every row."""

    def __init__(self, tiles: tuple[str, ...]) -> None:
        self.tiles = tiles

    def growing_picks(self, arch, layout, b, m, n, k, sms):
        rows = np.repeat(np.arange(len(b)), len(self.tiles))
        return rows, np.tile(np.asarray(self.tiles, dtype=object), len(b))


def _device_cols(names):
    from tilecast.device_db.loader import load_device
    from tilecast.learned import features as ft

    devs = [load_device(n) for n in names]
    return devs, ft


def _random_cols(n: int, batch: np.ndarray | None = None) -> cv.ConvColumns:
    rng = np.random.default_rng(0)
    b, c, k, hw = (rng.integers(1, 65, n), rng.integers(3, 2049, n), rng.integers(3, 2049, n),
                   rng.integers(5, 253, n))
    b = b if batch is None else batch
    algo = np.array([cv.ALGORITHMS[i % len(cv.ALGORITHMS)] for i in range(n)], dtype=object)
    return cv.ConvColumns(*(np.asarray(v, np.float64) for v in (
        b, c, k, hw, hw, hw, hw, [3] * n, [3] * n, [1] * n)), itemsize=np.full(n, 4.0),
        dtype=np.array(["float32"] * n, dtype=object), nhwc=np.zeros(n, dtype=bool),
        algo=algo)


@pytest.mark.parametrize("device", ["t4", "a100-sxm4-40gb", "l4", "h100-sxm5-80gb"])
def test_conv_features_size_independent_x_and_monotone_work(device):
    """Every algorithm: x finite and the same for batch N and 3N; every work term >= 0 and
    no smaller at 3N; launches add up per kernel of the algorithm."""
    from tilecast.device_db.loader import load_device
    from tilecast.learned import features as ft

    n = 64
    small = _random_cols(n)
    big = _random_cols(n, batch=3 * small.n)
    dc = ft.device_columns([load_device(device)], np.zeros(n, dtype=np.int64), small.dtype,
                           np.full(n, "vector", dtype=object))
    f, g = ft.build_features("conv", small, dc), ft.build_features("conv", big, dc)
    assert f.x.shape == (n, len(ft.FEATURES["conv"])) and np.isfinite(f.x).all()
    assert np.array_equal(f.x, g.x)
    for term in ("compute_ms", "dram_ms", "wave_ms", "waves"):
        a, b = getattr(f, term), getattr(g, term)
        assert (a >= 0).all() and (b >= a * (1 - 1e-9)).all(), term
    assert ((f.dram_ms + f.cached_ms) <= (g.dram_ms + g.cached_ms) * (1 + 1e-9)).all()
    launches = np.array([cv.LAUNCHES[a] for a in small.algo])
    assert np.allclose(f.launch_ms, dc.launch_s * 1e3 * launches)


# Sustained clock: the boost clock for a lone busy SM, 0.65 of the way from boost to base
# with every SM busy (base / boost from the device files). Lane share: GPUs with one FP32
# datapath per partition keep 1; doubled datapaths count as far as the sourced SGEMM rate
# (L4 0.367, H100 SXM 0.774), one datapath (0.5) where none is sourced (the A10); AMD keeps 1.
@pytest.mark.parametrize(("device", "full_load_clock", "lanes"), [
    ("t4", 1 - 0.65 * (1 - 585 / 1590), 1.0),
    ("l4", 1 - 0.65 * (1 - 795 / 2040), 0.367),
    ("h100-sxm5-80gb", 1 - 0.65 * (1 - 1590 / 1980), 0.774),
    ("a10", 1 - 0.65 * (1 - 885 / 1695), 0.5),
    ("mi210", 1.0, 1.0),  # AMD publishes no base clock
])
def test_sustained_clock_and_lane_share(device, full_load_clock, lanes):
    from tilecast.device_db.loader import load_device
    from tilecast.learned import features as ft

    dc = ft.device_columns([load_device(device)], np.zeros(3, dtype=np.int64),
                           np.array(["float32"] * 3, dtype=object),
                           np.full(3, "vector", dtype=object))
    clock = ft.sustained_clock(dc, np.array([0.0, 0.5, 1.0]))
    assert clock.tolist() == pytest.approx([1.0, (1 + full_load_clock) / 2, full_load_clock])
    assert ft.conv_lane_share(dc) == pytest.approx([lanes] * 3)


def test_one_chip_at_one_clock_runs_a_pointwise_conv_alike():
    # The A100 PCIe 40GB and 80GB: one chip, one boost clock (their base clocks and board
    # power differ). A batch-1 1x1 conv keeps 8 of 108 SMs busy: within 5 % of each other
    # (1.3x apart when the conv MLP read the base clock and the power as features).
    from tilecast.device_db.loader import load_device
    from tilecast.learned.predictor import default_predictor

    pointwise = Kernel("p", ("p",), "Conv", OpCost(
        "conv", 2 * 49 * 512 * 2048, 4 * (2048 * 49 + 512 * 2048 + 512 * 49), "float32",
        "matrix", matmul=MatmulDims(1, 49, 512, 2048),
        conv=ConvDims(1, 2048, 512, 7, 7, 7, 7, 1, 1)))
    a, b = (default_predictor().predict([pointwise], load_device(d))[0].gpu_ms
            for d in ("a100-pcie-40gb", "a100-pcie-80gb"))
    assert a == pytest.approx(b, rel=0.05)


def _conv_kernel(groups: int = 1) -> Kernel:
    d = ConvDims(8, 64, 64, 56, 56, 56, 56, 3, 3, pad=1, groups=groups)
    mm = MatmulDims(groups, 8 * 56 * 56, 64 // groups, 64 // groups * 9)
    flops = 2 * mm.b * mm.m * mm.n * mm.k
    return Kernel("c", ("c",), "Conv", OpCost("conv", flops, 4 * (2 * 8 * 64 * 56 * 56),
                                              "float32", "matrix", matmul=mm, conv=d))


def test_routing_of_dense_and_grouped_convs():
    from tilecast.learned.routing import route

    dense, grouped = _conv_kernel(), _conv_kernel(groups=64)
    r = route([dense, grouped], conv_model=True)
    assert r.parts["conv"].kernel.tolist() == [0]
    assert r.parts["matmul"].kernel.tolist() == []
    ew = r.parts["elementwise"]  # the depthwise conv: memory-bound rule, flagged
    assert ew.kernel.tolist() == [1] and ew.fallback.tolist() == [True]
    assert r.conv.tolist() == [True, True]  # both are cuDNN calls on the host
    old = route([dense], conv_model=False)  # an artifact without a conv model
    assert old.parts["matmul"].kernel.tolist() == [0] and old.parts["matmul"].fallback[0]
    assert "conv" not in old.parts


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_conv_on_another_model_keeps_the_conv_calls_host_dispatch(dtype):
    """A tensor-core conv is costed on the matmul model's implicit-GEMM view, but the host
    still issues one cuDNN call: its dispatch is the conv family's, as for an fp32 conv (so
    the host floor of an eager pass does not depend on the math mode); the same GEMM as a
    MatMul keeps the matmul family's (its GPU time has no layout transposes)."""
    from dataclasses import replace

    from tilecast.device_db.loader import load_device
    from tilecast.learned.predictor import default_predictor

    pred, device = default_predictor(), load_device("a100-sxm4-40gb")
    conv = _conv_kernel()
    half = replace(conv, cost=replace(conv.cost, dtype=dtype))
    gemm = Kernel("g", ("g",), "MatMul", replace(half.cost, family="matmul", conv=None))
    fp32, fp16, mm = pred.predict([conv, half, gemm], device)
    nvidia_conv, _ = pred.host_dispatch_ms["conv"]
    nvidia_mm, _ = pred.host_dispatch_ms["matmul"]
    assert fp32.host_ms == pytest.approx(nvidia_conv) and fp16.host_ms == pytest.approx(nvidia_conv)
    assert mm.host_ms == pytest.approx(nvidia_mm) and nvidia_mm < nvidia_conv
    # the GPU time is the GEMM's plus cuDNN's NCHW layout transposes (test_tensor_core.py)
    assert fp16.latency_ms >= nvidia_conv and fp16.gpu_ms > mm.gpu_ms


CONV_HEADER = ["OPName", "Latency", "Device", "Kernel Name", "Kernels", "B", "Input_Channel",
               "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]
NAMES = {"winograd_nonfused": ";void cudnn::winograd_nonfused::winogradForwardData4x4<f>(x);"
                              "volta_sgemm_64x64_nn",
         "implicit_precomp_gemm": ";cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1"}


def write_conv_csvs(root: Path, gpus=("Tesla T4", "Tesla V100-PCIE-32GB"), n: int = 40) -> None:
    """Made-up conv rows (latency a smooth function of the FLOPs): plumbing, not accuracy."""
    rng = np.random.default_rng(1)
    for gpu in gpus:
        path = root / "kernels" / "nvidia" / "train" / "conv" / f"{gpu.replace(' ', '_')}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(CONV_HEADER)
            for i in range(n):
                b, c, k, hw = (int(rng.integers(1, 17)), int(rng.integers(8, 257)),
                               int(rng.integers(8, 257)), int(rng.integers(7, 57)))
                algo = "winograd_nonfused" if i % 2 else "implicit_precomp_gemm"
                ms = 0.05 + 2 * b * c * k * hw * hw * 9 / 5e9
                w.writerow(["conv", ms, gpu, "k", NAMES[algo], b, c, k, 3, hw, 1, 1])


def test_conv_csv_reader_and_heldout_shapes(tmp_path):
    from tilecast.learned import conv_data as cd

    write_conv_csvs(tmp_path)
    s = cd.load_conv([tmp_path])
    assert len(s) == 80 and set(s.algo) == {"winograd_nonfused", "implicit_precomp_gemm"}
    assert (s.p == s.h).all()  # 3x3, stride 1, pad 1 keeps the size
    held = cd.heldout_shapes(s)
    assert 0 < held.sum() < len(s)
    # The split is by shape: equal dims on another GPU land on the same side.
    key = [(a, b, c, d) for a, b, c, d in zip(s.n, s.c, s.k, s.h, strict=True)]
    side = {}
    for kk, h in zip(key, held, strict=True):
        assert side.setdefault(kk, h) == h


def test_the_serving_rule_does_not_know_the_fused_block_that_ran(tmp_path):
    """Training reads each row's fused Winograd layout; the fastest-candidate rule (kernels-eval,
    the protocol) costs tile148, as a forecast of an unmeasured conv must."""
    from tilecast.learned import conv_data as cd

    write_conv_csvs(tmp_path)
    s = cd.load_conv([tmp_path])
    other = replace(s, fused=np.tile([4.0, 4.0, 2.0], (len(s), 1)))
    wino = np.full(len(s), "winograd", dtype=object)
    trained = [cd.conv_family_data(x, algo=wino).features.compute_ms for x in (s, other)]
    assert not np.allclose(*trained)  # the layout changes the blocks training sees

    def work_ms(d):
        return d.features.compute_ms + d.features.wave_ms
    assert np.array_equal(cd.fastest(s, work_ms)[0], cd.fastest(other, work_ms)[0])


@pytest.mark.slow
def test_trained_artifact_serves_convs(tmp_path):
    """tilecast train on folders with conv CSVs -> an artifact with a conv family whose
    predictor routes dense convs to it (not flagged as a fallback)."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from test_learned_train import make_dataset

    from tilecast.device_db.loader import load_device
    from tilecast.learned.predictor import OnnxPredictor
    from tilecast.learned.train import TrainConfig, train_all

    make_dataset(tmp_path)
    write_conv_csvs(tmp_path, gpus=("Tesla T4", "NVIDIA A100-PCIE-40GB"))
    train_all([tmp_path], tmp_path / "art", TrainConfig(epochs=2), progress=None)
    pred = OnnxPredictor(tmp_path / "art")
    assert pred.conv_model
    # NVIDIA rows only: AMD's dispatch is the learned NVIDIA one, not the initial value
    assert all(nv == amd for nv, amd in pred.host_dispatch_ms.values())
    t4 = load_device("t4")
    pointwise = Kernel("p", ("p",), "Conv", OpCost(
        "conv", 2 * 8 * 28 * 28 * 64 * 64, 4 * 8 * 64 * (56 * 56 + 28 * 28), "float32",
        "matrix", matmul=MatmulDims(1, 8 * 28 * 28, 64, 64),
        conv=ConvDims(8, 64, 64, 56, 56, 28, 28, 1, 1, stride=2)))
    out = pred.predict([_conv_kernel(), _conv_kernel(groups=64), pointwise], t4)
    assert out[0].tile in cv.CANDIDATES and out[0].latency_ms > 0
    assert out[2].tile == "implicit_precomp_gemm"  # no Winograd for 1x1 stride 2
    assert out[1].extrapolated and out[2].extrapolated  # memory-bound rule; 1x1 never trained
    lo, hi = pred.ranges["conv"]
    pred.ranges["conv"] = (lo - np.inf, hi + np.inf)  # inside the range: not extrapolated
    assert not pred.predict([_conv_kernel()], t4)[0].extrapolated


@needs_data
def test_shared_conv_data_algorithms():
    """Every GPU runs several algorithms; shapes are shared across GPUs, so the held-out split
    keeps each shape on one side everywhere."""
    from tilecast.learned import conv_data as cd

    s = cd.load_conv([DATA])
    assert len(s) > 20_000 and len(set(s.device)) == 5
    for gpu in set(s.device):
        algos = set(s.algo[s.device == gpu])
        assert {"winograd", "winograd_nonfused", "implicit_precomp_gemm"} <= algos, gpu
    held = cd.heldout_shapes(s)
    assert 0.15 < held.mean() < 0.25


@needs_data
def test_fused_winograd_blocks_reproduce_the_recorded_grids():
    """Every fused Winograd row of the five GPUs: the block layout its name shows gives its
    recorded grid (x * y * z) exactly; training reads that layout, a forecast does not."""
    from tilecast.learned import conv_data as cd

    checked = 0
    for path in cd.conv_files([DATA]):
        with path.open(newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if "scudnn_winograd" in r["Kernel Name"]]
        block = np.array([cv.fused_block(r["Kernels"]) for r in rows])
        _, work = recorded_work(rows, "winograd", fused=block)
        grid = np.array([float(r["Grid x"]) * float(r["Grid y"]) * float(r["Grid z"])
                         for r in rows])
        assert (work.tiles == grid).all(), path.name
        checked += len(rows)
    assert checked > 8000
    s = cd.load_conv([DATA])
    assert (s.fused != np.array(cv.FUSED_DEFAULT)).any(axis=1).sum() > 1000  # Pascal, A100
    assert (s.as_served().fused == np.array(cv.FUSED_DEFAULT)).all()


def recorded_work(rows: list[dict[str, str]], algo: str, **columns):
    """(columns, ``algorithm_work``) of recorded conv CSV rows (3x3, stride 1, fp32) run with
    ``algo``; ``columns``: further ``ConvColumns`` fields (the block or tile that ran)."""
    n, c, k, hw, pad = (np.array([float(r[col]) for r in rows]) for col in
                        ("B", "Input_Channel", "Output_Channel", "Input_Size", "Padding"))
    p = hw + 2 * pad - 2
    cc = cv.ConvColumns(n, c, k, hw, hw, p, p, *(np.full(len(rows), v) for v in
                                                 (3.0, 3.0, 1.0, 4.0)),
                        dtype=np.full(len(rows), "float32", dtype=object),
                        nhwc=np.zeros(len(rows), dtype=bool), **columns)
    return cc, cv.algorithm_work(cc, np.full(len(rows), algo, dtype=object),
                                 np.zeros(len(rows), dtype=bool))


@pytest.mark.parametrize("kernel, groups", [(1, 64), (3, 64), (3, 4)])
def test_a_grouped_conv_is_labelled_extrapolated(tmp_path: Path, kernel: int, groups: int):
    """The conv data holds dense 3x3 convs only: a grouped or depthwise conv is costed by
    rule and says so. A 1x1 depthwise conv (2 FLOPs per output) was not labelled before
    stop 45: its FLOPs per element lay inside the elementwise range it was routed through."""
    c_in = 64 // groups
    model = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[8,64,56,56] x) => (y) <float[64,{c_in},{kernel},{kernel}] w = {{0.0}}> {{\n"
        f"  y = Conv<group={groups}, pads=[{kernel // 2},{kernel // 2},{kernel // 2},"
        f"{kernel // 2}]>(x, w)\n}}")
    onnx.save(model, tmp_path / "g.onnx")
    dense = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[8,64,56,56] x) => (y) <float[64,64,3,3] w = {0.0}> {\n"
        "  y = Conv<pads=[1,1,1,1]>(x, w)\n}")
    onnx.save(dense, tmp_path / "d.onnx")
    (grouped,) = tilecast.analyze(tmp_path / "g.onnx", "a100-40gb").kernels
    (plain,) = tilecast.analyze(tmp_path / "d.onnx", "a100-40gb").kernels
    assert grouped.extrapolated and grouped.latency_ms > 0
    assert not plain.extrapolated  # fp32 3x3 dense: inside the conv data
