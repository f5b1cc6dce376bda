"""Matrix-unit GEMMs with no training data run at the GPU's sourced sustained rate
(learned/tensor_core.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import list_devices, load_device
from tilecast.learned.predictor import default_predictor


def _gemm(m: int, dtype: str = "float16", n: int | None = None, k: int | None = None) -> Kernel:
    n, k = n or m, k or m
    size = 4 if dtype == "float32" else 2
    cost = OpCost("matmul", 2 * m * n * k, size * (m * k + k * n + m * n), dtype, "matrix",
                  matmul=MatmulDims(1, m, n, k), elements=m * n)
    return Kernel("mm", ("mm",), "MatMul", cost)


SOURCED = [d for d in list_devices() if d.matrix_sustained_fraction is not None]


@pytest.mark.parametrize("device", SOURCED, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_gemm_runs_at_the_sustained_fraction(device, dtype) -> None:
    # 8192^3: the fixed cost and the 400 MB of operands are a few % of the compute at
    # fraction x peak, so the forecast lands just under the sourced figure.
    peak = device.peak_tflops(dtype, "matrix")
    if peak <= device.peak_tflops_fp32:  # no matrix units for this dtype (V100 bf16)
        pytest.skip(f"{device.name} has no {dtype} matrix units")
    kernel = _gemm(8192, dtype)
    pred = default_predictor().predict([kernel], device)[0]
    tflops = kernel.flops / pred.gpu_ms / 1e9
    assert 0.93 * device.matrix_sustained_fraction * peak < tflops
    assert tflops <= device.matrix_sustained_fraction * peak
    assert pred.extrapolated and pred.bound == "compute"


def test_the_rule_takes_only_untrained_matrix_dtypes_on_sourced_gpus() -> None:
    pred = default_predictor()
    a100 = load_device("a100-sxm4-80gb")
    unsourced = replace(a100, matrix_sustained_fraction=None)
    half, single = _gemm(4096), _gemm(4096, "float32")
    # fp16: the sourced fraction decides; without it the learned (SIMT) form stays
    assert pred.predict([half], a100)[0].gpu_ms < 0.9 * pred.predict([half], unsourced)[0].gpu_ms
    # fp32 is trained (SIMT on NVIDIA, matrix cores on AMD): never touched
    for dev, bare in ((a100, unsourced),
                      (load_device("mi210"), replace(load_device("mi210"),
                                                     matrix_sustained_fraction=None))):
        assert pred.predict([single], dev)[0] == pred.predict([single], bare)[0]


@pytest.mark.parametrize("device", ["h100-sxm5-80gb", "a100-pcie-40gb", "mi210", "l4"])
def test_monotone_in_work_and_never_under_the_roofline(device: str) -> None:
    dev = load_device(device)
    peak = dev.peak_tflops("float16", "matrix") * 1e12
    sizes = [(m, 4096, 1024) for m in (16, 64, 256, 1024, 4096, 16384)] + \
        [(4096, n, 4096) for n in (64, 512, 8192)] + [(4096, 4096, k) for k in (64, 512, 8192)]
    kernels = [_gemm(m, n=n, k=k) for m, n, k in sizes]
    preds = default_predictor().predict(kernels, dev)
    for (kern, p) in zip(kernels, preds, strict=True):
        assert p.gpu_ms * 1e-3 >= kern.flops / peak  # u <= 1
    for run in (preds[0:6], preds[6:9], preds[9:12]):
        lat = [p.latency_ms for p in run]
        assert lat == sorted(lat)


def _busy_ms(kernel: Kernel, device) -> float:
    p = default_predictor().predict([kernel], device)[0]
    return p.gpu_ms - p.fixed_ms


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb", "l4", "t4"])
def test_a_decode_gemm_streams_its_weights_as_a_copy_does(device: str) -> None:
    # 8 rows against a 14336 x 4096 bf16 weight (117 MB, over twice every L2 here, so all of
    # it comes from DRAM): the GEMM's busy time is the device's streaming time for its bytes,
    # what the elementwise model gives a copy of as many bytes (its plain FLOPs, 0.9 GFLOP, are
    # a few microseconds at the sustained matrix rate and vanish in the smooth maximum).
    dev = load_device(device)
    dtype = "bfloat16" if dev.peak_tflops("bfloat16", "matrix") > 0 else "float16"
    gemm = _gemm(8, dtype, n=14336, k=4096)
    elements = gemm.bytes // 4  # a copy: each 2-byte element read once and written once
    copy = Kernel("copy", ("copy",), "Identity",
                  OpCost("elementwise", 0, 4 * elements, dtype, elements=elements))
    assert _busy_ms(gemm, dev) == pytest.approx(_busy_ms(copy, dev), rel=0.01)


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb"])
def test_few_rows_are_not_padded_to_a_tile(device: str) -> None:
    # Memory-bound GEMMs take their plain FLOPs: 1 to 64 rows against an 8192^2 fp16 weight
    # (134 MB) cost the weight's stream, plus 1.5 % for 64 rows' own input and output and
    # under 1 % from their 8.6 GFLOP in the smooth maximum, not 1-64 rows padded to a
    # 128-row tile (2x-128x the FLOPs).
    dev = load_device(device)
    busy = [_busy_ms(_gemm(m, n=8192, k=8192), dev) for m in (1, 8, 64)]
    assert busy == sorted(busy)
    assert busy[-1] < 1.05 * busy[0]


@pytest.mark.parametrize("device", ["a100-sxm4-80gb", "h100-sxm5-80gb", "l4", "t4"])
def test_monotone_across_the_ridge_point(device: str) -> None:
    # Past the ridge point (intensity ~ rows for a skinny GEMM) the compute term turns to
    # whole waves of tiles, at least the plain FLOPs: the forecast may step up, never down.
    dev = load_device(device)
    kernels = [_gemm(m, n=4096, k=4096) for m in range(8, 1025, 8)]
    lat = [p.latency_ms for p in default_predictor().predict(kernels, dev)]
    assert lat == sorted(lat)
