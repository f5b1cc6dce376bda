"""What a planner reads off a step forecast: the whole training run (token counts, steps, days,
GPU-hours; tilecast.parallel.run) and the share of the GPU's peak the step achieves."""

from __future__ import annotations

import json
from dataclasses import replace

import onnx
import onnx.parser
import pytest
from parallel_helpers import TINY_FP16, analyze_cli, make_cluster, tiny_model

from tilecast.errors import ConfigError
from tilecast.parallel import Layout, TrainingRun, analyze_parallel, parse_tokens, plan_run


@pytest.mark.parametrize(("text", "tokens"), [
    ("300B", 300e9), ("1.5T", 1.5e12), ("3e11", 3e11), ("2M", 2e6), ("10k", 1e4),
    (" 7 ", 7.0), ("0.5g", 5e8),
])
def test_token_counts(text: str, tokens: float) -> None:
    assert parse_tokens(text) == pytest.approx(tokens)


@pytest.mark.parametrize("text", ["abc", "-5", "0", "1.5X", "", "3 B tokens", "1e400", "2e15",
                                  "nan", "inf"])
def test_bad_token_counts_name_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--train-tokens"):
        parse_tokens(text)


def test_run_arithmetic() -> None:
    # 1e9 tokens at 2^20 per step: ceil(953.67) = 954 steps of 1 s = 0.265 h; on 8 GPUs 2.12
    run = TrainingRun(tokens=1e9, tokens_per_step=2**20, step_ms=1000.0, gpus=8)
    assert run.steps == 954
    assert run.hours == pytest.approx(954 / 3600)
    assert run.days == pytest.approx(954 / 86400)
    assert run.gpu_hours == pytest.approx(8 * 954 / 3600)
    assert run.to_dict()["steps"] == 954
    assert "1B tokens = 954 steps of 1,048,576 tokens" in run.summary()


def test_plan_run_takes_the_global_batch_and_sequence() -> None:
    f = analyze_parallel(tiny_model(), Layout(dp=2, microbatches=3), cluster=make_cluster(),
                         predictor="roofline", optimizer="adam")
    run = plan_run(f, 1e6)
    # the tiny layer: batch 2 x 3 microbatches x dp 2 = 12 samples of 8 tokens
    assert (f.global_batch, f.sequence, run.tokens_per_step) == (12, 8, 96)
    assert run.steps == 10417 and run.step_ms == f.step_ms and run.gpus == 2
    with pytest.raises(ConfigError, match="no attention was recognized"):
        plan_run(replace(f, sequence=0), 1e6)


def test_cli_prints_and_writes_the_run(tmp_path) -> None:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    table = analyze_cli(path, "dp=2", "--train-tokens", "1M")
    assert table.exit_code == 0, table.output
    assert "run        1M tokens = 31,250 steps of 32 tokens" in table.output
    doc = json.loads(analyze_cli(path, "dp=2", "--train-tokens", "1M", "--format",
                                 "json").output)
    assert doc["run"]["steps"] == 31250 and doc["run"]["tokens_per_step"] == 32
    assert json.loads(analyze_cli(path, "dp=2", "--format", "json").output)["run"] is None
    ranking = analyze_cli(path, "auto", "--gpus", "2", "--train-tokens", "1M")
    assert ranking.exit_code == 0, ranking.output
    assert "run_days" in ranking.output.splitlines()[0]
    bad = analyze_cli(path, "dp=2", "--train-tokens", "lots")
    assert bad.exit_code != 0 and "Error: --train-tokens 'lots' is not a token count" in bad.output


@pytest.mark.parametrize(("model", "peak"), [
    (tiny_model, 19.5),  # fp32 GEMMs on the A100 SXM4 80GB: the SIMT peak
    (lambda: onnx.parser.parse_model(TINY_FP16), 312.0),  # fp16: the tensor-core peak
])
def test_utilization_is_a_share_of_the_gemm_dtype_peak(model, peak: float) -> None:
    f = analyze_parallel(model(), Layout(dp=2), cluster=make_cluster(), predictor="roofline",
                         optimizer="adam")
    assert f.peak_tflops == peak
    assert f.flops_utilization == pytest.approx(f.tflops_per_gpu / peak)
    doc = f.to_dict()
    assert doc["peak_tflops"] == peak and doc["flops_utilization"] > 0
    assert replace(f, peak_tflops=0.0).flops_utilization is None


def test_cli_prints_the_utilization(tmp_path) -> None:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    out = analyze_cli(path, "dp=2").output
    assert "TFLOP/s per GPU, " in out and "% of the 19.5 TFLOP/s peak" in out
