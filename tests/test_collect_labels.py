"""`tilecast collect-labels --device cpu`: a whole model timed and written as a label that
`tilecast evaluate` reads back with its dtype, runtime, task and attention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilecast.cli import main

pytest.importorskip("torch", reason="tilecast collect-labels needs the [collect] extra (torch)")
pytest.importorskip("transformers", reason="building Hugging Face models needs transformers")

TINY = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64,
        "n_positions": 64}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def _run(*args: str, repeats: int = 2):
    return CliRunner().invoke(main, ["collect-labels", *args, "--device", "cpu",
                                     "--repeats", str(repeats)])


def test_inference_label_and_its_config(tmp_path, config):
    out = tmp_path / "out"
    r = _run(str(config), "-b", "2", "-s", "16", "--dtype", "fp32", "--out", str(out))
    assert r.exit_code == 0, r.output
    label = json.loads((out / "labels-float32-eager" / "cpu" / "tiny-inf-16-2.json").read_text())
    assert label["e2e_latency"] > 0 and label["fw_latency"] == label["e2e_latency"]
    assert label["bwall_latency"] == 0 and label["num_layer"] == 2
    assert (label["dtype"], label["runtime"], label["attn"], label["task"]) == (
        "float32", "eager", "eager", "base")
    assert label["sm_clock_mhz"] is None  # no GPU clock on the CPU
    assert json.loads((out / "models" / "tiny.json").read_text()) == TINY


def _training_label(tmp_path: Path, config: Path) -> dict:
    """A one-layer training step at batch 2 x 16 tokens, collected on the CPU."""
    out = tmp_path / "out"
    r = _run(str(config), "-b", "2", "-s", "16", "--mode", "training", "--layers", "1",
             "--out", str(out))
    assert r.exit_code == 0, r.output
    return json.loads((out / "labels-bfloat16-eager" / "cpu" / "tiny-L1-train-16-2.json")
                      .read_text())


def test_training_label_splits_forward_and_backward(tmp_path, config, monkeypatch):
    # The backward is the step's median less the forward's. Real CPU timings cannot pin it:
    # with both cores busy a sub-millisecond forward's jitter swallowed it (0 at 2 and 5
    # repeats, and at 4 x 64 tokens with 7), so the timer is replaced: the forward is timed
    # first, then the whole step.
    timed = iter([1.5, 4.0])
    calls = []

    def fake_median(fn, device, repeats):
        calls.append(fn)
        return next(timed)

    monkeypatch.setattr("tilecast.collect.labels._median", fake_median)
    label = _training_label(tmp_path, config)
    assert len(calls) == 2 and calls[0] is not calls[1]  # the forward, then the step
    assert (label["fw_latency"], label["bwall_latency"], label["e2e_latency"]) == (1.5, 2.5, 4.0)
    assert label["num_layer"] == 1
    assert json.loads((tmp_path / "out" / "models" / "tiny-L1.json").read_text())["n_layer"] == 1


def test_a_training_step_is_timed_on_the_cpu(tmp_path, config):
    # the real timers; a loaded CPU may time the step no longer than the forward, and then
    # the label records no backward rather than a negative one
    label = _training_label(tmp_path, config)
    assert label["fw_latency"] > 0 and label["e2e_latency"] > 0
    assert label["bwall_latency"] == pytest.approx(
        max(label["e2e_latency"] - label["fw_latency"], 0.0))


def test_collected_label_is_evaluated_as_it_ran(tmp_path, config):
    """The label read back keeps the dtype, task and attention it was measured with, and
    `tilecast evaluate` forecasts it (the GPU directory renamed: the CPU is no GPU)."""
    from tilecast.evaluation.labels import discover_labels

    out = tmp_path / "out"
    assert _run(str(config), "-b", "2", "-s", "16", "--dtype", "fp16", "--out",
                str(out)).exit_code == 0
    labels = out / "labels-float16-eager"
    (labels / "cpu").rename(labels / "NVIDIA_L4")
    (label,), skipped = discover_labels(labels, out / "models")
    assert not skipped
    assert (label.dtype, label.runtime, label.task, label.attn) == (
        "float16", "eager", "base", "eager")
    report = tmp_path / "eval.json"
    r = CliRunner().invoke(main, ["evaluate", str(labels), "--predictor", "roofline",
                                  "--cache", str(tmp_path / "cache"), "--format", "json",
                                  "-o", str(report)])
    assert r.exit_code == 0, r.output
    (run,) = json.loads(report.read_text())["runs"]
    assert (run["dtype"], run["runtime"], run["predicted_ms"] > 0) == ("float16", "eager", True)
    assert list((tmp_path / "cache").glob("tiny-*-base-b2-s16-float16-eval.onnx"))


def test_an_autocast_label_records_its_math_mode(tmp_path, config):
    out = tmp_path / "out"
    r = _run(str(config), "-b", "2", "-s", "16", "--dtype", "fp32", "--math", "amp-bf16",
             "--out", str(out))
    assert r.exit_code == 0, r.output
    label = json.loads((out / "labels-float32-amp-bf16-eager" / "cpu" / "tiny-inf-16-2.json")
                       .read_text())
    assert (label["dtype"], label["math"], label["runtime"]) == ("float32", "amp-bf16", "eager")


@pytest.mark.parametrize("math_mode, out_dtype", [("graph", "float32"), ("amp-bf16", "bfloat16")])
def test_autocast_runs_the_fp32_model_in_half(math_mode, out_dtype):
    """What the label times is the fp32 model under torch.autocast: its Linear computes in
    bf16 (checked on the forward the timer calls), and TF32 is off outside --math tf32."""
    import torch

    from tilecast.collect.labels import _timers
    from tilecast.collect.labels import math_mode as tf32_setting

    module = torch.nn.Linear(8, 8)
    with tf32_setting(math_mode):
        assert not torch.backends.cudnn.allow_tf32
        forward, step = _timers(module, {"input": torch.ones(2, 8)}, "inference", "eager",
                                torch.device("cpu"), math_mode)
        assert step is None and str(forward().dtype) == f"torch.{out_dtype}"
    with tf32_setting("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with tf32_setting("tf32-conv"):  # PyTorch 1.12+'s default: cuDNN in TF32, cuBLAS in fp32
        assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.parametrize("args, message", [
    (["--dtype", "bf16", "--math", "amp-bf16"], "the model must be built in fp32"),
    (["--runtime", "cudagraph"], "CUDA graph of the forward: inference on a CUDA device only"),
    (["--runtime", "graph"], "Invalid value for '--runtime'"),
    (["--mode", "training", "--runtime", "cudagraph"], "inference on a CUDA device only"),
    (["--dtype", "int8"], "Invalid value for '--dtype'"),
])
def test_bad_input_is_one_error_line(tmp_path, config, args, message):
    r = _run(str(config), "-b", "1", "-s", "8", "--out", str(tmp_path / "o"), *args)
    assert r.exit_code != 0 and message in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error")
    assert not (tmp_path / "o" / "models").exists()  # nothing written


def test_image_models_run_whole(tmp_path):
    r = _run("resnet-50", "-b", "1", "--layers", "2", "--out", str(tmp_path / "o"))
    assert r.exit_code != 0 and "--layers cuts transformer configs only" in r.output
