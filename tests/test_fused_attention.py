"""A fused attention op (SDPA export, ONNX Attention, ORT's fused ops) is one kernel whose
scores never reach DRAM (learned/routing.py, ``_attention``)."""

from __future__ import annotations

import pytest

import tilecast
from tilecast.analyzer.costs.attention import SCORE_FLOPS, causal_pairs
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost, RowDims
from tilecast.device_db import load_device
from tilecast.learned.predictor import default_predictor


def _attention(b: int, heads: int, seq: int, d: int = 128, dtype: str = "float16",
               causal: bool = False) -> Kernel:
    """The cost the analyzer gives an Attention node: 4 d FLOPs and the softmax's work per
    visible (query, key) pair; Q, K, V read and O written."""
    pairs = b * heads * (causal_pairs(seq, seq) if causal else seq * seq)
    size = 2 if dtype in ("float16", "bfloat16") else 4
    cost = OpCost("attention", 4 * d * pairs + SCORE_FLOPS * pairs, 4 * b * heads * seq * d * size,
                  dtype, "matrix", matmul=MatmulDims(b * heads, seq, seq, d),
                  rows=RowDims(b * heads * seq, seq), elements=b * heads * seq * d)
    return Kernel("attn", ("attn",), "Attention", cost)


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "h100-sxm", "t4", "l4"])
def test_one_cta_per_128_queries_and_no_score_traffic(device: str) -> None:
    dev = load_device(device)
    # Llama 2 7B's attention at 8192 tokens: 32 heads of 128, 1.1 TFLOP. Its FLOPs at the
    # GPU's sourced GEMM rate (with up to 20 % for whole waves of 128-query CTAs) plus Q, K, V
    # and O once through DRAM bound it: no term for its 32 x 8192^2 scores (4.3 GB in fp16).
    k = _attention(1, 32, 8192)
    p = default_predictor().predict([k], dev)[0]
    peak = dev.peak_tflops("float16", "matrix") * 1e9  # FLOP per ms
    io_ms = k.bytes / dev.mem_bandwidth_bytes_per_s * 1e3
    assert k.flops / peak <= p.gpu_ms
    assert p.latency_ms <= 1.2 * k.flops / (dev.matrix_sustained_fraction * peak) + io_ms + 0.05
    assert p.tile == "128x128" and p.bound == "compute" and p.extrapolated


@pytest.mark.parametrize("device", ["a100-pcie-40gb", "h100-sxm", "t4"])
def test_more_work_takes_longer_and_causal_halves_it(device: str) -> None:
    dev = load_device(device)
    pred = default_predictor()
    # 512 -> 8192 tokens: 16x the queries against 16x the keys
    times = [p.latency_ms for p in pred.predict(
        [_attention(1, 32, s) for s in (512, 1024, 2048, 4096, 8192)], dev)]
    assert times == sorted(times)
    full, causal = pred.predict([_attention(1, 32, 8192), _attention(1, 32, 8192, causal=True)],
                                dev)
    # causal visits 8192 x 8193 / 2 of the 8192^2 pairs: about half the time once compute-bound
    assert 0.45 < causal.latency_ms / full.latency_ms < 0.6


def test_fp32_attention_takes_the_simt_model() -> None:
    # No TF32 by default: a float32 SDPA runs the memory-efficient kernel on the SIMT units.
    dev = load_device("a100-sxm4-40gb")
    half, single = default_predictor().predict(
        [_attention(1, 32, 2048), _attention(1, 32, 2048, dtype="float32")], dev)
    assert single.latency_ms > 5 * half.latency_ms  # 19.5 against 312 TFLOP/s peaks
    assert single.gpu_ms >= _attention(1, 32, 2048, dtype="float32").flops / 19.5e9


def test_sdpa_export_is_forecast_under_its_eager_twin() -> None:
    # The same layer as one Attention node and as eager MatMul / Softmax nodes: the fused one
    # moves no scores, so it takes less time on every GPU than the eager nodes replayed one by
    # one; a graph runtime fuses the eager chain into the same kernel (attention_fusion.py).
    sdpa = """
    <ir_version: 10, opset_import: ["" : 23]>
    g (float16[1, 8, 2048, 64] q, float16[1, 8, 2048, 64] k, float16[1, 8, 2048, 64] v)
      => (float16[1, 8, 2048, 64] y) {
      y = Attention(q, k, v)
    }"""
    eager = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float16[1, 8, 2048, 64] q, float16[1, 8, 64, 2048] kt, float16[1, 8, 2048, 64] v)
      => (float16[1, 8, 2048, 64] y) {
      s = MatMul(q, kt)
      p = Softmax <axis = -1> (s)
      y = MatMul(p, v)
    }"""
    import onnx.parser

    for device in ("a100-sxm4-40gb", "h100-sxm", "l4"):
        fused = tilecast.analyze(onnx.parser.parse_model(sdpa), device, runtime="graph")
        unfused = tilecast.analyze(onnx.parser.parse_model(eager), device, runtime="cudagraph")
        assert len(fused.kernels) == 1 and fused.total_ms < unfused.total_ms, device
        twin = tilecast.analyze(onnx.parser.parse_model(eager), device, runtime="graph")
        assert [k.kernel.op_type for k in twin.kernels] == ["Attention"]
        assert twin.total_ms == pytest.approx(fused.total_ms, rel=1e-6), device


def test_backward_recomputes_the_scores() -> None:
    # Flash-style backward: Q K^T again, dV, dP, dQ and dK, five products against two. The
    # query comes from a trained projection so that the attention's inputs need gradients.
    import onnx.parser

    model = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 23]>
    g (float16[1, 8, 512, 64] x, float16[1, 8, 512, 64] k, float16[1, 8, 512, 64] v)
      => (float16[1, 8, 512, 64] y) <float16[64, 64] w = {0}> {
      q = MatMul(x, w)
      y = Attention(q, k, v)
    }""")
    f = tilecast.analyze(model, "a100-sxm4-40gb", mode="training", predictor="roofline")
    fwd, bwd = ([k.kernel for k in f.kernels if k.kernel.family == "attention"
                 and k.kernel.phase == phase] for phase in ("forward", "backward"))
    assert len(fwd) == 1 and len(bwd) == 1
    assert bwd[0].cost.flops == fwd[0].cost.flops * 5 // 2
