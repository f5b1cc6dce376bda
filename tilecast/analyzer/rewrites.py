"""Launch-level rewrites: map ONNX nodes onto the kernels the framework really launches.

- Linear bias: exporters split a 3-D ``nn.Linear`` into MatMul + Add(bias), but PyTorch runs
  it as one ``addmm`` (the bias is the GEMM's epilogue / beta input), not a GEMM plus an
  elementwise pass over the output. The Add becomes zero-cost and the MatMul takes the bias
  as its third input (like Gemm), so training mode derives the bias gradient from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from .analysis import NodeResult

FOLDED_BIAS = "bias add folded into the preceding MatMul (PyTorch's addmm epilogue)"


def _bias_operand(add: NodeResult, mm_out: str, n: int):
    others = [t for t in add.node.inputs if t is not None and t.name != mm_out]
    if len(others) != 1:
        return None
    bias = others[0]
    return bias if bias.is_initializer and bias.shape == (n,) else None


def fold_linear_bias(results: tuple[NodeResult, ...]) -> tuple[NodeResult, ...]:
    uses = Counter(t.name for r in results for t in r.node.inputs if t is not None)
    producer = {t.name: i for i, r in enumerate(results) for t in r.node.outputs}
    out = list(results)
    for j, add in enumerate(results):
        if add.node.op_type != "Add" or add.node.domain or add.outcome != "costed":
            continue
        for t in add.node.inputs:
            i = producer.get(t.name) if t is not None else None
            mm = results[i] if i is not None else None
            if (mm is None or mm.node.op_type != "MatMul" or mm.outcome != "costed"
                    or mm.cost.matmul is None or uses[t.name] != 1 or len(mm.node.inputs) > 2):
                continue
            bias = _bias_operand(add, t.name, mm.cost.matmul.n)
            if bias is None or add.node.outputs[0].shape != t.shape:
                continue
            node = replace(mm.node, inputs=(*mm.node.inputs, bias), outputs=add.node.outputs)
            cost = replace(mm.cost, flops=mm.cost.flops + add.node.outputs[0].numel,
                           bytes=mm.cost.bytes + bias.nbytes)
            out[i] = NodeResult(node, "costed", cost)
            # The Add keeps its place (and name) in the report but no longer reads or writes
            # anything: its output is now the MatMul's.
            out[j] = NodeResult(replace(add.node, inputs=(), outputs=()), "zero", None,
                                FOLDED_BIAS)
            break
    return tuple(out)


# --- Eager views -----------------------------------------------------------------------------
# Exporters write PyTorch's metadata-only ops (transpose, permute, split/chunk, slicing) as
# Transpose/Split/Slice nodes that an ONNX runtime executes as copies. Eager PyTorch runs them
# as views: the per-node CSVs of the shared labels (neusight-asplos25, eager PyTorch 2.1) time
# every transpose/permute/split/getitem at 11-25 us, the host dispatch alone, for any tensor
# size, while `contiguous()` on the same tensors scales with size (40 us on GPT-2 large b4,
# 270 us on OPT-13B b2, L4). A view only stays free when its consumer takes strided operands.

VIEW_TRANSPOSE = "view: cuBLAS reads the operand transposed (op(A)/op(B) flag of the GEMM)"
VIEW_SPLIT = "view: eager PyTorch splits/slices the last dim as a strided view"
MATMULS = frozenset({("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul")})
# Consumers that read a last-dim slice without a copy: GEMMs (leading-dimension stride),
# Reshape that splits the sliced last dim (GPT-2's view(B, S, heads, head_dim) after split),
# Transpose (a view itself) and TensorIterator elementwise ops, which take any strides.
STRIDED_OK = MATMULS | frozenset(("", op) for op in (
    "Reshape", "Transpose", "Add", "Sub", "Mul", "Div", "Neg", "Cos", "Sin", "Tanh", "Sigmoid",
    "Relu", "Gelu", "Erf", "Where", "Cast"))


def _consumers(results: tuple[NodeResult, ...]) -> dict[str, list[NodeResult]]:
    out: dict[str, list[NodeResult]] = {}
    for r in results:
        for t in r.node.inputs:
            if t is not None and t.name:
                out.setdefault(t.name, []).append(r)
    return out


def _only_fed_to(r: NodeResult, consumers: dict[str, list[NodeResult]],
                 allowed: frozenset[tuple[str, str]], graph_outputs: frozenset[str]) -> bool:
    """Every output is read only by ``allowed`` ops; graph outputs are materialized (copy)."""
    names = [t.name for t in r.node.outputs if t.name]
    if not names or any(n in graph_outputs or not consumers.get(n) for n in names):
        return False
    return all((u.node.domain, u.node.op_type) in allowed for n in names for u in consumers[n])


def _swaps_last_two(r: NodeResult) -> bool:
    perm = r.node.attr("perm")
    if r.node.op_type != "Transpose" or r.node.domain or perm is None or len(perm) < 2:
        return False
    n = len(perm)
    return list(perm) == [*range(n - 2), n - 1, n - 2]


def _last_dim_slice(r: NodeResult) -> bool:
    """Split or Slice whose outputs differ from the input only in the last dim."""
    if r.node.domain or r.node.op_type not in ("Split", "Slice") or not r.node.inputs:
        return False
    x = r.node.inputs[0]
    outs = [t for t in r.node.outputs if t.name]
    if x is None or x.shape is None or not x.shape or not outs:
        return False
    return all(t.shape is not None and len(t.shape) == len(x.shape)
               and tuple(t.shape[:-1]) == tuple(x.shape[:-1]) for t in outs)


def eager_views(results: tuple[NodeResult, ...],
                graph_outputs: frozenset[str] = frozenset()) -> tuple[NodeResult, ...]:
    """Zero-cost the Transpose/Split/Slice nodes that eager PyTorch runs as views."""
    consumers = _consumers(results)
    out = list(results)
    for i, r in enumerate(results):
        if r.outcome != "costed":
            continue
        if _swaps_last_two(r) and _only_fed_to(r, consumers, MATMULS, graph_outputs):
            out[i] = NodeResult(r.node, "zero", None, VIEW_TRANSPOSE)
        elif _last_dim_slice(r) and _only_fed_to(r, consumers, STRIDED_OK, graph_outputs):
            out[i] = NodeResult(r.node, "zero", None, VIEW_SPLIT)
    return tuple(out)
