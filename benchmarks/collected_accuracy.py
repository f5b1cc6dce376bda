"""Score the shipped predictor against kernels measured with ``tilecast collect`` (one GPU).

usage: python benchmarks/collected_accuracy.py datasets/h100-sxm5-80gb [--repeat DIR]

None of these rows trained the shipped predictor, so every row is unseen: the table is
tilecast and the roofline per family x dtype (MAPE, the median forecast / measured ratio, the
share of kernels forecast within 1.25x and off by more than 2x). With ``--repeat`` (the same
shapes measured again on a fresh machine), it first prints the run-to-run spread: the floor
any model's error sits on. A training step's kernels have rows of their own: a linear's
weight gradient, RMS norm, SiLU, and a conv's data and weight gradients forecast as a
training step costs them (``--grad-kernel-time`` scores those against their profiled GPU
time: an event-timed ``convolution_backward`` also holds cuDNN's host work).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilecast.analyzer.forecast import misaligned_gemm  # noqa: E402
from tilecast.analyzer.predictor import RooflinePredictor  # noqa: E402
from tilecast.learned import conv_data as cd  # noqa: E402
from tilecast.learned import conv_eval as ce  # noqa: E402
from tilecast.learned.dataset import KernelSamples, read_csv  # noqa: E402
from tilecast.learned.evaluate import predict_by_device, report_family, to_kernels  # noqa: E402
from tilecast.learned.predictor import OnnxPredictor  # noqa: E402
from tilecast.learned.prepare import default_lookup  # noqa: E402

SHORT = {"bfloat16": "bf16", "float16": "fp16", "float8e4m3fn": "fp8", "float32": "fp32"}


# Ops shown on rows of their own, apart from their family's (stop 48's lease): a linear's
# weight gradient (dY^T X, costed as the analyzer's dB), RMS norm and SiLU.
OWN_ROWS = {"mmtn": "matmul dW (dY^T X)", "rms": "rmsnorm", "silu": "silu"}


def kernel_rows(root: Path) -> KernelSamples | None:
    parts = [p for p in (read_csv(f, "train") for f in
                         sorted((root / "kernels" / "nvidia" / "train").glob("*/*.csv"))) if p]
    return KernelSamples.concat(parts) if parts else None


def conv_rows(root: Path) -> cd.ConvSamples | None:
    files = sorted((root / "kernels" / "nvidia" / "train" / "conv").glob("*.csv"))
    # collect times each call with CUDA events: no sweep harness drift to take out
    parts = [p for p in (cd.read_conv_csv(f, drift=False) for f in files) if p]
    return cd.ConvSamples.concat(parts) if parts else None


# `tilecast collect`'s dtype names -> ONNX element types, for the grouped convs' graph.
_ONNX_TYPES = {"bfloat16": 16, "float16": 10, "float32": 1}  # onnx.TensorProto values


def grouped_convs(root: Path) -> tuple[np.ndarray, list, np.ndarray, np.ndarray, str | None]:
    """(measured ms, analyzer kernels, depthwise?, channels-last?, device) of the grouped and
    depthwise conv rows, which ``conv_data`` leaves out (no conv model: the analyzer's
    memory-bound rule, and PyTorch's native depthwise kernel where it runs one). The rows
    become one ONNX graph of Conv nodes, costed by the analyzer's own conv formula; a
    channels-last row ran cuDNN's NHWC kernels, so its kernel loses the native launch."""
    import csv
    from dataclasses import replace

    from onnx import helper

    import tilecast
    from tilecast.learned.dataset import COLLECT_DTYPES

    truth, depthwise, nhwc, nodes, inputs, outputs, device = [], [], [], [], [], [], None
    for path in sorted((root / "kernels" / "nvidia" / "train" / "conv").glob("*.csv")):
        for r in csv.DictReader(path.open()):
            n, c, k, rr, h, st, pad, g = (int(r[x]) for x in (
                "B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
                "Padding", "Groups"))
            if g == 1:
                continue
            i, elem = len(nodes), _ONNX_TYPES[COLLECT_DTYPES.get(r["dtype"], r["dtype"])]
            inputs += [helper.make_tensor_value_info(f"x{i}", elem, [n, c, h, h]),
                       helper.make_tensor_value_info(f"w{i}", elem, [k, c // g, rr, rr])]
            p = (h + 2 * pad - rr) // st + 1
            outputs.append(helper.make_tensor_value_info(f"y{i}", elem, [n, k, p, p]))
            nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}"], [f"y{i}"], f"conv{i}",
                                          group=g, strides=[st, st], pads=[pad] * 4))
            truth.append(float(r["Latency"]))
            depthwise.append(g == c)
            nhwc.append(bool(int(r["Channels_Last"])))
            device = r["Device"].strip()
    if not nodes:
        return np.array([]), [], np.array([], dtype=bool), np.array([], dtype=bool), None
    model = helper.make_model(helper.make_graph(nodes, "grouped", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    f = tilecast.analyze(model, default_lookup(device), predictor="roofline")
    if f.incomplete:
        raise SystemExit(f"Error: {sum(f.unshaped.values())} grouped convs could not be costed")
    kernels = [replace(k.kernel, cost=replace(k.kernel.cost, native=None)) if cl else k.kernel
               for k, cl in zip(f.kernels, nhwc, strict=True)]
    return np.array(truth), kernels, np.array(depthwise), np.array(nhwc), device


def batch_norms(root: Path) -> tuple[np.ndarray, list, str | None]:
    """(measured ms, analyzer kernels, device) of the inference batch-norm rows (op ``bn``: an
    NCHW ``F.batch_norm`` in eval mode), one ONNX BatchNormalization node each, costed by the
    analyzer's formula with PyTorch's native launch where PyTorch runs it (eager)."""
    import csv

    from onnx import helper

    import tilecast
    from tilecast.analyzer.native import select_backend
    from tilecast.learned.dataset import COLLECT_DTYPES

    truth, nodes, inputs, outputs, device = [], [], [], [], None
    for path in sorted((root / "kernels" / "nvidia" / "train" / "bn").glob("*.csv")):
        for r in csv.DictReader(path.open()):
            n, c, h = (int(r[x]) for x in ("B", "Channels", "Input_Size"))
            i, elem = len(nodes), _ONNX_TYPES[COLLECT_DTYPES.get(r["dtype"], r["dtype"])]
            params = [f"{p}{i}" for p in ("s", "b", "m", "v")]
            inputs += [helper.make_tensor_value_info(f"x{i}", elem, [n, c, h, h]),
                       *(helper.make_tensor_value_info(q, elem, [c]) for q in params)]
            outputs.append(helper.make_tensor_value_info(f"y{i}", elem, [n, c, h, h]))
            nodes.append(helper.make_node("BatchNormalization", [f"x{i}", *params], [f"y{i}"],
                                          f"bn{i}"))
            truth.append(float(r["Latency"]))
            device = r["Device"].strip()
    if not nodes:
        return np.array([]), [], None
    model = helper.make_model(helper.make_graph(nodes, "bn", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    f = tilecast.analyze(model, default_lookup(device), predictor="roofline")
    # one kernel per row, the transform: the op's per-channel copy and invstd launches
    # (select_backend adds them) take microseconds, inside the per-op timing's launch floor
    kernels = [k for k in select_backend([k.kernel for k in f.kernels], "graph", "eager")
               if not k.follow_on]
    return np.array(truth), kernels, device


# `tilecast collect`'s broadcast ops as ONNX nodes: a (1, H) row added to (B, H); GPT-2's
# causal-mask select, a (1, H) bool mask choosing between (B, H) and a 0-dim device tensor.
BROADCAST_OPS = {"addb": ("Add", ("x", "row")), "whereb": ("Where", ("keep", "x", "floor"))}


def broadcast_ops(root: Path) -> list[tuple[str, np.ndarray, list, str]]:
    """(op, measured ms, analyzer kernels, device) of the broadcast-operand rows, each an ONNX
    node costed by the analyzer with PyTorch's launch (eager): its non-vectorized loop."""
    import csv

    from onnx import TensorProto, helper

    import tilecast
    from tilecast.analyzer.native import select_backend
    from tilecast.learned.dataset import COLLECT_DTYPES

    out = []
    for op, (onnx_op, names) in BROADCAST_OPS.items():
        truth, nodes, inputs, outputs, device = [], [], [], [], None
        for path in sorted((root / "kernels" / "nvidia" / "train" / op).glob("*.csv")):
            for r in csv.DictReader(path.open()):
                b, h = int(r["B"]), int(r["H"])
                i, elem = len(nodes), _ONNX_TYPES[COLLECT_DTYPES.get(r["dtype"], r["dtype"])]
                shapes = {"x": (elem, [b, h]), "row": (elem, [1, h]),
                          "keep": (TensorProto.BOOL, [1, h]), "floor": (elem, [])}
                inputs += [helper.make_tensor_value_info(f"{n}{i}", *shapes[n]) for n in names]
                outputs.append(helper.make_tensor_value_info(f"y{i}", elem, [b, h]))
                nodes.append(helper.make_node(onnx_op, [f"{n}{i}" for n in names], [f"y{i}"],
                                              f"{op}{i}"))
                truth.append(float(r["Latency"]))
                device = r["Device"].strip()
        if nodes:
            model = helper.make_model(helper.make_graph(nodes, op, inputs, outputs),
                                      opset_imports=[helper.make_opsetid("", 17)])
            f = tilecast.analyze(model, default_lookup(device), predictor="roofline")
            out.append((op, np.array(truth),
                        select_backend([k.kernel for k in f.kernels], "graph", "eager"), device))
    return out


def _conv_row(r: dict) -> tuple[int, ...]:
    return tuple(int(r[x]) for x in ("B", "Input_Channel", "Output_Channel", "Kernel_Szie",
                                     "Input_Size", "Stride", "Padding", "Groups"))


def conv_grad_rows(root: Path, truth: str = "Latency",
                   ) -> list[tuple[str, str, tuple[int, ...], float, float, float]]:
    """(name, dtype, dims, measured, tilecast, roofline) of each conv gradient row
    (``convdx``, ``convdw``), forecast as a training step forecasts it: each row becomes a
    per-channel PRelu (so that the conv's input needs its gradient) and the Conv, and the
    step's ``<conv>.dX`` / ``<conv>.dW`` kernel is the forecast. The name tells dense,
    grouped and depthwise, NCHW and channels-last rows apart (an ONNX Conv has no layout), and
    convs of fewer than 8 input channels (an image stem: cuDNN pads them for the tensor
    cores). ``truth``: the CSV column measured (``Kernels GPU ms``: the profiled kernels'
    own time; rows without it are left out)."""
    import csv

    from onnx import helper

    import tilecast
    from tilecast.learned.dataset import COLLECT_DTYPES

    rows, parts, device = [], ([], [], [], []), None  # parts: inputs, outputs, inits, nodes
    for op, grad in (("convdx", "dX"), ("convdw", "dW")):
        for path in sorted((root / "kernels" / "nvidia" / "train" / op).glob("*.csv")):
            for r in csv.DictReader(path.open()):
                dims, dt = _conv_row(r), COLLECT_DTYPES.get(r["dtype"], r["dtype"])
                for part, new in zip(parts, _grad_graph(len(rows), dims, dt), strict=True):
                    part.extend(new)
                c, g = dims[1], dims[7]
                kind = "dense" if g == 1 else "depthwise" if g == c else "grouped"
                kind += " C<8" if c < 8 else ""
                layout = " NHWC" if int(r["Channels_Last"]) else ""
                rows.append((f"conv {grad} {kind}{layout}", dt, dims,
                             float(r.get(truth) or "nan"), grad))
                device = r["Device"].strip()
    if not rows:
        return []
    inputs, outputs, inits, nodes = parts
    model = helper.make_model(helper.make_graph(nodes, "grads", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    dev = default_lookup(device)
    preds = {}
    for name, predictor in (("tilecast", "learned"), ("roofline", "roofline"),
                            ("cudnn", _CudnnLayout(OnnxPredictor()))):
        f = tilecast.analyze(model, dev, mode="training", predictor=predictor)
        preds[name] = {k.kernel.name: k.latency_ms for k in f.kernels}
    # A channels-last row ran cuDNN's kernels, not PyTorch's own depthwise gradient.
    return [(name, dt, dims, ms, preds["cudnn" if "NHWC" in name else "tilecast"][
             f"conv{i}.{grad}"], preds["roofline"][f"conv{i}.{grad}"])
            for i, (name, dt, dims, ms, grad) in enumerate(rows) if ms > 0]


class _CudnnLayout:
    """The learned predictor on kernels handed to cuDNN: PyTorch's own NCHW kernels (its
    depthwise conv and data gradient) are not what a channels-last row ran."""

    def __init__(self, inner: OnnxPredictor) -> None:
        self.inner, self.name = inner, inner.name

    def predict(self, kernels: list, device: object) -> list:
        from dataclasses import replace

        return self.inner.predict([replace(k, cost=replace(k.cost, native=None))
                                   for k in kernels], device)


def conv_grads(root: Path, truth: str = "Latency",
               ) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """``conv_grad_rows`` grouped: (name, dtype, measured, tilecast, roofline)."""
    groups: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for name, dt, _, ms, tc, rf in conv_grad_rows(root, truth):
        groups.setdefault((name, dt), []).append((ms, tc, rf))
    return [(name, dt, *np.array(v).T) for (name, dt), v in sorted(groups.items())]


def _grad_graph(i: int, dims: tuple[int, ...], dtype: str) -> tuple[list, list, list, list]:
    """(inputs, outputs, initializers, nodes) of row ``i``: x -> PRelu -> Conv -> y."""
    from onnx import helper, numpy_helper

    n, c, k, rr, h, st, pad, g = dims
    elem, p = _ONNX_TYPES[dtype], (h + 2 * pad - rr) // st + 1

    def init(shape: tuple[int, ...], name: str):
        t = numpy_helper.from_array(np.zeros(shape, np.float16), name)
        t.data_type = elem  # bf16 shares fp16's two bytes; only the shape and type are read
        return t

    return ([helper.make_tensor_value_info(f"x{i}", elem, [n, c, h, h])],
            [helper.make_tensor_value_info(f"y{i}", elem, [n, k, p, p])],
            [init((c, 1, 1), f"s{i}"), init((k, c // g, rr, rr), f"w{i}")],
            [helper.make_node("PRelu", [f"x{i}", f"s{i}"], [f"a{i}"], f"pre{i}"),
             helper.make_node("Conv", [f"a{i}", f"w{i}"], [f"y{i}"], f"conv{i}", group=g,
                              strides=[st, st], pads=[pad] * 4)])


def scored(root: Path, conv_grad_truth: str = "Latency",
           ) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """(family, dtype, measured, tilecast, roofline) groups."""
    learned, roof, out = OnnxPredictor(), RooflinePredictor(), []
    s = kernel_rows(root)
    if s is not None:
        fam = report_family(s.op)
        tc, rf = predict_by_device(learned, s, default_lookup), predict_by_device(roof, s)
        # GEMMs whose rows are no multiple of 16 bytes run cuBLAS's unvectorized fallbacks,
        # which tilecast flags and does not model: shown apart.
        unaligned = np.array([misaligned_gemm(k) for k in to_kernels(s)], dtype=bool)
        own = np.isin(s.op, list(OWN_ROWS))
        for f in ("matmul", "linear", "elementwise", "softmax", "layernorm"):
            for dt in sorted(set(s.dtype.tolist())):
                for name, rows in ((f, ~unaligned & ~own), (f"{f} unaligned", unaligned)):
                    m = (fam == f) & (s.dtype == dt) & rows
                    if m.any():
                        out.append((name, dt, s.latency_ms[m], tc[m], rf[m]))
        for op, name in OWN_ROWS.items():
            for dt in sorted(set(s.dtype[s.op == op].tolist())):
                m = (s.op == op) & (s.dtype == dt) & ~unaligned
                out.append((name, dt, s.latency_ms[m], tc[m], rf[m]))
    c = conv_rows(root)
    if c is not None:
        tc = ce._predict(learned, c, default_lookup)
        rf = ce._predict(roof, c, default_lookup)
        # An ONNX Conv is NCHW: the analyzer has no layout, so channels-last rows are forecast
        # as NCHW (cuDNN's layout transposes included) and shown apart.
        for dt in sorted(set(c.dtype.tolist())):
            for name, layout in (("conv", ~c.nhwc), ("conv NHWC", c.nhwc)):
                m = (c.dtype == dt) & layout
                if m.any():
                    out.append((name, dt, c.latency_ms[m], tc[m], rf[m]))
    truth, kernels, dw, cl, device = grouped_convs(root)
    if len(truth):
        tc, rf, dtypes = _forecast_kernels(kernels, device, learned, roof)
        for dt in sorted(set(dtypes.tolist())):
            for name, m in (("depthwise (NCHW: PyTorch's kernel)", dw & ~cl),
                            ("depthwise NHWC (cuDNN)", dw & cl), ("grouped", ~dw & ~cl),
                            ("grouped NHWC", ~dw & cl)):
                if (m := m & (dtypes == dt)).any():
                    out.append((name, dt, truth[m], tc[m], rf[m]))
    for op, truth, kernels, device in broadcast_ops(root):
        tc, rf, dtypes = _forecast_kernels(kernels, device, learned, roof)
        for dt in sorted(set(dtypes.tolist())):
            m = dtypes == dt
            out.append((f"{op} (broadcast: the loop)", dt, truth[m], tc[m], rf[m]))
    truth, kernels, device = batch_norms(root)
    if len(truth):
        tc, rf, dtypes = _forecast_kernels(kernels, device, learned, roof)
        for dt in sorted(set(dtypes.tolist())):
            m = dtypes == dt
            out.append(("batch norm (inference)", dt, truth[m], tc[m], rf[m]))
    return out + conv_grads(root, conv_grad_truth)


def _forecast_kernels(kernels: list, device: str, learned: OnnxPredictor,
                      roof: RooflinePredictor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tilecast ms, roofline ms, dtype) of analyzer kernels timed one call each."""
    dev = default_lookup(device)
    tc = np.array([p.latency_ms for p in learned.predict(kernels, dev)])
    rf = np.array([p.latency_ms for p in roof.predict(kernels, dev)])
    return tc, rf, np.array([k.dtype for k in kernels], dtype=object)


def _stats(truth: np.ndarray, pred: np.ndarray) -> str:
    ratio = pred / truth
    return (f"{np.mean(np.abs(ratio - 1)) * 100:7.1f}% {np.median(ratio):6.2f} "
            f"{np.mean(np.abs(np.log(ratio)) < np.log(1.25)) * 100:5.0f}% "
            f"{np.mean(np.abs(np.log(ratio)) > np.log(2)) * 100:5.0f}%")


def spread(root: Path, repeat: Path) -> str:
    """MAPE of the second measurement against the first, per family, on the shared shapes."""
    lines = [f"{'family':12s} {'n':>5s} {'run-to-run MAPE':>16s}"]
    a, b = kernel_rows(root), kernel_rows(repeat)
    if a is None or b is None:
        return "no repeated kernels"
    key = lambda s, i: (s.op[i], s.dtype[i], s.b[i], s.m[i], s.n[i], s.k[i], s.rows[i],  # noqa
                        s.cols[i])
    first = {key(a, i): a.latency_ms[i] for i in range(len(a))}
    fam = report_family(b.op)
    for f in ("matmul", "linear", "elementwise", "softmax", "layernorm"):
        pairs = [(first[key(b, i)], b.latency_ms[i]) for i in range(len(b))
                 if fam[i] == f and key(b, i) in first]
        if pairs:
            x = np.array(pairs)
            mape = np.mean(np.abs(x[:, 1] / x[:, 0] - 1)) * 100
            lines.append(f"{f:12s} {len(x):5d} {mape:15.1f}%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--repeat", type=Path)
    ap.add_argument("--min-ms", type=float, default=0.0,
                    help="score only kernels measured at least this long")
    ap.add_argument("--grad-kernel-time", action="store_true",
                    help="score conv gradients against their profiled kernels' GPU time: "
                         "their event-timed single calls also hold cuDNN's host work")
    a = ap.parse_args()
    t = time.perf_counter()
    if a.repeat:
        print(spread(a.data, a.repeat), end="\n\n")
    head = (f"{'family':22s} {'dtype':5s} {'n':>5s} | {'tilecast MAPE':>13s} {'ratio':>6s} "
            f"{'<1.25x':>6s} {'>2x':>5s} | {'roofline MAPE':>13s} {'ratio':>6s} {'<1.25x':>6s} "
            f"{'>2x':>5s}")
    print(head + "\n" + "-" * len(head))
    grad_truth = "Kernels GPU ms" if a.grad_kernel_time else "Latency"
    for fam, dt, truth, tc, rf in scored(a.data, grad_truth):
        keep = truth >= a.min_ms
        if not keep.any():
            continue
        truth, tc, rf = truth[keep], tc[keep], rf[keep]
        print(f"{fam:22s} {SHORT.get(dt, dt):5s} {len(truth):5d} | {_stats(truth, tc):>33s} | "
              f"{_stats(truth, rf):>33s}")
    print(f"\n({time.perf_counter() - t:.0f} s; ratio: median forecast / measured)")


if __name__ == "__main__":
    main()
