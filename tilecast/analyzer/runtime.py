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

The memory format (``eager`` and ``cudagraph``; :data:`MEMORY_FORMATS`): cuDNN's tensor-core
convs run on NHWC, so on NCHW activations PyTorch launches a transpose kernel for each of a
conv's tensors (``Prediction.layout_ms``). Channels-last activations need none: of our H100's
channels-last rows (datasets/h100-sxm5-80gb, kernels/nvidia/train/conv*) 443 of 449 forward
convs, 84 of 86 data and 85 of 86 weight gradients launch no ``nchwToNhwc`` / ``nhwcToNchw``
kernel (the rest: 3-channel stems and a 5x5 32-group SIMT fallback), where 247 of 466 NCHW
forward rows do; a 3x3 conv on 1 x 64 x 14 x 14 replayed in 10.97 us NCHW, 5.55
channels-last. The other kernels are forecast as NCHW ones.

Under every runtime a queued kernel's own work (its GPU time less the per-launch part) is at
least :func:`lone_kernel_ms`: a DRAM round trip for its loads and another for its stores to
complete, at the shortest ``Device.dram_latency_ns`` sourced for the vendor (NVIDIA 253.8 ns,
AMD 391.2). The per-launch part is learned from per-op timings, which cannot split the host's
launch from a block's own latency, so subtracting all of it charged a lone block nothing but
the in-graph launch. Our H100 and H200 ran each family's smallest kernel in a CUDA graph in
0.90-6.6 us, above the floor's 0.51 us (docs/math-and-runtimes.md, "A queued kernel's
shortest time").

The two constants live here, once, with their sources (docs/math-and-runtimes.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ..device_db.device import Device
from ..device_db.loader import lowest_dram_latency_ns
from ..errors import TilecastError
from .analysis import NodeResult
from .predictor import Prediction
from .types import Kernel

RUNTIMES = ("eager", "graph", "cudagraph")
# The memory format PyTorch keeps a conv net's activations in: ``nchw`` (its default, and what
# an ONNX Conv states) or ``channels-last`` (``model.to(memory_format=torch.channels_last)``,
# which PyTorch's performance-tuning guide recommends for convnets under AMP; TensorFlow /
# Keras keeps NHWC by default). An exported graph is NCHW whichever ran, so the user says.
NCHW, CHANNELS_LAST = "nchw", "channels-last"
MEMORY_FORMATS = (NCHW, CHANNELS_LAST)
# The runtimes that run PyTorch's eager kernels (a CUDA-graph replay captures exactly those):
# views stay views and model-code activation chains stay their ops (views.py, activations.py).
PYTORCH_RUNTIMES = frozenset({"eager", "cudagraph"})

# Host time PyTorch eager spends per op before the kernel is queued. pytorch/pytorch#41383
# ("Large overhead (7 microseconds) for PyTorch operation", 2020) measures ~7 us per simple
# op with autograd on (~5 us without) in the Python -> dispatcher path; a CUDA op adds the
# cudaLaunchKernel call (back-to-back async launches issue every 3.8 us in NVIDIA's "Getting
# Started with CUDA Graphs", https://developer.nvidia.com/blog/cuda-graphs/ , an upper bound on
# the API's host cost). tilecast uses 10 us: ~7 us of framework plus ~3 us of launch call.
LAUNCH_CALL_US = 3.0
HOST_DISPATCH_US = 7.0 + LAUNCH_CALL_US
# Per-kernel cost inside a CUDA graph: in the same NVIDIA blog, 2.9 us kernels take 3.4 us
# each when launched as one graph (3.8 us as separate launches): ~0.5 us per kernel. It is
# also the gap between two kernels already queued in an eager stream (the GPU's end-of-grid
# to next-grid start, with no host in between).
GRAPH_KERNEL_LAUNCH_US = 0.5
# A kernel an op launches from C++ after its first (``Kernel.follow_on``) skips the Python and
# dispatcher path: the host pays the launch call alone, ~3 of the ~10 us above. tilecast
# charges that share of the kernel's predicted dispatch, so it scales with the measuring host
# as the dispatch does.
FOLLOW_ON_SHARE = LAUNCH_CALL_US / HOST_DISPATCH_US
FOLDED_BN = "folded into Conv (graph runtime)"


def check_runtime(runtime: str, memory_format: str = "nchw") -> None:
    if runtime not in RUNTIMES:
        raise TilecastError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if memory_format not in MEMORY_FORMATS:
        raise TilecastError(f"unknown memory format {memory_format!r}: choose one of "
                            f"{', '.join(MEMORY_FORMATS)}")


def predictor_launch_ms(device: Device) -> float:
    """The per-kernel launch overhead the predictors include in a kernel's GPU time."""
    return device.launch_overhead_us * 1e-3


def _busy_ms(p: Prediction, launch_ms: float, floor_ms: float = 0.0,
             dropped_ms: float = 0.0) -> float:
    """The kernel's own GPU work: its GPU time less the per-launch part the predictor knows
    (``fixed_ms``), or less the device's launch overhead when it does not say, and less
    ``dropped_ms`` (work the runtime does not run); never below ``floor_ms``."""
    gpu = p.gpu_ms if p.gpu_ms is not None else p.latency_ms
    return max(gpu - (p.fixed_ms if p.fixed_ms is not None else launch_ms) - dropped_ms,
               floor_ms)


def lone_kernel_ms(device: Device) -> float:
    """The shortest a queued kernel can run once its launch is hidden: one DRAM round trip for
    its loads and one for its stores to complete (module doc), at the shortest latency sourced
    for any GPU of the device's vendor. One bound for every GPU of a vendor: latencies are
    sourced for about half of the database, and a GPU's own would rank it behind an
    unmeasured one for want of a measurement."""
    ns = lowest_dram_latency_ns(device.vendor)
    return 0.0 if ns is None else 2.0 * ns * 1e-6


def _eager(preds: Sequence[Prediction], device: Device, follow_on: Sequence[bool],
           nhwc: bool) -> list[Prediction]:
    """The host queue (module docstring): a queued kernel pays its work and the GPU's
    inter-kernel gap, one the GPU waits for pays the launch latency after its dispatch.
    ``nhwc``: the activations are channels-last, so no layout transposes run."""
    out, end, issued = [], 0.0, 0.0
    launch, gap = predictor_launch_ms(device), GRAPH_KERNEL_LAUNCH_US * 1e-3
    floor = lone_kernel_ms(device)
    for p, inner in zip(preds, follow_on, strict=True):
        host = p.host_ms if p.host_ms is not None else HOST_DISPATCH_US * 1e-3
        issued += host * FOLLOW_ON_SHARE if inner else host
        start = max(end + gap, issued + launch)
        new_end = start + _busy_ms(p, launch, floor, p.layout_ms if nhwc else 0.0)
        waited = issued > end  # the GPU sat idle for the host
        bound = "overhead" if waited and issued - end >= p.latency_ms else p.bound
        out.append(replace(p, latency_ms=new_end - end, bound=bound))
        end = new_end
    return out


def _graph(preds: Sequence[Prediction], device: Device, nhwc: bool) -> list[Prediction]:
    """One launch for the pass; ``nhwc``: tensor-core convs run on NHWC activations (the
    ``graph`` runtime's compiler picks that layout, or the user's model is channels-last), so
    cuDNN's NCHW <-> NHWC transposes (``layout_ms``) are not run."""
    launch, graph_launch = predictor_launch_ms(device), GRAPH_KERNEL_LAUNCH_US * 1e-3
    floor = lone_kernel_ms(device)
    return [replace(p, latency_ms=_busy_ms(p, launch, floor, p.layout_ms if nhwc else 0.0)
                    + graph_launch)
            for p in preds]


def apply_runtime(preds: Sequence[Prediction], device: Device, runtime: str,
                  kernels: Sequence[Kernel] | None = None,
                  memory_format: str = "nchw") -> list[Prediction]:
    """Kernel GPU times (in launch order) -> the time each adds to the pass under ``runtime``.
    ``kernels``, the predicted kernels, say which are follow-on launches (eager only);
    ``memory_format`` (:data:`MEMORY_FORMATS`): the activations' layout under PyTorch."""
    check_runtime(runtime, memory_format)
    nhwc = memory_format == CHANNELS_LAST or runtime == "graph"
    if runtime == "eager":
        inner = [k.follow_on for k in kernels] if kernels is not None else [False] * len(preds)
        return _eager(preds, device, inner, nhwc)
    return _graph(preds, device, nhwc)


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
