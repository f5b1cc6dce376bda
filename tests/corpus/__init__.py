"""A corpus of small ONNX graphs as third-party exporters write them, built on the fly and cached.

Each builder writes one graph with tiny configs (2 layers, hidden 64-128) and symbolic input dims
(``batch``, ``sequence``), exactly as the exporter leaves it: torch.onnx legacy (``unk__N`` value
info), torch.onnx dynamo (unnamed dims), Hugging Face models built from configs, onnxruntime's
transformer optimizer, fp16 conversion, dynamic and QDQ static quantization, a small CNN, LSTM
and GRU, and with-past decoders (``past_sequence_length``) as optimum exports them. Graphs are
cached under ``$TILECAST_CORPUS`` (default ``~/.cache/tilecast/corpus``) in a folder keyed by a
hash of the builders' source (and tilecast's exporter) and the library versions, so an edit or
an upgrade rebuilds them. Importing this module never imports torch; building does.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx

from . import builders

# Input dims of the symbolic graph inputs, as a user would bind them.
DIMS = {"batch": 2, "sequence": 16, "past_sequence_length": 16}


def cache_root() -> Path:
    base = os.environ.get("TILECAST_CORPUS") or Path.home() / ".cache" / "tilecast" / "corpus"
    return Path(base)


def _key() -> str:
    import onnxruntime
    import torch
    import transformers

    import tilecast.exporters

    # the builders, and tilecast's own exporter (one graph comes from it)
    sources = [Path(builders.__file__), *sorted(Path(tilecast.exporters.__file__).parent.glob(
        "*.py"))]
    text = "".join(p.read_text(encoding="utf-8") for p in sources)
    versions = f"{torch.__version__} {transformers.__version__} {onnx.__version__} " \
               f"{onnxruntime.__version__}"
    return hashlib.sha256((text + versions).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    path = cache_root() / _key()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _quiet() -> Any:
    import logging

    loggers = [logging.getLogger(n) for n in ("torch", "onnxruntime", "transformers", "root",
                                              "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def build(name: str, folder: Path | None = None) -> Path:
    """The path of corpus graph ``name``, building it (and what it derives from) when missing."""
    folder = folder or cache_dir()
    path = folder / f"{name}.onnx"
    if path.is_file():
        return path
    spec = builders.CORPUS[name]
    sources = [build(dep, folder) for dep in spec.deps]
    tmp = folder / f".{name}.{os.getpid()}.tmp.onnx"
    with _quiet():
        spec.fn(tmp, *sources)
    os.replace(tmp, path)
    return path


NAMES: tuple[str, ...] = tuple(builders.CORPUS)
Builder = Callable[..., None]


def dims_of(name: str) -> dict[str, int]:
    """The input dims of graph ``name``, bound as a user would."""
    return {d: DIMS[d] for d in builders.CORPUS[name].dims}


def _graph(name: str) -> onnx.GraphProto:
    return onnx.load(str(build(name)), load_external_data=False).graph


def op_types(name: str) -> set[str]:
    """Domain-qualified op types of graph ``name`` (``com.microsoft::Attention``)."""
    return {f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
            for n in _graph(name).node}


def anonymous_dims(name: str) -> dict[str, int]:
    """How many value_info dims the exporter left anonymous (``unk__N``) or unnamed."""
    out = {"unk": 0, "unnamed": 0}
    for vi in _graph(name).value_info:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param.startswith("unk__"):
                out["unk"] += 1
            elif not d.dim_param and not d.HasField("dim_value"):
                out["unnamed"] += 1
    return out
