"""The `tilecast collect` run: time kernels on the user's device in the shared CSV schema.

Output layout (readable by ``tilecast train --data DIR``, like the shared dataset)::

    DIR/kernels/<vendor>/train/<op>/<device>.csv   one row per (shape, dtype), appended as measured
    DIR/devices/<device>.json                      the device, from torch's properties

Resumable: rows already in a CSV are skipped, and each row is flushed as soon as it is measured,
so an interrupted collection keeps everything it measured. torch is imported lazily (the
``[collect]`` extra).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .shapes import OP_DIMS, Shape, dtypes_for
from .timing import Timing, device_label, resolve_device, time_callable, torch_module

BASE_COLUMNS = ("OPName", "Latency", "Device", "Torch Version", "CUDNN Version", "Kernel Name",
                "Warps per SM", "Blocks per SM", "Grid x", "Grid y", "Grid z", "Block x",
                "Block y", "Block z", "CUDA Version", "Kernels")
EXTRA_COLUMNS = ("dtype", "Latency Fastest Mean", "Repeats", "SM Clock MHz", "Kernels GPU ms")


def columns(op: str) -> tuple[str, ...]:
    return (*BASE_COLUMNS, *OP_DIMS[op], *EXTRA_COLUMNS)


def existing_keys(path: Path) -> set[tuple[str, ...]]:
    if not path.is_file():
        return set()
    with path.open(newline="") as fh:
        rows = csv.DictReader(fh)
        dims = [c for c in (rows.fieldnames or []) if c not in BASE_COLUMNS + EXTRA_COLUMNS]
        return {(r["OPName"], r.get("dtype", "fp32"), *(r[d] for d in dims)) for r in rows}


def row_for(shape: Shape, dtype: str, device_name: str, timing: Timing, versions: dict,
            sm_count: int, repeats: int) -> dict[str, object]:
    grid_n = timing.grid[0] * timing.grid[1] * timing.grid[2]
    threads = timing.block[0] * timing.block[1] * timing.block[2]
    return {
        "OPName": shape.op, "Latency": timing.median_ms, "Device": device_name,
        **versions, "Kernel Name": timing.main_kernel,
        "Warps per SM": grid_n * threads / 32 / sm_count if sm_count else 0,
        "Blocks per SM": grid_n / sm_count if sm_count else 0,
        "Grid x": timing.grid[0], "Grid y": timing.grid[1], "Grid z": timing.grid[2],
        "Block x": timing.block[0], "Block y": timing.block[1], "Block z": timing.block[2],
        "Kernels": ";" + ";".join(timing.kernels), **shape.named, "dtype": dtype,
        "Latency Fastest Mean": timing.fastest_mean_ms, "Repeats": repeats,
        "SM Clock MHz": "" if timing.sm_clock_mhz is None else timing.sm_clock_mhz,
        "Kernels GPU ms": "" if timing.kernels_gpu_ms is None else timing.kernels_gpu_ms,
    }


def _header(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return next(csv.reader(fh), [])


class CsvSink:
    """Appends rows to one CSV per op, header once, flushed per row (interrupt-safe)."""

    def __init__(self, root: Path, vendor: str, device_name: str) -> None:
        self.root, self.vendor = root, vendor
        self.stem = device_name.replace(" ", "_").replace("/", "_")

    def path(self, op: str) -> Path:
        return self.root / "kernels" / self.vendor / "train" / op / f"{self.stem}.csv"

    def append(self, op: str, row: dict[str, object]) -> None:
        path = self.path(op)
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        # A file begun by an older tilecast keeps its header: columns it lacks are dropped.
        fields = columns(op) if new else _header(path)
        with path.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow(row)
            fh.flush()


def pending(shapes: Iterable[Shape], dtypes: tuple[str, ...], sink: CsvSink,
            ) -> list[tuple[Shape, str]]:
    """(shape, dtype) pairs not yet in the output (what makes collection resumable)."""
    done: dict[str, set[tuple[str, ...]]] = {}
    out = []
    for shape in shapes:
        keys = done.setdefault(shape.op, existing_keys(sink.path(shape.op)))
        for dtype in dtypes_for(shape.op, dtypes):
            if (shape.op, dtype, *map(str, shape.dims)) not in keys:
                out.append((shape, dtype))
    return out


@dataclass(frozen=True)
class CollectResult:
    device: str
    measured: int
    skipped_existing: int
    skipped_too_large: int
    files: tuple[Path, ...]
    left_for_next_run: int = 0  # pending when the time budget ran out


def _measured_peaks(device) -> tuple[float, float]:
    """(fp32 matmul TFLOP/s, copy GB/s) measured on the device: for devices not in the DB."""
    torch = torch_module()
    n = 2048 if device.type == "cuda" else 512
    a = torch.rand((n, n), device=device)
    ms = statistics.median(time_callable(lambda: a @ a, device, 5))
    big = torch.empty(64 * 2**20 // 4, device=device)
    copy_ms = statistics.median(time_callable(lambda: big.clone(), device, 5))
    return 2 * n**3 / (ms * 1e-3) / 1e12, 2 * big.numel() * 4 / (copy_ms * 1e-3) / 1e9


def describe_device(device, name: str, user: dict | None = None) -> dict:
    """A tilecast-schema device JSON: the database entry when the name is known (datasheet
    values), else torch's properties plus measured peaks, overridden by ``user`` fields."""
    from ..device_db import load_device
    from ..device_db.report import device_dict
    from ..errors import DeviceError

    try:
        return {**device_dict(load_device(name)), **(user or {})}
    except DeviceError:
        pass
    torch = torch_module()
    tflops, gbps = _measured_peaks(device)
    measured = "measured by tilecast collect on this device"
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        sms, mem = p.multi_processor_count, p.total_memory / 1e9
        prop = "torch.cuda.get_device_properties"
    else:
        import os

        sms, mem, prop = os.cpu_count() or 1, 1.0, "os.cpu_count (memory not measured)"
    desc = {
        "name": name, "vendor": "nvidia" if device.type == "cuda" else "cpu",
        "arch": "generic", "aliases": [], "sm_count": sms, "cores_per_sm": 1,
        "boost_clock_mhz": 1000.0, "memory_gb": round(mem, 2),
        "mem_bandwidth_gbps": round(gbps, 2), "l2_cache_mb": 1.0,
        "peak_tflops_fp32": round(tflops, 4), "launch_overhead_us": 5.0,
        "supported_dtypes": ["float32", "float16", "bfloat16"],
        "sources": {"sm_count": prop, "memory_gb": prop,
                    "mem_bandwidth_gbps": measured + " (64 MB copy)",
                    "peak_tflops_fp32": measured + " (fp32 matmul)",
                    "cores_per_sm": "unknown: placeholder, pass --device-info to set it",
                    "boost_clock_mhz": "unknown: placeholder, pass --device-info to set it",
                    "l2_cache_mb": "unknown: placeholder, pass --device-info to set it",
                    "launch_overhead_us": "tilecast default (see docs/devices.md)"},
    }
    user = dict(user or {})
    desc["sources"].update(user.pop("sources", {}))
    for key in user:
        desc["sources"].setdefault(key, "supplied with --device-info")
    return {**desc, **user}


def run_collection(out: Path, shapes: list[Shape], dtypes: tuple[str, ...], *, device_spec: str,
                   repeats: int, device_info: dict | None = None,
                   progress: Callable[[int, int, str], None] | None = None,
                   max_input_gb: float | None = None,
                   budget_s: float | None = None) -> CollectResult:
    """Measure every pending (shape, dtype) and append it to the CSVs under ``out``.

    ``budget_s`` stops before the next shape once that many seconds have passed (a leased GPU's
    time box); what was measured stays, and a rerun resumes with the rest."""
    import json
    import time

    from . import ops as collect_ops

    device = resolve_device(device_spec)
    name = device_label(device)
    desc = describe_device(device, name, device_info)
    vendor = desc["vendor"]
    sink = CsvSink(out, vendor, name)
    (out / "devices").mkdir(parents=True, exist_ok=True)
    (out / "devices" / f"{sink.stem}.json").write_text(json.dumps(desc, indent=2) + "\n")
    todo = pending(shapes, dtypes, sink)
    limit = (max_input_gb or (0.4 * desc["memory_gb"] if device.type == "cuda" else 2.0)) * 1e9
    vers, measured, too_large = collect_ops.versions(device), 0, 0
    stop_at = None if budget_s is None else time.monotonic() + budget_s
    for i, (shape, dtype) in enumerate(todo, 1):
        if stop_at is not None and time.monotonic() >= stop_at:
            break
        if progress:
            progress(i, len(todo), f"{shape.op} {dtype} {'x'.join(map(str, shape.dims))}")
        if collect_ops.input_bytes(shape, dtype) > limit:
            too_large += 1
            continue
        timing = collect_ops.measure(shape, dtype, device, repeats)
        sink.append(shape.op, row_for(shape, dtype, name, timing, vers, desc["sm_count"],
                                      repeats))
        measured += 1
    files = tuple(sorted({sink.path(s.op) for s in shapes if sink.path(s.op).exists()}))
    planned = sum(len(dtypes_for(s.op, dtypes)) for s in shapes)
    return CollectResult(name, measured, planned - len(todo), too_large, files,
                         len(todo) - measured - too_large)
