"""SVG charts of forecasts and sweeps, drawn without a plotting library."""

from __future__ import annotations

from .breakdown import forecast_svg
from .change import comparison_svg
from .parity import evaluation_svg
from .scaling import sweep_svg
from .serving import serving_svg

__all__ = ["comparison_svg", "evaluation_svg", "forecast_svg", "serving_svg", "sweep_svg"]
