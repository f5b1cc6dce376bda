"""Export any ``torch.nn.Module`` to a weightless, shape-complete ONNX file.

torch is imported inside functions only: importing this module never imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import ExportError

# Opset 23 has Attention and RMSNormalization: sdpa exports as one fused Attention node.
OPSET = 23
INSTALL_HINT = 'pip install "tilecast[export]"'


def require_torch() -> Any:
    """Import torch (and check the exporter's own dependency) or raise ExportError."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
        import torch
    except ImportError as exc:
        raise ExportError(f"exporting needs torch and onnxscript ({exc.name} is missing): "
                          f"{INSTALL_HINT}") from None
    return torch


def from_torch(module: Any, example_inputs: tuple[Any, ...] | Mapping[str, Any],
               path: str | Path, *, dynamic_dims: Mapping[str, Mapping[int, str]] | None = None,
               ) -> Path:
    """Export ``module`` called on ``example_inputs`` to ``path``; return the path.

    Parameters may live on the meta device (nothing is allocated) or be real tensors; either
    way no weight byte is written: initializers are external-data placeholders (see
    docs/exporters.md). ``example_inputs`` is a tuple of positional tensors or a mapping of
    keyword tensors; they are moved to the module's device. ``dynamic_dims`` maps an input
    name to {axis: symbol}, e.g. ``{"input_ids": {0: "batch"}}``; without it every dim is
    static and every value in the graph carries a complete static shape.
    """
    from ._graph import finalize, write_atomic

    program = export_program(module, example_inputs, dynamic_dims=dynamic_dims)
    proto = finalize(program.model, static=not dynamic_dims)
    return write_atomic(proto.SerializeToString(), Path(path))


def export_program(module: Any, example_inputs: tuple[Any, ...] | Mapping[str, Any], *,
                   dynamic_dims: Mapping[str, Mapping[int, str]] | None = None,
                   train_mode: bool = False) -> Any:
    """Run ``torch.onnx.export(dynamo=True)`` and return its ONNXProgram (nothing written).

    ``train_mode`` traces the module in training mode, so dropout appears as Dropout nodes
    (what a training step runs); inference traces drop it.
    """
    torch = require_torch()
    args, kwargs = _place_inputs(module, example_inputs, torch)
    module.train(train_mode)
    dynamic_shapes = _dynamic_shapes(module, args, kwargs, dynamic_dims)
    try:
        with _quiet_export():
            fast = _cached_registry_export() if dynamic_shapes is None else None
            if fast is not None:
                return fast(module, args, kwargs)
            return torch.onnx.export(
                module, args, kwargs=kwargs, dynamo=True, optimize=False, opset_version=OPSET,
                dynamic_shapes=dynamic_shapes, verbose=False)
    except Exception as exc:  # torch.export / torch.onnx raise many unrelated types
        raise ExportError(f"torch.onnx could not export {type(module).__name__}: "
                          f"{_first_line(exc)}") from exc


_REGISTRY: list[Any] = []


def _cached_registry_export() -> Any:
    """torch.onnx.export minus rebuilding the torchlib registry (~2 s) on every call.

    For static shapes ``torch.onnx.export(dynamo=True)`` is ``_core.export`` with a fresh
    ``ONNXRegistry.from_torchlib``; here the registry is built once per process. Private API
    (the [export] extra pins torch): if its signature differs, None and the public path runs.
    """
    import inspect

    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:
        return None
    if not {"registry", "optimize", "opset_version"} <= set(
            inspect.signature(_core.export).parameters):
        return None
    if not _REGISTRY:
        _REGISTRY.append(_registration.ONNXRegistry.from_torchlib(opset_version=OPSET))
    return lambda module, args, kwargs: _core.export(
        module, args, kwargs, registry=_REGISTRY[0], optimize=False, opset_version=OPSET,
        verbose=False)


def _place_inputs(module: Any, example_inputs: Any, torch: Any,
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    device = next((p.device for p in module.parameters()), None)
    move = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t) if device else (
        lambda t: t)
    if isinstance(example_inputs, Mapping):
        return (), {k: move(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, torch.Tensor):
        return (move(example_inputs),), {}
    return tuple(move(t) for t in example_inputs), {}


def _dynamic_shapes(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    dynamic_dims: Mapping[str, Mapping[int, str]] | None) -> Any:
    """torch.onnx takes string dim names; name positional inputs after forward's parameters."""
    if not dynamic_dims:
        return None
    import inspect

    params = list(inspect.signature(module.forward).parameters)
    names = [*params[:len(args)], *kwargs]
    unknown = sorted(set(dynamic_dims) - set(names))
    if unknown:
        raise ExportError(f"dynamic_dims names unknown inputs {unknown}; inputs are {names}")
    dims = {n: dict(dynamic_dims.get(n, {})) or None for n in names}
    return dims


def _first_line(exc: BaseException) -> str:
    """The most specific line of a (often multi-page) exporter error."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    for err in (root, exc):
        for line in str(err).splitlines():
            if line.strip():
                return f"{type(err).__name__}: {line.strip()}"
    return type(exc).__name__


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Keep the exporter's progress prints, warnings and log lines off the user's terminal."""
    names = ("torch.onnx", "torch.export", "torch._export", "torch.fx", "torch._dynamo",
             "onnxscript", "onnx_ir", "transformers")
    loggers = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for logger, _ in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in loggers:
            logger.setLevel(level)
