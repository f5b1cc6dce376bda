"""The exporter corpus (tests/corpus): every graph analyzes as its exporter wrote it, with only
the graph's input dims bound, on L4 and H100, with no unsupported or unshaped op.

The graphs are built on the fly (torch 2.13 CPU, transformers from configs, onnxruntime's
optimizer and quantizers) and cached across sessions under ~/.cache/tilecast/corpus.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import corpus  # noqa: E402  (tests/corpus, after the skips: building needs torch)

import tilecast  # noqa: E402

TESTED = [n for n in corpus.NAMES if not corpus.builders.CORPUS[n].bench_only]


def forecast(name: str, device: str = "l4") -> tilecast.Forecast:
    return tilecast.analyze(corpus.build(name), device, dims=corpus.dims_of(name))


@pytest.mark.parametrize("device", ["l4", "h100"])
@pytest.mark.parametrize("name", TESTED)
def test_analyzes_as_exported(name, device):
    path = corpus.build(name)  # exporters warn; analyzing must not
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = tilecast.analyze(path, device, dims=corpus.dims_of(name))
    assert f.total_ms > 0
    assert (dict(f.unsupported), dict(f.unshaped), f.incomplete) == ({}, {}, False)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_every_exporter_kind_is_in_the_corpus():
    # each family of issue 11 has a graph: the fused and quantized ops included
    ops = {op for n in TESTED for op in corpus.op_types(n)}
    assert {"com.microsoft::EmbedLayerNormalization", "com.microsoft::Attention",
            "com.microsoft::SkipLayerNormalization", "com.microsoft::QAttention",
            "com.microsoft::QEmbedLayerNormalization", "MatMulInteger", "QuantizeLinear",
            "DequantizeLinear", "LSTM", "GRU", "Conv", "QLinearConv", "com.microsoft::QLinearAdd",
            "com.microsoft::QLinearGlobalAveragePool", "com.microsoft::QGemm",
            "com.microsoft::FusedConv"} <= ops
    assert any(op.startswith("com.microsoft::FastGelu") or op.endswith("BiasGelu") for op in ops)


def test_anonymous_and_unnamed_dims_are_present_as_exported():
    # the corpus does exercise both kinds of exporter value_info that tilecast discards
    assert corpus.anonymous_dims("bert_qdynamic")["unk"] > 0
    assert corpus.anonymous_dims("bert_dynamo")["unnamed"] > 0


@pytest.mark.parametrize("name", ["gpt2_with_past", "llama_with_past"])
def test_decode_step_forecasts_faster_than_prefill(name):
    # one new token over 127 cached ones reads the same weights as a 128-token prefill with no
    # past but does 1/128 of its matrix work: it must not forecast slower
    def ms(sequence, past):
        dims = {"batch": 1, "sequence": sequence, "past_sequence_length": past}
        return tilecast.analyze(corpus.build(name), "l4", dims=dims).total_ms

    assert ms(1, 127) < ms(128, 0)


# batch 2, 4 heads of 16 (hidden 64), 16 new tokens: each (batch, head) sees 16 * 17 / 2 = 136
# pairs, with 16 cached positions 16 * 16 + 136 = 392; 2 * 16 * 2 + 6 FLOPs per pair
@pytest.mark.parametrize(("name", "pairs"), [
    ("gpt2_legacy", 136), ("llama_legacy", 136), ("llama_dynamo", 136),
    ("gpt2_with_past", 392), ("llama_with_past", 392)])
def test_graph_runtime_reads_each_exporters_causal_mask(name, pairs):
    # the mask is the band and'ed with the attention_mask input's padding: the fused kernel
    # computes the band's pairs, as an is_causal kernel does (analyzer/causal.py)
    f = tilecast.analyze(corpus.build(name), "a100-sxm4-80gb", dims=corpus.dims_of(name),
                         runtime="graph", predictor="roofline")
    flops = [k.kernel.cost.flops for k in f.kernels if k.kernel.op_type == "Attention"]
    assert flops == [2 * 4 * pairs * (2 * 16 * 2 + 6)] * 2  # one per layer


def test_graph_runtime_reads_t5s_biased_causal_mask():
    # T5's decoder fills its position bias outside the band: its two self-attentions are
    # causal and read the bias (one more FLOP per score); the encoder's and the cross
    # attentions see every pair
    f = tilecast.analyze(corpus.build("t5_legacy"), "a100-sxm4-80gb",
                         dims=corpus.dims_of("t5_legacy"), runtime="graph", predictor="roofline")
    att = [k.kernel.cost for k in f.kernels if k.kernel.op_type == "Attention"]
    assert sorted((c.matmul.causal, c.flops) for c in att) == \
        [(False, 2 * 4 * 256 * (64 + 6 + 1))] * 4 + [(True, 2 * 4 * 136 * (64 + 6 + 1))] * 2


SAME_MODEL = {
    "bert": ("bert_legacy", "bert_dynamo", "bert_tilecast", "bert_ort_opt", "bert_ort_fp16",
             "bert_qdynamic", "bert_ort_qdynamic"),
    "gpt2": ("gpt2_legacy", "gpt2_ort_opt"),
    "llama": ("llama_legacy", "llama_dynamo"),
    "cnn": ("cnn_legacy", "cnn_dynamo", "cnn_qdq"),
}


@pytest.mark.parametrize("model", sorted(SAME_MODEL))
def test_same_model_has_the_same_matrix_work_from_every_exporter(model):
    # Derived shapes are right whatever the exporter: the matmul + attention + conv FLOPs of
    # one model agree. Within 1 %: bias adds ride in a Gemm / fused epilogue or not, and a
    # BatchNorm is folded into the conv bias by one exporter and not by another.
    flops = {n: sum(k.kernel.flops for k in forecast(n).kernels
                    if k.kernel.family in ("matmul", "attention", "conv"))
             for n in SAME_MODEL[model]}
    assert max(flops.values()) <= 1.01 * min(flops.values()), flops


def test_same_bert_from_three_exporters_agrees():
    # torch.onnx legacy, torch.onnx dynamo and tilecast export of one BERT config (2x16 tokens)
    ms = {n: forecast(n).total_ms for n in ("bert_legacy", "bert_dynamo", "bert_tilecast")}
    assert max(ms.values()) <= 1.10 * min(ms.values()), ms


def test_qdq_int8_forecasts_faster_than_fp32():
    # At batch 1024 the convs dominate and int8 wins (2.30 vs 4.34 ms on L4). Up to batch 256
    # this 16x16 toy CNN is host-dispatch bound in eager mode (each conv is a cuDNN call, in
    # int8 as in fp32), and the QDQ graph's activation QuantizeLinear kernels make it slower
    # (1.35 vs 1.25 ms at 256), as in PyTorch.
    dims = {"batch": 1024}
    q = tilecast.analyze(corpus.build("cnn_qdq"), "l4", dims=dims)
    f = tilecast.analyze(corpus.build("cnn_legacy"), "l4", dims=dims)
    assert q.total_ms < f.total_ms


def test_strict_cli_passes_on_a_complete_forecast():
    from click.testing import CliRunner

    from tilecast.cli import main

    name = "bert_ort_qdynamic"
    binds = [a for d, v in corpus.dims_of(name).items() for a in ("--dim", f"{d}={v}")]
    r = CliRunner().invoke(main, ["analyze", str(corpus.build(name)), "-d", "l4", "--strict",
                                  *binds])
    assert r.exit_code == 0, r.output
