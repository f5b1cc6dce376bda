"""The library API: docs/api.md's examples run as written, stable exports, type hints,
Forecast save/load and the optional pandas export."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import shutil
from pathlib import Path

import onnx
import pytest

import tilecast
from tilecast.analyzer.forecast import Forecast
from tilecast.analyzer.synthetic import gpt2_like

REPO = Path(__file__).resolve().parents[1]
API_DOC = REPO / "docs" / "api.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text(encoding="utf-8"))


@pytest.fixture
def doc_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    onnx.save(gpt2_like(layers=2), tmp_path / "model.onnx")
    onnx.save(gpt2_like(layers=3), tmp_path / "model_v2.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_api_doc_has_examples():
    blocks = python_blocks(API_DOC)
    assert len(blocks) >= 6
    text = "\n".join(blocks)
    for name in ("tilecast.analyze", "tilecast.compare", "tilecast.load_forecast",
                 "to_dataframe", "tilecast.load_device", "run_gate"):
        assert name in text, name


def test_api_doc_examples_run(doc_dir: Path, capsys: pytest.CaptureFixture[str]):
    # One namespace for the whole page: later examples use names earlier ones define.
    namespace: dict[str, object] = {"__name__": "api_doc"}
    for i, block in enumerate(python_blocks(API_DOC)):
        try:
            exec(compile(block, f"{API_DOC.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message points at the block
            pytest.fail(f"docs/api.md python block {i} failed: {type(exc).__name__}: {exc}\n"
                        f"{block}")
    out = capsys.readouterr().out
    assert "NVIDIA L4" in out and "❌" in out and "added" in out
    assert (doc_dir / ".tilecast" / "model.json").is_file()


def test_readme_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The README's examples read the bundled examples/ models and write files: run them in a
    # scratch directory holding a copy of the models, never in the checkout.
    (tmp_path / "examples").mkdir()
    for model in (REPO / "examples").glob("*.onnx"):
        shutil.copy(model, tmp_path / "examples" / model.name)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in python_blocks(REPO / "README.md"):
        exec(compile(block, "README.md", "exec"), namespace)
    assert (tmp_path / "baseline.json").is_file()


def test_stable_names_are_exported():
    for name in ("analyze", "compare", "load_forecast", "load_device", "list_devices",
                 "Forecast", "KernelForecast", "Comparison", "DeviceComparison",
                 "KernelChange", "FamilyChange", "Threshold", "TilecastError", "ConfigError"):
        assert name in tilecast.__all__, name
        assert getattr(tilecast, name) is not None
    assert (Path(tilecast.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("fn", [tilecast.analyze, tilecast.compare, tilecast.load_forecast,
                                Forecast.from_dict, Forecast.from_json,
                                tilecast.gate.load_config, tilecast.gate.run_gate,
                                tilecast.gate.update_baselines])
def test_public_functions_are_typed(fn):
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, fn
    for p in sig.parameters.values():
        if p.name != "cls":
            assert p.annotation is not inspect.Parameter.empty, (fn, p.name)


def test_result_values_are_frozen(gpt2_path: Path):
    c = tilecast.compare(gpt2_path, gpt2_path, "l4", predictor="roofline")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.devices[0].regressed = True  # type: ignore[misc]


# --- Forecast save / load ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_forecast_round_trips_through_json(gpt2_path: Path, tmp_path: Path, mode: str):
    f = tilecast.analyze(gpt2_path, "t4", mode=mode, predictor="roofline")
    path = tmp_path / "f.json"
    path.write_text(f.to_json())
    g = tilecast.load_forecast(path)
    assert g.device.name == "Tesla T4" and g.mode == mode and g.predictor == "roofline"
    assert [k.to_dict() for k in g.kernels] == [k.to_dict() for k in f.kernels]
    assert g.total_ms == pytest.approx(f.total_ms, rel=1e-5)
    assert g.to_dict()["kernels"] == f.to_dict()["kernels"]


def _saved(gpt2_path: Path) -> dict:
    return tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_dict()


def test_from_dict_rejects_other_schema_versions(gpt2_path: Path):
    data = _saved(gpt2_path) | {"schema": 2}
    with pytest.raises(tilecast.ConfigError, match=r"found schema 2.*reads forecast schema 1"):
        Forecast.from_dict(data)
    del data["schema"]
    with pytest.raises(tilecast.ConfigError, match="no 'schema' field"):
        Forecast.from_dict(data)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("kernels"), "field 'kernels' is missing"),
    (lambda d: d.update(mode=3), "field 'mode' must be a string"),
    (lambda d: d["kernels"][1].pop("flops"), r"field 'kernels\[1\].flops' is missing"),
    (lambda d: d["kernels"][0].update(latency_ms="fast"),
     r"'kernels\[0\].latency_ms' must be a number"),
    (lambda d: d["kernels"][0].update(matmul=[1, 2]),
     r"'kernels\[0\].matmul' must be an object or null"),
    (lambda d: d.update(zero_cost_reasons=3), "zero_cost_reasons"),
    (lambda d: d["zero_cost_reasons"][0].pop("reason"), r"zero_cost_reasons\[0\]"),
])
def test_from_dict_names_the_bad_field(gpt2_path: Path, edit, message: str):
    data = _saved(gpt2_path)
    edit(data)
    with pytest.raises(tilecast.ConfigError, match=message):
        Forecast.from_dict(data, origin="saved.json")


def test_from_dict_unknown_device(gpt2_path: Path):
    data = _saved(gpt2_path) | {"device": "Imaginary GPU 9000"}
    with pytest.raises(tilecast.DeviceError, match="'Imaginary GPU 9000' is not in the device"):
        Forecast.from_dict(data)
    f = Forecast.from_dict(data, device=tilecast.load_device("l4"))
    assert f.device.name == "NVIDIA L4"


def test_from_json_and_load_forecast_errors(tmp_path: Path):
    with pytest.raises(tilecast.ConfigError, match="not valid JSON"):
        Forecast.from_json("{nope")
    with pytest.raises(tilecast.ConfigError, match="cannot read forecast"):
        tilecast.load_forecast(tmp_path / "missing.json")


# --- pandas is optional ------------------------------------------------------------------------
def test_to_dataframe_with_pandas(gpt2_path: Path):
    pd = pytest.importorskip("pandas", reason="pandas is optional")
    df = tilecast.analyze(gpt2_path, "l4", predictor="roofline").to_dataframe()
    assert isinstance(df, pd.DataFrame) and {"name", "latency_ms", "matmul_m"} <= set(df)


def test_to_dataframe_without_pandas(gpt2_path: Path, monkeypatch: pytest.MonkeyPatch):
    import sys

    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    f = tilecast.analyze(gpt2_path, "l4", predictor="roofline")
    with pytest.raises(ImportError, match="pip install pandas"):
        f.to_dataframe()


def test_comparison_json_is_valid(gpt2_path: Path):
    c = tilecast.compare(gpt2_path, gpt2_path, ["l4", "t4"], predictor="roofline")
    data = json.loads(c.to_json())
    assert data["kind"] == "tilecast-comparison" and not data["regressed"]
    assert [d["device"] for d in data["devices"]] == ["NVIDIA L4", "Tesla T4"]


CONSOLE = re.compile(r"^```console\n\$ (tilecast [^\n]*)\n(.*?)^```", re.S | re.M)


def test_readme_console_example_is_what_the_command_prints(monkeypatch: pytest.MonkeyPatch):
    # The worked example was left at an older predictor's numbers (48.355 ms against 47.586)
    # for several releases: the README's console block must be the command's output, exactly.
    from click.testing import CliRunner

    from tilecast.cli import main

    monkeypatch.chdir(REPO)
    blocks = CONSOLE.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks, "the README has no console example"
    for command, shown in blocks:
        result = CliRunner().invoke(main, command.split()[1:])
        assert result.exit_code == 0, result.output
        assert result.output == shown, command
