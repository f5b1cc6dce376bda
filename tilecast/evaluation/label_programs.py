"""The programs the labels measured, where the installed transformers builds another one.

The labels' per-node CSVs record each measured run's FX graph (transformers 4.x). Where
today's transformers lays a model out differently, the evaluation exports the recorded
program, so that an error is the predictor's and not a different program's.

OPT's attention, as every OPT CSV records it (A100 80GB, ``opt_13-train-2048-2``, per layer):
three ``contiguous`` copies of the [2, 32, 2048, 64] query, key and value (0.061 ms each),
``bmm``, ``add_6`` (the additive mask, 2.03 ms), ``max_1``: the scores clamped at the dtype's
minimum, ``torch.max(scores, finfo.min)`` (1.42 ms forward, 7.00 ms backward), ``softmax``,
``bmm_1``; the 1/sqrt(d) scale is applied to the query (``mul_1``, [2, 2048, 2048]). The
installed transformers drops the clamp and the copies and multiplies the scores by 1.0. Over
24 layers the clamp alone is 202 ms of that 3189 ms step.

GPT-2 (and the GPT-3 configs, which use its model class) and BERT record today's work (a
scale, a mask, softmax) but other masks, and a mask is read again for every head when it
outgrows the cache (``analyzer/costs/broadcast.py``). Today's eager attention adds one float
``[b, 1, s, s]`` mask, built once per model. The CSVs record, per layer:

- GPT-2: ``truediv`` by sqrt(d), then ``where`` with the ``[1, 1, s, s]`` bool causal buffer
  and a 0-dim minimum (no padding mask was passed);
- BERT: ``truediv``, then ``add`` of the ``[b, 1, 1, s]`` extended padding mask.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OPT_ATTENTION = "tilecast-labels-opt"  # registered attention name (exporters.register_attention)


def opt_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  scaling: float, dropout: float = 0.0, **_: Any) -> tuple[Any, Any]:
    """OPT attention as the labels' FX graphs record it (see the module docstring)."""
    import torch

    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    scores = torch.matmul(query, key.transpose(-1, -2))
    if scaling != 1.0:  # OPT scales the query before this call and passes 1.0
        scores = scores * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
        floor = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype,
                             device=scores.device)
        scores = torch.max(scores, floor)
    if scores.dtype == torch.float16:
        probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    else:
        probs = torch.nn.functional.softmax(scores, dim=-1)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2), probs


def _finish(module: Any, scores: Any, value: Any, dropout: float) -> tuple[Any, Any]:
    import torch

    probs = torch.nn.functional.softmax(scores, dim=-1)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2), probs


def gpt2_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                   scaling: float, dropout: float = 0.0, **_: Any) -> tuple[Any, Any]:
    """GPT-2's attention as its labels' FX graphs record it (module docstring); exported with
    no mask tensor (``register_attention(mask=False)``)."""
    import torch

    scores = torch.matmul(query, key.transpose(-1, -2)) / (1.0 / scaling)
    q, k = scores.shape[-2], scores.shape[-1]
    causal = torch.ones(q, k, dtype=torch.bool, device=scores.device).tril(k - q)[None, None]
    floor = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype,
                         device=scores.device)
    return _finish(module, torch.where(causal, scores, floor), value, dropout)


def bert_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                   scaling: float, dropout: float = 0.0, **_: Any) -> tuple[Any, Any]:
    """BERT's attention as its labels' FX graphs record it: the padding mask is added as
    ``[b, 1, 1, s]`` (all zeros: the measured runs padded nothing)."""
    import torch

    scores = torch.matmul(query, key.transpose(-1, -2)) / (1.0 / scaling)
    pad = torch.zeros(scores.shape[0], 1, 1, scores.shape[-1], dtype=scores.dtype,
                      device=scores.device)
    return _finish(module, scores + pad, value, dropout)


GPT2_ATTENTION = "tilecast-labels-gpt2"
BERT_ATTENTION = "tilecast-labels-bert"
# model_type -> (registered name, function, whether the model builds eager's mask tensor)
ATTENTION_BY_MODEL_TYPE = {"opt": (OPT_ATTENTION, opt_attention, True),
                           "gpt2": (GPT2_ATTENTION, gpt2_attention, False),
                           "bert": (BERT_ATTENTION, bert_attention, False)}


def attention_for(config: Path) -> str:
    """The attention to export a labelled model with: eager, or the recorded one."""
    model_type = json.loads(config.read_text()).get("model_type", "")
    if model_type not in ATTENTION_BY_MODEL_TYPE:
        return "eager"
    from ..exporters import register_attention

    name, fn, mask = ATTENTION_BY_MODEL_TYPE[model_type]
    register_attention(name, fn, mask=mask)
    return name
