"""A floor on PyTorch's own NCHW depthwise conv: the rate at which an SM issues instructions.

``conv_depthwise2d_forward_kernel`` (``analyzer.native``) runs one thread per output. Each
thread works its output's image, channel, row and column out of its index (integer
divisions), then for every tap of the window checks the bounds, loads an input and a weight,
widens them to fp32 and multiplies-adds, and finally writes one value. One FMA in some
twenty instructions per tap, and nothing shared between threads: the SM's schedulers, not
its FP32 lanes nor the DRAM, set the pace. So

    busy >= ceil(blocks / SMs) x 32 warps x (PER_OUTPUT + PER_TAP x taps) / (issue x clock)

with ``issue`` the warp instructions an SM dispatches per clock (FP32 lanes / (32 x
``Device.fp32_issue_share``): 4 on Volta to Blackwell, the dual-dispatch 4 and 8 of Pascal's
GP100 and GP104, an upper bound there, which keeps this a floor) and the boost clock, at
which our H100 ran every one of these kernels (the rows' recorded SM clock).

PER_OUTPUT and PER_TAP are the kernel's instruction stream, per thread, as our H100 measures
it: a relative least-squares fit of the formula to its 34 depthwise rows of 10 us and more
(bf16, 3 x 3 and 5 x 5, 0.2-822 M outputs: ``python benchmarks/depthwise_issue.py``), which
then forecasts the H200's 17 rows within 2.5 % (MAPE). The H200 has the H100's SMs and clock
and 1.43x its bandwidth, and ran the same shapes in the same time: the bound is the SM, not
the memory. The bytes these convs move would take 0.2-0.3x their time at the datasheet
bandwidth, so the elementwise copy rate the analyzer routes them to forecast them 2.6x too
fast (docs/accuracy.md, "Collected on our H100"). The counts are a property of PyTorch's
compiled kernel, not of a GPU; other architectures compile it to a similar stream, and no
other architecture's measurement exists yet (``scripts/gpu_collect.py`` measures these convs
on every lent GPU), so a forecast this floor raises off Hopper is flagged ``extrapolated``.
"""

from __future__ import annotations

from ..analyzer.native import ceil_div, launch
from ..analyzer.types import NativeDepthwise
from ..device_db.device import Device

WARP = 32
PER_OUTPUT = 190.0  # warp instructions per thread: the index arithmetic, bias and store
PER_TAP = 16.5  # warp instructions per thread and tap: bounds, two loads, widening, FMA
MEASURED_ARCHS = frozenset({"hopper"})  # where the counts were measured (H100, H200)


def issue_per_clock(device: Device) -> float:
    """Warp instructions one SM dispatches per clock: its FP32 lanes over the share of the
    dispatch slots they fill (``Device.fp32_issue_share``; 0.5 where none is given, as the
    learned features take it)."""
    return device.cores_per_sm / (WARP * (device.fp32_issue_share or 0.5))


def issue_ms(native: NativeDepthwise, device: Device) -> float:
    """The busy time the SMs need to issue ``native``'s instructions, in ms (module doc)."""
    run = launch(native)
    per_sm = ceil_div(run.blocks, device.sm_count)
    slots = per_sm * (run.threads // WARP) * (PER_OUTPUT + PER_TAP * run.steps)
    return slots / (issue_per_clock(device) * device.boost_clock_mhz * 1e3)
