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
24 layers the clamp alone is 202 ms of that 3189 ms step. GPT-2 and BERT record the same
work as today's eager attention (a scale, a mask, softmax), so they export unchanged.
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


ATTENTION_BY_MODEL_TYPE = {"opt": (OPT_ATTENTION, opt_attention)}


def attention_for(config: Path) -> str:
    """The attention to export a labelled model with: eager, or the recorded one."""
    model_type = json.loads(config.read_text()).get("model_type", "")
    if model_type not in ATTENTION_BY_MODEL_TYPE:
        return "eager"
    from ..exporters import register_attention

    name, fn = ATTENTION_BY_MODEL_TYPE[model_type]
    register_attention(name, fn)
    return name
