"""Read a label's per-node CSV (one row per torch.fx node) and sort its nodes into families.

The NeuSight labels come with ``<label>.csv``: the same Hugging Face run, timed node by node
(``fw_latency``, ``bw_latency``, ``acc_latency`` in ms). Models with ``num_layer > 0`` in the
label JSON were traced with their first block only; the nodes of that block (an
``nn_module_stack`` path ending in ``.0``: child 0 of the ``nn.ModuleList`` holding the
blocks) stand for all ``num_layer`` blocks, so they repeat that many times.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

HOST = "host"  # launches no GPU kernel: graph plumbing, Python values, views
UNCLASSIFIED = "unclassified"  # an fx op this table does not know: counted, never dropped
COLUMNS = ("op", "target", "meta", "dtype", "input_shapes", "fw_latency", "bw_latency",
           "acc_latency", "Name")
_CALLABLE = re.compile(r"<built-in (?:function|method) (\w+)|<function (\w+) at")
_MODULE = re.compile(r"\('([^']*)', <class '[\w.]*?(\w+)'>\)")

# fx target (function name, tensor method or nn.Module class) -> tilecast kernel family.
# These are PyTorch op names, the vocabulary of the per-node CSV, not ONNX node names.
FX_FAMILIES: dict[str, str] = {
    # cuBLAS GEMMs: nn.Linear / F.linear (GEMM + bias epilogue), the attention matmuls, and
    # transformers' Conv1D (GPT-2), which is addmm.
    **dict.fromkeys(("Linear", "linear", "matmul", "bmm", "baddbmm", "addmm", "mm",
                     "Conv1D"), "matmul"),
    # One row-wise kernel per call (max, exp-sum, scale in one pass).
    **dict.fromkeys(("softmax", "Softmax", "log_softmax"), "softmax"),
    # nn.LayerNorm / F.layer_norm: one fused row kernel (T5's RMS norm is traced through as
    # pow/mean/rsqrt/mul and lands in those families).
    **dict.fromkeys(("LayerNorm", "layer_norm"), "normalization"),
    # Embedding lookups gather rows of the table.
    **dict.fromkeys(("Embedding", "embedding"), "gather"),
    # Pointwise kernels: arithmetic, activations, masks, casts, fills (ones/zeros/full/arange
    # write a tensor on the GPU), torch.tensor (a host-to-device copy), dropout (a mask kernel
    # when training; see INFERENCE_IDENTITY).
    **dict.fromkeys((
        "add", "sub", "mul", "truediv", "floordiv", "pow", "neg", "abs", "rsqrt", "sqrt",
        "exp", "log", "tanh", "Tanh", "gelu", "GELUActivation", "NewGELUActivation", "relu",
        "ReLU", "sigmoid", "where", "masked_fill", "masked_fill_", "eq", "ne", "gt", "lt",
        "le", "ge", "bool", "to", "float", "long", "type", "type_as", "ones", "zeros",
        "full", "full_like", "zeros_like", "ones_like", "arange", "tensor", "one_hot",
        "dropout", "Dropout", "clamp"), "elementwise"),
    # Reductions over a dim (torch.max/min with a dim return (values, indices): see _family).
    **dict.fromkeys(("sum", "mean", "argmax", "argmin", "count_nonzero", "cumsum",
                     "logsumexp", "max", "min"), "reduction"),
    # Copies into a new layout: contiguous after a permute, cat, clone, repeat, reshape of a
    # non-contiguous tensor, setitem (index_put: Switch's token dispatch writes).
    **dict.fromkeys(("contiguous", "cat", "stack", "clone", "repeat", "reshape", "setitem"),
                    "movement"),
    # No kernel: shape queries and Python values, metadata-only views (the data stays where
    # it is), torch.finfo; their per-node time is the timing harness's floor, not GPU work.
    **dict.fromkeys(("size", "dim", "getattr", "finfo", "view", "permute", "transpose",
                     "expand", "unsqueeze", "squeeze", "split", "chunk", "flatten", "t"),
                    HOST),
}
# Identity under model.eval(): no kernel at inference.
INFERENCE_IDENTITY = frozenset({"dropout", "Dropout"})
# Elementwise on two tensors, a reduction when called with a dim (then they return a tuple,
# which the CSV records with no dtype).
BINARY_OR_REDUCE = frozenset({"max", "min"})
# Python operators: on ints (shape arithmetic, no dtype in the CSV) they run on the host.
PY_OPERATORS = frozenset({"add", "sub", "mul", "truediv", "floordiv", "pow", "eq", "ne", "gt",
                          "lt", "le", "ge", "getitem"})


@dataclass(frozen=True)
class FxNode:
    """One fx node of the per-node CSV; ``repeats`` > 1 for nodes of the repeated block."""

    name: str
    op: str  # placeholder | get_attr | call_function | call_method | call_module | output
    target: str  # short name: function, tensor method or module class
    family: str
    repeats: int
    forward_ms: float
    backward_ms: float
    accumulate_ms: float  # gradient accumulation into .grad (training)
    input_shapes: str = ""  # as recorded, e.g. "[[8, 512, 1024]]"
    output_shape: str = ""  # as recorded, e.g. "(8, 512, 1024)"
    input_contiguous: str = ""  # as recorded, e.g. "[False, True]" (optional column)


def _target(row: dict[str, str]) -> str:
    if row["op"] == "call_module":
        stack = _MODULE.findall(row["meta"])
        own = [cls for path, cls in stack if path == row["target"]]
        return own[-1] if own else (stack[-1][1] if stack else row["target"])
    m = _CALLABLE.match(row["target"])
    if m:
        return m.group(1) or m.group(2)
    if row["target"].startswith("<class 'torch.finfo'>"):
        return "finfo"
    return row["target"]


def fx_family(op: str, target: str, *, is_tensor: bool, tensor_inputs: int,
              training: bool) -> str:
    """The tilecast family of one fx node (``HOST`` when it launches no kernel)."""
    if op in ("placeholder", "get_attr", "output"):
        return HOST  # graph inputs, parameters and outputs: no work
    if target in PY_OPERATORS and not is_tensor:
        return HOST  # arithmetic on Python ints (shapes), or indexing a shape tuple
    if target == "getitem":
        # basic indexing (ints, slices) of one tensor is a view; a tensor index (bool mask,
        # indices: Switch's dispatch) makes a gather copy
        return HOST if tensor_inputs <= 1 else "movement"
    if target in BINARY_OR_REDUCE:
        return "reduction" if not is_tensor else "elementwise"
    if target in INFERENCE_IDENTITY and not training:
        return HOST
    return FX_FAMILIES.get(target, UNCLASSIFIED)


def _ms(row: dict[str, str], col: str, where: str) -> float:
    try:
        value = float(row[col] or 0.0)
    except ValueError:
        raise ConfigError(f"{where}: column {col!r} is not a number: {row[col]!r}") from None
    if not value >= 0:
        raise ConfigError(f"{where}: column {col!r} must be >= 0 ms, got {value}")
    return value


def _in_first_block(meta: str) -> bool:
    return any(path.endswith(".0") for path, _ in _MODULE.findall(meta))


def read_per_node_csv(path: Path, *, num_layer: int = 0, training: bool = False,
                      ) -> tuple[FxNode, ...]:
    """Every node of ``path``, classified, with its measured ms per phase."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(f"cannot read per-node CSV {path}: {exc}") from None
    if not rows:
        raise ConfigError(f"per-node CSV {path} has no rows")
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise ConfigError(f"per-node CSV {path}: missing column(s) {', '.join(missing)}")
    nodes = []
    for i, row in enumerate(rows, 2):
        where = f"{path.name} line {i} ({row['Name']})"
        target = _target(row)
        shapes = row["input_shapes"].strip()
        tensor_inputs = shapes.count("[") - 1 if shapes.startswith("[[") else 0
        family = fx_family(row["op"], target, is_tensor=bool(row["dtype"].strip()),
                           tensor_inputs=tensor_inputs, training=training)
        repeats = num_layer if num_layer > 0 and _in_first_block(row["meta"]) else 1
        nodes.append(FxNode(row["Name"], row["op"], target, family, repeats,
                            _ms(row, "fw_latency", where), _ms(row, "bw_latency", where),
                            _ms(row, "acc_latency", where), shapes,
                            (row.get("output_shape") or "").strip(),
                            (row.get("input_contiguous") or "").strip()))
    return tuple(nodes)
