"""More work never takes less time in the pass, under every runtime (hypothesis): the time a
kernel adds is its GPU time less the fixed part the runtime hides (``runtime._busy_ms``), so
the fixed part must not grow faster than the GPU time. The kernels are costed by the
analyzer's own formulas (``test_costs.cost_of``), with the operands the ops really have (a
layer norm's scale and shift, a batch norm's four statistics), which the synthetic kernels of
test_predictor_properties.py leave out."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="property tests need hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_costs import cost_of  # noqa: E402

from tilecast.analyzer.runtime import RUNTIMES, apply_runtime  # noqa: E402
from tilecast.analyzer.types import Kernel  # noqa: E402
from tilecast.device_db import list_devices  # noqa: E402

DEVICES = list_devices()
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None)
ONNX_TYPES = {"float32": "float", "float16": "float16"}


def layer_norm(rows: int, cols: int, dtype: str) -> Kernel:
    t = ONNX_TYPES[dtype]
    cost = cost_of(f"{t}[{rows}, {cols}] x, {t}[{cols}] s, {t}[{cols}] b",
                   "y = LayerNormalization <axis = -1> (x, s, b)", "LayerNormalization")
    return Kernel("ln", ("ln",), "LayerNormalization", cost)


def batch_norm(n: int, c: int, hw: int, dtype: str) -> Kernel:
    t = ONNX_TYPES[dtype]
    cost = cost_of(f"{t}[{n}, {c}, {hw}, {hw}] x, {t}[{c}] s, {t}[{c}] b, {t}[{c}] m, "
                   f"{t}[{c}] v", "y = BatchNormalization(x, s, b, m, v)", "BatchNormalization")
    return Kernel("bn", ("bn",), "BatchNormalization", cost)


def _predictor():
    from tilecast.learned.predictor import default_predictor

    return default_predictor()


def _assert_never_faster(small: Kernel, big: Kernel) -> None:
    pred = _predictor()
    for dev in DEVICES:
        a, b = pred.predict([small, big], dev)
        assert b.gpu_ms >= a.gpu_ms * (1 - 1e-5), (dev.name, small.cost, big.cost)
        for runtime in RUNTIMES:
            ta, tb = (apply_runtime([p], dev, runtime)[0].latency_ms for p in (a, b))
            assert tb >= ta * (1 - 1e-5), (dev.name, runtime, small.cost, big.cost, ta, tb)


@SETTINGS
@given(rows=st.integers(1, 4096), cols=st.sampled_from((64, 256, 768, 1024, 4096)),
       dtype=st.sampled_from(tuple(ONNX_TYPES)), factor=st.integers(2, 8))
def test_a_layer_norm_with_more_rows_never_takes_less_time(rows, cols, dtype, factor) -> None:
    # Before stop 56 the scale and shift, spread over the rows, shrank a block's bytes as rows
    # were added: a 1,024-wide layer norm was forecast faster at 8 rows than at 1 (A10).
    _assert_never_faster(layer_norm(rows, cols, dtype), layer_norm(rows * factor, cols, dtype))


@SETTINGS
@given(n=st.integers(1, 64), c=st.integers(1, 1024), hw=st.sampled_from((7, 14, 28, 56)),
       dtype=st.sampled_from(tuple(ONNX_TYPES)), factor=st.integers(2, 8))
def test_a_batch_norm_with_more_channels_never_takes_less_time(n, c, hw, dtype, factor) -> None:
    # A channel is a row of the row model (N H W long), so more channels add rows of the same
    # length. More batch lengthens the rows instead, another row shape: there the fixed part
    # grows with the row, and under a CUDA graph the busy time can fall by a few percent
    # (docs/predictor.md, "Monotonicity").
    _assert_never_faster(batch_norm(n, c, hw, dtype), batch_norm(n, c * factor, hw, dtype))
