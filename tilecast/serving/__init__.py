"""LLM serving forecasts: prefill and KV-cached decode steps of a decoder-only model, time to
first token, time per output token, throughput and KV-cache memory."""

from __future__ import annotations

from .api import analyze_serving, decode_contexts, parse_batches
from .decode import decode_kernels
from .forecast import DecodeStep, ServingForecast

__all__ = ["analyze_serving", "decode_contexts", "decode_kernels", "parse_batches",
           "DecodeStep", "ServingForecast"]
