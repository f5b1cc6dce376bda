"""A floor on kernels whose threads keep one load in flight each: PyTorch's own NCHW batch-norm
and max-pool kernels, and its non-vectorized elementwise loop.

Such a kernel cannot run faster than its threads can wait for their loads: every thread waits
one DRAM latency per element it walks (``analyzer.native``: the launch PyTorch makes), and an
SM runs only as many of its blocks at once as its thread and block limits allow. So

    busy >= ceil(blocks / (SMs x resident blocks per SM)) x steps x DRAM latency

for the walks whose grid is set by the tensor's channels or outputs (the per-channel batch
norm kernels, max pool), each of which only grows with the tensor. The normalize pass
(``transform``) fills the GPU with blocks whose shape PyTorch changes by band of the map's size
(a 260-pixel map runs 128-thread blocks, a 259-pixel one 64-thread blocks), so its launch-based
floor would fall as the map or the channels grow (by up to 1.7x at a band's edge). Its floor is
the same law at full occupancy instead, elements over resident threads:

    busy >= ceil(N C H W / (SMs x resident threads per SM)) x DRAM latency

which only grows with the tensor and is 0.81x the launch-based figure over ResNet-50's 53 maps
(the launch leaves lanes idle in its last step).
Both use the unloaded latency a pointer chase measures (``Device.dram_latency_ns``, sourced per
GPU). Little's law on one SM, no fitted constant.

A step's loads do not all come back one latency later: every resident thread issues its load
at once, and the DRAM serves them at its bandwidth, so the last answer arrives the step's
bytes / bandwidth after the first. Summed over the steps that queue is the kernel's bytes at
the bandwidth, added to the walk:

    busy >= steps x DRAM latency + bytes / bandwidth

(the closed-system bound of one delay station, the latency, in series with one server, the
DRAM). A per-channel walk of few blocks barely queues; the normalize pass over a large map
queues as long as it waits: ResNet-50's 256 x 56 x 56 normalize at batch 256 on our H100,
761 rounds x 375.1 ns = 285 us plus 822 MB at 3.35 TB/s = 245 us, 531 us against the 539 us
traced, where the walk alone said 285 (docs/predictor.md, "Batch norm and max pool on
PyTorch's native kernels"). The datasheet bandwidth keeps it a floor. The learned models never
saw these kernels (the training data is fp32, whose batch norms PyTorch hands to cuDNN, and
has no pool), and the elementwise copy rate they give is 3-20x too fast for a per-channel walk.

**The non-vectorized loop** (``analyzer.native``: a broadcast operand, a permuted copy) walks
``vt`` outputs per thread, each a memory round trip after the last, so

    busy >= ceil(blocks / (SMs x resident blocks per SM)) x vt x DRAM latency x miss share
            + DRAM bytes / bandwidth

where the bytes a kernel finds in the L2 (``features.l2_hits``, the rule the elementwise
model uses, and the broadcast repeats it charges) neither queue at the DRAM nor wait its
latency (the miss share: the DRAM part of the kernel's traffic). The training data never
showed this loop: every elementwise row there is the vector kernel, which issues all of a
thread's loads at once and streams at 0.8-0.9 of the bandwidth. Checked without a fitted
number on every GPU that timed it: the labels' fp32 per-node CSVs (broadcast adds of
BERT, GPT-2 and OPT; floor / measured, median over the nodes past 1 M elements: A100 PCIe
40GB 0.82, V100 0.93, MI210 0.82, L4 0.53; ROCm builds the same loop) and our bf16 sweeps
(``addb``, ``whereb``, 0.1 ms and more: H100 0.90-0.96, H200 0.80-0.86). Where the
bandwidth per SM is low (L4, T4) the queue dominates and the floor adds nothing to the
vector rate; where it is high the waits show: BERT-large's mask add takes 1.36x a vectorized
op of the same bytes on the A100 PCIe 40GB and 1.00x on the L4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..analyzer.native import ceil_div, launch
from ..analyzer.predictor import Prediction
from ..analyzer.types import Kernel, NativeBatchNorm, NativeDepthwise, NativeLoop, NativePool
from ..device_db.device import Device
from .device_columns import MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM
from .features import l2_hits, reread_misses
from .form import Q_HOST
from .native_issue import MEASURED_ARCHS, issue_ms
from .tensor_core import smooth_max


def walk_ms(kernels: Sequence[Kernel], device: Device) -> np.ndarray:
    """The floor of each kernel's busy time in ms; NaN where none applies (no native kernel, no
    sourced latency, or an AMD GPU's batch norm, pool or depthwise conv: ROCm's MIOpen /
    native choice is not modelled; its non-vectorized loop is PyTorch's own, as on NVIDIA). A
    native depthwise conv's floor is its instruction issue instead (``native_issue``)."""
    out = np.full(len(kernels), np.nan)
    for i, k in enumerate(kernels):
        native = k.cost.native
        if not _floored(native, device):
            continue
        if isinstance(native, NativeDepthwise):
            out[i] = issue_ms(native, device)
        elif device.dram_latency_ns is None:
            continue
        elif isinstance(native, NativeLoop):
            out[i] = _loop_ms(k, native, device)
        else:
            out[i] = _walk(native, device) + queue_ms(k.cost.bytes, device)
    return out


def _floored(native: object, device: Device) -> bool:
    """Whether this module floors a kernel with ``native`` on ``device``'s vendor."""
    return native is not None and (isinstance(native, NativeLoop) or device.vendor == "nvidia")


def _resident_blocks(device: Device, threads: int) -> int:
    """Blocks of ``threads`` the whole GPU holds at once, by the SMs' thread and block limits."""
    threads_per_sm = MAX_THREADS_PER_SM.get(device.arch, 2048)
    per_sm = max(1, min(threads_per_sm // threads, MAX_BLOCKS_PER_SM.get(device.arch, 32)))
    return device.sm_count * per_sm


def _loop_ms(k: Kernel, native: NativeLoop, device: Device) -> float:
    """The non-vectorized loop's floor (module doc), ms: its waits on the share of its traffic
    the L2 does not hold, and those bytes with the broadcast repeats' misses at the
    bandwidth."""
    run = launch(native, k.dtype)
    traffic = float(k.cost.bytes)
    l2 = device.l2_cache_mb * 2**20
    dram = traffic - float(l2_hits(np.asarray(traffic), np.asarray(l2)))
    rr = k.cost.reread
    repeats = 0.0 if rr is None else float(reread_misses(rr.bytes, rr.slice_bytes, l2))
    waits = ceil_div(run.blocks, _resident_blocks(device, run.threads)) * run.steps
    share = dram / traffic if traffic > 0 else 0.0
    return waits * device.dram_latency_ns * 1e-6 * share + queue_ms(dram + repeats, device)


def _walk(native: NativeBatchNorm | NativePool, device: Device) -> float:
    """The DRAM-latency walk of a batch-norm or max-pool kernel (module doc), ms."""
    latency_ms = device.dram_latency_ns * 1e-6
    run = launch(native)
    resident = _resident_blocks(device, run.threads)
    if isinstance(native, NativeBatchNorm) and native.kernel == "transform":
        elements = native.n * native.channels * native.spatial
        return ceil_div(elements, resident * run.threads) * latency_ms
    return ceil_div(run.blocks, resident) * run.steps * latency_ms


def queue_ms(nbytes: int | float, device: Device) -> float:
    """The time a walk's loads and stores wait at the DRAM behind the other threads' (module
    docstring): its bytes at the datasheet bandwidth."""
    return float(nbytes) / (device.mem_bandwidth_gbps * 1e6)


def hold_to_walk(predictions: Sequence[Prediction], kernels: Sequence[Kernel],
                 device: Device) -> list[Prediction]:
    """Each native kernel's GPU time raised to its fixed part plus the floor where that is
    longer, labelled bound by ``latency`` (a walk) or ``compute`` (a depthwise conv's issue;
    flagged ``extrapolated`` off the architectures it was measured on); the host dispatch
    then overlaps it as before. On a GPU with no sourced latency a walk (or loop) keeps the
    learned time and is flagged ``extrapolated``: the training data holds no such kernel."""
    floor = walk_ms(kernels, device)
    out = list(predictions)
    for i, (p, k) in enumerate(zip(predictions, kernels, strict=True)):
        if not _floored(k.cost.native, device):
            continue
        if np.isnan(floor[i]):
            out[i] = replace(p, extrapolated=True)
            continue
        gpu = (p.fixed_ms or 0.0) + float(floor[i])
        if p.gpu_ms is None or gpu <= p.gpu_ms:
            continue
        host = np.array([p.host_ms or 0.0])
        latency = float(smooth_max(host, np.array([gpu]), Q_HOST)[0]) if p.host_ms else gpu
        issue = isinstance(k.cost.native, NativeDepthwise)
        # A longer GPU time never shortens the forecast (the predictor's own blend of host and
        # GPU time is not this smooth maximum everywhere).
        # No fold scored a floor: the kernel's error band no longer applies (bands.py).
        out[i] = replace(p, latency_ms=max(latency, p.latency_ms), gpu_ms=gpu,
                         bound="compute" if issue else "latency", band=None,
                         extrapolated=p.extrapolated or (
                             issue and device.arch not in MEASURED_ARCHS))
    return out
