"""``tilecast sweep`` / ``tilecast.sweep``: one model over several GPUs and input sizes."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from graph_texts import BATCH_MLP

import tilecast
import tilecast.device_db
from tilecast.cli import main
from tilecast.errors import TilecastError
from tilecast.sweep import render_sweep, sweep


@pytest.fixture
def mlp(batch_mlp):
    return batch_mlp()


def test_rows_are_the_forecasts_of_each_gpu_and_batch(mlp):
    s = sweep(mlp, ["t4", "h100"], {"batch": [1, 64]}, predictor="roofline")
    assert [(r.device, dict(r.dims)["batch"]) for r in s.rows] == [
        ("Tesla T4", 1), ("Tesla T4", 64), ("NVIDIA H100 SXM5 80GB", 1),
        ("NVIDIA H100 SXM5 80GB", 64)]
    for r in s.rows:
        batch = dict(r.dims)["batch"]
        f = tilecast.analyze(mlp, r.device, dims={"batch": batch}, predictor="roofline")
        assert r.total_ms == pytest.approx(f.total_ms, abs=1e-4)
        assert r.kernels == len(f.kernels) == 3
        # samples/s = batch x 1000 / ms
        assert r.samples_per_s == pytest.approx(batch * 1000 / f.total_ms, rel=1e-3)
        assert r.top_family == "matmul" and 0 < r.top_family_share <= 1
    t4, h100 = {dict(r.dims)["batch"]: r for r in s.rows[:2]}, s.rows[2:]
    for r in h100:  # speedup: the first GPU's time at the same batch over this one's
        base = t4[dict(r.dims)["batch"]].total_ms
        assert r.speedup == pytest.approx(base / r.total_ms, rel=1e-3) and r.speedup > 1
    assert all(r.speedup == 1.0 for r in t4.values())


def test_a_gpu_without_the_math_mode_is_a_row_that_says_why(mlp):
    s = sweep(mlp, ["t4", "a100-sxm4-40gb"], {"batch": [8]}, math="tf32", predictor="roofline")
    t4, a100 = s.rows
    assert t4.total_ms is None and "no TF32 tensor cores" in t4.skipped
    # the first GPU that ran is the speedup baseline
    assert a100.total_ms > 0 and a100.speedup == 1.0 and a100.skipped is None


def test_math_modes_and_runtimes_are_rows_of_their_own(mlp):
    s = sweep(mlp, ["t4", "a100-sxm4-40gb"], {"batch": [32]}, predictor="roofline",
              math=["graph", "tf32", "amp-fp16"], runtime=["eager", "graph"])
    assert [(r.device[:4], r.math, r.runtime) for r in s.rows] == [
        (d, m, rt) for d in ("Tesl", "NVID") for m in ("graph", "tf32", "amp-fp16")
        for rt in ("eager", "graph")]
    for r in s.rows:
        if r.total_ms is None:  # the T4 has no TF32
            assert r.device == "Tesla T4" and r.math == "tf32"
            continue
        f = tilecast.analyze(mlp, r.device, dims={"batch": 32}, predictor="roofline",
                             math=r.math, runtime=r.runtime)
        assert r.total_ms == pytest.approx(f.total_ms, abs=1e-6)
        # speedup: the sweep's first forecast (T4, graph, eager) over this one
        assert r.speedup == pytest.approx(s.rows[0].total_ms / f.total_ms, rel=1e-3)


def test_dims_grid_takes_every_combination_last_dim_fastest(tmp_path):
    text = BATCH_MLP.replace("float[batch, 256] x", "float[batch_size, seq, 256] x").replace(
        "float[batch, 512] y", "float[batch_size, seq, 512] y")
    onnx.save(onnx.parser.parse_model(text), tmp_path / "m.onnx")
    s = sweep(tmp_path / "m.onnx", ["l4"], {"seq": [4, 8], "batch_size": [1, 2]},
              predictor="roofline")
    assert [dict(r.dims) for r in s.rows] == [
        {"seq": 4, "batch_size": 1}, {"seq": 4, "batch_size": 2},
        {"seq": 8, "batch_size": 1}, {"seq": 8, "batch_size": 2}]
    # samples/s counts the dim that names the batch, whatever its position
    assert [round(r.samples_per_s * r.total_ms / 1000) for r in s.rows] == [1, 2, 1, 2]


@pytest.mark.parametrize("devices, dims, match", [
    ([], None, "at least one device"),
    (["t4", "no-such-gpu"], None, "unknown device 'no-such-gpu'"),
    (["t4"], {"batch": []}, "--dim batch has no value"),
    (["t4"], {"width": [2]}, "no input dim named 'width'"),
])
def test_bad_requests_raise_one_clear_error(mlp, devices, dims, match):
    with pytest.raises(TilecastError, match=match):
        sweep(mlp, devices, dims, predictor="roofline")


@pytest.mark.parametrize("math, runtime, match", [
    (["graph", "fp8"], "eager", "unknown math mode 'fp8'"),  # not a row per GPU
    ([], "eager", "at least one math mode"),
    ("graph", ["eager", "jit"], "runtime"),
])
def test_bad_math_or_runtime_names_raise(mlp, math, runtime, match):
    with pytest.raises(TilecastError, match=match):
        sweep(mlp, ["t4"], {"batch": [1]}, predictor="roofline", math=math, runtime=runtime)


def _cli(*args: str):
    return CliRunner().invoke(main, ["sweep", *args])


def test_cli_formats(mlp):
    common = [str(mlp), "-d", "t4,l4", "-d", "h100", "--dim", "batch=1,8", "--predictor",
              "roofline"]
    table = _cli(*common)
    assert table.exit_code == 0, table.output
    assert "speedup against Tesla T4" in table.output and "batch=8" in table.output
    md = _cli(*common, "--format", "markdown")
    assert "| device | math | runtime | dims | total_ms |" in md.output
    rows = list(csv.DictReader(io.StringIO(_cli(*common, "--format", "csv").output)))
    assert len(rows) == 6 and rows[0]["batch"] == "1" and rows[0]["speedup"] == "1.0"
    data = json.loads(_cli(*common, "--format", "json").output)
    assert data["kind"] == "sweep" and len(data["rows"]) == 6
    assert data["rows"][-1]["dims"] == {"batch": 8}
    assert render_sweep(sweep(mlp, ["t4"], {"batch": [1]}, predictor="roofline"), "json")


@pytest.mark.parametrize("args, message", [
    (["-d", "t4", "--dim", "batch=1,x"], "expected NAME=N[,N...]"),
    (["-d", "t4", "--dim", "batch=0"], "expected NAME=N[,N...]"),
    (["-d", ","], "expected GPU names"),
    (["-d", "t4,nope"], "Error: unknown device 'nope'"),
    (["-d", "t4", "--dim", "seq=4"], "no input dim named 'seq'"),
    (["-d", "t4", "--math", "tf32"], "no GPU given can run what was asked"),
    (["-d", "t4", "--math", "graph,fp8"], "'fp8': choose from graph, tf32"),
    (["-d", "t4", "--runtime", "eager,jit"], "'jit': choose from eager"),
])
def test_cli_bad_input_is_one_error_line(mlp, args, message):
    res = _cli(str(mlp), *args, "--predictor", "roofline")
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_cli_a_long_list_of_gpus_is_not_read_as_a_path(mlp):
    # 40 names: longer than a file name may be (is_file raises "File name too long")
    names = ",".join(["Tesla T4"] * 40)
    res = _cli(str(mlp), "-d", names, "--dim", "batch=1", "--predictor", "roofline",
               "--format", "json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)["rows"]) == 40


def test_cli_repeated_values_are_swept_once(mlp):
    res = _cli(str(mlp), "-d", "t4", "--dim", "batch=4,4,2", "--predictor", "roofline",
               "--format", "json")
    assert [r["dims"]["batch"] for r in json.loads(res.output)["rows"]] == [4, 2]


def test_a_device_json_path_with_a_comma_is_one_device(mlp, tmp_path):
    gpus = Path(tilecast.device_db.__file__).parent / "gpus"
    path = tmp_path / "my,gpu.json"
    shutil.copy(gpus / "nvidia_t4.json", path)
    res = _cli(str(mlp), "-d", str(path), "-d", "l4", "--dim", "batch=2", "--predictor",
               "roofline", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [r["device"] for r in json.loads(res.output)["rows"]] == ["Tesla T4", "NVIDIA L4"]
