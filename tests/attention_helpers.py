"""Shared by the attention-mask tests: analyze a graph text with its sequence dim S bound to
16, and read the forecast's kernels and zero-cost reasons."""

from __future__ import annotations

import onnx.parser

import tilecast

SEQUENCE = 16  # S: a mask of up to 100 elements would be host arithmetic (fold.py)


def run(text: str, runtime: str = "eager"):
    return tilecast.analyze(onnx.parser.parse_model(text), "a100-sxm4-40gb",
                            predictor="roofline", runtime=runtime, dims={"S": SEQUENCE})


def ops(f) -> list[str]:
    return sorted(k.kernel.op_type for k in f.kernels)


def reasons(f, reason: str) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == reason)


def attention(f):
    (att,) = [k.kernel for k in f.kernels if k.kernel.op_type == "Attention"]
    return att
