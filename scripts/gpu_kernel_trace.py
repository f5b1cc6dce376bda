"""Per-kernel GPU time on a leased GPU: the in-graph floor of tiny kernels, and whole-model traces.

usage: python scripts/gpu_kernel_trace.py OUT [--device cuda:0] [--only MODELS] [--amp-steps]
       python scripts/gpu_kernel_trace.py OUT --sweep [--eager]

1. ``floor.csv``: N back-to-back launches of one tiny op, (a) captured in one CUDA graph and
   replayed, (b) queued eagerly without a sync: time per launch. (a) is the GPU time a kernel
   costs in a graph runtime with nothing to do, which single-call timings (CUDA events around
   one launch on an idle GPU) cannot separate from the host's launch.
2. ``trace-<model>-<runtime>-b<batch>.csv``: every kernel of one forward in bf16 from the torch
   profiler (name, GPU start and duration in us, grid, block), eager and replayed from a CUDA
   graph, with the forward's wall time: the per-node data `tilecast evaluate --by-family` and
   the graph-runtime diagnosis need.
3. ``--sweep``: ``floor-sweep.csv``, the in-graph time per launch of one op per family (add,
   softmax, layer norm, sum, linear, batched Q K^T, and one wave of linears and convs whose
   reduction grows) from one block to many waves, beside the
   kernel's own GPU time, name and grid from the profiler (one eager call): how a kernel's
   in-graph cost grows from its lone-block latency to its streaming rate.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_LAUNCH = 400


def _per_launch_us(fn, n: int, graph: bool) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        run = g.replay
    else:
        def run() -> None:
            for _ in range(n):
                fn()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    return sorted(times)[len(times) // 2]


def tiny_ops(dev) -> dict:
    bf = torch.bfloat16
    x = torch.rand(128, device=dev, dtype=bf)
    big = torch.rand(1 << 20, device=dev, dtype=bf)
    a, w = torch.rand(8, 256, device=dev, dtype=bf), torch.rand(256, 256, device=dev, dtype=bf)
    img = torch.rand(1, 64, 14, 14, device=dev, dtype=bf)
    k1 = torch.rand(64, 64, 1, 1, device=dev, dtype=bf)
    k3 = torch.rand(64, 64, 3, 3, device=dev, dtype=bf)
    nhwc = img.to(memory_format=torch.channels_last)
    k3l = k3.to(memory_format=torch.channels_last)
    return {"add 128 bf16": lambda: x + x, "relu 128 bf16": lambda: F.relu(x),
            "add 1M bf16": lambda: big + big, "linear 8x256x256 bf16": lambda: F.linear(a, w),
            "conv1x1 1x64x14x14 NCHW": lambda: F.conv2d(img, k1),
            "conv3x3 1x64x14x14 NCHW": lambda: F.conv2d(img, k3, padding=1),
            "conv3x3 1x64x14x14 NHWC": lambda: F.conv2d(nhwc, k3l, padding=1)}


def floors(out: Path, dev) -> None:
    torch.backends.cudnn.benchmark = True
    rows = []
    with torch.inference_mode():
        for name, fn in tiny_ops(dev).items():
            try:
                g, e = _per_launch_us(fn, N_LAUNCH, True), _per_launch_us(fn, N_LAUNCH, False)
                rows.append({"op": name, "graph_us_per_launch": g, "eager_us_per_launch": e})
                print(f"floor {name}: graph {g:.2f} us, eager queued {e:.2f} us", flush=True)
            except Exception as exc:  # one op must not cost the others
                print(f"floor {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    _write(out / "floor.csv", rows)


def sweep_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """(family, dims): each family from one block to many waves on a 132-SM GPU."""
    out = [("add", (1 << p,)) for p in range(7, 27)]
    rows = (1, 4, 16, 64, 256, 1024, 4096, 16384)
    out += [("softmax", (r, c)) for c in (128, 1024, 4096) for r in rows]
    out += [("layernorm", (r, c)) for c in (768, 4096) for r in rows]
    out += [("sum", (r, 4096)) for r in (1, 64, 4096)]
    out += [("linear", (m, k, k)) for k in (256, 1024, 4096) for m in (1, 8, 64, 512, 4096)]
    out += [("bmmt", (bh, s, 64)) for bh in (1, 16, 128) for s in (64, 256, 1024)]
    # The reduction loop (docs/predictor.md, "The reduction loop of a small tensor-core GEMM"):
    # one wave of tiles whose k grows, as a linear of 16 rows and as ResNet-50's batch-1
    # 3 x 3 convs on 7 x 7 maps (k = 9 C), so a lent GPU of another architecture tests the
    # one-L2-round-trip-per-k-step floor.
    out += [("linear", (16, k, 256)) for k in (64, 256, 1024, 2048, 4096, 8192, 16384)]
    out += [("conv", (1, c, 256, 7, 3)) for c in (64, 128, 256, 512, 1024)]
    return out


def _sweep_fn(family: str, dims: tuple[int, ...], dev):
    """The op as a closure over its operands, writing into one preallocated output where
    PyTorch has an out= form (a graph of many launches must not allocate each output)."""
    bf = torch.bfloat16
    r = lambda *s: torch.rand(*s, device=dev, dtype=bf)  # noqa: E731
    if family == "add":
        x, y = r(*dims), torch.empty(dims, device=dev, dtype=bf)
        return lambda: torch.add(x, x, out=y)
    if family == "softmax":
        x = r(*dims)
        return lambda: torch.softmax(x, -1)
    if family == "layernorm":
        x, w, b = r(*dims), r(dims[1]), r(dims[1])
        return lambda: F.layer_norm(x, (dims[1],), w, b)
    if family == "sum":
        x = r(*dims)
        return lambda: x.sum(-1)
    if family == "linear":
        m, k, n = dims
        x, w, y = r(m, k), r(n, k), torch.empty(m, n, device=dev, dtype=bf)
        return lambda: torch.matmul(x, w.t(), out=y)
    if family == "conv":  # N, C, K, H (= W), R (= S), stride 1, "same" padding, NCHW
        n, c, k, h, rs = dims
        x, w = r(n, c, h, h), r(k, c, rs, rs)
        return lambda: F.conv2d(x, w, padding=rs // 2)
    bh, s, d = dims  # bmmt: Q K^T
    q, k, y = r(bh, s, d), r(bh, s, d), torch.empty(bh, s, s, device=dev, dtype=bf)
    return lambda: torch.bmm(q, k.transpose(1, 2), out=y)


def _isolated(fn) -> dict:
    """One eager call under the profiler: its kernels' names, grids and own GPU time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ks = _kernels(prof)
    return {"kernel_us": sum(k["dur_us"] for k in ks), "kernels": len(ks),
            "names": ";".join(k["name"][:120] for k in ks),
            "grids": ";".join(k["grid"] for k in ks)}


def sweep(out: Path, dev, eager: bool = False, name: str = "floor-sweep.csv") -> None:
    """``eager`` adds the time per launch queued eagerly (the host's dispatch per family)."""
    rows = []
    with torch.inference_mode():
        for family, dims in sweep_shapes():
            label = f"{family} {'x'.join(map(str, dims))}"
            try:
                fn = _sweep_fn(family, dims, dev)
                out_bytes = 2 * max(torch.as_tensor(fn()).numel(), 1)
                n = int(min(max(4e8 // out_bytes, 20), N_LAUNCH))
                g = _per_launch_us(fn, n, True)
                e = _per_launch_us(fn, n, False) if eager else float("nan")
                rows.append({"family": family, "dims": "x".join(map(str, dims)),
                             "dtype": "bf16", "launches": n, "graph_us_per_launch": g,
                             "eager_us_per_launch": e, **_isolated(fn)})
                print(f"sweep {label}: graph {g:.2f} us/launch, kernel "
                      f"{rows[-1]['kernel_us']:.2f} us, grid {rows[-1]['grids']}", flush=True)
            except Exception as exc:  # one shape must not cost the others
                print(f"sweep {label}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            _write(out / name, rows)
            torch.cuda.empty_cache()


def _write(path: Path, rows: list[dict]) -> None:
    if rows:
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def _kernels(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    ks = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    t0 = min((e["ts"] for e in ks), default=0)
    return [{"name": e["name"], "start_us": e["ts"] - t0, "dur_us": e.get("dur", 0),
             "grid": "x".join(map(str, e.get("args", {}).get("grid", []))),
             "block": "x".join(map(str, e.get("args", {}).get("block", [])))} for e in ks]


def _profile(run, path: Path, label: str, unit: str) -> None:
    """Warm ``run`` up, time 10 calls on the wall clock, profile one, write its kernels to
    ``path`` and print their GPU busy time and span beside the wall time per call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        run()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t) * 100
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ks = _kernels(prof)
    busy = sum(k["dur_us"] for k in ks) / 1e3
    span = max((k["start_us"] + k["dur_us"] for k in ks), default=0) / 1e3
    _write(path, ks)
    print(f"trace {label}: {len(ks)} kernels, busy {busy:.3f} ms, span {span:.3f} ms, "
          f"wall {wall_ms:.3f} ms per {unit}", flush=True)


def trace(out: Path, model: str, batch: int, seq: int | None, runtime: str, dev,
          layers: int | None = None) -> None:
    from tilecast.exporters.api import build_module

    built = build_module(model, batch=batch, seq=seq, dtype="bfloat16", layers=layers,
                         device=str(dev))
    module, inputs = built.module.eval(), dict(built.inputs)

    def forward():
        with torch.inference_mode():
            return module(**inputs)

    run = forward
    if runtime == "cudagraph":
        from tilecast.collect.labels import _graph_replay

        run = _graph_replay(forward, dev)
    _profile(run, out / f"trace-{model}-{runtime}-b{batch}.csv",
             f"{model} {runtime} b{batch}", "forward")


def trace_amp_step(out: Path, model: str, batch: int, seq: int | None, dev,
                   math: str = "amp-bf16") -> None:
    """One training step of the fp32 model under autocast, as `collect-labels --math` times
    it: its kernels, and how much of the step's wall time the GPU is busy."""
    from tilecast.collect.labels import _timers, math_mode
    from tilecast.exporters.api import build_module

    built = build_module(model, batch=batch, seq=seq, dtype="float32", device=str(dev))
    with math_mode(math):
        _, step = _timers(built.module, dict(built.inputs), "training", "eager", dev, math)
        _profile(step, out / f"trace-{model}-{math}-train-b{batch}.csv",
                 f"{model} {math} training b{batch}", "step")


AMP_STEPS = (("bert-large", 8, 512), ("bert-large", 1, 512), ("resnet-50", 128, None),
             ("vit-base", 32, None))
TRACES = (("resnet-50", 1, None, "cudagraph", None), ("resnet-50", 1, None, "eager", None),
          ("resnet-50", 32, None, "cudagraph", None), ("resnet-50", 256, None, "cudagraph", None),
          ("mobilenet-v3-large", 1, None, "cudagraph", None),
          ("bert-large", 8, 512, "eager", None), ("llama-3-8b", 1, 2048, "eager", 4),
          ("gpt2-large", 4, 1024, "eager", None), ("gpt2-large", 1, 1024, "eager", None))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--only", default="", help="comma-separated models to trace (no floors)")
    ap.add_argument("--amp-steps", action="store_true",
                    help="only the autocast training steps (AMP_STEPS)")
    ap.add_argument("--sweep", action="store_true", help="only floor-sweep.csv")
    ap.add_argument("--eager", action="store_true", help="with --sweep: queued eagerly too")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(a.device)
    if a.sweep:
        sweep(a.out, dev, a.eager, "floor-sweep-eager.csv" if a.eager else "floor-sweep.csv")
        return
    if a.amp_steps:
        for model, b, s in AMP_STEPS:
            try:
                trace_amp_step(a.out, model, b, s, dev)
            except Exception as exc:
                print(f"trace {model} amp b{b}: FAILED {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
            torch.cuda.empty_cache()
        return
    only = [m for m in a.only.split(",") if m]
    if not only:
        floors(a.out, dev)
    for model, b, s, rt, layers in TRACES:
        if only and model not in only:
            continue
        try:
            trace(a.out, model, b, s, rt, dev, layers)
        except Exception as exc:
            print(f"trace {model} {rt} b{b}: FAILED {type(exc).__name__}: {str(exc)[:300]}",
                  flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
