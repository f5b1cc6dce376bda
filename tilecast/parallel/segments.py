"""Per-segment (prologue, each transformer layer, epilogue) costs of one tensor-parallel rank."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from ..analyzer.analysis import NodeResult
from ..analyzer.forecast import KernelForecast
from ..analyzer.training import trainable
from .context import AttentionExchange
from .experts import ExpertPlan
from .structure import EPILOGUE, PROLOGUE, Structure
from .tensor import Roles, segment_of

FLOAT = ("float", "bfloat")


@dataclass
class Segment:
    """Sums over one segment for one microbatch (update and parameters: once per step)."""

    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    update_ms: float = 0.0
    update_bytes: float = 0.0  # optimizer traffic (for a fused multi-tensor optimizer)
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    param_elems: float = 0.0  # per tensor-parallel rank
    param_bytes: float = 0.0
    expert_param_elems: float = 0.0  # the part of the above that is experts' (per rank)
    expert_param_bytes: float = 0.0
    activation_bytes: float = 0.0  # saved for the backward, per microbatch
    # The attention cores' share (selective recomputation drops these activations and runs
    # these forward kernels again in the backward)
    core_fwd_ms: float = 0.0
    core_bwd_ms: float = 0.0  # their backward (a context-parallel ring overlaps both)
    core_fwd_flops: float = 0.0
    core_activation_bytes: float = 0.0
    hidden_bytes: float = 0.0  # the hidden state between layers (p2p, recomputation)
    tp_fwd: list[tuple[str, float]] = field(default_factory=list)  # (op, bytes) per call
    tp_bwd: list[tuple[str, float]] = field(default_factory=list)
    ep_fwd: list[tuple[str, float]] = field(default_factory=list)  # MoE token exchange
    ep_bwd: list[tuple[str, float]] = field(default_factory=list)
    cp_fwd: list[tuple[str, float]] = field(default_factory=list)  # K/V ring or all-to-alls
    cp_bwd: list[tuple[str, float]] = field(default_factory=list)

    def copy(self) -> Segment:
        out = Segment()
        out.add(self)
        return out

    def add(self, other: Segment) -> None:
        """Sum ``other`` into this segment (hidden state: the larger of the two)."""
        for name in SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.hidden_bytes = max(self.hidden_bytes, other.hidden_bytes)
        for name in CALLS:
            getattr(self, name).extend(getattr(other, name))


SUMMED = ("fwd_ms", "bwd_ms", "update_ms", "update_bytes", "fwd_flops", "bwd_flops",
          "param_elems", "param_bytes", "expert_param_elems", "expert_param_bytes",
          "activation_bytes", "core_fwd_ms", "core_bwd_ms", "core_fwd_flops",
          "core_activation_bytes")
CALLS = ("tp_fwd", "tp_bwd", "ep_fwd", "ep_bwd", "cp_fwd", "cp_bwd")


def shared_weights(proto: onnx.ModelProto) -> dict[str, str]:
    """Initializer name -> key shared by aliases of one weight (tied embeddings are exported
    as two placeholders pointing at the same external data)."""
    out = {}
    for init in proto.graph.initializer:
        ext = tuple((e.key, e.value) for e in init.external_data if e.key != "length")
        out[init.name] = repr(ext) if ext and init.data_location == 1 else init.name
    return out


def _aliases(results: Sequence[NodeResult], keys: Mapping[str, str]) -> set[str]:
    """Parameters that are a second name of a weight already seen (a tied embedding): one
    weight, one optimizer state."""
    _, params = trainable(results)
    seen, out = set(), set()
    for name in params:
        key = keys.get(name, name)
        if key in seen:
            out.add(name)
        seen.add(key)
    return out


def _add_kernels(segs: Mapping, kernels: Sequence[KernelForecast], s: Structure,
                 index: Mapping[str, int], owner: Mapping[str, int], aliases: set[str]
                 ) -> None:
    core = {i for b in s.blocks for i in b.core}
    for kf in kernels:
        k = kf.kernel
        if k.phase == "update" and k.name.rsplit(".", 1)[0] in aliases:
            continue
        seg = segs[segment_of(k, s, index, owner)]
        if k.phase == "forward":
            seg.fwd_ms += kf.latency_ms
            seg.fwd_flops += k.flops
            if k.nodes and index.get(k.nodes[0]) in core:
                seg.core_fwd_ms += kf.latency_ms
                seg.core_fwd_flops += k.flops
        elif k.phase == "backward":
            seg.bwd_ms += kf.latency_ms
            seg.bwd_flops += k.flops
            if k.nodes and index.get(k.nodes[0]) in core:
                seg.core_bwd_ms += kf.latency_ms
        else:
            seg.update_ms += kf.latency_ms
            seg.update_bytes += k.bytes


def _add_params(segs: Mapping, results: Sequence[NodeResult], s: Structure, r: Roles,
                tp: int, keys: Mapping[str, str], plan: ExpertPlan | None) -> None:
    _, params = trainable(results)
    remote = plan.remote_tensors if plan is not None else frozenset()
    experts = plan.expert_weights if plan is not None else frozenset()
    seen: set[str] = set()
    for i, res in enumerate(results):
        for t in res.node.inputs:
            if t is None or t.name not in params or keys.get(t.name, t.name) in seen \
                    or t.name in remote:
                continue
            seen.add(keys.get(t.name, t.name))
            div = tp if t.name in r.split_tensors else 1
            seg = segs[s.segment(i)]
            seg.param_elems += t.numel / div
            seg.param_bytes += t.nbytes / div
            if t.name in experts:
                seg.expert_param_elems += t.numel / div
                seg.expert_param_bytes += t.nbytes / div


def _saves_input(res: NodeResult, name: str) -> bool:
    """Whether autograd keeps input ``name`` of this consumer for its backward: not for
    adds, dropouts (they keep a mask), softmax (it keeps its output), scaling by a constant
    or data movement (a copy's gradient is the inverse permute, split or slice of dY)."""
    node = res.node
    if node.op_type in ("Add", "Sub", "Dropout", "Softmax"):
        return False
    if res.cost is not None and res.cost.family == "movement":
        return False
    if node.op_type in ("Mul", "Div"):
        other = [t for t in node.inputs if t is not None and t.name != name]
        return not (other and other[0].is_initializer and other[0].numel <= 1)
    return True


def _add_activations(segs: Mapping, results: Sequence[NodeResult], s: Structure, r: Roles,
                     tp: int, internal: frozenset[int], plan: ExpertPlan | None) -> None:
    """Tensors saved for the backward, per microbatch (views followed to their source); none
    from the ``internal`` nodes of a fused group (megatron.fused_internal)."""
    consumers: dict[str, list[int]] = defaultdict(list)
    for j, res in enumerate(results):
        for t in res.node.inputs:
            if t is not None:
                consumers[t.name].append(j)

    def saved(name: str) -> bool:
        for j in consumers.get(name, ()):
            res = results[j]
            if res.outcome == "zero" and res.node.op_type != "Dropout":
                if any(saved(o.name) for o in res.node.outputs):
                    return True
            elif _saves_input(res, name):
                return True
        return False

    core = {i for b in s.blocks for i in b.core if i != b.core_out}  # selective drops these
    for i, res in enumerate(results):
        node = res.node
        if (res.outcome != "costed" and node.op_type != "Dropout") or i in internal \
                or (plan is not None and i in plan.remote):
            continue
        t = node.outputs[0]
        if t.shape is None or not t.dtype.startswith(FLOAT):
            continue
        div = tp if (i in r.split or i in r.column) else 1
        if plan is not None and i in plan.local:  # an expert on ep times the rows
            div /= plan.ep
        nbytes = 0.0
        if node.op_type == "Dropout":
            nbytes += t.numel / div  # the one-byte mask
        if node.op_type == "Softmax" or saved(t.name):
            nbytes += t.nbytes / div
        seg = segs[s.segment(i)]
        seg.activation_bytes += nbytes
        if i in core:
            seg.core_activation_bytes += nbytes


def _add_tp_collectives(segs: Mapping, results: Sequence[NodeResult], s: Structure,
                        sequence_parallel: bool, plan: ExpertPlan | None) -> None:
    pair = (("reduce-scatter", 1.0), ("all-gather", 1.0)) if sequence_parallel else \
        (("all-reduce", 1.0),)
    for b in s.blocks:
        grow = 1
        if plan is not None and b.row in plan.remote:
            continue  # another rank's expert
        if plan is not None and b.row in plan.local:
            grow = plan.ep
        seg = segs[s.segment(b.row)]
        out = results[b.row].node.outputs[0].nbytes * grow
        inp = grow * next((t.nbytes for t in results[b.column[0]].node.inputs
                           if t is not None and not t.is_initializer and t.shape is not None),
                          0)
        seg.hidden_bytes = max(seg.hidden_bytes, out)
        seg.tp_fwd.extend((op, out) for op, _ in pair)
        seg.tp_bwd.extend((op, inp) for op, _ in pair)
    for i in s.vocab_gathers:
        segs[s.segment(i)].tp_fwd.append(("all-reduce", results[i].node.outputs[0].nbytes))
    if s.lm_head is not None:
        x = results[s.lm_head].node.inputs[0]
        segs[s.segment(s.lm_head)].tp_bwd.append(("all-reduce", x.nbytes))


def _add_expert_exchange(segs: Mapping, s: Structure, plan: ExpertPlan, split: int) -> None:
    """Dispatch and combine all-to-alls of every MoE layer, forward and backward. With
    sequence parallelism each tensor-parallel rank holds 1/``split`` of the tokens and
    exchanges only those (Megatron-core's all-to-all dispatcher, which then all-gathers the
    expert inputs over the tensor-parallel ranks: the expert blocks' collectives)."""
    for g in plan.groups:
        seg = segs[s.segment(min(g.rows))]
        calls = [("all-to-all", g.dispatch_bytes / split),
                 ("all-to-all", g.combine_bytes / split)]
        seg.ep_fwd.extend(calls)
        seg.ep_bwd.extend(calls)


def _split_sequence(segs: Mapping, s: Structure, cp: int,
                    exchanges: Sequence[AttentionExchange], comm: str) -> None:
    """A context-parallel rank holds 1/cp of every token's activations and sends 1/cp of
    every token-sized collective; each attention passes K and V chunks round the ring (cp - 1
    steps forward; K, V and their gradients backward) or exchanges Q, K and V and its output
    with all-to-alls (``comm`` "a2a")."""
    for seg in segs.values():
        seg.activation_bytes /= cp
        seg.core_activation_bytes /= cp
        seg.hidden_bytes /= cp
        for name in CALLS:
            setattr(seg, name, [(op, nbytes / cp) for op, nbytes in getattr(seg, name)])
    for x in exchanges:
        seg = segs[s.segment(x.row)]
        fwd, bwd = x.calls(cp, comm)
        seg.cp_fwd.extend(fwd)
        seg.cp_bwd.extend(bwd)


def segment_costs(results: Sequence[NodeResult], kernels: Sequence[KernelForecast],
                  s: Structure, r: Roles, tp: int, proto: onnx.ModelProto,
                  sequence_parallel: bool, internal: frozenset[int] = frozenset(),
                  plan: ExpertPlan | None = None, cp: int = 1,
                  exchanges: Sequence[AttentionExchange] = (), cp_comm: str = "ring",
                  ) -> dict[int | str, Segment]:
    segs: dict[int | str, Segment] = defaultdict(Segment)
    index = {res.node.name: i for i, res in enumerate(results)}
    owner: dict[str, int] = {}
    for i, res in enumerate(results):
        for t in res.node.inputs:
            if t is not None:
                owner.setdefault(t.name, i)
    keys = shared_weights(proto)
    _add_kernels(segs, kernels, s, index, owner, _aliases(results, keys))
    _add_params(segs, results, s, r, tp, keys, plan)
    _add_activations(segs, results, s, r, tp, internal, plan)
    if plan is not None and plan.ep > 1:
        _add_expert_exchange(segs, s, plan, tp if sequence_parallel else 1)
    if tp > 1:
        _add_tp_collectives(segs, results, s, sequence_parallel, plan)
    else:
        for b in s.blocks:
            seg = segs[s.segment(b.row)]
            seg.hidden_bytes = max(seg.hidden_bytes, results[b.row].node.outputs[0].nbytes)
    for key in (PROLOGUE, EPILOGUE, *range(s.layers)):
        segs[key]  # noqa: B018  (every segment exists, empty or not)
    if cp > 1:
        _split_sequence(segs, s, cp, exchanges, cp_comm)
    return dict(segs)
