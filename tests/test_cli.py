"""The command line through click's CliRunner: output formats and every bad-input case."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tilecast.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_error_line(result) -> None:
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error:"), result.output
    assert "Traceback" not in result.output


def test_analyze_table(gpt2_path):
    r = run("analyze", str(gpt2_path), "--device", "l4", "--predictor", "roofline", "--top", "3")
    assert r.exit_code == 0, r.output
    assert "NVIDIA L4" in r.output and "total" in r.output and "unsupported ops: none" in r.output


@pytest.mark.parametrize("fmt, probe", [("json", '"schema": 1'), ("csv", "name,op_type"),
                                        ("markdown", "### tilecast forecast")])
def test_analyze_formats(gpt2_path, fmt, probe):
    r = run("analyze", str(gpt2_path), "-d", "t4", "--predictor", "roofline", "--format", fmt)
    assert r.exit_code == 0, r.output
    assert probe in r.output


def test_analyze_output_file_is_identical_across_runs(gpt2_path, tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"f{i}.json"
        r = run("analyze", str(gpt2_path), "-d", "l4", "--predictor", "roofline",
                "--format", "json", "-o", str(out))
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["device"] == "NVIDIA L4"


def test_training_and_fusion_flags(gpt2_path):
    r = run("analyze", str(gpt2_path), "-d", "l4", "--predictor", "roofline", "--mode",
            "training", "--optimizer", "adam", "--format", "json")
    assert r.exit_code == 0, r.output
    assert set(json.loads(r.output)["by_phase"]) == {"forward", "backward", "update"}
    r = run("analyze", str(gpt2_path), "-d", "l4", "--predictor", "roofline", "--fusion")
    assert r.exit_code == 0 and "(fused)" in r.output


def test_bad_inputs(tmp_path, gpt2_path):
    not_onnx = tmp_path / "x.onnx"
    not_onnx.write_text("hello")
    truncated = tmp_path / "t.onnx"
    truncated.write_bytes(gpt2_path.read_bytes()[:1000])
    bad_dev = tmp_path / "dev.json"
    bad_dev.write_text('{"name": "x"}')
    broken_dev = tmp_path / "broken.json"
    broken_dev.write_text("{not json")
    cases = [
        ("analyze", str(tmp_path / "missing.onnx"), "-d", "l4"),
        ("analyze", str(not_onnx), "-d", "l4"),
        ("analyze", str(truncated), "-d", "l4"),
        ("analyze", str(gpt2_path), "-d", "nvidia l5"),
        ("analyze", str(gpt2_path), "-d", str(bad_dev)),
        ("analyze", str(gpt2_path), "-d", str(broken_dev)),
        ("analyze", str(gpt2_path), "-d", "l4", "--dim", "batch"),
        ("devices", "show", "h1000"),
    ]
    for args in cases:
        _one_error_line(run(*args))


def test_unknown_device_lists_close_matches(gpt2_path):
    r = run("analyze", str(gpt2_path), "-d", "nvidia l5")
    assert "L4" in r.output


def test_unbound_dim_error(tmp_path):
    import onnx.parser

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, 8] x, float[8, 8] w) => (float[batch, 8] y) { y = MatMul(x, w) }""")
    path = tmp_path / "sym.onnx"
    import onnx

    onnx.save(model, path)
    r = run("analyze", str(path), "-d", "l4", "--predictor", "roofline")
    _one_error_line(r)
    assert "batch" in r.output
    r = run("analyze", str(path), "-d", "l4", "--predictor", "roofline", "--dim", "batch=4")
    assert r.exit_code == 0, r.output


def test_devices_list_and_show():
    r = run("devices")
    assert r.exit_code == 0 and "NVIDIA L4" in r.output and "MI300X" in r.output
    r = run("devices", "show", "Tesla_T4", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.output)["sm_count"] == 40


@pytest.mark.parametrize("cmd", [[], ["analyze"], ["devices"], ["devices", "show"]])
def test_help_has_an_example(cmd):
    r = run(*cmd, "--help")
    assert r.exit_code == 0 and "Example" in r.output
