"""Zero-cost ops: metadata only on the GPU, each with the reason it launches no kernel."""

from __future__ import annotations

from ..registry import REGISTRY

VIEW = "a view: changes shape metadata, the data stays where it is"
NOOP_CAST = "a cast to the dtype its input has: no copy (PyTorch's .to() returns the tensor)"
# Zero-cost nodes whose output holds their input's elements as they lie: a fusion pass
# walks past them (epilogues.py, attention_fusion.py, cast_fusion.py)
PASS_THROUGH = frozenset({VIEW, NOOP_CAST})
# A Transpose only Shape / Size read (views.py): it reads no elements either
SHAPE_ONLY = "view: only its shape is read (Shape / Size), no kernel writes it"
ZERO_COST: dict[str, str] = {
    "Reshape": VIEW,
    "Flatten": VIEW,
    "Squeeze": VIEW,
    "Unsqueeze": VIEW,
    "BitCast": "a view: reinterprets the same bytes as another dtype",
    "Identity": "aliases its input; ONNX Runtime removes it (EliminateIdentity)",
    "Shape": "reads shape metadata on the host",
    "Size": "reads shape metadata on the host",
    "Constant": "an initializer: materialized once when the session loads",
    "Dropout": "identity at inference (training_mode false); ONNX Runtime removes it "
               "(EliminateDropout)",
    "Optional": "wraps a value in an optional: metadata only",
    "OptionalHasElement": "tests an optional for a value: metadata only",
    "OptionalGetElement": "unwraps an optional: metadata only",
    "SequenceEmpty": "creates an empty sequence: metadata only",
    "SequenceLength": "reads a sequence's length: metadata only",
}

# No GPU kernel exists for these in any runtime tilecast models: ONNX Runtime implements them
# for the CPU only, and the forecast is of GPU time.
CPU_ONLY = "CPU-only: strings and image decoding have no GPU kernel"
for _op in ("StringConcat", "StringNormalizer", "StringSplit", "RegexFullMatch",
            "TfIdfVectorizer", "ImageDecoder"):
    ZERO_COST[_op] = CPU_ONLY

for _op, _reason in ZERO_COST.items():
    REGISTRY.register_zero("", _op, _reason)
# ONNX Runtime's contrib ops with CPU kernels only, and its axis insertion (an Unsqueeze)
for _op in ("Tokenizer", "MurmurHash3", "BifurcationDetector"):
    REGISTRY.register_zero("com.microsoft", _op, CPU_ONLY)
REGISTRY.register_zero("com.microsoft", "ExpandDims", VIEW)
