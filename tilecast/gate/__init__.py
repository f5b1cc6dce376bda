"""Compare forecasts and gate changes on latency regressions (``tilecast compare``/``gate``)."""

from __future__ import annotations

from .api import compare
from .compare import Comparison, DeviceComparison, FamilyChange, KernelChange
from .config import GateConfig, ModelSpec, load_config
from .runner import GateResult, run_gate, update_baselines
from .threshold import Threshold, parse_threshold

__all__ = ["compare", "Comparison", "DeviceComparison", "FamilyChange", "KernelChange",
           "Threshold", "parse_threshold", "GateConfig", "ModelSpec", "GateResult",
           "load_config", "run_gate", "update_baselines"]
