"""Constant index arithmetic read symbolically (analyzer/index_values.py): every tracked value
equals, element by element, what ONNX's reference evaluator computes for the same graph;
values outside the tracked forms stay unknown rather than guessed."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from tilecast.analyzer.causal import CausalMask, abstract_values
from tilecast.analyzer.graph import build_graph, load_model
from tilecast.analyzer.index_values import Affine, Uniform, Vector

INITS = ("int64[2, 1, 1, 1] bi = {0, 1}, int64[1, 6] pos = {0, 1, 2, 3, 4, 5}, "
         "int64 one = {1}, int64[1] z = {0}, int64[1] o = {1}, int64[1] six = {6}, "
         "int64[1] seven = {7}, int64[1] m1 = {-1}, int64[1] ax1 = {1}, int64[2] b6 = {2, 6}, "
         "int64[1] last = {-1}, int64 axis = {-1}, int64 r0 = {3}, int64 r9 = {9}, int64 r2 = {2}")


def _graph(body: str, out: str) -> str:
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1] dummy, float[2, 3, 5] t) => ({out} y)
  <{INITS}> {{
{body}
}}"""


def _materialize(v: object, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(v, Vector):
        return np.array(v.values)
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
    "shape-gather": ("s = Shape(t)\n  y = Gather(s, r2)", "int64"),  # t's last dim, 5
    "shape": ("y = Shape(t)", "int64[3]"),  # (2, 3, 5): a vector, not a grid
    "shape-start": ("y = Shape <start = 1> (t)", "int64[2]"),  # (3, 5): 3 + 2 i
    # one row of a transposed grid: y[s] = pos[s]
    "gather-axis": ("e = Expand(pos, b6)\n  tr = Transpose <perm = [1, 0]> (e)\n"
                    "  y = Gather <axis = 1> (tr, one)", "int64[6]"),
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
        None, {"dummy": np.zeros(1, np.float32), "t": np.zeros((2, 3, 5), np.float32)})
    got = _values(text)["y"]
    np.testing.assert_array_equal(_materialize(got, want.shape), want)


@pytest.mark.parametrize("body", [
    "e = Expand(pos, b6)\n  y = Mul(e, e)",  # a product of grids is not affine
    "e = Expand(pos, b6)\n  y = CumSum(e, axis)",  # a running sum of a grid neither
    "e = Expand(pos, b6)\n  y = Cast <to = 9> (e)",  # a grid cast to bool
    "y = Slice(pos, z, six, unknown, o)",  # an axis not read from constants
])
def test_anything_else_stays_unknown(body: str) -> None:
    text = _graph(body, "int64[2, 6]").replace("(float[1] dummy,",
                                               "(float[1] dummy, int64[1] unknown,")
    assert "y" not in _values(text)


# transformers' vmap mask (batch 2, 6 tokens): visible = (kv_idx <= q_idx) & (packed[q] ==
# packed[kv]), each index gathered from the broadcast position ids with stacked (b, i) grids
def _index(x: str) -> str:
    """(batch, position) index pairs stacked on a new last axis, broadcast to s{x}'s shape."""
    return "".join(f"  {a}{x} = Expand({a}i, s{x})\n  u{a}{x} = Unsqueeze({a}{x}, last)\n"
                   for a in ("b", x)) + f"  i{x} = Concat <axis = -1> (ub{x}, u{x}{x})\n"


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
{index_q}{index_k}  kpos = GatherND(e, ik)
  qpos = GatherND(e, iq)
  le = LessOrEqual(kpos, qpos)
  pq = GatherND(packed, iq)
  pk = GatherND(packed, ik)
  same = Equal(pq, pk)
  vis0 = And(yes, le)
  vis = And(vis0, same)
  m = Where(vis, zero, low)
  y = Add(s, m)
}""".replace("{index_q}", _index("q")).replace("{index_k}", _index("k"))


def test_transformers_vmap_mask_is_causal() -> None:
    m = load_model(onnx.parser.parse_model(VMAP))
    masks = build_graph(m).causal_masks
    assert masks["m"] == masks["vis"] == CausalMask(0)
    swapped = VMAP.replace("LessOrEqual(kpos, qpos)", "LessOrEqual(qpos, kpos)")
    m = load_model(onnx.parser.parse_model(swapped))  # queries after their keys: not causal
    assert "m" not in build_graph(m).causal_masks


# random chains of the tracked ops over a random grid: whatever the chain, a value tilecast
# tracks is the value the reference evaluator computes
def _step(draw, st, x: np.ndarray, name: str, k: int) -> tuple[str, np.ndarray, str]:
    op = draw(st.sampled_from(["add", "transpose", "slice", "unsqueeze", "expand", "concat",
                               "gather"]))
    out, ax = f"v{k}", draw(st.integers(0, x.ndim - 1))
    if op == "add":
        c = draw(st.integers(-5, 5))
        return f"  c{k} = Constant <value = int64 {{{c}}}> ()\n  {out} = Add({name}, c{k})\n", \
            x + c, out
    if op == "transpose":
        perm = draw(st.permutations(range(x.ndim)))
        return f"  {out} = Transpose <perm = {list(perm)}> ({name})\n", x.transpose(perm), out
    if op == "slice" and x.shape[ax] > 1:
        start, step = draw(st.integers(0, x.shape[ax] - 1)), draw(st.sampled_from([1, 2, -1]))
        end = x.shape[ax] if step > 0 else -x.shape[ax] - 1
        sl = [slice(None)] * x.ndim
        sl[ax] = slice(start, end if step > 0 else None, step)
        consts = "".join(f"  {n}{k} = Constant <value = int64[1] {{{v}}}> ()\n"
                         for n, v in (("s", start), ("e", end), ("a", ax), ("p", step)))
        return consts + f"  {out} = Slice({name}, s{k}, e{k}, a{k}, p{k})\n", x[tuple(sl)], out
    if op == "unsqueeze" and x.ndim < 4:
        return (f"  a{k} = Constant <value = int64[1] {{{ax}}}> ()\n"
                f"  {out} = Unsqueeze({name}, a{k})\n"), np.expand_dims(x, ax), out
    if op == "expand" and x.ndim < 4:
        shape = (3, *x.shape)
        return (f"  a{k} = Constant <value = int64[{len(shape)}] {{{str(shape)[1:-1]}}}> ()\n"
                f"  {out} = Expand({name}, a{k})\n"), np.broadcast_to(x, shape), out
    if op == "concat":
        return f"  {out} = Concat <axis = {ax}> ({name}, {name})\n", \
            np.concatenate([x, x], ax), out
    if op == "gather" and x.ndim > 1:
        i = draw(st.integers(0, x.shape[ax] - 1))
        return (f"  i{k} = Constant <value = int64 {{{i}}}> ()\n"
                f"  {out} = Gather <axis = {ax}> ({name}, i{k})\n"), np.take(x, i, ax), out
    return "", x, name


def test_random_chains_of_tracked_ops_match_the_reference_evaluator() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    tracked = []

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(st.data())
    def check(data) -> None:
        rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5))
        c0, c1, off = (data.draw(st.integers(-3, 3)) for _ in range(3))
        x = off + c0 * np.arange(rows)[:, None] + c1 * np.arange(cols)[None, :]
        body, name = "", "g0"
        for k in range(data.draw(st.integers(1, 5))):
            text, x, name = _step(data.draw, st, x, name, k)
            body += text
        shape = str(list(x.shape)).replace(" ", "")
        grid = ", ".join(str(int(v)) for v in (off + c0 * np.arange(rows)[:, None]
                                                + c1 * np.arange(cols)[None, :]).reshape(-1))
        model = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1] dummy) => (int64{shape} y)
  <int64[{rows}, {cols}] g0 = {{{grid}}}> {{
{body}  y = Identity({name})
}}"""
        want = ReferenceEvaluator(onnx.parser.parse_model(model)).run(
            None, {"dummy": np.zeros(1, np.float32)})[0]
        np.testing.assert_array_equal(want, x)  # the chain is what numpy says
        got = _values(model).get("y")
        tracked.append(got is not None)
        if got is not None:
            np.testing.assert_array_equal(_materialize(got, want.shape), want)

    check()
    assert sum(tracked) >= 0.8 * len(tracked)  # the chains do get tracked, most of them
