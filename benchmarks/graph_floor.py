"""Small kernels one at a time, as a CUDA graph and as eager PyTorch queues them: forecast vs
measured on our own H100 sweep (``datasets/h100-sxm5-80gb/traces/floor-sweep-eager.csv``).

usage: python benchmarks/graph_floor.py [CSV] [--device "NVIDIA H100 SXM5 80GB"] [--rows]

Each sweep row is one bf16 op (add, softmax, layer norm, sum, linear, Q K^T, conv) from one block to
many waves, launched 20-400 times back to back: ``graph_us_per_launch`` from one CUDA graph's
replay, ``eager_us_per_launch`` queued eagerly without a sync. The row becomes a one-node ONNX
graph that tilecast forecasts with ``--runtime cudagraph`` and ``eager``; the table is the
median forecast / measured ratio per family and size band (below, near and past one wave of
blocks). None of these rows trains the predictor: bf16 Hopper is outside its training data.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tilecast  # noqa: E402

DEFAULT = ROOT / "datasets" / "h100-sxm5-80gb" / "traces" / "floor-sweep-eager.csv"
BF16 = TensorProto.BFLOAT16


def _io(name: str, shape: tuple[int, ...]):
    return helper.make_tensor_value_info(name, BF16, list(shape))


def one_node(family: str, dims: tuple[int, ...]):
    """The sweep's op as the one node of an ONNX graph (every operand a graph input, so
    nothing is folded as a weight)."""
    if family == "add":
        ins, out, node = [("x", dims)], ("y", dims), helper.make_node("Add", ["x", "x"], ["y"])
    elif family == "softmax":
        ins, out = [("x", dims)], ("y", dims)
        node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    elif family == "layernorm":
        ins, out = [("x", dims), ("w", dims[1:]), ("b", dims[1:])], ("y", dims)
        node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], axis=-1)
    elif family == "sum":
        ins, out = [("x", dims)], ("y", dims[:1])
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    elif family == "linear":
        m, k, n = dims
        ins, out = [("x", (m, k)), ("w", (k, n))], ("y", (m, n))
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    elif family == "conv":  # N, C, K, H (= W), R (= S): stride 1, "same" padding, NCHW
        n, c, k, h, rs = dims
        ins, out = [("x", (n, c, h, h)), ("w", (k, c, rs, rs))], ("y", (n, k, h, h))
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[rs // 2] * 4)
    else:  # bmmt: Q K^T, K already transposed (the sweep's bmm reads it strided)
        bh, s, d = dims
        ins, out = [("q", (bh, s, d)), ("kt", (bh, d, s))], ("y", (bh, s, s))
        node = helper.make_node("MatMul", ["q", "kt"], ["y"])
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [-1])] if family == "sum" else []
    graph = helper.make_graph([node], family, [_io(n, s) for n, s in ins], [_io(*out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


BANDS = ("1 block", "< 1 wave", "1-16 waves", "> 16 waves")


def band(row: dict) -> str:
    """The size band, by the profiled grid's blocks against the H100's 132 SMs."""
    blocks = sum(int(np.prod([int(v) for v in g.split("x")])) for g in row["grids"].split(";"))
    return BANDS[0] if blocks == 1 else BANDS[1] if blocks < 132 else (
        BANDS[2] if blocks <= 132 * 16 else BANDS[3])


@dataclass(frozen=True)
class FloorRow:
    """One sweep row beside its forecasts (us per launch)."""

    family: str
    dims: str
    band: str
    graph_us: float
    eager_us: float
    forecast_graph_us: float
    forecast_eager_us: float
    incomplete: bool  # some node of the one-node graph was not costed


def score(path: Path, device: tilecast.Device) -> list[FloorRow]:
    out = []
    for r in csv.DictReader(path.open()):
        model = one_node(r["family"], tuple(int(v) for v in r["dims"].split("x")))
        f = {rt: tilecast.analyze(model, device, runtime=rt) for rt in ("cudagraph", "eager")}
        out.append(FloorRow(r["family"], r["dims"], band(r), float(r["graph_us_per_launch"]),
                            float(r["eager_us_per_launch"]), f["cudagraph"].total_ms * 1e3,
                            f["eager"].total_ms * 1e3, f["eager"].incomplete))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", type=Path, nargs="?", default=DEFAULT)
    ap.add_argument("--device", default="NVIDIA H100 SXM5 80GB")
    ap.add_argument("--rows", action="store_true", help="print every row too")
    a = ap.parse_args()
    if not a.csv.exists():
        raise SystemExit(f"Error: {a.csv} not found (measured by scripts/gpu_kernel_trace.py "
                         "--sweep --eager on a leased GPU)")
    dev = tilecast.load_device(a.device)
    rows = score(a.csv, dev)
    for r in rows if a.rows else ():
        print(f"{r.family:9s} {r.dims:16s} graph {r.graph_us:7.2f} us, forecast "
              f"{r.forecast_graph_us:7.2f}; eager {r.eager_us:7.2f}, forecast "
              f"{r.forecast_eager_us:7.2f}")
    print(f"{dev.name}, bf16, forecast / measured per launch (median; n rows)\n")
    print("| family | size | rows | CUDA graph | eager |\n| --- | --- | ---: | ---: | ---: |")
    for (fam, b), group in sorted(groups(rows).items(), key=lambda kv: (kv[0][0],
                                                                       BANDS.index(kv[0][1]))):
        print(f"| {fam} | {b} | {len(group)} | "
              f"{np.median([r.forecast_graph_us / r.graph_us for r in group]):.2f} | "
              f"{np.median([r.forecast_eager_us / r.eager_us for r in group]):.2f} |")


def groups(rows: list[FloorRow]) -> dict[tuple[str, str], list[FloorRow]]:
    out: dict[tuple[str, str], list[FloorRow]] = {}
    for r in rows:
        out.setdefault((r.family, r.band), []).append(r)
    return out


if __name__ == "__main__":
    main()
