"""Batch-1 CNN inference ranks GPUs the right way round under every runtime (issue 10: neither
an H100 nor an A100 is forecast more than 2 % slower than an L4 or a T4 on ResNet-50 or
MobileNetV3 at batch 1). Before stop 43 MobileNetV3 under ``--runtime graph`` took 1.40 ms on
the A100 SXM4 40GB against 1.31 on the T4: its tiny kernels paid a whole wave's per-wave cost
read from the device (docs/predictor.md, "Partly filled waves")."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="exporters need torch: pip install 'tilecast[export]'")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

import tilecast  # noqa: E402
from tilecast.exporters import export_model, zoo_entry  # noqa: E402

FAST = ("h100", "h100-pcie", "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb",
        "a100-pcie-80gb")
SLOW = ("l4", "t4")
SLACK = 1.02


@pytest.fixture(scope="module", params=("resnet-50", "mobilenet-v3-large"))
def batch1(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(request.param) / "m.onnx"
    export_model(zoo_entry(request.param).config(), batch=1, output=path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ("eager", "graph", "cudagraph"))
def test_newer_datacenter_gpus_are_not_slower_at_batch_1(batch1: Path, runtime: str) -> None:
    ms = {d: tilecast.analyze(batch1, d, runtime=runtime).total_ms for d in FAST + SLOW}
    for fast in FAST:
        for slow in SLOW:
            assert ms[fast] <= SLACK * ms[slow], (batch1.parent.name, runtime, fast, slow, ms)
