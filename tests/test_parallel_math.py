"""``--math`` under ``--parallel``: an fp32 graph trained on TF32 tensor cores or under
``torch.autocast`` (analyzer.mathmode), sharded like any other graph."""

from __future__ import annotations

import json

import pytest
from parallel_helpers import analyze_cli, make_cluster, tiny_model

from tilecast.analyzer.predictor import RooflinePredictor
from tilecast.errors import TilecastError
from tilecast.parallel import Layout, analyze_parallel


class Recording(RooflinePredictor):
    """Keeps every kernel it is asked about (the step's kernels, then the loss, the fused
    optimizer update and the gradient clipping, each a call of its own)."""

    def __init__(self) -> None:
        self.kernels: list = []

    def predict(self, kernels, device):
        self.kernels.extend(kernels)
        return super().predict(kernels, device)


def _run(math: str, tp: int = 1) -> tuple[object, list]:
    rec = Recording()
    f = analyze_parallel(tiny_model(), Layout(tp=tp), cluster=make_cluster(), predictor=rec,
                         math=math)
    return f, rec.kernels


def _weight_casts(kernels: list) -> dict[str, int]:
    # autocast casts each weight once per forward pass (its cast cache): "<weight>/autocast"
    return {k.nodes[0]: k.cost.bytes for k in kernels
            if k.op_type == "Cast" and k.phase == "forward" and k.nodes[0].endswith("/autocast")}


def test_autocast_keeps_the_structure_and_runs_the_linears_in_half() -> None:
    f, kernels = _run("amp-bf16", tp=2)
    assert f.graph_layers == 1 and f.math == "amp-bf16"
    linears = [k for k in kernels if k.family == "matmul" and k.phase == "forward"]
    assert linears and {k.dtype for k in linears} == {"bfloat16"}
    assert f.peak_tflops == make_cluster().device.peak_tflops("bfloat16", "matrix")


def test_each_rank_casts_its_shard_of_a_split_weight() -> None:
    # wqkv_0 is [16, 48] fp32 (column-parallel): its cast reads 16 x 48 x 4 and writes
    # 16 x 48 x 2 bytes = 4608; at tp = 2 each rank casts half of it.
    one, two = _weight_casts(_run("amp-fp16")[1]), _weight_casts(_run("amp-fp16", tp=2)[1])
    assert one["wqkv_0/autocast"] == 16 * 48 * (4 + 2)
    assert two["wqkv_0/autocast"] == one["wqkv_0/autocast"] // 2
    assert set(one) == set(two) and all(two[w] * 2 == one[w] for w in one)


def test_master_weights_and_the_optimizer_stay_fp32() -> None:
    f, kernels = _run("amp-bf16")
    plain, _ = _run("graph")
    updates = {k.dtype for k in kernels if k.phase == "update"}
    assert updates == {"float32"}
    # the same parameters, gradients and Adam states; the saved activations change dtype
    assert f.ranks[0].memory.weights == plain.ranks[0].memory.weights
    assert f.ranks[0].memory.optimizer == plain.ranks[0].memory.optimizer


def test_tf32_runs_the_fp32_linears_on_tensor_cores() -> None:
    f, kernels = _run("tf32", tp=2)
    linears = {k.dtype for k in kernels if k.family == "matmul"}
    assert linears == {"tf32"}
    assert f.peak_tflops == make_cluster().device.peak_tflops("tf32", "matrix")
    assert {k.dtype for k in kernels if k.phase == "update"} == {"float32"}


def test_tf32_on_a_gpu_without_it_is_an_error() -> None:
    with pytest.raises(TilecastError, match="tf32"):
        analyze_parallel(tiny_model(), Layout(dp=2), cluster=make_cluster(), device="v100",
                         predictor="roofline", math="tf32")


def test_cli_records_the_math_mode(tmp_path) -> None:
    import onnx

    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    res = analyze_cli(path, "dp=2,tp=2", "--math", "amp-bf16", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["math"] == "amp-bf16"
    bad = analyze_cli(path, "dp=2", "--math", "tf32", "-d", "v100")
    assert bad.exit_code != 0 and "Error:" in bad.output and "Traceback" not in bad.output


def test_autocast_keeps_the_experts_of_a_moe_layer() -> None:
    # The experts' inputs are slices of one token buffer; autocast casts each slice before
    # its expert's first linear, and the recognizer looks through those casts.
    from test_parallel_experts import moe_model

    f = analyze_parallel(moe_model(), Layout(dp=2, ep=2), cluster=make_cluster(),
                         predictor="roofline", math="amp-bf16")
    assert f.experts == 4
    # the dispatched buffer is fp32 (4 experts x 16 slots x 16 x 4 B); the experts' outputs,
    # combined back, bf16
    sizes = {c.bytes for c in f.collectives if c.group == "ep" and c.phase == "forward"}
    assert sizes == {4 * 16 * 16 * 4, 4 * 16 * 16 * 2}


def test_activation_casts_follow_the_activation_split() -> None:
    # The softmax writes fp32 probabilities (autocast's fp32_set_opt_dtype) that P V casts
    # back to half: split by heads, each rank casts its half (2 x 4 heads x 8 x 8 x (4 + 2) B
    # = 3072 at tp = 1). The LayerNorm output feeding the column-parallel QKV is replicated:
    # every rank casts all of it (2 x 8 x 16 x (4 + 2) B = 1536).
    def casts(tp: int) -> dict[str, int]:
        kernels = _run("amp-bf16", tp)[1]
        return {k.nodes[0].split("/")[0]: k.cost.bytes for k in kernels
                if k.op_type == "Cast" and k.phase == "forward" and "/autocast." in k.nodes[0]}

    one, two = casts(1), casts(2)
    assert one["p_0"] == 3072 and two["p_0"] == 1536
    assert one["n1_0"] == two["n1_0"] == 1536
