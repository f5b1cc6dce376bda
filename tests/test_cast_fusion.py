"""Under the graph runtime a Cast that alone reads a row or elementwise kernel's output is
written by that kernel in the cast dtype (cast_fusion.py); eager PyTorch runs it alone."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.cast_fusion import CAST_IN_PRODUCER

# An fp32 LayerNorm over (64, 256), flattened, cast to half for a half GEMM: autocast's form
BASE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 32, 256] x, float[256] s, float[256] b, float16[256, 128] w)
    => (float16[64, 128] y) <int64[2] flat = {64, 256}> {
  n = LayerNormalization <axis = -1> (x, s, b)
  f = Reshape(n, flat)
  h = Cast <to = 10> (f)
  y = MatMul(h, w)
}"""
# a shape query reads no elements: the cast still fuses
SHAPE = BASE.replace("=> (float16[64, 128] y)", "=> (float16[64, 128] y, int64[3] d)") \
    .replace("  f = Reshape", "  d = Shape(n)\n  f = Reshape")
# the fp32 LayerNorm output is also a graph output: the kernel writes it and the half copy
SHARED = BASE.replace("=> (float16[64, 128] y)", "=> (float16[64, 128] y, float[2, 32, 256] n)")
# autocast casts the output once per GEMM reading it: one half copy is written
TWICE = BASE.replace("=> (float16[64, 128] y)", "=> (float16[64, 128] y, float16[64, 128] z)") \
    .replace("  y = MatMul(h, w)",
             "  y = MatMul(h, w)\n  h2 = Cast <to = 10> (f)\n  z = MatMul(h2, w)")
# a cast of a GEMM's output: the GEMM's own output type, left to the library
AFTER_GEMM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[64, 256] x, float16[256, 128] w) => (float[64, 128] y) {
  m = MatMul(x, w)
  y = Cast <to = 1> (m)
}"""

# LayerNorm bytes: x 64 x 256 fp32 (65,536), scale and shift (2,048), the output 65,536 in
# fp32 or 32,768 in half
FP32_OUT, HALF_OUT = 65536 + 2048 + 65536, 65536 + 2048 + 32768


def _run(text: str, runtime: str = "graph", math: str = "graph"):
    return tilecast.analyze(onnx.parser.parse_model(text), "a100-sxm4-40gb",
                            predictor="roofline", runtime=runtime, math=math)


def _fused(f) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == CAST_IN_PRODUCER)


@pytest.mark.parametrize(("text", "ops", "norm_bytes"), [
    (BASE, ["LayerNormalization", "MatMul"], HALF_OUT),
    (SHAPE, ["LayerNormalization", "MatMul"], HALF_OUT),
    (SHARED, ["LayerNormalization", "MatMul"], FP32_OUT + 32768),
    (TWICE, ["LayerNormalization", "MatMul", "MatMul"], HALF_OUT),
])
def test_the_producer_writes_the_cast_dtype(text: str, ops: list[str],
                                            norm_bytes: int) -> None:
    f = _run(text)
    assert [k.kernel.op_type for k in f.kernels] == ops
    assert _fused(f) == ops.count("MatMul")  # one cast per GEMM
    (norm,) = [k.kernel for k in f.kernels if k.kernel.op_type == "LayerNormalization"]
    assert norm.bytes == norm_bytes


def test_a_gemm_output_cast_stays_a_kernel() -> None:
    assert [k.kernel.op_type for k in _run(AFTER_GEMM).kernels] == ["MatMul", "Cast"]


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_pytorch_runtimes_run_the_cast_alone(runtime: str) -> None:
    f = _run(BASE, runtime)
    assert "Cast" in [k.kernel.op_type for k in f.kernels] and _fused(f) == 0


def test_autocast_casts_after_a_norm_fuse_under_graph() -> None:
    # the same layer exported in fp32 and forecast under amp-fp16: autocast casts the
    # LayerNorm's output for the GEMM, and the weight (a graph input here, so a kernel)
    fp32 = BASE.replace("float16[256, 128] w", "float[256, 128] w") \
        .replace("float16[64, 128] y", "float[64, 128] y").replace("  h = Cast <to = 10> (f)\n",
                                                                "").replace("(h, w)", "(f, w)")
    graph = _run(fp32, math="amp-fp16")
    casts = [k.kernel.name for k in graph.kernels if k.kernel.op_type == "Cast"]
    assert _fused(graph) == 1 and len(casts) == 1 and casts[0].startswith("w/")
    assert "Cast" in [k.kernel.op_type for k in _run(fp32, "eager", "amp-fp16").kernels]
