"""A Gemm's B layout picks cuBLAS's kernel layout: transB=0 (B stored k x n, PyTorch's
addmm(x, W) and GPT-2's Conv1D) runs the "nn" kernels the batched-matmul sweep measured,
transB=1 (a linear layer's weight) the "tn" kernels of the Linear sweep (docs/predictor.md,
"A Gemm's weight layout")."""

from __future__ import annotations

import numpy as np
import onnx.parser
import pytest

import tilecast.analyzer.costs  # noqa: F401  (registers the formulas)
from tilecast.analyzer.graph import build_graph
from tilecast.analyzer.registry import REGISTRY
from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
from tilecast.device_db import list_devices, load_device
from tilecast.learned.routing import route


def _gemm_cost(inputs: str, body: str, op: str) -> OpCost:
    text = ('<ir_version: 10, opset_import: ["" : 18]>\n'
            f"g ({inputs}) => (sink) {{\n{body}\n sink = Identity(y)\n}}")
    node = next(n for n in build_graph(onnx.parser.parse_model(text)).nodes
                if n.op_type == op)
    return REGISTRY.lookup(node.domain, node.op_type, node.opset).fn(node)


@pytest.mark.parametrize(("inputs", "body", "op", "want"), [
    # GPT-2's Conv1D: addmm(bias, x, W) with W (in, out) -> Gemm transB=0: B is k x n
    ("float[4,16] a, float[16,8] b, float[8] c", "y = Gemm(a, b, c)", "Gemm", "kn"),
    # nn.Linear on 2-D input: addmm(bias, x, W.t()) -> Gemm transB=1: B is n x k
    ("float[4,16] a, float[8,16] b", "y = Gemm<transB=1>(a, b)", "Gemm", "nk"),
    # transA: neither sweep measured it; the linear layout stays the default
    ("float[16,4] a, float[16,8] b", "y = Gemm<transA=1>(a, b)", "Gemm", None),
    # a MatMul with a 2-D B may be nn.Linear with its transpose folded at export: not said
    ("float[2,4,16] a, float[16,8] b", "y = MatMul(a, b)", "MatMul", None),
])
def test_gemm_records_how_its_b_is_stored(inputs, body, op, want) -> None:
    assert _gemm_cost(inputs, body, op).matmul.b_layout == want


def _kernel(op: str, d: MatmulDims) -> Kernel:
    cost = OpCost("matmul", 2 * d.b * d.m * d.n * d.k,
                  4 * d.b * (d.m * d.k + d.k * d.n + d.m * d.n), "float32", "matrix",
                  matmul=d, elements=d.b * d.m * d.n)
    return Kernel(op, (op,), op, cost)


def test_routing_sends_a_k_by_n_gemm_to_the_batched_layout() -> None:
    kernels = [_kernel("Gemm", MatmulDims(1, 64, 32, 16, b_layout="kn")),
               _kernel("Gemm", MatmulDims(1, 64, 32, 16, b_layout="nk")),
               _kernel("Gemm", MatmulDims(1, 64, 32, 16)),  # a backward GEMM: no layout said
               _kernel("MatMul", MatmulDims(1, 64, 32, 16)),
               _kernel("MatMul", MatmulDims(4, 64, 32, 16, batched=True))]
    parts = route(kernels).parts["matmul"]
    assert list(parts.layout) == ["nn", "tn", "tn", "tn", "nn"]


# GPT-2 Large's MLP input projection at batch 4, sequence 1024: 4,096 rows x 1,280 -> 5,120.
# On Pascal the Linear sweep ran maxwell_sgemm_64x64_tn / 32x128_tn (median 1.3 TFLOP/s on
# the P4 over kernels of 0.5 ms and more) and the batched sweep maxwell_sgemm_128x64_nn
# (median 1.9, p90 3.1); the P4's GPT-2 Large run (labels, per-node CSV) took this addmm in
# 16.8 ms, 3.2 TFLOP/s: the nn kernels' rate, not the tn ones'.
C_FC = MatmulDims(1, 4096, 5120, 1280)


@pytest.mark.parametrize("device", ["tesla-p4", "p100"])
def test_pascal_runs_a_k_by_n_gemm_on_the_faster_nn_kernels(device: str) -> None:
    from tilecast.learned.predictor import default_predictor

    kn, nk = (_kernel("Gemm", MatmulDims(1, C_FC.m, C_FC.n, C_FC.k, b_layout=lay))
              for lay in ("kn", "nk"))
    fast, slow = default_predictor().predict([kn, nk], load_device(device))
    assert fast.latency_ms < 0.8 * slow.latency_ms, (fast, slow)


@pytest.mark.parametrize("device", [d for d in list_devices() if d.vendor == "nvidia"],
                         ids=lambda d: d.name)
def test_more_rows_of_a_k_by_n_gemm_never_take_less_time(device) -> None:
    # Its batch ladder runs along the rows and the batch at once (TileTable.candidates), so
    # the candidates of twice the rows are among its own: no slack across tile switches.
    from tilecast.learned.predictor import default_predictor

    # (m, n, k): the first four ran faster at twice the rows on a V100 with the batch ladder
    # along b alone (64x64 -> 32x128 / 128x32: 36.4 -> 32.5 us for the first)
    rng = np.random.default_rng(7)
    shapes = [(38, 8246, 11), (45, 6439, 16), (36, 75, 80), (35, 3304, 382)] + [
        (int(2 ** rng.uniform(0, 13)), int(2 ** rng.uniform(4, 14)),
         int(2 ** rng.uniform(4, 14))) for _ in range(12)]
    kernels = [_kernel("Gemm", MatmulDims(1, m * f, n, k, b_layout="kn"))
               for m, n, k in shapes for f in (1, 2, 8)]
    out = default_predictor().predict(kernels, device)
    for i in range(0, len(out), 3):
        a, b, c = (out[i + j].gpu_ms for j in range(3))
        assert a <= b * (1 + 1e-5) and b <= c * (1 + 1e-5), (device.name, shapes[i // 3], a, b, c)
