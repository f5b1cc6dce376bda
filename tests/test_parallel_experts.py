"""Expert parallelism: MoE layers recognized from structure, per-rank experts and kernels,
all-to-all token exchange, expert gradients and memory (tilecast.parallel.experts)."""

from __future__ import annotations

import json

import onnx.parser
import pytest
from parallel_helpers import (
    Recording,
    _layer,
    _weights,
    analyze_cli,
    attention_core,
    make_cluster,
    tiny_model,
)

from tilecast.analyzer.types import MatmulDims
from tilecast.errors import TilecastError
from tilecast.parallel import analyze_parallel
from tilecast.parallel.api import _graph
from tilecast.parallel.experts import recognize_experts
from tilecast.parallel.layout import Layout, parse_layout
from tilecast.parallel.search import candidate_layouts
from tilecast.parallel.structure import recognize

# One pre-LN layer (batch 2, seq 8, hidden 16, 4 heads) whose MLP is 4 experts of 16 -> 64 ->
# 16: a router, a (4 experts, 16 slots, 16) token buffer, one Gather slice per expert, the
# outputs stacked and summed back (the static, capacity-padded form exporters/moe.py writes).
EXPERTS = 4
_EXPERT = """
  x{e} = Gather <axis = 0> (buf, i{e})
  h{e} = MatMul(x{e}, w1_{e})
  a{e} = Relu(h{e})
  y{e} = MatMul(a{e}, w2_{e})
  u{e} = Unsqueeze(y{e}, ax0)"""
MOE = f"""<ir_version: 8, opset_import: ["" : 18]>
g (float[2, 8, 16] x) => (float[2, 8, 16] y)
<float[16] g1 = {{1.0}}, float[16] b1 = {{0.0}}, float[16, 48] wqkv = {{0.0}},
 float[16, 16] wo = {{0.0}}, float[16] g2 = {{1.0}}, float[16] b2 = {{0.0}},
 float[16, 4] wr = {{0.0}},
 {", ".join(f"float[16, 64] w1_{e} = {{0.0}}, float[64, 16] w2_{e} = {{0.0}}, "
            f"int64 i{e} = {{{e}}}" for e in range(EXPERTS))},
 int64[4] hs = {{2, 8, 4, 4}}, int64[3] hm = {{2, 8, 16}}, int64[2] tk = {{16, 16}},
 int64[1] ax0 = {{0}}, int64[1] ax2 = {{2}}, float sc = {{0.5}}> {{
  n1 = LayerNormalization <axis = -1> (x, g1, b1)
  qkv = MatMul(n1, wqkv)
  q, k, v = Split <axis = 2, num_outputs = 3> (qkv){attention_core()}
  a = MatMul(om, wo)
  r1 = Add(a, x)
  n2 = LayerNormalization <axis = -1> (r1, g2, b2)
  tok = Reshape(n2, tk)
  logits = MatMul(tok, wr)
  probs = Softmax <axis = -1> (logits)
  pt = Transpose <perm = [1, 0]> (probs)
  pu = Unsqueeze(pt, ax2)
  buf = Mul(pu, tok)
{"".join(_EXPERT.format(e=e) for e in range(EXPERTS))}
  st = Concat <axis = 0> ({", ".join(f"u{e}" for e in range(EXPERTS))})
  summed = ReduceSum <keepdims = 0> (st, ax0)
  m = Reshape(summed, hm)
  y = Add(m, r1)
}}"""
TOKENS_BYTES = EXPERTS * 16 * 16 * 4  # the (4, 16, 16) fp32 buffer, dispatched and combined
EXPERT_BYTES = (16 * 64 + 64 * 16) * 4  # w1 and w2 of one expert


def moe_model():
    return onnx.parser.parse_model(MOE)


def dense_then_moe_model():
    """The tiny dense layer, then the MoE layer: Switch's pattern (MoE every second layer)."""
    text = (MOE.replace("(x, g1, b1)", "(z1, g1, b1)").replace("Add(a, x)", "Add(a, z1)")
            .replace("<float[16] g1", f"<{_weights(0)}, float[16] g1")
            .replace("> {\n", "> {\n" + _layer(0, "x", "z1") + "\n", 1))
    return onnx.parser.parse_model(text)


def run(layout, model=None, **kw):
    pred = Recording()
    f = analyze_parallel(model or moe_model(), layout, cluster=make_cluster(), predictor=pred,
                         optimizer="adam", clip_grad=False, fused_optimizer=False, **kw)
    return f, pred.kernels


def expert_matmuls(kernels):
    """(m, n, k) of the experts' forward up projections: the only forward products with 16
    inputs and 64 outputs (32 per rank with tp=2)."""
    dims = [k.cost.matmul for k in kernels if k.phase == "forward" and k.cost.matmul]
    return sorted((d.m, d.n, d.k) for d in dims if d.k == 16 and d.n in (64, 32))


def test_moe_layer_is_recognized_from_structure():
    _, _, results = _graph(moe_model(), None)
    (group,) = recognize_experts(results, recognize(results))
    assert group.experts == EXPERTS
    assert (group.dispatch_bytes, group.combine_bytes) == (TOKENS_BYTES, TOKENS_BYTES)
    _, _, dense = _graph(tiny_model(), None)
    assert recognize_experts(dense, recognize(dense)) == ()


def test_a_rank_runs_its_experts_on_ep_times_the_rows_with_the_same_flops():
    one, k1 = run(Layout(dp=2))
    two, k2 = run(Layout(dp=2, ep=2))
    # ep=1: 4 experts x 16 slots; ep=2: 2 experts x (2 ranks x 16 slots), 16 -> 64 each
    assert expert_matmuls(k1) == [(16, 64, 16)] * 4
    assert expert_matmuls(k2) == [(32, 64, 16)] * 2
    matmul_flops = [sum(k.flops for k in ks if k.family == "matmul") for ks in (k1, k2)]
    assert matmul_flops[0] == matmul_flops[1]
    assert one.ranks[0].flops == pytest.approx(two.ranks[0].flops, rel=0.02)


def test_expert_weights_are_split_and_their_gradients_reduced_over_dp_over_ep():
    dense, _ = run(Layout(dp=4))
    moe, _ = run(Layout(dp=4, ep=2))
    # two of the four experts leave each rank
    lost = dense.ranks[0].memory.weights - moe.ranks[0].memory.weights
    assert lost == pytest.approx(2 * EXPERT_BYTES)
    grads = {c.group: c for c in moe.collectives if c.name.endswith("grad.all-reduce")}
    assert grads["dp"].ranks == 4 and grads["edp"].ranks == 2
    per_step = {g: c.bytes * c.count for g, c in grads.items()}
    assert per_step["edp"] == pytest.approx(2 * EXPERT_BYTES, abs=grads["edp"].count)
    total = moe.ranks[0].memory.weights
    assert per_step["dp"] == pytest.approx(total - 2 * EXPERT_BYTES, abs=grads["dp"].count)
    # ep = dp: every rank holds its own experts, nothing to reduce for them
    alone, _ = run(Layout(dp=4, ep=4))
    assert {c.group for c in alone.collectives if "grad" in c.name} == {"dp"}


def test_zero_shards_expert_states_over_dp_over_ep():
    f, _ = run(Layout(dp=4, ep=2, zero=1))
    plain, _ = run(Layout(dp=4, ep=2))
    m, p = f.ranks[0].memory, plain.ranks[0].memory
    expert_elems = 2 * EXPERT_BYTES / 4
    dense_elems = p.weights / 4 - expert_elems
    # fp32 Adam: momentum and variance, 8 bytes per parameter of the rank's shard
    assert m.optimizer == pytest.approx(8 * (dense_elems / 4 + expert_elems / 2))
    assert {c.group for c in f.collectives if c.op == "all-gather"} == {"dp", "edp"}


def test_all_to_all_dispatch_and_combine_cost_alpha_beta():
    f, _ = run(Layout(dp=2, ep=2, microbatches=3))
    a2a = [c for c in f.collectives if c.group == "ep"]
    assert {(c.phase, c.op, c.bytes, c.count) for c in a2a} == {
        ("forward", "all-to-all", TOKENS_BYTES, 2 * 3), ("backward", "all-to-all",
                                                         TOKENS_BYTES, 2 * 3)}
    # NCCL base 8.4 us + (n - 1) alpha 2 us + (n - 1) / n x 4096 B / 100 GB/s
    assert a2a[0].latency_ms == pytest.approx((8.4 + 2 + 0.5 * TOKENS_BYTES / 100e3) / 1e3)
    assert all(c.exposed for c in a2a)


def test_tensor_and_expert_parallel_together():
    f, kernels = run(Layout(dp=2, tp=2, ep=2))
    # 2 local experts, 32 rows each, the up projection split by columns (64 / 2)
    assert expert_matmuls(kernels) == [(32, 32, 16)] * 2
    groups = {c.group for c in f.collectives}
    assert {"tp", "ep", "dp"} <= groups and "edp" not in groups  # dp / ep = 1
    ep_span = next(c for c in f.collectives if c.group == "ep")
    assert ep_span.ranks == 2 and ep_span.bytes == TOKENS_BYTES
    # sequence parallel: each tensor-parallel rank exchanges its half of the tokens
    sp, _ = run(Layout(dp=2, tp=2, ep=2, sequence_parallel=True))
    assert {c.bytes for c in sp.collectives if c.group == "ep"} == {TOKENS_BYTES // 2}


def test_layer_replication_repeats_the_dense_moe_pattern():
    # 2 graph layers (dense, MoE) to 6: dense, MoE, dense, MoE, dense, MoE -> 3 MoE layers,
    # each a dispatch and a combine all-to-all in the forward
    f, _ = run(Layout(dp=2, ep=2), dense_then_moe_model(), layers=6)
    (fwd,) = [c for c in f.collectives if c.group == "ep" and c.phase == "forward"]
    assert fwd.count == 3 * 2 and f.layers == 6
    one, _ = run(Layout(dp=2, ep=2), moe_model(), layers=3)  # every layer is MoE
    (fwd,) = [c for c in one.collectives if c.group == "ep" and c.phase == "forward"]
    assert fwd.count == 3 * 2


def _structure(layers):
    """A Structure whose layer i holds layers[i] attention blocks and one MLP."""
    from tilecast.parallel.structure import Block, Structure

    blocks, starts, node = [], [], 0
    for count in layers:
        starts.append(node)
        for kind in ["attention"] * count + ["mlp"]:
            blocks.append(Block(kind, (node,), node + 1, frozenset(), 4 if kind != "mlp"
                                else 0))
            node += 2
    return Structure(tuple(blocks), tuple(starts), node - 1, None, frozenset(), (), ())


@pytest.mark.parametrize("attention, moe_layers, period", [
    ([1, 1, 1], set(), 1),  # a decoder-only or encoder-only stack
    ([1, 1, 1, 1], {1, 3}, 2),  # an MoE layer every second layer
    ([1, 1, 2, 2], set(), 4),  # 2 encoder + 2 decoder layers (cross-attention): the whole
    ([1, 1, 2, 2], {1, 3}, 4),  # graph, so that both stacks grow together
])
def test_replication_period_follows_the_layer_kinds(attention, moe_layers, period):
    from types import SimpleNamespace

    from tilecast.parallel.api import _period

    s = _structure(attention)
    rows = {i: min(b.row for b in s.blocks if s.segment(b.row) == i) for i in moe_layers}
    moe = [SimpleNamespace(rows=(rows[i],)) for i in moe_layers]
    assert _period(s, moe) == period


@pytest.mark.parametrize("layout, model, needle", [
    (dict(dp=2, ep=4), None, "must divide dp"),
    (dict(dp=3, ep=3), None, "does not divide the 4 experts"),
    (dict(dp=2, ep=2), tiny_model, "needs mixture-of-experts layers"),
])
def test_bad_expert_layouts(layout, model, needle):
    with pytest.raises(TilecastError, match=needle):
        run(Layout(**layout), model() if model else None)


def test_parse_and_label_carry_ep():
    lay = parse_layout("dp=8, ep=4")
    assert (lay.dp, lay.ep, lay.expert_dp) == (8, 4, 2)
    assert lay.label() == "dp=8,tp=1,pp=1,ep=4,mb=1"
    assert Layout(dp=8).label() == "dp=8,tp=1,pp=1,mb=1"


def test_auto_search_tries_expert_degrees_only_for_moe_models():
    moe = {(x.dp, x.tp, x.ep) for x in candidate_layouts(4, 4, 1, experts=4)}
    assert {(4, 1, 1), (4, 1, 2), (4, 1, 4), (2, 2, 2), (1, 4, 1)} <= moe
    assert {x.ep for x in candidate_layouts(4, 4, 1)} == {1}
    assert {x.ep for x in candidate_layouts(6, 6, 1, experts=4)} == {1, 2}


def test_cli_json_reports_ep_and_the_all_to_alls(tmp_path):
    path = tmp_path / "moe.onnx"
    onnx.save(moe_model(), str(path))
    out = analyze_cli(path, "dp=4,ep=2", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["layout"]["ep"] == 2 and doc["experts"] == EXPERTS
    assert {c["group"] for c in doc["collectives"] if c["op"] == "all-to-all"} == {"ep"}
    table = analyze_cli(path, "dp=4,ep=2")
    assert "experts    4 per MoE layer, 2 per rank (ep 2)" in table.output
    bad = analyze_cli(path, "dp=4,ep=3")
    assert bad.exit_code == 2 and bad.output.count("Error:") == 1


def test_matmul_dims_of_the_shared_helper():
    from tilecast.parallel.tensor import matmul_role

    fwd = MatmulDims(1, 16, 64, 8)
    assert matmul_role(fwd, fwd) == "forward"
    assert matmul_role(MatmulDims(1, 16, 8, 64), fwd) == "dA"
    assert matmul_role(MatmulDims(1, 8, 64, 16), fwd) == "dB"
