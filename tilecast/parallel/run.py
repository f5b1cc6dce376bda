"""A whole training run at the forecast step time: steps, wall-clock days and GPU-hours.

Tokens per step are the global batch times the graph's sequence length (the attention's query
length, ``ParallelForecast.sequence``). The run repeats the forecast step; warm-up, evaluation,
checkpointing and restarts are not in it, and the output says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .forecast import ParallelForecast

# A quadrillion tokens: far past any corpus, and every count below it stays a finite float.
MAX_TOKENS = 1e15
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_TOKENS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class TrainingRun:
    """``tokens`` trained at ``tokens_per_step`` per step of ``step_ms`` on ``gpus`` GPUs."""

    tokens: float
    tokens_per_step: int
    step_ms: float
    gpus: int

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.tokens_per_step)

    @property
    def hours(self) -> float:
        return self.steps * self.step_ms / 3.6e6

    @property
    def days(self) -> float:
        return self.hours / 24

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "tokens_per_step": self.tokens_per_step,
                "steps": self.steps, "hours": round(self.hours, 3),
                "days": round(self.days, 3), "gpu_hours": round(self.gpu_hours, 1)}

    def summary(self) -> str:
        return (f"{_count(self.tokens)} tokens = {self.steps:,} steps of "
                f"{self.tokens_per_step:,} tokens: {self.days:,.2f} days, "
                f"{self.gpu_hours:,.0f} GPU-hours (steps only: no warm-up, evaluation or "
                f"checkpoints)")


def parse_tokens(text: str) -> float:
    """``300e9``, ``300B``, ``1.5T``, ``2M`` or a plain count; an error names the value."""
    m = _TOKENS.match(text)
    if not m:
        raise ConfigError(f"--train-tokens {text!r} is not a token count (e.g. 300B, 1.5T, "
                          "3e11)")
    tokens = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not 0 < tokens <= MAX_TOKENS:
        raise ConfigError(f"--train-tokens {text!r} must be more than 0 and at most "
                          f"{MAX_TOKENS:.0e}")
    return tokens


def plan_run(forecast: ParallelForecast, tokens: float) -> TrainingRun:
    """The run of ``tokens`` tokens at the forecast's step time and global batch."""
    if forecast.sequence <= 0:
        raise ConfigError(f"{forecast.model}: no attention was recognized, so its sequence "
                          "length (tokens per sample) is unknown; a token count cannot be "
                          "turned into steps")
    return TrainingRun(tokens, forecast.global_batch * forecast.sequence, forecast.step_ms,
                       forecast.layout.gpus)


def _count(tokens: float) -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"
