"""Survey: tiny Hugging Face models of many architectures, exported both ways, analyzed.

Each architecture is built from a small config (2 layers, hidden 64; random weights, nothing is
downloaded) and exported with torch.onnx's dynamo exporter (static shapes) and its legacy
exporter (dynamic ``batch`` / ``sequence`` axes, bound here to the traced sizes); the legacy
graph is also saved by an ONNX Runtime session at ORT_ENABLE_EXTENDED (``ort``: its fusions,
com.microsoft ops). Every graph is then analyzed on an L4 and an H100 in inference and
training. Each row says what happened:

- ``ok``: a complete forecast (no unsupported or unshaped node) and no warning;
- ``incomplete``: unsupported or unshaped nodes (listed, with where the shapes stop);
- ``warned``: a complete forecast that printed a Python warning;
- ``error``: a ``TilecastError`` (one ``Error:`` line at the CLI);
- ``crash``: any other exception (a bug);
- ``export failed``: torch could not export the model (not tilecast's).

The test corpus (``tests/corpus``) keeps a few of these graphs under test; this survey is the
wider net that finds the next one to add.

    PYTHONPATH=. python benchmarks/architectures.py              # every architecture (~2 min)
    PYTHONPATH=. python benchmarks/architectures.py --only t5 mamba
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH, SEQ, HIDDEN = 2, 16, 64
TEXT = dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=1000, max_position_embeddings=128)
GQA = dict(TEXT, num_key_value_heads=2, use_cache=False)
ENC_DEC = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
               vocab_size=1000, d_model=HIDDEN)


@dataclass(frozen=True)
class Arch:
    model_type: str
    config: dict[str, Any]
    inputs: str  # text, ids, encdec, image, audio, speech


ARCHS: dict[str, Arch] = {
    "bert": Arch("bert", TEXT, "text"),
    "roberta": Arch("roberta", TEXT, "text"),
    "distilbert": Arch("distilbert", dict(dim=HIDDEN, n_layers=2, n_heads=4, hidden_dim=128,
                                          vocab_size=1000), "text"),
    "albert": Arch("albert", dict(TEXT, embedding_size=32), "text"),
    "electra": Arch("electra", dict(TEXT, embedding_size=32), "text"),
    "deberta-v2": Arch("deberta-v2", TEXT, "text"),
    "gpt2": Arch("gpt2", dict(n_embd=HIDDEN, n_layer=2, n_head=4, vocab_size=1000,
                              n_positions=128, use_cache=False), "text"),
    "opt": Arch("opt", dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                            ffn_dim=128, vocab_size=1000, max_position_embeddings=128,
                            word_embed_proj_dim=HIDDEN, use_cache=False), "text"),
    "llama": Arch("llama", GQA, "text"),
    "mistral": Arch("mistral", GQA, "text"),
    "qwen2": Arch("qwen2", GQA, "text"),
    "gemma": Arch("gemma", dict(GQA, head_dim=16), "text"),
    "phi": Arch("phi", dict(TEXT, use_cache=False), "text"),
    "gpt_neox": Arch("gpt_neox", dict(TEXT, use_cache=False), "text"),
    "falcon": Arch("falcon", dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                  vocab_size=1000, use_cache=False), "text"),
    "mixtral": Arch("mixtral", dict(GQA, num_local_experts=4, num_experts_per_tok=2), "text"),
    "mamba": Arch("mamba", dict(hidden_size=HIDDEN, num_hidden_layers=2, vocab_size=1000,
                                state_size=8, use_cache=False), "ids"),
    "t5": Arch("t5", dict(d_model=HIDDEN, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                          vocab_size=1000), "encdec"),
    "bart": Arch("bart", dict(ENC_DEC, max_position_embeddings=128), "encdec"),
    "whisper": Arch("whisper", dict(ENC_DEC, num_mel_bins=16, max_source_positions=32,
                                    max_target_positions=32, pad_token_id=1, bos_token_id=2,
                                    eos_token_id=3, decoder_start_token_id=2), "speech"),
    "wav2vec2": Arch("wav2vec2", dict(TEXT, conv_dim=[32, 32], conv_stride=[5, 2],
                                      conv_kernel=[10, 3], num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=4), "audio"),
    "vit": Arch("vit", dict(TEXT, image_size=64, patch_size=8), "image"),
    "beit": Arch("beit", dict(TEXT, image_size=64, patch_size=8), "image"),
    "dinov2": Arch("dinov2", dict(TEXT, image_size=56, patch_size=14), "image"),
    "clip_vision": Arch("clip_vision_model", dict(TEXT, image_size=64, patch_size=8), "image"),
    "resnet": Arch("resnet", dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                  depths=[1, 1, 1, 1]), "image"),
    "convnext": Arch("convnext", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
                     "image"),
    "swin": Arch("swin", dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=64,
                              patch_size=4, window_size=4), "image"),
    "mobilevit": Arch("mobilevit", dict(image_size=64, hidden_sizes=[32, 48, 64],
                                        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]), "image"),
    "segformer": Arch("segformer", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                        num_attention_heads=[1, 1, 2, 2],
                                        decoder_hidden_size=64), "image"),
}


def example_inputs(arch: Arch, image_size: int) -> tuple[tuple[str, ...], tuple[Any, ...],
                                                          dict[int, str]]:
    """Input names, example tensors and the dynamic axes of the first input's kind."""
    import torch

    ids = torch.randint(0, 1000, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    text_axes = {0: "batch", 1: "sequence"}
    return {
        "text": (("input_ids", "attention_mask"), (ids, mask), text_axes),
        "ids": (("input_ids",), (ids,), text_axes),
        "encdec": (("input_ids", "attention_mask", "decoder_input_ids"), (ids, mask, ids),
                   text_axes),
        "image": (("pixel_values",), (torch.randn(BATCH, 3, image_size, image_size),),
                  {0: "batch"}),
        "audio": (("input_values",), (torch.randn(BATCH, 1600),), text_axes),
        "speech": (("input_features", "decoder_input_ids"),
                   (torch.randn(BATCH, 16, 64), ids[:, :8]), {0: "batch"}),
    }[arch.inputs]


def _module(arch: Arch) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(arch.model_type, **arch.config)
    try:
        model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
    except (ValueError, TypeError):  # models without an eager/sdpa switch
        model = transformers.AutoModel.from_config(cfg)
    return model.eval(), getattr(cfg, "image_size", 64)


@contextlib.contextmanager
def _quiet():
    """Silence file descriptors 1 and 2 while torch exports: a failed export prints its whole
    TorchScript graph, and the dynamo exporter's optimizer logs each constant it cannot fold."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def export(name: str, how: str, path: Path) -> tuple[str, ...]:
    """Export ``name`` to ``path``; returns the graph's dynamic dim names."""
    import torch

    model, image_size = _module(ARCHS[name])
    names, args, axes = example_inputs(ARCHS[name], image_size)

    class ByName(torch.nn.Module):  # exporters pass inputs positionally; HF wants keywords
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return self.model(**dict(zip(names, tensors, strict=True)))[0]

    with torch.no_grad(), warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        if how == "dynamo":
            torch.onnx.export(ByName().eval(), args, dynamo=True, input_names=list(names),
                              verbose=False).save(str(path))
            return ()
        dynamic = {n: {a: d for a, d in axes.items() if a < t.dim()}
                   for n, t in zip(names, args, strict=True)}
        torch.onnx.export(ByName().eval(), args, str(path), dynamo=False, opset_version=17,
                          input_names=list(names), dynamic_axes=dynamic)
        return tuple(sorted({d for dims in dynamic.values() for d in dims.values()}))


def ort_saved(src: Path, path: Path) -> None:
    """``src`` as an ONNX Runtime session saves it at ORT_ENABLE_EXTENDED (its transformer and
    Conv fusions, com.microsoft ops)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def outcome(path: Path, dims: dict[str, int]) -> tuple[str, str]:
    """(kind, detail) over L4 and H100, inference and training."""
    import tilecast
    from tilecast.errors import TilecastError

    details = []
    for device in ("l4", "h100"):
        for mode in ("inference", "training"):
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    f = tilecast.analyze(path, device, dims=dims, mode=mode)
            except TilecastError as exc:
                return "error", f"{device} {mode}: {exc}"
            except Exception as exc:  # noqa: BLE001  (the survey reports bugs, it does not stop)
                return "crash", f"{device} {mode}: {type(exc).__name__}: {exc}"
            if f.incomplete:
                return "incomplete", (f"{device} {mode}: unsupported {dict(f.unsupported)}, "
                                      f"unshaped {dict(f.unshaped)} from {f.unshaped_from}")
            if caught:
                return "warned", f"{device} {mode}: {caught[0].category.__name__}: " \
                                 f"{caught[0].message}"
            details.append(f"{device} {mode[:5]} {f.total_ms:.2f} ms")
    return "ok", ", ".join(details)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(ARCHS), help="these architectures")
    args = ap.parse_args()
    counts: dict[str, int] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or ARCHS:
            for how in ("dynamo", "legacy", "ort"):
                path = Path(tmp) / f"{name}-{how}.onnx"
                try:
                    if how == "ort":  # the legacy graph as an ORT session saves it
                        with _quiet():
                            ort_saved(Path(tmp) / f"{name}-legacy.onnx", path)
                    else:
                        dyn = export(name, how, path)
                except Exception as exc:  # noqa: BLE001  (torch's failure, reported)
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    kind, detail = "export failed", f"{type(exc).__name__}: {first[:120]}"
                else:
                    sizes = {"batch": BATCH, "sequence": SEQ}
                    kind, detail = outcome(path, {d: sizes[d] for d in dyn})
                counts[kind] = counts.get(kind, 0) + 1
                print(f"{name:12s} {how:7s} {kind:14s} {detail}", flush=True)
    summary = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    print(f"\n{sum(counts.values())} graphs in {time.perf_counter() - start:.0f} s: {summary}")
    return 1 if counts.get("crash") else 0


if __name__ == "__main__":
    sys.exit(main())
