"""Grouped-query K and V of an unpadded batch (sdpa_kernels.py): Hugging Face passes them to
SDPA unrepeated when it passes no mask. PyTorch's flash kernel (sm80 and later, fp16 / bf16)
reads them as they are, so the export's repeat_kv is part of the call; on other GPUs and in
fp32 the call takes SDPA's math path, op by op."""

from __future__ import annotations

import onnx.parser
import pytest
from test_padding import DECODER_MASK, HEAD, SDPA

import tilecast
from tilecast.analyzer.sdpa_kernels import pytorch_sdpa

# 4 query heads over 2 KV heads (n_rep 2), the decoder mask of test_padding: K and V projected
# as (2, S, 2, 16), repeated as repeat_kv writes it: Unsqueeze, Expand, Reshape to 4 heads
GQA = (HEAD.replace("float[2, S, 4, 16] kp, float[2, S, 4, 16] vp",
                    "float[2, S, 2, 16] kp, float[2, S, 2, 16] vp")
       .replace("int64[1] at2 = {2}>", "int64[1] at2 = {2}, int64[5] rep = {1, 1, 2, 1, 1}, "
                "int64[4] heads = {2, 4, -1, 16}>")
       + DECODER_MASK + """  k5 = Unsqueeze(k1, at2)
  ke = Expand(k5, rep)
  kr = Reshape(ke, heads)
  v5 = Unsqueeze(v1, at2)
  ve = Expand(v5, rep)
  vr = Reshape(ve, heads)
""" + SDPA.replace("Transpose <perm = [0, 1, 3, 2]> (k)", "Transpose <perm = [0, 1, 3, 2]> (kr)")
       .replace("o = MatMul(p, v)", "o = MatMul(p, vr)"))
GQA = GQA.replace("  k = Transpose", "  k1 = Transpose").replace("  v = Transpose",
                                                               "  v1 = Transpose")
# fp16 under autocast: Q and the output (2, 4, 16, 16) 4,096 bytes each, K and V (2, 2, 16, 16)
# 2,048 each, as the flash kernel reads them
GROUPED_BYTES = 2 * 4096 + 2 * 2048


def _run(device: str, math: str):
    return tilecast.analyze(onnx.parser.parse_model(GQA), device, predictor="roofline",
                            math=math, dims={"S": 16})


def _ops(f) -> list[str]:
    return sorted(k.kernel.op_type for k in f.kernels)


@pytest.mark.parametrize("device", ["a100-sxm4-40gb", "h100-sxm"])
def test_flash_reads_grouped_heads(device: str) -> None:
    f = _run(device, "amp-fp16")
    att = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    assert [a.cost.bytes for a in att] == [GROUPED_BYTES] and att[0].cost.matmul.causal
    assert "Expand" not in _ops(f) and "ReduceSum" in _ops(f)


@pytest.mark.parametrize(("device", "math"), [
    ("t4", "amp-fp16"),  # no flash kernel before sm80
    ("Tesla V100 SXM2 32GB", "amp-fp16"),
    ("a100-sxm4-40gb", "graph"),  # flash takes no fp32
])
def test_elsewhere_the_call_takes_the_math_path(device: str, math: str) -> None:
    ops = _ops(_run(device, math))
    assert "Attention" not in ops and "Softmax" in ops and ops.count("Expand") == 2


@pytest.mark.parametrize(("vendor", "arch", "autocast", "dtype", "reads"), [
    ("nvidia", "ampere", None, "float16", True),
    ("nvidia", "ampere", None, "float32", False),  # fp32 as exported
    ("nvidia", "ampere", "bfloat16", "float32", True),  # autocast runs it in bf16
    ("nvidia", "turing", "float16", "float16", False),
    ("amd", "cdna3", "float16", "float16", False),
])
def test_which_calls_flash_reads_grouped(vendor: str, arch: str, autocast: str | None,
                                        dtype: str, reads: bool) -> None:
    assert pytorch_sdpa(vendor, arch, autocast).reads_gqa(dtype) is reads
