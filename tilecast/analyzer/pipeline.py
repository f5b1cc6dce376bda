"""``analyze``: ONNX model + device -> :class:`Forecast`. The one entry point CLI and API share."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from ..device_db import Device, load_device
from ..errors import PredictorError, TilecastError
from .analysis import NodeResult, cost_graph
from .fold import fold_load_time
from .forecast import Forecast, KernelForecast, ZeroCostOp
from .fusion import fusion_groups
from .graph import Graph, build_graph, load_model
from .predictor import Predictor, RooflinePredictor
from .rewrites import fold_linear_bias
from .steps import expand_steps
from .types import Kernel

MODES = ("inference", "training")


def resolve_predictor(spec: str | os.PathLike[str] | Predictor | None) -> Predictor:
    """``None``/"default": the shipped learned predictor when present, else roofline;
    "roofline"; "learned"; or a path to a predictor ONNX file."""
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        return spec
    if spec == "roofline":
        return RooflinePredictor()
    from .. import learned

    shipped = getattr(learned, "available", lambda: False)()
    if spec in (None, "default"):
        return learned.default_predictor() if shipped else RooflinePredictor()
    if spec == "learned":
        if not shipped:
            raise PredictorError("the learned predictor is not shipped in this install")
        return learned.default_predictor()
    path = Path(spec)
    if not path.is_file():
        raise PredictorError(f"unknown predictor {str(spec)!r}: use default, learned, "
                             "roofline, or the path of a predictor .onnx file")
    return learned.load_predictor(path)


def node_kernels(results: Sequence[NodeResult]) -> list[Kernel]:
    """One kernel per costed or unsupported node, in graph order (unfused execution)."""
    return [Kernel(r.node.name, (r.node.name,), r.node.op_type, r.cost)
            for r in results if r.cost is not None]


def group_kernels(graph: Graph, results: Sequence[NodeResult]) -> list[Kernel]:
    """One kernel per fusion group that does any work (fused execution)."""
    kernels = []
    for g in fusion_groups(graph, tuple(results)):
        if g.cost is None:
            continue
        names = tuple(results[i].node.name for i in g.members if results[i].cost is not None)
        kernels.append(Kernel(names[0], names, g.op_type, g.cost, group=g.id))
    return kernels


def _model_label(model: str | os.PathLike[str] | onnx.ModelProto) -> str:
    if isinstance(model, onnx.ModelProto):
        return model.graph.name or "<in-memory model>"
    return str(model)


def analyze(model: str | os.PathLike[str] | onnx.ModelProto,
            device: str | os.PathLike[str] | Device, *, mode: str = "inference",
            fusion: bool = False, dims: Mapping[str, int] | None = None,
            predictor: str | os.PathLike[str] | Predictor | None = None,
            optimizer: str = "none") -> Forecast:
    """Forecast the latency of one inference pass (or training step) of ``model`` on ``device``.

    >>> f = analyze("examples/tiny_mlp.onnx", "l4", predictor="roofline")  # doctest: +SKIP
    >>> round(f.total_ms, 3)  # doctest: +SKIP
    """
    if mode not in MODES:
        raise TilecastError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    dev = device if isinstance(device, Device) else load_device(device)
    pred = resolve_predictor(predictor)
    proto = load_model(model)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)  # binding dims edits the proto: never touch the caller's
    graph = build_graph(proto, dims)
    results = fold_load_time(fold_linear_bias(cost_graph(graph)))
    kernels = group_kernels(graph, results) if fusion else node_kernels(results)
    kernels = expand_steps(results, kernels)
    if mode == "training":
        from .training import training_kernels

        kernels = training_kernels(graph, results, kernels, optimizer=optimizer)
    preds = pred.predict(kernels, dev)
    kf = tuple(KernelForecast(k, p.latency_ms, p.bound, p.tile, p.extrapolated)
               for k, p in zip(kernels, preds, strict=True))
    return Forecast(
        model=_model_label(model), device=dev, mode=mode, predictor=pred.name, kernels=kf,
        unsupported=dict(Counter(r.op_key for r in results if r.outcome == "unsupported")),
        zero_cost=dict(Counter(r.op_key for r in results if r.outcome == "zero")),
        fusion=fusion, dims=dict(dims or {}), node_count=len(results),
        zero_cost_reasons=zero_cost_reasons(results),
    )


def zero_cost_reasons(results: Sequence[NodeResult]) -> tuple[ZeroCostOp, ...]:
    """(op, reason, count) of the zero-cost nodes, sorted by op then reason."""
    acc = Counter((r.op_key, r.reason) for r in results if r.outcome == "zero")
    return tuple(ZeroCostOp(op, reason, n) for (op, reason), n in sorted(acc.items()))
