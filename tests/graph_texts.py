"""Tiny ONNX graphs in text syntax that several test files share."""

from __future__ import annotations

# A two-layer MLP whose batch is symbolic: a sweep binds it (conftest's ``batch_mlp``).
BATCH_MLP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 256] x, float[256, 512] w, float[512, 512] w2) => (float[batch, 512] y) {
  h = MatMul(x, w)
  r = Relu(h)
  y = MatMul(r, w2)
}"""
