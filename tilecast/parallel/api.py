"""``analyze_parallel``: one training step of a model on a cluster under a parallel layout."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import onnx

from ..analyzer.analysis import NodeResult
from ..analyzer.cast_fusion import drop_noop_casts
from ..analyzer.forecast import KernelForecast
from ..analyzer.fusion import fusion_groups
from ..analyzer.graph import build_graph, load_model
from ..analyzer.mathmode import AMP_DTYPES, apply_autocast, check_math, tf32_kernels
from ..analyzer.native import select_backend
from ..analyzer.params import parameters
from ..analyzer.pipeline import kernels_of, node_kernels, prepare, resolve_predictor
from ..analyzer.predictor import Predictor, predict_checked
from ..analyzer.runtime import apply_runtime, check_runtime
from ..analyzer.sdpa_kernels import ANY_GPU, SdpaKernels, pytorch_sdpa
from ..analyzer.training import OPTIMIZER_TRAFFIC, training_kernels
from ..analyzer.types import Kernel, OpCost, TensorInfo
from ..device_db import Device, load_device
from ..errors import TilecastError
from .cluster import Cluster, load_cluster
from .context import (
    attention_cores,
    attention_exchanges,
    context_kernels,
    sequence_length,
    shrunk_forward,
)
from .experts import (
    ExpertGroup,
    ExpertPlan,
    expert_kernels,
    grown_forward,
    plan_experts,
    recognize_experts,
)
from .forecast import ParallelForecast
from .layout import Layout
from .loss import cross_entropy
from .megatron import MEGATRON_FUSION, fused_backward, fused_internal
from .segments import Segment, segment_costs
from .stages import build_stages
from .structure import EPILOGUE, PROLOGUE, Structure, recognize
from .tensor import Roles, check_divisible, roles, shard_kernels


def _graph(model: str | os.PathLike[str] | onnx.ModelProto, dims: Mapping[str, int] | None,
           runtime: str = "eager", sdpa: SdpaKernels = ANY_GPU):
    """The model's nodes as each rank's runtime runs them (the single-GPU front end)."""
    proto = load_model(model)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    graph = build_graph(proto, dims)
    return proto, graph, prepare(graph, runtime, sdpa=sdpa)


def _clip_kernel(param_bytes: float, dtype: str) -> Kernel:
    """Gradient clipping by global norm: one pass to compute the norm, one to scale
    (read + write): three passes over the gradients, memory-bound."""
    n = int(param_bytes)
    return Kernel("grad_clip", (), "ClipGradNorm",
                  OpCost("elementwise", n, 3 * n, dtype, elements=n // 4), "update")


def _clip_ms_per_byte(units: Sequence[Segment], dtype: str, pred: Predictor,
                      device: Device) -> float:
    total = sum(u.param_bytes for u in units)
    if not total:
        return 0.0
    return pred.predict([_clip_kernel(total, dtype)], device)[0].latency_ms / total


def _fused_update(units: Sequence[Segment], optimizer: str, dtype: str, pred: Predictor,
                  device: Device) -> None:
    """Re-time each unit's optimizer step as its share of one multi-tensor kernel."""
    total = sum(u.update_bytes for u in units)
    elements = int(sum(u.param_elems for u in units))
    if not total or not elements:
        return
    flops = OPTIMIZER_TRAFFIC[optimizer][1] * elements
    k = Kernel(f"fused_{optimizer}", (), f"Fused{optimizer.capitalize()}",
               OpCost("elementwise", flops, int(total), dtype, elements=elements), "update")
    per_byte = pred.predict([k], device)[0].latency_ms / total
    for u in units:
        u.update_ms = per_byte * u.update_bytes


def _add_loss(last: Segment, logits: TensorInfo, layout: Layout, pred: Predictor,
               device: Device, runtime: str) -> None:
    """The cross entropy on the last layer's segment: its kernels on this rank's tokens and
    vocabulary slice, its saved softmax and its tensor-parallel all-reduces."""
    if not logits.shape or not logits.known:
        return
    vocab = logits.shape[-1]
    lk = cross_entropy(logits.numel // vocab // layout.cp, vocab, logits.dtype, layout.tp)
    for kernels, phase in ((lk.forward, "forward"), (lk.backward, "backward")):
        ms = sum(p.latency_ms for p in apply_runtime(pred.predict(list(kernels), device),
                                                     device, runtime, kernels))
        flops = sum(k.flops for k in kernels)
        if phase == "forward":
            last.fwd_ms, last.fwd_flops = last.fwd_ms + ms, last.fwd_flops + flops
        else:
            last.bwd_ms, last.bwd_flops = last.bwd_ms + ms, last.bwd_flops + flops
    last.activation_bytes += lk.saved_bytes
    last.tp_fwd.extend(lk.all_reduces)


def graph_batch(graph) -> int:
    """The graph's batch: the first dim of its first shaped input (1 where unknown)."""
    shapes = [t.shape for t in graph.inputs if t.shape]
    return shapes[0][0] if shapes and shapes[0][0] > 0 else 1


def analyze_parallel(model: str | os.PathLike[str] | onnx.ModelProto,
                     layout: Layout, *, cluster: str | os.PathLike[str] | Cluster,
                     device: str | os.PathLike[str] | Device | None = None,
                     dims: Mapping[str, int] | None = None,
                     predictor: str | os.PathLike[str] | Predictor | None = None,
                     optimizer: str = "adam", layers: int | None = None,
                     clip_grad: bool = True, fusion: bool = False,
                     fused_optimizer: bool = True, runtime: str = "eager",
                     loss: bool = True, math: str = "graph",
                     memory_format: str = "nchw") -> ParallelForecast:
    """Forecast one training step of ``model`` (its graph batch is one microbatch) on
    ``layout.gpus`` GPUs of ``cluster``. ``layers`` repeats the graph's first transformer
    layer up to that many layers (export a model with few layers, forecast the full depth;
    where the layers differ in kind, MoE or dense, with or without cross-attention, their
    shortest repeating run is repeated instead).
    ``fusion`` forecasts Megatron-LM's fused kernels (``megatron.py``: fused elementwise
    chains such as bias-GeLU and bias-dropout-add; the scale-mask-softmax, forward and
    backward, in 16-bit only).
    ``fused_optimizer`` forecasts the optimizer step as multi-tensor kernels (Megatron-LM's
    apex FusedAdam, PyTorch's default foreach Adam on CUDA): the same bytes as one kernel per
    parameter without a launch and a partly filled GPU per small tensor. ``runtime`` (eager or
    graph) issues each rank's kernels as ``tilecast analyze --runtime`` does, on
    ``memory_format`` activations (``--memory-format``). ``loss`` adds
    Megatron-LM's vocabulary-parallel cross entropy after the LM head (``loss.py``).
    ``math`` runs an fp32 graph as ``tilecast analyze --math`` does (analyzer.mathmode):
    ``tf32`` on TF32 tensor cores (``tf32-conv``: its convs only), ``amp-fp16`` / ``amp-bf16``
    under ``torch.autocast`` with
    its casts (each rank casts its shard of a split weight); the parameters, their gradients
    and the optimizer stay in the graph's dtype (fp32 master weights).

    >>> f = analyze_parallel("gpt2.onnx", Layout(dp=2, tp=2), cluster="dgx-a100")  # doctest: +SKIP
    >>> f.step_ms, [r.bubble_ms for r in f.ranks]  # doctest: +SKIP
    """
    check_runtime(runtime, memory_format)
    cl = load_cluster(cluster)
    if device is not None:
        cl = replace(cl, device=load_device(device))
    check_math(math, cl.device)
    pred = resolve_predictor(predictor)
    proto, graph, results = _graph(model, dims, runtime, pytorch_sdpa(
        cl.device.vendor, cl.device.arch, AMP_DTYPES.get(math)))
    results = drop_noop_casts(apply_autocast(results, math))
    s = recognize(results)
    warnings = list(s.warnings)
    moe, plan = _check_structure(results, s, layout, layers, graph.name or str(model))
    r = roles(results, s, layout.sequence_parallel)
    groups = fusion_groups(graph, results, MEGATRON_FUSION) if fusion else ()
    forward = kernels_of(groups, results) if fusion else node_kernels(results)
    kernels = training_kernels(graph, results, forward, optimizer=optimizer)
    if fusion:
        kernels = fused_backward(kernels, forward, results)
    index = {res.node.name: i for i, res in enumerate(results)}
    kernels = _rank_kernels(kernels, results, index, layout, plan, r, s)
    dtype = _update_dtype(results, kernels)
    kernels = tf32_kernels(kernels, math)
    kernels = select_backend(kernels, math, runtime, memory_format)  # native batch norm, cuDNN
    # Each rank issues its kernels like a single GPU (analyzer.runtime): in eager mode the
    # host runs ahead of long kernels, so a short kernel after them costs its GPU time only.
    preds = apply_runtime(predict_checked(pred, kernels, cl.device), cl.device, runtime, kernels,
                          memory_format)
    kf = [KernelForecast(k, p.latency_ms, p.bound, p.tile, p.extrapolated)
          for k, p in zip(kernels, preds, strict=True)]
    internal = fused_internal(results, groups, frozenset(graph.outputs))
    exchanges = attention_exchanges(results, s, layout.cp, layout.cp_comm, layout.tp) \
        if layout.cp > 1 else ()
    segs = segment_costs(results, kf, s, r, layout.tp, proto, layout.sequence_parallel,
                         internal, plan, layout.cp, exchanges, layout.cp_comm)
    units = _units(segs, s.layers, layers or s.layers, _period(s, moe))
    if loss and s.lm_head is not None:
        _add_loss(units[-1], results[s.lm_head].node.outputs[0], layout, pred, cl.device,
                  runtime)
    if s.layers == 1 and (layers or 1) > 1:
        warnings.append("repeating the only layer of a one-layer graph leaves out the norm and "
                        "residual add that sit outside it: export two layers")
    if layout.pp > len(units):
        raise TilecastError(f"pp={layout.pp} needs at least {layout.pp} layers, the model "
                            f"has {len(units)}")
    if fused_optimizer and optimizer != "none":
        _fused_update(units, optimizer, dtype, pred, cl.device)
    clip = _clip_ms_per_byte(units, dtype, pred, cl.device) if clip_grad else None
    ranks, collectives = build_stages(units, layout, cl, clip, dtype, optimizer)
    return ParallelForecast(
        model=str(model) if not isinstance(model, onnx.ModelProto) else graph.name,
        cluster=cl, layout=layout, predictor=pred.name, layers=layers or s.layers,
        graph_layers=s.layers, microbatch=graph_batch(graph), ranks=tuple(ranks),
        collectives=tuple(collectives), warnings=tuple(warnings + _memory_warnings(ranks)),
        runtime=runtime, experts=max((g.experts for g in moe), default=0),
        sequence=min((sequence_length(results, b) for b in s.blocks
                      if b.kind == "attention" and b.core), default=0),
        peak_tflops=gemm_peak_tflops(kernels, cl.device), math=math,
        memory_format=memory_format)


def _update_dtype(results: Sequence[NodeResult], kernels: Sequence[Kernel]) -> str:
    """The dtype the optimizer step and gradient clipping run in: the parameters' (fp32
    master weights under autocast), else the first kernel's."""
    dtypes = Counter(t.dtype for t in parameters(results).values())
    if dtypes:
        return dtypes.most_common(1)[0][0]
    return kernels[0].dtype if kernels else "float32"


def gemm_peak_tflops(kernels: Sequence[Kernel], device: Device) -> float:
    """The per-GPU peak of the dtype that carries most of the GEMM FLOPs (tensor cores where
    the GPU has them for it): what the achieved TFLOP/s is a share of."""
    flops: Counter[str] = Counter()
    for k in kernels:
        if k.cost.family in ("matmul", "attention"):
            flops[k.dtype] += k.flops
    dtype = flops.most_common(1)[0][0] if flops else "float32"
    return device.peak_tflops(dtype, "matrix")


def _rank_kernels(kernels: Sequence[Kernel], results: Sequence[NodeResult],
                  index: Mapping[str, int], layout: Layout, plan: ExpertPlan | None,
                  r: Roles, s: Structure) -> list[Kernel]:
    """The kernels one rank runs: its experts on ep x the rows, then 1/cp of the sequence,
    then its tensor-parallel shard (each step reads the forward dims the previous left)."""
    forward: dict = {}
    if plan is not None:
        kernels = expert_kernels(kernels, results, plan, index)
        forward = grown_forward(results, plan)
    if layout.cp > 1:
        heads = attention_cores(s) if layout.cp_comm == "a2a" else frozenset()
        kernels = context_kernels(kernels, results, index, layout.cp, forward, heads)
        forward = shrunk_forward(results, layout.cp, forward, heads)
    return shard_kernels(kernels, results, r, index, layout.tp, forward)


def _check_structure(results: Sequence[NodeResult], s: Structure, layout: Layout,
                     layers: int | None, name: str,
                     ) -> tuple[tuple[ExpertGroup, ...], ExpertPlan | None]:
    """The graph's MoE layers and this rank's expert plan; an error where the layout needs
    a structure the graph does not have."""
    if (layout.tp > 1 or layout.pp > 1 or layers) and not s.layers:
        raise TilecastError(f"tensor/pipeline parallelism and layer replication need "
                            f"transformer layers, but none was recognized in {name}: "
                            f"{'; '.join(s.warnings)}")
    if layout.tp > 1:
        check_divisible(results, s, layout.tp)
    moe = recognize_experts(results, s)
    if layout.ep > 1 and not moe:
        raise TilecastError(f"ep={layout.ep} needs mixture-of-experts layers (MLP blocks fed "
                            f"by slices of one token buffer, one per expert), but none was "
                            f"recognized in {name}")
    return moe, plan_experts(results, moe, layout.ep) if layout.ep > 1 else None


def _period(s: Structure, moe: Sequence[ExpertGroup]) -> int:
    """The shortest run of layers whose pattern the graph repeats, a layer's kind being its
    attention blocks (two in a decoder layer with cross-attention) and whether it is MoE: 1
    for a model whose layers are all alike, 2 for Switch's MoE layer every second layer, the
    whole graph for an encoder-decoder (so its encoder and decoder layers grow together)."""
    if not s.layers:
        return 1
    moe_layers = {s.segment(min(g.rows)) for g in moe}
    attention = Counter(s.segment(b.row) for b in s.blocks if b.kind == "attention")
    kinds = [(i in moe_layers, attention[i]) for i in range(s.layers)]
    return next(p for p in range(1, s.layers + 1)
                if all(kinds[i] == kinds[i % p] for i in range(s.layers)))


def _units(segs: Mapping, graph_layers: int, target: int, period: int = 1) -> list[Segment]:
    """Per-layer segments, the prologue folded into the first and the epilogue into the
    last; when ``target`` exceeds the graph's layers, its first ``period`` layers (the
    repeating dense / MoE pattern) are repeated in turn after them."""
    if graph_layers == 0:
        unit = Segment()
        for seg in segs.values():
            unit.add(seg)
        return [unit]
    if target < graph_layers:
        raise TilecastError(f"layers={target} is fewer than the graph's {graph_layers}")
    units = [segs[i].copy() for i in range(graph_layers)]
    units[period:period] = [segs[j % period].copy() for j in range(target - graph_layers)]
    units[0].add(segs[PROLOGUE])
    units[-1].add(segs[EPILOGUE])
    return units


def _memory_warnings(ranks: Sequence) -> list[str]:
    out = []
    for r in ranks:
        m = r.memory
        if not m.fits:
            out.append(f"stage {r.stage} needs {m.total / 2**30:.1f} GiB per GPU, more than "
                       f"the device's {m.capacity / 2**30:.0f} GiB")
    return out
