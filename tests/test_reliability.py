"""Every reader validates what it reads (issue 15): the five reproducers, graph structure,
published schemas, device architectures, label and kernel data, and the exit statuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast import schemas
from tilecast.analyzer.forecast import Forecast
from tilecast.analyzer.forecast_schema import forecast_schema
from tilecast.analyzer.validate import validate_graph
from tilecast.cli import main
from tilecast.device_db.device import ARCHS, GENERIC_ARCH
from tilecast.device_db.loader import GPUS_DIR, load_device
from tilecast.device_db.schema import device_schema
from tilecast.errors import ConfigError, DeviceError, InvalidGraphError, PredictorError
from tilecast.gate.baseline import baseline_schema, baseline_text, load_saved, model_inputs
from tilecast.learned import features, tiles
from tilecast.learned.dataset import read_csv

RF = ("--predictor", "roofline")
GRAPH = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x, float[2,3] y) => (float[2,3] z) {
  a = Add(x, y)
  z = Relu(a)
}"""


def run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error(result, status: int = 2) -> str:
    """The documented status and exactly one ``Error:`` line (the last), no traceback."""
    assert result.exit_code == status, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, gpt2_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("reliability")
    saved = tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_dict()
    out = {"model": gpt2_path, "empty": d / "empty.json"}
    out["empty"].write_text("")
    for name, edit in (("negative", {"total_ms": -1.0}), ("string", {"total_ms": "12"})):
        out[name] = d / f"{name}.json"
        out[name].write_text(json.dumps(saved | edit))
    out["good"] = d / "good.json"
    out["good"].write_text(json.dumps(saved))
    return out


# --- the five reproducers of the issue ------------------------------------------------------
def test_empty_saved_forecast_is_bad_input_not_regression(files):
    line = one_error(run("compare", files["empty"], files["model"], "-d", "l4", *RF))
    assert str(files["empty"]) in line and "not valid JSON" in line


def test_evaluate_without_label_files_fails(tmp_path: Path):
    (tmp_path / "NVIDIA_L4").mkdir()
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    line = one_error(run("evaluate", tmp_path))
    assert "no label files" in line and "<model>-<inf|train>-<seq>-<batch>" in line


@pytest.mark.parametrize("name, expected", [("negative", "must be a number >= 0, got float -1"),
                                            ("string", 'must be a number >= 0, got str "12"')])
def test_corrupt_total_is_refused(files, name: str, expected: str):
    line = one_error(run("compare", files[name], files["model"], *RF))
    assert f"field 'total_ms' {expected}" in line


@pytest.mark.parametrize("edit, message", [
    # two nodes write `a`
    (("z = Relu(a)", "a = Relu(x)\n z = Relu(a)"), "output 'a' is already assigned by node"),
    # Add's second input removed
    (("Add(x, y)", "Add(x)"), "required input #1 'B' is missing"),
    # the declared output z is produced by nothing
    (("z = Relu(a)", "w = Relu(a)"), "graph output 'z' is produced by no node"),
    # Relu reads `a` before Add writes it
    (("a = Add(x, y)\n  z = Relu(a)", "z = Relu(a)\n  a = Add(x, y)"), "not in topological"),
    # an input nobody produces
    (("Relu(a)", "Relu(q)"), "input 'q' is produced by no node, initializer or graph input"),
])
def test_broken_graphs_name_the_node(tmp_path: Path, edit, message: str):
    path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(GRAPH.replace(*edit)), path)
    line = one_error(run("analyze", path, "-d", "l4", *RF))
    assert message in line


def test_invalid_element_type(tmp_path: Path):
    model = onnx.parser.parse_model(GRAPH)
    model.graph.input[0].type.tensor_type.elem_type = 99
    onnx.save(model, tmp_path / "m.onnx")
    assert "graph input 'x' has element type 99" in one_error(
        run("analyze", tmp_path / "m.onnx", "-d", "l4", *RF))


def test_unknown_arch_lists_the_known_ones(tmp_path: Path):
    obj = json.loads((GPUS_DIR / "nvidia_l4.json").read_text()) | {"arch": "quantum"}
    (tmp_path / "q.json").write_text(json.dumps(obj))
    line = one_error(run("devices", "show", tmp_path / "q.json"))
    assert "field 'arch' must be one of" in line and all(a in line for a in ARCHS)


# --- graph structure: what stays accepted -----------------------------------------------------
@pytest.mark.parametrize("text", [
    GRAPH,
    # Clip's min and max are OPTIONAL in its schema: omitted or empty names are fine
    GRAPH.replace("Relu(a)", "Clip(a)"), GRAPH.replace("Relu(a)", 'Clip(a, "", "")'),
    # an op of a custom domain has no schema in onnx.defs: no arity check
    GRAPH.replace('opset_import: ["" : 17]', 'opset_import: ["" : 17, "my.ops" : 1]')
         .replace("Relu(a)", "my.ops.Fancy(a)"),
    # a graph output that is a graph input passes through
    GRAPH.replace("=> (float[2,3] z)", "=> (float[2,3] z, float[2,3] x)"),
])
def test_valid_graphs_pass(text: str):
    validate_graph(onnx.parser.parse_model(text))


def test_too_many_inputs():
    with pytest.raises(InvalidGraphError, match="node 'Relu_1' .* takes at most 1"):
        validate_graph(onnx.parser.parse_model(GRAPH.replace("Relu(a)", "Relu(a, x)")))


# --- published schemas ---------------------------------------------------------------------
def test_checked_in_schemas_match_the_dataclasses():
    stale = schemas.stale()
    assert not stale, (f"docs/schemas/ is out of date ({', '.join(stale)}): regenerate with "
                       f"`{schemas.REGENERATE}` and commit the result")


def test_written_files_validate_against_their_schemas(gpt2_path: Path):
    f = tilecast.analyze(gpt2_path, "l4", mode="training", predictor="roofline")
    schemas.check(json.loads(f.to_json()), forecast_schema(), "forecast")
    model = onnx.load(str(gpt2_path), load_external_data=False)
    text = baseline_text([f], "gpt2.onnx", model_inputs(model))
    schemas.check(json.loads(text), baseline_schema(), "baseline")
    for path in sorted(GPUS_DIR.glob("*.json")):
        schemas.check(json.loads(path.read_text()), device_schema(), str(path), DeviceError)


def test_published_schemas_work_with_a_standard_validator(gpt2_path: Path, files):
    """Other tools validate with off-the-shelf libraries: the files must be valid JSON Schema,
    accept what tilecast writes, and refuse what tilecast refuses."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the dev extra")
    for schema in schemas.published().values():
        jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(forecast_schema())
    assert validator.is_valid(json.loads(files["good"].read_text()))
    assert not validator.is_valid(json.loads(files["negative"].read_text()))
    assert not validator.is_valid(json.loads(files["string"].read_text()))
    device = jsonschema.Draft202012Validator(device_schema())
    for path in sorted(GPUS_DIR.glob("*.json")):
        assert device.is_valid(json.loads(path.read_text())), path
    assert not device.is_valid(json.loads((GPUS_DIR / "nvidia_l4.json").read_text())
                               | {"arch": "quantum"})


def test_schema_check_names_the_json_path():
    schema = forecast_schema()
    data = {"schema": 1, "model": "m", "device": "d", "mode": "inference", "predictor": "p",
            "kernels": [{"name": "k", "op_type": "MatMul", "family": "matmul",
                         "phase": "forward", "flops": 1, "bytes": 1, "latency_ms": math.nan,
                         "bound": "compute"}]}
    with pytest.raises(ConfigError, match=r"f.json: field 'kernels\[0\].latency_ms' must be a "
                                          "finite number"):
        schemas.check(data, schema, "f.json")


@pytest.mark.parametrize("version, hint", [(2, "upgrade tilecast"), (0, "re-create it")])
def test_other_forecast_versions_say_which_is_needed(files, version: int, hint: str):
    data = json.loads(files["good"].read_text()) | {"schema": version}
    with pytest.raises(ConfigError, match=f"found schema {version}; .* reads forecast schema 1 "
                                          f"\\({hint}"):
        Forecast.from_dict(data)


def test_totals_must_match_their_kernels(files):
    data = json.loads(files["good"].read_text())
    data["kernels"][0]["latency_ms"] += 1.0
    with pytest.raises(ConfigError, match="field 'total_ms' is .* but the kernels add up to"):
        Forecast.from_dict(data, origin="saved.json")


def test_baseline_names_the_forecast_and_kernel(tmp_path: Path, files, gpt2_path: Path):
    f = tilecast.analyze(gpt2_path, "l4", predictor="roofline")
    data = json.loads(baseline_text([f], "m.onnx", None))
    data["forecasts"][0]["kernels"][3]["latency_ms"] = -2
    (tmp_path / "b.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"field 'forecasts\[0\].kernels\[3\].latency_ms'"):
        load_saved(tmp_path / "b.json")


# --- device architectures ---------------------------------------------------------------------
def _device_json(tmp_path: Path, **edit: object) -> Path:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(json.loads((GPUS_DIR / "nvidia_l4.json").read_text()) | edit))
    return path


def test_generic_arch_and_old_unknown_are_accepted(tmp_path: Path):
    assert load_device(_device_json(tmp_path, arch="generic")).arch == GENERIC_ARCH
    assert load_device(_device_json(tmp_path, arch="unknown")).arch == GENERIC_ARCH  # migrated


@pytest.mark.parametrize("version", [2, "1", True])
def test_device_schema_version_is_checked(tmp_path: Path, version: object):
    with pytest.raises(DeviceError, match="field 'schema' is .* reads device schema 1"):
        load_device(_device_json(tmp_path, schema=version))
    assert load_device(_device_json(tmp_path, schema=1)).name == "NVIDIA L4"


def test_every_named_arch_has_occupancy_numbers():
    """generic uses the documented defaults; every other arch has its own row."""
    named = set(ARCHS) - {GENERIC_ARCH}
    for table in (features.MAX_THREADS_PER_SM, features.MAX_BLOCKS_PER_SM,
                  features.L1_KIB_PER_SM):
        assert named <= set(table), named - set(table)
    assert GENERIC_ARCH not in tiles.ARCH_FAMILY  # falls back to the newest measured family


# --- label and kernel data ----------------------------------------------------------------------
HEADER = "OPName,Device,B,M,N,K,Latency\n"


@pytest.mark.parametrize("latency", ["fast", "nan", "inf", "0", "-1", ""])
def test_bad_kernel_latency_names_file_and_line(tmp_path: Path, latency: str):
    path = tmp_path / "bmm.csv"
    path.write_text(HEADER + "bmm,NVIDIA L4,1,8,8,8,0.01\n" + f"bmm,NVIDIA L4,1,8,8,8,{latency}\n")
    with pytest.raises(ConfigError, match=f"{path}:3: column 'Latency' must be a positive"):
        read_csv(path, "eval")


def test_bad_kernel_dim_and_device(tmp_path: Path):
    path = tmp_path / "bmm.csv"
    path.write_text(HEADER + "bmm,NVIDIA L4,1,x,8,8,0.01\n")
    with pytest.raises(ConfigError, match=":2: column 'M' must be a non-negative number"):
        read_csv(path, "eval")
    path.write_text(HEADER + "bmm,,1,8,8,8,0.01\n")
    with pytest.raises(ConfigError, match=":2: column 'Device' must be a GPU name"):
        read_csv(path, "eval")


def test_kernels_eval_without_data_names_the_layout(tmp_path: Path):
    line = one_error(run("kernels-eval", "--data", tmp_path))
    assert "expected kernels/nvidia/eval/" in line


# --- exit statuses ----------------------------------------------------------------------------
def test_internal_error_is_status_3_with_one_line(monkeypatch: pytest.MonkeyPatch, files):
    def boom(*_a, **_k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("tilecast.analyzer.pipeline.analyze", boom)
    line = one_error(run("analyze", files["model"], "-d", "l4", *RF), status=3)
    assert "internal error (ZeroDivisionError" in line and "tilecast bug" in line


def test_compare_statuses(files, tmp_path: Path):
    assert run("compare", files["good"], files["model"], *RF).exit_code == 0
    slower = json.loads(files["good"].read_text())
    for k in slower["kernels"]:
        k["latency_ms"] /= 2  # the base was twice as fast: the model regressed
    slower["total_ms"] /= 2
    slower["by_phase"] = slower["by_family"] = {}
    slower["unsupported_ms"] /= 2
    (tmp_path / "fast.json").write_text(json.dumps(slower))
    assert run("compare", tmp_path / "fast.json", files["model"], *RF).exit_code == 1
    one_error(run("compare", files["negative"], files["model"], *RF))


# --- atomic writes and a gate that fails closed ---------------------------------------------------
def test_output_writes_are_atomic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files):
    out = tmp_path / "f.json"
    out.write_text("previous")

    def fail(*_a):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr("os.replace", fail)
    line = one_error(run("analyze", files["model"], "-d", "l4", *RF, "--format", "json",
                         "-o", out))
    assert "No space left on device" in line
    assert out.read_text() == "previous" and list(tmp_path.iterdir()) == [out]


@pytest.fixture
def gate_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    onnx.save(onnx.parser.parse_model(GRAPH), tmp_path / "m.onnx")
    (tmp_path / "tilecast.toml").write_text('devices = ["l4"]\npredictor = "roofline"\n'
                                            '[[models]]\npath = "m.onnx"\n')
    monkeypatch.chdir(tmp_path)
    assert run("gate", "--update-baseline").exit_code == 0
    assert run("gate").exit_code == 0
    return tmp_path


@pytest.mark.parametrize("target, content, message", [
    (".tilecast/m.json", "", "not valid JSON"),
    (".tilecast/m.json", '{"schema": 1, "kind": "tilecast-baseline", "forecasts": [{}]}',
     "field 'forecasts[0].schema' is missing"),
    ("m.onnx", "", "is empty (0 bytes)"),
    ("m.onnx", "not a model", "is not a readable ONNX model"),
])
def test_gate_fails_closed_on_corrupt_inputs(gate_repo: Path, target: str, content: str,
                                             message: str):
    (gate_repo / target).write_text(content)
    assert message in one_error(run("gate"))


def test_gate_fails_closed_on_missing_baseline(gate_repo: Path):
    (gate_repo / ".tilecast" / "m.json").unlink()
    assert "no baseline at .tilecast/m.json" in one_error(run("gate"))


# A window larger than its input (wav2vec2's feature convs bound to 8 audio samples): the conv
# model divided by zero tiles and the eager runtime spread the NaN to every later kernel.
WINDOW = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,2,2] x, float[4,3,3,3] w) => (y) {{
  y = {op}
}}"""


@pytest.mark.parametrize("op", ["Conv(x, w)", "MaxPool<kernel_shape=[3,3]>(x)",
                                "AveragePool<kernel_shape=[3,3]>(x)"])
def test_a_window_larger_than_its_input_is_named(tmp_path: Path, op: str):
    path = tmp_path / "w.onnx"
    onnx.save(onnx.parser.parse_model(WINDOW.format(op=op)), path)
    error = one_error(run("analyze", path, "-d", "h100"))
    assert "output [1, " in error and "is empty: the input is smaller than the window" in error


def test_a_predictor_returning_nan_is_an_error_naming_the_kernel(monkeypatch: pytest.MonkeyPatch):
    from tilecast.analyzer.predictor import Prediction, RooflinePredictor

    def nan_predict(self, kernels, device):
        return [Prediction(latency_ms=math.nan, bound="memory") for _ in kernels]

    monkeypatch.setattr(RooflinePredictor, "predict", nan_predict)
    nan_named = r"returned latency nan ms for kernel 'Add_0' \(Add, float32"
    with pytest.raises(PredictorError, match=nan_named):
        tilecast.analyze(onnx.parser.parse_model(GRAPH), "h100", predictor="roofline")
