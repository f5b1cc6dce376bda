"""Runtimes (eager host dispatch, graph launch, BN folding) and how outputs, compare and gate
record the math mode and runtime."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.analyzer.forecast import GRAPH_FLOOR_US
from tilecast.analyzer.predictor import Prediction, RooflinePredictor
from tilecast.analyzer.runtime import (
    FOLDED_BN,
    FOLLOW_ON_SHARE,
    GRAPH_KERNEL_LAUNCH_US,
    HOST_DISPATCH_US,
    apply_runtime,
    lone_kernel_ms,
    predictor_launch_ms,
)
from tilecast.analyzer.types import Kernel, OpCost
from tilecast.cli import main
from tilecast.report import render_table

H = HOST_DISPATCH_US * 1e-3
G = GRAPH_KERNEL_LAUNCH_US * 1e-3

CONV_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[8, 16, 32, 32] x) => (float[8, 16, 32, 32] y) <float[16, 16, 3, 3] w = {0.0},
    float[16] s = {1.0}, float[16] t = {0.0}, float[16] mu = {0.0}, float[16] var = {1.0}> {
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  d = BatchNormalization(c, s, t, mu, var)
  y = Relu(d)
}"""

TWO_USES = CONV_BN.replace("float[8, 16, 32, 32] y)", "float[8, 16, 32, 32] y, "
                           "float[8, 16, 32, 32] c)")


F = 0.017  # a per-launch part as the learned predictor gives it (~17 us, fixed_ms)


def _preds(ms: list[float]) -> list[Prediction]:
    return [Prediction(m, "memory") for m in ms]


def _timed(work_ms: list[float], learned: bool) -> list[Prediction]:
    """Per-op timings of kernels doing ``work_ms``: the learned predictor states its
    per-launch part (fixed_ms); other predictors include the device's launch overhead."""
    dev = tilecast.load_device("l4")
    if learned:
        return [Prediction(w + F, "memory", gpu_ms=w + F, fixed_ms=F) for w in work_ms]
    return _preds([w + predictor_launch_ms(dev) for w in work_ms])


@pytest.mark.parametrize("learned", [True, False])
@pytest.mark.parametrize("work_ms,expected", [
    # all shorter than the dispatch: the GPU waits for the host, one dispatch per kernel,
    # and the last kernel starts one launch latency after the last dispatch
    ([0.001, 0.002, 0.003], lambda L: 3 * H + L + 0.003),
    # all longer: the host runs ahead; only the first dispatch and launch show, then the
    # kernels run back to back one inter-kernel gap apart
    ([1.0, 2.0, 3.0], lambda L: H + L + 6.0 + 2 * G),
    # a long kernel lets the host queue the next two short ones: they run back to back
    ([1.0, 0.001, 0.001], lambda L: H + L + 1.002 + 2 * G),
    # short kernels first: two dispatches of idle GPU, then the long one issued at 3H
    ([0.001, 0.001, 1.0], lambda L: 3 * H + L + 1.0),
])
def test_eager_dispatch_floor(work_ms, expected, learned):
    dev = tilecast.load_device("l4")
    out = apply_runtime(_timed(work_ms, learned), dev, "eager")
    assert sum(p.latency_ms for p in out) == pytest.approx(expected(predictor_launch_ms(dev)))
    assert all(p.latency_ms >= w - 1e-12 for p, w in zip(out, work_ms, strict=True))


def test_queued_kernels_hide_the_per_op_timing_overhead():
    # 100 kernels of 1 ms each, timed alone at 1 ms + 17 us: in a stream the 17 us hides
    # behind the previous kernel and only the 0.5 us inter-kernel gap shows.
    dev = tilecast.load_device("a100-sxm4-40gb")
    out = apply_runtime(_timed([1.0] * 100, learned=True), dev, "eager")
    total = sum(p.latency_ms for p in out)
    assert total == pytest.approx(H + predictor_launch_ms(dev) + 100 * 1.0 + 99 * G)
    assert total < 100 * (1.0 + F)


def test_eager_marks_host_bound_kernels_overhead():
    out = apply_runtime(_preds([0.001, 1.0]), tilecast.load_device("l4"), "eager")
    assert [p.bound for p in out] == ["overhead", "memory"]


def test_graph_runtime_swaps_the_launch_overhead_for_the_graph_launch():
    dev = tilecast.load_device("a100-sxm4-40gb")
    launch = predictor_launch_ms(dev)
    lone = lone_kernel_ms(dev)  # a kernel with no work still waits for its memory
    out = apply_runtime(_preds([launch + 0.1, launch]), dev, "graph")
    assert [p.latency_ms for p in out] == pytest.approx([0.1 + G, G + lone])
    # the learned predictor's per-launch part goes the same way
    out = apply_runtime(_timed([0.1, 0.0], learned=True), dev, "graph")
    assert [p.latency_ms for p in out] == pytest.approx([0.1 + G, G + lone])


@pytest.mark.parametrize("device, latency_ns", [
    # every GPU of a vendor is held to the shortest latency sourced for it: NVIDIA's is the
    # L40's (the H100's own is 375.1, the A100's 407.5; the T4 has none), AMD's the MI210's
    ("h100-sxm5-80gb", 253.8), ("a100-sxm4-40gb", 253.8), ("t4", 253.8),
    ("mi100", 391.2), ("mi300x", 391.2),
])
def test_a_queued_kernel_waits_two_dram_round_trips(device, latency_ns):
    """A kernel whose learned work is nothing still loads and stores: under a graph it costs
    the in-graph launch plus 2 x the DRAM latency, and so does one queued behind a long
    kernel in eager."""
    dev = tilecast.load_device(device)
    lone = 2 * latency_ns * 1e-6
    assert lone_kernel_ms(dev) == pytest.approx(lone)
    out = apply_runtime(_timed([0.0], learned=True), dev, "graph")
    assert out[0].latency_ms == pytest.approx(G + lone)
    out = apply_runtime(_timed([1.0, 0.0], learned=True), dev, "eager")
    assert out[1].latency_ms == pytest.approx(G + lone)


def test_a_follow_on_launch_pays_only_the_launch_call():
    """Three host-bound kernels of 1 us, the middle one launched by the first one's op: the
    host issues the last at H + share x H + H; it starts one launch latency later."""
    dev = tilecast.load_device("l4")
    kernels = [Kernel(f"k{i}", (f"k{i}",), "Add", OpCost("elementwise", 1, 8, "float32"),
                      follow_on=i == 1) for i in range(3)]
    out = apply_runtime(_timed([0.001] * 3, learned=True), dev, "eager", kernels)
    total = (2 + FOLLOW_ON_SHARE) * H + predictor_launch_ms(dev) + 0.001
    assert sum(p.latency_ms for p in out) == pytest.approx(total)
    plain = apply_runtime(_timed([0.001] * 3, learned=True), dev, "eager")
    assert sum(p.latency_ms for p in plain) == pytest.approx(total + (1 - FOLLOW_ON_SHARE) * H)


def test_eager_is_never_faster_than_graph():
    model = onnx.parser.parse_model(CONV_BN)
    for device in ("t4", "h100-sxm", "mi300x"):
        eager = tilecast.analyze(model, device, predictor="roofline")
        graph = tilecast.analyze(model, device, predictor="roofline", runtime="graph")
        assert graph.total_ms < eager.total_ms
        assert (eager.runtime, graph.runtime) == ("eager", "graph")


def test_graph_runtime_folds_inference_batch_norm_into_the_conv():
    model = onnx.parser.parse_model(CONV_BN)
    graph = tilecast.analyze(model, "t4", predictor="roofline", runtime="graph")
    # the ReLU then runs in the conv's epilogue (tests/test_epilogues.py)
    assert [k.kernel.op_type for k in graph.kernels] == ["Conv"]
    assert graph.zero_cost == {"BatchNormalization": 1, "Relu": 1}
    eager = tilecast.analyze(model, "t4", predictor="roofline")
    assert [k.kernel.op_type for k in eager.kernels] == ["Conv", "BatchNormalization", "Relu"]


def test_cudagraph_replays_every_eager_kernel_without_the_host():
    # torch.cuda.graphs captures what eager launches, batch norm included (an H100 ResNet-50
    # replay runs 106 batch-norm kernels), and drops the host's dispatch
    model = onnx.parser.parse_model(CONV_BN)
    for device in ("t4", "h100-sxm"):
        runs = {rt: tilecast.analyze(model, device, predictor="learned", runtime=rt)
                for rt in ("eager", "cudagraph", "graph")}
        ops = {rt: [k.kernel.op_type for k in f.kernels] for rt, f in runs.items()}
        assert ops["cudagraph"] == ops["eager"] == ["Conv", "BatchNormalization", "Relu"]
        assert runs["cudagraph"].zero_cost == {}
        assert runs["graph"].total_ms < runs["cudagraph"].total_ms < runs["eager"].total_ms
        assert runs["cudagraph"].runtime == "cudagraph"


HALF_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[32, 64, 56, 56] x, float16[64, 64, 3, 3] w) => (float16[32, 64, 56, 56] y) {
  y = Conv <pads = [1, 1, 1, 1]> (x, w)
}"""


def test_a_compiled_graph_runs_tensor_core_convs_without_layout_transposes():
    # PyTorch (eager or replayed) transposes an NCHW fp16 conv's X in and Y out around the
    # NHWC kernel; a compiled runtime picks NHWC and runs the GEMM alone
    model = onnx.parser.parse_model(HALF_CONV)
    dev = tilecast.load_device("h100-sxm")
    replay, compiled = (tilecast.analyze(model, dev, runtime=rt) for rt in ("cudagraph", "graph"))
    pred = tilecast.learned.predictor.default_predictor().predict([replay.kernels[0].kernel], dev)
    assert pred[0].layout_ms > 0
    assert replay.total_ms - compiled.total_ms == pytest.approx(pred[0].layout_ms, rel=1e-6)


def test_fold_reason_names_the_graph_runtime():
    from tilecast.analyzer.analysis import cost_graph
    from tilecast.analyzer.graph import build_graph
    from tilecast.analyzer.runtime import fold_batchnorm

    results = fold_batchnorm(cost_graph(build_graph(onnx.parser.parse_model(CONV_BN))))
    assert [r.reason for r in results if r.outcome == "zero"] == [FOLDED_BN]
    assert results[0].node.outputs[0].name == "d"  # the Conv writes the BN's output


@pytest.mark.parametrize("text,mode", [(TWO_USES, "inference"), (CONV_BN, "training")])
def test_batch_norm_is_kept_when_it_cannot_fold(text, mode):
    # the conv output is also a graph output / training needs the batch statistics
    f = tilecast.analyze(onnx.parser.parse_model(text), "t4", predictor="roofline",
                         runtime="graph", mode=mode)
    assert "BatchNormalization" in {k.kernel.op_type for k in f.kernels}


def test_unknown_runtime_is_an_error():
    with pytest.raises(tilecast.TilecastError, match="runtime"):
        tilecast.analyze(onnx.parser.parse_model(CONV_BN), "t4", runtime="jit")


def test_predictor_time_is_what_the_runtime_starts_from():
    # graph runtime on one kernel: roofline GPU time - launch + graph launch
    model = onnx.parser.parse_model(CONV_BN)
    dev = tilecast.load_device("t4")
    f = tilecast.analyze(model, dev, predictor="roofline", runtime="graph")
    gpu = RooflinePredictor().predict([f.kernels[0].kernel], dev)[0].latency_ms
    assert f.kernels[0].latency_ms == pytest.approx(gpu - predictor_launch_ms(dev) + G)


# --- outputs say which runtime and math mode were assumed ------------------------------------

@pytest.fixture
def conv_path(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(onnx.parser.parse_model(CONV_BN), path)
    return path


@pytest.mark.parametrize("fmt,needles", [
    ("table", ["math       tf32", "runtime    graph"]),
    ("markdown", ["math tf32", "graph runtime"]),
    ("json", ['"math": "tf32"', '"runtime": "graph"']),
    ("csv", [",tf32,graph"]),
])
def test_every_format_names_math_and_runtime(conv_path, fmt, needles):
    res = CliRunner().invoke(main, ["analyze", str(conv_path), "-d", "a100-sxm4-40gb",
                                    "--predictor", "roofline", "--math", "tf32",
                                    "--runtime", "graph", "--format", fmt])
    assert res.exit_code == 0, res.output
    for needle in needles:
        assert needle in res.output


def test_old_forecast_json_reads_as_graph_math_and_eager(conv_path):
    data = tilecast.analyze(conv_path, "t4", predictor="roofline").to_dict()
    del data["math"], data["runtime"]
    f = tilecast.Forecast.from_dict(data)
    assert (f.math, f.runtime) == ("graph", "eager")


def _save(path, *args):
    res = CliRunner().invoke(main, ["analyze", str(path), "-d", "a100-sxm4-40gb",
                                    "--predictor", "roofline", "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_compare_follows_the_saved_math_and_runtime(conv_path, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(_save(conv_path, "--math", "tf32", "--runtime", "graph"))
    res = CliRunner().invoke(main, ["compare", str(base), str(conv_path)])
    assert res.exit_code == 0, res.output
    # the model is re-forecast under tf32 + graph, so nothing changed
    assert "math tf32, graph runtime" in res.output
    dev = tilecast.compare(str(base), str(conv_path)).devices[0]
    assert dev.delta_ms == 0 and dev.base_kernels == dev.new_kernels == 1  # BN, ReLU fused
    assert (dev.to_dict()["math"], dev.to_dict()["runtime"]) == ("tf32", "graph")


@pytest.mark.parametrize("flag,value", [("--math", "graph"), ("--runtime", "eager")])
def test_compare_refuses_different_modes(conv_path, tmp_path, flag, value):
    base = tmp_path / "base.json"
    base.write_text(_save(conv_path, "--math", "tf32", "--runtime", "graph"))
    res = CliRunner().invoke(main, ["compare", str(base), str(conv_path), flag, value])
    assert res.exit_code == 2
    assert res.output.count("Error:") == 1 and "not comparable" in res.output


def test_compare_api_refuses_two_saved_forecasts_with_different_math(conv_path):
    a = tilecast.analyze(conv_path, "a100-sxm4-40gb", predictor="roofline")
    b = tilecast.analyze(conv_path, "a100-sxm4-40gb", predictor="roofline", math="tf32")
    with pytest.raises(tilecast.ConfigError, match="math"):
        tilecast.compare(a, b)


def test_gate_baseline_records_math_and_runtime_and_checks_them(conv_path, tmp_path,
                                                               monkeypatch):
    cfg = tmp_path / "tilecast.toml"
    cfg.write_text(f'predictor = "roofline"\ndevices = ["a100-sxm4-40gb"]\n'
                   f'math = "tf32"\nruntime = "graph"\n[[models]]\npath = "{conv_path.name}"\n')
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["gate", "--update-baseline"]).exit_code == 0
    saved = json.loads((tmp_path / ".tilecast" / "conv.json").read_text())["forecasts"][0]
    assert (saved["math"], saved["runtime"]) == ("tf32", "graph")
    assert runner.invoke(main, ["gate"]).exit_code == 0
    cfg.write_text(cfg.read_text().replace('math = "tf32"', 'math = "graph"'))
    res = runner.invoke(main, ["gate"])
    assert res.exit_code == 2 and res.output.count("Error:") == 1
    assert "math" in res.output


def test_gate_config_names_a_bad_math_mode(tmp_path):
    from tilecast.gate.config import load_config

    cfg = tmp_path / "tilecast.toml"
    cfg.write_text('devices = ["t4"]\nmath = "fp8"\n[[models]]\npath = "m.onnx"\n')
    with pytest.raises(tilecast.ConfigError, match=r"models\[0\]\.math|math: must be one of"):
        load_config(cfg)


def test_parallel_forecasts_take_the_math_mode(conv_path):
    # A conv net under data parallelism (no transformer layer needed): its fp32 convs on TF32.
    res = CliRunner().invoke(main, ["analyze", str(conv_path), "--mode", "training",
                                    "--parallel", "dp=2,tp=1,pp=1", "--cluster", "dgx-a100",
                                    "--predictor", "roofline", "--math", "tf32"])
    assert res.exit_code == 0, res.output
    assert "tf32" in res.output


# A permute of the batch dim that a strided batched GEMM reads in place (batch stride 32,
# rows ld 256): a view in eager PyTorch; a graph runtime folds only last-two-dims swaps.
VIEW_MM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 8, 32] x, float[8, 32, 32] w) => (float[8, 64, 32] y) {
  xt = Transpose<perm = [1, 0, 2]>(x)
  y = MatMul(xt, w)
}"""


def test_a_cuda_graph_replays_pytorchs_views_as_views():
    # eager PyTorch passes a strided view to the BLAS, and a replay captures exactly that;
    # an ONNX / compiled runtime copies it (analyzer/views.py)
    model = onnx.parser.parse_model(VIEW_MM)
    ops = {rt: [k.kernel.op_type for k in tilecast.analyze(
        model, "t4", predictor="roofline", runtime=rt).kernels]
        for rt in ("eager", "cudagraph", "graph")}
    assert ops["eager"] == ops["cudagraph"] == ["MatMul"]
    assert ops["graph"] == ["Transpose", "MatMul"]


TINY = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 128] x) => (float[1, 128] y) {
  a = Add(x, x)
  b = Relu(a)
  y = Mul(b, b)
}"""


@pytest.mark.parametrize("runtime", ["graph", "cudagraph"])
@pytest.mark.parametrize("device", [d.name for d in tilecast.list_devices()])
def test_no_kernel_is_forecast_under_the_measured_in_graph_floor(device, runtime):
    # Three 128-element kernels: each is its 0.5 us launch plus two DRAM round trips, above
    # the 0.9 us no kernel undercut in a CUDA graph on our Hoppers, on every GPU.
    f = tilecast.analyze(onnx.parser.parse_model(TINY), device, runtime=runtime)
    assert f.below_graph_floor == ()
    assert min(k.latency_ms for k in f.kernels) >= GRAPH_FLOOR_US * 1e-3


@pytest.mark.parametrize("runtime, flagged", [("eager", 0), ("graph", 3), ("cudagraph", 3)])
def test_kernels_under_the_measured_in_graph_floor_are_flagged(tmp_path, monkeypatch, runtime,
                                                               flagged):
    # With no DRAM latency for the GPU's vendor (none in the database), each tiny kernel
    # is its 0.5 us launch and a near-zero busy time, and is flagged.
    monkeypatch.setattr("tilecast.analyzer.runtime.lowest_dram_latency_ns", lambda vendor: None)
    device = tilecast.load_device("h100")
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.parser.parse_model(TINY), str(path))
    f = tilecast.analyze(str(path), device, runtime=runtime)
    assert len(f.below_graph_floor) == flagged
    assert ("graph floor: 3 of 3 kernels" in render_table(f)) == bool(flagged)
