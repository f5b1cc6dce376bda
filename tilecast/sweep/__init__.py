"""Forecast one model on several GPUs and input sizes: the table for choosing a GPU."""

from __future__ import annotations

from .api import Sweep, SweepRow, sweep
from .report import render_sweep

__all__ = ["Sweep", "SweepRow", "render_sweep", "sweep"]
