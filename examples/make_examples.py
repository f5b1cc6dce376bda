"""Regenerate the bundled example models (see examples/README.md)."""

from __future__ import annotations

from pathlib import Path

import onnx

from tilecast.analyzer.synthetic import gpt2_like, small_cnn

HERE = Path(__file__).parent

if __name__ == "__main__":
    onnx.save(gpt2_like(layers=12, hidden=768, heads=12, seq=1024, batch=1, vocab=50257,
                        name="gpt2_small"), HERE / "gpt2-small.onnx")
    onnx.save(small_cnn(batch=8, image=224, width=64, classes=1000), HERE / "small-cnn.onnx")
