"""A decode step runs only the experts its few tokens pick (serving/experts.py)."""

from __future__ import annotations

import onnx.parser
import pytest
from test_parallel_experts import MOE

from tilecast.analyzer.pipeline import node_kernels
from tilecast.parallel.api import _graph
from tilecast.parallel.structure import recognize
from tilecast.serving.decode import decode_kernels
from tilecast.serving.experts import expert_routing

# The tiny MoE layer (2 sequences of 8 tokens, 4 experts) with 8 slots per expert instead of
# 16: capacity = tokens x k / E = 16 x 2 / 4, top-2 routing as Mixtral's export writes it.
TOP2 = (MOE.replace("int64[1] ax0 = {0}", "int64[1] ax0 = {0}, int64[1] z = {0}, "
                    "int64[1] e8 = {8}, int64[1] ax1 = {1}")
        .replace("  buf = Mul(pu, tok)\n",
                 "  full = Mul(pu, tok)\n  buf = Slice(full, z, e8, ax1)\n"))


def _parts():
    _, graph, results = _graph(onnx.parser.parse_model(TOP2), None)
    return results, recognize(results)


@pytest.mark.parametrize(("batch", "share"), [
    (1, 0.5),  # one token picks 2 of 4 experts: each runs in half the steps
    (2, 0.75),  # 1 - (1 - 2/4)^2
    (8, 1 - 0.5 ** 8),
])
def test_the_share_of_steps_an_expert_runs(batch: int, share: float) -> None:
    results, s = _parts()
    shares = expert_routing(results, s, graph_tokens=16, batch=batch).shares
    experts = {results[i].node.outputs[0].name for i in shares}
    assert {"h0", "y0", "h3", "y3"} <= experts and "qkv" not in experts  # dense: absent
    assert all(v == pytest.approx(share) for v in shares.values())


def test_an_expert_that_runs_takes_its_tokens_choices() -> None:
    # Batch 1: the token's 2 choices go to the 2 experts that run, one row each (the graph's
    # 8 slots x 1 / 16 tokens = 0.5 row per expert, over a share of 0.5); at batch 8 an
    # expert runs in 0.996 of the steps on 8 x 2 / 4 / 0.996 = 4 rows.
    results, s = _parts()
    kernels = node_kernels(results)
    node = {r.node.outputs[0].name: r.node.name for r in results if r.node.outputs}
    for batch, rows in ((1, 1), (8, 4)):
        shares = expert_routing(results, s, 16, batch).shares
        step = decode_kernels(kernels, results, s, prompt=8, context=9, batch=batch,
                              graph_batch=2, shares=shares)
        h0 = next(k for k in step if k.nodes == (node["h0"],))
        assert h0.cost.matmul.m == rows
        qkv = next(k for k in step if k.nodes == (node["qkv"],))
        assert qkv.cost.matmul.m == batch  # a dense linear: one row per sequence


def test_a_dense_mixture_runs_every_expert() -> None:
    # 16 slots for 16 tokens: the graph gives every expert every token (k = E), so every
    # expert runs in every step, as before.
    _, graph, results = _graph(onnx.parser.parse_model(MOE), None)
    shares = expert_routing(results, recognize(results), graph_tokens=16, batch=1).shares
    assert shares and set(shares.values()) == {1.0}


def test_routing_summary_for_the_output() -> None:
    results, s = _parts()
    r = expert_routing(results, s, graph_tokens=16, batch=1)
    assert r.to_dict() == {"per_layer": 4, "top_k": 2, "active_per_step": 2.0}
    from parallel_helpers import tiny_model

    _, _, plain = _graph(tiny_model(), None)
    dense = expert_routing(plain, recognize(plain), graph_tokens=16, batch=1)
    assert dense.to_dict() is None and dense.shares == {}
