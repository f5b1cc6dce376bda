"""Write the trained utilization MLPs as ONE self-contained ONNX file (onnx only, no torch).

Per family ``<f>`` (matmul, elementwise, softmax, layernorm) the graph has::

    <f>_features   float32 [N_f, F_f]  columns in metadata feature_names[<f>] order
    <f>_work_ms    float32 [N_f]       max(compute, memory) roofline time (features.py)
    <f>_launch_ms  float32 [N_f]       the device's launch overhead
      -> <f>_latency_ms  = <f>_fixed_ms + work_ms / sigmoid(z_work)   (z clipped to +-30)
      -> <f>_fixed_ms    = launch_ms * (1 + softplus(z_fixed))   (>= one launch)
      -> <f>_utilization = (work_ms + launch_ms) / latency_ms     in (0, 1]

Clamping to the training range of each feature and normalization ((x - mean) / std) are
inside the graph, so callers feed raw features. Families a
caller does not need are fed with zero rows (shape [0, F_f]). The tile table travels in the
metadata (``tile_table``), so the file alone is the whole predictor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCHEMA_VERSION = "1"
OPSET = 17
IR_VERSION = 8  # readable by onnxruntime >= 1.14
ARTIFACT_NAME = "tilecast_predictor.onnx"
# Logits are clipped so float32 never rounds sigmoid to 0 (utilization stays > 0, latency
# finite); model.py applies the same clip in training.
Z_LIMIT = 30.0


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


def io_names(family: str) -> dict[str, str]:
    """Input and output names of one family in the graph."""
    return {k: f"{family}_{k}" for k in ("features", "work_ms", "launch_ms", "latency_ms",
                                         "utilization", "fixed_ms")}


def _act(nodes: list, kind: str, src: str, dst: str) -> None:
    if kind == "silu":  # x * sigmoid(x); the single op needs opset 22+
        nodes.append(helper.make_node("Sigmoid", [src], [dst + "_sig"]))
        nodes.append(helper.make_node("Mul", [src, dst + "_sig"], [dst]))
    else:
        nodes.append(helper.make_node({"tanh": "Tanh", "relu": "Relu"}[kind], [src], [dst]))


def _family_graph(w: FamilyWeights) -> tuple[list, list, list, list]:
    """(nodes, initializers, inputs, outputs) of one family, names prefixed by the family."""
    p, io, f = w.family + "_", io_names(w.family), len(w.feature_names)
    inits = [numpy_helper.from_array(np.asarray(w.lo, np.float32).reshape(1, f), p + "lo"),
             numpy_helper.from_array(np.asarray(w.hi, np.float32).reshape(1, f), p + "hi"),
             numpy_helper.from_array(np.asarray(w.mean, np.float32).reshape(1, f), p + "mean"),
             numpy_helper.from_array(np.asarray(w.std, np.float32).reshape(1, f), p + "std"),
             numpy_helper.from_array(np.array(0, np.int64), p + "col_work"),
             numpy_helper.from_array(np.array(1, np.int64), p + "col_fixed"),
             numpy_helper.from_array(np.array(1.0, np.float32), p + "one"),
             numpy_helper.from_array(np.array(-Z_LIMIT, np.float32), p + "z_lo"),
             numpy_helper.from_array(np.array(Z_LIMIT, np.float32), p + "z_hi")]
    nodes = [helper.make_node("Max", [io["features"], p + "lo"], [p + "above_lo"]),
             helper.make_node("Min", [p + "above_lo", p + "hi"], [p + "clamped"]),
             helper.make_node("Sub", [p + "clamped", p + "mean"], [p + "centered"]),
             helper.make_node("Div", [p + "centered", p + "std"], [p + "h0"])]
    src = p + "h0"
    for i, (weight, bias) in enumerate(w.layers):
        inits += [numpy_helper.from_array(np.ascontiguousarray(weight.T, np.float32), f"{p}w{i}"),
                  numpy_helper.from_array(np.asarray(bias, np.float32), f"{p}b{i}")]
        nodes += [helper.make_node("MatMul", [src, f"{p}w{i}"], [f"{p}mm{i}"]),
                  helper.make_node("Add", [f"{p}mm{i}", f"{p}b{i}"], [f"{p}z{i}"])]
        src = f"{p}z{i}"
        if i < len(w.layers) - 1:
            _act(nodes, w.activation, src, f"{p}h{i + 1}")
            src = f"{p}h{i + 1}"
    nodes += [
        helper.make_node("Gather", [src, p + "col_work"], [p + "z_work_raw"], axis=1),
        helper.make_node("Gather", [src, p + "col_fixed"], [p + "z_fixed_raw"], axis=1),
        helper.make_node("Clip", [p + "z_work_raw", p + "z_lo", p + "z_hi"], [p + "z_work"]),
        helper.make_node("Clip", [p + "z_fixed_raw", p + "z_lo", p + "z_hi"], [p + "z_fixed"]),
        # work / sigmoid(z) = work * (1 + exp(-z)): exact, and no approximate sigmoid can
        # round to 0 and make the latency infinite.
        helper.make_node("Neg", [p + "z_work"], [p + "neg_z"]),
        helper.make_node("Exp", [p + "neg_z"], [p + "exp_neg_z"]),
        helper.make_node("Add", [p + "exp_neg_z", p + "one"], [p + "inv_u_work"]),
        helper.make_node("Mul", [io["work_ms"], p + "inv_u_work"], [p + "busy_ms"]),
        helper.make_node("Softplus", [p + "z_fixed"], [p + "sp_fixed"]),
        helper.make_node("Add", [p + "sp_fixed", p + "one"], [p + "fixed_scale"]),
        helper.make_node("Mul", [io["launch_ms"], p + "fixed_scale"], [io["fixed_ms"]]),
        helper.make_node("Add", [io["fixed_ms"], p + "busy_ms"], [io["latency_ms"]]),
        helper.make_node("Add", [io["work_ms"], io["launch_ms"]], [p + "t_ref_ms"]),
        helper.make_node("Div", [p + "t_ref_ms", io["latency_ms"]], [io["utilization"]])]
    n = f"N_{w.family}"
    inputs = [helper.make_tensor_value_info(io["features"], TensorProto.FLOAT, [n, f]),
              helper.make_tensor_value_info(io["work_ms"], TensorProto.FLOAT, [n]),
              helper.make_tensor_value_info(io["launch_ms"], TensorProto.FLOAT, [n])]
    outputs = [helper.make_tensor_value_info(io[k], TensorProto.FLOAT, [n])
               for k in ("latency_ms", "utilization", "fixed_ms")]
    return nodes, inits, inputs, outputs


def build_model(families: Sequence[FamilyWeights], metadata: Mapping[str, str]) -> onnx.ModelProto:
    """One ONNX model holding every family's MLP side by side."""
    nodes, inits, inputs, outputs = [], [], [], []
    for w in families:
        fn, fi, fin, fout = _family_graph(w)
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
    """metadata_props: every value a string (JSON for structured ones)."""
    meta = {
        "schema_version": SCHEMA_VERSION,
        "families": json.dumps([w.family for w in families]),
        "feature_names": json.dumps({w.family: list(w.feature_names) for w in families}),
        "feature_units": json.dumps({n: units[n] for w in families for n in w.feature_names},
                                    sort_keys=True),
        "activation": json.dumps({w.family: w.activation for w in families}),
        "inputs": "<family>_features float32 [N, F]; <family>_work_ms float32 [N]; "
                  "<family>_launch_ms float32 [N]",
        "outputs": "<family>_latency_ms, <family>_utilization (0, 1], <family>_fixed_ms; "
                   "float32 [N]",
    }
    for key, value in extra.items():
        meta[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return meta


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
