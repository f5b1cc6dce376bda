"""Runtimes: how the host issues the predicted kernels (eager dispatch or a captured graph).

Predictors return each kernel's GPU time as a per-op timing measures it: the work plus a
per-launch part (the learned predictor's ``fixed_ms``; the roofline's
``Device.launch_overhead_us``). The runtime is applied after prediction, so it holds for every
predictor:

- ``eager`` (PyTorch eager, the default): the host dispatches kernels one after another, each
  taking :data:`HOST_DISPATCH_US` (the learned predictor's ``host_ms``), and runs ahead of the
  GPU asynchronously. Kernel ``i`` starts at ``max(end_{i-1} + gap, issued_i + launch)``
  (gap: :data:`GRAPH_KERNEL_LAUNCH_US`, launch: ``Device.launch_overhead_us``) and then runs
  its work. While kernels are longer than the dispatch, the host's lead grows and later
  kernels run back to back, one gap apart: the per-launch part a per-op timing adds (the
  harness records its start event before the op is called, so the op's dispatch and launch
  fall inside) is hidden behind the previous kernel. A run of kernels shorter than the
  dispatch leaves the GPU idle between them. Each kernel is charged ``end_i - end_{i-1}``
  (so the total is the last kernel's end).
- ``graph`` (XLA, TensorRT-style compilers): the whole pass is one launch, so there is no
  host floor and each kernel's per-launch part becomes :data:`GRAPH_KERNEL_LAUNCH_US`; at
  inference, a BatchNormalization fed only by a Conv is folded into the Conv's weights, the
  scale, residual or bias add and ReLU / GELU after a Conv or GEMM run in its epilogue
  (``epilogues``), and
  tensor-core convs run on the NHWC layout the compiler picks, without cuDNN's NCHW <-> NHWC
  transposes (``Prediction.layout_ms``).
- ``cudagraph`` (PyTorch's ``torch.cuda.graphs``: the eager kernels captured and replayed):
  launched as ``graph`` is, but every kernel eager runs stays, BatchNormalization included. An
  H100 ResNet-50 bf16 replay runs 106 batch-norm kernels, 8.6 of its 27.5 ms at batch 256
  (datasets/h100-sxm5-80gb/traces).

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

RUNTIMES = ("eager", "graph", "cudagraph")
# The runtimes that run PyTorch's eager kernels (a CUDA-graph replay captures exactly those):
# views stay views and model-code activation chains stay their ops (views.py, activations.py).
PYTORCH_RUNTIMES = frozenset({"eager", "cudagraph"})

# Host time PyTorch eager spends per op before the kernel is queued. pytorch/pytorch#41383
# ("Large overhead (7 microseconds) for PyTorch operation", 2020) measures ~7 us per simple
# op with autograd on (~5 us without) in the Python -> dispatcher path; a CUDA op adds the
# cudaLaunchKernel call (back-to-back async launches issue every 3.8 us in NVIDIA's "Getting
# Started with CUDA Graphs", https://developer.nvidia.com/blog/cuda-graphs/ , an upper bound on
# the API's host cost). tilecast uses 10 us: ~7 us of framework plus ~3 us of launch call.
HOST_DISPATCH_US = 10.0
# Per-kernel cost inside a CUDA graph: in the same NVIDIA blog, 2.9 us kernels take 3.4 us
# each when launched as one graph (3.8 us as separate launches): ~0.5 us per kernel. It is
# also the gap between two kernels already queued in an eager stream (the GPU's end-of-grid
# to next-grid start, with no host in between).
GRAPH_KERNEL_LAUNCH_US = 0.5
FOLDED_BN = "folded into Conv (graph runtime)"


def check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise TilecastError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")


def predictor_launch_ms(device: Device) -> float:
    """The per-kernel launch overhead the predictors include in a kernel's GPU time."""
    return device.launch_overhead_us * 1e-3


def _busy_ms(p: Prediction, launch_ms: float) -> float:
    """The kernel's own GPU work: its GPU time less the per-launch part the predictor knows
    (``fixed_ms``), or less the device's launch overhead when it does not say."""
    gpu = p.gpu_ms if p.gpu_ms is not None else p.latency_ms
    return max(gpu - (p.fixed_ms if p.fixed_ms is not None else launch_ms), 0.0)


def _eager(preds: Sequence[Prediction], device: Device) -> list[Prediction]:
    """The host queue (module docstring): a queued kernel pays its work and the GPU's
    inter-kernel gap, one the GPU waits for pays the launch latency after its dispatch."""
    out, end, issued = [], 0.0, 0.0
    launch, gap = predictor_launch_ms(device), GRAPH_KERNEL_LAUNCH_US * 1e-3
    for p in preds:
        issued += p.host_ms if p.host_ms is not None else HOST_DISPATCH_US * 1e-3
        start = max(end + gap, issued + launch)
        new_end = start + _busy_ms(p, launch)
        waited = issued > end  # the GPU sat idle for the host
        bound = "overhead" if waited and issued - end >= p.latency_ms else p.bound
        out.append(replace(p, latency_ms=new_end - end, bound=bound))
        end = new_end
    return out


def _graph(preds: Sequence[Prediction], device: Device, compiled: bool) -> list[Prediction]:
    """One launch for the pass; ``compiled`` (the ``graph`` runtime) also picks NHWC layouts
    for tensor-core convs, so cuDNN's NCHW <-> NHWC transposes (``layout_ms``) are not run."""
    launch, graph_launch = predictor_launch_ms(device), GRAPH_KERNEL_LAUNCH_US * 1e-3
    return [replace(p, latency_ms=max(_busy_ms(p, launch) - (p.layout_ms if compiled else 0.0),
                                      0.0) + graph_launch)
            for p in preds]


def apply_runtime(preds: Sequence[Prediction], device: Device,
                  runtime: str) -> list[Prediction]:
    """Kernel GPU times (in launch order) -> the time each adds to the pass under ``runtime``."""
    check_runtime(runtime)
    if runtime == "eager":
        return _eager(preds, device)
    return _graph(preds, device, compiled=runtime == "graph")


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
