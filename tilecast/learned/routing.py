"""Map analyzer kernels to the trained families' inputs ("parts"): one Python pass that reads
each kernel once, then numpy.

A kernel becomes one part, or several whose latencies add up (attention). The rules, and why:

- matmul with ``cost.matmul``: the matmul model.
- dense conv with ``cost.conv`` (groups = 1): the conv model (``conv.py``: cuDNN's algorithm
  and its work). Where the predictor has no conv model, and for convs without geometry
  (backward dX / dW), the matmul model on the implicit-GEMM view, flagged as a fallback;
  so do tensor-core and int8 convs (no conv data: cuDNN runs them as implicit GEMMs).
- a 16-bit or TF32 grouped conv of ``GROUP_MMA_CHANNELS`` or more input channels per group:
  cuDNN's tensor-core implicit GEMM, so the matmul model on its batched view (one product per
  group), flagged as a fallback.
- other grouped and depthwise convs (groups > 1): few multiply-adds per byte (a depthwise 3x3
  does 9 per output element), so the memory-bound rule below, flagged as a fallback
  (PyTorch's own depthwise kernel is then held to its issue rate: ``native_issue.py``).
- elementwise: the elementwise model on ``elements``, ``bytes`` and ``flops``.
- softmax / normalization with ``cost.rows``: the softmax / layernorm model.
- a fused attention op with ``cost.matmul`` (b = batch*heads, m = seq_q, n = seq_kv,
  k = head_dim): one kernel, as every runtime that receives a fused op runs it (PyTorch's
  scaled_dot_product_attention: FlashAttention-2 or the memory-efficient kernel; ONNX
  Runtime's fused attention): the matmul model on its equivalent batched GEMM, b x (seq_q x
  head_dim) outputs over a reduction that carries the op's FLOPs, with the op's bytes (Q, K,
  V, O: the scores never reach DRAM) and, on matrix units, one CTA per 128 queries of a head.
  (Eager attention without SDPA is not one op: its MatMul and Softmax nodes are costed as
  such.)
- everything else (reduction, pooling, gather, movement, unsupported) or a kernel without the
  dims its family needs: the memory-bound rule, the elementwise model on a copy moving the
  kernel's bytes (bytes / 2 read, bytes / 2 written) with its FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from ..analyzer.types import DTYPE_SIZE, Kernel, NativeDepthwise
from .conv import TC_CHANNEL_MULTIPLE, ConvColumns

# Convolutions that are not a cuDNN / MIOpen call: ONNX Runtime's own kernel for opset 27's
# stateful causal conv (and its backward) takes its family's dispatch, not the conv call's;
# so does PyTorch's own depthwise kernel (a kernel whose ``cost.native`` is a
# ``NativeDepthwise``): our H100 timed its smallest calls at 26 us (5th percentile of 123),
# cuDNN's dense NCHW convs at 31 us.
NOT_LIBRARY_CONV = ("CausalConvWithState", "CausalConvWithStateGrad")
_KIND = {"matmul": 0, "conv": 1, "elementwise": 2, "softmax": 3, "normalization": 4,
         "attention": 5}
_OTHER = 6
_NO_MM = (0, 0, 0, 0, False)
_NO_ROWS = (0, 0)
CONV_MEASURED_DTYPES = ("float32",)
# Vector dtypes whose behaviour is measured (or a half-width float of it): others go bytewise.
MEASURED_VECTOR_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Parts:
    """Columns of one family's parts; ``kernel`` indexes the input kernels."""

    kernel: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    itemsize: np.ndarray
    elements: np.ndarray
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    dtype: np.ndarray  # str
    unit: np.ndarray  # str: "matrix" | "vector"
    layout: np.ndarray  # str: "nn" batched matmul | "tn" linear (matmul only)
    primary: np.ndarray  # bool: this part names the kernel's tile
    fallback: np.ndarray  # bool: routed by a rule rather than the kernel's own model
    bytewise: np.ndarray  # bool: a dtype with no data, costed by its byte width as fp32
    # bytes read once per pass: a B operand that is a layer's weight (analyzer/weights.py),
    # or a memory-bound kernel's state such as a decode step's KV cache (OpCost.state_bytes)
    weight: np.ndarray
    fused: np.ndarray  # bool: a fused attention kernel's equivalent GEMM (matmul only)
    # Elementwise: a broadcast operand's extra reads, the slice one repeat reads and the
    # operand's own bytes (analyzer/costs/broadcast.py); 0 elsewhere.
    reread: np.ndarray
    reread_slice: np.ndarray
    reread_operand: np.ndarray


@dataclass(frozen=True)
class ConvParts:
    """Dense convolutions for the conv model; ``kernel`` indexes the input kernels."""

    kernel: np.ndarray
    columns: ConvColumns
    dtype: np.ndarray  # str
    unit: np.ndarray  # str: "matrix" for tensor-core dtypes, else "vector"
    primary: np.ndarray  # bool
    fallback: np.ndarray  # bool
    bytewise: np.ndarray  # bool


@dataclass(frozen=True)
class Routed:
    parts: dict[str, Parts | ConvParts]
    dtype: np.ndarray  # per kernel
    estimated: np.ndarray  # per kernel: cost.estimated
    conv: np.ndarray  # per kernel: a library convolution call, whichever model costs its GPU time


_COST = attrgetter("family", "flops", "bytes", "dtype", "elements", "matmul", "rows", "unit",
                   "estimated", "reread", "state_bytes")
_MM = attrgetter("b", "m", "n", "k", "weight_b")
_ROWS = attrgetter("rows", "cols")
_REREAD = attrgetter("bytes", "slice_bytes", "operand_bytes")
_NO_REREAD = (0, 0, 0)


def _layout_code(op_type: str, mm) -> int:
    """1: the linear layout ("tn"); -1: a batched product, or a shared B stored k x n ("nn");
    0: decided by the batch. A Gemm's B is as ``b_layout`` says (transB), a linear layer's
    weight where it does not."""
    if mm is not None and (mm.batched or mm.b_layout == "kn"):
        return -1
    return 1 if op_type == "Gemm" else 0


def _read(kernels: Sequence[Kernel]) -> tuple[np.ndarray, list[str], list[str]]:
    """(numbers (n, 20), dtype names, unit names) read from the kernels in one pass (the hot
    loop of serving: C-level attribute getters, one tuple per kernel); columns 14 and 15
    index the name lists."""
    recs = []
    append = recs.append
    dtypes: dict[str, int] = {}
    units: dict[str, int] = {}
    size, kinds = DTYPE_SIZE, _KIND
    for kernel in kernels:
        fam, flops, nbytes, dtype, elements, mm, rd, unit, est, rr, state = _COST(kernel.cost)
        d = dtypes.get(dtype)
        if d is None:
            d = dtypes[dtype] = len(dtypes)
        u = units.get(unit)
        if u is None:
            u = units[unit] = len(units)
        append((kinds.get(fam, _OTHER), flops, nbytes, size.get(dtype, 4), elements,
                *(_MM(mm) if mm is not None else _NO_MM),
                *(_ROWS(rd) if rd is not None else _NO_ROWS),
                _layout_code(kernel.op_type, mm), est, d, u,
                *(_REREAD(rr) if rr is not None else _NO_REREAD), state))
    arr = np.array(recs, dtype=np.float64).reshape(len(recs), 20)
    return arr, list(dtypes), list(units)


def _parts(idx: np.ndarray, cols: dict[str, np.ndarray], dtype: np.ndarray, unit: np.ndarray,
           layout: np.ndarray | None = None, primary: bool = True,
           fallback: np.ndarray | bool = False) -> Parts:
    n = len(idx)
    return Parts(idx, *(np.asarray(cols[k], dtype=np.float64) for k in (
        "flops", "bytes", "itemsize", "elements", "b", "m", "n", "k", "rows", "cols")),
        dtype, unit, layout if layout is not None else np.full(n, "nn", dtype=object),
        np.full(n, primary), np.broadcast_to(np.asarray(fallback, dtype=bool), (n,)).copy(),
        np.zeros(n, dtype=bool), np.asarray(cols.get("weight", np.zeros(n)), dtype=np.float64),
        np.broadcast_to(np.asarray(cols.get("fused", False), dtype=bool), (n,)).copy(),
        *(np.asarray(cols.get(k, np.zeros(n)), dtype=np.float64)
          for k in ("reread", "reread_slice", "reread_operand")))


def _bytewise(p: Parts) -> Parts:
    """Vector kernels of a dtype the data has none of (bool, integers, fp8): the same bytes
    moved as fp32 elements, through the measured fp32 elementwise behaviour (these kernels are
    memory-bound; their FLOPs per element are kept)."""
    odd = ~np.isin(p.dtype, MEASURED_VECTOR_DTYPES)
    if not odd.any():
        return p
    scale = np.where(odd, p.itemsize / 4.0, 1.0)
    return replace(p, itemsize=np.where(odd, 4.0, p.itemsize), elements=p.elements * scale,
                   flops=p.flops * scale, dtype=np.where(odd, "float32", p.dtype).astype(object),
                   bytewise=odd)


def _concat(parts: list[Parts]) -> Parts:
    return Parts(*(np.concatenate([getattr(p, f) for p in parts])
                   for f in Parts.__dataclass_fields__))


_CONV_FIELDS = ("n", "c", "k", "h", "w", "p", "q", "r", "s", "stride")


# cuDNN runs a 16-bit grouped conv of 4 or more input channels per group as a tensor-core
# implicit GEMM (``sm80`` / ``sm90_xmma_fprop_implicit_gemm``: 176 of 179 such rows on our
# H100 and H200), and one of 2 channels per group mostly on its direct SIMT kernel
# (``conv2d_grouped_direct_kernel``: 43 of 56). datasets/h100-sxm5-80gb, h200-sxm-141gb.
GROUP_MMA_CHANNELS = 4


def _conv_geometry(kernels: Sequence[Kernel], kind: np.ndarray,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense conv with geometry, grouped conv, grouped conv with at least
    ``GROUP_MMA_CHANNELS`` input channels per group) masks; dims read only for conv kernels."""
    n = len(kind)
    dense, grouped, wide = (np.zeros(n, dtype=bool) for _ in range(3))
    for i in np.nonzero(kind == _KIND["conv"])[0]:
        geo = kernels[i].cost.conv
        if geo is not None:
            grouped[i] = geo.groups > 1
            dense[i] = not grouped[i]
            wide[i] = grouped[i] and geo.c // geo.groups >= GROUP_MMA_CHANNELS
    return dense, grouped, wide


def _conv_parts(kernels: Sequence[Kernel], idx: np.ndarray, dtype: np.ndarray,
                itemsize: np.ndarray) -> ConvParts:
    geo = [kernels[i].cost.conv for i in idx]
    n = len(idx)
    dims = {f: np.array([getattr(g, f) for g in geo], dtype=np.float64).reshape(n)
            for f in _CONV_FIELDS}
    epilogue = np.array([kernels[i].cost.epilogue_bytes for i in idx],
                        dtype=np.float64).reshape(n)
    cols = ConvColumns(**dims, itemsize=itemsize, dtype=dtype, nhwc=np.zeros(n, dtype=bool),
                       epilogue_bytes=epilogue)
    unit = np.where(np.isin(dtype, list(TC_CHANNEL_MULTIPLE)), "matrix", "vector")
    no = np.zeros(n, dtype=bool)
    return ConvParts(idx, cols, dtype, unit.astype(object), ~no, no, no.copy())


def route(kernels: Sequence[Kernel], conv_model: bool = False) -> Routed:
    """Parts per trained family for ``kernels``; ``conv_model``: the predictor has one."""
    a, dtypes, units = _read(kernels)
    dtype = np.array(dtypes, dtype=object)[a[:, 14].astype(np.int64)]
    unit = np.array(units, dtype=object)[a[:, 15].astype(np.int64)]
    estimated = a[:, 13] > 0
    col = dict(zip(("kind", "flops", "bytes", "itemsize", "elements", "b", "m", "n", "k",
                    "weight_b", "rows", "cols", "gemm"), a.T[:13], strict=True))
    col["reread"], col["reread_slice"], col["reread_operand"] = a[:, 16], a[:, 17], a[:, 18]
    col["weight"] = a[:, 19]  # a memory-bound kernel's pass state (OpCost.state_bytes)
    kind, has_mm, has_rows = col["kind"], col["b"] > 0, col["rows"] > 0
    dense, grouped, wide_groups = _conv_geometry(kernels, kind)
    # The conv data is fp32 SIMT only. Tensor-core (tf32 / fp16 / bf16) and int8 convolutions
    # run as implicit GEMMs on matrix units (cuDNN picks no Winograd or FFT for them): they
    # take the matmul model's implicit-GEMM view at the dtype's matrix peak.
    is_conv = dense & conv_model & np.isin(dtype, CONV_MEASURED_DTYPES)
    # A tensor-core grouped conv is a batched implicit GEMM, one product per group.
    tc_groups = wide_groups & np.isin(dtype, list(TC_CHANNEL_MULTIPLE)) & (unit == "matrix")
    is_mm = ((kind == 0) | (kind == 1)) & has_mm & ~is_conv & (~grouped | tc_groups)
    is_attn = (kind == 5) & has_mm
    is_soft, is_norm = (kind == 3) & has_rows, (kind == 4) & has_rows
    is_ew = kind == 2
    other = ~(is_mm | is_attn | is_soft | is_norm | is_ew | is_conv)

    def sub(mask: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        idx = np.nonzero(mask)[0]
        return idx, {k: v[idx] for k, v in col.items()}

    idx, c = sub(is_mm)
    c["elements"] = c["b"] * c["m"] * c["n"]
    c["weight"] = c["weight_b"] * c["b"] * c["k"] * c["n"] * c["itemsize"]
    # A linear layer's GEMM (Gemm, or a weight shared by every row: b = 1) is "tn"; a batched
    # product is "nn" at any batch, 1 included (as the bmm training rows are).
    layout = np.where((c["gemm"] > 0) | ((c["b"] == 1) & (c["gemm"] == 0)), "tn",
                      "nn").astype(object)
    matmul = [_parts(idx, c, dtype[idx], unit[idx], layout, fallback=kind[idx] == 1)]
    idx, c = sub(is_ew)
    elementwise = [_parts(idx, c | {"elements": np.maximum(c["elements"], 1)}, dtype[idx],
                          np.full(len(idx), "vector", dtype=object))]
    idx, c = sub(other)
    copy = np.maximum(c["bytes"] / (2.0 * c["itemsize"]), 1.0)
    # Their FLOPs run on the vector units (PyTorch's reductions, pools, gathers; grouped
    # convs on CUDA cores), except a fused attention's without matmul dims (a decode step's):
    # its dot products are matrix-unit MMAs, so they take that peak.
    fused = (kind[idx] == _KIND["attention"]) & (unit[idx] == "matrix")
    elementwise.append(_parts(idx, c | {"elements": copy, "bytes": 2 * copy * c["itemsize"]},
                              dtype[idx], np.where(fused, "matrix", "vector").astype(object),
                              fallback=True))
    rows = {}
    for name, mask in (("softmax", is_soft), ("layernorm", is_norm)):
        idx, c = sub(mask)
        rows[name] = [_parts(idx, c | {"elements": c["rows"] * c["cols"]}, dtype[idx],
                             np.full(len(idx), "vector", dtype=object))]
    _attention(col, np.nonzero(is_attn)[0], dtype, matmul)
    parts: dict[str, Parts | ConvParts] = {
        "matmul": _concat(matmul), "elementwise": _bytewise(_concat(elementwise)),
        "softmax": _concat(rows["softmax"]), "layernorm": _concat(rows["layernorm"])}
    if conv_model:
        idx = np.nonzero(is_conv)[0]
        parts["conv"] = _conv_parts(kernels, idx, dtype[idx], col["itemsize"][idx])
    library = np.array([k.op_type not in NOT_LIBRARY_CONV
                        and not isinstance(k.cost.native, NativeDepthwise) for k in kernels],
                       dtype=bool)
    return Routed(parts, dtype, estimated, (kind == _KIND["conv"]) & library)


def _attention(col: dict[str, np.ndarray], idx: np.ndarray, dtype: np.ndarray,
               matmul: list[Parts]) -> None:
    """Fused attention kernels as one equivalent batched GEMM (module docstring): b = batch x
    heads products of (seq_q x dv) outputs, dv = elements / (b seq_q), whose reduction k
    carries the op's FLOPs (4 x head_dim per visible pair, causal pairs only, plus the
    softmax's per-score work), and the op's bytes."""
    b, sq, flops = col["b"][idx], col["m"][idx], col["flops"][idx]
    dv = np.maximum(np.round(col["elements"][idx] / np.maximum(b * sq, 1.0)), 1.0)
    k = np.maximum(flops / np.maximum(2.0 * b * sq * dv, 1.0), 1.0)
    zeros = np.zeros(len(idx))
    cols = {"flops": flops, "bytes": col["bytes"][idx], "itemsize": col["itemsize"][idx],
            "elements": b * sq * dv, "b": b, "m": dv, "n": sq, "k": k, "rows": zeros,
            "cols": zeros, "fused": True}
    matmul.append(_parts(idx, cols, dtype[idx], np.full(len(idx), "matrix", dtype=object),
                         np.full(len(idx), "nn", dtype=object), fallback=True))
