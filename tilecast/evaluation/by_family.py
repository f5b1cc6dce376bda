"""``tilecast evaluate --by-family``: measured vs forecast ms per kernel family, per run.

Measured: the label's per-node CSV (``fx_nodes``), nodes of the repeated block counted once
per block. Forecast: the same label's forecast (``runner.forecast_label``: same export cache),
its kernels costed as the per-node harness times them, each alone (the predictor's latency:
the op's dispatch and launch included, which a step hides behind the previous kernel; and the
kernels the harness launches in their place, ``harness.py``), so the families compare like
with like; the run's forecast total is the step (runtime applied).
A Transpose whose output only GEMMs read counts as matmul where the CSV's matmul nodes read
permuted operands (``copies_inside_matmul``): there tilecast's costed Transpose stands for the
copy ``torch.matmul`` makes of an operand whose batch dims do not merge (``analyzer/views.py``),
which the CSV books inside the matmul node (``gemm_operand_copies``).
Phases: forward, backward, accumulate (``grad += new`` into ``.grad``: the CSV's
``acc_latency``, tilecast's ``GradAccumulate`` kernels; always an add, so its measured ms count
as elementwise whichever node owns the parameter) and update (optimizer; not in the labels).
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import onnx

from ..analyzer.forecast import Forecast, KernelForecast
from ..analyzer.pipeline import resolve_predictor
from ..analyzer.predictor import Predictor
from ..analyzer.types import FAMILIES
from ..analyzer.views import MATMULS
from ..device_db import Device
from ..errors import ConfigError
from .fx_nodes import HOST, UNCLASSIFIED, FxNode, read_per_node_csv
from .harness import timed_alone
from .labels import Label, Skipped, discover_labels, measured_passes
from .runner import Progress, _no_labels, cached_export, default_cache_dir, forecast_label

PHASES = ("forward", "backward", "accumulate", "update")
ORDER = (*FAMILIES, HOST, UNCLASSIFIED)  # row order within a phase: tilecast's families first
ACCUMULATE_OP = "GradAccumulate"  # op_type of tilecast's gradient-accumulation kernels
GEMM_OPS = frozenset(op for _, op in MATMULS)  # the GEMMs that read strided operands


@dataclass(frozen=True)
class FamilyRow:
    """One family in one phase of one run."""

    phase: str
    family: str
    measured_ms: float  # sum over the per-node CSV
    predicted_ms: float  # sum over the forecast's kernels
    ratio: float | None  # predicted / measured; None when nothing was measured
    nodes: int  # fx node instances with time in this phase (a block's nodes x num_layer)
    kernels: int  # forecast kernels


@dataclass(frozen=True)
class PhaseStep:
    """A training label's measured forward or backward beside the per-node sum of that phase:
    where a step differs from its nodes, this says which pass holds the difference."""

    phase: str  # forward, or backward (the label's bwall_latency: accumulation included)
    step_ms: float  # the label JSON's fw_latency / bwall_latency
    nodes_ms: float  # per-node CSV sum over the phase, no-kernel nodes included
    ratio: float | None  # step / nodes
    forecast_ms: float  # the forecast's kernels of the phase, as queued in the step


@dataclass(frozen=True)
class RunFamilies:
    """One label run: its family rows and what separates the kernels from the measured step."""

    gpu: str
    model: str
    mode: str
    batch: int
    seq: int
    e2e_ms: float  # the label's measured step
    kernel_ms: float  # per-node sum over nodes that launch a kernel
    host_ms: float  # per-node sum over nodes that launch none (the timing harness's floor)
    gap_ms: float  # e2e_ms - kernel_ms: what the per-node timings do not explain (either sign)
    predicted_ms: float  # forecast step (runtime applied; rows hold kernels timed alone)
    zero_cost_nodes: int  # ONNX nodes the forecast treats as launching no kernel
    unclassified: tuple[str, ...]  # fx targets missing from fx_nodes.FX_FAMILIES
    rows: tuple[FamilyRow, ...]
    phases: tuple[PhaseStep, ...] = ()  # training labels that record fw/bwall latencies


@dataclass(frozen=True)
class FamilyTotal:
    """One family in one phase summed over every run of a GPU and mode."""

    gpu: str
    mode: str
    phase: str
    family: str
    measured_ms: float
    predicted_ms: float
    ratio: float | None
    runs: int


@dataclass(frozen=True)
class ByFamilyResult:
    runs: tuple[RunFamilies, ...]
    totals: tuple[FamilyTotal, ...]
    skipped: tuple[Skipped, ...]
    predictor: str

    def to_dict(self) -> dict[str, Any]:
        return {"predictor": self.predictor, "runs": [asdict(r) for r in self.runs],
                "totals": [asdict(t) for t in self.totals],
                "skipped": [asdict(s) for s in self.skipped]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _ratio(predicted: float, measured: float) -> float | None:
    return round(predicted / measured, 3) if measured > 0 else None


def _measured(nodes: Iterable[FxNode]) -> dict[tuple[str, str], tuple[float, int]]:
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for n in nodes:
        for phase, ms, family in (("forward", n.forward_ms, n.family),
                                  ("backward", n.backward_ms, n.family),
                                  ("accumulate", n.accumulate_ms, "elementwise")):
            if phase == "forward" or ms > 0:
                cell = acc[(phase, family)]
                cell[0] += ms * n.repeats
                cell[1] += n.repeats
    return {k: (v[0], int(v[1])) for k, v in acc.items()}


def copies_inside_matmul(nodes: Iterable[FxNode]) -> bool:
    """Does the CSV time a matmul node reading a non-contiguous operand of rank >= 4?
    ``torch.matmul`` reshapes it to 3-D, a copy the node's time holds (BERT, GPT-2). A model
    that calls ``.contiguous()`` itself (OPT) times those copies as movement nodes."""
    for n in nodes:
        if n.family != "matmul" or not n.input_contiguous:
            continue
        try:
            shapes, flags = ast.literal_eval(n.input_shapes), ast.literal_eval(n.input_contiguous)
        except (ValueError, SyntaxError):
            continue
        if isinstance(shapes, list) and isinstance(flags, list) and any(
                isinstance(sh, list) and len(sh) >= 4 and flag is False
                for sh, flag in zip(shapes, flags, strict=False)):
            return True
    return False


def gemm_operand_copies(model: Path) -> frozenset[str]:
    """Names of the Transpose nodes whose outputs only GEMMs read, directly or through more
    Transposes (none is a graph output)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for t in n.input:
            readers[t].append(n)
    outputs = {o.name for o in graph.output}
    memo: dict[int, bool] = {}

    def feeds_gemms(n: onnx.NodeProto) -> bool:
        if id(n) not in memo:
            users = [u for o in n.output for u in readers.get(o, [])]
            memo[id(n)] = bool(users) and not outputs.intersection(n.output) and all(
                u.op_type in GEMM_OPS or (u.op_type == "Transpose" and feeds_gemms(u))
                for u in users)
        return memo[id(n)]

    return frozenset(n.name for n in graph.node if n.op_type == "Transpose" and feeds_gemms(n))


def _predicted(forecast: Forecast, alone_ms: Sequence[float] | None = None,
               as_matmul: frozenset[str] = frozenset(),
               ) -> dict[tuple[str, str], tuple[float, int]]:
    # The CSV books a node's backward under the node (a Linear's bias-gradient reduction is
    # part of the Linear's bw_latency), so a backward kernel counts in its forward node's family.
    def family_of(k: KernelForecast) -> str:
        nodes = k.kernel.nodes
        return "matmul" if nodes and all(n in as_matmul for n in nodes) else k.kernel.family

    forward = {n: family_of(k) for k in forecast.kernels if k.kernel.phase == "forward"
               for n in k.kernel.nodes}
    ms = alone_ms if alone_ms is not None else [k.latency_ms for k in forecast.kernels]
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for k, k_ms in zip(forecast.kernels, ms, strict=True):
        phase = "accumulate" if k.kernel.op_type == ACCUMULATE_OP else k.kernel.phase
        family = family_of(k)
        if phase == "backward" and k.kernel.nodes:
            family = forward.get(k.kernel.nodes[0], family)
        cell = acc[(phase, family)]
        cell[0] += k_ms
        cell[1] += 1
    return {key: (v[0], int(v[1])) for key, v in acc.items()}


def _order(key: tuple[str, str]) -> tuple[int, int, str]:
    phase, family = key
    rank = ORDER.index(family) if family in ORDER else len(ORDER)
    return PHASES.index(phase) if phase in PHASES else len(PHASES), rank, family


def _node_ms(nodes: Iterable[FxNode], *, host: bool) -> float:
    return sum((n.forward_ms + n.backward_ms + n.accumulate_ms) * n.repeats
               for n in nodes if (n.family == HOST) == host)


# Per-node columns of each measured pass (labels.PASS_KEYS).
PASS_COLUMNS = {"forward": ("forward_ms",), "backward": ("backward_ms", "accumulate_ms")}


def phase_steps(label: Label, nodes: Iterable[FxNode], forecast: Forecast,
                ) -> tuple[PhaseStep, ...]:
    """Each measured pass the label JSON records, beside its per-node sum and its forecast."""
    by_phase, nodes = forecast.by_phase, tuple(nodes)
    out = []
    for phase, step in measured_passes(label).items():
        node_ms = sum(getattr(n, c) * n.repeats for n in nodes for c in PASS_COLUMNS[phase])
        out.append(PhaseStep(phase, round(step, 4), round(node_ms, 4),
                             round(step / node_ms, 4) if node_ms > 0 else None,
                             round(by_phase.get(phase, 0.0), 4)))
    return tuple(out)


def compare_run(label: Label, nodes: tuple[FxNode, ...], forecast: Forecast,
                alone_ms: Sequence[float] | None = None,
                as_matmul: frozenset[str] = frozenset()) -> RunFamilies:
    """Match one run's measured nodes with its forecast, family by family and phase by phase.
    ``alone_ms``: each forecast kernel timed alone (default: its latency in the forecast);
    ``as_matmul``: nodes whose kernels count as matmul (``gemm_operand_copies``)."""
    meas, pred = _measured(nodes), _predicted(forecast, alone_ms, as_matmul)
    rows = []
    for key in sorted(set(meas) | set(pred), key=_order):
        m_ms, m_n = meas.get(key, (0.0, 0))
        p_ms, p_n = pred.get(key, (0.0, 0))
        rows.append(FamilyRow(key[0], key[1], round(m_ms, 4), round(p_ms, 4),
                              _ratio(p_ms, m_ms), m_n, p_n))
    kernel_ms = _node_ms(nodes, host=False)
    return RunFamilies(
        label.gpu, label.model, label.mode, label.batch, label.seq, round(label.measured_ms, 4),
        round(kernel_ms, 4), round(_node_ms(nodes, host=True), 4),
        round(label.measured_ms - kernel_ms, 4),
        round(forecast.total_ms, 4), sum(forecast.zero_cost.values()),
        tuple(sorted({n.target for n in nodes if n.family == UNCLASSIFIED})), tuple(rows),
        phase_steps(label, nodes, forecast) if label.mode == "training" else ())


def _totals(runs: list[RunFamilies]) -> tuple[FamilyTotal, ...]:
    acc: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for run in runs:
        for r in run.rows:
            cell = acc[(run.gpu, run.mode, r.phase, r.family)]
            cell[0] += r.measured_ms
            cell[1] += r.predicted_ms
            cell[2] += 1
    out = []
    for key in sorted(acc, key=lambda k: (k[0], k[1], *_order(k[2:]))):
        measured, predicted, n = acc[key]
        out.append(FamilyTotal(*key, round(measured, 3), round(predicted, 3),
                               _ratio(predicted, measured), int(n)))
    return tuple(out)


def num_layer(label: Label) -> int:
    """How many times the per-node CSV's first block repeats (the label JSON's num_layer)."""
    value = json.loads(label.file.read_text()).get("num_layer", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{label.file}: num_layer must be an integer >= 0, got {value!r}")
    return value


def alone_ms(pred: Predictor, forecast: Forecast, device: Device) -> list[float]:
    """Each forecast kernel timed alone as the per-node harness runs it (``harness``): the
    predictor's latency, summed over the kernels the harness launches in its place."""
    groups = [timed_alone(k.kernel) for k in forecast.kernels]
    latency = [p.latency_ms for p in pred.predict([k for g in groups for k in g], device)]
    out, start = [], 0
    for g in groups:
        out.append(sum(latency[start:start + len(g)]))
        start += len(g)
    return out


def evaluate_by_family(labels_dir: Path, *, models_dir: Path | None = None,
                       gpus: tuple[str, ...] = (), predictor: str | Predictor | None = None,
                       cache_dir: Path | None = None, progress: Progress | None = None,
                       ) -> ByFamilyResult:
    """Per-family comparison for every label that has a per-node CSV beside its JSON."""
    models_dir = models_dir or labels_dir.parent / "models"
    labels, skipped = discover_labels(labels_dir, models_dir, gpus)
    with_csv = []
    for label in labels:
        if label.file.with_suffix(".csv").is_file():
            with_csv.append(label)
        else:
            skipped.append(Skipped(str(label.file.relative_to(labels_dir)),
                                   "no per-node CSV beside it"))
    if not with_csv:
        raise ConfigError(_no_labels(labels_dir, gpus, skipped) + " with a per-node CSV")
    pred = resolve_predictor(predictor)
    cache = cache_dir or default_cache_dir()
    runs = []
    for i, label in enumerate(with_csv, 1):
        if progress:
            progress(f"[{i}/{len(with_csv)}] {label.gpu} {label.file.name}")
        nodes = read_per_node_csv(label.file.with_suffix(".csv"), num_layer=num_layer(label),
                                  training=label.mode == "training")
        forecast = forecast_label(label, pred, cache, progress)
        copies = (gemm_operand_copies(cached_export(label, cache))
                  if copies_inside_matmul(nodes) else frozenset())
        runs.append(compare_run(label, nodes, forecast, alone_ms(pred, forecast, label.device),
                                copies))
    return ByFamilyResult(tuple(runs), _totals(runs), tuple(skipped), pred.name)
