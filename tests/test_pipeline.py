"""End-to-end analysis: roofline forecast, fusion groups, JSON schema and determinism."""

from __future__ import annotations

import json
import sys

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.analysis import cost_graph
from tilecast.analyzer.fusion import fusion_groups
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.predictor import RooflinePredictor
from tilecast.analyzer.runtime import (
    GRAPH_KERNEL_LAUNCH_US,
    HOST_DISPATCH_US,
    predictor_launch_ms,
)

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 128] x, float[128, 256] w, float[256] b) => (float[64, 256] z) {
  h = MatMul(x, w)
  hb = Add(h, b)
  s = Constant<value = int64[2] {64, 256}>()
  r = Reshape(hb, s)
  a = Relu(r)
  z = Sigmoid(a)
}"""


def test_gpt2_and_cnn_have_no_unsupported_op(gpt2_path, cnn_path):
    for path in (gpt2_path, cnn_path):
        f = tilecast.analyze(path, "l4", predictor="roofline")
        assert f.unsupported == {}, f.unsupported
        assert f.total_ms == pytest.approx(sum(f.by_family.values()))
        assert f.total_ms > 0


def test_roofline_latency_is_max_of_compute_and_memory(gpt2_path):
    dev = tilecast.load_device("l4")
    f = tilecast.analyze(gpt2_path, dev, predictor="roofline")
    # The predictor's GPU time, before the runtime (eager dispatch) is applied.
    preds = RooflinePredictor().predict([k.kernel for k in f.kernels], dev)
    for k, p in zip(f.kernels, preds, strict=True):
        c = k.kernel.cost
        compute = c.flops / (dev.peak_tflops(c.dtype, c.unit) * 1e9)
        memory = c.bytes / (dev.mem_bandwidth_gbps * 1e6)
        expected = max(compute, memory) + dev.launch_overhead_us * 1e-3
        assert p.latency_ms == pytest.approx(expected)
        assert k.bound in ("compute", "memory", "overhead")


def test_json_has_schema_fields_and_is_deterministic(gpt2_path):
    a = tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_json()
    b = tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_json()
    assert a == b
    data = json.loads(a)
    for key in ("schema", "tilecast_version", "model", "device", "mode", "predictor",
                "total_ms", "by_family", "kernels", "unsupported"):
        assert key in data
    assert data["schema"] == 1
    kernel = data["kernels"][0]
    for key in ("name", "nodes", "op_type", "family", "flops", "bytes", "latency_ms", "bound"):
        assert key in kernel


def test_fusion_groups_chain_with_external_bytes_only():
    graph = build_graph(onnx.parser.parse_model(CHAIN))
    results = cost_graph(graph)
    groups = [g for g in fusion_groups(graph, results) if g.cost is not None]
    ops = sorted(g.op_type for g in groups)
    assert ops == ["Fused[Add+Relu+Sigmoid]", "MatMul"]
    fused = next(g for g in groups if g.op_type.startswith("Fused"))
    # external: h (64x256) and b (256) in, z (64x256) out; r, a never reach DRAM
    assert fused.cost.bytes == (64 * 256 + 256 + 64 * 256) * 4
    assert fused.epilogue_of == "MatMul_0" or fused.epilogue_of.startswith("MatMul")
    # every node carries a group id: the groups partition the nodes
    members = sorted(i for g in fusion_groups(graph, results) for i in g.members)
    assert members == list(range(len(results)))


def test_fusion_forecast_is_faster_with_fewer_kernels(gpt2_path):
    plain = tilecast.analyze(gpt2_path, "a100-80gb", predictor="roofline")
    fused = tilecast.analyze(gpt2_path, "a100-80gb", predictor="roofline", fusion=True)
    assert len(fused.kernels) < len(plain.kernels)
    assert fused.total_ms < plain.total_ms
    assert sum(k.kernel.flops for k in fused.kernels) == sum(k.kernel.flops
                                                              for k in plain.kernels)


def test_custom_predictor_object_is_used(gpt2_path):
    class Constant(RooflinePredictor):
        name = "constant"

        def predict(self, kernels, device):
            return [tilecast.Prediction(1.0, "compute") for _ in kernels]

    f = tilecast.analyze(gpt2_path, "t4", predictor=Constant())
    # Eager: the host issues the first kernel after one dispatch and it starts one launch
    # later; every later one is queued while the GPU is still busy with 1 ms kernels, so its
    # launch hides behind its predecessor and only the inter-kernel gap shows.
    n, launch = len(f.kernels), predictor_launch_ms(tilecast.load_device("t4"))
    first = HOST_DISPATCH_US * 1e-3 + launch
    expected = first + n * (1.0 - launch) + (n - 1) * GRAPH_KERNEL_LAUNCH_US * 1e-3
    assert f.predictor == "constant" and f.total_ms == pytest.approx(expected)


def test_import_does_not_pull_torch():
    code = "import tilecast, sys; tilecast.analyze; assert 'torch' not in sys.modules"
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_linear_bias_add_is_folded_into_its_matmul():
    # the bias must be a parameter (an initializer) for PyTorch's addmm to take it
    text = CHAIN.replace(", float[256] b) =>", ") =>").replace(
        "=> (float[64, 256] z) {", "=> (float[64, 256] z) <float[256] b = {0.0}> {")
    f = tilecast.analyze(onnx.parser.parse_model(text), "l4", predictor="roofline")
    mm = next(k.kernel for k in f.kernels if k.kernel.op_type == "MatMul")
    # 2*64*128*256 GEMM FLOPs + 64*256 bias adds; bytes: x, w, the bias vector and the output
    assert mm.flops == 2 * 64 * 128 * 256 + 64 * 256
    assert mm.bytes == (64 * 128 + 128 * 256 + 256 + 64 * 256) * 4
    assert "Add" not in [k.kernel.op_type for k in f.kernels]
    assert f.zero_cost.get("Add") == 1
