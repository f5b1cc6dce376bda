"""End-to-end labels on the user's device: a zoo model (or config) run and timed as a whole, in
the shared labels' format, so that ``tilecast evaluate`` scores tilecast against it.

Layout written under ``out`` (``tilecast evaluate out/labels-<dtype>-<runtime>``; the models
folder beside it is what evaluate reads the configs from)::

    out/labels-<dtype>-<runtime>/<GPU_DIR>/<model>-<inf|train>-<seq>-<batch>.json
    out/models/<model>.json          the config the run was built from (depth included)

The model is built from its config by tilecast's exporters (random weights, token ids 0) in
the label's dtype, so the program measured is the one ``tilecast export`` forecasts (MoE
layers in their static form, ``exporters.moe``). Inference runs under ``torch.inference_mode``
in eval mode; a training step is the forward and the backward of the output's sum (no
optimizer), timed whole and forward alone, as NeuSight's labels record ``fw_latency`` and
``bwall_latency``. ``runtime="cudagraph"`` replays one CUDA graph of the forward (inference).
``math`` sets how an fp32 model's math runs, as ``tilecast analyze --math`` forecasts it:
``graph`` (fp32 as built: TF32 off for matmuls and convs, whatever PyTorch's defaults),
``tf32``, or ``amp-bf16`` / ``amp-fp16`` (the fp32 model under ``torch.autocast``); the label
records it in ``math`` and its folder is ``labels-float32-<math>-<runtime>``.
torch is imported lazily (the ``[collect]`` extra).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analyzer.mathmode import MATH_MODES, TF32, TF32_MODES
from ..errors import ConfigError, TilecastError
from .timing import device_label, resolve_device, sm_clock_mhz, time_callable, torch_module

SHORT_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MODES = {"inference": "inf", "training": "train"}
LABEL_RUNTIMES = ("eager", "cudagraph")


@dataclass(frozen=True)
class LabelResult:
    path: Path
    e2e_ms: float
    fw_ms: float
    bwall_ms: float

    def summary(self) -> str:
        back = f", backward {self.bwall_ms:.3f} ms" if self.bwall_ms else ""
        return f"wrote {self.path}: {self.e2e_ms:.3f} ms (forward {self.fw_ms:.3f} ms{back})"


def _check(dtype: str, mode: str, runtime: str, device, math: str = "graph") -> str:
    if dtype not in SHORT_DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: choose from {', '.join(SHORT_DTYPES)}")
    if math not in MATH_MODES:
        raise ConfigError(f"unknown math mode {math!r}: choose from {', '.join(MATH_MODES)}")
    if math != "graph" and dtype != "fp32":
        raise ConfigError(f"--math {math} runs an fp32 model's math ({math}); the model must "
                          f"be built in fp32 (--dtype fp32), not {dtype}")
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    if runtime not in LABEL_RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}: choose from eager, cudagraph")
    if runtime == "cudagraph" and (mode != "inference" or device.type != "cuda"):
        raise ConfigError("--runtime cudagraph replays a CUDA graph of the forward: inference "
                          "on a CUDA device only")
    return SHORT_DTYPES[dtype]


def _sum_outputs(out: Any) -> Any:
    """A scalar to backpropagate from: the sum of the model's (first) output tensor."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    elif isinstance(out, dict):  # transformers' ModelOutput: logits first
        out = next(iter(out.values()))
    return out.float().sum()


def _graph_replay(fn: Callable[[], Any], device) -> Callable[[], Any]:
    """One CUDA graph of ``fn`` (warmed up on a side stream, as torch.cuda.graphs asks)."""
    torch = torch_module()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as exc:
        raise TilecastError(f"the forward cannot be captured as a CUDA graph: "
                            f"{str(exc).splitlines()[0]}") from None
    return graph.replay


AUTOCAST_DTYPES = {"amp-bf16": "bfloat16", "amp-fp16": "float16"}


@contextlib.contextmanager
def math_mode(math: str) -> Iterator[None]:
    """TF32 on or off for the whole measurement (PyTorch's defaults differ for matmuls and
    cuDNN convs, so a label says which ran), restored afterwards."""
    torch = torch_module()
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = math == TF32
    torch.backends.cudnn.allow_tf32 = math in TF32_MODES
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _autocast(math: str, device, runtime: str) -> Callable[[], Any]:
    """A fresh autocast context per call (or none). A CUDA graph captures the casts, so its
    weight-cast cache is off there, as torch.cuda.graphs asks."""
    torch = torch_module()
    if math not in AUTOCAST_DTYPES:
        return contextlib.nullcontext
    dtype = getattr(torch, AUTOCAST_DTYPES[math])
    return lambda: torch.autocast(device.type, dtype=dtype, cache_enabled=runtime != "cudagraph")


def _timers(module: Any, inputs: dict, mode: str, runtime: str, device, math: str = "graph"
            ) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """(forward, whole training step or None) callables."""
    torch = torch_module()
    amp = _autocast(math, device, runtime)
    if mode == "inference":
        module.eval()

        def forward() -> Any:
            with torch.inference_mode(), amp():
                return module(**inputs)

        return (_graph_replay(forward, device) if runtime == "cudagraph" else forward), None
    module.train()

    def train_forward() -> Any:
        with amp():
            return module(**inputs)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        _sum_outputs(train_forward()).backward()

    return train_forward, step


def _median(fn: Callable[[], Any], device, repeats: int) -> float:
    return statistics.median(time_callable(fn, device, repeats, warmup=5, warmup_s=0.2))


def collect_label(model: str, out: Path, *, batch: int | None, seq: int | None, dtype: str = "bf16",
                  mode: str = "inference", runtime: str = "eager", attn: str = "eager",
                  layers: int | None = None, device_spec: str = "cuda:0",
                  repeats: int = 20, math: str = "graph") -> LabelResult:
    """Build ``model`` (zoo name or config path) on the device, time it, write its label."""
    from ..exporters.api import build_module
    from ..exporters.hf import with_layers

    device = resolve_device(device_spec)
    full = _check(dtype, mode, runtime, device, math)
    built = build_module(model, batch=batch, seq=seq, dtype=full, attn=attn, layers=layers,
                         device=str(device))
    if layers and built.image:
        # evaluate rebuilds the model from the config written here, which has no depth key
        raise ConfigError("--layers cuts transformer configs only; image models run whole")
    module, inputs, task, batch, seq = (built.module, dict(built.inputs), built.task,
                                        built.batch, built.seq)
    with math_mode(math):
        forward, step = _timers(module, inputs, mode, runtime, device, math)
        fw_ms = _median(forward, device, repeats)
        e2e_ms = _median(step, device, repeats) if step else fw_ms
    config = with_layers(dict(built.config), layers) if layers else dict(built.config)
    config.pop("_tilecast", None)
    stem = f"{built.name}-L{layers}" if layers else built.name
    seq_or_size = seq if seq is not None else int(config.get("image_size", 224))
    torch = torch_module()
    record = {
        "num_layer": _depth(config), "e2e_latency": e2e_ms, "fw_latency": fw_ms,
        "bwall_latency": max(e2e_ms - fw_ms, 0.0) if step else 0, "dtype": full,
        "runtime": runtime, "math": math, "attn": attn, "model": stem, "task": task,
        "batch": batch,
        "seq": seq_or_size,
        "device": device_label(device), "torch": torch.__version__,
        "cuda": torch.version.cuda or "", "repeats": repeats,
        "sm_clock_mhz": sm_clock_mhz(device),
    }
    gpu_dir = record["device"].replace(" ", "_").replace("/", "_")
    folder = f"labels-{full}-{runtime}" if math == "graph" else f"labels-{full}-{math}-{runtime}"
    path = (out / folder / gpu_dir /
            f"{stem}-{MODES[mode]}-{seq_or_size}-{batch}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "models" / f"{stem}.json").write_text(json.dumps(config, indent=2) + "\n")
    return LabelResult(path, e2e_ms, fw_ms, record["bwall_latency"])


def _depth(config: dict) -> int:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(config.get(key), int):
            return config[key]
    return 0
