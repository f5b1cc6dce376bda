"""LLM serving forecasts: prefill, KV-cached decode steps, per-request latency and KV-cache
memory (tilecast.serving)."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from parallel_helpers import attention_core

from tilecast.analyzer.graph import build_graph, load_model
from tilecast.analyzer.pipeline import node_kernels, prepare
from tilecast.analyzer.synthetic import gpt2_like
from tilecast.cli import main
from tilecast.device_db import load_device
from tilecast.errors import TilecastError
from tilecast.parallel.structure import recognize
from tilecast.serving import (
    DecodeStep,
    ServingForecast,
    analyze_serving,
    decode_contexts,
    decode_kernels,
)
from tilecast.serving.decode import prefill_kernels
from tilecast.serving.report import render_serving

# 2 layers, hidden 64 (4 heads of 16), 32 tokens, batch 2, vocabulary 1000, fp32.
GPT = dict(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=1000)
KV_LAYER = 2 * (2 * 32 * 64 * 4)  # K and V of every sequence's prompt, one layer: 32768 B
MLP = """<ir_version: 8, opset_import: ["" : 18]>
g (float[4, 64] x) => (float[4, 64] y) <float[64, 64] w = {0.0}> { y = MatMul(x, w) }"""


def parts():
    g = build_graph(load_model(gpt2_like(**GPT)))
    r = prepare(g, "eager")
    return node_kernels(r), r, recognize(r)


def test_a_decode_step_runs_one_token_per_sequence_against_the_cache():
    kernels, results, s = parts()
    step = decode_kernels(kernels, results, s, prompt=32, context=40, batch=2, graph_batch=2)
    products = [k.cost.matmul for k in step if k.cost.matmul is not None]
    # every linear on batch 2 rows: QKV 64 -> 192, out 64 -> 64, MLP 64 -> 256 -> 64, LM head
    assert {(d.m, d.n, d.k) for d in products} == {(2, 192, 64), (2, 64, 64), (2, 256, 64),
                                                   (2, 64, 256), (2, 1000, 64)}
    attend = [k for k in step if k.op_type == "DecodeAttention"]
    writes = [k for k in step if k.op_type == "KVCacheWrite"]
    assert len(attend) == len(writes) == 2 and not any(k.op_type == "Softmax" for k in step)
    # the cache over 40 keys plus the query and output (2 sequences x 64 values x 4 B, each)
    assert attend[0].cost.bytes == KV_LAYER * 40 // 32 + 2 * 2 * 64 * 4
    assert attend[0].cost.state_bytes == KV_LAYER * 40 // 32  # the cache: pass state
    assert attend[0].cost.flops == 4 * (2 * 64) * 40  # Q K^T and P V, 2 FLOPs per FMA
    assert writes[0].cost.bytes == 2 * KV_LAYER // 32  # one token's K and V, read and written


def test_a_decode_step_rereads_broadcast_operands_for_its_own_rows_only():
    # The prefill reads the position embeddings again for the second sequence and the
    # 4 KB bias-like operands of each layer for 7 more token rows; a decode step of 2
    # sequences x 1 token repeats none of them (it kept the prompt's re-reads before).
    kernels, results, s = parts()
    assert sum(k.cost.reread is not None for k in kernels) == 3
    step = decode_kernels(kernels, results, s, prompt=32, context=40, batch=2, graph_batch=2)
    assert all(k.cost.reread is None for k in step)


# A 16 KB RMSNorm weight read by 4,096 token rows: 4,095 re-reads. On 8 rows 7 (8 / 4096 of
# the repeats), on 1 row none, on twice the rows 8,191; a 1 KB residual read by a fused
# epilogue scales with the output.
@pytest.mark.parametrize(("num", "den", "rereads", "epilogue"), [
    (8, 4096, 7, 2), (1, 4096, 0, 0), (2, 1, 8191, 2048),
])
def test_scaled_reads_follow_the_rows(num: int, den: int, rereads: int, epilogue: int):
    from tilecast.analyzer.types import BroadcastReread, OpCost
    from tilecast.parallel.tensor import scaled_reads

    kb16 = 16384
    c = OpCost("elementwise", 0, 0, "float32", reread=BroadcastReread(4095 * kb16, kb16, kb16),
               epilogue_bytes=1024)
    got = scaled_reads(c, num, den)
    assert (got.reread.bytes // kb16 if got.reread else 0) == rereads
    assert got.epilogue_bytes == epilogue


def test_the_prefill_computes_the_last_tokens_logits_only():
    kernels, results, s = parts()
    heads = [k.cost.matmul for k in prefill_kernels(kernels, results, s, 32, 2, 2)
             if k.cost.matmul is not None and k.cost.matmul.n == 1000]
    assert [(d.m, d.n, d.k) for d in heads] == [(2, 1000, 64)]  # was 64 rows (2 x 32)


def test_another_batch_scales_rows_and_attention_batches():
    kernels, results, s = parts()
    prefill = prefill_kernels(kernels, results, s, 32, batch=6, graph_batch=2)
    dims = {(d.b, d.m, d.n, d.k) for d in (k.cost.matmul for k in prefill) if d is not None}
    # 6 x 32 token rows; Q K^T and P V over 6 sequences x 4 heads; the head on 6 last tokens
    assert {(1, 192, 192, 64), (24, 32, 32, 16), (24, 32, 16, 32), (1, 6, 1000, 64)} <= dims
    step = decode_kernels(kernels, results, s, prompt=32, context=40, batch=6, graph_batch=2)
    assert {d.m for d in (k.cost.matmul for k in step) if d is not None} == {6}
    attend = next(k for k in step if k.op_type == "DecodeAttention")
    assert attend.cost.bytes == 3 * KV_LAYER * 40 // 32 + 2 * 6 * 64 * 4


@pytest.mark.parametrize(("generate", "contexts"), [
    (1, []), (2, [33]), (4, [33, 34, 35]), (9, [33, 36, 40]), (128, [33, 96, 159]),
])
def test_decode_contexts(generate: int, contexts: list[int]):
    # token t (2..generate) attends over the 32 prompt tokens and the t - 1 generated ones
    assert decode_contexts(32, generate) == contexts


def _forecast(steps, generate: int = 9) -> ServingForecast:
    return ServingForecast("m", load_device("a100-sxm4-80gb"), "roofline", "graph", batch=4,
                           prompt=32, generate=generate, prefill_ms=10.0,
                           decode=tuple(DecodeStep(c, ms) for c, ms in steps),
                           weights_bytes=40 * 2**30, kv_bytes_per_token=2**20)


def test_request_arithmetic():
    f = _forecast([(33, 1.0), (36, 2.0), (40, 3.0)])
    assert f.tpot_ms == pytest.approx((1 + 4 * 2 + 3) / 6)  # Simpson's rule
    assert f.ttft_ms == 10.0 and f.total_ms == pytest.approx(10 + 8 * 2.0)
    assert f.tokens_per_s == pytest.approx(4 * 9 / 0.026)
    assert f.kv_cache_bytes == 4 * 41 * 2**20
    # 80 GiB - 40 GiB of weights over 41 MiB a sequence
    assert f.max_batch == (40 * 2**30) // (41 * 2**20) and f.fits
    one = _forecast([], generate=1)
    assert one.tpot_ms is None and one.total_ms == 10.0
    doc = json.loads(f.to_json())
    assert doc["kind"] == "serving" and doc["memory"]["max_batch"] == f.max_batch


def test_forecast_of_a_model():
    f = analyze_serving(gpt2_like(**GPT), "a100-sxm4-80gb", generate=9, predictor="roofline")
    assert (f.batch, f.prompt, [s.context for s in f.decode]) == (2, 32, [33, 36, 40])
    assert f.kv_bytes_per_token == 2 * 2 * 64 * 4  # 2 layers of K and V, 64 fp32 values
    steps = [s.latency_ms for s in f.decode]
    assert steps == sorted(steps) and 0 < steps[0] < f.prefill_ms
    big = analyze_serving(gpt2_like(**GPT), "a100-sxm4-80gb", generate=9, batch=64,
                          predictor="roofline")
    assert big.batch == 64 and big.kv_bytes_per_token == f.kv_bytes_per_token
    # host-bound at both batches (every kernel shorter than its dispatch): never faster
    assert big.prefill_ms >= f.prefill_ms and big.tokens_per_s > f.tokens_per_s
    with pytest.raises(TilecastError, match="batch must be 1 to"):
        analyze_serving(gpt2_like(**GPT), "h100", generate=4, batch=0)


def test_a_decode_steps_kv_cache_streams_from_dram_once_the_step_outgrows_the_l2():
    """One layer's cache (36 MiB) fits the L4's 48 MB L2, but a decode step reads it a whole
    step after its last read, with every layer's weights (here one 64 MiB matrix) streamed
    since: from DRAM, at no more than the DRAM bandwidth. A kernel benchmark repeating the
    attention alone keeps it resident. Before stop 44 both read it from the L2."""
    from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
    from tilecast.learned.predictor import default_predictor

    cache = 36 * 2**20
    attend = Kernel("a", ("a",), "DecodeAttention", OpCost(
        "attention", 4 * 2**22, cache + 2**16, "bfloat16", elements=2**22, state_bytes=cache))
    mm = MatmulDims(1, 8, 8192, 4096, weight_b=True)  # Linear(4096 -> 8192) on 8 rows
    gemm = Kernel("w", ("w",), "MatMul", OpCost("matmul", 2 * 8 * 8192 * 4096,
                                                2 * (8 * 4096 + 8192 * 4096 + 8 * 8192),
                                                "bfloat16", "matrix", matmul=mm))
    l4, pred = load_device("l4"), default_predictor()
    alone = pred.predict([attend], l4)[0].gpu_ms
    in_step = pred.predict([attend, gemm], l4)[0].gpu_ms
    assert in_step >= cache / (l4.mem_bandwidth_gbps * 1e9) * 1e3 > alone


def test_a_decode_attention_is_its_cache_read_not_its_vector_flops():
    """FlashDecoding runs Q K^T and P V as tensor-core MMAs: the decode attention's FLOPs take
    the matrix peak, and its time is its KV-cache read. Costed on the vector units' fp32 peak
    (what PyTorch's 16-bit elementwise math gets), the A100's 151 MFLOP per layer (batch 8,
    32 heads, 1152 keys of 128) ran 2.3x the time of its 38 MB. Only a kernel that says
    "matrix" gets it: a grouped conv without matmul dims stays on the vector units."""
    from tilecast.analyzer.types import Kernel, OpCost
    from tilecast.learned.predictor import default_predictor
    from tilecast.learned.routing import route

    flops, cache = 4 * 8 * 32 * 1152 * 128, 2 * 8 * 8 * 1152 * 128 * 2
    cost = OpCost("attention", flops, cache + 2**16, "bfloat16", unit="matrix",
                  elements=8 * 32 * 128 * 1152, state_bytes=cache)
    attend = Kernel("a", ("a",), "DecodeAttention", cost)
    a100 = load_device("a100-sxm4-80gb")
    p = default_predictor().predict([attend], a100)[0]
    busy = p.gpu_ms - p.fixed_ms  # the work a CUDA graph runs, launch aside
    assert busy < 1.3 * cache / (a100.mem_bandwidth_gbps * 1e9) * 1e3
    grouped = Kernel("g", ("g",), "Conv", OpCost("conv", flops, cache, "bfloat16", "matrix"))
    units = route([attend, grouped]).parts["elementwise"].unit.tolist()
    assert units == ["matrix", "vector"]


def test_longer_contexts_cost_more_on_the_learned_predictor():
    f = analyze_serving(gpt2_like(**GPT), "h100", generate=2000, runtime="graph")
    first, _, last = (s.latency_ms for s in f.decode)
    assert last > first


@pytest.mark.parametrize("kw", [{}, {"tp": 2}, {"layers": 8}])
def test_a_fused_attention_graph_serves_as_its_eager_twin_decodes(kw):
    # The same decoder with each attention core one causal Attention node (an SDPA export):
    # decode steps replace either core by the same fused decode kernel, so they, the cache
    # and the weights agree; the prefill runs one fused kernel per core either way (the
    # graph runtime fuses the eager chain and reads its Trilu mask as causal, causal.py).
    size = dict(layers=2, hidden=512, heads=8, seq=512, batch=4, vocab=8000)
    eager, fused = (analyze_serving(gpt2_like(**size, fused_attention=f), "h100", generate=64,
                                    runtime="graph", **kw) for f in (False, True))
    assert fused.tpot_ms == pytest.approx(eager.tpot_ms)
    assert (fused.kv_cache_bytes, fused.weights_bytes) == (eager.kv_cache_bytes,
                                                           eager.weights_bytes)
    assert fused.prefill_ms == pytest.approx(eager.prefill_ms)


def test_a_fused_residual_scales_with_the_gemm_output() -> None:
    # A GEMM of 1,024 rows x 512 -> 512 in bf16 with its residual add fused (graph runtime):
    # operands 2 (1024 x 512 + 512 x 512 + 1024 x 512) bytes, the residual 2 x 1024 x 512.
    # On one row (a decode step) the operands scale with the operands, the residual with
    # the output: 1/1024 of it, not the operands' ratio (which would keep 40 % of it).
    from tilecast.analyzer.types import MatmulDims, OpCost
    from tilecast.parallel.tensor import rescale_matmul

    d, residual = MatmulDims(1, 1024, 512, 512), 2 * 1024 * 512
    operands = 2 * (1024 * 512 + 512 * 512 + 1024 * 512)
    c = OpCost("matmul", 2 * 1024 * 512 * 512, operands + residual, "bfloat16", "matrix",
               matmul=d, epilogue_bytes=residual)
    one = rescale_matmul(c, MatmulDims(1, 1, 512, 512))
    assert one.epilogue_bytes == residual // 1024
    assert one.bytes == operands * (512 + 512 * 512 + 512) // (2 * 1024 * 512 + 512 * 512) \
        + residual // 1024


def test_graph_serving_fuses_the_residual_adds_into_their_gemms(monkeypatch) -> None:
    # The same forecast with the epilogue fusion turned off: both phases read the residuals
    # back as adds of their own, so they take longer.
    fused = analyze_serving(gpt2_like(**GPT), "h100", generate=8, runtime="graph")
    monkeypatch.setattr("tilecast.analyzer.pipeline.fuse_epilogues",
                        lambda results, outputs: results)
    apart = analyze_serving(gpt2_like(**GPT), "h100", generate=8, runtime="graph")
    assert fused.prefill_ms < apart.prefill_ms and fused.tpot_ms < apart.tpot_ms


@pytest.mark.parametrize("runtime", ["eager", "graph", "cudagraph"])
def test_a_decode_steps_kernels_under_the_in_graph_floor_are_counted(monkeypatch, runtime):
    # The tiny decoder's decode step: every kernel a few kilobytes. With no DRAM latency for
    # the GPU's vendor, under a graph runtime each is its 0.5 us launch and a near-zero busy
    # time, under the 0.9 us no kernel undercut in a CUDA graph on our Hoppers; eager charges
    # the host's dispatch instead.
    monkeypatch.setattr("tilecast.analyzer.runtime.lowest_dram_latency_ns", lambda vendor: None)
    f = analyze_serving(gpt2_like(**GPT), "h100", generate=4, runtime=runtime)
    doc = f.to_dict()["graph_floor"]
    if runtime == "eager":
        assert f.graph_floor is None and doc is None
        return
    # graph: 6 (its attention reads and writes the heads in place), cudagraph: 20
    assert f.graph_floor.kernels >= 6 and 0 < f.graph_floor.ms < f.decode[0].latency_ms
    assert doc["kernels"] == f.graph_floor.kernels
    assert doc["ms"] == pytest.approx(f.graph_floor.ms, rel=1e-5)
    assert f"graph floor: {f.graph_floor.kernels:,} kernels" in render_serving(f, "table")


def test_a_graph_without_attention_is_an_error():
    with pytest.raises(TilecastError, match="no attention pattern"):
        analyze_serving(onnx.parser.parse_model(MLP), "h100", generate=4)
    for generate in (0, 10**9):
        with pytest.raises(TilecastError, match="generate must be 1 to 10,000,000, got"):
            analyze_serving(gpt2_like(**GPT), "h100", generate=generate)


def test_cli(tmp_path):
    path = tmp_path / "gpt.onnx"
    onnx.save(gpt2_like(**GPT), str(path))
    run = CliRunner().invoke
    table = run(main, ["serve", str(path), "-d", "l4", "--generate", "16", "--predictor",
                       "roofline"])
    assert table.exit_code == 0, table.output
    assert "prefill" in table.output and "per token after the first" in table.output
    doc = json.loads(run(main, ["serve", str(path), "-d", "l4", "--generate", "16",
                                "--predictor", "roofline", "--format", "json"]).output)
    assert doc["generate"] == 16 and doc["tpot_ms"] > 0 and doc["memory"]["fits"]
    md = run(main, ["serve", str(path), "-d", "l4", "--generate", "2", "--format",
                    "markdown", "--predictor", "roofline"])
    assert md.output.startswith("- model")
    sweep = run(main, ["serve", str(path), "-d", "l4", "--generate", "4", "--batch", "1,4,16",
                       "--predictor", "roofline"])
    lines = sweep.output.splitlines()
    assert sweep.exit_code == 0 and lines[1].split()[:2] == ["batch", "prefill_ms"]
    assert [ln.split()[0] for ln in lines[2:]] == ["1", "4", "16"]
    runs = json.loads(run(main, ["serve", str(path), "-d", "l4", "--generate", "4", "--batch",
                                 "1,4", "--format", "json", "--predictor", "roofline"]).output)
    assert runs["kind"] == "serving-sweep" and [r["batch"] for r in runs["runs"]] == [1, 4]
    for bad_batch in ("0", "1,x", "", "4,-1"):
        bad = run(main, ["serve", str(path), "-d", "l4", "--generate", "4", "--batch",
                         bad_batch])
        assert bad.exit_code == 2 and "Error: --batch" in bad.output, bad_batch
    tp = json.loads(run(main, ["serve", str(path), "-d", "a100-sxm4-80gb", "--generate", "4",
                               "--tp", "2", "--format", "json", "--predictor", "roofline"]
                        ).output)
    assert (tp["tp"], tp["cluster"]) == (2, "dgx-a100")
    mlp = tmp_path / "mlp.onnx"
    onnx.save(onnx.parser.parse_model(MLP), str(mlp))
    bad = run(main, ["serve", str(mlp), "-d", "l4", "--generate", "4"])
    assert bad.exit_code == 2 and bad.output.startswith("Error:")
    assert "Traceback" not in bad.output


def test_tensor_parallel_serving_splits_weights_cache_and_heads():
    one = analyze_serving(gpt2_like(**GPT), "a100-sxm4-80gb", generate=9, predictor="roofline")
    two = analyze_serving(gpt2_like(**GPT), "a100-sxm4-80gb", generate=9, predictor="roofline",
                          tp=2)
    assert (two.tp, two.cluster) == (2, "dgx-a100")  # the first preset with the GPU
    assert two.kv_bytes_per_token == one.kv_bytes_per_token / 2
    # every parameter is split but the norms (4 of 64 fp32 values each, 3 of them) and the
    # position table (32 x 64, replicated; the word table is vocabulary-parallel)
    replicated = (3 * 2 * 64 + 32 * 64) * 4
    assert two.weights_bytes == pytest.approx((one.weights_bytes - replicated) / 2
                                              + replicated, rel=0.02)
    assert two.max_batch > one.max_batch
    with pytest.raises(TilecastError, match="tp=3 does not divide the 4 attention heads"):
        analyze_serving(gpt2_like(**GPT), "h100", generate=4, tp=3)


def test_a_tensor_parallel_decode_step_holds_its_share_and_all_reduces():
    from tilecast.parallel.cluster import load_cluster
    from tilecast.serving.tensor import plan_tensor

    kernels, results, s = parts()
    ranked, plan = plan_tensor(kernels, results, s, 2, load_cluster("dgx-a100"), 2 * 32)
    step = decode_kernels(ranked, results, s, prompt=32, context=40, batch=2, graph_batch=2,
                          tp=2)
    products = {(d.m, d.n, d.k) for d in (k.cost.matmul for k in step) if d is not None}
    # QKV 192 / 2 columns, the output projection's 64 / 2 reduction, the head's 1000 / 2
    assert {(2, 96, 64), (2, 64, 32), (2, 128, 64), (2, 64, 128), (2, 500, 64)} == products
    attend = next(k for k in step if k.op_type == "DecodeAttention")
    assert attend.cost.bytes == (KV_LAYER * 40 // 32 + 2 * 2 * 64 * 4) // 2
    # two row-parallel outputs per layer (64 fp32 values a token), the logits gathered
    assert plan.allreduce_bytes == (256,) * 4 and plan.logits_bytes == 4000
    assert plan.comm_ms(tokens=2, sequences=2) > 0


@pytest.mark.parametrize(("graph", "target", "segment", "times"), [
    (2, 32, 0, 31.0),  # the whole first layer, 31 times
    (2, 32, 1, 1.0),  # the last layer's segment once (its add and norm are in the epilogue)
    (4, 10, 1, 3.0),  # (10 - 1) / (4 - 1)
    (1, 8, 0, 8.0),  # a one-layer graph repeats its only segment
    (2, 2, 0, 1.0), (2, 32, "prologue", 1.0), (2, 32, "epilogue", 1.0),
])
def test_depth(graph, target, segment, times):
    from tilecast.serving.depth import Depth

    assert Depth(graph, target).times(segment) == times


@pytest.mark.parametrize("tp", [1, 2])
def test_repeated_layers_forecast_the_deeper_graph(tp: int):
    deep = analyze_serving(gpt2_like(**{**GPT, "layers": 6}), "h100", generate=9, tp=tp,
                           runtime="graph")
    grown = analyze_serving(gpt2_like(**GPT), "h100", generate=9, tp=tp, runtime="graph",
                            layers=6)
    assert grown.layers == deep.layers == 6
    for field in ("prefill_ms", "tpot_ms", "weights_bytes", "kv_bytes_per_token"):
        assert getattr(grown, field) == pytest.approx(getattr(deep, field), rel=1e-6), field


# A decoder layer with an LM head whose K and V are projected from a second sequence (an
# encoder's output): batch 2, 8 tokens, hidden 16, 4 heads of 4, vocabulary 32.
CROSS = """<ir_version: 8, opset_import: ["" : 18]>
g (int64[2, 8] ids, float[2, 8, 16] enc) => (float[2, 8, 32] logits)
<float[32, 16] emb = {0.0}, float[16, 16] wq = {0.0}, float[16, 16] wk = {0.0},
 float[16, 16] wv = {0.0}, float[16, 16] wo = {0.0}, int64[4] hs = {2, 8, 4, 4},
 int64[3] hm = {2, 8, 16}, float sc = {0.5}> {
  x = Gather(emb, ids)
  q = MatMul(x, wq)
  k = MatMul(enc, wk)
  v = MatMul(enc, wv)""" + attention_core() + """
  a = MatMul(om, wo)
  y = Add(a, x)
  embt = Transpose <perm = [1, 0]> (emb)
  logits = MatMul(y, embt)
}"""


# The same layer reading a KV cache: 4 past tokens' K and V before the 8 new ones.
PAST = (CROSS.replace("float[2, 8, 16] enc", "float[2, 4, 16] pk, float[2, 4, 16] pv")
        .replace("k = MatMul(enc, wk)", "kn = MatMul(x, wk)\n  k = Concat <axis = 1> (pk, kn)")
        .replace("v = MatMul(enc, wv)", "vn = MatMul(x, wv)\n  v = Concat <axis = 1> (pv, vn)")
        .replace("int64[4] hs = {2, 8, 4, 4},",
                 "int64[4] hs = {2, 8, 4, 4}, int64[4] hk = {2, 12, 4, 4},")
        .replace(attention_core(), attention_core(kv_shape="hk")))


def test_only_decoder_only_language_models_are_served():
    from parallel_helpers import tiny_model

    with pytest.raises(TilecastError, match="need a language model head"):
        analyze_serving(tiny_model(), "h100", generate=4)  # a layer without a head
    with pytest.raises(TilecastError, match="is a cross-attention"):
        analyze_serving(onnx.parser.parse_model(CROSS), "h100", generate=4)
    with pytest.raises(TilecastError, match="attends 8 queries to 12 keys"):
        analyze_serving(onnx.parser.parse_model(PAST), "h100", generate=4)
