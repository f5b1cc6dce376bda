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
    assert attention_for(_config(tmp_path, {"model_type": "llama"})) == "eager"


def test_built_in_attention_names_cannot_be_registered():
    with pytest.raises(ExportError, match="built in"):
        register_attention("eager", lambda *a, **k: None)


GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 32,
        "n_head": 4, "vocab_size": 128, "n_positions": 64}
BERT = {"model_type": "bert", "architectures": ["BertLMHeadModel"], "num_hidden_layers": 2,
        "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
        "vocab_size": 128, "max_position_embeddings": 64}


def _mask_operands(path: Path, op: str) -> list[list[tuple[str, tuple[int, ...]]]]:
    """(dtype, shape) of the broadcast operands of each ``op`` node that feeds a Softmax."""
    from tilecast.analyzer.graph import build_graph, load_model

    graph = build_graph(load_model(path))
    feeds = {t.name for n in graph.nodes if n.op_type == "Softmax" for t in n.inputs if t}
    out = []
    for n in graph.nodes:
        if n.op_type == op and n.outputs[0].name in feeds:
            out.append([(t.dtype, t.shape) for t in n.inputs
                        if t is not None and t.shape != n.outputs[0].shape])
    return out


def test_gpt2_exports_the_recorded_causal_where(tmp_path):
    # The CSVs: where(bias[:, :, :s, :s], scores, min) per layer on a [1, 1, s, s] bool buffer,
    # no padding mask; today's eager adds a float mask built once per model.
    config = _config(tmp_path, GPT2)
    path = from_hf_config(config, batch=2, seq=16, task="causal-lm", attn=attention_for(config),
                          path=tmp_path / "recorded.onnx")
    assert _mask_operands(path, "Where") == [
        [("bool", (1, 1, 16, 16)), ("float32", ())]] * GPT2["n_layer"]
    assert "And" not in _ops(path)


def test_bert_exports_the_recorded_padding_add(tmp_path):
    # The CSVs: add of the [b, 1, 1, s] extended mask per layer (today: a [b, 1, s, s] one).
    config = _config(tmp_path, BERT)
    path = from_hf_config(config, batch=2, seq=16, task="base", attn=attention_for(config),
                          path=tmp_path / "recorded.onnx")
    assert _mask_operands(path, "Add") == [[("float32", (2, 1, 1, 16))]] * 2
