"""``analyze_serving``: prefill and KV-cached decode forecasts of a decoder-only model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from ..analyzer.analysis import NodeResult
from ..analyzer.cast_fusion import drop_noop_casts
from ..analyzer.forecast import below_graph_floor
from ..analyzer.graph import build_graph, load_model
from ..analyzer.native import select_backend
from ..analyzer.pipeline import (
    compile_inference,
    group_kernels,
    node_kernels,
    prepare,
    resolve_predictor,
)
from ..analyzer.predictor import Predictor, predict_checked
from ..analyzer.runtime import apply_runtime, check_runtime
from ..analyzer.steps import expand_steps
from ..analyzer.types import Kernel
from ..device_db import Device, load_device
from ..errors import TilecastError
from ..parallel.api import graph_batch
from ..parallel.cluster import Cluster, cluster_for_device, load_cluster
from ..parallel.context import kv_bytes, sequence_length
from ..parallel.structure import Block, Structure, recognize
from ..parallel.tensor import segment_of
from .decode import decode_kernels, prefill_kernels
from .depth import Depth
from .experts import expert_routing
from .forecast import DecodeStep, GraphFloor, ServingForecast
from .tensor import plan_tensor

# Ten million tokens: past any model's context window, and every count stays exact in int64.
MAX_GENERATE = 10_000_000
MAX_BATCH = 1_000_000  # sequences in one batch
MAX_TP = 1024  # GPUs one model is split over
MAX_LAYERS = 100_000  # transformer layers


def analyze_serving(model: str | os.PathLike[str] | onnx.ModelProto,
                    device: str | os.PathLike[str] | Device, *, generate: int,
                    dims: Mapping[str, int] | None = None,
                    predictor: str | os.PathLike[str] | Predictor | None = None,
                    runtime: str = "eager", fusion: bool = False,
                    batch: int | None = None, tp: int = 1,
                    cluster: str | os.PathLike[str] | Cluster | None = None,
                    layers: int | None = None) -> ServingForecast:
    """Forecast ``batch`` requests of ``prompt`` tokens generating ``generate`` tokens each,
    where the prompt length is the graph's (a decoder-only model's forward pass: export it at
    the prompt length, or bind its dims with ``dims``) and ``batch`` the graph's batch unless
    given (every kernel's work scaled to it): the prefill (time to first token), the decode
    steps with a KV cache (time per output token), and the KV cache's memory. ``tp`` splits
    the model over that many GPUs of ``cluster`` (a preset, JSON or ``Cluster``; default: the
    first preset with this GPU): the figures are then per GPU (``tensor.py``). ``layers``
    forecasts that many transformer layers from a graph exported with fewer (identical) ones.

    >>> f = analyze_serving("llama.onnx", "h100", generate=256)  # doctest: +SKIP
    >>> f.ttft_ms, f.tpot_ms, f.tokens_per_s, f.max_batch  # doctest: +SKIP
    """
    _check_counts(generate, batch, tp, layers)
    check_runtime(runtime)
    dev = device if isinstance(device, Device) else load_device(device)
    pred = resolve_predictor(predictor)
    d = _decoder(model, dims, runtime, fusion)
    if layers and not d.s.layers:
        raise TilecastError(f"{d.label}: --layers repeats transformer layers, and none was "
                            "recognized")
    depth = Depth(d.s.layers, layers or d.s.layers)
    batch = batch or d.batch
    cl = _cluster(cluster, dev) if tp > 1 else None
    kernels, plan = plan_tensor(d.kernels, d.results, d.s, tp, cl, d.batch * d.prompt, depth)
    run = _Runner(pred, dev, runtime, d.results, d.s, depth)
    prefill_ms, extrapolated, _ = run(prefill_kernels(kernels, d.results, d.s, d.prompt, batch,
                                                      d.batch))
    routing = expert_routing(d.results, d.s, d.batch * d.prompt, batch)
    shares = routing.shares
    steps, first_floor = [], None
    for context in decode_contexts(d.prompt, generate):
        step = decode_kernels(kernels, d.results, d.s, d.prompt, context, batch, d.batch, tp,
                              shares)
        ms, ext, floor = run(step, run.weights(step, shares))
        steps.append(DecodeStep(context, ms + plan.comm_ms(batch, batch)))
        if first_floor is None:  # the report shows the first decode step's
            first_floor = floor
        extrapolated |= ext
    kv = sum(kv_bytes(d.results, b) * depth.times(d.s.segment(b.row))  # the graph's batch
             for b in d.attention) / tp
    return ServingForecast(
        model=d.label, device=dev, predictor=pred.name, runtime=runtime, batch=batch,
        prompt=d.prompt, generate=generate,
        prefill_ms=prefill_ms + plan.comm_ms(batch * d.prompt, batch), decode=tuple(steps),
        weights_bytes=plan.weights_bytes, tp=tp, cluster=cl.name if cl is not None else None,
        kv_bytes_per_token=kv / (d.batch * d.prompt), extrapolated=extrapolated,
        layers=depth.target, routing=routing.to_dict(),
        graph_floor=first_floor if first_floor and first_floor.kernels else None)


@dataclass(frozen=True)
class _Decoder:
    """The graph as served: its kernels, recognized structure, prompt length and batch."""

    label: str
    results: tuple[NodeResult, ...]
    s: Structure
    attention: tuple[Block, ...]
    kernels: tuple[Kernel, ...]
    prompt: int
    batch: int


def _decoder(model, dims: Mapping[str, int] | None, runtime: str, fusion: bool) -> _Decoder:
    graph = build_graph(load_model(model), dims)
    results = tuple(prepare(graph, runtime))
    s = recognize(results)
    label = graph.name if isinstance(model, onnx.ModelProto) else str(model)
    attention = tuple(b for b in s.blocks if b.kind == "attention" and b.core)
    _check(results, attention, s.lm_head, label)
    # A cast to the dtype a tensor has is no kernel; a graph runtime fuses what
    # ``compile_inference`` says (attention chains, epilogues, casts). The structure is
    # recognized on the unfused nodes, and a fused kernel keeps its library node's name.
    costed = drop_noop_casts(results)
    if runtime == "graph":
        costed = compile_inference(costed, graph)
    kernels = select_backend(expand_steps(costed, group_kernels(graph, costed) if fusion
                                          else node_kernels(costed)), "graph", runtime)
    return _Decoder(label, results, s, attention, tuple(kernels),
                    min(sequence_length(results, b) for b in attention), graph_batch(graph))


@dataclass(frozen=True)
class _Runner:
    """Forecast a pass's kernels, each as often as its layer runs (``depth.py``)."""

    pred: Predictor
    device: Device
    runtime: str
    results: Sequence[NodeResult]
    s: Structure
    depth: Depth

    def weights(self, kernels: Sequence[Kernel], shares: Mapping[int, float]) -> list[float]:
        """Per kernel, the share of steps it runs in (an expert's; 1 for every other)."""
        index = {r.node.name: i for i, r in enumerate(self.results)}
        return [shares.get(index.get(k.nodes[0], -1), 1.0) if k.nodes else 1.0
                for k in kernels]

    def __call__(self, kernels: Sequence[Kernel],
                 weights: Sequence[float] | None = None) -> tuple[float, bool, GraphFloor]:
        """(ms, extrapolated, the kernels under the in-graph floor) of one pass."""
        preds = apply_runtime(predict_checked(self.pred, list(kernels), self.device), self.device,
                              self.runtime, kernels)
        share = [weights[n] if weights else 1.0 for n in range(len(preds))]
        repeats = [1.0] * len(preds)
        if self.depth.target != self.depth.graph:
            index = {r.node.name: i for i, r in enumerate(self.results)}
            repeats = [self.depth.times(segment_of(k, self.s, index, {})) for k in kernels]
        times = [p.latency_ms * w * r for p, w, r in zip(preds, share, repeats, strict=True)]
        low = [n for n, p in enumerate(preds) if below_graph_floor(p.latency_ms, self.runtime)]
        floor = GraphFloor(round(sum(share[n] * repeats[n] for n in low)),
                           sum(times[n] for n in low))
        return sum(times), any(p.extrapolated for p in preds), floor


def _check_counts(generate: int, batch: int | None, tp: int, layers: int | None) -> None:
    for name, value, top in (("generate", generate, MAX_GENERATE),
                             ("batch", batch if batch is not None else 1, MAX_BATCH),
                             ("tp", tp, MAX_TP),
                             ("layers", layers if layers is not None else 1, MAX_LAYERS)):
        if not 1 <= value <= top:
            raise TilecastError(f"{name} must be 1 to {top:,}, got {value}")


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


def _check(results, attention, lm_head: int | None, label: str) -> None:
    """A decoder-only language model (its attention as MatMul / Softmax nodes or one fused
    node), whose graph is a prefill: no KV cache read."""
    if not attention:
        raise TilecastError(f"{label}: serving forecasts need a decoder's attention, and no "
                            "attention pattern (Q/K/V projections -> softmax(QK^T)V -> output "
                            "projection) was recognized")
    if lm_head is None:
        raise TilecastError(f"{label}: serving forecasts need a language model head (the next "
                            "token's logits: a final weighted MatMul as wide as the embedding "
                            "table), and none was recognized")
    for b in attention:
        scores = results[min(b.core)].cost
        mm = scores.matmul if scores is not None else None
        if mm is not None and mm.m != mm.n:
            raise TilecastError(
                f"{label}: node '{results[min(b.core)].node.name}' attends {mm.m} queries to "
                f"{mm.n} keys: a graph that reads a KV cache (past inputs) is itself a decode "
                "step; serve derives the decode steps from the prefill graph (bind the past "
                "length to 0, or export without past inputs)")
        sources = {t.name for i in b.column for t in results[i].node.inputs[:1]
                   if t is not None}
        if len(sources) > 1:  # K and V projected from another sequence than Q
            raise TilecastError(
                f"{label}: the attention at node '{results[b.row].node.name}' is a "
                "cross-attention (its K and V come from another sequence than its Q): "
                "encoder-decoder models are not supported, only decoder-only ones")


def _cluster(cluster, device: Device) -> Cluster:
    if cluster is None:
        return cluster_for_device(device)
    return cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
