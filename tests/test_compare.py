"""``tilecast compare`` / ``tilecast.compare``: thresholds, kernel matching, saved forecasts as
baselines, output formats, exit status and every bad-input case."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.analyzer.synthetic import gpt2_like
from tilecast.cli import main
from tilecast.gate.baseline import baseline_text, model_inputs
from tilecast.gate.threshold import Threshold, parse_threshold

RF = ("--predictor", "roofline")


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error:") and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[-1], lines[-1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """l2: the base; l3: one more layer; l1: one fewer; b4: batch 4 instead of 2."""
    d = tmp_path_factory.mktemp("compare")
    out = {}
    for key, model in (("l2", gpt2_like(layers=2)), ("l3", gpt2_like(layers=3)),
                       ("l1", gpt2_like(layers=1)), ("b4", gpt2_like(layers=2, batch=4))):
        out[key] = d / f"{key}.onnx"
        onnx.save(model, out[key])
    return out


@pytest.fixture(scope="module")
def saved(models: dict[str, Path]) -> Path:
    path = models["l2"].with_name("l2.json")
    path.write_text(tilecast.analyze(models["l2"], "l4", predictor="roofline").to_json())
    return path


# --- thresholds -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, value, unit", [
    ("5%", 5.0, "%"), (" 0.5 % ", 0.5, "%"), ("2ms", 2.0, "ms"), ("0.5 ms", 0.5, "ms"),
    ("500us", 0.5, "ms"), ("1s", 1000.0, "ms"), ("0%", 0.0, "%"),
])
def test_parse_threshold(text: str, value: float, unit: str):
    assert parse_threshold(text) == Threshold(value, unit)


@pytest.mark.parametrize("text", ["5", "", "abc", "-5%", "5%%", "2 min", "nan%"])
def test_parse_threshold_rejects(text: str):
    with pytest.raises(tilecast.ConfigError, match="write a percentage"):
        parse_threshold(text)


@pytest.mark.parametrize("threshold, base, new, exceeded", [
    ("5%", 10.0, 10.5, False),  # exactly at the threshold passes
    ("5%", 10.0, 10.51, True),
    ("5%", 10.0, 5.0, False),  # faster never regresses
    ("2ms", 10.0, 12.0, False),
    ("2ms", 10.0, 12.01, True),
    ("0%", 0.0, 0.1, True),  # from nothing to something
])
def test_threshold_exceeded(threshold: str, base: float, new: float, exceeded: bool):
    assert parse_threshold(threshold).exceeded(base, new) is exceeded


# --- matching and the comparison ------------------------------------------------------------
def test_extra_layer_is_the_top_change(models):
    c = tilecast.compare(models["l2"], models["l3"], "l4", predictor="roofline")
    d = c.device("NVIDIA L4")
    assert d.regressed and c.regressed and d.change_pct > 5
    assert d.top and all(k.status == "added" and k.name.startswith("h.2.") for k in d.top)
    # The whole new layer is added; the head renumbered by the builder is matched, not added
    # (final LayerNorm and LM-head MatMul; the tied weight's transpose is folded at load).
    assert {k.name.split(".")[1] for k in d.added} == {"2"} and not d.removed
    assert d.renamed == 2 and d.new_kernels - d.base_kernels == len(d.added)
    assert sum(k.delta_ms for k in d.added) == pytest.approx(d.delta_ms, rel=1e-6)
    fam = {f.family: f for f in d.by_family}
    assert fam["matmul"].delta_ms > 0 and fam["gather"].delta_ms == 0


def test_removed_layer_is_faster(models):
    c = tilecast.compare(models["l2"], models["l1"], ["l4", "t4"], predictor="roofline")
    assert not c.regressed
    for d in c.devices:
        assert d.direction == "faster" and d.removed and not d.added
        assert all(k.name.startswith("h.1.") for k in d.removed)
    assert c.verdict.startswith("✅ no regression: NVIDIA L4 inference is")
    assert "faster" in c.verdict


def test_renamed_nodes_match_by_signature(models, tmp_path: Path):
    model = onnx.load(models["l2"], load_external_data=False)
    for i, node in enumerate(model.graph.node):
        node.name = f"renamed/{i}"
    c = tilecast.compare(models["l2"], model, "l4", predictor="roofline")
    d = c.devices[0]
    assert d.delta_ms == 0 and not d.added and not d.removed
    assert d.renamed == d.base_kernels and not d.top


def test_same_model_is_unchanged(models, saved):
    c = tilecast.compare(saved, models["l2"])  # device, predictor and dims from the JSON
    d = c.devices[0]
    assert d.device == "NVIDIA L4" and d.delta_ms == 0 and d.direction == "unchanged"
    assert c.verdict == "✅ no regression" and not c.warnings


def test_multi_device_baseline_formats(models, tmp_path: Path):
    forecasts = [tilecast.analyze(models["l2"], d, predictor="roofline") for d in ("l4", "t4")]
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([f.to_dict() for f in forecasts]))
    as_baseline = tmp_path / "baseline.json"
    as_baseline.write_text(baseline_text(forecasts, "l2.onnx", model_inputs(
        onnx.load(models["l2"], load_external_data=False))))
    for path in (as_list, as_baseline):
        c = tilecast.compare(path, models["l3"], threshold="50%")
        assert [d.device for d in c.devices] == ["NVIDIA L4", "Tesla T4"] and not c.regressed
    c = tilecast.compare(as_baseline, models["b4"], "t4")
    assert any("different inputs" in w for w in c.warnings)


def test_forecast_objects_and_json(models):
    f = tilecast.analyze(models["l2"], "l4", predictor="roofline")
    c = tilecast.compare(f, models["l3"], threshold="2ms")
    data = json.loads(c.to_json())
    assert data["threshold"] == "2ms" and data["regressed"] is False
    dev = data["devices"][0]
    # 62 costed nodes, 8 of them bias adds folded into their MatMul, 4 folded at load (the
    # tied weight's transpose, the constant position lookup and the causal mask's two ops),
    # the 2 QKV Splits eager views (views.py), and each layer's erf-GELU chain (Div, Erf, Add,
    # 0.5 * x, Mul: opset 17, so F.gelu as exported) one kernel, 4 nodes zero-cost
    # (activations.py)
    assert dev["added"] and dev["top"][0]["status"] == "added" and dev["base_kernels"] == 40
    assert {"family", "base_ms", "new_ms", "delta_ms", "change_pct"} <= set(dev["by_family"][0])


# --- the command line -----------------------------------------------------------------------
def test_cli_extra_layer_exits_1_below_the_change(models):
    r = run("compare", models["l2"], models["l3"], "-d", "l4", *RF, "--threshold", "5%")
    assert r.exit_code == 1, r.output
    top = r.output.split("top kernel changes:")[1].splitlines()[2:5]
    assert all(re.match(r"\s+added\s+h\.2\.", line) for line in top), top
    assert "❌ NVIDIA L4 inference is" in r.output and "slower (threshold 5 %)" in r.output


def test_cli_threshold_above_the_change_exits_0(models):
    r = run("compare", models["l2"], models["l3"], "-d", "l4", *RF, "--threshold", "60%")
    assert r.exit_code == 0, r.output
    r = run("compare", models["l2"], models["l3"], "-d", "l4", *RF, "--threshold", "1ms")
    assert r.exit_code == 0 and "(threshold 1 ms)" in r.output


def test_cli_markdown(models):
    r = run("compare", models["l2"], models["l3"], "-d", "l4", "-d", "t4", *RF,
            "--format", "markdown")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0] == "### tilecast latency comparison"
    assert re.fullmatch(r"❌ NVIDIA L4 inference is \d+\.\d % slower \(threshold 5 %\); "
                        r"Tesla T4 inference is .*", lines[2])
    assert "| NVIDIA L4 | inference |" in r.output and "| `h.2." in r.output
    assert r.output.count("<details>") == 2


def test_cli_json_to_file(models, saved, tmp_path: Path):
    out = tmp_path / "c.json"
    r = run("compare", saved, models["l2"], "--format", "json", "-o", out)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["verdict"] == "✅ no regression" and data["devices"][0]["delta_ms"] == 0


def _separate_stderr_runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 always captures stderr apart


def test_cli_different_inputs_warn(models):
    args = ["compare", models["l2"], models["b4"], "-d", "l4", *RF, "--threshold", "50%"]
    r = _separate_stderr_runner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    assert "Warning: the models take different inputs" in r.stderr
    assert "input_ids int64 [2, 32]" in r.stderr and "[4, 32]" in r.stderr
    assert "Warning" not in r.stdout


def test_cli_training_mode(models):
    r = run("compare", models["l2"], models["l3"], "-d", "l4", *RF, "--mode", "training",
            "--optimizer", "adam", "--format", "json")
    assert r.exit_code == 1
    dev = json.loads(r.stdout)["devices"][0]
    assert dev["mode"] == "training" and {k["phase"] for k in dev["added"]} == {
        "forward", "backward", "update"}


# --- bad input: one Error line, exit 2 ------------------------------------------------------
def test_cli_bad_threshold(models):
    _one_error_line(run("compare", models["l2"], models["l3"], "-d", "l4", "--threshold", "5"),
                    "threshold '5'")


def test_cli_unknown_device(models):
    _one_error_line(run("compare", models["l2"], models["l3"], "-d", "no-such-gpu"),
                    "unknown device 'no-such-gpu'")


def test_cli_device_not_in_the_saved_forecast(models, saved):
    _one_error_line(run("compare", saved, models["l3"], "-d", "t4"),
                    "holds no inference forecast for Tesla T4", "NVIDIA L4")


def test_cli_mode_not_in_the_saved_forecast(models, saved):
    _one_error_line(run("compare", saved, models["l2"], "--mode", "training"),
                    "holds no training forecast")


def test_cli_schema_mismatch(models, saved, tmp_path: Path):
    bad = tmp_path / "v2.json"
    bad.write_text(saved.read_text().replace('"schema": 1', '"schema": 2', 1))
    _one_error_line(run("compare", bad, models["l2"]), "found schema 2", "reads forecast schema 1")
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"schema": 7, "forecasts": [json.loads(saved.read_text())]}))
    _one_error_line(run("compare", baseline, models["l2"]), "found baseline schema 7")


def test_cli_predictor_mismatch(models, saved, tmp_path: Path):
    other = tmp_path / "other.json"
    other.write_text(saved.read_text().replace('"predictor": "roofline"',
                                               '"predictor": "learned-test"'))
    _one_error_line(run("compare", other, models["l2"], *RF),
                    "predictor 'learned-test'", "'roofline'")


def test_cli_fusion_mismatch(models, saved):
    _one_error_line(run("compare", saved, models["l2"], "--fusion"), "without fusion")


@pytest.mark.parametrize("content", ["{not json", '{"hello": 1}', "[]"])
def test_cli_malformed_json(models, tmp_path: Path, content: str):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    _one_error_line(run("compare", bad, models["l2"], "-d", "l4"), "bad.json")


def test_cli_missing_file_and_no_device(models, tmp_path: Path):
    _one_error_line(run("compare", tmp_path / "nope.onnx", models["l2"], "-d", "l4"),
                    "not found")
    _one_error_line(run("compare", models["l2"], models["l3"]), "--device")
