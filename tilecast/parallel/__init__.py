"""Distributed training forecasts: data, tensor and pipeline parallelism with collectives."""

from __future__ import annotations
