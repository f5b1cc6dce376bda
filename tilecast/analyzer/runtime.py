"""Runtimes: how the host issues the predicted kernels (eager dispatch or a captured graph).

Predictors return each kernel's GPU time, including the device's per-kernel launch overhead
(``Device.launch_overhead_us``). The runtime is applied after prediction, so it holds for every
predictor:

- ``eager`` (PyTorch eager, the default): the host dispatches kernels one after another, each
  taking :data:`HOST_DISPATCH_US`, and runs ahead of the GPU asynchronously. Kernel ``i`` cannot
  start before the host has issued it: ``start_i = max(end_{i-1}, (i + 1) * dispatch)``. While
  kernels are longer than the dispatch, the host's lead grows and short kernels later run back
  to back; a run of kernels shorter than the dispatch leaves the GPU idle between them. Each
  kernel is charged ``end_i - end_{i-1}`` (so the total is the last kernel's end).
- ``graph`` (CUDA graphs, XLA, TensorRT-style): the whole pass is one launch, so there is no
  host floor and each kernel's launch overhead becomes :data:`GRAPH_KERNEL_LAUNCH_US`; at
  inference, a BatchNormalization fed only by a Conv is folded into the Conv's weights.

The two constants live here, once, with their sources (docs/math-and-runtimes.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..device_db.device import Device
from ..errors import TilecastError
from .analysis import NodeResult
from .predictor import Prediction

RUNTIMES = ("eager", "graph")

# Host time PyTorch eager spends per op before the kernel is queued. pytorch/pytorch#41383
# ("Large overhead (7 microseconds) for PyTorch operation", 2020) measures ~7 us per simple
# op with autograd on (~5 us without) in the Python -> dispatcher path; a CUDA op adds the
# cudaLaunchKernel call (back-to-back async launches issue every 3.8 us in NVIDIA's "Getting
# Started with CUDA Graphs", https://developer.nvidia.com/blog/cuda-graphs/ , an upper bound on
# the API's host cost). tilecast uses 10 us: ~7 us of framework plus ~3 us of launch call.
HOST_DISPATCH_US = 10.0
# Per-kernel cost inside a CUDA graph: in the same NVIDIA blog, 2.9 us kernels take 3.4 us
# each when launched as one graph (3.8 us as separate launches): ~0.5 us per kernel.
GRAPH_KERNEL_LAUNCH_US = 0.5
FOLDED_BN = "folded into Conv (graph runtime)"


def check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise TilecastError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")


def predictor_launch_ms(device: Device) -> float:
    """The per-kernel launch overhead the predictors include in a kernel's GPU time."""
    return device.launch_overhead_us * 1e-3


def _eager(preds: Sequence[Prediction]) -> list[Prediction]:
    """A predictor that knows its kernels' GPU time apart from the host dispatch of their op
    (``gpu_ms``, ``host_ms``: the learned predictor, from the per-op measurements) is
    simulated with those; others with the kernel latency and :data:`HOST_DISPATCH_US`."""
    out, end, issued = [], 0.0, 0.0
    for p in preds:
        issued += p.host_ms if p.host_ms is not None else HOST_DISPATCH_US * 1e-3
        start = max(end, issued)
        new_end = start + (p.gpu_ms if p.gpu_ms is not None else p.latency_ms)
        waited = issued > end  # the GPU sat idle for the host
        bound = "overhead" if waited and issued - end >= p.latency_ms else p.bound
        out.append(replace(p, latency_ms=new_end - end, bound=bound))
        end = new_end
    return out


def _graph(preds: Sequence[Prediction], device: Device) -> list[Prediction]:
    launch, graph_launch = predictor_launch_ms(device), GRAPH_KERNEL_LAUNCH_US * 1e-3
    return [replace(p, latency_ms=max((p.gpu_ms if p.gpu_ms is not None else p.latency_ms)
                                      - launch, 0.0) + graph_launch)
            for p in preds]


def apply_runtime(preds: Sequence[Prediction], device: Device,
                  runtime: str) -> list[Prediction]:
    """Kernel GPU times (in launch order) -> the time each adds to the pass under ``runtime``."""
    check_runtime(runtime)
    return _eager(preds) if runtime == "eager" else _graph(preds, device)


def fold_batchnorm(results: Sequence[NodeResult],
                   graph_outputs: Iterable[str] = ()) -> tuple[NodeResult, ...]:
    """Inference under a graph runtime: BatchNormalization(Conv(x)) becomes the Conv alone
    (scale and shift fold into its weights and bias) when the BN is the conv output's only
    reader; the BN is zero-cost, with a reason."""
    uses = Counter(t.name for r in results for t in r.node.inputs if t is not None)
    uses.update(graph_outputs)
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    out = list(results)
    for j, bn in enumerate(results):
        if bn.node.op_type != "BatchNormalization" or bn.node.domain or bn.outcome != "costed":
            continue
        if bn.node.attr("training_mode", 0) or not bn.node.inputs or bn.node.inputs[0] is None:
            continue
        x = bn.node.inputs[0]
        i = producer.get(x.name)
        conv = out[i] if i is not None else None
        if conv is None or conv.node.op_type != "Conv" or conv.outcome != "costed" \
                or uses[x.name] != 1:
            continue
        # The Conv now writes the BN's output (same shape and dtype): rewire, keep its cost.
        out[i] = replace(conv, node=replace(conv.node, outputs=bn.node.outputs[:1]))
        out[j] = NodeResult(replace(bn.node, inputs=(), outputs=()), "zero", None, FOLDED_BN)
    return tuple(out)
