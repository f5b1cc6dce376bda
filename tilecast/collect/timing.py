"""Timing primitives of ``tilecast collect``: the device, one callable timed with CUDA events
(perf_counter on the CPU), and the summary statistics. torch is imported lazily."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError, TilecastError

FASTEST_FRACTION = 0.2  # "mean of the fastest runs": the fastest fifth, robust to stragglers


@dataclass(frozen=True)
class Timing:
    median_ms: float
    fastest_mean_ms: float
    kernels: tuple[str, ...]  # every kernel launched, in order
    main_kernel: str  # the longest-running one
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    # The SM clock right after the timed runs (NVML / AMD SMI through torch; None where they
    # are absent): the shared sweeps record none, and their training and held-out splits ran
    # the same GEMMs 1.1-1.2x apart on the P100, V100 and T4 while their memory-bound rows
    # agree (benchmarks/data_consistency.py, check 5), which a clock difference would explain.
    sm_clock_mhz: int | None = None
    # The GPU time of the profiled call's kernels, summed (CUPTI's durations: the kernels' own
    # time, without the host's dispatch and launch that a CUDA-event timing around one call
    # holds; on an H100 VM host those put the shortest kernels at 19-35 us, while in a CUDA
    # graph such kernels take 1-3 us, datasets/h100-sxm5-80gb/README.md). None on the CPU.
    kernels_gpu_ms: float | None = None


def torch_module():
    try:
        import torch
    except ImportError:
        raise TilecastError('tilecast collect needs torch: pip install "tilecast[collect]"'
                            ) from None
    return torch


def resolve_device(spec: str):
    torch = torch_module()
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise TilecastError(f"no CUDA device is present for --device {spec}; use "
                            "--device cpu to test the collection on the CPU")
    try:
        return torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(f"bad --device {spec!r}: {exc}") from None


def device_label(device) -> str:
    torch = torch_module()
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def sm_clock_mhz(device) -> int | None:
    """The device's current SM clock in MHz, or None (CPU, or no NVML / AMD SMI)."""
    if device.type != "cuda":
        return None
    torch = torch_module()
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # pynvml / amdsmi missing or unsupported (untyped errors): no reading
        return None


def summarize(times_ms: list[float]) -> tuple[float, float]:
    fast = sorted(times_ms)[: max(1, int(len(times_ms) * FASTEST_FRACTION))]
    return statistics.median(times_ms), sum(fast) / len(fast)


def time_callable(fn: Callable[[], object], device, repeats: int, warmup: int = 3,
                  warmup_s: float = 0.02) -> list[float]:
    """Per-call latencies in ms: CUDA events on a GPU, perf_counter on the CPU. Warm-up runs
    at least ``warmup`` calls and ``warmup_s`` seconds (clocks, caches, lazy library init)."""
    import time

    torch = torch_module()
    start_t, calls = time.perf_counter(), 0
    while calls < warmup or (time.perf_counter() - start_t < warmup_s and calls < 1000):
        fn()
        calls += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return out
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out
