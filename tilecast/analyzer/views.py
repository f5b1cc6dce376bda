"""Views: the Transpose/Split/Slice nodes a runtime runs without a copy kernel.

Exporters write PyTorch's metadata-only ops (``transpose``, ``permute``, ``split``/``chunk``,
slicing) as Transpose/Split/Slice nodes, which an ONNX runtime executes as copies. Eager
PyTorch runs them as views: the per-node CSVs of the shared labels (neusight-asplos25, eager
PyTorch 2.1) time every transpose/permute/split/getitem at 11-25 us, the host dispatch alone,
whatever the tensor size, while ``contiguous()`` on the same tensors grows with the size (40 us
on GPT-2 large batch 4, 270 us on OPT-1.3B batch 2, L4). A view stays free only while its
consumers read strided operands; where one needs contiguous memory the copy is real:

- Transpose chains feeding only GEMMs: ``torch.matmul`` folds the batch dims with
  ``reshape`` (a copy unless they merge into one stride) and cuBLAS reads each matrix with a
  leading dimension, transposed or not (the op(A)/op(B) flag). So a last-two-dims swap
  (``k.transpose(-1, -2)``) is free, and ``permute(0, 2, 1, 3)`` is free only at batch 1
  (otherwise matmul's reshape copies it: kept costed, it stands for that copy).
- Transposes feeding an ONNX ``Attention`` (an SDPA export, or an exported SDPA call fused
  back into one: attention_fusion.py) as Q, K or V with the head dim last: PyTorch's fused
  SDPA kernels read strided heads (``_sdpa_reads_in_place``), and
  the ``transpose(1, 2)`` of their output: flash and memory-efficient attention write
  (B, S, H, D) and return it as a (B, H, S, D) view, so the transpose back is contiguous
  and the model's ``contiguous()`` / ``reshape`` copy nothing.
- Split/Slice along the last dim feeding GEMMs, Reshape (GPT-2's ``view`` of each q/k/v
  chunk), Transpose or elementwise ops (TensorIterator takes any strides).
- Transposes whose output only ``Shape`` / ``Size`` read: no consumer asks for the data
  (under a graph runtime too: its compiler knows the shape without the kernel).
- Everything else (Concat, Reshape of a permuted tensor, graph outputs) stays a copy.

Graph runtimes (``--runtime graph``) copy what eager PyTorch keeps as views (an XLA or
TensorRT buffer is dense, ONNX Runtime runs Transpose/Split/Slice as kernels), with one
exception every one of them makes: a Transpose that swaps the last two dims and feeds only
GEMMs is folded into the GEMM's operand flag (XLA's ``TransposeFolding`` pass, ONNX Runtime's
``MatmulTransposeFusion`` for its CUDA and ROCm providers, TensorRT's matrix-multiply operand
``kTRANSPOSE``). A permute of the batch dims stays a kernel there, at any batch, except
around a fused attention kernel, which reads and writes its heads in place
(``attention_layout.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .analysis import NodeResult
from .costs.zero import SHAPE_ONLY
from .fusion import METADATA_READERS

VIEW_TRANSPOSE = "view: cuBLAS reads the operand transposed (op(A)/op(B) flag of the GEMM)"
VIEW_SPLIT = "view: eager PyTorch splits/slices the last dim as a strided view"
VIEW_SDPA_OUT = "view: PyTorch's SDPA writes (B, S, H, D); the transpose back reads it as is"
FOLDED_TRANSPOSE = "folded into the GEMM: the graph compiler reads the operand transposed"
MATMULS = frozenset({("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul")})
STRIDED_OK = MATMULS | frozenset(("", op) for op in (
    "Reshape", "Transpose", "Add", "Sub", "Mul", "Div", "Neg", "Cos", "Sin", "Tanh", "Sigmoid",
    "Relu", "Gelu", "Erf", "Where", "Cast"))
Consumers = dict[str, list[NodeResult]]


def _consumers(results: Sequence[NodeResult]) -> Consumers:
    """Who reads each tensor's elements: a Shape or Size reads only a view's metadata (the
    TorchScript exporter's SDPA reads the query's head size that way)."""
    out: Consumers = {}
    for r in results:
        if r.node.op_type in METADATA_READERS and not r.node.domain:
            continue
        for t in r.node.inputs:
            if t is not None and t.name:
                out.setdefault(t.name, []).append(r)
    return out


def _users(r: NodeResult, consumers: Consumers,
           graph_outputs: frozenset[str]) -> list[NodeResult] | None:
    """The nodes reading r's outputs; None when an output is materialized (graph output/unread)."""
    names = [t.name for t in r.node.outputs if t.name]
    if not names or any(n in graph_outputs or not consumers.get(n) for n in names):
        return None
    return [u for n in names for u in consumers[n]]


def _gemm_reads_in_place(shape: tuple[int, ...], perm: Sequence[int]) -> bool:
    """Does matmul read ``contiguous(shape).permute(perm)`` without a copy?

    The batch dims (all but the last two, size-1 dims aside) must merge into one stride and
    the matrix must have one unit stride and a leading dimension >= its extent.
    """
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    dims = [(shape[p], strides[p]) for p in perm]
    batch = [d for d in dims[:-2] if d[0] != 1]
    if any(a[1] != b[0] * b[1] for a, b in zip(batch, batch[1:], strict=False)):
        return False
    (rows, row_st), (cols, col_st) = dims[-2:]
    return ((col_st == 1 or cols == 1) and row_st >= cols) or (
        (row_st == 1 or rows == 1) and col_st >= rows)


def _transpose_chain(r: NodeResult, shape: tuple[int, ...], perm: list[int],
                     consumers: Consumers, graph_outputs: frozenset[str]) -> list[int] | None:
    """ids of the Transposes from r that GEMMs read in place, or None if any of them copies."""
    users = _users(r, consumers, graph_outputs)
    if users is None:
        return None
    chain = [id(r)]
    for u in users:
        key = (u.node.domain, u.node.op_type)
        if key in MATMULS and _gemm_reads_in_place(shape, perm) \
                or key == ("", "Attention") and _sdpa_reads_in_place(r, u, perm):
            continue
        inner = u.node.attr("perm")
        if key != ("", "Transpose") or not is_perm(inner, len(perm)) or u.outcome != "costed":
            return None
        sub = _transpose_chain(u, shape, [perm[p] for p in inner], consumers, graph_outputs)
        if sub is None:
            return None
        chain.extend(sub)
    return chain


def _sdpa_reads_in_place(r: NodeResult, u: NodeResult, perm: Sequence[int]) -> bool:
    """Does ONNX Attention ``u`` read r's output as Q, K or V with the head dim still
    contiguous? PyTorch's SDPA kernels (flash, memory-efficient) take any strides but a unit
    one on the last dim, and transpose (B, H, S, D) back to their own (B, S, H, D) as a view."""
    out = r.node.outputs[0].name
    slots = [i for i, t in enumerate(u.node.inputs) if t is not None and t.name == out]
    return bool(slots) and max(slots) < 3 and perm[-1] == len(perm) - 1


def _sdpa_outputs(results: Sequence[NodeResult]) -> set[str]:
    """ONNX Attention outputs, and reshapes of them that keep their shape (an exporter's
    ``view`` back to the same dims)."""
    found: set[str] = set()
    for r in results:
        x = r.node.inputs[0] if r.node.inputs else None
        same = r.node.op_type == "Reshape" and x is not None and x.name in found \
            and x.shape is not None and r.node.outputs[0].shape == x.shape
        if (r.node.op_type == "Attention" and r.outcome == "costed" or same) \
                and not r.node.domain and r.node.outputs:
            found.add(r.node.outputs[0].name)
    return found


def _transpose_root(r: NodeResult) -> tuple[tuple[int, ...], list[int]] | None:
    x, perm = (r.node.inputs[0] if r.node.inputs else None), r.node.attr("perm")
    if (r.node.op_type != "Transpose" or r.node.domain or r.outcome != "costed" or x is None
            or x.shape is None or -1 in x.shape or len(x.shape) < 2
            or not is_perm(perm, len(x.shape))):
        return None
    return tuple(x.shape), list(perm)


def _shape_read_only(results: Sequence[NodeResult], consumers: Consumers,
                     graph_outputs: frozenset[str]) -> set[int]:
    """ids of the costed Transposes whose outputs only Shape / Size read (the TorchScript
    exporter's SDPA call reads the (B, H, S, D) key's length that way when it builds K^T
    from the projection directly): eager PyTorch's transpose is a view, and a graph
    compiler knows the shape without running it."""
    sized = {t.name for r in results if r.node.op_type in METADATA_READERS and not r.node.domain
             for t in r.node.inputs if t is not None}
    return {id(r) for r in results if _transpose_root(r) is not None and all(
        t.name in sized and t.name not in graph_outputs and not consumers.get(t.name)
        for t in r.node.outputs)}


def is_perm(perm: object, rank: int) -> bool:
    """A valid permutation of the rank's axes (a malformed graph's attribute may not be)."""
    return isinstance(perm, (list, tuple)) and sorted(perm) == list(range(rank))


def _last_dim_slice(r: NodeResult) -> bool:
    """Split or Slice whose outputs differ from the input only in the last dim."""
    if r.node.domain or r.node.op_type not in ("Split", "Slice") or r.outcome != "costed":
        return False
    x = r.node.inputs[0] if r.node.inputs else None
    outs = [t for t in r.node.outputs if t.name]
    if x is None or not x.shape or not outs:
        return False
    return all(t.shape is not None and len(t.shape) == len(x.shape)
               and tuple(t.shape[:-1]) == tuple(x.shape[:-1]) for t in outs)


def eager_views(results: Sequence[NodeResult],
                graph_outputs: frozenset[str] = frozenset()) -> tuple[NodeResult, ...]:
    """Zero-cost (with the reason) the Transpose/Split/Slice nodes eager PyTorch runs as views."""
    consumers = _consumers(results)
    sdpa_out = _sdpa_outputs(results)
    views = dict.fromkeys(_shape_read_only(results, consumers, graph_outputs), SHAPE_ONLY)
    for r in results:  # graph order: a chain's first Transpose is seen before the rest
        root = None if id(r) in views else _transpose_root(r)
        if root and r.node.inputs[0].name in sdpa_out and root[1] == [0, 2, 1, 3]:
            views[id(r)] = VIEW_SDPA_OUT
            continue
        chain = _transpose_chain(r, *root, consumers, graph_outputs) if root else None
        views.update(dict.fromkeys(chain or (), VIEW_TRANSPOSE))
        users = _users(r, consumers, graph_outputs) if _last_dim_slice(r) else None
        if users and all((u.node.domain, u.node.op_type) in STRIDED_OK for u in users):
            views[id(r)] = VIEW_SPLIT
    return tuple(NodeResult(r.node, "zero", None, views[id(r)]) if id(r) in views else r
                 for r in results)


def _swaps_last_two(perm: Sequence[int]) -> bool:
    n = len(perm)
    return list(perm[:-2]) == list(range(n - 2)) and list(perm[-2:]) == [n - 1, n - 2]


def _gemm_operand_of_all(r: NodeResult, users: Sequence[NodeResult]) -> bool:
    """Is every read of r's output an A or B operand of a GEMM (not a Gemm's bias C)?"""
    out = r.node.outputs[0].name
    return all((u.node.domain, u.node.op_type) in MATMULS
               and all(i < 2 for i, t in enumerate(u.node.inputs) if t is not None
                       and t.name == out) for u in users)


def graph_views(results: Sequence[NodeResult],
                graph_outputs: frozenset[str] = frozenset()) -> tuple[NodeResult, ...]:
    """Zero-cost (with the reason) the last-two-dims Transposes a graph compiler folds into
    the GEMMs that read them."""
    consumers = _consumers(results)
    views = dict.fromkeys(_shape_read_only(results, consumers, graph_outputs), SHAPE_ONLY)
    for r in results:
        root = _transpose_root(r)
        users = _users(r, consumers, graph_outputs) if root else None
        if users and _swaps_last_two(root[1]) and _gemm_operand_of_all(r, users):
            views[id(r)] = FOLDED_TRANSPOSE
    return tuple(NodeResult(r.node, "zero", None, views[id(r)]) if id(r) in views else r
                 for r in results)
