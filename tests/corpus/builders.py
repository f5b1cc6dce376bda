"""The corpus builders: one function per graph, writing it to the path it is given.

Every builder is deterministic (seeded) and uses a tiny config. The cache key of the corpus is a
hash of this file, so editing a builder rebuilds the corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 0
BATCH, SEQ = 2, 16  # example sizes for tracing; the graphs keep both symbolic
HEADS, HIDDEN = 4, 64
TEXT_AXES = {0: "batch", 1: "sequence"}


@dataclass(frozen=True)
class Spec:
    fn: Callable[..., None]
    deps: tuple[str, ...] = ()
    family: str = ""  # what the graph exercises (issue 11's list)
    bench_only: bool = False  # too large for the test suite: benchmarks only
    dims: tuple[str, ...] = ("batch", "sequence")  # the graph's symbolic input dims


def _torch() -> Any:
    import torch

    torch.manual_seed(SEED)
    return torch


def _hf_model(model_type: str, **overrides: Any) -> Any:
    import transformers

    _torch()
    sizes = {"bert": dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                          intermediate_size=4 * HIDDEN, vocab_size=1000,
                          max_position_embeddings=128),
             "gpt2": dict(n_embd=HIDDEN, n_layer=2, n_head=HEADS, vocab_size=1000, n_positions=128,
                          use_cache=False),
             "llama": dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                           num_key_value_heads=2, intermediate_size=176, vocab_size=1000,
                           max_position_embeddings=128, use_cache=False),
             "vit": dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                         intermediate_size=4 * HIDDEN, image_size=32, patch_size=8)}[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **{**sizes, **overrides})
    cfg.return_dict = False
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
    return model.eval()


def _text_inputs(names: tuple[str, ...]) -> tuple[Any, ...]:
    torch = _torch()
    ids = torch.randint(0, 1000, (BATCH, SEQ))
    made = {"input_ids": ids, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.int64),
            "token_type_ids": torch.zeros(BATCH, SEQ, dtype=torch.int64)}
    return tuple(made[n] for n in names)


BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _ByName:
    """Calls a Hugging Face model with keyword inputs and returns its first output: the legacy
    exporter passes inputs positionally, which transformers' forward wrappers reject."""

    def __new__(cls, model: Any, names: tuple[str, ...]) -> Any:
        torch = _torch()

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                out = self.model(**dict(zip(names, args, strict=True)))
                return out[0] if isinstance(out, (tuple, list)) else out

        return Wrapped().eval()


def _legacy(module: Any, args: tuple[Any, ...], names: tuple[str, ...], path: Path,
            axes: dict[int, str] | None = None, opset: int = 17) -> None:
    torch = _torch()
    if hasattr(module, "config"):
        module = _ByName(module, names)
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                          input_names=list(names), output_names=["output"],
                          dynamic_axes={n: axes or TEXT_AXES for n in names})


def _dynamo(module: Any, args: tuple[Any, ...], names: tuple[str, ...], path: Path,
            axes: dict[int, str] | None = None) -> None:
    torch = _torch()
    dims = {"batch": torch.export.Dim("batch", min=1, max=64),
            "sequence": torch.export.Dim("sequence", min=2, max=128)}
    shapes = tuple({i: dims[n] for i, n in (axes or TEXT_AXES).items()} for _ in names)
    with torch.no_grad():
        program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=shapes,
                                    input_names=list(names), verbose=False)
    program.save(str(path))


def bert_legacy(path: Path) -> None:
    _legacy(_hf_model("bert"), _text_inputs(BERT_INPUTS), BERT_INPUTS, path)


def bert_dynamo(path: Path) -> None:
    _dynamo(_hf_model("bert"), _text_inputs(BERT_INPUTS), BERT_INPUTS, path)


def bert_tilecast(path: Path) -> None:
    from tilecast.exporters import export_model

    cfg = _hf_model("bert").config.to_dict()
    export_model(cfg, batch=BATCH, seq=SEQ, task="base", output=path)


DECODER_INPUTS = ("input_ids", "attention_mask")  # a mask keeps transformers off aten::diff


def gpt2_legacy(path: Path) -> None:
    _legacy(_hf_model("gpt2"), _text_inputs(DECODER_INPUTS), DECODER_INPUTS, path)


def llama_dynamo(path: Path) -> None:
    _dynamo(_hf_model("llama"), _text_inputs(DECODER_INPUTS), DECODER_INPUTS, path)


def llama_legacy(path: Path) -> None:
    _legacy(_hf_model("llama"), _text_inputs(DECODER_INPUTS), DECODER_INPUTS, path)


PAST = 8  # past tokens for tracing; the graph keeps past_sequence_length symbolic
TOTAL = "past_sequence_length + sequence"  # optimum's name for the mask and present length


class _WithPast:
    """A causal LM taking its past key/values as flat inputs, as optimum's with-past decoders
    do: the Cache object is built inside forward, so the exporter sees plain tensors."""

    def __new__(cls, model: Any) -> Any:
        import transformers

        torch = _torch()
        layers = model.config.num_hidden_layers

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: Any, attention_mask: Any, *past: Any) -> Any:
                cache = transformers.DynamicCache(config=model.config)
                for i in range(layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 past_key_values=cache, use_cache=True, return_dict=True)
                present = [t for layer in out.past_key_values.layers
                           for t in (layer.keys, layer.values)]
                return (out.logits, *present)

        return Wrapped().eval()


def _with_past(model_type: str, path: Path) -> None:
    import transformers

    torch = _torch()
    cfg = _hf_model(model_type, use_cache=True).config
    cfg.return_dict = True
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or HEADS
    kv = [f"{i}.{t}" for i in range(cfg.num_hidden_layers) for t in ("key", "value")]
    names = ["input_ids", "attention_mask", *(f"past_key_values.{n}" for n in kv)]
    outputs = ["logits", *(f"present.{n}" for n in kv)]
    axes = {"input_ids": TEXT_AXES, "attention_mask": {0: "batch", 1: TOTAL},
            "logits": TEXT_AXES, **{n: {0: "batch", 2: "past_sequence_length"} for n in names[2:]},
            **{n: {0: "batch", 2: TOTAL} for n in outputs[1:]}}
    past = [torch.randn(BATCH, kv_heads, PAST, HIDDEN // HEADS) for _ in kv]
    args = (*_text_inputs(("input_ids",)), torch.ones(BATCH, PAST + SEQ, dtype=torch.int64), *past)
    with torch.no_grad():
        torch.onnx.export(_WithPast(model.eval()), args, str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=outputs, dynamic_axes=axes)


def gpt2_with_past(path: Path) -> None:
    _with_past("gpt2", path)


def llama_with_past(path: Path) -> None:
    _with_past("llama", path)


def vit_dynamo(path: Path) -> None:
    torch = _torch()
    _dynamo(_hf_model("vit"), (torch.randn(BATCH, 3, 32, 32),), ("pixel_values",), path,
            axes={0: "batch"})


def _ort_optimize(src: Path, path: Path, model_type: str, fp16: bool = False,
                  heads: int = HEADS, hidden: int = HIDDEN) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    # The optimizer fuses Attention only when told the head count and hidden size.
    opt = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden)
    if fp16:
        opt.convert_float_to_float16(keep_io_types=True)
    opt.save_model_to_file(str(path))


def bert_ort_opt(path: Path, src: Path) -> None:
    _ort_optimize(src, path, "bert")


def bert_ort_fp16(path: Path, src: Path) -> None:
    _ort_optimize(src, path, "bert", fp16=True)


def gpt2_ort_opt(path: Path, src: Path) -> None:
    _ort_optimize(src, path, "gpt2")


def gpt2_small_ort_opt(path: Path, src: Path) -> None:
    _ort_optimize(src, path, "gpt2", heads=12, hidden=768)  # GPT-2 small's config


def quant_dynamic(path: Path, src: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8)


def quant_dynamic_fused(path: Path, src: Path) -> None:
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # The quantizer needs every value typed; ORT's symbolic shape inference types the
    # com.microsoft ops of an optimized graph first, as ORT's quantization docs recommend.
    typed = SymbolicShapeInference.infer_shapes(onnx.load(str(src)), auto_merge=True)
    pre = path.with_suffix(".pre.onnx")
    onnx.save(typed, str(pre))
    quant_dynamic(path, pre)
    pre.unlink()


class _Calibration:
    """Random NCHW images for static quantization's calibration (a few batches)."""

    def __init__(self, name: str, shape: tuple[int, ...], batches: int = 4) -> None:
        import numpy as np

        rng = np.random.default_rng(SEED)
        self._data = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                           for _ in range(batches)])

    def get_next(self) -> dict[str, Any] | None:
        return next(self._data, None)


def cnn_qdq(path: Path, src: Path) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(src), str(path), _Calibration("input", (1, 3, 32, 32)),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)


def cnn_qoperator(path: Path, src: Path) -> None:
    """Static quantization in ONNX Runtime's operator format: QLinearConv, and com.microsoft's
    QLinearAdd, QLinearGlobalAveragePool, ... in place of the float ops."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # ORT's documented pre-processing step; without it this exporter's Conv biases trip the
    # operator-format quantizer.
    pre = path.with_suffix(".pre.onnx")
    quant_pre_process(str(src), str(pre))
    quantize_static(str(pre), str(path), _Calibration("input", (1, 3, 32, 32)),
                    quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    pre.unlink()


def cnn_ort_extended(path: Path, src: Path) -> None:
    """A model saved by an ONNX Runtime session at ORT_ENABLE_EXTENDED: Conv + Relu fused into
    com.microsoft FusedConv."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def _tiny_resnet() -> Any:
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), Block(16, 16, 1), Block(16, 32, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


def cnn_legacy(path: Path) -> None:
    torch = _torch()
    _legacy(_tiny_resnet(), (torch.randn(BATCH, 3, 32, 32),), ("input",), path,
            axes={0: "batch"})


def cnn_dynamo(path: Path) -> None:
    torch = _torch()
    _dynamo(_tiny_resnet(), (torch.randn(BATCH, 3, 32, 32),), ("input",), path,
            axes={0: "batch"})


def _rnn(kind: str) -> Any:
    torch = _torch()
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind]
    return cls(32, 64, num_layers=2, batch_first=True, bidirectional=True).eval()


def lstm_legacy(path: Path) -> None:
    torch = _torch()
    _legacy(_rnn("lstm"), (torch.randn(BATCH, SEQ, 32),), ("input",), path)


def gru_legacy(path: Path) -> None:
    torch = _torch()
    _legacy(_rnn("gru"), (torch.randn(BATCH, SEQ, 32),), ("input",), path)


def gpt2_small_inline(path: Path) -> None:
    """GPT-2 small (12 layers, hidden 768, 124 M parameters): ~500 MB of inline weights."""
    import transformers

    _torch()
    cfg = transformers.GPT2Config(use_cache=False, return_dict=False)
    model = transformers.GPT2Model(cfg).eval()
    _legacy(model, _text_inputs(DECODER_INPUTS), DECODER_INPUTS, path)


T5_INPUTS = ("input_ids", "attention_mask", "decoder_input_ids")


def t5_legacy(path: Path) -> None:
    """T5 encoder-decoder: relative-position buckets (a log of host-side distances, -inf on the
    diagonal) and a decoder that shares the ``sequence`` dim with the encoder."""
    import transformers

    _torch()
    cfg = transformers.T5Config(d_model=HIDDEN, d_ff=4 * HIDDEN, num_layers=2, num_heads=HEADS,
                                d_kv=HIDDEN // HEADS, vocab_size=1000, use_cache=False)
    ids, mask = _text_inputs(("input_ids", "attention_mask"))
    _legacy(transformers.T5Model(cfg).eval(), (ids, mask, ids), T5_INPUTS, path)


def wav2vec2_legacy(path: Path) -> None:
    """wav2vec2: a strided Conv1d feature encoder over raw audio and a grouped positional
    convolution (16 groups)."""
    import transformers

    torch = _torch()
    cfg = transformers.Wav2Vec2Config(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=16)
    model = transformers.Wav2Vec2Model(cfg).eval()
    _legacy(model, (torch.randn(BATCH, 1600),), ("input_values",), path)


IMAGE = ("batch",)
PAST_DIMS = ("batch", "sequence", "past_sequence_length")
CORPUS: dict[str, Spec] = {
    "bert_legacy": Spec(bert_legacy, family="torch.onnx legacy (unk__ dims)"),
    "bert_dynamo": Spec(bert_dynamo, family="torch.onnx dynamo (unnamed dims)"),
    "bert_tilecast": Spec(bert_tilecast, family="tilecast export (static shapes)", dims=()),
    "gpt2_legacy": Spec(gpt2_legacy, family="HF GPT-2, legacy"),
    "llama_legacy": Spec(llama_legacy, family="HF Llama, legacy"),
    "llama_dynamo": Spec(llama_dynamo, family="HF Llama, dynamo"),
    "gpt2_with_past": Spec(gpt2_with_past, family="optimum-style with-past decoder, GPT-2",
                           dims=PAST_DIMS),
    "llama_with_past": Spec(llama_with_past, family="optimum-style with-past decoder, Llama",
                            dims=PAST_DIMS),
    "vit_dynamo": Spec(vit_dynamo, family="HF ViT, dynamo", dims=IMAGE),
    "bert_ort_opt": Spec(bert_ort_opt, ("bert_legacy",), "ORT transformer optimizer"),
    "bert_ort_fp16": Spec(bert_ort_fp16, ("bert_legacy",), "ORT optimizer + fp16"),
    "gpt2_ort_opt": Spec(gpt2_ort_opt, ("gpt2_legacy",), "ORT optimizer, GPT-2"),
    "bert_qdynamic": Spec(quant_dynamic, ("bert_legacy",), "dynamic quantization"),
    "bert_ort_qdynamic": Spec(quant_dynamic_fused, ("bert_ort_opt",),
                              "dynamic quantization of fused ops (QAttention, QEmbedLayerNorm)"),
    "cnn_legacy": Spec(cnn_legacy, family="small ResNet-like CNN", dims=IMAGE),
    "cnn_dynamo": Spec(cnn_dynamo, family="small CNN, dynamo", dims=IMAGE),
    "cnn_qdq": Spec(cnn_qdq, ("cnn_legacy",), "QDQ static quantization", dims=IMAGE),
    "cnn_qoperator": Spec(cnn_qoperator, ("cnn_legacy",), "QOperator static quantization",
                          dims=IMAGE),
    "cnn_ort_extended": Spec(cnn_ort_extended, ("cnn_legacy",),
                             "ORT session optimizer (FusedConv)", dims=IMAGE),
    "lstm_legacy": Spec(lstm_legacy, family="LSTM"),
    "gru_legacy": Spec(gru_legacy, family="GRU"),
    "t5_legacy": Spec(t5_legacy, family="HF T5 encoder-decoder, legacy"),
    "wav2vec2_legacy": Spec(wav2vec2_legacy, family="HF wav2vec2: Conv1d over audio, legacy"),
    "gpt2_small_inline": Spec(gpt2_small_inline, family="large inline weights", bench_only=True),
    "gpt2_small_ort_opt": Spec(gpt2_small_ort_opt, ("gpt2_small_inline",),
                               "ORT optimizer, large inline weights", bench_only=True),
}
