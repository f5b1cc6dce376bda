"""Training labels pass by pass (``evaluation/passes.py``)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tilecast.errors import ConfigError
from tilecast.evaluation.passes import PassRun, evaluate_passes, load_paper_passes

TRAINABLE = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[8, 16] x) => (float[8, 16] y) <float[16, 16] w = {0.0}> {
    y = MatMul(x, w)
}
"""
HEADER = ("model_name,seqlen,batch,device,mode,option,label_all_e2e_latency,"
          "neusight_all_fw_latency,neusight_all_bwall_latency")


def _summary(folder: Path, *rows: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.csv").write_text("\n".join((HEADER, *rows)) + "\n")
    return folder


def test_paper_passes_are_the_training_rows(tmp_path):
    folder = _summary(tmp_path / "published", "tiny,2,8,NVIDIA_L4,train,,3.0,1.5,2.5",
                      "tiny,2,8,NVIDIA_L4,inf,,1.0,1.1,",  # inference: no passes
                      "tiny,2,4,NVIDIA_L4,train,,3.0,,")  # no NeuSight forecast
    assert load_paper_passes(folder) == {("NVIDIA_L4", "tiny", 8, 2): (1.5, 2.5)}
    assert load_paper_passes(tmp_path / "nowhere") == {}


def test_paper_passes_name_the_missing_column_and_the_bad_line(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.csv").write_text("model_name,seqlen\ntiny,2\n")
    with pytest.raises(ConfigError, match="missing column.*batch"):
        load_paper_passes(tmp_path / "a")
    with pytest.raises(ConfigError, match="line 2"):
        load_paper_passes(_summary(tmp_path / "b", "tiny,2,eight,NVIDIA_L4,train,,3,1,2"))


def test_error_pct_is_signed_per_pass():
    run = PassRun("NVIDIA_L4", "tiny", 8, 2, measured_fw_ms=2.0, measured_bw_ms=4.0,
                  predicted_fw_ms=1.0, predicted_bw_ms=5.0, paper_fw_ms=3.0, paper_bw_ms=None)
    assert run.error_pct("fw") == (pytest.approx(-50.0), pytest.approx(50.0))
    assert run.error_pct("bw") == (pytest.approx(25.0), None)


@pytest.fixture
def labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    gpu = tmp_path / "labels" / "NVIDIA_L4"
    gpu.mkdir(parents=True)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.json").write_text('{"model_type": "gpt2"}')
    (gpu / "tiny-train-2-8.json").write_text(
        '{"e2e_latency": 0.5, "fw_latency": 0.2, "bwall_latency": 0.3}')
    (gpu / "tiny-inf-2-8.json").write_text('{"e2e_latency": 0.1}')  # not a training run
    (gpu / "tiny-train-2-4.json").write_text('{"e2e_latency": 0.5}')  # no passes recorded

    def fake_export(config, *, output, **kwargs):
        onnx.save(onnx.parser.parse_model(TRAINABLE), output)

    monkeypatch.setattr("tilecast.exporters.export_model", fake_export)
    _summary(tmp_path / "published", "tiny,2,8,NVIDIA_L4,train,,0.5,0.25,0.35")
    return tmp_path / "labels"


def test_each_training_label_with_both_passes_is_forecast_pass_by_pass(labels, tmp_path):
    runs = evaluate_passes(labels, published_dir=tmp_path / "published",
                           predictor="roofline", cache_dir=tmp_path / "cache")
    assert [(r.model, r.batch) for r in runs] == [("tiny", 8)]
    run = runs[0]
    assert (run.measured_fw_ms, run.measured_bw_ms) == (0.2, 0.3)
    assert (run.paper_fw_ms, run.paper_bw_ms) == (0.25, 0.35)
    # the forward is the MatMul; the backward its weight gradient (and the .grad add)
    assert 0 < run.predicted_fw_ms < run.predicted_bw_ms
