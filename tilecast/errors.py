"""Error hierarchy. Library code raises these; only ``cli.py`` turns them into ``Error:`` lines."""

from __future__ import annotations


class TilecastError(Exception):
    """Base class of every error tilecast reports to a user."""


class ModelLoadError(TilecastError):
    """The model file is missing, unreadable, or not a valid ONNX protobuf."""


class UnsupportedModelError(TilecastError):
    """The graph uses something tilecast cannot analyze at all."""


class ShapeError(TilecastError):
    """A shape needed for costing is unknown (e.g. an unbound symbolic dim)."""


class DeviceError(TilecastError):
    """An unknown device name or a malformed device description."""


class PredictorError(TilecastError):
    """The learned predictor file is missing, incompatible, or fails to run."""


class ExportError(TilecastError):
    """A model could not be exported to ONNX."""


class ConfigError(TilecastError):
    """A configuration or input file (gate config, baseline, labels) is malformed."""


class InvalidGraphError(ModelLoadError):
    """The graph breaks ONNX structure rules (not SSA, a missing producer or required input, a
    cycle, an invalid element type); the message names the node or value."""
