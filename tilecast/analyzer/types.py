"""Value types shared by the analyzer, the predictors and the reports.

Conventions, stated once for the whole project:
- FLOPs: one fused multiply-add counts as 2 FLOPs; a compare, exp or divide counts as 1 unless a
  cost formula says otherwise.
- bytes: unique DRAM bytes, read plus written, once per distinct tensor, at the tensor's dtype
  size. Caches are not modelled here; the predictors account for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

# ONNX TensorProto.DataType -> (name, bytes per element).
DTYPES: dict[int, tuple[str, float]] = {
    1: ("float32", 4), 2: ("uint8", 1), 3: ("int8", 1), 4: ("uint16", 2), 5: ("int16", 2),
    6: ("int32", 4), 7: ("int64", 8), 8: ("string", 8), 9: ("bool", 1), 10: ("float16", 2),
    11: ("float64", 8), 12: ("uint32", 4), 13: ("uint64", 8), 14: ("complex64", 8),
    15: ("complex128", 16), 16: ("bfloat16", 2), 17: ("float8e4m3fn", 1),
    18: ("float8e4m3fnuz", 1), 19: ("float8e5m2", 1), 20: ("float8e5m2fnuz", 1),
    21: ("uint4", 0.5), 22: ("int4", 0.5), 23: ("float4e2m1", 0.5),
}
DTYPE_SIZE: dict[str, float] = {name: size for name, size in DTYPES.values()}
# "tf32" is a compute dtype only (--math tf32: fp32 tensors, TF32 tensor-core math).
DTYPE_SIZE["tf32"] = 4

FAMILIES = (
    "matmul", "conv", "attention", "elementwise", "normalization", "softmax", "reduction",
    "pooling", "gather", "movement", "unsupported", "unshaped",
    "collective",  # NCCL collectives of distributed training (tilecast.parallel)
)


@dataclass(frozen=True)
class TensorInfo:
    """One value of the graph. ``shape`` holds ints once symbolic dims are bound."""

    name: str
    shape: tuple[int, ...] | None  # None: rank unknown
    dtype: str  # e.g. "float32"; "unknown" when the graph does not say
    is_initializer: bool = False

    # cached_property writes the instance __dict__ directly, so it works on a frozen
    # dataclass: these are read several times per node on large graphs.
    @cached_property
    def known(self) -> bool:
        """Every dim is a bound integer."""
        return self.shape is not None and all(d >= 0 for d in self.shape)

    @cached_property
    def numel(self) -> int:
        if self.shape is None:
            raise ValueError(f"tensor {self.name!r} has an unknown shape")
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> float:
        return DTYPE_SIZE.get(self.dtype, 4)

    @cached_property
    def nbytes(self) -> int:
        return int(self.numel * self.itemsize)


@dataclass(frozen=True)
class NodeView:
    """A typed, read-only view of one ONNX node: what cost formulas see (never protobuf).

    Missing optional inputs (empty names in ONNX) are kept as ``None`` so positions hold.
    """

    name: str
    op_type: str
    domain: str  # "" for the default ONNX domain
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    opset: int = 0

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> TensorInfo | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def shape_str(self) -> str:
        ins = ", ".join(str(list(t.shape)) if t and t.shape is not None else "?"
                        for t in self.inputs)
        outs = ", ".join(str(list(t.shape)) if t.shape is not None else "?"
                         for t in self.outputs)
        return f"({ins}) -> ({outs})"


@dataclass(frozen=True)
class MatmulDims:
    """The (B, M, N, K) view of a matmul-like kernel: B independent (M x K) @ (K x N)."""

    b: int
    m: int
    n: int
    k: int
    # A batched product (both operands carry the batch), even of batch 1: cuBLAS runs a
    # (strided) batched GEMM, not the linear layer's GEMM with a shared weight.
    batched: bool = False
    # B (k x n, b of them) is a constant of the graph (a layer's weight): read once per pass,
    # so it comes from DRAM when the pass's weights outgrow the L2 (analyzer/weights.py).
    weight_b: bool = False
    # How the graph stores a shared B, where it says: "kn" (Gemm transB=0, as PyTorch's
    # addmm(x, W) and GPT-2's Conv1D hold it: cuBLAS runs its "nn" kernels) or "nk" (Gemm
    # transB=1, a linear layer's weight: "tn"); None where the graph does not say which ran
    # (a MatMul with a constant B may be nn.Linear with its transpose folded at export).
    b_layout: str | None = None
    # An attention product over a causal band's (m, n) pairs only (costs/attention.Heads):
    # the kernel's FLOPs count those pairs, not m x n.
    causal: bool = False


@dataclass(frozen=True)
class ConvDims:
    """The geometry of a convolution as cuDNN sees it (NCHW names; 1-D convs have h = r = 1,
    3-D convs fold depth into h, p and r). X (n, c, h, w) * W (k, c/groups, r, s) ->
    Y (n, k, p, q); ``stride``, ``pad`` and ``dilation`` are those of the first spatial axis
    (the larger one where they differ)."""

    n: int
    c: int
    k: int
    h: int
    w: int
    p: int
    q: int
    r: int
    s: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1

    @property
    def depthwise(self) -> bool:
        """One input channel per group (MobileNet's depthwise convs)."""
        return self.groups > 1 and self.groups == self.c


@dataclass(frozen=True)
class RowDims:
    """Row-wise kernels (softmax, normalization, reductions): ``rows`` rows of ``cols``."""

    rows: int
    cols: int


@dataclass(frozen=True)
class BroadcastReread:
    """An elementwise op's broadcast operand, read again for every repeat of its broadcast
    dims (``costs/broadcast.py``). ``bytes``: those extra reads when no cache keeps the operand
    between repeats; ``slice_bytes``: the part of it one repeat reads; ``operand_bytes``: the
    operand itself, once (counted in the cost's ``bytes``). Whether the repeats come from DRAM
    depends on the GPU's L2, so the predictor decides."""

    bytes: int
    slice_bytes: int
    operand_bytes: int


@dataclass(frozen=True)
class NativeBatchNorm:
    """One of PyTorch's native batch-norm kernels on an NCHW input of ``n`` images x
    ``channels`` x ``spatial`` pixels: ``kernel`` is "transform" (the normalize pass, at
    inference and in training), "per_channel" (one block per channel walking all of its
    ``n x spatial`` elements: the batch statistics) or "backward" (the same blocks walking
    the channel twice: the reduction, then dX)."""

    n: int
    channels: int
    spatial: int
    kernel: str  # "transform" | "per_channel" | "backward"


@dataclass(frozen=True)
class NativePool:
    """PyTorch's native NCHW max pool: ``threads`` in blocks of 256, each loading ``taps``
    values one at a time (forward, ``max_pool_forward_nchw``: one thread per output visiting
    its window; backward, ``max_pool_backward_nchw``: one per input pixel, padded to whole
    blocks per plane, reading the index of each window that covers it)."""

    threads: int
    taps: int


@dataclass(frozen=True)
class NativeDepthwise:
    """PyTorch's native NCHW depthwise conv (``conv_depthwise2d_forward_kernel``): one thread
    per output in blocks of 1024, each summing its ``taps`` products (the window, unrolled for
    3 x 3 and 5 x 5); ``channels``: the input's, which decide whether an fp16 conv goes to
    cuDNN instead (``analyzer.native``)."""

    outputs: int
    taps: int
    channels: int


@dataclass(frozen=True)
class NativeLoop:
    """PyTorch's non-vectorized elementwise loop (``elementwise_kernel<128, vt>``,
    ATen/native/cuda/CUDALoops.cuh) over ``elements`` outputs: TensorIterator runs it in
    place of its 16-byte vector kernel when an operand is not laid out like the output (a
    broadcast tensor, a permuted copy). Blocks of 128 threads, each visiting ``vt`` outputs
    one after another (``analyzer.native``)."""

    elements: int


@dataclass(frozen=True)
class OpCost:
    """The static cost of one node (or one derived kernel).

    ``unit`` says which peak applies: "matrix" (tensor/matrix cores when the dtype uses them)
    or "vector" (CUDA cores / SIMD). ``estimated`` marks a bytes-only guess for an op tilecast
    cannot cost exactly (unsupported ops), so reports can flag it.
    """

    family: str
    flops: int
    bytes: int
    dtype: str
    unit: str = "vector"
    matmul: MatmulDims | None = None
    rows: RowDims | None = None
    elements: int = 0  # output elements (tile count of elementwise kernels derives from it)
    estimated: bool = False
    conv: ConvDims | None = None  # convolutions: the geometry (``matmul`` its implicit GEMM)
    # Elementwise ops: a broadcast operand read again per repeat (not in ``bytes``, which
    # counts each tensor once).
    reread: BroadcastReread | None = None
    # A Conv or GEMM whose epilogue reads another tensor (a residual or bias add fused under
    # a graph runtime, ``analyzer.epilogues``): those bytes, already in ``bytes``.
    epilogue_bytes: int = 0
    # State the kernel reads once per pass, already in ``bytes``: a layer's KV cache in a
    # decode step (``serving.decode``). Like a layer's weights (``analyzer.weights``), it is
    # last touched a whole pass earlier, so it comes from DRAM once the pass's weights and
    # state outgrow the L2 (``learned.predictor._stream_weights``).
    state_bytes: int = 0
    # A kernel as PyTorch's own kernels run it, one load per thread at a time
    # (``analyzer.native``): set by the cost formulas, dropped where another library runs it.
    native: NativeBatchNorm | NativePool | NativeDepthwise | NativeLoop | None = None


@dataclass(frozen=True)
class Kernel:
    """One launched kernel as the predictors see it: a node, a fusion group, or a derived
    backward / weight-update kernel. ``nodes`` are the ONNX node names it covers."""

    name: str
    nodes: tuple[str, ...]
    op_type: str
    cost: OpCost
    phase: str = "forward"  # forward | backward | update
    group: int | None = None  # fusion group id
    # Launched from C++ by the op that launched the kernel before it (a native batch norm's
    # per-channel kernels and normalize pass): an eager host pays the launch call alone, not
    # another Python and dispatcher pass (``analyzer.runtime``).
    follow_on: bool = False

    @property
    def family(self) -> str:
        return self.cost.family

    @property
    def flops(self) -> int:
        return self.cost.flops

    @property
    def bytes(self) -> int:
        return self.cost.bytes

    @property
    def dtype(self) -> str:
        return self.cost.dtype
