"""Fusion groups when a value has several readers: a compiler's kernel computes the value and
every reader it can take without a cycle (analyzer/fusion.py); named-pattern rules
(Megatron-LM) join a value to its reader only when that reader is its only one."""

from __future__ import annotations

import onnx.parser

from tilecast.analyzer.analysis import cost_graph
from tilecast.analyzer.fusion import COMPILER, FusionRules, fusion_groups
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.parallel.megatron import MEGATRON_FUSION

# Llama's RMSNorm as Hugging Face writes it: the fp16 input cast to fp32, read by both the
# mean of squares and the final multiply.
RMSNORM = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[4, 64] x, float16[64] w) => (float16[4, 64] y) <float two = {2.0},
    float eps = {0.00001}, int64[1] axes = {-1}> {
  xf = Cast <to = 1> (x)
  sq = Pow(xf, two)
  ms = ReduceMean <keepdims = 1> (sq, axes)
  me = Add(ms, eps)
  rt = Sqrt(me)
  inv = Reciprocal(rt)
  nf = Mul(xf, inv)
  nh = Cast <to = 10> (nf)
  y = Mul(w, nh)
}"""
X = 4 * 64 * 2  # fp16 [4, 64]: the input and the output
SMALL = 64 * 2 + 4 + 4 + 8  # the weight, the two scalars and the axes

# The ReLU's output is read by an add and by a matmul whose output the add reads as well:
# the add cannot join the ReLU's kernel (it would wait for the matmul that waits for it).
CYCLE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 64] x, float[64, 64] w) => (float[64, 64] z) {
  p = Relu(x)
  m = MatMul(p, w)
  z = Add(p, m)
}"""

# A residual stream: the sum feeds the next layer's ReLU (which joins its kernel) and a later
# add behind a matmul (which cannot), so the fused kernel still writes the sum once.
RESIDUAL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 64] a, float[64, 64] b, float[64, 64] w) => (float[64, 64] z) {
  s = Add(a, b)
  t = Relu(s)
  m = MatMul(t, w)
  z = Add(s, m)
}"""
T = 64 * 64 * 4  # one fp32 [64, 64] tensor


def _groups(text: str, rules: FusionRules = COMPILER):
    graph = build_graph(onnx.parser.parse_model(text))
    results = cost_graph(graph)
    groups = fusion_groups(graph, results, rules)
    # the groups partition the nodes whatever the rules
    assert sorted(i for g in groups for i in g.members) == list(range(len(results)))
    return [g for g in groups if g.cost is not None]


def test_a_value_read_twice_joins_both_readers():
    (norm,) = _groups(RMSNORM)
    assert norm.op_type.startswith("Fused[Cast+Pow+ReduceMean")
    # one kernel: the fp16 input in, the fp16 output out; the fp32 copy never reaches DRAM
    assert norm.cost.bytes == X + SMALL + X


def test_named_pattern_rules_keep_a_value_with_two_readers_apart():
    groups = _groups(RMSNORM, MEGATRON_FUSION)
    assert [g.op_type for g in groups][0] == "Cast"
    cast = groups[0]
    assert cast.cost.bytes == X + 2 * X  # fp16 in, fp32 out (read back by its two readers)
    assert sum(g.cost.bytes for g in groups) > X + SMALL + X


def test_a_join_that_would_close_a_cycle_is_not_made():
    ops = sorted(g.op_type for g in _groups(CYCLE))
    assert ops == ["Add", "MatMul", "Relu"]


def test_a_value_read_outside_its_group_is_still_written_once():
    groups = {g.op_type: g for g in _groups(RESIDUAL)}
    assert set(groups) == {"Fused[Add+Relu]", "MatMul", "Add"}
    # a and b in; the sum (read again by the last add) and the ReLU's output (the matmul's) out
    assert groups["Fused[Add+Relu]"].cost.bytes == 4 * T
    assert groups["Fused[Add+Relu]"].members == (0, 1)


def _group_dag_is_acyclic(groups, results) -> bool:
    """Kahn's algorithm over the groups: an edge wherever a member reads another group's
    member's output."""
    group_of = {i: g.id for g in groups for i in g.members}
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    edges = {(group_of[producer[t.name]], group_of[i]) for i, r in enumerate(results)
             for t in r.node.inputs if t is not None and t.name in producer
             and group_of[producer[t.name]] != group_of[i]}
    indegree = {g.id: 0 for g in groups}
    for _, b in edges:
        indegree[b] += 1
    ready, done = [g for g, n in indegree.items() if n == 0], 0
    while ready:
        a = ready.pop()
        done += 1
        for x, b in edges:
            if x == a:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
    return done == len(groups)


def test_real_graphs_fuse_into_an_acyclic_set_of_kernels_with_no_more_bytes(gpt2_path,
                                                                              cnn_path):
    for path in (gpt2_path, cnn_path):
        graph = build_graph(load_model(path))
        results = cost_graph(graph)
        groups = fusion_groups(graph, results)
        assert _group_dag_is_acyclic(groups, results), path
        single = fusion_groups(graph, results, FusionRules(multi_reader=False))
        for g in groups:
            costed = [results[i].cost for i in g.members if results[i].cost is not None]
            if g.cost is not None:
                # a group moves no more than its members did apart, and does their FLOPs
                assert g.cost.bytes <= sum(c.bytes for c in costed)
                assert g.cost.flops == sum(c.flops for c in costed)
        # joining more readers only ever merges groups
        assert len(groups) <= len(single)
        assert sum(g.cost.bytes for g in groups if g.cost) <= sum(
            g.cost.bytes for g in single if g.cost)
