"""--memory-format: channels-last activations run tensor-core convs without cuDNN's layout
transposes (analyzer/runtime.py), and every output, compare and gate say which was assumed."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.cli import main

# A 3x3 fp16 conv: cuDNN's tensor-core kernel runs on NHWC, so on NCHW activations PyTorch
# transposes X and W in and Y out (learned/tensor_core.py, nchw_transpose_bytes).
HALF_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[32, 64, 56, 56] x, float16[64, 64, 3, 3] w) => (float16[32, 64, 56, 56] y) {
  y = Conv <pads = [1, 1, 1, 1]> (x, w)
}"""
# A 1x1 stride-1 conv is a GEMM on NCHW as it stands: no transposes either way.
POINTWISE = HALF_CONV.replace("64, 3, 3] w", "64, 1, 1] w").replace(
    "<pads = [1, 1, 1, 1]> ", "")
# fp32 on SIMT cores: cuDNN's NCHW kernels, no transposes.
FP32_CONV = HALF_CONV.replace("float16", "float")


def _layout_ms(model: onnx.ModelProto, dev: tilecast.Device) -> float:
    f = tilecast.analyze(model, dev, runtime="cudagraph")
    pred = tilecast.learned.predictor.default_predictor().predict([f.kernels[0].kernel], dev)
    return pred[0].layout_ms


@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
@pytest.mark.parametrize("device", ["t4", "a100-sxm4-40gb", "h100-sxm"])
def test_channels_last_drops_exactly_the_layout_transposes(runtime, device):
    model, dev = onnx.parser.parse_model(HALF_CONV), tilecast.load_device(device)
    nchw, cl = (tilecast.analyze(model, dev, runtime=runtime, memory_format=m)
                for m in ("nchw", "channels-last"))
    layout = _layout_ms(model, dev)
    assert layout > 0
    assert nchw.total_ms - cl.total_ms == pytest.approx(layout, rel=1e-6)
    assert (nchw.memory_format, cl.memory_format) == ("nchw", "channels-last")


@pytest.mark.parametrize("text", [POINTWISE, FP32_CONV])
def test_convs_that_transpose_nothing_do_not_move(text):
    model = onnx.parser.parse_model(text)
    nchw, cl = (tilecast.analyze(model, "a100-sxm4-40gb", memory_format=m).total_ms
                for m in ("nchw", "channels-last"))
    assert nchw == cl


def test_the_graph_runtime_picks_nhwc_whatever_the_format():
    model = onnx.parser.parse_model(HALF_CONV)
    nchw, cl = (tilecast.analyze(model, "h100-sxm", runtime="graph", memory_format=m).total_ms
                for m in ("nchw", "channels-last"))
    replay_cl, replay = (tilecast.analyze(model, "h100-sxm", runtime="cudagraph",
                                          memory_format=m).total_ms
                         for m in ("channels-last", "nchw"))
    # one conv: a replay on channels-last runs what the compiled graph runs
    assert nchw == cl == replay_cl < replay


def test_an_unknown_memory_format_is_an_error():
    with pytest.raises(tilecast.TilecastError, match="memory format 'nhwc'"):
        tilecast.analyze(onnx.parser.parse_model(HALF_CONV), "t4", memory_format="nhwc")


# --- outputs, compare, gate, sweep --------------------------------------------------------

@pytest.fixture
def conv_path(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(onnx.parser.parse_model(HALF_CONV), path)
    return path


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("fmt,needle", [
    ("table", "layout     channels-last (tensor-core convs run without layout transposes)"),
    ("markdown", "layout     channels-last"),
    ("json", '"memory_format": "channels-last"'),
    ("csv", ",channels-last"),
])
def test_every_format_names_the_memory_format(conv_path, fmt, needle):
    res = _run("analyze", str(conv_path), "-d", "h100-sxm", "--memory-format",
               "channels-last", "--format", fmt)
    assert res.exit_code == 0, res.output
    assert needle in res.output


def test_the_table_says_when_nchw_transposes_are_costed(conv_path):
    res = _run("analyze", str(conv_path), "-d", "h100-sxm")
    assert res.exit_code == 0, res.output
    assert "layout     nchw (cuDNN's NCHW <-> NHWC transposes" in res.output
    # a model without convs has nothing to lay out: no line
    mm = conv_path.parent / "mm.onnx"
    onnx.save(onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 64] a, float[64, 64] b) => (float[64, 64] y) { y = MatMul(a, b) }"""), mm)
    assert "layout " not in _run("analyze", str(mm), "-d", "h100-sxm").output


def test_a_forecast_written_before_the_option_reads_as_nchw(conv_path):
    data = tilecast.analyze(conv_path, "t4", memory_format="channels-last").to_dict()
    assert tilecast.Forecast.from_dict(data).memory_format == "channels-last"
    del data["memory_format"]
    assert tilecast.Forecast.from_dict(data).memory_format == "nchw"


def test_a_bad_memory_format_in_a_saved_forecast_is_named(conv_path):
    data = tilecast.analyze(conv_path, "t4").to_dict() | {"memory_format": "nhwc"}
    with pytest.raises(tilecast.ConfigError, match="memory_format"):
        tilecast.Forecast.from_dict(data)


def test_compare_follows_the_saved_memory_format_and_refuses_another(conv_path, tmp_path):
    base = tmp_path / "base.json"
    res = _run("analyze", str(conv_path), "-d", "h100-sxm", "--memory-format",
               "channels-last", "--format", "json")
    base.write_text(res.output)
    same = _run("compare", str(base), str(conv_path))
    assert same.exit_code == 0, same.output
    assert "math graph, eager runtime, channels-last" in same.output
    other = _run("compare", str(base), str(conv_path), "--memory-format", "nchw")
    assert other.exit_code == 2 and other.output.count("Error:") == 1
    assert "memory format 'channels-last'" in other.output and "--memory-format" in other.output


def test_gate_records_the_memory_format_and_checks_it(conv_path, tmp_path, monkeypatch):
    cfg = tmp_path / "tilecast.toml"
    cfg.write_text('devices = ["h100-sxm"]\nmemory_format = "channels-last"\n'
                   f'[[models]]\npath = "{conv_path.name}"\n')
    monkeypatch.chdir(tmp_path)
    assert _run("gate", "--update-baseline").exit_code == 0
    saved = json.loads((tmp_path / ".tilecast" / "conv.json").read_text())["forecasts"][0]
    assert saved["memory_format"] == "channels-last"
    assert _run("gate").exit_code == 0
    cfg.write_text(cfg.read_text().replace('"channels-last"', '"nchw"'))
    res = _run("gate")
    assert res.exit_code == 2 and "memory format" in res.output


def test_gate_config_names_a_bad_memory_format(tmp_path):
    from tilecast.gate.config import load_config

    cfg = tmp_path / "tilecast.toml"
    cfg.write_text('devices = ["t4"]\nmemory_format = "nhwc"\n[[models]]\npath = "m.onnx"\n')
    with pytest.raises(tilecast.ConfigError, match="memory_format"):
        load_config(cfg)


def test_sweep_runs_every_row_on_the_memory_format(conv_path):
    from tilecast.sweep import sweep

    s = sweep(conv_path, ["t4", "h100-sxm"], memory_format="channels-last")
    direct = tilecast.analyze(conv_path, "h100-sxm", memory_format="channels-last").total_ms
    assert s.rows[1].total_ms == pytest.approx(direct, rel=1e-5)
    assert s.to_dict()["memory_format"] == "channels-last"
    res = _run("sweep", str(conv_path), "-d", "t4", "--memory-format", "channels-last")
    assert res.exit_code == 0 and "channels-last activations" in res.output


# Training needs a weight: the conv's W as an initializer.
TRAINED_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[32, 64, 56, 56] x) => (float16[32, 64, 56, 56] y) <float16[64, 64, 3, 3] w = {0}> {
  y = Conv <pads = [1, 1, 1, 1]> (x, w)
}"""


def test_parallel_training_takes_the_memory_format(tmp_path):
    path = tmp_path / "trained.onnx"
    onnx.save(onnx.parser.parse_model(TRAINED_CONV), path)
    args = ("analyze", str(path), "--mode", "training", "--parallel", "dp=2,tp=1,pp=1",
            "--cluster", "dgx-h100", "--runtime", "cudagraph", "--format", "json")
    nchw, cl = (json.loads(_run(*args, "--memory-format", m).output)
                for m in ("nchw", "channels-last"))
    assert cl["memory_format"] == "channels-last"
    # the forward and the weight gradient drop their transposes (a replay: eager would wait
    # for the host's dispatch of the gradient accumulation either way)
    assert cl["step_ms"] < nchw["step_ms"]


# bf16: PyTorch runs the NCHW depthwise conv, max pool and batch norm itself
# (analyzer/native.py); channels-last hands the depthwise conv to cuDNN's NHWC kernels and
# runs NHWC pool and batch norm kernels, so no NCHW walk is left; the batch norm keeps its
# per-channel kernels (the running mean's copy and 1 / sqrt(var + eps)). Opset 22: bf16 Conv.
NATIVE = """
<ir_version: 10, opset_import: ["" : 22]>
g (bfloat16[8, 64, 56, 56] x, bfloat16[64, 1, 3, 3] w, bfloat16[64] s, bfloat16[64] b,
   bfloat16[64] mu, bfloat16[64] var) => (bfloat16[8, 64, 28, 28] y) {
  d = Conv <group = 64, pads = [1, 1, 1, 1]> (x, w)
  n = BatchNormalization (d, s, b, mu, var)
  y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (n)
}"""


def _natives(memory_format: str) -> dict[str, str | None]:
    f = tilecast.analyze(onnx.parser.parse_model(NATIVE), "h100-sxm",
                         memory_format=memory_format)
    return {k.kernel.op_type: type(k.kernel.cost.native).__name__
            if k.kernel.cost.native is not None else None for k in f.kernels}


def test_channels_last_runs_no_nchw_walk():
    nchw, cl = _natives("nchw"), _natives("channels-last")
    assert nchw == {"Conv": "NativeDepthwise", "BatchNormMeanCopy": None,
                    "BatchNormInvstd": None, "BatchNormalization": "NativeBatchNorm",
                    "MaxPool": "NativePool"}
    assert cl == {"Conv": None, "BatchNormMeanCopy": None, "BatchNormInvstd": None,
                  "BatchNormalization": None, "MaxPool": None}
