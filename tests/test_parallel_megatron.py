"""tilecast.parallel as Megatron-LM runs: its fused kernels (the masked softmax in 16-bit only,
with its own backward), selective and full recomputation, and --parallel auto choosing the
least recomputation that fits."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from parallel_helpers import TINY, TINY_FP16, Recording, layers_text, make_cluster, tiny_model

from tilecast.cli import main
from tilecast.errors import TilecastError
from tilecast.parallel import Layout, analyze_parallel, search


@pytest.mark.parametrize("text, attention, grads", [
    # fp32: Megatron-LM's fused scale-mask-softmax needs 16-bit inputs, so the scale runs as
    # a kernel of its own and torch.softmax after it; autograd differentiates both (softmax:
    # dY * Y, then the row kernel; the scale: dY * s)
    (TINY, ["Mul", "Softmax"], ["SoftmaxGrad", "SoftmaxGrad", "MulGrad"]),
    # 16-bit: the CUDA kernel and its own backward, one row kernel over dY and the saved
    # probabilities [2, 4, 8, 8]: 3 x 512 x 2 bytes
    (TINY_FP16, ["Fused[Mul+Softmax]"], ["ScaledMaskedSoftmaxGrad"]),
])
def test_megatron_fusion_fuses_the_scaled_softmax_in_16_bit_only(text, attention, grads):
    pred = Recording()
    analyze_parallel(onnx.parser.parse_model(text), Layout(), cluster=make_cluster(),
                     predictor=pred, optimizer="none", clip_grad=False, fusion=True)
    forward = [k.op_type for k in pred.kernels if k.phase == "forward"]
    matmuls = [i for i, op in enumerate(forward) if op == "MatMul"]
    # between the scores (QK^T, the second MatMul) and the probabilities times V (the third)
    assert forward[matmuls[1] + 1:matmuls[2]] == attention
    backward = [k for k in pred.kernels if k.phase == "backward"
                and k.op_type in ("SoftmaxGrad", "MulGrad", "ScaledMaskedSoftmaxGrad")]
    assert [k.op_type for k in backward] == grads
    if grads == ["ScaledMaskedSoftmaxGrad"]:
        assert backward[0].cost.bytes == 3 * 512 * 2


def test_cli_parallel_honours_fusion(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    args = ["analyze", str(path), "--mode", "training", "--parallel", "dp=2", "--cluster",
            "dgx-a100", "--predictor", "roofline", "--format", "json"]
    plain, fused = (CliRunner().invoke(main, args + extra) for extra in ([], ["--fusion"]))
    assert plain.exit_code == 0 and fused.exit_code == 0, plain.output + fused.output
    # the fused run launches fewer kernels (Split + Transpose, the output Transpose)
    assert json.loads(fused.output)["step_ms"] < json.loads(plain.output)["step_ms"]


def test_selective_recomputation_reruns_the_attention_core_only():
    pred = Recording()
    ranks = {r: analyze_parallel(tiny_model(), Layout(recompute=r), cluster=make_cluster(),
                                 predictor=pred if r == "none" else "roofline",
                                 optimizer="none", clip_grad=False).ranks[0]
             for r in ("none", "selective", "full")}
    forward = [k for k in pred.kernels if k.phase == "forward"]
    matmuls = [i for i, k in enumerate(forward) if k.op_type == "MatMul"]
    # the core: Q K^T, the scale, the softmax and probs x V (the second to the third MatMul)
    core_flops = sum(k.flops for k in forward[matmuls[1]:matmuls[2] + 1])
    fwd_flops = sum(k.flops for k in forward)
    none, sel, full = ranks["none"], ranks["selective"], ranks["full"]
    assert sel.flops - none.flops == pytest.approx(core_flops)
    assert full.flops - none.flops == pytest.approx(fwd_flops)
    # of the core's tensors only the softmax output [2, 4, 8, 8] fp32 is kept (the scores are
    # scaled by a constant, which keeps nothing; the context feeds the output projection)
    assert none.memory.activations - sel.memory.activations == 2 * 4 * 8 * 8 * 4
    assert none.step_ms < sel.step_ms < full.step_ms


def test_recompute_modes_in_layout_and_cli(tmp_path):
    assert Layout(recompute=True).recompute == "full"
    assert Layout(recompute=False).recompute == "none"
    assert Layout(recompute="selective").label().endswith("recompute=selective")
    with pytest.raises(TilecastError, match="recompute must be one of"):
        Layout(recompute="some")
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    args = ["analyze", str(path), "--mode", "training", "--parallel", "dp=2", "--cluster",
            "dgx-a100", "--predictor", "roofline", "--format", "json"]
    for extra, want in (([], "none"), (["--recompute"], "full"),
                        (["--recompute", "selective"], "selective")):
        res = CliRunner().invoke(main, args + extra)
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["layout"]["recompute"] == want
    bad = CliRunner().invoke(main, args + ["--recompute", "half"])
    assert bad.exit_code == 2 and "half" in bad.output


def test_auto_search_takes_the_least_recomputation_that_fits():
    from types import SimpleNamespace


    # a stub forecast: memory falls with recomputation and with tp; time rises with it
    memory = {"none": 3.0, "selective": 2.0, "full": 1.0}
    cost = {"none": 1.0, "selective": 1.1, "full": 1.3}
    tried = []

    def run(layout):
        tried.append((layout.tp, layout.recompute))
        gib = memory[layout.recompute] / layout.tp
        return SimpleNamespace(layout=layout, fits=gib <= 1.0,
                               step_ms=cost[layout.recompute] * (1 + 0.1 * layout.tp))

    found = search(run, 2, 2, 1)  # dp=2,tp=1 and dp=1,tp=2 (pp=2 too)
    by_tp = {(f.layout.tp, f.layout.pp): f.layout.recompute for f in found}
    # tp=1 fits only with full recomputation; tp=2 halves the memory: selective fits
    assert by_tp[(1, 1)] == "full" and by_tp[(2, 1)] == "selective"
    # it stops at the first mode that fits
    assert [m for tp, m in tried if tp == 2] == ["none", "selective"]
    pinned = search(run, 2, 2, 1, recompute="none")
    assert {f.layout.recompute for f in pinned} == {"none"} and not any(f.fits for f in pinned)


def test_a_fused_chain_keeps_its_input_not_its_intermediates():
    # MLP activation x * exp(x): autograd keeps exp's output [2, 8, 64] fp32 for the product's
    # backward; fused (Megatron's bias-GeLU function, a compiler's partitioner) only the chain's
    # input x is kept, which the unfused chain keeps too
    text = layers_text(1).replace("act_0 = Relu(h_0)", "t_0 = Exp(h_0)\n  act_0 = Mul(t_0, h_0)")
    plain, fused = (analyze_parallel(onnx.parser.parse_model(text), Layout(),
                                     cluster=make_cluster(), predictor="roofline",
                                     fusion=fusion).ranks[0].memory.activations
                    for fusion in (False, True))
    assert plain - fused == 2 * 8 * 64 * 4


def test_cross_entropy_kernels_follow_megatron():
    from tilecast.parallel.loss import cross_entropy

    # 16 tokens of a 100-word vocabulary over tp=2: 50 logits per rank, in fp32
    lk = cross_entropy(16, 100, "float32", 2)
    n = 16 * 50
    assert [k.op_type for k in lk.forward] == ["ReduceMax", "Sub", "Exp", "ReduceSum", "Div"]
    # max and sum read the slice once (and write a per-token vector); sub, exp, div read and
    # write it in place; the backward scales the saved softmax in place
    assert [k.cost.bytes for k in lk.forward] == [4 * (n + 16), 8 * n, 8 * n, 4 * (n + 16),
                                                  8 * n]
    assert [k.cost.bytes for k in lk.backward] == [8 * n]
    assert lk.saved_bytes == 4 * n and lk.all_reduces == (("all-reduce", 64.0),) * 3
    half = cross_entropy(16, 100, "bfloat16", 1)  # logits.float() and the gradient cast back
    assert half.forward[0].op_type == "Cast" and half.backward[-1].op_type == "Cast"
    assert half.forward[0].cost.bytes == (2 + 4) * 16 * 100 and half.all_reduces == ()


def test_the_step_computes_the_loss_after_the_lm_head():
    from tilecast.analyzer.synthetic import gpt2_like

    model = gpt2_like(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=1000)
    kw = dict(cluster=make_cluster(), predictor="roofline", optimizer="adam")
    with_loss = analyze_parallel(model, Layout(tp=2), **kw)
    without = analyze_parallel(model, Layout(tp=2), loss=False, **kw)
    # per rank: 64 tokens x 500 logits, 5 forward FLOPs per logit and 1 backward
    assert with_loss.ranks[0].flops - without.ranks[0].flops == 6 * 64 * 500
    # context parallel: each rank's loss covers its 32 tokens
    cp = [analyze_parallel(model, Layout(tp=2, cp=2), loss=flag, **kw).ranks[0].flops
          for flag in (True, False)]
    assert cp[0] - cp[1] == 6 * 32 * 500
    assert with_loss.step_ms > without.step_ms
    # the per-token max, target logit and exp sum: three all-reduces of 64 x 4 bytes
    counts = [sum(c.count for c in f.collectives if c.op == "all-reduce" and c.bytes == 256)
              for f in (with_loss, without)]
    assert counts[0] - counts[1] == 3
