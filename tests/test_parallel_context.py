"""Context parallelism: 1/cp of every token-wise kernel per rank, the K/V ring and what the
attention hides of it, gradients over dp x cp (tilecast.parallel.context)."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest
from parallel_helpers import Recording, analyze_cli, make_cluster, tiny_model

from tilecast.errors import TilecastError
from tilecast.parallel import analyze_parallel
from tilecast.parallel.layout import Layout, parse_layout
from tilecast.parallel.search import candidate_layouts
from tilecast.parallel.segments import Segment
from tilecast.parallel.stages import _context

# The tiny layer (parallel_helpers): batch 2, seq 8, hidden 16, fused QKV, 4 heads of 4. K and
# V leave the QKV split as (2, 8, 16) fp32 tensors of 1024 bytes each.
KV_BYTES = 2 * (2 * 8 * 16 * 4)
BASE_MS, HOP_MS = 8.4e-3, 2e-3  # NCCL's base latency; the test link's alpha (2 us)


def run(layout, model=None):
    pred = Recording()
    f = analyze_parallel(model or tiny_model(), layout, cluster=make_cluster(), predictor=pred,
                         optimizer="adam", clip_grad=False, fused_optimizer=False)
    return f, pred.kernels


def forward_matmuls(kernels):
    return sorted((d.b, d.m, d.n, d.k) for d in (k.cost.matmul for k in kernels
                                                 if k.phase == "forward") if d is not None)


def test_each_rank_runs_a_cp_th_of_the_tokens_and_its_queries_against_all_keys():
    _, one = run(Layout())
    _, two = run(Layout(cp=2))
    # (b, m, n, k): QKV 16 rows -> 8; Q K^T (8 heads x batch, 8 queries x 8 keys) -> 4 x 8;
    # probs x V 4 queries against all 8 keys; output projection and MLP on 8 rows
    assert forward_matmuls(one) == [(1, 16, 16, 16), (1, 16, 16, 64), (1, 16, 48, 16),
                                    (1, 16, 64, 16), (8, 8, 4, 8), (8, 8, 8, 4)]
    assert forward_matmuls(two) == [(1, 8, 16, 16), (1, 8, 16, 64), (1, 8, 48, 16),
                                    (1, 8, 64, 16), (8, 4, 4, 8), (8, 4, 8, 4)]
    work = [sum(k.flops for k in ks if k.phase != "update") for ks in (one, two)]
    assert work[1] == pytest.approx(work[0] / 2, rel=0.01)
    # the weight gradients sum over half the rows; weight-sized kernels stay whole
    updates = [sorted(k.cost.bytes for k in ks if k.phase == "update") for ks in (one, two)]
    assert updates[0] == updates[1]


def test_the_ring_sends_kv_chunks_and_the_attention_hides_what_it_can():
    f, _ = run(Layout(cp=2, microbatches=3))
    ring = {c.phase: c for c in f.collectives if c.group == "cp"}
    # forward: cp - 1 = 1 step of the K and V chunks (1/cp each); backward: K, V, dK, dV
    assert (ring["forward"].bytes, ring["backward"].bytes) == (KV_BYTES // 2, KV_BYTES)
    assert ring["forward"].count == ring["backward"].count == 3
    assert ring["forward"].latency_ms == pytest.approx(BASE_MS + HOP_MS
                                                       + KV_BYTES / 2 / 100e9 * 1e3)
    seg = Segment(core_fwd_ms=1.0, core_bwd_ms=0.001,
                  cp_fwd=[("send-recv", 1e6)] * 3, cp_bwd=[("send-recv", 2e6)] * 3)
    fwd, bwd, colls = _context(seg, Layout(cp=4), make_cluster(), 0)
    step = BASE_MS + HOP_MS + 2e6 / 100e9 * 1e3
    assert fwd == 0.0 and bwd == pytest.approx(3 * step - 0.001)
    assert {c.phase: c.exposed for c in colls} == {"forward": False, "backward": True}


def test_all_to_all_variant_splits_heads_and_exposes_its_exchanges():
    f, kernels = run(Layout(cp=2, cp_comm="a2a"))
    # the attention runs all 8 queries x 8 keys on half of the 8 batch x heads; the QKV
    # projection still on half of the rows
    assert (4, 8, 8, 4) in forward_matmuls(kernels) and (4, 8, 4, 8) in forward_matmuls(kernels)
    assert (1, 8, 48, 16) in forward_matmuls(kernels)
    a2a = sorted((c.phase, c.bytes, c.count) for c in f.collectives if c.group == "cp")
    # Q (1024 B) / 2 and the output (1024 B) / 2 share a row; K + V (2048 B) / 2
    assert a2a == [("backward", 512, 2), ("backward", 1024, 1), ("forward", 512, 2),
                   ("forward", 1024, 1)]
    assert all(c.exposed and c.op == "all-to-all" for c in f.collectives if c.group == "cp")
    with pytest.raises(TilecastError, match="heads per tensor-parallel rank"):
        run(Layout(tp=2, cp=4, cp_comm="a2a"))
    with pytest.raises(TilecastError, match="cp_comm must be one of"):
        Layout(cp=2, cp_comm="ulysses")
    assert Layout(cp=2, cp_comm="a2a").label() == "dp=1,tp=1,pp=1,cp=2,a2a,mb=1"
    comms = {x.cp_comm for x in candidate_layouts(4, 4, 1, sequence=8,
                                                  cp_comms=("ring", "a2a")) if x.cp > 1}
    assert comms == {"ring", "a2a"}


def test_gradients_and_zero_shards_span_dp_times_cp():
    plain, _ = run(Layout(dp=2, zero=1))
    f, _ = run(Layout(dp=2, cp=2, zero=1))
    grads = next(c for c in f.collectives if c.name == "dp.grad.reduce-scatter")
    assert grads.ranks == 4 and f.layout.gpus == 4
    m, p = f.ranks[0].memory, plain.ranks[0].memory
    assert m.optimizer == pytest.approx(p.optimizer / 2)  # fp32 Adam states over 4, not 2
    assert m.weights == p.weights  # weights are whole on every rank
    assert m.activations == pytest.approx(p.activations / 2)


@pytest.mark.parametrize("layout, model, needle", [
    (dict(cp=3), None, "divisible by 2 x cp"),
    (dict(cp=2), "mlp", "no attention pattern"),
])
def test_bad_context_layouts(layout, model, needle):
    mlp = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
g (float[2, 8, 16] x) => (float[2, 8, 16] y)
<float[16, 64] w1 = {0.0}, float[64, 16] w2 = {0.0}> {
  h = MatMul(x, w1)
  a = Relu(h)
  y = MatMul(a, w2)
}""")
    with pytest.raises(TilecastError, match=needle):
        run(Layout(**layout), mlp if model else None)


def test_parse_label_and_search_carry_cp():
    lay = parse_layout("dp=2,cp=4")
    assert (lay.gpus, lay.replicas) == (8, 8)
    assert lay.label() == "dp=2,tp=1,pp=1,cp=4,mb=1"
    cps = {x.cp for x in candidate_layouts(8, 8, 1, sequence=8)}
    assert cps == {1, 2, 4}  # 8 = 2 x cp chunks for cp = 4
    assert {x.cp for x in candidate_layouts(8, 8, 1)} == {1}
    assert {x.cp for x in candidate_layouts(8, 8, 1, sequence=12)} == {1, 2}


def test_cli_json_reports_cp_and_the_ring(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    out = analyze_cli(path, "dp=2,cp=2", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["layout"]["cp"] == 2 and doc["gpus"] == 4 and doc["sequence"] == 8
    assert {c["op"] for c in doc["collectives"] if c["group"] == "cp"} == {"send-recv"}
    table = analyze_cli(path, "dp=2,cp=2")
    assert "sequence   8 tokens, 4 per rank (cp 2)" in table.output
    a2a = analyze_cli(path, "dp=2,cp=2", "--cp-comm", "a2a", "--format", "json")
    assert json.loads(a2a.output)["layout"]["cp_comm"] == "a2a"
