"""A causal mask folded into a constant (analyzer/band_values.py): the weightless reader reads
a dropped tensor's values once and keeps what band they hold, inline or in an external data
file, so the graph runtime's fused attention kernel computes the visible pairs only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tilecast
from tilecast.analyzer.band_values import BandValues, band_of
from tilecast.analyzer.graph import load_model

S = 40  # 40 x 40 fp32 = 6.4 kB: over the weightless reader's 4 kB, so its bytes are dropped
D = np.arange(S)[None, :] - np.arange(S)[:, None]  # key - query
LOW = np.float32(-3.4e38)


@pytest.mark.parametrize(("mask", "band"), [
    (np.where(D > 0, -np.inf, 0).astype(np.float32), BandValues(None, 0, True)),  # triu(-inf, 1)
    (np.where(D > 0, np.float16(-65504), 0).astype(np.float16), BandValues(None, 0, True)),
    (D <= 0, BandValues(None, 0, False)),  # a boolean tril
    ((D <= 0).astype(np.uint8), BandValues(None, 0, False)),
    ((D <= 0) & (D > -4), BandValues(-3, 0, False)),  # a window of 4 keys
    (np.where(D > 2, LOW, 0).astype(np.float32), BandValues(None, 2, True)),
    (np.zeros((S, S), np.float32), BandValues(None, None, True)),  # nothing hidden
    ((D % 2 == 0), None),  # a checkerboard is no band
    (np.random.default_rng(0).normal(size=(S, S)).astype(np.float32), None),  # a weight
    (np.where(D > 0, -1.0, 0).astype(np.float32), None),  # -1 does not hide a score
])
def test_band_of(mask: np.ndarray, band: BandValues | None) -> None:
    assert band_of(mask[None, None]) == band


def _model(mask: np.ndarray) -> onnx.ModelProto:
    # B 1, H 2, S (the mask's), D 8: Q K^T, add the constant mask, softmax, P V
    s = mask.shape[-1]
    x = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 2, s, 8]) for n in "qkv"]
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, s, 8])
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Add", ["s", "mask"], ["u"]),
             helper.make_node("Softmax", ["u"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", x, [y], [numpy_helper.from_array(mask, "mask")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _flops(model: onnx.ModelProto | str) -> int:
    f = tilecast.analyze(model, "a100-sxm4-40gb", predictor="roofline", runtime="graph")
    (att,) = [k for k in f.kernels if k.kernel.op_type == "Attention"]
    return att.kernel.cost.flops


CAUSAL = np.where(D > 0, LOW, 0).astype(np.float32)
# 2 heads x visible pairs x (2 x 8 x 2 + 6) FLOPs; 40 x 41 / 2 pairs when causal
CAUSAL_FLOPS, ALL_FLOPS = 2 * (S * (S + 1) // 2) * 38, 2 * S * S * (38 + 1)


def test_an_inline_folded_mask_is_causal() -> None:
    assert _flops(_model(CAUSAL)) == CAUSAL_FLOPS
    small = CAUSAL[:16, :16]  # 1 kB: kept with its values, read directly
    assert _flops(_model(small)) == 2 * (16 * 17 // 2) * 38
    assert _flops(_model(np.where(D > 1, LOW, 0).astype(np.float32))) == ALL_FLOPS  # not aligned


def test_a_mask_in_an_external_data_file_is_read(tmp_path: Path) -> None:
    onnx.save_model(_model(CAUSAL), tmp_path / "m.onnx", save_as_external_data=True,
                    location="m.onnx.data", size_threshold=0)
    assert _flops(str(tmp_path / "m.onnx")) == CAUSAL_FLOPS
    (tmp_path / "m.onnx.data").unlink()  # the data file gone: every pair, no error
    assert _flops(str(tmp_path / "m.onnx")) == ALL_FLOPS


def test_an_external_location_outside_the_models_folder_is_not_read(tmp_path: Path) -> None:
    inner = tmp_path / "model"
    inner.mkdir()
    onnx.save_model(_model(CAUSAL), inner / "m.onnx", save_as_external_data=True,
                    location="m.onnx.data", size_threshold=0)
    (inner / "m.onnx.data").rename(tmp_path / "m.onnx.data")
    m = onnx.load(inner / "m.onnx", load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.onnx.data"
    onnx.save_model(m, inner / "m.onnx")
    assert [t.doc_string for t in load_model(inner / "m.onnx").graph.initializer] == [""]


def test_a_bfloat16_mask_is_tagged_by_the_weightless_reader() -> None:
    # bf16 has no numpy dtype: the reader widens its 16-bit patterns (fp32's upper half)
    d = np.arange(64)[None, :] - np.arange(64)[:, None]  # 64 x 64 x 2 bytes: dropped
    bits = (np.where(d > 0, LOW, 0).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    t = helper.make_tensor("mask", onnx.TensorProto.BFLOAT16, [64, 64], bits.tobytes(), raw=True)
    g = helper.make_graph([], "g", [], [], [t])
    (kept,) = load_model(helper.make_model(g)).graph.initializer
    assert (kept.doc_string, kept.raw_data) == ("tilecast:band None 0 1", b"")
