"""``analyze``: ONNX model + device -> :class:`Forecast`. The one entry point CLI and API share."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from ..device_db import Device, load_device
from ..errors import PredictorError, TilecastError
from .activations import fuse_activations
from .analysis import NodeResult, cost_graph, unshaped_root
from .attention_fusion import fuse_attention
from .attention_layout import read_in_place
from .cast_fusion import drop_noop_casts, fuse_casts
from .epilogues import fuse_epilogues
from .fold import fold_load_time
from .forecast import Forecast, KernelForecast, OpReason
from .fusion import COMPILER, FusionGroup, FusionRules, fusion_groups
from .graph import Graph, build_graph, load_model
from .mathmode import AMP_DTYPES, apply_autocast, check_math, fold_weight_casts, tf32_kernels
from .native import select_backend
from .predictor import Predictor, RooflinePredictor, predict_checked
from .rewrites import fold_linear_bias
from .runtime import PYTORCH_RUNTIMES, apply_runtime, check_runtime, fold_batchnorm
from .sdpa_kernels import ANY_GPU, SdpaKernels, pytorch_sdpa
from .sdpa_mask import convert_bool_masks, padding_checks
from .steps import expand_steps
from .types import Kernel
from .views import eager_views, graph_views
from .weights import mark_weight_operands

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


def prepare(graph: Graph, runtime: str, *, sdpa: SdpaKernels = ANY_GPU
            ) -> tuple[NodeResult, ...]:
    """The graph's nodes costed as ``runtime`` runs them: linear biases folded into their
    GEMMs, load-time subgraphs folded, decomposed activations fused where the runtime does
    (activations.py), under PyTorch each exported ``scaled_dot_product_attention`` call as
    its one fused kernel (attention_fusion.py), the runtime's views (views.py), and the GEMM
    operands that are weights marked (weights.py). ``sdpa``: PyTorch's SDPA kernels for the
    GPU (``sdpa_kernels.pytorch_sdpa``)."""
    outputs = frozenset(graph.outputs)
    results = fuse_activations(fold_load_time(fold_linear_bias(cost_graph(graph))), outputs,
                               runtime=runtime, opset=graph.opsets.get("", 0))
    if runtime in PYTORCH_RUNTIMES:  # ORT / compiled runtimes run these as kernels (views.py)
        # first: the transposes around an SDPA call are then views of its kernel's operands
        if sdpa.fused:  # an unpadded batch's masks are not built (padding.py)
            before = results
            results = fuse_attention(results, outputs, graph.causal_masks, sdpa_calls=True,
                                     unpadded=graph.unpadded.masks, sdpa=sdpa)
            if runtime == "eager":  # a capture cannot read the check back: no mask passed
                results = padding_checks(results, graph.inputs,
                                         graph.unpadded.checked(before, results))
        results = convert_bool_masks(results)  # of the masks still passed
        results = eager_views(results, outputs)
    else:  # ... but fold a last-two-dims Transpose into the GEMM reading it
        results = graph_views(results, outputs)
    return mark_weight_operands(results)


def compile_inference(results: Sequence[NodeResult], graph: Graph) -> tuple[NodeResult, ...]:
    """What a graph runtime fuses at inference: each eager attention chain into one kernel
    that reads and writes its heads in place, residual adds and activations into GEMM and
    conv epilogues, and a cast into the row or elementwise kernel producing its input
    (after the epilogues: a GEMM's epilogue may take that kernel first)."""
    results = read_in_place(fuse_attention(results, graph.outputs, graph.causal_masks),
                            graph.outputs)
    return fuse_casts(fuse_epilogues(results, graph.outputs), graph.outputs)


def node_kernels(results: Sequence[NodeResult]) -> list[Kernel]:
    """One kernel per costed or unsupported node, in graph order (unfused execution)."""
    return [Kernel(r.node.name, (r.node.name,), r.node.op_type, r.cost)
            for r in results if r.cost is not None]


def group_kernels(graph: Graph, results: Sequence[NodeResult],
                  rules: FusionRules = COMPILER) -> list[Kernel]:
    """One kernel per fusion group that does any work (fused execution under ``rules``)."""
    return kernels_of(fusion_groups(graph, tuple(results), rules), results)


def kernels_of(groups: Sequence[FusionGroup], results: Sequence[NodeResult]) -> list[Kernel]:
    """One kernel per group that does any work, named after its first costed node."""
    kernels = []
    for g in groups:
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
            optimizer: str = "none", math: str = "graph", runtime: str = "eager",
            memory_format: str = "nchw") -> Forecast:
    """Forecast the latency of one inference pass (or training step) of ``model`` on ``device``.

    ``math``: graph (the graph's dtypes), tf32, tf32-conv, amp-fp16 or amp-bf16 (see
    ``tilecast.analyzer.mathmode``); ``runtime``: eager, cudagraph or graph
    (``analyzer.runtime``); ``memory_format``: nchw or channels-last, the layout PyTorch keeps
    the activations in (channels-last: no layout transposes around tensor-core convs).

    >>> f = analyze("examples/tiny_mlp.onnx", "l4", predictor="roofline")  # doctest: +SKIP
    >>> round(f.total_ms, 3)  # doctest: +SKIP
    """
    if mode not in MODES:
        raise TilecastError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    check_runtime(runtime, memory_format)
    dev = device if isinstance(device, Device) else load_device(device)
    check_math(math, dev)
    pred = resolve_predictor(predictor)
    proto = load_model(model)  # a weightless copy: the caller's proto is never touched
    graph = build_graph(proto, dims)
    results = prepare(graph, runtime,
                      sdpa=pytorch_sdpa(dev.vendor, dev.arch, AMP_DTYPES.get(math)))
    node_count = len(results)
    compiled = runtime == "graph" and mode == "inference"
    if compiled:
        results = fold_batchnorm(results, graph.outputs)
    results = drop_noop_casts(apply_autocast(results, math))  # after: autocast sets dtypes
    if compiled:  # after autocast: an epilogue reads its operand at the dtype it then has
        results = compile_inference(fold_weight_casts(results), graph)
    kernels = group_kernels(graph, results) if fusion else node_kernels(results)
    kernels = expand_steps(results, kernels)
    if mode == "training":
        from .training import training_kernels

        kernels = training_kernels(graph, results, kernels, optimizer=optimizer)
    kernels = tf32_kernels(kernels, math)
    # PyTorch's native batch norm or cuDNN, its NCHW kernels or channels-last ones
    kernels = select_backend(kernels, math, runtime, memory_format)
    preds = apply_runtime(predict_checked(pred, kernels, dev), dev, runtime, kernels,
                          memory_format)
    kf = tuple(KernelForecast(k, p.latency_ms, p.bound, p.tile, p.extrapolated, p.clamped,
                              p.band) for k, p in zip(kernels, preds, strict=True))
    return Forecast(
        model=_model_label(model), device=dev, mode=mode, predictor=pred.name, kernels=kf,
        unsupported=dict(Counter(r.op_key for r in results if r.outcome == "unsupported")),
        zero_cost=dict(Counter(r.op_key for r in results if r.outcome == "zero")),
        unshaped=dict(Counter(r.op_key for r in results if r.outcome == "unshaped")),
        unshaped_from=unshaped_root(results),
        unsupported_reasons=outcome_reasons(results, "unsupported"),
        fusion=fusion, dims=dict(dims or {}), node_count=node_count,
        zero_cost_reasons=outcome_reasons(results, "zero"), math=math, runtime=runtime,
        memory_format=memory_format,
        band_level=getattr(pred, "band_level", None),  # a predictor with error bands
    )


def outcome_reasons(results: Sequence[NodeResult], outcome: str) -> tuple[OpReason, ...]:
    """(op, reason, count) of the nodes with ``outcome`` (zero or unsupported), sorted by op
    then reason."""
    acc = Counter((r.op_key, r.reason) for r in results if r.outcome == outcome)
    return tuple(OpReason(op, reason, n) for (op, reason), n in sorted(acc.items()))
