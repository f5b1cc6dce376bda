"""The learned, tile-based utilization predictor.

Serving (``predictor.OnnxPredictor``) needs only numpy and onnxruntime; training (``train``)
needs torch, the ``direct`` baseline scikit-learn. Importing this package imports neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .predictor import OnnxPredictor

ARTIFACT = Path(__file__).parent / "artifacts" / "tilecast_predictor.onnx"


def available() -> bool:
    """Whether the shipped predictor file is present."""
    return ARTIFACT.is_file()


def default_predictor() -> OnnxPredictor:
    """The shipped predictor (cached)."""
    from .predictor import default_predictor as load

    return load()


def load_predictor(path: str | Path) -> OnnxPredictor:
    """A predictor from an ONNX file written by ``tilecast train``."""
    from .predictor import OnnxPredictor

    return OnnxPredictor(path)
