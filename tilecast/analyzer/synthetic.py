"""Synthetic ONNX graphs built with onnx.helper alone (no torch): a GPT-2-style decoder and a
small ResNet-style CNN. Used by the bundled examples, the tests and the benchmarks.

Weights are external-data references to a file that is never written, the same scheme the
exporters use: shapes and dtypes are exact, no weight byte exists anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHTS_FILE = "weights.absent.bin"


@dataclass
class _Builder:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def name(self, base: str) -> str:
        self.counter += 1
        return f"{base}_{self.counter}"

    def weight(self, name: str, shape: list[int], dtype: int = TensorProto.FLOAT) -> str:
        t = onnx.TensorProto(name=name, data_type=dtype, dims=shape)
        t.data_location = TensorProto.EXTERNAL
        size = int(np.prod(shape)) * (2 if dtype in (TensorProto.FLOAT16,
                                                      TensorProto.BFLOAT16) else 4)
        for k, v in (("location", WEIGHTS_FILE), ("offset", "0"), ("length", str(size))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t)
        return name

    def const(self, value: np.ndarray, base: str = "const") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, prefix: str = "",
           **attrs) -> str | list[str]:
        name = self.name(f"{prefix}{op_type}")
        outs = [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs


def _attention(b: _Builder, x: str, p: str, batch: int | str, seq: int, hidden: int,
               heads: int, mask: str | None, dt: int) -> str:
    """The attention block; ``mask`` None: its core as one causal ONNX ``Attention`` node
    (opset 23), as an SDPA export has it."""
    hd = hidden // heads
    qkv = b.op("Add", [b.op("MatMul", [x, b.weight(f"{p}.attn.c_attn.weight",
                                                   [hidden, 3 * hidden], dt)], prefix=p),
                       b.weight(f"{p}.attn.c_attn.bias", [3 * hidden], dt)], prefix=p)
    split = b.const(np.array([hidden] * 3, dtype=np.int64), "split")
    q, k, v = b.op("Split", [qkv, split], n_out=3, axis=-1, prefix=p)
    heads_shape = b.const(np.array([0, seq, heads, hd], dtype=np.int64), "shape")
    q, k, v = (b.op("Reshape", [t, heads_shape], prefix=p) for t in (q, k, v))
    q = b.op("Transpose", [q], perm=[0, 2, 1, 3], prefix=p)
    k = b.op("Transpose", [k], perm=[0, 2, 3, 1] if mask else [0, 2, 1, 3], prefix=p)
    v = b.op("Transpose", [v], perm=[0, 2, 1, 3], prefix=p)
    if mask is None:
        ctx = b.op("Attention", [q, k, v], is_causal=1, prefix=p)
    else:
        scores = b.op("MatMul", [q, k], prefix=p)
        scale = b.const(np.array(math.sqrt(hd), dtype=np.float32 if dt == 1 else np.float16))
        scores = b.op("Add", [b.op("Div", [scores, scale], prefix=p), mask], prefix=p)
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1, prefix=p), v], prefix=p)
    ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3], prefix=p)
    ctx = b.op("Reshape", [ctx, b.const(np.array([0, seq, hidden], dtype=np.int64))], prefix=p)
    out = b.op("MatMul", [ctx, b.weight(f"{p}.attn.c_proj.weight", [hidden, hidden], dt)],
               prefix=p)
    return b.op("Add", [out, b.weight(f"{p}.attn.c_proj.bias", [hidden], dt)], prefix=p)


def _mlp(b: _Builder, x: str, p: str, hidden: int, dt: int) -> str:
    h = b.op("Add", [b.op("MatMul", [x, b.weight(f"{p}.mlp.c_fc.weight", [hidden, 4 * hidden],
                                                 dt)], prefix=p),
                     b.weight(f"{p}.mlp.c_fc.bias", [4 * hidden], dt)], prefix=p)
    np_dt = np.float32 if dt == TensorProto.FLOAT else np.float16
    # GELU, erf form: 0.5 * x * (1 + erf(x / sqrt(2))), as torch exports it.
    erf = b.op("Erf", [b.op("Div", [h, b.const(np.array(math.sqrt(2), dtype=np_dt))],
                            prefix=p)], prefix=p)
    g = b.op("Mul", [b.op("Mul", [h, b.const(np.array(0.5, dtype=np_dt))], prefix=p),
                     b.op("Add", [erf, b.const(np.array(1.0, dtype=np_dt))], prefix=p)],
             prefix=p)
    out = b.op("MatMul", [g, b.weight(f"{p}.mlp.c_proj.weight", [4 * hidden, hidden], dt)],
               prefix=p)
    return b.op("Add", [out, b.weight(f"{p}.mlp.c_proj.bias", [hidden], dt)], prefix=p)


def _layernorm(b: _Builder, x: str, p: str, hidden: int, dt: int) -> str:
    return b.op("LayerNormalization", [x, b.weight(f"{p}.weight", [hidden], dt),
                                       b.weight(f"{p}.bias", [hidden], dt)],
                axis=-1, epsilon=1e-5, prefix=p)


def gpt2_like(layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 32,
              batch: int | str = 2, vocab: int = 1000, dtype: int = TensorProto.FLOAT,
              name: str = "gpt2_like", fused_attention: bool = False) -> onnx.ModelProto:
    """A GPT-2 decoder (pre-LN, erf GELU, causal mask, tied LM head) as a static ONNX graph.
    ``batch`` may be a string to leave a symbolic dim; ``fused_attention``: each attention
    core one causal ``Attention`` node (opset 23) instead of MatMul / Softmax nodes."""
    b = _Builder()
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])
    x = b.op("Gather", [b.weight("wte.weight", [vocab, hidden], dt := dtype), "input_ids"])
    pos = b.op("Gather", [b.weight("wpe.weight", [seq, hidden], dt),
                          b.const(np.arange(seq, dtype=np.int64), "position_ids")])
    x = b.op("Add", [x, pos])
    # The causal mask is computed in-graph (as exporters do), not stored as a seq^2 constant.
    fill = onnx.helper.make_tensor("fill", dt, [1], [-1e4])
    mask = b.op("Trilu", [b.op("ConstantOfShape", [b.const(np.array([1, 1, seq, seq],
                                                                    dtype=np.int64))],
                               value=fill), b.const(np.array(1, dtype=np.int64))], upper=1)
    for i in range(layers):
        p = f"h.{i}."
        a = _attention(b, _layernorm(b, x, p + "ln_1", hidden, dt), p, batch, seq, hidden,
                       heads, None if fused_attention else mask, dt)
        x = b.op("Add", [x, a], prefix=p)
        x = b.op("Add", [x, _mlp(b, _layernorm(b, x, p + "ln_2", hidden, dt), p, hidden, dt)],
                 prefix=p)
    x = _layernorm(b, x, "ln_f", hidden, dt)
    head = b.op("Transpose", ["wte.weight"], perm=[1, 0])
    logits = b.op("MatMul", [x, head])
    out = helper.make_tensor_value_info(logits, dt, [batch, seq, vocab])
    graph = helper.make_graph(b.nodes, name, [ids], [out], b.inits)
    return _finish(graph, opset=23 if fused_attention else 17)


def _conv_bn_relu(b: _Builder, x: str, p: str, cin: int, cout: int, k: int, stride: int,
                  relu: bool = True) -> str:
    w = b.weight(f"{p}.conv.weight", [cout, cin, k, k])
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride],
             pads=[k // 2] * 4, prefix=p)
    bn = [b.weight(f"{p}.bn.{n}", [cout]) for n in ("weight", "bias", "mean", "var")]
    y = b.op("BatchNormalization", [y, *bn], epsilon=1e-5, prefix=p)
    return b.op("Relu", [y], prefix=p) if relu else y


def small_cnn(batch: int = 2, image: int = 64, width: int = 32, classes: int = 10,
              name: str = "small_cnn") -> onnx.ModelProto:
    """A ResNet-style CNN: stem conv + max-pool, two residual blocks, global pool, classifier."""
    b = _Builder()
    inp = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [batch, 3, image, image])
    x = _conv_bn_relu(b, "pixels", "stem", 3, width, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for i, (cin, cout, stride) in enumerate(((width, width, 1), (width, 2 * width, 2))):
        p = f"layer{i}."
        y = _conv_bn_relu(b, x, p + "a", cin, cout, 3, stride)
        y = _conv_bn_relu(b, y, p + "b", cout, cout, 3, 1, relu=False)
        skip = x if stride == 1 else _conv_bn_relu(b, x, p + "down", cin, cout, 1, stride,
                                                   relu=False)
        x = b.op("Relu", [b.op("Add", [y, skip], prefix=p)], prefix=p)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    logits = b.op("Gemm", [x, b.weight("fc.weight", [classes, 2 * width]),
                           b.weight("fc.bias", [classes])], transB=1)
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT, [batch, classes])
    return _finish(helper.make_graph(b.nodes, name, [inp], [out], b.inits))


def _finish(graph: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tilecast.synthetic")
    model.ir_version = 8 if opset < 21 else 10
    return onnx.shape_inference.infer_shapes(model, data_prop=True)
