"""Constant index arithmetic read symbolically (analyzer/index_values.py): every tracked value
equals, element by element, what ONNX's reference evaluator computes for the same graph;
values outside the tracked forms stay unknown rather than guessed."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from tilecast.analyzer.causal import CausalMask, abstract_values, causal_masks
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.analyzer.index_values import Affine, Uniform

INITS = ("int64[2, 1, 1, 1] bi = {0, 1}, int64[1, 6] pos = {0, 1, 2, 3, 4, 5}, "
         "int64 one = {1}, int64[1] z = {0}, int64[1] o = {1}, int64[1] six = {6}, "
         "int64[1] seven = {7}, int64[1] m1 = {-1}, int64[1] ax1 = {1}, int64[2] b6 = {2, 6}, "
         "int64[1] last = {-1}, int64 axis = {-1}, int64 r0 = {3}, int64 r9 = {9}, int64 r2 = {2}")


def _graph(body: str, out: str) -> str:
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1] dummy) => ({out} y)
  <{INITS}> {{
{body}
}}"""


def _materialize(v: object, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(v, Uniform):
        return np.full(shape, v.value)
    assert isinstance(v, Affine) and len(v.coefs) == len(shape)
    grid = np.full(shape, v.offset, dtype=np.int64)
    for ax, c in enumerate(v.coefs):
        grid = grid + c * np.arange(shape[ax]).reshape([-1 if i == ax else 1
                                                       for i in range(len(shape))])
    return grid


# each body computes y from constants only; the reference evaluator says what y holds
CASES = {
    # the position ids broadcast over the batch, then shifted: y[b, s] = s - 1
    "expand-sub": ("e = Expand(pos, b6)\n  y = Sub(e, one)", "int64[2, 6]"),
    # transformers' packed-sequence check: diff(prepend(pos[:, :1] - 1, pos)) == 1 everywhere
    "diff": ("e = Expand(pos, b6)\n  f = Slice(e, z, o, ax1, o)\n  g1 = Sub(f, one)\n"
             "  c = Concat <axis = -1> (g1, e)\n  hi = Slice(c, o, seven, last, o)\n"
             "  lo = Slice(c, z, six, last, o)\n  y = Sub(hi, lo)", "int64[2, 6]"),
    "cumsum-of-zeros": ("e = Expand(pos, b6)\n  d = Sub(e, e)\n  y = CumSum(d, axis)",
                        "int64[2, 6]"),
    "cumsum-of-ones": ("e = Expand(pos, b6)\n  d = Sub(e, e)\n  p = Add(d, one)\n"
                       "  y = CumSum(p, axis)", "int64[2, 6]"),  # 1, 2, ..., 6 per row
    "transpose": ("e = Expand(pos, b6)\n  y = Transpose <perm = [1, 0]> (e)", "int64[6, 2]"),
    "reversed-slice": ("y = Slice(pos, m1, z, ax1, m1)", "int64[1, 5]"),  # 5, 4, ..., 1
    "range": ("y = Range(r0, r9, r2)", "int64[3]"),  # 3, 5, 7
    # a vmap-style index: pos[b, s] gathered with (b, s) index pairs stacked on the last axis
    "gather-nd": ("e = Expand(pos, b6)\n  ib = Expand(bi, shp)\n  iq = Expand(q, shp)\n"
                  "  ub = Unsqueeze(ib, last)\n  uq = Unsqueeze(iq, last)\n"
                  "  ix = Concat <axis = -1> (ub, uq)\n  y = GatherND(e, ix)", "int64[2, 1, 6, 1]"),
}
GATHER_INITS = ", int64[1, 1, 6, 1] q = {0, 1, 2, 3, 4, 5}, int64[4] shp = {2, 1, 6, 1}"


def _values(text: str) -> dict[str, object]:
    m = load_model(onnx.parser.parse_model(text))
    return abstract_values(m, build_graph(m).nodes)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tracked_value_is_what_the_graph_computes(case: str) -> None:
    body, out = CASES[case]
    text = _graph(body, out).replace(INITS, INITS + GATHER_INITS)
    (want,) = ReferenceEvaluator(onnx.parser.parse_model(text)).run(
        None, {"dummy": np.zeros(1, np.float32)})
    got = _values(text)["y"]
    np.testing.assert_array_equal(_materialize(got, want.shape), want)


@pytest.mark.parametrize("body", [
    "e = Expand(pos, b6)\n  y = Mul(e, e)",  # a product of grids is not affine
    "e = Expand(pos, b6)\n  y = CumSum(e, axis)",  # a running sum of a grid neither
    "e = Expand(pos, b6)\n  y = Cast <to = 9> (e)",  # a grid cast to bool
    "y = Slice(pos, z, six, unknown, o)",  # an axis not read from constants
])
def test_anything_else_stays_unknown(body: str) -> None:
    text = _graph(body, "int64[2, 6]").replace("(float[1] dummy)",
                                               "(float[1] dummy, int64[1] unknown)")
    assert "y" not in _values(text)


# transformers' vmap mask (batch 2, 6 tokens): visible = (kv_idx <= q_idx) & (packed[q] ==
# packed[kv]), each index gathered from the broadcast position ids with stacked (b, i) grids
VMAP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 1, 6, 6] s) => (float[2, 1, 6, 6] y)
  <int64[1, 6] pos = {0, 1, 2, 3, 4, 5}, int64[2] b6 = {2, 6}, int64[1] last = {-1},
   int64 axis = {-1}, int64[2, 1, 1, 1] bi = {0, 1}, int64[1, 1, 6, 1] qi = {0, 1, 2, 3, 4, 5},
   int64[1, 1, 1, 6] ki = {0, 1, 2, 3, 4, 5}, int64[4] sq = {2, 1, 6, 1},
   int64[4] sk = {2, 1, 1, 6}, bool yes = {1}, float zero = {0.0}, float low = {-3.4e38}> {
  e = Expand(pos, b6)
  zq = Sub(e, e)
  packed = CumSum(zq, axis)
  bq = Expand(bi, sq)
  qq = Expand(qi, sq)
  ubq = Unsqueeze(bq, last)
  uqq = Unsqueeze(qq, last)
  iq = Concat <axis = -1> (ubq, uqq)
  bk = Expand(bi, sk)
  kk = Expand(ki, sk)
  ubk = Unsqueeze(bk, last)
  ukk = Unsqueeze(kk, last)
  ik = Concat <axis = -1> (ubk, ukk)
  kpos = GatherND(e, ik)
  qpos = GatherND(e, iq)
  le = LessOrEqual(kpos, qpos)
  pq = GatherND(packed, iq)
  pk = GatherND(packed, ik)
  same = Equal(pq, pk)
  vis0 = And(yes, le)
  vis = And(vis0, same)
  m = Where(vis, zero, low)
  y = Add(s, m)
}"""


def test_transformers_vmap_mask_is_causal() -> None:
    m = load_model(onnx.parser.parse_model(VMAP))
    masks = causal_masks(m, build_graph(m).nodes)
    assert masks["m"] == masks["vis"] == CausalMask(0)
    swapped = VMAP.replace("LessOrEqual(kpos, qpos)", "LessOrEqual(qpos, kpos)")
    m = load_model(onnx.parser.parse_model(swapped))  # queries after their keys: not causal
    assert "m" not in causal_masks(m, build_graph(m).nodes)
