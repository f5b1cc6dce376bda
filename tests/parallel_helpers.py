"""Shared by the tilecast.parallel tests: a tiny transformer layer in ONNX text, a test
cluster, and a predictor that records what it was asked."""

from __future__ import annotations

import onnx.parser
from click.testing import CliRunner, Result

from tilecast.analyzer.predictor import RooflinePredictor
from tilecast.cli import main
from tilecast.parallel.cluster import parse_cluster


# Pre-LN transformer layers: batch 2, seq 8, hidden 16, 4 heads of 4, MLP 64.
def _weights(i: int) -> str:
    return (f"float[16] g1_{i} = {{1.0}}, float[16] b1_{i} = {{0.0}}, "
            f"float[16, 48] wqkv_{i} = {{0.0}}, float[16, 16] wo_{i} = {{0.0}}, "
            f"float[16] g2_{i} = {{1.0}}, float[16] b2_{i} = {{0.0}}, "
            f"float[16, 64] w1_{i} = {{0.0}}, float[64, 16] w2_{i} = {{0.0}}")


def attention_core(sfx: str = "", kv_shape: str = "hs") -> str:
    """Heads of q, k, v (suffixed ``sfx``) -> softmax(q k^T * sc) v -> ``om`` (batch, seq,
    hidden), with the shapes ``hs`` (queries), ``kv_shape`` (keys, values) and ``hm``."""
    return f"""
  qh{sfx} = Reshape(q{sfx}, hs)
  kh{sfx} = Reshape(k{sfx}, {kv_shape})
  vh{sfx} = Reshape(v{sfx}, {kv_shape})
  qt{sfx} = Transpose <perm = [0, 2, 1, 3]> (qh{sfx})
  kt{sfx} = Transpose <perm = [0, 2, 3, 1]> (kh{sfx})
  vt{sfx} = Transpose <perm = [0, 2, 1, 3]> (vh{sfx})
  s{sfx} = MatMul(qt{sfx}, kt{sfx})
  ss{sfx} = Mul(s{sfx}, sc)
  p{sfx} = Softmax <axis = -1> (ss{sfx})
  o{sfx} = MatMul(p{sfx}, vt{sfx})
  ot{sfx} = Transpose <perm = [0, 2, 1, 3]> (o{sfx})
  om{sfx} = Reshape(ot{sfx}, hm)"""


def _layer(i: int, x: str, y: str) -> str:
    return f"""
  n1_{i} = LayerNormalization <axis = -1> ({x}, g1_{i}, b1_{i})
  qkv_{i} = MatMul(n1_{i}, wqkv_{i})
  q_{i}, k_{i}, v_{i} = Split <axis = 2, num_outputs = 3> (qkv_{i}){attention_core(f"_{i}")}
  a_{i} = MatMul(om_{i}, wo_{i})
  r1_{i} = Add(a_{i}, {x})
  n2_{i} = LayerNormalization <axis = -1> (r1_{i}, g2_{i}, b2_{i})
  h_{i} = MatMul(n2_{i}, w1_{i})
  act_{i} = Relu(h_{i})
  m_{i} = MatMul(act_{i}, w2_{i})
  {y} = Add(m_{i}, r1_{i})"""


def layers_text(layers: int) -> str:
    names = ["x", *(f"y{i}" for i in range(1, layers)), "y"]
    weights = ", ".join(_weights(i) for i in range(layers))
    body = "".join(_layer(i, names[i], names[i + 1]) for i in range(layers))
    return f"""<ir_version: 8, opset_import: ["" : 18]>
g (float[2, 8, 16] x) => (float[2, 8, 16] y)
<{weights}, int64[4] hs = {{2, 8, 4, 4}}, int64[3] hm = {{2, 8, 16}}, float sc = {{0.5}}> {{
{body}
}}"""


TINY = layers_text(1)
# The same layer in fp16 (the text format writes float16 literals as their bits: 1.0 = 0x3C00,
# 0.5 = 0x3800).
TINY_FP16 = (TINY.replace("float[", "float16[").replace("float sc = {0.5}", "float16 sc = {14336}")
             .replace("{1.0}", "{15360}").replace("{0.0}", "{0}"))

LINK = {"fabric": "nvswitch", "generation": "test", "bandwidth_gbps": 100, "latency_us": 2}
NET = {"fabric": "infiniband", "generation": "test", "bandwidth_gbps": 10, "latency_us": 5}
SOURCES = {"gpus_per_node": "test", "intra_node.bandwidth_gbps": "test",
           "intra_node.latency_us": "test", "inter_node.bandwidth_gbps": "test",
           "inter_node.latency_us": "test"}


def make_cluster(**change):
    obj = {"name": "test", "description": "test cluster", "gpu": "a100-sxm4-80gb",
           "gpus_per_node": 8, "intra_node": dict(LINK), "inter_node": dict(NET),
           "sources": dict(SOURCES)}
    obj.update(change)
    return parse_cluster(obj, "test.json")


def tiny_model():
    return onnx.parser.parse_model(TINY)


class Recording(RooflinePredictor):
    def predict(self, kernels, device):
        self.kernels = list(kernels)
        return super().predict(kernels, device)


def analyze_cli(path, parallel: str, *extra: str) -> Result:
    """``tilecast analyze PATH --mode training --parallel PARALLEL`` on the dgx-a100 preset
    with the roofline predictor, plus ``extra`` options."""
    return CliRunner().invoke(main, ["analyze", str(path), "--mode", "training", "--parallel",
                                     parallel, "--cluster", "dgx-a100", "--predictor",
                                     "roofline", *extra])
