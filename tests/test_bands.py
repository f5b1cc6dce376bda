"""Error bands: the leave-one-GPU-out folds' measured / forecast quantiles per family
(learned/bands.py), attached to the kernels they validate and summed into a forecast's band
(analyzer/band.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx.parser
import pytest
from click.testing import CliRunner

import tilecast
from tilecast.analyzer.band import forecast_band
from tilecast.analyzer.forecast import Forecast, KernelForecast
from tilecast.analyzer.predictor import Prediction
from tilecast.analyzer.types import Kernel, NativePool, OpCost
from tilecast.cli import main
from tilecast.device_db import load_device
from tilecast.errors import ConfigError
from tilecast.report import render_table

learned = pytest.importorskip("tilecast.learned")
if not learned.available():
    pytest.skip("the learned predictor is not shipped in this install", allow_module_level=True)

from tilecast.learned.bands import (  # noqa: E402
    BANDS_NAME,
    DECADE_EDGES_MS,
    Band,
    BandCollector,
    ErrorBands,
    band_arrays,
    decade,
    load_bands,
    weighted_quantile,
)
from tilecast.learned.latency_walk import hold_to_walk  # noqa: E402
from tilecast.learned.predictor import ARTIFACT, OnnxPredictor  # noqa: E402


@pytest.mark.parametrize("values, weights, q, expected", [
    # equal weights: cumulative 0.25, 0.5, 0.75, 1; the first value reaching q
    ([1, 2, 3, 4], [1, 1, 1, 1], 0.5, 2),
    ([1, 2, 3, 4], [1, 1, 1, 1], 0.9, 4),
    # cumulative 0.125, 0.25, 1: q = 0.2 is first reached by the second value
    ([1, 2, 3], [0.5, 0.5, 3.0], 0.2, 2),
    ([3, 1, 2], [3.0, 0.5, 0.5], 0.9, 3),  # unsorted input
])
def test_weighted_quantile(values, weights, q, expected) -> None:
    assert weighted_quantile(np.array(values, float), np.array(weights, float), q) == expected


def test_each_fold_weighs_the_same_in_a_cell() -> None:
    """Three folds of softmax kernels forecast at 1 ms (decade 3: 1-10 ms): fold A 1,000
    kernels at ratio 1.0, folds B and C one each at 2.0. By rows, A would set both ends
    (1,000 of 1,002); by fold, A holds 1/3 of the weight: the 10 % quantile is 1.0 and the
    90 % 2.0. Kernels forecast at 0.05 ms fall in decade 1 and are a cell of their own, too
    sparse (one row) to keep."""
    c = BandCollector()
    c.add(np.full(1000, "softmax"), np.full(1000, 1.5), np.full(1000, 1.5))
    c.add(np.array(["softmax", "softmax"]), np.array([3.0, 0.1]), np.array([1.5, 0.05]))
    c.add(np.array(["softmax"] * 99), np.full(99, 3.0), np.full(99, 1.5))
    (band,) = c.bands("test").bands
    assert (band.family, band.decade, band.rows, band.folds) == ("softmax", 3, 1100, 3)
    assert (band.low, band.high) == (1.0, 2.0)


def test_a_kernel_takes_its_decade_or_the_nearest_cell() -> None:
    bands = ErrorBands(0.8, (Band("matmul", 1, 0.9, 1.5, 100, 5),
                             Band("matmul", 3, 0.8, 1.2, 100, 5)), "test")
    # 5 us is decade 0 -> nearest 1; 0.5 ms decade 2 -> 1 and 3 tie, the lower wins; 50 ms
    # decade 4 -> 3
    decades = decade(np.array([0.005, 0.5, 2.0, 50.0])).tolist()
    assert decades == [0, 2, 3, 4]
    assert [bands.cell("matmul", d).decade for d in decades] == [1, 1, 3, 3]
    assert bands.cell("softmax", 3) is None


HEAD = '"schema": 1, "level": 0.8, "decade_edges_ms": [0.01, 0.1, 1.0, 10.0, 100.0]'


@pytest.mark.parametrize("text, field", [
    ('{"schema": 2, "level": 0.8, "bands": []}', "'schema'"),
    ('{"schema": 1, "level": 1.5, "bands": []}', "'level'"),
    ('{"schema": 1, "level": 0.8, "decade_edges_ms": [1], "bands": []}', "'decade_edges_ms'"),
    ('{' + HEAD + ', "bands": [{"decade": 1, "low": 0.9, "high": 1.1}]}', "'family'"),
    ('{' + HEAD + ', "bands": [{"family": "matmul", "decade": 9, "low": 0.9, "high": 1.1}]}',
     "'decade'"),
    ('{' + HEAD + ', "bands": [{"family": "matmul", "decade": 1, "low": 1.2, "high": 1.1}]}',
     "'low' <= 'high'"),
    ("not json", "not a readable JSON"),
])
def test_a_bad_bands_file_names_its_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / BANDS_NAME
    path.write_text(text)
    with pytest.raises(ConfigError, match=field):
        load_bands(path)


def _bands(tmp_path: Path, low: float = 0.9, high: float = 1.2) -> Path:
    """The shipped predictor in a folder of its own, with bands for every family."""
    shutil.copy(ARTIFACT, tmp_path / ARTIFACT.name)
    fams = ("matmul", "elementwise", "softmax", "layernorm", "conv")
    (tmp_path / BANDS_NAME).write_text(json.dumps({
        "schema": 1, "level": 0.8, "protocol": "test", "decade_edges_ms": DECADE_EDGES_MS,
        "bands": [{"family": f, "decade": 2, "low": low, "high": high, "rows": 10, "folds": 5}
                  for f in fams]}))
    return tmp_path / ARTIFACT.name


def test_only_scored_kernels_get_a_band(tmp_path: Path) -> None:
    bands = load_bands(_bands(tmp_path).parent / BANDS_NAME)
    # scored softmax, an untrained dtype, costed by a rule (no family); all at 0.5 ms
    fams = np.array(["softmax", "softmax", None], dtype=object)
    low, high = band_arrays(bands, fams, np.array([True, False, True]), np.full(3, 0.5))
    assert low[0] == 0.9 and high[0] == 1.2 and np.isnan(low[1:]).all()


def test_a_kernel_held_by_its_walk_loses_its_band() -> None:
    """A native max pool's walk (bound ``latency``) is a physical rule no fold scored."""
    pool = Kernel("p", ("p",), "MaxPool", OpCost("pooling", 9 << 20, 8 << 20, "float32",
                                                  native=NativePool(1 << 20, 9)))
    (held,) = hold_to_walk([Prediction(0.001, "memory", gpu_ms=0.001, fixed_ms=0.0,
                                       band=(0.9, 1.2))], [pool], load_device("h100"))
    assert held.bound == "latency" and held.band is None


MLP = """<ir_version: 8, opset_import: ["" : 17]>
mlp (float[64, 1024] x, float[1024, 4096] w) => (float[64, 4096] y) {
  h = MatMul (x, w)
  y = Softmax <axis = -1> (h)
}"""


def test_a_forecast_band_sums_its_kernels_bands(tmp_path: Path) -> None:
    """Every kernel of an fp32 MatMul + Softmax on a T4 has a band (0.9, 1.2), so the total
    spans 0.9x to 1.2x of the kernels it covers, and the rest as forecast."""
    model = onnx.parser.parse_model(MLP)
    f = tilecast.analyze(model, "t4", predictor=str(_bands(tmp_path)), runtime="graph")
    band = f.band
    assert band is not None and band.level == 0.8
    covered = sum(k.latency_ms for k in f.kernels if k.band is not None)
    assert covered == pytest.approx(band.covered_ms) and covered > 0
    rest = f.total_ms - covered
    assert band.low_ms == pytest.approx(rest + 0.9 * covered)
    assert band.high_ms == pytest.approx(rest + 1.2 * covered)
    assert "band       " in render_table(f)
    back = Forecast.from_json(f.to_json())  # kernel times were written to 6 digits
    assert back.band.level == 0.8 and back.kernels[0].band == f.kernels[0].band
    assert (back.band.low_ms, back.band.high_ms) == pytest.approx((band.low_ms, band.high_ms),
                                                                  rel=1e-5)


def test_bandless_kernels_stay_as_forecast() -> None:
    cost = OpCost("elementwise", 1, 8, "float32")
    k = Kernel("a", ("a",), "Add", cost)
    kernels = [KernelForecast(k, 1.0, "memory", band=(0.5, 2.0)),
               KernelForecast(k, 2.0, "overhead", band=(0.75, 1.5)),
               KernelForecast(k, 1.0, "memory")]  # no band: as forecast at both ends
    band = forecast_band(kernels, 0.8)
    # low 0.5 + 1.5 + 1 = 3, high 2 + 3 + 1 = 6, covered 1 + 2
    assert (band.low_ms, band.high_ms, band.covered_ms) == (3.0, 6.0, 3.0)
    assert forecast_band(kernels, None) is None


def test_bf16_tensor_core_kernels_have_no_band(tmp_path: Path) -> None:
    """No fold measured a 16-bit GEMM: its kernel is extrapolated, and the band covers none
    of it."""
    model = onnx.parser.parse_model(MLP.replace("float[", "bfloat16["))
    f = tilecast.analyze(model, "h100", predictor=str(_bands(tmp_path)), runtime="graph")
    mm = next(k for k in f.kernels if k.kernel.op_type == "MatMul")
    assert mm.extrapolated and mm.band is None


def test_a_predictor_without_bands_and_the_roofline_show_none(tmp_path: Path) -> None:
    shutil.copy(ARTIFACT, tmp_path / ARTIFACT.name)
    assert OnnxPredictor(tmp_path).band_level is None
    model = onnx.parser.parse_model(MLP)
    f = tilecast.analyze(model, "t4", predictor="roofline")
    assert f.band is None and f.to_dict()["band"] is None
    assert "band       " not in render_table(f)


def test_writing_bands_needs_the_folds(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["kernels-eval", "--data", str(tmp_path),
                                       "--write-bands", str(tmp_path / "b.json")])
    assert result.exit_code != 0
    assert "Error: --write-bands takes the leave-one-GPU-out folds" in result.output


def test_the_folds_bands_are_written_with_their_command(tmp_path: Path) -> None:
    from tilecast.learned.commands import _write_bands

    c = BandCollector()
    for _ in range(3):
        c.add(np.full(100, "matmul"), np.full(100, 2.0), np.full(100, 2.0))
    said: list[str] = []
    path = tmp_path / BANDS_NAME
    _write_bands(c, path, [Path("data")], 1, ("matmul",), said.append)
    bands = load_bands(path)
    assert [(b.family, b.decade, b.low, b.high) for b in bands.bands] == [("matmul", 3, 1, 1)]
    assert bands.protocol == ("tilecast kernels-eval --data data --cv logo --family matmul "
                              f"--write-bands {BANDS_NAME}")
    assert said == [f"wrote {path}: matmul[3] 1.00-1.00"]
