"""16- and 8-bit GEMMs whose rows are no multiple of 16 bytes are flagged
(analyzer/forecast.py, ``misaligned_gemm``) and forecast with cuBLAS's narrower operand loads
(learned/tensor_core.py, ``load_width_slowdown``)."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

import tilecast
from tilecast.report import render_markdown, render_table

HEAD = """<ir_version: 8, opset_import: ["" : 17]>
head ({dtype}[64, 128] x, {dtype}[128, {n}] w) => ({dtype}[64, {n}] y) {{
  y = MatMul(x, w)
}}"""


@pytest.mark.parametrize("dtype, n, flagged", [
    ("float16", 50257, True),   # GPT-2's vocabulary: 50257 x 2 bytes, odd
    ("bfloat16", 30522, True),  # BERT's: 61044 bytes, 4 short of a multiple of 16
    ("float16", 50264, False),  # padded to a multiple of 8 elements (16 bytes)
    ("float", 50257, False),    # 4-byte rows: SIMT (or TF32) kernels, no 16-byte rule here
])
def test_an_unaligned_half_precision_head_is_flagged(dtype, n, flagged) -> None:
    model = onnx.parser.parse_model(HEAD.format(dtype=dtype, n=n))
    f = tilecast.analyze(model, "h100", predictor="roofline")
    assert len(f.misaligned) == int(flagged)
    text = render_table(f) + render_markdown(f)
    assert ("alignment:" in text) == flagged
    if flagged:
        assert f"64 x 128 -> {n}" in text


def test_the_json_marks_the_kernel() -> None:
    import json

    f = tilecast.analyze(onnx.parser.parse_model(HEAD.format(dtype="float16", n=50257)), "h100",
                         predictor="roofline")
    (kernel,) = json.loads(f.to_json())["kernels"]
    assert kernel["misaligned"] is True


BIG = """<ir_version: 8, opset_import: ["" : 17]>
head ({dtype}[8192, 1280] x, {dtype}[1280, {n}] w) => ({dtype}[8192, {n}] y) {{
  y = MatMul(x, w)
}}"""


@pytest.mark.parametrize("dtype, n, padded, low, high", [
    # GPT-2's head: 50257 x 2 bytes is odd, so 2-byte loads, 8x the aligned main loop (our
    # H100 and H200 ran such heads 6.0-9.0x the aligned forecast); the padded 50264 loads 16
    ("float16", 50257, 50264, 6.0, 8.0),
    # BERT's: 30522 x 2 = 61044 bytes, divisible by 4: 4-byte loads, 4x (measured 2.6-3.3x)
    ("bfloat16", 30522, 30528, 3.0, 4.0),
    # fp32 rows take SIMT (or TF32) kernels: no 16-byte rule, no slowdown
    ("float", 50257, 50264, 0.99, 1.01),
])
def test_an_unaligned_head_loads_in_narrower_pieces(dtype, n, padded, low, high) -> None:
    learned = pytest.importorskip("tilecast.learned")
    if not learned.available():
        pytest.skip("the learned predictor is not shipped in this install")
    times = [tilecast.analyze(onnx.parser.parse_model(BIG.format(dtype=dtype, n=width)), "h100",
                              runtime="graph").total_ms for width in (n, padded)]
    assert low <= times[0] / times[1] <= high
