"""Properties of the shipped learned predictor over every device in the database (hypothesis):
more work never takes less time, every kernel lies inside its envelope, and tiny kernels do
not rank GPUs backwards."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="property tests need hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tilecast.analyzer.predictor import roofline_times_ms  # noqa: E402
from tilecast.analyzer.types import (  # noqa: E402
    DTYPE_SIZE,
    ConvDims,
    Kernel,
    MatmulDims,
    OpCost,
    RowDims,
)
from tilecast.device_db import list_devices  # noqa: E402

DEVICES = list_devices()
FAMILIES = ("bmm", "linear", "elementwise", "softmax", "layernorm", "reduction")
DTYPES = ("float32", "float16", "bfloat16", "bool", "int64")
# Generations in release order, per vendor (a newer part must not be slower on tiny kernels).
GENERATION = {"pascal": 0, "volta": 1, "turing": 2, "ampere": 3, "ada": 4, "hopper": 5,
              "blackwell": 6, "cdna1": 0, "cdna2": 1, "cdna3": 2}
SWITCH_SLACK = 0.25  # at most 25 % faster across a matmul kernel switch
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def _predictor():
    from tilecast.learned.predictor import default_predictor

    return default_predictor()


def kernel(family: str, dtype: str, a: int, b: int, c: int, d: int) -> Kernel:
    """A kernel as the analyzer costs it: matmul (batch a, m b, n c, k d), row kernels
    (rows a * b, cols c), elementwise and reductions (a * b * c elements), a 3x3 "same" conv
    (batch a, channels b / 8 in and c / 8 out, d / 16 pixels square)."""
    size = DTYPE_SIZE[dtype]
    if family == "conv":
        n, c, k, hw = a, -(-b // 8), -(-c // 8), -(-d // 16)
        mm = MatmulDims(1, n * hw * hw, k, c * 9)
        cost = OpCost("conv", 2 * mm.m * mm.n * mm.k,
                      int(size * (n * c * hw * hw + k * c * 9 + n * k * hw * hw)), dtype,
                      "matrix", matmul=mm, elements=n * k * hw * hw,
                      conv=ConvDims(n, c, k, hw, hw, hw, hw, 3, 3, pad=1))
        return Kernel("k", ("k",), "Conv", cost)
    if family in ("bmm", "linear"):
        bb = a if family == "bmm" else 1
        mm = MatmulDims(bb, b, c, d, batched=family == "bmm")
        cost = OpCost("matmul", 2 * bb * b * c * d, int(size * bb * (b * d + d * c + b * c)),
                      dtype, "matrix", matmul=mm, elements=bb * b * c)
        return Kernel("k", ("k",), "Gemm" if family == "linear" else "MatMul", cost)
    if family in ("softmax", "layernorm"):
        rows = RowDims(a * b, c)
        n = a * b * c
        fam = "softmax" if family == "softmax" else "normalization"
        cost = OpCost(fam, 5 * n, int(2 * size * n), dtype, rows=rows, elements=n)
        return Kernel("k", ("k",), "Softmax", cost)
    n = a * b * c
    if family == "reduction":
        cost = OpCost("reduction", n, int(size * n + size * a), dtype, rows=RowDims(a, b * c),
                      elements=a)
        return Kernel("k", ("k",), "ReduceSum", cost)
    cost = OpCost("elementwise", n, int(3 * size * n), dtype, elements=n)
    return Kernel("k", ("k",), "Add", cost)


dims = st.tuples(*(st.integers(1, 2048) for _ in range(4)))


@SETTINGS
@given(family=st.sampled_from(FAMILIES), dtype=st.sampled_from(DTYPES), base=dims,
       which=st.integers(0, 3), factor=st.integers(2, 8))
def test_more_work_never_takes_less_time(family, dtype, base, which, factor) -> None:
    if family in ("bmm", "linear") and dtype in ("bool", "int64"):
        dtype = "float32"
    grown = list(base)
    grown[which] *= factor
    small, big = kernel(family, dtype, *base), kernel(family, dtype, *grown)
    pred = _predictor()
    for dev in DEVICES:
        a, b = pred.predict([small, big], dev)
        # Strict at a fixed configuration (the form is monotone in every work term). Where
        # the tile selector switches a matmul's tile, split-K or layout, the two kernels run
        # different kernels: a bounded step (docs/predictor.md, "Monotonicity").
        slack = SWITCH_SLACK if a.tile != b.tile else 1e-5
        assert b.latency_ms >= a.latency_ms * (1 - slack), (dev.name, small, big, a, b)
        assert b.gpu_ms >= a.gpu_ms * (1 - slack), (dev.name, small, big, a, b)


@SETTINGS
@given(family=st.sampled_from(("bmm", "linear")), base=dims, factor=st.integers(2, 64))
# ResNet-50's classifier, 16 -> 32 rows: the trees switch 128x32/3 -> 32x32/3, and their own
# picks forecast 32 rows 23 % faster than 16 on an A100 (73.7 -> 56.8 us).
@example(family="linear", base=(1, 16, 1000, 2048), factor=2)
def test_a_larger_batch_never_takes_less_time_even_across_tile_switches(family, base,
                                                                        factor) -> None:
    # cuBLAS SIMT GEMMs take the fastest of the configurations the trees pick for this and
    # larger batches (TileTable.candidates): growing the batch dimension (a linear's rows, a
    # batched product's batch) shrinks the candidate set and grows each candidate's time, so
    # the forecast cannot fall, tile switch or not (no SWITCH_SLACK).
    which = 0 if family == "bmm" else 1
    grown = list(base)
    grown[which] *= factor
    small, big = kernel(family, "float32", *base), kernel(family, "float32", *grown)
    pred = _predictor()
    for dev in DEVICES:
        if dev.vendor != "nvidia":
            continue  # Tensile keeps the trees' pick (docs/predictor.md, "Selection")
        a, b = pred.predict([small, big], dev)
        assert b.gpu_ms >= a.gpu_ms * (1 - 1e-5), (dev.name, small, big, a, b)


@SETTINGS
@given(family=st.sampled_from(FAMILIES), dtype=st.sampled_from(DTYPES), base=dims)
def test_every_kernel_inside_its_envelope(family, dtype, base) -> None:
    """Never faster than the roofline at the device's peaks, never slower than the envelope
    ceiling (the utilization floor's time plus the fixed costs), always finite."""
    if family in ("bmm", "linear") and dtype in ("bool", "int64"):
        dtype = "float32"
    k = kernel(family, dtype, *base)
    pred = _predictor()
    for dev in DEVICES:
        p = pred.predict([k], dev)[0]
        compute_ms, memory_ms = roofline_times_ms(k, dev)
        # Bytes of a working set that fits twice in the L2 may come from it, faster than DRAM.
        in_l2 = k.bytes <= 2 * dev.l2_cache_mb * 2**20
        # Winograd and FFT convs do fewer FLOPs than the direct count the roofline uses.
        floor_ms = max(0.0 if family == "conv" else compute_ms, 0.0 if in_l2 else memory_ms)
        assert p.gpu_ms >= floor_ms * 0.99, (dev.name, k, p)
        # Ceiling: 21 launches + waves' setup + work at a 0.1 % utilization, a loose bound
        # that still catches any runaway (the old predictor forecast a 16 kB And at 151 ms).
        assert p.latency_ms <= 1.0 + 1000 * (compute_ms + memory_ms) * 4, (dev.name, k, p)
        assert p.latency_ms >= p.gpu_ms * (1 - 1e-6)


@pytest.mark.parametrize("family", (*FAMILIES, "conv"))
def test_tiny_kernels_do_not_rank_gpus_backwards(family: str) -> None:
    """A 128-element kernel of each family (conv: one 3x3 conv of one image, 1 -> 2 channels
    on 1 x 1): within 1.5x on every pair of GPUs of a vendor where the second is of the same
    or a newer generation."""
    k = kernel(family, "float32", 1, 8, 16, 8)
    pred = _predictor()
    _assert_ranked_alike(family, {d.name: pred.predict([k], d)[0].latency_ms for d in DEVICES})


def _assert_ranked_alike(family: str, lat: dict[str, float]) -> None:
    """Within 1.5x on every pair of GPUs of a vendor where the second is of the same or a
    newer generation."""
    for a, b in itertools.permutations(DEVICES, 2):
        if a.vendor == b.vendor and GENERATION[b.arch] >= GENERATION[a.arch]:
            assert lat[b.name] <= 1.5 * lat[a.name], (family, a.name, b.name, lat)


# Families whose tiny kernels' in-graph time is held alike: their partly filled waves cost
# their share (features.STREAMING). Layer norm and matmul still charge a lone block or tile a
# per-wave cost that the MLP reads from the device (docs/predictor.md, "Partly filled waves").
GRAPH_FAMILIES = ("elementwise", "softmax", "reduction")


@pytest.mark.parametrize("family", GRAPH_FAMILIES)
def test_tiny_kernels_rank_gpus_alike_inside_a_cuda_graph(family: str) -> None:
    """The same under ``--runtime graph``, where no host dispatch hides a kernel's GPU time: a
    128-element kernel's in-graph time within 1.5x on every such pair (before stop 43: a
    15.5x spread, P4 0.6 us against P100 9.8 us, from a whole wave's per-wave cost)."""
    from tilecast.analyzer.runtime import apply_runtime

    k = kernel(family, "float32", 1, 8, 16, 8)
    pred = _predictor()
    _assert_ranked_alike(family, {d.name: apply_runtime(pred.predict([k], d), d, "graph")[0]
                                  .latency_ms for d in DEVICES})


@pytest.mark.parametrize("dram_mb", (0.5, 4.096, 32.0, 256.0))
def test_streaming_more_l2_bytes_never_takes_less_time(dram_mb: float) -> None:
    """The streaming proxy (a copy of as many bytes; what a cold-weight GEMM's operand
    stream costs) on every device: adding L2-served bytes to a DRAM stream never makes it
    faster. Before stop 44 it did on the A10 (4.096 MB + 64 kB cached: 10.7725 -> 10.7694 us),
    which made 8 batch doublings of ResNet-50 / ViT faster (benchmarks/sanity.py)."""
    pred = _predictor()
    cached_bytes = np.array([0.0, 4e3, 8e3, 16e3, 64e3, 1e6, 8e6])
    for dev in DEVICES:
        per_byte_ms = 1e-6 / dev.mem_bandwidth_gbps  # bytes at peak -> ms
        n = len(cached_bytes)
        ms = pred._stream_ms(np.full(n, dram_mb * 1e6 * per_byte_ms), cached_bytes * per_byte_ms,
                             np.full(n, "bfloat16", dtype=object), np.full(n, 2.0), dev)
        assert (np.diff(ms) >= -1e-12).all(), (dev.name, dram_mb, ms)


# Convs get their own examples (adding them to FAMILIES would reshuffle the others').
CONV_DTYPES = ("float32", "float16")


@SETTINGS
@given(dtype=st.sampled_from(CONV_DTYPES), base=dims, factor=st.integers(2, 8))
def test_conv_larger_batch_never_takes_less_time(dtype, base, factor) -> None:
    """fp32 (the conv model): strict in the batch N, algorithm switches included: each
    candidate algorithm's forecast never falls with N (the conv features do not depend on it)
    and the forecast is their minimum. fp16 runs the matmul model's implicit-GEMM view, tile
    switches allowed."""
    grown = (base[0] * factor, *base[1:])
    small, big = kernel("conv", dtype, *base), kernel("conv", dtype, *grown)
    pred = _predictor()
    for dev in DEVICES:
        a, b = pred.predict([small, big], dev)
        slack = SWITCH_SLACK if a.tile != b.tile and dtype != "float32" else 1e-5
        assert b.latency_ms >= a.latency_ms * (1 - slack), (dev.name, small, big, a, b)
        assert b.gpu_ms >= a.gpu_ms * (1 - slack), (dev.name, small, big, a, b)


@SETTINGS
@given(dtype=st.sampled_from(CONV_DTYPES), base=dims)
def test_conv_inside_its_envelope(dtype, base) -> None:
    test_every_kernel_inside_its_envelope.hypothesis.inner_test("conv", dtype, base)


def _analyzed_mask_add(b: int, h: int, s: int, dtype: str) -> Kernel:
    """The analyzer's own cost of ``[b, h, s, s] + [b, 1, s, s]`` (re-reads included)."""
    from test_costs import cost_of

    c = cost_of(f"{dtype}[{b},{h},{s},{s}] x, {dtype}[{b},1,{s},{s}] m", "y = Add(x, m)", "Add")
    return Kernel("add", ("add",), "Add", c)


@given(b=st.integers(1, 8), h=st.integers(2, 64),
       s=st.sampled_from((16, 64, 256, 1024, 2048)),
       dtype=st.sampled_from(("float", "float16")), twice=st.sampled_from(("b", "h")))
@settings(max_examples=40, deadline=None, derandomize=True)
@example(b=1, h=2, s=64, dtype="float", twice="h")  # P100: -0.25 % before per-element loads
def test_a_mask_add_never_gets_faster_with_more_batch_or_heads(b, h, s, dtype, twice) -> None:
    # A broadcast operand's unique bytes per element fall as it repeats more (2 + 1/h tensors);
    # the streams and the loads per element do not (features.elementwise_features). From
    # h = 1 the mask is no broadcast: the kernel changes from a three- to a two-stream add.
    p = _predictor()
    small = _analyzed_mask_add(b, h, s, dtype)
    big = _analyzed_mask_add(2 * b if twice == "b" else b, 2 * h if twice == "h" else h, s,
                             dtype)
    for dev in DEVICES:  # float32 inference: 1e-5 relative is rounding
        a, c = (p.predict([k], dev)[0].latency_ms for k in (small, big))
        assert c >= a * (1 - 1e-5), (dev.name, b, h, s, dtype, twice)
