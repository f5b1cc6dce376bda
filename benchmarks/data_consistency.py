"""Do the shared dataset's two measurement sources agree? Seven checks, printed per GPU.

    python benchmarks/data_consistency.py [--data ../shared/datasets/neusight-asplos25]

1. The same fp32 Linear GEMM (rows x in -> out) timed in the kernel sweep
   (``kernels/nvidia/{train,eval}/linear``) and node by node in a label's per-node CSV:
   kernel-sweep ms / per-node ms, median and range over the shapes both hold.
2. Backward / forward of the same node in the training labels (sum of bw_latency over sum of
   fw_latency per op kind): how much slower PyTorch's backward kernel of an op is than its
   forward on the same tensors.
3. Measured end-to-end step / the sum of the per-node timings (repeated blocks counted), per
   GPU and mode: what a sum of isolated kernels leaves out (or counts twice).
4. The backward of softmax and dropout on the attention tensor, in passes over that tensor: the
   scalar divide on the same tensor (its forward reads it and writes it: 2 passes) gives the
   GPU's streaming rate. What PyTorch launches moves 6 passes for softmax (``dY * Y``, then the
   row kernel on it and Y: ATen's softmax_backward_cuda_out) and, as the per-node harness calls
   the backward with grad mode on, 6.25 for dropout (cast the one-byte mask, scale it, multiply
   by dY); a training step's dropout backward is one 2.25-pass kernel.
5. The sweep's two splits on near-identical shapes: for each held-out (eval) GEMM of at least
   1 GFLOP, the training row of the same op and GPU whose B, M, N and K all lie within 10 %;
   eval TFLOP/s / train TFLOP/s, median and quartiles; the same for elementwise ops of at
   least 100 MB (rows, cols; GB/s). The held-out shapes are round (model dims, multiples of
   128), the training shapes random; within each split roundness is worth 0-6 %, and the
   memory-bound elementwise rows, which do not run at the SM clock, agree across splits.
6. The conv sweep's harness drift (``tilecast.learned.sweep_drift``): each conv CSV lists
   random shapes in the order they ran. Per tenth of the file: the median batch (the shapes
   are drawn alike), the 2nd percentile of the recorded latency (the smallest convs: a few
   microseconds of GPU work) and the median excess of the recorded latency over a baseline
   that knows the shape but not the position, in three size classes of that baseline. An
   excess that rises alike for small and large convs is time added per call, not by the GPU.
7. Linear GEMMs by reduction length K (both splits): the median TFLOP/s of the rows that take
   10-100 ms (long enough that dispatch and launch do not count) and have at least 4M outputs
   (M x N: 256 tiles of 128 x 128, two waves or more on every GPU; without it, a fixed duration
   gives the long reductions few output tiles), per K band, over the band K < 2,048. A longer
   reduction runs slower per FLOP on the P100, the A100s and the AMD GPUs, though its tiles
   do more work per operand byte loaded (docs/predictor.md, "Long reductions").

Why: the predictor trains on (1)'s sweep and is scored end to end against labels whose kernels
were timed as in (1)'s per-node column; a GPU whose two sources disagree cannot be forecast
within a few percent on both (docs/predictor.md, "Open causes"). Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "datasets" / "neusight-asplos25"
sys.path.insert(0, str(REPO))

from tilecast.evaluation.by_family import num_layer  # noqa: E402
from tilecast.evaluation.fx_nodes import HOST, FxNode, read_per_node_csv  # noqa: E402
from tilecast.evaluation.labels import Label, discover_labels  # noqa: E402

if TYPE_CHECKING:
    from tilecast.learned.dataset import KernelSamples

GEMM_MODULES = ("Linear", "Conv1D")  # nn.Linear and transformers' Conv1D (GPT-2): one GEMM
# Op kinds of check 2: fx target -> kind.
BACKWARD_KINDS = {"softmax": "softmax", "Dropout": "dropout", "dropout": "dropout",
                  "LayerNorm": "layernorm", "layer_norm": "layernorm", "gelu": "gelu",
                  "GELUActivation": "gelu", "NewGELUActivation": "gelu", "truediv": "truediv",
                  "Linear": "linear", "Conv1D": "linear"}
KIND_ORDER = ("linear", "softmax", "dropout", "layernorm", "gelu", "truediv")


def gemm_dims(node: FxNode) -> tuple[int, int, int] | None:
    """(rows, in, out) of a Linear-like node from its recorded shapes."""
    if node.target not in GEMM_MODULES or not node.input_shapes or not node.output_shape:
        return None
    try:
        x = ast.literal_eval(node.input_shapes)[0]
        y = ast.literal_eval(node.output_shape)
    except (ValueError, SyntaxError, IndexError, TypeError):
        return None
    rows = 1
    for d in x[:-1]:
        rows *= int(d)
    return rows, int(x[-1]), int(y[-1])


def sweep_linears(data: Path) -> dict[tuple[str, int, int, int], float]:
    """(device name, rows, in, out) -> ms of every NVIDIA fp32 Linear in the kernel sweep."""
    from tilecast.learned.dataset import load_kernels
    from tilecast.learned.prepare import default_lookup

    out: dict[tuple[str, int, int, int], float] = {}
    for split in ("train", "eval"):
        s = load_kernels([data], split)
        s = s.select(s.op == "linear")
        names = {d: default_lookup(d).name for d in set(s.device.tolist())}
        for i in range(len(s)):  # tilecast dims: m rows, k reduction (in), n outputs
            key = (names[s.device[i]], int(s.m[i]), int(s.k[i]), int(s.n[i]))
            out[key] = float(s.latency_ms[i])
    return out


def labelled_runs(data: Path) -> list[tuple[Label, tuple[FxNode, ...]]]:
    labels, _ = discover_labels(data / "labels", data / "models")
    runs = []
    for label in labels:
        csv_path = label.file.with_suffix(".csv")
        if csv_path.is_file():
            runs.append((label, read_per_node_csv(csv_path, num_layer=num_layer(label),
                                                  training=label.mode == "training")))
    return runs


def _spread(values: list[float]) -> str:
    return (f"{len(values):5d}  {statistics.median(values):6.2f}  {min(values):5.2f}  "
            f"{max(values):5.2f}")


def same_gemm(runs, sweep) -> list[str]:
    ratios: dict[str, list[float]] = defaultdict(list)
    for label, nodes in runs:
        for node in nodes:
            dims = gemm_dims(node)
            key = dims and (label.device.name, *dims)
            if key in sweep and node.forward_ms > 0:
                ratios[label.gpu].append(sweep[key] / node.forward_ms)
    lines = ["1. Same Linear GEMM: kernel-sweep ms / per-node ms",
             f"{'gpu':26s} pairs  median    min    max"]
    lines += [f"{gpu:26s} {_spread(v)}" for gpu, v in sorted(ratios.items())]
    return lines


def backward_ratios(runs) -> list[str]:
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for label, nodes in runs:
        if label.mode != "training":
            continue
        for node in nodes:
            kind = BACKWARD_KINDS.get(node.target)
            if kind and node.forward_ms > 0 and node.backward_ms > 0:
                acc = sums[(label.gpu, kind)]
                acc[0] += node.forward_ms * node.repeats
                acc[1] += node.backward_ms * node.repeats
    gpus = sorted({g for g, _ in sums})
    lines = ["2. Training labels: backward ms / forward ms of the same nodes",
             f"{'gpu':26s}" + "".join(f"{k:>10s}" for k in KIND_ORDER)]
    for gpu in gpus:
        cells = [sums.get((gpu, k)) for k in KIND_ORDER]
        lines.append(f"{gpu:26s}" + "".join(
            f"{c[1] / c[0]:10.2f}" if c else f"{'-':>10s}" for c in cells))
    return lines


def step_over_nodes(runs) -> list[str]:
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for label, nodes in runs:
        total = sum((n.forward_ms + n.backward_ms + n.accumulate_ms) * n.repeats
                    for n in nodes if n.family != HOST)
        if total > 0 and label.variant in ("plain", "fusion"):
            ratios[(label.gpu, f"{label.mode} {label.variant}")].append(label.measured_ms / total)
    lines = ["3. Measured step / sum of per-node kernel timings",
             f"{'gpu':26s} {'mode':20s} runs  median    min    max"]
    lines += [f"{gpu:26s} {mode:20s} {_spread(v)}" for (gpu, mode), v in sorted(ratios.items())]
    return lines


def attention_passes(runs) -> list[str]:
    passes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for label, nodes in runs:
        if label.mode != "training":
            continue
        # the scalar divide's forward on each 4-D tensor: 2 passes at the streaming rate
        ref = {n.input_shapes: n.forward_ms for n in nodes
               if n.target == "truediv" and n.forward_ms > 0 and n.input_shapes.count(",") == 3}
        for n in nodes:
            kind = BACKWARD_KINDS.get(n.target)
            if kind in ("softmax", "dropout") and n.input_shapes in ref and n.backward_ms > 0:
                passes[(label.gpu, kind)].append(2.0 * n.backward_ms / ref[n.input_shapes])
    lines = ["4. Backward of softmax / dropout on the attention tensor, in passes over it "
             "(PyTorch's kernels: 6 / 6.25 with grad mode on)",
             f"{'gpu':26s} {'op':8s} nodes  median    min    max"]
    lines += [f"{gpu:26s} {kind:8s} {_spread(v)}" for (gpu, kind), v in sorted(passes.items())]
    return lines


def _split_ratios(s, sel, dims, speed) -> list[float]:
    """Held-out speed / speed of the nearest training row of the same op (every dim within
    10 %), for the held-out rows of ``sel`` that have one."""
    import numpy as np

    out = []
    for op in sorted(set(s.op[sel].tolist())):
        tr, ev = (np.nonzero(sel & (s.op == op) & (s.split == sp))[0] for sp in ("train", "eval"))
        for j in ev if len(tr) else ():
            gap = np.abs(dims[tr] - dims[j]).max(axis=1)
            if gap.min() < np.log(1.1):
                out.append(speed[j] / speed[tr[gap.argmin()]])
    return out


def kernel_samples(data: Path) -> KernelSamples:
    """Every kernel of the sweep, both splits and vendors (checks 5 and 7)."""
    from tilecast.learned.dataset import KernelSamples, load_kernels

    return KernelSamples.concat([load_kernels([data], sp, vendor) for sp in ("train", "eval")
                                 for vendor in ("nvidia", "amd")])


def split_pairs(s: KernelSamples) -> list[str]:
    import numpy as np

    gemm = np.log(np.stack([s.b, s.m, s.n, s.k], 1).astype(float).clip(1))
    rows = np.log(np.stack([s.rows, s.cols], 1).astype(float).clip(1))
    # (label, rows, dims, speed): GEMMs of >= 1 GFLOP by FLOP rate (compute-bound: they run
    # at the SM clock), elementwise ops of >= 100 MB by byte rate (memory-bound: they do not)
    kinds = (("linear", (s.op == "linear") & (s.flops >= 1e9), gemm, s.flops / s.latency_ms),
             ("bmm", (s.op == "bmm") & (s.flops >= 1e9), gemm, s.flops / s.latency_ms),
             ("ew", (s.family == "elementwise") & (s.bytes >= 1e8), rows,
              s.bytes / s.latency_ms))
    lines = ["5. The sweep's held-out split / its training split: speed of near-identical "
             "shapes (same op, every dim within 10 %)",
             f"{'gpu':26s} {'op':7s} pairs  median    q25    q75"]
    for dev in sorted(set(s.device.tolist())):
        for label, sel, dims, speed in kinds:
            ratios = _split_ratios(s, sel & (s.device == dev), dims, speed)
            if ratios:
                q25, q50, q75 = np.percentile(ratios, [25, 50, 75])
                lines.append(f"{dev:26s} {label:7s} {len(ratios):5d}  {q50:6.2f}  {q25:5.2f}  "
                             f"{q75:5.2f}")
    return lines


def _by_tenth(s, base) -> dict[str, list[float]]:
    """Check 6's rows for one conv file: each statistic over the ten tenths of the file."""
    import numpy as np

    tenth = np.minimum((s.position * 10).astype(int), 9)
    parts = [tenth == i for i in range(10)]
    excess = s.latency_ms - base
    rows = {"median batch": [float(np.median(s.n[m])) for m in parts],
            "2nd pct ms": [float(np.percentile(s.latency_ms[m], 2)) for m in parts]}
    for lo, hi in ((0.0, 0.3), (0.3, 2.0), (2.0, np.inf)):
        size = (base >= lo) & (base < hi)
        rows[f"excess, base {lo:g}-{hi:g}"] = [
            float(np.median(excess[m & size])) if (m & size).any() else float("nan")
            for m in parts]
    return rows


def conv_drift(data: Path) -> list[str]:
    import numpy as np

    from tilecast.learned import conv_data as cd
    from tilecast.learned.sweep_drift import shape_baseline_ms

    lines = ["6. The conv sweep, by tenth of its file: median batch; 2nd percentile of the "
             "recorded ms; median recorded - baseline ms for baselines < 0.3, 0.3-2, > 2 ms",
             f"{'gpu':26s} {'what':18s} " + " ".join(f"{i:>6d}" for i in range(1, 11))]
    for f in cd.conv_files([data]):
        s = cd.read_conv_csv(f, drift=False)
        if s is None:
            continue
        _, fit = cd.file_drift(s)
        dims = np.column_stack([np.log2(np.maximum(v, 1.0)) for v in
                                (s.n, s.c, s.k, s.p, s.r, s.stride)])
        base = shape_baseline_ms(dims, s.algo, s.latency_ms)
        for what, vals in _by_tenth(s, base).items():
            cells = (f"{v:6.2f}" if v == v else f"{'-':>6s}" for v in vals)  # nan: no rows
            lines.append(f"{s.device[0]:26s} {what:18s} " + " ".join(cells))
        lines.append(f"{s.device[0]:26s} {'drift (fitted)':18s} span {fit.span_ms:.2f} ms, "
                     f"noise {fit.noise_ms:.3f} ms, taken out: {fit.applied}")
    return lines


K_BANDS = (0, 2048, 8192, 16384, 32768, 2**62)  # check 7's reduction lengths
DURATION_MS = (10.0, 100.0)  # check 7's rows: compute-bound, past the fixed costs
MIN_OUTPUTS = 2**22  # and several waves of output tiles


def long_reductions(s: KernelSamples) -> list[str]:
    """Check 7 on kernel samples ``s``."""
    import numpy as np

    rate = s.flops / s.latency_ms / 1e9  # TFLOP/s
    lo_ms, hi_ms = DURATION_MS
    sel = ((s.op == "linear") & (s.latency_ms >= lo_ms) & (s.latency_ms < hi_ms)
           & (s.m * s.n >= MIN_OUTPUTS))
    bands = list(itertools.pairwise(K_BANDS))
    heads = [f"{lo // 1024}k-{hi // 1024}k" if hi < K_BANDS[-1] else f">={lo // 1024}k"
             for lo, hi in bands]
    lines = [f"7. Linear TFLOP/s by reduction length K, rows of {lo_ms:g}-{hi_ms:g} ms with "
             f">= {MIN_OUTPUTS / 2**20:g}M outputs: the first band's median, then each band's "
             "median over it (rows)",
             f"{'gpu':26s} {'TFLOP/s':>8s} " + " ".join(f"{h:>13s}" for h in heads[1:])]
    for dev in sorted(set(s.device[sel].tolist())):
        med = []
        for lo, hi in bands:
            m = sel & (s.device == dev) & (s.k >= lo) & (s.k < hi)
            med.append((float(np.median(rate[m])) if m.any() else float("nan"), int(m.sum())))
        first = med[0][0]
        cells = (f"{r / first:6.2f} ({n:4d})" if n else f"{'-':>13s}" for r, n in med[1:])
        lines.append(f"{dev:26s} {first:8.2f} " + " ".join(cells))
    return lines


def parse_data_args(doc: str | None) -> Path | None:
    """The ``--data`` folder of a shared-dataset benchmark, or None after one ``Error:`` line
    when it holds no labels."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    data = ap.parse_args().data
    if not (data / "labels").is_dir():
        print(f"Error: no shared dataset at {data} (labels/ missing)", file=sys.stderr)
        return None
    return data


def main() -> int:
    data = parse_data_args(__doc__)
    if data is None:
        return 2
    runs, kernels = labelled_runs(data), kernel_samples(data)
    for block in (same_gemm(runs, sweep_linears(data)), backward_ratios(runs),
                  step_over_nodes(runs), attention_passes(runs), split_pairs(kernels),
                  conv_drift(data), long_reductions(kernels)):
        print("\n".join(block), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
