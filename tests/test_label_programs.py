"""The evaluation exports the program its labels measured (``evaluation/label_programs``)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

pytest.importorskip("torch", reason="exporters need torch: pip install 'tilecast[export]'")
pytest.importorskip("transformers", reason="exporters need transformers: pip install "
                                           "'tilecast[export]'")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

from tilecast.errors import ExportError  # noqa: E402
from tilecast.evaluation.label_programs import OPT_ATTENTION, attention_for  # noqa: E402
from tilecast.exporters import from_hf_config, register_attention  # noqa: E402

OPT = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "num_hidden_layers": 2,
       "hidden_size": 32, "ffn_dim": 64, "num_attention_heads": 4, "vocab_size": 128,
       "max_position_embeddings": 64, "word_embed_proj_dim": 32, "do_layer_norm_before": True}


def _config(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_opt_exports_the_recorded_attention(tmp_path):
    config = _config(tmp_path, OPT)
    attn = attention_for(config)
    assert attn == OPT_ATTENTION
    recorded = _ops(from_hf_config(config, batch=2, seq=16, task="causal-lm", attn=attn,
                                   path=tmp_path / "recorded.onnx"))
    today = _ops(from_hf_config(config, batch=2, seq=16, task="causal-lm",
                                path=tmp_path / "eager.onnx"))
    # The labels' FX graphs clamp the masked scores at the dtype's minimum (max_1), once a
    # layer; today's eager attention does not, and instead scales the scores by 1.0.
    assert recorded.count("Max") == OPT["num_hidden_layers"] and "Max" not in today
    assert recorded.count("Softmax") == today.count("Softmax") == OPT["num_hidden_layers"]
    assert recorded.count("Mul") < today.count("Mul")


def test_other_models_export_with_eager_attention(tmp_path):
    assert attention_for(_config(tmp_path, {"model_type": "gpt2"})) == "eager"


def test_built_in_attention_names_cannot_be_registered():
    with pytest.raises(ExportError, match="built in"):
        register_attention("eager", lambda *a, **k: None)
