"""Image models built in plain torch (exporters/resnet.py, exporters/mobilenet.py).

The image size does not change a convolutional network's weights or op mix, so the exports
here run at 32 x 32 (seconds each)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

pytest.importorskip("torch", reason="exporters need torch: pip install 'tilecast[export]'")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

import tilecast  # noqa: E402
from tilecast.exporters import export_model, zoo_entry  # noqa: E402
from tilecast.exporters.mobilenet import LARGE_BLOCKS, make_divisible  # noqa: E402


def _small(name: str) -> dict:
    config = zoo_entry(name).config()
    return {**config, "image_size": 32}


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, int]:
    path = tmp_path_factory.mktemp("mobilenet") / "m.onnx"
    r = export_model(_small("mobilenet-v3-large"), batch=2, output=path)
    return onnx.load(str(path), load_external_data=False), r.parameters


def _groups(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def test_mobilenet_v3_large_has_the_papers_weights(mobilenet) -> None:
    # torchvision's MobileNet_V3_Large_Weights list 5,483,032 learnable parameters for the same
    # architecture (Howard et al. 2019, Table 1); the export's placeholders also hold each batch
    # norm's running mean and variance, two more per channel.
    proto, parameters = mobilenet
    inits = {t.name: t for t in proto.graph.initializer}
    bn_channels = sum(inits[n.input[1]].dims[0] for n in proto.graph.node
                      if n.op_type == "BatchNormalization")
    assert parameters - 2 * bn_channels == 5_483_032


def test_mobilenet_v3_large_op_mix(mobilenet) -> None:
    proto, _ = mobilenet
    counts = Counter(n.op_type for n in proto.graph.node)
    depthwise = [n for n in proto.graph.node if n.op_type == "Conv" and _groups(n) > 1]
    # One depthwise conv per bottleneck; SE in 8 of them (one hard-sigmoid gate each); an
    # identity shortcut wherever stride 1 keeps the channels (blocks 1, 3, 5, 6, 8-10, 12, 14,
    # 15 of Table 1).
    assert len(depthwise) == len(LARGE_BLOCKS) == 15
    assert counts["HardSigmoid"] == sum(b[3] for b in LARGE_BLOCKS) == 8
    assert counts["Add"] == 10
    assert counts["Gemm"] == 2  # the classifier: 960 -> 1280 -> 1000


@pytest.mark.parametrize(("channels", "want"), [
    (16 / 4, 8),     # never below the divisor
    (72 / 4, 24),    # 18 rounds to 16, under 90 % of 18, so one step up (Table 1's SE width)
    (120 / 4, 32),   # 30 -> 32
    (960 / 4, 240),  # already a multiple
])
def test_make_divisible(channels: float, want: int) -> None:
    assert make_divisible(channels) == want


def test_layers_keeps_the_first_bottlenecks(tmp_path: Path) -> None:
    r = export_model(_small("mobilenet-v3-large"), batch=1, layers=3,
                     output=tmp_path / "m3.onnx")
    proto = onnx.load(str(r.path), load_external_data=False)
    assert sum(n.op_type == "Conv" and _groups(n) > 1 for n in proto.graph.node) == 3


def test_mobilenet_forecast_is_complete(mobilenet, tmp_path: Path) -> None:
    proto, _ = mobilenet
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    f = tilecast.analyze(path, "t4")
    assert not f.incomplete and f.total_ms > 0
    # The 15 depthwise convs are costed (memory-bound rule) and labelled extrapolated: the conv
    # data has dense 3x3 convs only.
    depthwise = [k for k in f.kernels
                 if k.kernel.cost.conv is not None and k.kernel.cost.conv.groups > 1]
    assert len(depthwise) == 15 and all(k.extrapolated and k.latency_ms > 0 for k in depthwise)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet-50", "mobilenet-v3-large"])
def test_batch_1_newer_gpus_are_not_forecast_slower(model: str, tmp_path: Path) -> None:
    # Issue 10: at batch 1 neither an H100 nor an A100 is forecast more than 2 % slower than
    # an L4 or a T4 (the default eager runtime, 224 x 224 images).
    path = export_model(model, batch=1, output=tmp_path / "m.onnx").path
    totals = {d: tilecast.analyze(path, d).total_ms
              for d in ("t4", "l4", "a100-pcie-40gb", "a100-sxm4-80gb", "h100-sxm")}
    for fast in ("a100-pcie-40gb", "a100-sxm4-80gb", "h100-sxm"):
        assert totals[fast] <= 1.02 * min(totals["t4"], totals["l4"]), totals


def test_image_configs_are_recognized_without_a_seq(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_small("mobilenet-v3-large")))
    r = export_model(config, batch=1, output=tmp_path / "m.onnx")
    assert r.task == "image-classification" and r.inputs["pixel_values"] == (1, 3, 32, 32)
