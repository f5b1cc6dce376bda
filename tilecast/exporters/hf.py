"""Hugging Face models from a config alone, built on the meta device: no hub, no weights.

torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError
from .torch_export import INSTALL_HINT, require_torch

# task -> transformers Auto class; order matters for "auto" (first class that matches wins).
TASK_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "pretraining": "AutoModelForPreTraining",
    "sequence-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
    "base": "AutoModel",
}
TASKS = ("auto", *TASK_AUTO_CLASSES)
DTYPES = ("float32", "float16", "bfloat16")
ATTNS = ("eager", "sdpa")
# Attention functions registered by name (``register_attention``), beside eager and sdpa,
# and the names whose models build no mask tensor (the function makes its own).
_ATTENTION_FUNCTIONS: dict[str, Callable[..., Any]] = {}
_MASKLESS: set[str] = set()
# Config keys that hold a depth; encoder-decoder models have one per stack.
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
              "encoder_layers", "decoder_layers")
# Learned absolute position tables: a longer seq would index past their end.
POSITION_KEYS = ("n_positions", "max_position_embeddings")
# Sizes that must be positive integers; checked up front so the error names the key.
SIZE_KEYS = ("hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_heads",
             "intermediate_size", "n_inner", "d_ff", "ffn_dim", "vocab_size", *DEPTH_KEYS)


@dataclass(frozen=True)
class Prepared:
    """A built (meta) module with its example inputs, ready for ``torch_export``."""

    module: Any
    inputs: Mapping[str, Any]
    task: str
    architecture: str


def load_config(config: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A config dict from a mapping or a ``config.json`` path (ExportError if unreadable)."""
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(f"config file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise ExportError(f"config {path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ExportError(f"config {path} must hold a JSON object, not {type(data).__name__}")
    return data


def from_hf_config(config: str | Path | Mapping[str, Any], *, batch: int, seq: int,
                   task: str = "auto", dtype: str = "float32", attn: str = "eager",
                   layers: int | None = None, path: str | Path) -> Path:
    """Build a Hugging Face model from ``config`` on the meta device and export it to ``path``.

    ``task`` is one of TASKS ("auto" follows the config's ``architectures``); ``attn`` "eager"
    exports MatMul + Softmax attention, "sdpa" one fused Attention node; ``layers`` overrides
    the depth. Inputs: input_ids (batch, seq) int64, plus attention_mask for non-causal tasks
    and decoder_input_ids (batch, seq) for encoder-decoder models; image models take
    pixel_values (batch, channels, image_size, image_size) and ignore ``seq``.
    """
    from .torch_export import from_torch

    prepared = prepare(load_config(config), batch=batch, seq=seq, task=task, dtype=dtype,
                       attn=attn, layers=layers)
    return from_torch(prepared.module, prepared.inputs, path)


def prepare(config: Mapping[str, Any], *, batch: int, seq: int, task: str = "auto",
            dtype: str = "float32", attn: str = "eager", layers: int | None = None,
            device: str = "meta") -> Prepared:
    """Validate, build the model on ``device`` (meta: shapes only, for exporting; a real
    device to run it: ``collect.labels``), and make its example inputs there."""
    check_options(batch=batch, seq=seq, task=task, dtype=dtype, attn=attn, layers=layers)
    _check_sizes(config)
    data = with_layers(dict(config), layers) if layers is not None else dict(config)
    data.pop("_tilecast", None)
    torch = require_torch()
    transformers = _require_transformers()
    if attn in _ATTENTION_FUNCTIONS:
        _register_with_transformers(attn, transformers)
    cfg = build_config(data, transformers)
    task, auto = resolve_task(cfg, task, transformers)
    module = build_model(auto, cfg, dtype=dtype, attn=attn, torch=torch, device=device)
    inputs = example_inputs(module, cfg, task, batch=batch, seq=seq, torch=torch,
                            device=device)
    return Prepared(module, inputs, task, type(module).__name__)


def check_options(*, batch: int, seq: int | None, task: str, dtype: str, attn: str,
                  layers: int | None) -> None:
    """Reject bad option values before anything heavy is imported."""
    for name, value in (("batch", batch), ("seq", seq), ("layers", layers)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value <= 0):
            raise ExportError(f"{name} must be a positive integer, got {value!r}")
    for name, value, allowed in (("task", task, TASKS), ("dtype", dtype, DTYPES),
                                 ("attn", attn, (*ATTNS, *_ATTENTION_FUNCTIONS))):
        if value not in allowed:
            raise ExportError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def register_attention(name: str, fn: Callable[..., Any], *, mask: bool = True) -> None:
    """Make ``attn=name`` build models whose attention layers call ``fn`` (transformers'
    attention-function signature: module, query, key, value, attention_mask, scaling, dropout),
    with eager's additive float masks, or with none (``mask=False``: ``fn`` gets None and
    builds the mask its program used). The evaluation uses it to export the attention its
    labels measured (``evaluation/label_programs.py``)."""
    if name in ATTNS:
        raise ExportError(f"attention {name!r} is built in; register another name")
    _ATTENTION_FUNCTIONS[name] = fn
    (_MASKLESS.discard if mask else _MASKLESS.add)(name)


def _no_mask(*_: Any, **__: Any) -> None:
    return None


def _register_with_transformers(name: str, transformers: Any) -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    transformers.AttentionInterface.register(name, _ATTENTION_FUNCTIONS[name])
    AttentionMaskInterface.register(
        name, _no_mask if name in _MASKLESS else ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def with_layers(data: dict[str, Any], layers: int) -> dict[str, Any]:
    """Set every depth key present to ``layers``, keeping MoE sparse steps (Switch)."""
    keys = [k for k in DEPTH_KEYS if isinstance(data.get(k), int)]
    if not keys:
        raise ExportError(f"cannot override layers: the config has none of {list(DEPTH_KEYS)}")
    for stack, depth in (("encoder", "num_layers"), ("decoder", "num_decoder_layers")):
        sparse = f"num_sparse_{stack}_layers"
        if data.get(sparse) and data.get(depth, data.get("num_layers")):
            step = max(1, data.get(depth, data.get("num_layers")) // data[sparse])
            data[sparse] = max(1, layers // step)
    for key in keys:
        data[key] = layers
    if isinstance(data.get("layer_types"), list) and data["layer_types"]:
        types = data["layer_types"]  # per-layer kinds (sliding/full attention): keep the cycle
        data["layer_types"] = [types[i % len(types)] for i in range(layers)]
    return data


def _check_sizes(data: Mapping[str, Any]) -> None:
    for key in SIZE_KEYS:
        value = data.get(key)
        if key in data and value is not None and (not isinstance(value, int) or value <= 0):
            raise ExportError(f"config key {key!r} must be a positive integer, got {value!r}")


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ExportError(f"exporting a Hugging Face config needs transformers: {INSTALL_HINT}"
                          ) from None
    return transformers


def build_config(data: dict[str, Any], transformers: Any) -> Any:
    """A PretrainedConfig from a dict, with use_cache off; ExportError naming the problem."""
    model_type = data.get("model_type")
    if not model_type:
        raise ExportError("config has no 'model_type' key (e.g. \"gpt2\", \"bert\", \"llama\")")
    rest = {k: v for k, v in data.items() if k != "model_type"}
    try:
        with _quiet_transformers():
            cfg = transformers.AutoConfig.for_model(model_type, **rest)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc):
            raise ExportError(f"config key 'model_type': transformers "
                              f"{transformers.__version__} does not know {model_type!r}"
                              ) from None
        raise ExportError(f"transformers cannot build a {model_type} config: {exc}") from None
    except (TypeError, KeyError, AttributeError) as exc:
        raise ExportError(f"transformers cannot build a {model_type} config: {exc}") from None
    cfg.use_cache = False
    return cfg


def supported_tasks(cfg: Any, transformers: Any) -> list[str]:
    return [t for t, auto in TASK_AUTO_CLASSES.items()
            if type(cfg) in getattr(transformers, auto)._model_mapping]


def resolve_task(cfg: Any, task: str, transformers: Any) -> tuple[str, Any]:
    """(task, Auto class); "auto" picks the task whose class ``architectures`` names."""
    tasks = supported_tasks(cfg, transformers)
    if task == "auto":
        arch = (getattr(cfg, "architectures", None) or [None])[0]
        mapped = {t: getattr(transformers, TASK_AUTO_CLASSES[t])._model_mapping[type(cfg)]
                  for t in tasks}
        task = next((t for t, cls in mapped.items() if cls.__name__ == arch), "base")
    if task not in tasks:
        raise ExportError(f"task {task!r} is not supported by model_type {cfg.model_type!r}; "
                          f"supported: {', '.join(tasks) or 'none'}")
    return task, getattr(transformers, TASK_AUTO_CLASSES[task])


def build_model(auto: Any, cfg: Any, *, dtype: str, attn: str, torch: Any,
                device: str = "meta") -> Any:
    """Instantiate the task's model on ``device``: on meta, shapes and dtypes without weight
    memory; elsewhere with transformers' random initialization."""
    from .moe import make_static

    if auto.__name__ == "AutoModelForSequenceClassification" and cfg.pad_token_id is None:
        cfg.pad_token_id = cfg.eos_token_id if cfg.eos_token_id is not None else 0
    try:
        with torch.device(device), _quiet_transformers():
            model = auto.from_config(cfg, attn_implementation=attn, dtype=getattr(torch, dtype))
    except (ValueError, TypeError, AttributeError, KeyError, ImportError) as exc:
        raise ExportError(f"transformers cannot build a {cfg.model_type} model for this config "
                          f"(attn={attn!r}): {str(exc).splitlines()[0]}") from None
    make_static(model)
    return model.eval()


def example_inputs(module: Any, cfg: Any, task: str, *, batch: int, seq: int, torch: Any,
                   device: str = "meta") -> dict[str, Any]:
    """Inputs on ``device``: token ids 0 (and all-ones masks) for text, zero pixel_values for
    images."""
    if getattr(module, "main_input_name", "input_ids") == "pixel_values":
        size, channels = cfg.image_size, getattr(cfg, "num_channels", 3)
        dtype = next(module.parameters()).dtype
        return {"pixel_values": torch.zeros(batch, channels, size, size, dtype=dtype,
                                            device=device)}
    _check_positions(cfg, seq)
    params = inspect.signature(module.forward).parameters
    ids = torch.zeros(batch, seq, dtype=torch.int64, device=device)
    inputs = {"input_ids": ids}
    if task != "causal-lm" and "attention_mask" in params:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.int64, device=device)
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        inputs["decoder_input_ids"] = torch.zeros(batch, seq, dtype=torch.int64, device=device)
    return inputs


def _check_positions(cfg: Any, seq: int) -> None:
    for key in POSITION_KEYS:
        limit = getattr(cfg, key, None)
        if isinstance(limit, int) and seq > limit:
            raise ExportError(f"seq {seq} exceeds the model's {key} = {limit}; use a shorter "
                              f"seq or raise {key} in the config")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers logs config warnings (e.g. token ids vs a tiny vocab) on stderr."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
