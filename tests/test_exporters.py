"""Exporters: tiny Hugging Face / torch models to weightless, shape-complete ONNX graphs.

Every export here is a 1-2 layer model with small hidden sizes (seconds each); real-size
exports (the zoo, the NeuSight configs as they are) are marked slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytest.importorskip("torch", reason="exporters need torch: pip install 'tilecast[export]'")
pytest.importorskip("transformers", reason="exporters need transformers: pip install "
                                           "'tilecast[export]'")
pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")

from click.testing import CliRunner  # noqa: E402

from tilecast.cli import main  # noqa: E402
from tilecast.errors import ExportError  # noqa: E402
from tilecast.exporters import export_model, from_hf_config, from_torch, list_zoo  # noqa: E402
from tilecast.exporters._graph import WEIGHTS_LOCATION, check_shapes, write_atomic  # noqa: E402

B, S = 2, 16
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64,
        "n_head": 4, "vocab_size": 256, "n_positions": 64}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
         "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}
SWITCH = {"model_type": "switch_transformers", "d_model": 32, "d_ff": 64, "d_kv": 8,
          "num_heads": 4, "num_layers": 1, "num_decoder_layers": 1, "num_experts": 4,
          "num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1, "expert_capacity": 6,
          "vocab_size": 128, "architectures": ["SwitchTransformersForConditionalGeneration"]}
# Top-k experts as transformers' 3-D expert collections (Mixtral): 4 experts, 2 per token.
MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
           "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 96,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
           "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 64}
# DeepSeek-V3's shape in miniature: MLA attention (low-rank Q and KV, a rotary part written
# into each head), the first layer dense, then 8 routed experts (top-2) beside a shared one.
DEEPSEEK = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
            "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 4,
            "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
            "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "vocab_size": 256,
            "max_position_embeddings": 64, "q_lora_rank": 32, "kv_lora_rank": 16,
            "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
            "rope_scaling": None}
NEUSIGHT = ("bert_large", "gpt2_large", "gpt3_xl", "gpt3_27", "opt_13", "switchxl4")


def load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """name -> static shape for every value and initializer."""
    out = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    for v in (*proto.graph.value_info, *proto.graph.input, *proto.graph.output):
        out[v.name] = tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
    return out


def elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    out = {t.name: t.data_type for t in proto.graph.initializer}
    for v in (*proto.graph.value_info, *proto.graph.input, *proto.graph.output):
        out[v.name] = v.type.tensor_type.elem_type
    return out


def ops(proto: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in proto.graph.node]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory):
    """Export each tiny variant once, on first use."""
    folder = tmp_path_factory.mktemp("exports")
    cache: dict[str, Path] = {}

    def get(name: str, config: dict, **kw) -> onnx.ModelProto:
        if name not in cache:
            cache[name] = from_hf_config(config, batch=B, seq=S, path=folder / f"{name}.onnx",
                                         **kw)
        return load(cache[name])

    get.folder = folder
    return get


def test_gpt2_projection_shapes_follow_the_config(exports):
    proto = exports("gpt2", GPT2)
    h, shp = GPT2["n_embd"], shapes(proto)
    gemms = {n.input[1]: (shp[n.input[0]], shp[n.input[1]]) for n in proto.graph.node
             if n.op_type in ("Gemm", "MatMul") and n.input[1] in shp}
    # GPT-2's Conv1D is addmm: (B*S, H) x (H, 3H) for QKV, (B*S, 4H) x (4H, H) for mlp.c_proj.
    for layer in range(GPT2["n_layer"]):
        assert gemms[f"transformer.h.{layer}.attn.c_attn.weight"] == ((B * S, h), (h, 3 * h))
        assert gemms[f"transformer.h.{layer}.mlp.c_proj.weight"] == ((B * S, 4 * h), (4 * h, h))
    softmaxes = [shp[n.output[0]] for n in proto.graph.node if n.op_type == "Softmax"]
    assert softmaxes == [(B, GPT2["n_head"], S, S)] * GPT2["n_layer"]
    assert shp[proto.graph.output[0].name] == (B, S, GPT2["vocab_size"])


def test_initializers_are_placeholders_and_no_data_file_exists(exports):
    proto = exports("gpt2", GPT2)
    inits = {t.name: t for t in proto.graph.initializer}
    qkv = inits["transformer.h.0.attn.c_attn.weight"]
    assert qkv.data_type == onnx.TensorProto.FLOAT and list(qkv.dims) == [64, 192]
    assert qkv.data_location == onnx.TensorProto.EXTERNAL and not qkv.raw_data
    entries = {e.key: e.value for e in qkv.external_data}
    assert entries["location"] == WEIGHTS_LOCATION and int(entries["length"]) == 64 * 192 * 4
    weights = [t for t in inits.values() if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(weights) >= 12 * GPT2["n_layer"]  # every parameter is declared
    assert all(p.suffix == ".onnx" for p in exports.folder.iterdir())  # no data, no temp file
    assert not (exports.folder / WEIGHTS_LOCATION).exists()
    check_shapes(proto)  # every node output has a complete static shape


@pytest.mark.parametrize("dtype, onnx_type", [("float16", onnx.TensorProto.FLOAT16),
                                              ("bfloat16", onnx.TensorProto.BFLOAT16)])
def test_dtype_propagates_to_weights_and_activations(exports, dtype, onnx_type):
    proto = exports(f"llama-{dtype}", LLAMA, dtype=dtype)
    types = elem_types(proto)
    assert types["model.layers.0.self_attn.q_proj.weight"] == onnx_type
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul"]
    assert matmuls and all(types[n.output[0]] == onnx_type for n in matmuls)
    assert types[proto.graph.output[0].name] == onnx_type
    assert types["input_ids"] == onnx.TensorProto.INT64


def test_llama_grouped_query_projections(exports):
    proto = exports("llama-float16", LLAMA, dtype="float16")
    shp, h = shapes(proto), LLAMA["hidden_size"]
    kv = LLAMA["num_key_value_heads"] * h // LLAMA["num_attention_heads"]
    assert shp["model.layers.0.self_attn.q_proj.weight"] == (h, h)  # stored (in, out)
    assert shp["model.layers.0.self_attn.k_proj.weight"] == (h, kv)
    assert shp["model.layers.0.mlp.gate_proj.weight"] == (h, LLAMA["intermediate_size"])
    # nn.Linear's weight transpose is folded into the stored weight: no Transpose kernel.
    assert not [n for n in proto.graph.node
                if n.op_type == "Transpose" and n.input[0].endswith("_proj.weight")]


def test_eager_and_sdpa_attention_node_sets_differ(exports):
    eager, sdpa = exports("gpt2", GPT2), exports("gpt2-sdpa", GPT2, attn="sdpa")
    assert ops(eager).count("Softmax") == GPT2["n_layer"] and "Attention" not in ops(eager)
    assert ops(sdpa).count("Attention") == GPT2["n_layer"] and "Softmax" not in ops(sdpa)
    node = next(n for n in sdpa.graph.node if n.op_type == "Attention")
    assert shapes(sdpa)[node.input[0]] == (B, GPT2["n_head"], S, GPT2["n_embd"] // 4)
    gqa = exports("llama-bfloat16-sdpa", LLAMA, dtype="bfloat16", attn="sdpa")
    assert ops(gqa).count("Attention") == 1


def test_switch_experts_are_padded_to_capacity(exports):
    proto = exports("switch", SWITCH)
    shp = shapes(proto)
    expert_in = {shp[n.input[0]] for n in proto.graph.node if n.op_type in ("Gemm", "MatMul")
                 and ".experts.expert_" in n.input[1] and n.input[1].endswith("wi.weight")}
    # capacity 6 slots per sequence and expert: every expert runs on (batch * 6, d_model).
    assert expert_in == {(B * SWITCH["expert_capacity"], SWITCH["d_model"])}
    assert {"NonZero", "Loop", "If"}.isdisjoint(ops(proto))
    assert [i.name for i in proto.graph.input] == ["input_ids", "attention_mask",
                                                  "decoder_input_ids"]


def test_switch_moe_layers_are_recognized_for_expert_parallelism(exports):
    from tilecast.parallel import Layout, analyze_parallel
    from tilecast.parallel.api import _graph
    from tilecast.parallel.experts import recognize_experts
    from tilecast.parallel.structure import recognize

    proto = exports("switch", SWITCH)
    _, _, results = _graph(proto, None)
    groups = recognize_experts(results, recognize(results))
    # one sparse encoder and one sparse decoder layer, 4 experts each, (4, B * 6, d_model)
    assert [g.experts for g in groups] == [4, 4]
    assert {g.dispatch_bytes for g in groups} == {4 * B * 6 * SWITCH["d_model"] * 4}
    f = analyze_parallel(proto, Layout(dp=4, ep=4), cluster="dgx-a100", predictor="roofline")
    assert sum(c.count for c in f.collectives if c.op == "all-to-all") == 2 * 2 * 2


def test_topk_experts_get_static_capacity_and_a_weight_each(exports):
    from tilecast.parallel.api import _graph
    from tilecast.parallel.experts import recognize_experts
    from tilecast.parallel.structure import recognize

    proto = exports("mixtral", MIXTRAL)
    assert {"NonZero", "Loop", "If"}.isdisjoint(ops(proto))
    weights = [i for i in proto.graph.initializer if ".experts." in i.name]
    # gate_up (2 x 96, 64) and down (64, 96) per expert, each its own 2-D parameter
    assert sorted(tuple(w.dims) for w in weights) == [(64, 96)] * 4 + [(192, 64)] * 4
    _, _, results = _graph(proto, None)
    (group,) = recognize_experts(results, recognize(results))
    # capacity = ceil(tokens x top_k / experts) = 2 x 16 x 2 / 4 = 16 slots per expert
    assert group.experts == 4
    assert group.dispatch_bytes == 4 * 16 * MIXTRAL["hidden_size"] * 4
    expert_flops = sum(r.cost.flops for r in results if r.cost is not None
                       and r.cost.family == "matmul" and any(
                           t is not None and ".experts." in t.name for t in r.node.inputs))
    # every token's two choices through 64 -> 192 and 96 -> 64: 2 FLOPs per multiply-add
    assert expert_flops == 2 * (B * S * 2) * (64 * 192 + 96 * 64)
    # context parallelism passes K and V as projected, 2 KV heads of 16, not repeated to 4
    from tilecast.parallel.context import attention_exchanges

    (ring,) = attention_exchanges(results, recognize(results), 2, "ring")
    assert ring.kv_bytes == 2 * B * S * (2 * 16) * 4


def test_topk_experts_at_decode_run_only_one_expert_per_choice(exports):
    # one token, top-2 of 4 experts: two experts run, one slot each (not all four)
    path = from_hf_config(MIXTRAL, batch=1, seq=1, path=exports.folder / "mixtral-1.onnx")
    proto = load(path)
    weights = sorted(tuple(i.dims) for i in proto.graph.initializer if ".experts." in i.name)
    assert weights == [(64, 96)] * 2 + [(192, 64)] * 2
    expert_inputs = [shapes(proto)[n.input[0]] for n in proto.graph.node
                     if n.op_type in ("Gemm", "MatMul") and ".experts." in n.input[1]]
    assert sorted(expert_inputs) == [(1, 64)] * 2 + [(1, 96)] * 2  # up and down, 1 row each


def test_deepseek_layers_and_experts_are_recognized(exports):
    from tilecast.parallel import Layout, analyze_parallel
    from tilecast.parallel.api import _graph
    from tilecast.parallel.experts import recognize_experts
    from tilecast.parallel.structure import recognize

    proto = exports("deepseek", DEEPSEEK)
    assert {"NonZero", "Loop", "If"}.isdisjoint(ops(proto))
    _, _, results = _graph(proto, None)
    s = recognize(results)
    assert s.layers == 2 and not s.warnings
    (group,) = recognize_experts(results, s)  # the second layer's routed experts
    assert group.experts == 8
    f = analyze_parallel(proto, Layout(dp=2, tp=2, ep=2), cluster="dgx-h100",
                         predictor="roofline")
    assert {c.group for c in f.collectives} >= {"tp", "ep", "dp"}


def test_from_torch_meta_module_with_dynamic_batch(tmp_path):
    import torch

    with torch.device("meta"):
        module = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                     torch.nn.Linear(32, 4))
    path = from_torch(module, (torch.zeros(3, 8),), tmp_path / "mlp.onnx",
                      dynamic_dims={"input": {0: "batch"}})
    proto = load(path)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 8
    # A 2-D Linear is Gemm(transB=1): the weight keeps torch's (out, in) layout.
    assert {t.name: list(t.dims) for t in proto.graph.initializer}["0.weight"] == [32, 8]
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    assert any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
    check_shapes(proto, static=False)


def test_task_auto_follows_architectures_and_bert_gets_a_mask(tmp_path):
    bert = {"model_type": "bert", "architectures": ["BertLMHeadModel"], "hidden_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
            "vocab_size": 128, "max_position_embeddings": 32}
    r = export_model(bert, batch=1, seq=8, task="masked-lm", output=tmp_path / "b.onnx")
    assert r.architecture == "BertForMaskedLM" and r.task == "masked-lm"
    assert set(r.inputs) == {"input_ids", "attention_mask"}
    import transformers

    from tilecast.exporters.hf import build_config, resolve_task

    assert resolve_task(build_config(bert, transformers), "auto", transformers)[0] == "causal-lm"


def test_import_tilecast_does_not_import_torch():
    code = ("import sys, tilecast, tilecast.exporters, tilecast.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'onnxscript')]; print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_missing_torch_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ExportError, match=r'pip install "tilecast\[export\]"'):
        export_model(GPT2, batch=1, seq=8, output=tmp_path / "x.onnx")
    assert not list(tmp_path.iterdir())


def test_write_atomic_leaves_nothing_on_failure(monkeypatch, tmp_path):
    def boom(*_args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        write_atomic(b"x" * 100, tmp_path / "m.onnx")
    assert not list(tmp_path.iterdir())


def test_zoo_lists_every_required_model():
    names = {e.name for e in list_zoo()}
    assert {"bert-large", "gpt2-large", "gpt3-xl", "gpt3-2.7b", "opt-1.3b", "switch-xl-4",
            "llama-3-8b", "vit-base", "resnet-50"} <= names
    assert all(e.description and e.batch > 0 for e in list_zoo())
    llama = json.loads(next(e for e in list_zoo() if e.name == "llama-3-8b").path.read_text())
    assert (llama["num_key_value_heads"], llama["intermediate_size"]) == (8, 14336)


@pytest.mark.parametrize("name", NEUSIGHT)
def test_neusight_configs_resolve(dataset_dir, name):
    import transformers

    from tilecast.exporters.hf import build_config, load_config, resolve_task

    cfg = build_config(load_config(dataset_dir / "models" / f"{name}.json"), transformers)
    task, _ = resolve_task(cfg, "auto", transformers)
    assert task == ("seq2seq" if name == "switchxl4" else "causal-lm")


# --- CLI ---------------------------------------------------------------------------------


def run(*args: str):
    return CliRunner().invoke(main, ["export", *args])


def one_error_line(result, folder: Path, needle: str) -> None:
    assert result.exit_code != 0
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and needle in errors[0], result.output
    assert "Traceback" not in result.output
    assert not [p for p in folder.iterdir() if p.suffix in (".onnx", ".tmp")]


def test_cli_list_and_export(tmp_path):
    r = run("--list")
    assert r.exit_code == 0 and "llama-3-8b" in r.output and "resnet-50" in r.output
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({**GPT2, "n_layer": 1}))
    out = tmp_path / "tiny.onnx"
    r = run(str(config), "--batch", "1", "--seq", "8", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "building" in r.output and "wrote" in r.output
    assert shapes(load(out))["input_ids"] == (1, 8)


@pytest.mark.parametrize("args, needle", [
    (("gpt3-2.8b",), "did you mean gpt3-2.7b"),
    (("gpt3-2.7b", "--batch", "0"), "batch must be a positive integer"),
    (("gpt3-2.7b", "--seq", "-4"), "seq must be a positive integer"),
    (("gpt3-2.7b", "--seq", "4096"), "exceeds the model's n_positions"),
    (("gpt2-large", "--task", "seq2seq"), "task 'seq2seq' is not supported by model_type"),
    (("missing.json", "--batch", "1", "--seq", "8"), "config file not found"),
])
def test_cli_bad_input(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    one_error_line(run(*args, "-o", str(tmp_path / "m.onnx")), tmp_path, needle)


@pytest.mark.parametrize("config, needle", [
    ({"n_layer": 1}, "no 'model_type' key"),
    ({"model_type": "gpt2", "n_embd": "wide"}, "config key 'n_embd'"),
    ({"model_type": "not-a-model"}, "config key 'model_type'"),
    ({"model_type": "gpt2", "n_embd": 30, "n_head": 4}, "transformers cannot build"),
])
def test_cli_bad_config(tmp_path, config, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    one_error_line(run(str(path), "--batch", "1", "--seq", "8", "-o", str(tmp_path / "m.onnx")),
                   tmp_path, needle)


# --- real sizes (slow) -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", NEUSIGHT)
def test_neusight_configs_export_as_they_are(dataset_dir, tmp_path, name):
    task = "seq2seq" if name == "switchxl4" else "auto"
    r = export_model(str(dataset_dir / "models" / f"{name}.json"), batch=1, seq=512, task=task,
                     output=tmp_path / "m.onnx")
    assert r.file_bytes < 20e6 and r.parameters > 3e8
    check_shapes(load(r.path))


@pytest.mark.slow
@pytest.mark.parametrize("entry", [e.name for e in list_zoo()])
def test_zoo_exports_and_analyzes(tmp_path, entry):
    import tilecast

    r = export_model(entry, output=tmp_path / f"{entry}.onnx")
    forecast = tilecast.analyze(r.path, "l4")
    assert forecast.total_ms > 0 and not forecast.unsupported, forecast.unsupported


def test_train_mode_keeps_dropout_for_training_forecasts(tmp_path):
    import tilecast

    paths = {}
    for train in (False, True):
        paths[train] = tmp_path / f"gpt2-{train}.onnx"
        export_model(GPT2, batch=B, seq=S, task="causal-lm", output=paths[train],
                     train_mode=train)
    assert "Dropout" not in ops(load(paths[False]))
    # GPT-2 drops out after the embeddings, on attention probabilities, after the attention
    # projection and after the MLP: 1 + 3 per layer
    assert ops(load(paths[True])).count("Dropout") == 1 + 3 * GPT2["n_layer"]
    f = tilecast.analyze(paths[True], "l4", mode="training", predictor="roofline")
    assert f.unsupported == {} and any(k.kernel.op_type == "DropoutGrad" for k in f.kernels)
