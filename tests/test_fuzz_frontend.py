"""Fuzzing the front end: mutated graphs (dropped inputs, renamed values, bad dims, changed
attributes and op types) and mutated device JSONs only ever raise tilecast's own errors, and
the CLI answers them with exactly one ``Error:`` line and exit status 2."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_frontend import ARITH, DATA_DEPENDENT

import tilecast
from tilecast.analyzer.synthetic import gpt2_like, small_cnn
from tilecast.cli import main
from tilecast.errors import TilecastError

# The ops of stop 47's coverage: contrib mirrors, sampling, spectral and quantized ops.
NEW_OPS = """<ir_version: 10, opset_import: ["" : 22, "com.microsoft" : 1]>
g (float[1,8,16,16] x, float[16,8,3,3] w, float[16] b, float[1,8,8,2] grid, float[4,4] r,
   int64[4] bi, uint8[2,8] qa, float sa, uint8 za, float[4,64,1] sig) => (y, z, q, f) {
  c = com.microsoft.FusedConv<activation="Relu", pads=[1,1,1,1]>(x, w, b)
  s = GridSample(c, grid)
  y = RoiAlign<output_height=2, output_width=2>(s, r, bi)
  z = LRN<size=3>(c)
  q = com.microsoft.QLinearAdd(qa, sa, za, qa, sa, za, sa, za)
  f = DFT<onesided=1>(sig)
}"""
BASES = {
    "arith": onnx.parser.parse_model(ARITH),
    "new_ops": onnx.parser.parse_model(NEW_OPS),
    "data_dependent": onnx.parser.parse_model(DATA_DEPENDENT),
    "gpt2": gpt2_like(layers=1, hidden=32, heads=2, seq=8, batch=1, vocab=100),
    "cnn": small_cnn(),
}
KINDS = ("drop_input", "rename_input", "rename_output", "dim", "dim_param", "attr_int",
         "attr_ints", "attr_empty", "drop_attr", "op_type", "domain", "drop_initializer",
         "drop_node", "dtype")
OPS = ("MatMul", "Conv", "Reshape", "Attention", "LSTM", "Einsum", "Slice", "Gather",
       "Softmax", "NoSuchOp", "Loop", "Concat", "Range", "GridSample", "DFT", "RoiAlign",
       "FusedConv", "MoE", "DeformConv")
MUTATION = st.tuples(st.sampled_from(KINDS), st.integers(0, 10**6), st.integers(-3, 70000))
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _mutate(model: onnx.ModelProto, kind: str, i: int, v: int) -> None:
    g = model.graph
    node = g.node[i % len(g.node)] if g.node else None
    if kind == "dim" and g.input:
        dims = g.input[i % len(g.input)].type.tensor_type.shape.dim
        if dims:
            dims[v % len(dims)].dim_value = v if v % 3 else -v
    elif kind == "dim_param" and g.input:
        dims = g.input[i % len(g.input)].type.tensor_type.shape.dim
        if dims:
            dims[v % len(dims)].dim_param = ("", "unk__3", "batch", "x y")[v % 4]
    elif kind == "drop_initializer" and g.initializer:
        del g.initializer[i % len(g.initializer)]
    elif kind == "drop_node" and g.node:
        del g.node[i % len(g.node)]
    elif node is not None:
        _mutate_node(node, kind, i, v)


def _mutate_node(node: onnx.NodeProto, kind: str, i: int, v: int) -> None:
    if kind == "drop_input" and node.input:
        del node.input[v % len(node.input)]
    elif kind == "rename_input" and node.input:
        node.input[v % len(node.input)] = f"ghost{v % 3}" if v % 2 else ""
    elif kind == "rename_output" and node.output:
        node.output[v % len(node.output)] = f"ghost{v % 3}"
    elif kind in ("attr_int", "attr_ints", "attr_empty", "drop_attr") and node.attribute:
        a = node.attribute[v % len(node.attribute)]
        if kind == "drop_attr":
            node.attribute.remove(a)
        elif kind == "attr_empty":  # a list attribute with no element (no type to re-make)
            a.Clear()
            a.name, a.type = ("pads", "axes", "kernel_shape")[i % 3], onnx.AttributeProto.INTS
        elif kind == "attr_int":
            a.Clear()
            a.CopyFrom(onnx.helper.make_attribute(("axis", "perm", "to", "num_heads")[i % 4], v))
        else:
            a.ClearField("ints")
            a.ints.extend([v, -v, i % 5][: 1 + i % 3])
    elif kind == "op_type":
        node.op_type = OPS[v % len(OPS)]
    elif kind == "domain":
        node.domain = ("com.microsoft", "", "ai.onnx.ml", "bogus")[v % 4]
    elif kind == "dtype" and node.op_type == "Cast":
        node.attribute[0].i = v % 26


def _mutated(base: str, mutations: list[tuple[str, int, int]]) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(BASES[base])
    for m in mutations:
        _mutate(model, *m)
    return model


@settings(SETTINGS, max_examples=150)
@given(base=st.sampled_from(sorted(BASES)), mutations=st.lists(MUTATION, min_size=1, max_size=4),
       batch=st.integers(1, 64), extra=st.booleans())
def test_analyze_raises_only_tilecast_errors(base, mutations, batch, extra):
    model = _mutated(base, mutations)
    names = {d.dim_param for vi in BASES[base].graph.input
             for d in vi.type.tensor_type.shape.dim if d.dim_param}
    dims = {n: batch for n in names} | ({"sequence": 3} if extra else {})
    with contextlib.suppress(TilecastError):
        tilecast.analyze(model, "l4", dims=dims, predictor="roofline")


@settings(SETTINGS, max_examples=40)
@given(base=st.sampled_from(["cnn", "gpt2"]), mutations=st.lists(MUTATION, min_size=1, max_size=3),
       training=st.booleans(), runtime=st.sampled_from(["eager", "graph"]))
def test_learned_forecasts_of_mutated_graphs_are_finite(base, mutations, training, runtime):
    # Through the learned predictor and the training step too: a graph that analyzes gets a
    # finite forecast with no negative count (an empty conv output once forecast NaN, and an
    # anonymous input dim gave its gradient sums negative element counts, which NaN spread
    # through the eager runtime's running clock to every later kernel).
    model = _mutated(base, mutations)
    mode = "training" if training else "inference"
    with contextlib.suppress(TilecastError):
        f = tilecast.analyze(model, "h100", dims={"batch": 2}, mode=mode, runtime=runtime)
        assert math.isfinite(f.total_ms) and f.total_ms >= 0
        assert all(min(k.kernel.flops, k.kernel.bytes, k.kernel.cost.elements) >= 0
                   for k in f.kernels)


def _one_error_line_or_success(args: list[str]) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code in (0, 2), r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)
    if r.exit_code == 2:
        assert sum(line.startswith("Error:") for line in r.output.splitlines()) == 1, r.output


@settings(SETTINGS, max_examples=25)
@given(base=st.sampled_from(sorted(BASES)), mutations=st.lists(MUTATION, min_size=1, max_size=3),
       strict=st.booleans())
def test_cli_prints_one_error_line(base, mutations, strict):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(_mutated(base, mutations).SerializeToString())
        _one_error_line_or_success(["analyze", str(path), "-d", "l4", "--predictor",
                                    "roofline", "--dim", "batch=2", *(["--strict"] * strict)])


@settings(SETTINGS, max_examples=40)
@given(cut=st.integers(0, 10**6), flip=st.integers(0, 255))
def test_corrupted_files_are_load_errors(cut, flip):
    data = bytearray(BASES["gpt2"].SerializeToString())
    data = data[: cut % len(data)] or bytearray(b"\x00")
    data[cut % len(data)] ^= flip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(bytes(data))
        with contextlib.suppress(TilecastError):
            tilecast.analyze(path, "l4", dims={"batch": 1}, predictor="roofline")


DEVICE = Path(tilecast.__file__).parent / "device_db" / "gpus" / "nvidia_l4.json"
BAD_VALUES = (None, -1, 0, "fast", [], {}, 1e300, True)


@settings(SETTINGS, max_examples=60)
@given(key=st.integers(0, 100), value=st.sampled_from(BAD_VALUES), drop=st.booleans())
def test_mutated_device_json_raises_only_tilecast_errors(key, value, drop):
    data = json.loads(DEVICE.read_text(encoding="utf-8"))
    name = sorted(data)[key % len(data)]
    if drop:
        del data[name]
    else:
        data[name] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dev.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        with contextlib.suppress(TilecastError):
            tilecast.analyze(BASES["cnn"], str(path), predictor="roofline")


@pytest.mark.parametrize("base", sorted(BASES))
def test_unmutated_bases_analyze(base):
    # the fuzz starts from graphs that do analyze: the mutations are what it tests
    names = {d.dim_param for vi in BASES[base].graph.input
             for d in vi.type.tensor_type.shape.dim if d.dim_param}
    assert tilecast.analyze(BASES[base], "l4", dims=dict.fromkeys(names, 2),
                            predictor="roofline").total_ms > 0


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("attr", ["pads", "kernel_shape", "activation_params"])
def test_empty_list_attributes_on_the_new_ops(index, attr):
    # every node of NEW_OPS given an untyped-empty ints attribute: no traceback (a mirror used
    # to re-make attributes from their values and raised ValueError)
    model = _mutated("new_ops", [])
    node = model.graph.node[index]
    node.attribute.append(onnx.AttributeProto(name=attr, type=onnx.AttributeProto.INTS))
    with contextlib.suppress(TilecastError):
        tilecast.analyze(model, "l4", predictor="roofline")
