"""16- and 8-bit GEMMs whose rows are no multiple of 16 bytes are flagged, not silently
forecast as aligned (analyzer/forecast.py, ``misaligned_gemm``)."""

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
