"""Golden forecasts: the full JSON of small models, regenerated with ``pytest --update-golden``."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import tilecast
from tilecast.analyzer.synthetic import gpt2_like, small_cnn

GOLDEN = Path(__file__).parent / "golden"
MODELS = {
    "gpt2_tiny_l4_roofline": (lambda: gpt2_like(layers=1, hidden=32, heads=2, seq=16, batch=1,
                                                vocab=100), "l4", "roofline"),
    "cnn_t4_roofline": (small_cnn, "t4", "roofline"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_golden(name, tmp_path, update_golden):
    build, device, predictor = MODELS[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(build(), path)
    data = tilecast.analyze(path, device, predictor=predictor).to_dict()
    data["model"] = name  # the tmp path differs per run
    text = json.dumps(data, indent=2) + "\n"
    golden = GOLDEN / f"{name}.json"
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}: run pytest --update-golden"
    assert text == golden.read_text()
