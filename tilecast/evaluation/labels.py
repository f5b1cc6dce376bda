"""Find and validate measured-latency label files.

Layout: ``LABELS_DIR/<GPU_DIR>/<model>-<inf|train>-<seq>-<batch>[-fusion|-dp4|-tp4|-pp4_1].json``
holding ``e2e_latency`` in ms, and optionally the ``dtype`` the model ran in (``float32``, the
default and all of NeuSight's; ``float16``, ``bfloat16``) and the ``runtime`` (``eager``, the
default; ``graph``: CUDA graphs), the ``math`` an fp32 model ran with (``graph``, the default;
``tf32``, ``amp-bf16``, ``amp-fp16``), the model ``task`` it was built for and its ``attn``
(eager, sdpa; ``tilecast collect-labels`` writes all five), which the forecast then uses.
Anything else is reported as skipped with the reason, never dropped.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..analyzer.mathmode import MATH_MODES, check_math
from ..analyzer.runtime import RUNTIMES
from ..device_db import Device, load_device
from ..errors import DeviceError, TilecastError
from ..exporters.hf import ATTNS, TASK_AUTO_CLASSES

NAME = re.compile(r"^(?P<model>.+?)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)"
                  r"(?P<suffix>-[A-Za-z0-9_]+)?\.json$")
MODES = {"inf": "inference", "train": "training"}
LAYOUT = "LABELS_DIR/<GPU_DIR>/<model>-<inf|train>-<seq>-<batch>[-fusion].json with e2e_latency"
LABEL_DTYPES = ("float32", "float16", "bfloat16")  # what the exporters build a model in


@dataclass(frozen=True)
class Label:
    file: Path
    gpu: str  # the GPU directory name, e.g. NVIDIA_L4
    device: Device
    model: str  # config file stem
    config: Path
    mode: str  # inference | training
    seq: int
    batch: int
    variant: str  # plain | fusion | a multi-GPU layout (dp4, tp4, pp4_1)
    measured_ms: float
    dtype: str = "float32"  # the JSON's "dtype": what the measured model ran in
    runtime: str = "eager"  # the JSON's "runtime": eager | graph (CUDA graphs)
    task: str | None = None  # the JSON's "task" (exporter task); None: by model type
    attn: str | None = None  # the JSON's "attn"; None: what NeuSight's runs recorded
    math: str = "graph"  # the JSON's "math": how an fp32 model's math ran (tf32, amp-bf16, ...)


@dataclass(frozen=True)
class Skipped:
    file: str
    reason: str


def _measured(path: Path) -> tuple[float, str, str, str | None, str | None, str]:
    """(e2e_latency ms, dtype, runtime, task, attn, math) of one label JSON."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"unreadable JSON ({exc})") from None
    value = data.get("e2e_latency") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("missing or non-numeric e2e_latency")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"e2e_latency must be a positive number, got {value}")
    dtype, runtime = data.get("dtype", "float32"), data.get("runtime", "eager")
    if dtype not in LABEL_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(LABEL_DTYPES)}, got {dtype!r}")
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    math_mode = data.get("math", "graph")
    if math_mode not in MATH_MODES:
        raise ValueError(f"math must be one of {', '.join(MATH_MODES)}, got {math_mode!r}")
    if math_mode != "graph" and dtype != "float32":
        raise ValueError(f"math {math_mode} applies to a float32 model, not {dtype}")
    task, attn = data.get("task"), data.get("attn")
    if task is not None and task not in TASK_AUTO_CLASSES:
        raise ValueError(f"task must be one of {', '.join(TASK_AUTO_CLASSES)}, got {task!r}")
    if attn is not None and attn not in ATTNS:
        raise ValueError(f"attn must be one of {', '.join(ATTNS)}, got {attn!r}")
    return float(value), dtype, runtime, task, attn, math_mode


# The passes a training label may also record (NeuSight's JSONs): the forward, and the
# backward with the gradient accumulation.
PASS_KEYS = {"forward": "fw_latency", "backward": "bwall_latency"}


def measured_passes(label: Label) -> dict[str, float]:
    """phase -> ms of each pass the label's JSON records as a positive number (none is fine)."""
    data = json.loads(label.file.read_text())
    out = {}
    for phase, key in PASS_KEYS.items():
        value = data.get(key) if isinstance(data, dict) else None
        if (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0):
            out[phase] = float(value)
    return out


def _parse(path: Path, root: Path, models: Path) -> Label:
    m = NAME.match(path.name)
    if m is None:
        raise ValueError("name is not <model>-<inf|train>-<seq>-<batch>[-fusion].json")
    variant = "plain" if m["suffix"] is None else m["suffix"][1:]
    if variant != "fusion" and variant != "plain":
        from .distributed import parse_variant

        parse_variant(variant, models)  # raises ValueError for an unknown variant
    try:
        device = load_device(path.parent.name)
    except DeviceError as exc:
        raise ValueError(f"unknown GPU directory {path.parent.name!r}: {exc}") from None
    # No aliasing: the L4 "switch4" run, say, is a smaller Switch (d_model 768, per its
    # per-node CSV) than switchxl4.json, so guessing a config would compare different models.
    stem = m["model"]
    config = models / f"{stem}.json"
    if not config.is_file():
        raise ValueError(f"no model config {config.name} in {models}")
    ms, dtype, runtime, task, attn, math_mode = _measured(path)
    try:  # a mode the GPU cannot run (bf16 autocast on a T4) cannot have been measured there
        check_math(math_mode, device)
    except TilecastError as exc:
        raise ValueError(str(exc)) from None
    return Label(path, path.parent.name, device, stem, config, MODES[m["mode"]],
                 int(m["seq"]), int(m["batch"]), variant, ms, dtype, runtime, task, attn,
                 math_mode)


def discover_labels(root: Path, models: Path, gpus: tuple[str, ...] = (),
                    ) -> tuple[list[Label], list[Skipped]]:
    """All label files under ``root`` (optionally only the GPU dirs or devices in ``gpus``)."""
    wanted = {load_device(g).name for g in gpus}
    labels, skipped = [], []
    for path in sorted(root.glob("*/*.json")):
        rel = str(path.relative_to(root))
        try:
            label = _parse(path, root, models)
        except ValueError as exc:
            if _in_scope(path.parent.name, wanted):
                skipped.append(Skipped(rel, str(exc)))
            continue
        if not wanted or label.device.name in wanted:
            labels.append(label)
    return labels, skipped


def _in_scope(gpu_dir: str, wanted: set[str]) -> bool:
    """Whether a label that could not be read belongs to the GPUs asked for (all when none
    were; a directory that names no known GPU is always reported)."""
    if not wanted:
        return True
    try:
        return load_device(gpu_dir).name in wanted
    except DeviceError:
        return True
