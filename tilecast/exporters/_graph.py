"""ONNX-side post-processing of a torch.onnx export: weightless initializers, folding, shapes.

The dynamo exporter hands back an ``onnx_ir`` model whose initializers wrap meta (or real)
torch tensors. Here every such initializer becomes an external-data placeholder (name, dtype,
shape, a byte range in a file that is never written), shape arithmetic is constant-folded
without ever reading a weight, and ONNX shape inference completes the value_info. See
docs/exporters.md for the scheme.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError

# Every weight placeholder points into this file; tilecast never writes it.
WEIGHTS_LOCATION = "tilecast-weights-not-materialized.bin"
# Placeholders are laid out as a real external-data file would be (offsets aligned like
# onnx's own external-data writer), so a later tool could materialize the weights in place.
_ALIGN = 4096
# Fold shape arithmetic (small) but keep seq x seq masks and the like as computed ops, as on
# the GPU, and out of the file.
_FOLD_INPUT_LIMIT = 8192
_FOLD_OUTPUT_LIMIT = 4096
# Node metadata worth its bytes: the module path of each node (which layer it belongs to).
# The exporter's stack traces and FX dumps would be ~80 % of the file.
_NODE_METADATA_KEPT = ("namespace", "pkg.torch.onnx.name_scopes")
METADATA = {"tilecast.weights": "not-materialized", "tilecast.weights_location": WEIGHTS_LOCATION}


@dataclass(frozen=True)
class _Placeholder:
    value: Any  # onnx_ir.Value whose const_value is withheld while passes run
    tensor: Any  # onnx_ir.ExternalTensor written in its place


def finalize(model: Any, *, static: bool = True) -> Any:
    """Turn the exporter's ``onnx_ir`` model into a weightless, shape-complete ModelProto."""
    import onnx
    import onnx_ir as ir

    placeholders = _detach_weights(model, ir)
    _simplify(model)
    placeholders += _fold_weight_transposes(model, placeholders, ir)
    for p in placeholders:
        p.value.const_value = p.tensor
    for key, value in METADATA.items():
        model.metadata_props[key] = value
    proto = ir.serde.serialize_model(model)
    proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    drop_noop_casts(proto)
    _trim_node_metadata(proto)
    check_shapes(proto, static=static)
    return proto


def _detach_weights(model: Any, ir: Any) -> list[_Placeholder]:
    """Withhold every weight from the passes (so none is ever read) and plan its placeholder."""
    out: list[_Placeholder] = []
    offset = 0
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if not _from_torch(tensor):
            continue
        nbytes = int(tensor.nbytes)
        out.append(_Placeholder(value, ir.ExternalTensor(
            WEIGHTS_LOCATION, offset, nbytes, tensor.dtype, shape=tensor.shape, name=name)))
        offset += -(-nbytes // _ALIGN) * _ALIGN
        value.const_value = None
    return out


def _from_torch(tensor: Any) -> bool:
    """A parameter, buffer or lifted constant of the module (not a constant torchlib built)."""
    return hasattr(getattr(tensor, "raw", None), "device")


def _simplify(model: Any) -> None:
    """Inline functions, fold shape arithmetic, drop dead nodes, lift Constants.

    Deliberately not onnxscript's full optimizer: its rewrite rules read initializer values
    (there are none) and take most of the export time on 32-layer models.
    """
    from onnx_ir.passes import common
    from onnxscript.optimizer import fold_constants_ir

    with _quiet("onnxscript", "onnx_ir"), warnings.catch_warnings():
        # Folding evaluates e.g. T5's log-bucketed relative positions with numpy: log(0) is
        # intended there (the -inf lands in a branch Where discards).
        warnings.simplefilter("ignore", RuntimeWarning)
        common.InlinePass()(model)
        fold_constants_ir(model, onnx_shape_inference=False, input_size_limit=_FOLD_INPUT_LIMIT,
                          output_size_limit=_FOLD_OUTPUT_LIMIT)
        common.RemoveUnusedNodesPass()(model)
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
        common.RemoveUnusedFunctionsPass()(model)
        common.RemoveUnusedOpsetsPass()(model)


def drop_noop_casts(proto: Any) -> None:
    """Remove Identity nodes and Casts to the input's own dtype (``x.to(x.dtype)``: no kernel).

    Runs on the shape-inferred proto, where every value's dtype is known.
    """
    graph = proto.graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input)}
    dtypes.update((t.name, t.data_type) for t in graph.initializer)
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    keep = []
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
        src, dst = (node.input[0], node.output[0]) if node.input else ("", "")
        noop = node.domain in ("", "ai.onnx") and dst not in outputs and (
            node.op_type == "Identity" or node.op_type == "Cast" and any(
                a.name == "to" and a.i == dtypes.get(src) for a in node.attribute))
        if noop:
            rename[dst] = src
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    kept_info = [v for v in graph.value_info if v.name not in rename]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)


def _fold_weight_transposes(model: Any, placeholders: list[_Placeholder], ir: Any,
                            ) -> list[_Placeholder]:
    """Store ``Transpose(weight)`` as a pre-transposed weight, as folding real weights would.

    ``nn.Linear`` exports as MatMul(x, Transpose(W)); on the GPU no transpose kernel runs
    (the GEMM reads W transposed), so the node must not stay. A weight with no other consumer
    keeps its name; a shared one (tied embeddings) gets ``<name>.transposed`` aliasing the same
    bytes. Either way the TensorProto's doc_string records the permutation.
    """
    graph, by_value = model.graph, {p.value: p for p in placeholders}
    added: list[_Placeholder] = []
    for node in list(graph):
        src = node.inputs[0] if node.op_type == "Transpose" and node.inputs else None
        if src not in by_value or node.outputs[0].is_graph_output():
            continue
        perm = list(node.attributes["perm"].as_ints())
        old = by_value[src].tensor
        sole = len(src.uses()) == 1
        name = old.name if sole else f"{old.name}.transposed"
        tensor = ir.ExternalTensor(
            old.location, old.offset, old.length, old.dtype, name=name,
            shape=ir.Shape([old.shape[i] for i in perm]),
            doc_string=f"{old.name} stored transposed, perm={perm}")
        value = ir.Value(name=name, type=ir.TensorType(old.dtype), shape=tensor.shape,
                         const_value=tensor)
        ir.convenience.replace_all_uses_with(node.outputs[0], value)
        graph.remove(node, safe=True)
        if sole:
            graph.initializers.pop(src.name)
            placeholders.remove(by_value.pop(src))
        graph.register_initializer(value)
        added.append(_Placeholder(value, tensor))
    return added


def _trim_node_metadata(proto: Any) -> None:
    for node in proto.graph.node:
        kept = [m for m in node.metadata_props if m.key in _NODE_METADATA_KEPT]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)


def check_shapes(proto: Any, *, static: bool = True) -> None:
    """Raise ExportError naming the first node output without a complete tensor shape."""
    graph = proto.graph
    typed = {v.name: v.type for v in (*graph.value_info, *graph.output, *graph.input)}
    typed.update((t.name, None) for t in graph.initializer)
    for node in graph.node:
        for name in node.output:
            if not name or name in typed and typed[name] is None:
                continue
            problem = _shape_problem(typed.get(name), static)
            if problem:
                raise ExportError(
                    f"exported graph is not shape-complete: output {name!r} of node "
                    f"{node.name!r} ({node.op_type}) {problem}")


def _shape_problem(type_proto: Any, static: bool) -> str | None:
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return "has no tensor type"
    tt = type_proto.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return "has no dtype or shape"
    for i, dim in enumerate(tt.shape.dim):
        if not dim.HasField("dim_value") and (static or not dim.HasField("dim_param")):
            return f"has an unknown dim {i}"
    return None


def write_atomic(data: bytes, path: Path) -> Path:
    """Write ``data`` to ``path`` via a temp file and rename: no partial file on failure."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ExportError(f"output folder {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """Silence chatty library loggers (warnings about the withheld weights) for a block."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)
