"""Write the trained latency MLPs as ONE self-contained ONNX file (onnx only, no torch).

Per family ``<f>`` (matmul, elementwise, softmax, layernorm) the graph has::

    <f>_features    float32 [N_f, F_f]  columns in metadata feature_names[<f>] order
    <f>_compute_ms  float32 [N_f]       FLOPs at the peak in whole waves (features.py)
    <f>_dram_ms     float32 [N_f]       bytes beyond the L2 at the DRAM bandwidth
    <f>_cached_ms   float32 [N_f]       bytes the L2 holds, at the DRAM bandwidth
    <f>_wave_ms     float32 [N_f]       whole waves of full-block bytes at the DRAM bandwidth
    <f>_waves       float32 [N_f]       waves of thread blocks
    <f>_launch_ms   float32 [N_f]       the device's launch overhead
      -> <f>_latency_ms  eager latency: smooth max of host dispatch and GPU time
      -> <f>_gpu_ms      GPU time (what a CUDA-graph runtime sees)
      -> <f>_u_compute, <f>_u_memory   the utilizations in [floor, 1]
      -> <f>_fixed_ms    the fixed GPU cost (>= one launch)

The form is model.py's (monotone in every work term, bounded by the roofline below and the
utilization floor above). Clamping to the training range of each feature, normalization
((x - mean) / std) and the per-vendor host dispatch time are inside the graph, so callers feed
raw features. Families a caller does not need are fed with zero rows (shape [0, F_f]). The
tile table travels in the metadata (``tile_table``), so the file alone is the whole predictor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .form import FIXED_MAX, HEADS, KNEE_SCALE, P_BUSY, Q_HOST, SETUP_MAX

SCHEMA_VERSION = "2"  # 2: monotone work-term form, host dispatch, utilization floor
OPSET = 17
IR_VERSION = 8  # readable by onnxruntime >= 1.14
ARTIFACT_NAME = "tilecast_predictor.onnx"
# Logits are clipped as in model.py.
Z_LIMIT = 30.0
TERMS = ("compute_ms", "dram_ms", "cached_ms", "wave_ms", "waves", "launch_ms")
OUTPUTS = ("latency_ms", "gpu_ms", "u_compute", "u_memory", "fixed_ms")


@dataclass(frozen=True)
class FamilyWeights:
    family: str
    feature_names: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    layers: Sequence[tuple[np.ndarray, np.ndarray]]  # (W (out, in), b) per Linear layer
    activation: str  # silu | tanh | relu
    lo: np.ndarray  # training range of each feature; inputs are clamped to it
    hi: np.ndarray
    u_floor: float = 0.02  # the envelope's utilization floor
    # Heads blind to the tile (setup: a small MLP) and to tile and device (fixed: linear), over
    # the normalized features times their masks (model.py).
    setup_layers: Sequence[tuple[np.ndarray, np.ndarray]] = ()
    setup_mask: np.ndarray | None = None
    fixed_w: np.ndarray | None = None
    fixed_b: float = 0.0
    host_ms: tuple[float, float] = (0.0, 0.0)  # eager dispatch time: nvidia, amd


def io_names(family: str) -> dict[str, str]:
    """Input and output names of one family in the graph."""
    return {k: f"{family}_{k}" for k in ("features", *TERMS, *OUTPUTS)}


def _act(nodes: list, kind: str, src: str, dst: str) -> None:
    if kind == "silu":  # x * sigmoid(x); the single op needs opset 22+
        nodes.append(helper.make_node("Sigmoid", [src], [dst + "_sig"]))
        nodes.append(helper.make_node("Mul", [src, dst + "_sig"], [dst]))
    else:
        nodes.append(helper.make_node({"tanh": "Tanh", "relu": "Relu"}[kind], [src], [dst]))


def _const(inits: list, name: str, value) -> str:
    inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return name


def _index(inits: list, name: str, value: int) -> str:
    inits.append(numpy_helper.from_array(np.array(value, np.int64), name))
    return name


def _index_vec(inits: list, name: str, values: list[int]) -> str:
    inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _node(nodes: list, op: str, ins: list[str], out: str, **attrs) -> str:
    nodes.append(helper.make_node(op, ins, [out], **attrs))
    return out


def _smooth_max(nodes: list, inits: list, a: str, b: str, power: float, out: str) -> str:
    """(a^p + b^p)^(1/p), scaled by max(a, b) so float32 never overflows."""
    m = _node(nodes, "Max", [a, b], out + "_smx")
    tiny = _const(inits, out + "_smx_tiny", 1e-30)
    safe = _node(nodes, "Max", [m, tiny], out + "_smx_safe")
    p = _const(inits, out + "_smx_p", power)
    ra = _node(nodes, "Pow", [_node(nodes, "Div", [a, safe], out + "_smx_ra"), p], out + "_smx_pa")
    rb = _node(nodes, "Pow", [_node(nodes, "Div", [b, safe], out + "_smx_rb"), p], out + "_smx_pb")
    s = _node(nodes, "Add", [ra, rb], out + "_smx_s")
    inv_p = _const(inits, out + "_smx_inv_p", 1.0 / power)
    root = _node(nodes, "Pow", [s, inv_p], out + "_smx_root")
    return _node(nodes, "Mul", [safe, root], out)


def _mlp(w: FamilyWeights, p: str, io: dict[str, str], nodes: list, inits: list) -> str:
    f = len(w.feature_names)
    for name, value in (("lo", w.lo), ("hi", w.hi), ("mean", w.mean), ("std", w.std)):
        _const(inits, p + name, np.asarray(value, np.float32).reshape(1, f))
    src = _node(nodes, "Max", [io["features"], p + "lo"], p + "above_lo")
    src = _node(nodes, "Min", [src, p + "hi"], p + "clamped")
    src = _node(nodes, "Sub", [src, p + "mean"], p + "centered")
    src = _node(nodes, "Div", [src, p + "std"], p + "h0")
    for i, (weight, bias) in enumerate(w.layers):
        inits += [numpy_helper.from_array(np.ascontiguousarray(weight.T, np.float32), f"{p}w{i}"),
                  numpy_helper.from_array(np.asarray(bias, np.float32), f"{p}b{i}")]
        src = _node(nodes, "MatMul", [src, f"{p}w{i}"], f"{p}mm{i}")
        src = _node(nodes, "Add", [src, f"{p}b{i}"], f"{p}z{i}")
        if i < len(w.layers) - 1:
            _act(nodes, w.activation, src, f"{p}h{i + 1}")
            src = f"{p}h{i + 1}"
    return _node(nodes, "Clip", [src, _const(inits, p + "z_lo", -Z_LIMIT),
                                 _const(inits, p + "z_hi", Z_LIMIT)], p + "z")


def _side_head(w: FamilyWeights, head: str, p: str, f: int, nodes: list, inits: list) -> str:
    """Logit of the setup head (a small MLP on masked features) or the fixed head (linear)."""
    if head == "setup":
        mask = np.ones(f) if w.setup_mask is None else np.asarray(w.setup_mask)
        src = _node(nodes, "Mul", [p + "h0", _const(inits, p + "setup_mask", mask.reshape(1, f))],
                    p + "setup_in")
        layers = list(w.setup_layers) or [(np.zeros((1, f)), np.zeros(1))]
    else:
        fw = np.zeros(f) if w.fixed_w is None else np.asarray(w.fixed_w)
        src, layers = p + "h0", [(fw.reshape(1, f), np.array([w.fixed_b]))]
    for i, (weight, bias) in enumerate(layers):
        src = _node(nodes, "MatMul", [src, _const(inits, f"{p}{head}_w{i}", weight.T)],
                    f"{p}{head}_mm{i}")
        src = _node(nodes, "Add", [src, _const(inits, f"{p}{head}_b{i}", bias)],
                    f"{p}{head}_z{i}")
        if i < len(layers) - 1:
            _act(nodes, w.activation, src, f"{p}{head}_a{i}")
            src = f"{p}{head}_a{i}"
    flat = _node(nodes, "Reshape", [src, _index_vec(inits, f"{p}{head}_shape", [-1])],
                 f"{p}{head}_vec")
    return _node(nodes, "Clip", [flat, p + "z_lo", p + "z_hi"], f"{p}logit_{head}")


def _family_graph(w: FamilyWeights, member: int | None = None) -> tuple[list, list, list, list]:
    """(nodes, initializers, inputs, outputs) of one family, names prefixed by the family; an
    ensemble ``member`` writes its outputs under its own prefix (``_ensemble_graph``)."""
    p, io, f = w.family + "_", io_names(w.family), len(w.feature_names)
    if member is not None:
        p = f"{p}m{member}_"
        io |= {k: p + k for k in OUTPUTS}
    nodes: list = []
    inits: list = []
    z = _mlp(w, p, io, nodes, inits)
    sig, logits = {}, {}
    for j, head in enumerate(HEADS):
        if head in ("setup", "fixed"):
            logits[head] = _side_head(w, head, p, f, nodes, inits)
        else:
            idx = _index(inits, f"{p}col_{head}", j)
            logits[head] = _node(nodes, "Gather", [z, idx], f"{p}logit_{head}", axis=1)
        sig[head] = _node(nodes, "Sigmoid", [logits[head]], f"{p}sig_{head}")
    floor = _const(inits, p + "u_floor", w.u_floor)
    span = _const(inits, p + "u_span", 1.0 - w.u_floor)
    # u_m grows with the byte cost it divides (model.py): L2 bytes weighted by r_cache
    cached = _node(nodes, "Mul", [io["cached_ms"], sig["r_cache"]], p + "cached_cost")
    mem = _node(nodes, "Add", [io["dram_ms"], cached], p + "mem_ms")
    u = {}
    for head, out, work in (("u_compute", io["u_compute"], io["compute_ms"]),
                            ("u_memory", io["u_memory"], mem)):
        what = head.split("_")[1]
        scaled = _node(nodes, "Mul", [sig[head], span], f"{p}{head}_scaled")
        u_max = _node(nodes, "Add", [scaled, floor], f"{p}{head}_max")
        # exp(-beta * softplus(knee - log work)), work clamped at exp(-40) as in model.py
        lw = _node(nodes, "Log", [_node(nodes, "Max", [work, _const(
            inits, f"{p}{what}_tiny", float(np.exp(-40.0)))], f"{p}{what}_pos")], f"{p}{what}_lw")
        knee = _node(nodes, "Mul", [logits[f"knee_{what}"], _const(
            inits, f"{p}{what}_kscale", KNEE_SCALE)], f"{p}{what}_knee")
        gap = _node(nodes, "Softplus", [_node(nodes, "Sub", [knee, lw], f"{p}{what}_gap0")],
                    f"{p}{what}_gap")
        drop = _node(nodes, "Mul", [sig[f"slope_{what}"], gap], f"{p}{what}_drop")
        lifted = _node(nodes, "Mul", [u_max, _node(nodes, "Exp", [_node(
            nodes, "Neg", [drop], f"{p}{what}_negdrop")], f"{p}{what}_fall")], f"{p}{what}_u0")
        u[head] = _node(nodes, "Max", [lifted, floor], out)
    one = _const(inits, p + "one", 1.0)
    setup = _node(nodes, "Mul", [io["launch_ms"], _node(
        nodes, "Mul", [sig["setup"], _const(inits, p + "setup_max", SETUP_MAX)],
        p + "setup_scale")], p + "setup_ms")
    fixed_scale = _node(nodes, "Add", [one, _node(
        nodes, "Mul", [sig["fixed"], _const(inits, p + "fixed_max", FIXED_MAX)],
        p + "fixed_extra")], p + "fixed_scale")
    fixed = _node(nodes, "Mul", [io["launch_ms"], fixed_scale], io["fixed_ms"])
    busy_c = _node(nodes, "Add", [
        _node(nodes, "Div", [io["compute_ms"], u["u_compute"]], p + "compute_busy"),
        _node(nodes, "Mul", [io["waves"], setup], p + "setup_busy")], p + "busy_c")
    stream = _node(nodes, "Div", [mem, u["u_memory"]], p + "stream_ms")
    wave = _node(nodes, "Mul", [io["wave_ms"], sig["wave_rate"]], p + "wave_cost")
    busy_m = _smooth_max(nodes, inits, stream, wave, P_BUSY, p + "busy_m")
    busy = _smooth_max(nodes, inits, busy_c, busy_m, P_BUSY, p + "busy")
    gpu = _node(nodes, "Add", [fixed, busy], io["gpu_ms"])
    amd_idx = _index(inits, p + "amd_col",
                     w.feature_names.index("amd") if "amd" in w.feature_names else 0)
    amd = _node(nodes, "Gather", [io["features"], amd_idx], p + "amd", axis=1)
    if "amd" not in w.feature_names:
        amd = _node(nodes, "Mul", [amd, _const(inits, p + "zero", 0.0)], p + "amd_zero")
    nv, amd_ms = (float(v) for v in w.host_ms)
    host = _node(nodes, "Add", [_const(inits, p + "host_nv", nv), _node(
        nodes, "Mul", [amd, _const(inits, p + "host_delta", amd_ms - nv)], p + "host_amd")],
        p + "host_ms")
    _smooth_max(nodes, inits, host, gpu, Q_HOST, io["latency_ms"])
    inputs, outputs = _family_io(w)
    return nodes, inits, inputs, outputs


def _family_io(w: FamilyWeights) -> tuple[list, list]:
    io, f = io_names(w.family), len(w.feature_names)
    n = f"N_{w.family}"
    inputs = [helper.make_tensor_value_info(io["features"], TensorProto.FLOAT, [n, f])]
    inputs += [helper.make_tensor_value_info(io[t], TensorProto.FLOAT, [n]) for t in TERMS]
    outputs = [helper.make_tensor_value_info(io[k], TensorProto.FLOAT, [n]) for k in OUTPUTS]
    return inputs, outputs


def _ensemble_graph(members: Sequence[FamilyWeights]) -> tuple[list, list, list, list]:
    """Every member on the family's inputs; each output is the median of the members'
    (``model.Ensemble``; the lower median for an even count): the smallest of the
    ``K // 2 + 1`` largest. Per output, each member's latency >= its GPU time >= its fixed
    time, and order statistics keep that order, so the medians do too."""
    nodes, inits = [], []
    for k, w in enumerate(members):
        fn, fi, _, _ = _family_graph(w, member=k)
        nodes += fn
        inits += fi
    family, io = members[0].family, io_names(members[0].family)
    axis = _index_vec(inits, f"{family}_member_axis", [1])
    top = _index_vec(inits, f"{family}_median_rank", [len(members) // 2 + 1])
    for out in OUTPUTS:
        cols = [_node(nodes, "Unsqueeze", [f"{family}_m{k}_{out}", axis],
                      f"{family}_m{k}_{out}_col") for k in range(len(members))]
        stack = _node(nodes, "Concat", cols, f"{family}_members_{out}", axis=1)
        nodes.append(helper.make_node("TopK", [stack, top], [f"{family}_upper_{out}",
                                                            f"{family}_upper_idx_{out}"],
                                      axis=1, largest=1))
        _node(nodes, "ReduceMin", [f"{family}_upper_{out}"], io[out], axes=[1], keepdims=0)
    inputs, outputs = _family_io(members[0])
    return nodes, inits, inputs, outputs


def _by_family(families: Sequence[FamilyWeights]) -> dict[str, list[FamilyWeights]]:
    """Entries of one family are the members of its ensemble (in order)."""
    out: dict[str, list[FamilyWeights]] = {}
    for w in families:
        out.setdefault(w.family, []).append(w)
    return out


def build_model(families: Sequence[FamilyWeights], metadata: Mapping[str, str]) -> onnx.ModelProto:
    """One ONNX model holding every family's MLP side by side."""
    nodes, inits, inputs, outputs = [], [], [], []
    for members in _by_family(families).values():
        fn, fi, fin, fout = (_family_graph(members[0]) if len(members) == 1
                             else _ensemble_graph(members))
        nodes += fn
        inits += fi
        inputs += fin
        outputs += fout
    graph = helper.make_graph(nodes, "tilecast_utilization", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tilecast")
    model.ir_version = IR_VERSION
    model.doc_string = __doc__ or ""
    helper.set_model_props(model, dict(metadata))
    onnx.checker.check_model(model)
    return model


def metadata_for(families: Sequence[FamilyWeights], units: Mapping[str, str],
                 extra: Mapping[str, object]) -> dict[str, str]:
    """metadata_props: every value a string (JSON for structured ones). An ensemble's entries
    share features, ranges and floor; its host dispatch time is their geometric mean."""
    groups = _by_family(families)
    families = [m[0] for m in groups.values()]
    host = {fam: np.exp(np.mean([np.log(w.host_ms) for w in m], axis=0)).tolist()
            for fam, m in groups.items()}
    meta = {
        "schema_version": SCHEMA_VERSION,
        "families": json.dumps([w.family for w in families]),
        "feature_names": json.dumps({w.family: list(w.feature_names) for w in families}),
        "feature_units": json.dumps({n: units[n] for w in families for n in w.feature_names},
                                    sort_keys=True),
        "activation": json.dumps({w.family: w.activation for w in families}),
        "inputs": "<family>_features float32 [N, F]; <family>_{"
                  + ",".join(TERMS) + "} float32 [N]",
        "outputs": "<family>_{" + ",".join(OUTPUTS) + "} float32 [N]",
        "u_floor": json.dumps({w.family: w.u_floor for w in families}),
        "feature_ranges": json.dumps({w.family: [np.asarray(w.lo).tolist(),
                                                 np.asarray(w.hi).tolist()] for w in families}),
        "host_dispatch_ms": json.dumps(host),
        "ensemble_members": json.dumps({fam: len(m) for fam, m in groups.items()}),
    }
    for key, value in extra.items():
        meta[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return meta


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
