from __future__ import annotations

from pathlib import Path

import onnx
import onnx.parser
import pytest
from graph_texts import BATCH_MLP

from tilecast.analyzer.synthetic import gpt2_like, small_cnn

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO.parent / "shared" / "datasets" / "neusight-asplos25"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/*.json from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def dataset_dir() -> Path:
    if not DATASET.is_dir():
        pytest.skip(f"shared dataset not found at {DATASET} (it lives beside the checkout)")
    return DATASET


@pytest.fixture(scope="session")
def gpt2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "gpt2.onnx"
    onnx.save(gpt2_like(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=1000), path)
    return path


@pytest.fixture(scope="session")
def cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "cnn.onnx"
    onnx.save(small_cnn(), path)
    return path


@pytest.fixture
def batch_mlp(tmp_path: Path):
    """Save BATCH_MLP under ``name`` in a fresh folder; returns its path."""
    def save(name: str = "mlp.onnx") -> Path:
        path = tmp_path / name
        onnx.save(onnx.parser.parse_model(BATCH_MLP), path)
        return path
    return save
