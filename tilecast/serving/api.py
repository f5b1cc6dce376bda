"""``analyze_serving``: prefill and KV-cached decode forecasts of a decoder-only model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import onnx

from ..analyzer.graph import build_graph, load_model
from ..analyzer.pipeline import group_kernels, node_kernels, prepare, resolve_predictor
from ..analyzer.predictor import Predictor
from ..analyzer.runtime import apply_runtime, check_runtime
from ..analyzer.steps import expand_steps
from ..analyzer.types import Kernel
from ..device_db import Device, load_device
from ..errors import TilecastError
from ..parallel.cluster import Cluster, cluster_for_device, load_cluster
from ..parallel.context import kv_bytes, sequence_length
from ..parallel.structure import recognize
from .decode import decode_kernels, prefill_kernels
from .forecast import DecodeStep, ServingForecast
from .tensor import plan_tensor

# Ten million tokens: past any model's context window, and every count stays exact in int64.
MAX_GENERATE = 10_000_000
MAX_BATCH = 1_000_000  # sequences in one batch
MAX_TP = 1024  # GPUs one model is split over


def analyze_serving(model: str | os.PathLike[str] | onnx.ModelProto,
                    device: str | os.PathLike[str] | Device, *, generate: int,
                    dims: Mapping[str, int] | None = None,
                    predictor: str | os.PathLike[str] | Predictor | None = None,
                    runtime: str = "eager", fusion: bool = False,
                    batch: int | None = None, tp: int = 1,
                    cluster: str | os.PathLike[str] | Cluster | None = None,
                    ) -> ServingForecast:
    """Forecast ``batch`` requests of ``prompt`` tokens generating ``generate`` tokens each,
    where the prompt length is the graph's (a decoder-only model's forward pass: export it at
    the prompt length, or bind its dims with ``dims``) and ``batch`` the graph's batch unless
    given (every kernel's work scaled to it): the prefill (time to first token), the decode
    steps with a KV cache (time per output token), and the KV cache's memory. ``tp`` splits
    the model over that many GPUs of ``cluster`` (a preset, JSON or ``Cluster``; default: the
    first preset with this GPU): the figures are then per GPU (``tensor.py``).

    >>> f = analyze_serving("llama.onnx", "h100", generate=256)  # doctest: +SKIP
    >>> f.ttft_ms, f.tpot_ms, f.tokens_per_s, f.max_batch  # doctest: +SKIP
    """
    if not 1 <= generate <= MAX_GENERATE:
        raise TilecastError(f"generate must be 1 to {MAX_GENERATE:,} tokens, got {generate}")
    check_runtime(runtime)
    dev = device if isinstance(device, Device) else load_device(device)
    pred = resolve_predictor(predictor)
    proto = load_model(model)
    graph = build_graph(proto, dims)
    results = prepare(graph, runtime)
    s = recognize(results)
    label = graph.name if isinstance(model, onnx.ModelProto) else str(model)
    attention = [b for b in s.blocks if b.kind == "attention" and b.core]
    _check(results, attention, label)
    prompt = min(sequence_length(results, b) for b in attention)
    graph_batch = _batch(graph)
    batch = graph_batch if batch is None else batch
    if not 1 <= batch <= MAX_BATCH:
        raise TilecastError(f"batch must be 1 to {MAX_BATCH:,} sequences, got {batch}")
    kernels = expand_steps(results, group_kernels(graph, results) if fusion
                           else node_kernels(results))
    if not 1 <= tp <= MAX_TP:
        raise TilecastError(f"tp must be 1 to {MAX_TP}, got {tp}")
    cl = _cluster(cluster, dev) if tp > 1 else None
    kernels, plan = plan_tensor(kernels, results, s, tp, cl, graph_batch * prompt)
    prefill_ms, extrapolated = _forecast(
        pred, prefill_kernels(kernels, results, s, prompt, batch, graph_batch), dev, runtime)
    prefill_ms += plan.comm_ms(batch * prompt, batch)
    kv = [kv_bytes(results, b) / tp for b in attention]  # the graph's sequences, per layer
    steps = []
    for context in decode_contexts(prompt, generate):
        ms, ext = _forecast(pred, decode_kernels(kernels, results, s, prompt, context, batch,
                                                 graph_batch, tp), dev, runtime)
        steps.append(DecodeStep(context, ms + plan.comm_ms(batch, batch)))
        extrapolated |= ext
    return ServingForecast(
        model=label, device=dev,
        predictor=pred.name, runtime=runtime, batch=batch, prompt=prompt, generate=generate,
        prefill_ms=prefill_ms, decode=tuple(steps),
        weights_bytes=plan.weights_bytes, tp=tp, cluster=cl.name if cl is not None else None,
        kv_bytes_per_token=sum(kv) / (graph_batch * prompt), extrapolated=extrapolated)


def parse_batches(text: str) -> tuple[int, ...]:
    """``--batch 1,8,32``: positive batch sizes, each at most ``MAX_BATCH``."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(not 1 <= b <= MAX_BATCH for b in sizes):
        raise TilecastError(f"--batch {text!r}: expected batch sizes from 1 to {MAX_BATCH:,}, "
                            "comma-separated (e.g. 1,8,32)")
    return sizes


def decode_contexts(prompt: int, generate: int) -> list[int]:
    """The keys each forecast decode step attends over: token t (2..generate) sees
    prompt + t - 1. Every step for up to three, else the first, the middle and the last
    (Simpson's rule integrates the mean: ``ServingForecast.tpot_ms``)."""
    first, last = prompt + 1, prompt + generate - 1
    if generate - 1 <= 3:
        return list(range(first, last + 1))
    return [first, (first + last) // 2, last]


def _check(results, attention, label: str) -> None:
    if not attention:
        raise TilecastError(f"{label}: serving forecasts need a decoder's attention, and no "
                            "attention pattern (Q/K/V projections -> softmax(QK^T)V -> output "
                            "projection) was recognized")
    for b in attention:
        first = results[min(b.core)]
        if first.cost is not None and first.cost.family == "attention":
            raise TilecastError(
                f"{label}: node '{first.node.name}' ({first.node.op_type}) is a fused attention "
                "node; decode forecasts take the attention as MatMul and Softmax nodes "
                "(tilecast export --attn eager)")


def _cluster(cluster, device: Device) -> Cluster:
    if cluster is None:
        return cluster_for_device(device)
    return cluster if isinstance(cluster, Cluster) else load_cluster(cluster)


def _batch(graph) -> int:
    shapes = [t.shape for t in graph.inputs if t.shape]
    return shapes[0][0] if shapes and shapes[0][0] > 0 else 1


def _forecast(pred: Predictor, kernels: Sequence[Kernel], device: Device,
              runtime: str) -> tuple[float, bool]:
    preds = apply_runtime(pred.predict(list(kernels), device), device, runtime)
    return sum(p.latency_ms for p in preds), any(p.extrapolated for p in preds)
