"""torch side of ``tilecast collect``: build each op on a device, profile its kernels.

Only imported when collecting (needs torch, the ``[collect]`` extra).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .shapes import (
    BN_INFERENCE_OPS,
    BN_TRAIN_OPS,
    CONV_OPS,
    FIXED_DTYPES,
    HEAD_DIM,
    LAYOUT_OPS,
    MASK_OPS,
    MATMUL_OPS,
    Shape,
)
from .timing import Timing, sm_clock_mhz, summarize, time_callable

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                "bf16": torch.bfloat16}
ELEMENTWISE: dict[str, Callable] = {
    "add": lambda x, y: x + y, "addu": lambda x, y: x + 1.5, "mul": lambda x, y: x * y,
    "mulu": lambda x, y: x * 1.5, "div": lambda x, y: x / y, "divu": lambda x, y: x / 1.5,
    "pow": lambda x, y: torch.pow(x, y), "powu": lambda x, y: torch.pow(x, 2.0),
    "relu": lambda x, y: F.relu(x), "gelu": lambda x, y: F.gelu(x),
    "tanh": lambda x, y: torch.tanh(x), "silu": lambda x, y: F.silu(x),
}


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    # Values in [0.5, 1.5): no zeros to divide by, no negative bases for pow.
    return torch.rand(shape, dtype=dtype, device=device) + 0.5


def _fp8_linear(shape: Shape, device) -> Callable[[], object]:
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise ConfigError("fp8 kernels need a CUDA GPU with fp8 units (compute capability "
                          ">= 8.9)")
    _, m, n, k = shape.dims  # (m x n) @ (n x k): n is the reduction (shapes.py)
    a = _rand((m, n), torch.float16, device).to(torch.float8_e4m3fn)
    b = _rand((k, n), torch.float16, device).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _mask_op(op: str, d: dict[str, int], dt: torch.dtype, device) -> Callable[[], object]:
    """The ``MASK_OPS`` of ``shapes``: broadcast operands, bool tensors, a cast."""
    rows, cols = d["B"], d["H"]
    if op == "and":
        a, b = (torch.rand((rows, cols), device=device) < 0.5 for _ in range(2))
        return lambda: a & b
    x = _rand((rows, cols), dt, device)
    if op == "cast":
        other = torch.float32 if dt in (torch.float16, torch.bfloat16) else torch.bfloat16
        return lambda: x.to(other)
    floor = torch.full((), -1.0, dtype=dt, device=device)  # 0-dim: broadcast, not a scalar
    if op == "maxt":
        return lambda: torch.maximum(x, floor)
    if op == "whereb":
        keep = torch.rand((1, cols), device=device) < 0.5
        return lambda: torch.where(keep, x, floor)
    row = _rand((1, cols), dt, device)  # addb
    return lambda: x + row


def build(shape: Shape, dtype: str, device) -> Callable[[], object]:
    """A zero-argument callable running the op once on preallocated inputs."""
    if shape.op in FIXED_DTYPES:
        if dtype != FIXED_DTYPES[shape.op]:
            raise ConfigError(f"{shape.op} is measured in {FIXED_DTYPES[shape.op]} only, "
                              f"not {dtype}")
        return _mask_op(shape.op, shape.named, torch.float32, device)
    if dtype == "fp8":
        if shape.op not in ("linear", "bmm") or shape.dims[0] != 1:
            raise ConfigError(f"fp8 is collected for linear-shaped matmuls only, not {shape.op}")
        return _fp8_linear(shape, device)
    dt = TORCH_DTYPES[dtype]
    d = shape.named
    # The shared CSVs' convention (shapes.py): (B x M x N) @ (B x N x K), N the reduction.
    if shape.op == "bmm":
        a, b = _rand((d["B"], d["M"], d["N"]), dt, device), _rand((d["B"], d["N"], d["K"]),
                                                                  dt, device)
        return lambda: torch.bmm(a, b)
    if shape.op == "bmmt":  # attention's Q K^T: K stored (B, K, N), read transposed
        a, bt = _rand((d["B"], d["M"], d["N"]), dt, device), _rand((d["B"], d["K"], d["N"]),
                                                                   dt, device)
        return lambda: torch.bmm(a, bt.transpose(1, 2))
    if shape.op == "linear":  # Linear(N -> K) on M rows: the weight is stored (K, N)
        x, w = _rand((d["M"], d["N"]), dt, device), _rand((d["K"], d["N"]), dt, device)
        return lambda: F.linear(x, w)
    if shape.op == "mmtn":  # a weight gradient dY^T X: dY stored (N, M), read transposed
        a, b = _rand((d["B"], d["N"], d["M"]), dt, device), _rand((d["B"], d["N"], d["K"]),
                                                                  dt, device)
        if d["B"] == 1:  # autograd's linear backward calls mm, not a batched GEMM
            a2, b2 = a[0], b[0]
            return lambda: torch.mm(a2.t(), b2)
        return lambda: torch.bmm(a.transpose(1, 2), b)
    if shape.op in CONV_OPS:
        return _conv(shape.op, d, dt, device)
    if shape.op == "sdpa":
        q, k, v = (_rand((d["B"], d["Heads"], d["Seq"], d["Head_Dim"]), dt, device)
                   for _ in range(3))
        causal = bool(d["Causal"])
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if shape.op in BN_INFERENCE_OPS:  # bnc: autocast's, fp32 weights and statistics
        x = _rand((d["B"], d["Channels"], d["Input_Size"], d["Input_Size"]), dt, device)
        st = torch.float32 if shape.op == "bnc" else dt
        stats = [_rand((d["Channels"],), st, device) for _ in range(4)]
        return lambda: F.batch_norm(x, stats[0], stats[1], stats[2], stats[3], training=False)
    if shape.op in BN_TRAIN_OPS:
        return _bn_training(shape.op, d, dt, device)
    if shape.op in MASK_OPS:
        return _mask_op(shape.op, d, dt, device)
    if shape.op in LAYOUT_OPS:
        head = HEAD_DIM if d["H"] % HEAD_DIM == 0 else HEAD_DIM // 2
        if d["H"] % head:
            raise ConfigError(f"permc needs H a multiple of {head} (heads of {HEAD_DIM} or "
                              f"{HEAD_DIM // 2} elements), got H={d['H']}")
        x = _rand((d["B"], d["H"] // head, head), dt, device)
        return lambda: x.transpose(0, 1).contiguous()
    x = _rand((d["B"], d["H"]), dt, device)
    if shape.op == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if shape.op == "ln":
        g, b = _rand((d["H"],), dt, device), _rand((d["H"],), dt, device)
        return lambda: F.layer_norm(x, (d["H"],), g, b)
    if shape.op == "rms":
        g = _rand((d["H"],), dt, device)
        return lambda: F.rms_norm(x, (d["H"],), g)
    y = _rand((d["B"], d["H"]), dt, device)
    fn = ELEMENTWISE[shape.op]
    return lambda: fn(x, y)


def _conv(op: str, d: dict[str, int], dt: torch.dtype, device) -> Callable[[], object]:
    """The forward (``conv``) or one of its gradients (``convdx``: dX, ``convdw``: dW), as
    autograd's convolution backward computes it, on the forward's layout."""
    g = d["Groups"]
    if d["Input_Channel"] % g or d["Output_Channel"] % g:
        raise ConfigError(f"conv channels {d['Input_Channel']} -> {d['Output_Channel']} are "
                          f"not divisible by Groups={g}")
    fmt = torch.channels_last if d["Channels_Last"] else torch.contiguous_format
    x = _rand((d["B"], d["Input_Channel"], d["Input_Size"], d["Input_Size"]), dt, device)
    w = _rand((d["Output_Channel"], d["Input_Channel"] // g, d["Kernel_Szie"],
               d["Kernel_Szie"]), dt, device)
    x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
    stride, pad = [d["Stride"]] * 2, [d["Padding"]] * 2
    if op == "conv":
        return lambda: F.conv2d(x, w, stride=stride, padding=pad, groups=g)
    dy = F.conv2d(x, w, stride=stride, padding=pad, groups=g).contiguous(memory_format=fmt)
    mask = [op == "convdx", op == "convdw", False]
    return lambda: torch.ops.aten.convolution_backward(
        dy, x, w, None, stride, pad, [1, 1], False, [0, 0], g, mask)


def _bn_training(op: str, d: dict[str, int], dt: torch.dtype, device) -> Callable[[], object]:
    """Batch norm on batch statistics (``bnfw``), or autograd's backward of it (``bnbw``: dX,
    dgamma and dbeta), in the model's dtype and layout, as a training step runs them."""
    fmt = torch.channels_last if d["Channels_Last"] else torch.contiguous_format
    x = _rand((d["B"], d["Channels"], d["Input_Size"], d["Input_Size"]), dt, device)
    x = x.to(memory_format=fmt)
    # a model cast to the dtype (as tilecast's bf16 labels are): running statistics too
    mean, var, w, b = (_rand((d["Channels"],), dt, device) for _ in range(4))
    if op == "bnfw":
        return lambda: F.batch_norm(x, mean, var, w, b, training=True)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    with torch.enable_grad():
        y = F.batch_norm(x, mean, var, w, b, training=True)
    dy = torch.ones_like(y)
    return lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)


def input_bytes(shape: Shape, dtype: str) -> int:
    size = 1 if dtype in ("fp8", "bool") else 2 if dtype in ("fp16", "bf16") else 4
    d = shape.named
    if shape.op in MATMUL_OPS:
        return size * d["B"] * (d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"])
    if shape.op in CONV_OPS:
        img = d["B"] * d["Input_Size"] ** 2
        return size * (img * (d["Input_Channel"] + d["Output_Channel"])
                       + d["Output_Channel"] * d["Input_Channel"] // d["Groups"]
                       * d["Kernel_Szie"] ** 2)
    if shape.op in BN_INFERENCE_OPS or shape.op in BN_TRAIN_OPS:
        return size * 2 * d["B"] * d["Channels"] * d["Input_Size"] ** 2
    if shape.op == "sdpa":  # Q, K, V and the output
        return size * 4 * d["B"] * d["Heads"] * d["Seq"] * d["Head_Dim"]
    return size * 3 * d["B"] * d["H"]


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ backend prints a line per start/stop on fd 2: silence it."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _profile(fn: Callable[[], object], device) -> tuple[list[str], list[dict]]:
    """Names and args (grid, block) of what one call launches, from the profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    act = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with _quiet_stderr(), profile(activities=act) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    finally:
        os.unlink(path)
    cat = "kernel" if device.type == "cuda" else "cpu_op"
    picked = [e for e in events if e.get("cat") == cat and e.get("ph") == "X"]
    if device.type != "cuda":  # CPU: the outermost aten ops only
        picked = [e for e in picked if e.get("name", "").startswith("aten::")][:1]
    return [e["name"] for e in picked], picked


def measure(shape: Shape, dtype: str, device, repeats: int) -> Timing:
    fn = build(shape, dtype, device)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    # cuDNN tries its algorithms and keeps the fastest, as the shared conv sweep was recorded
    # (docs/predictor.md, "Convolutions"): the first warm-up call pays for the search.
    torch.backends.cudnn.benchmark = True
    with torch.no_grad():
        times = time_callable(fn, device, repeats)
        clock = sm_clock_mhz(device)  # before profiling: the state the timings ran in
        names, events = _profile(fn, device)
    median, fastest = summarize(times)
    main = max(events, key=lambda e: e.get("dur", 0), default={})
    args = main.get("args", {})
    grid = tuple(args.get("grid", (0, 0, 0)))
    block = tuple(args.get("block", (0, 0, 0)))
    gpu = sum(e.get("dur", 0) for e in events) * 1e-3 if device.type == "cuda" else None
    return Timing(median, fastest, tuple(names), main.get("name", ""), grid, block, clock, gpu)


def versions(device) -> dict[str, str]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"Torch Version": f"p{torch.__version__.split('+')[0]}",
            "CUDNN Version": str(cudnn or ""),
            "CUDA Version": f"cu{torch.version.cuda.replace('.', '')}"
            if torch.version.cuda and device.type == "cuda" else device.type}
