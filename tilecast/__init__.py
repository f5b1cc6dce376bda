"""tilecast: forecast deep learning latency on GPUs from an ONNX graph, without the GPU.

>>> import tilecast
>>> forecast = tilecast.analyze("model.onnx", "l4")  # doctest: +SKIP
>>> forecast.total_ms, forecast.by_family  # doctest: +SKIP

Importing tilecast never imports torch: exporting and training are optional extras.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .analyzer.forecast import Forecast, KernelForecast, load_forecast  # noqa: E402
from .analyzer.pipeline import analyze  # noqa: E402
from .analyzer.predictor import Prediction, Predictor, RooflinePredictor  # noqa: E402
from .analyzer.types import Kernel, MatmulDims, OpCost, RowDims  # noqa: E402
from .device_db import Device, list_devices, load_device  # noqa: E402
from .errors import (  # noqa: E402
    ConfigError,
    DeviceError,
    ExportError,
    ModelLoadError,
    PredictorError,
    ShapeError,
    TilecastError,
    UnknownDimError,
    UnsupportedModelError,
)
from .gate import (  # noqa: E402
    Comparison,
    DeviceComparison,
    FamilyChange,
    KernelChange,
    Threshold,
    compare,
)

__all__ = [
    "__version__", "analyze", "load_device", "list_devices", "Device", "Forecast",
    "KernelForecast", "Kernel", "OpCost", "MatmulDims", "RowDims", "Prediction", "Predictor",
    "RooflinePredictor", "TilecastError", "ModelLoadError", "UnsupportedModelError",
    "ShapeError", "UnknownDimError", "DeviceError", "PredictorError", "ExportError", "ConfigError",
    "load_forecast", "compare", "Comparison", "DeviceComparison", "FamilyChange",
    "KernelChange", "Threshold",
]
