"""Where ``learned/native_issue.py``'s instruction counts come from, and how well they hold.

PyTorch's native NCHW depthwise conv is bound by instruction issue (``native_issue``): busy =
ceil(blocks / SMs) x 32 warps x (PER_OUTPUT + PER_TAP x taps) / (issue x clock). This script
reads the depthwise rows our GPUs measured (``tilecast collect``: the kernel's GPU time where
the lease profiled it, else the mean of the fastest fifth of calls for rows of 0.1 ms and
more, where the host's dispatch hides behind the kernel), fits the two counts on the H100 by
relative least squares, and scores the fit and the shipped counts on every GPU:

    python benchmarks/depthwise_issue.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tilecast.analyzer.native import ceil_div  # noqa: E402
from tilecast.analyzer.types import NativeDepthwise  # noqa: E402
from tilecast.device_db import load_device  # noqa: E402
from tilecast.learned.native_issue import (  # noqa: E402
    PER_OUTPUT,
    PER_TAP,
    issue_ms,
    issue_per_clock,
)

FIT_ON = "h100-sxm5-80gb"
SETS = {  # data folder -> (device, CSV files); the gputime lease profiled kernels' GPU time
    "h100-sxm5-80gb": ("h100", ("h100-sxm5-80gb", "h100-sxm5-80gb-gputime")),
    "h200-sxm-141gb": ("h200", ("h200-sxm-141gb",)),
}
MIN_EVENT_MS, MIN_GPU_MS = 0.1, 0.01


def rows(folder: str) -> list[tuple[NativeDepthwise, float]]:
    """(launch, measured GPU ms) of the NCHW depthwise rows of one GPU's folders."""
    out = []
    for sub in SETS[folder][1]:
        for path in sorted((ROOT / "datasets" / sub / "kernels/nvidia/train/conv").glob("*.csv")):
            for r in csv.DictReader(path.open()):
                if "conv_depthwise2d_forward_kernel" not in r["Kernel Name"]:
                    continue
                n, c, k, taps, h, st, pad = (int(r[x]) for x in (
                    "B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size",
                    "Stride", "Padding"))
                p = (h + 2 * pad - taps) // st + 1
                gpu = r.get("Kernels GPU ms")
                ms = float(gpu) if gpu else float(r["Latency Fastest Mean"])
                if ms >= (MIN_GPU_MS if gpu else MIN_EVENT_MS):
                    out.append((NativeDepthwise(n * k * p * p, taps * taps, c), ms))
    return out


def fit(samples: list[tuple[NativeDepthwise, float]], device: str) -> tuple[float, float]:
    """(per output, per tap) warp instructions minimizing the relative squared error."""
    dev = load_device(device)
    scale = 1e3 * issue_per_clock(dev) * dev.boost_clock_mhz
    per_sm = np.array([ceil_div(ceil_div(d.outputs, 1024), dev.sm_count) * 32 / scale
                       for d, _ in samples])
    taps = np.array([d.taps for d, _ in samples], dtype=float)
    ms = np.array([m for _, m in samples])
    a = np.stack([per_sm, per_sm * taps], axis=1) / ms[:, None]
    (per_output, per_tap), *_ = np.linalg.lstsq(a, np.ones(len(ms)), rcond=None)
    return float(per_output), float(per_tap)


def mape(samples: list[tuple[NativeDepthwise, float]], device: str) -> tuple[float, float]:
    """(MAPE %, median forecast / measured) of the shipped floor."""
    dev = load_device(device)
    ratio = np.array([issue_ms(d, dev) / ms for d, ms in samples])
    return float(np.mean(np.abs(ratio - 1)) * 100), float(np.median(ratio))


def main() -> None:
    per_output, per_tap = fit(rows(FIT_ON), SETS[FIT_ON][0])
    print(f"fit on {FIT_ON}: {per_output:.1f} warp instructions per output + {per_tap:.2f} "
          f"per tap (shipped: {PER_OUTPUT} + {PER_TAP})")
    for folder, (device, _) in SETS.items():
        samples = rows(folder)
        err, med = mape(samples, device)
        print(f"{folder:16s} {len(samples):3d} rows  MAPE {err:4.1f} %  median {med:.3f}"
              f"{'  (fitted here)' if folder == FIT_ON else ''}")


if __name__ == "__main__":
    main()
