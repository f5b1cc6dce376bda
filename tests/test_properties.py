"""Property tests for every reader (issue 15): any mutation of a valid file either raises a
``TilecastError`` subclass or yields finite, non-negative numbers; through the CLI, exactly one
``Error:`` line and status 2, or a normal result with none. Derandomized and bounded, so CI is
deterministic and fast."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecast
from tilecast.analyzer.forecast import Forecast
from tilecast.cli import main
from tilecast.device_db.loader import GPUS_DIR, NUMERIC_FIELDS, parse_device
from tilecast.errors import TilecastError
from tilecast.evaluation.labels import discover_labels
from tilecast.gate.baseline import baseline_text, saved_from_data
from tilecast.learned.dataset import read_csv

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
JSON = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
GRAPH = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,8] x, float[8,8] w) => (float[2,32] z) {
  shape = Constant<value = int64[2] {2, 32}>()
  m = MatMul(x, w)
  a = Add(m, x)
  s = Softmax<axis = -1>(a)
  z = Reshape(s, shape)
}"""


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list) else ()
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


@st.composite
def mutated(draw: st.DrawFn, valid: Any) -> Any:
    """``valid`` with one node replaced, deleted, or given an extra key."""
    data = copy.deepcopy(valid)
    path = draw(st.sampled_from(_paths(data)[1:]))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(("replace", "delete", "extra")))
    if action == "delete":
        del parent[path[-1]]
    elif action == "extra" and isinstance(parent[path[-1]], dict):
        parent[path[-1]][draw(st.text(max_size=5))] = draw(JSON)
    else:
        parent[path[-1]] = draw(JSON)
    return data


def _finite(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _check_forecast(f: Forecast) -> None:
    assert _finite(f.total_ms) and all(_finite(k.latency_ms) for k in f.kernels)


@pytest.fixture(scope="module")
def forecast(gpt2_path: Path) -> dict:
    return tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_dict()


# --- forecasts and baselines --------------------------------------------------------------------
@FAST
@given(data=st.data())
def test_mutated_forecast(forecast: dict, data: st.DataObject):
    try:
        f = Forecast.from_dict(data.draw(mutated(forecast)), origin="f.json")
    except TilecastError:
        return
    _check_forecast(f)


@FAST
@given(cut=st.integers(0, 4000))
def test_truncated_forecast_text(forecast: dict, cut: int):
    text = json.dumps(forecast)
    with contextlib.suppress(TilecastError):
        _check_forecast(Forecast.from_json(text[:cut] + text[cut + 1:], origin="f.json"))


@FAST
@given(data=st.data())
def test_mutated_baseline(forecast: dict, data: st.DataObject):
    valid = json.loads(baseline_text([Forecast.from_dict(forecast)], "m.onnx", None))
    try:
        saved = saved_from_data(data.draw(mutated(valid)), "b.json")
    except TilecastError:
        return
    for f in saved.forecasts.values():
        _check_forecast(f)


@settings(FAST, max_examples=25)
@given(data=st.data())
def test_cli_compare_mutated_forecast(forecast: dict, data: st.DataObject):
    bad = data.draw(mutated(forecast))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "base.json").write_text(json.dumps(bad))
        (Path(tmp) / "new.json").write_text(json.dumps(forecast))
        result = CliRunner().invoke(main, ["compare", f"{tmp}/base.json", f"{tmp}/new.json"])
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert "Traceback" not in result.output and result.exit_code in (0, 1, 2), result.output
    assert len(errors) == (1 if result.exit_code == 2 else 0), result.output


# --- device JSON ------------------------------------------------------------------------------
@FAST
@given(data=st.data())
def test_mutated_device(data: st.DataObject):
    valid = json.loads((GPUS_DIR / "nvidia_l4.json").read_text())
    try:
        device = parse_device(data.draw(mutated(valid)), "d.json")
    except TilecastError:
        return
    for path in NUMERIC_FIELDS:
        obj: Any = device
        for part in path.split("."):
            obj = getattr(obj, part)
        assert obj is None or (math.isfinite(obj) and obj > 0), path


# --- graphs -----------------------------------------------------------------------------------
@st.composite
def broken_graph(draw: st.DrawFn) -> onnx.ModelProto:
    """The tiny graph after one structural edit of the kind exporters get wrong."""
    model = onnx.parser.parse_model(GRAPH)
    nodes = model.graph.node
    i = draw(st.integers(0, len(nodes) - 1))
    names = ["x", "w", "shape", "m", "a", "s", "z", "nope", ""]
    edit = draw(st.sampled_from(("input", "output", "drop", "swap", "elem", "extra")))
    if edit == "input" and nodes[i].input:
        nodes[i].input[draw(st.integers(0, len(nodes[i].input) - 1))] = draw(
            st.sampled_from(names))
    elif edit == "output":
        nodes[i].output[0] = draw(st.sampled_from(names))
    elif edit == "drop":
        del nodes[i]
    elif edit == "swap":
        j = draw(st.integers(0, len(nodes) - 1))
        a, b = copy.deepcopy(nodes[i]), copy.deepcopy(nodes[j])
        nodes[i].CopyFrom(b)
        nodes[j].CopyFrom(a)
    elif edit == "elem":
        model.graph.input[draw(st.integers(0, 1))].type.tensor_type.elem_type = draw(
            st.integers(-3, 200))
    else:
        nodes[i].input.append(draw(st.sampled_from(names)))
    return model


@settings(FAST, max_examples=60)
@given(model=broken_graph())
def test_broken_graph(model: onnx.ModelProto):
    """An independent oracle too: what tilecast accepts, onnx's own checker accepts."""
    try:
        f = tilecast.analyze(model, "l4", predictor="roofline")
    except TilecastError:
        return
    _check_forecast(f)
    onnx.checker.check_model(model)


@settings(FAST, max_examples=20)
@given(model=broken_graph(), cut=st.integers(0, 300))
def test_cli_analyze_broken_file(model: onnx.ModelProto, cut: int):
    raw = model.SerializeToString()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(raw[:cut] if cut < len(raw) else raw)
        result = CliRunner().invoke(main, ["analyze", str(path), "-d", "l4",
                                           "--predictor", "roofline"])
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert result.exit_code in (0, 2) and "Traceback" not in result.output, result.output
    assert len(errors) == (1 if result.exit_code == 2 else 0), result.output


# --- label files and kernel CSVs ------------------------------------------------------------------
@FAST
@given(value=JSON)
def test_label_latency(value: Any):
    with tempfile.TemporaryDirectory() as tmp:
        root, models = Path(tmp) / "labels", Path(tmp) / "models"
        (root / "NVIDIA_L4").mkdir(parents=True)
        models.mkdir()
        (models / "bert.json").write_text("{}")
        (root / "NVIDIA_L4" / "bert-inf-128-8.json").write_text(
            json.dumps({"e2e_latency": value}))
        labels, skipped = discover_labels(root, models)
    assert len(labels) + len(skipped) == 1
    assert all(math.isfinite(lb.measured_ms) and lb.measured_ms > 0 for lb in labels)


@FAST
@given(column=st.integers(0, 6), cell=st.text(max_size=8))
def test_kernel_csv_cell(column: int, cell: str):
    row = ["bmm", "NVIDIA L4", "1", "8", "8", "8", "0.01"]
    row[column] = cell.replace(",", "").replace("\n", "").replace("\r", "").replace('"', "")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bmm.csv"
        path.write_text("OPName,Device,B,M,N,K,Latency\n" + ",".join(row) + "\n")
        try:
            samples = read_csv(path, "eval")
        except TilecastError:
            return
    if samples is not None:
        assert all(math.isfinite(x) and x > 0 for x in samples.latency_ms)
        assert (samples.flops >= 0).all() and (samples.bytes >= 0).all()
