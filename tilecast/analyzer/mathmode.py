"""Math modes: the arithmetic a framework runs an fp32 graph in (TF32 tensor cores, autocast).

``--math graph`` (the default) forecasts the dtypes the graph has. ``tf32`` runs fp32 matmuls,
convolutions and attention on TF32 tensor cores (bytes stay fp32; the compute dtype of those
kernels becomes ``"tf32"``, whose peak ``Device.peak_tflops`` knows). ``amp-fp16`` /
``amp-bf16`` forecast the graph as ``torch.autocast("cuda", dtype=...)`` runs it, following the
CUDA op lists of PyTorch's "Automatic Mixed Precision package - torch.amp" page (Autocast Op
Reference, https://pytorch.org/docs/stable/amp.html#autocast-op-reference):

- ops that autocast to the lower precision (matmul, mm, bmm, addmm, linear, baddbmm, conv*,
  conv_transpose*, prelu, RNN cells; ``scaled_dot_product_attention`` is in the same list in
  ATen's ``autocast_mode.h``) cast every fp32 input to half and run in half;
- ops that autocast to float32 (layer_norm, group_norm, norm/normalize, exp, log, pow,
  reciprocal, ..., losses) cast half inputs to fp32; softmax, log_softmax, sum, prod, cumsum
  take ``dtype=float32`` instead (ATen's ``fp32_set_opt_dtype`` policy): they read half and
  write fp32 with no cast kernel;
- every other op runs in the widest floating type of its inputs through PyTorch's own type
  promotion (no cast kernel): half only when all its non-scalar float inputs are half.
  Batch/instance norm keep their input's dtype (cuDNN takes fp32 statistics with half data).

Casts are kernels: an activation cast per consumer (autocast does not cache them), a weight
cast once per weight and forward pass (autocast's cast cache holds leaf tensors that require
grad for the autocast region). In training the backward derives from the rewritten graph, so
every cast gets its gradient cast and the fp32 master weights their accumulation. A compiled
inference engine (``--runtime graph``) holds its weights as constants, cast once when it is
built, as it folds batch norm into them (``fold_weight_casts``): no weight cast runs per pass,
and the kernel producing an activation writes its casts (``cast_fusion.fuse_casts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..device_db.device import Device
from ..errors import TilecastError
from .analysis import NodeResult
from .params import FREE_VIEWS
from .registry import REGISTRY, CostEntry
from .types import DTYPES, Kernel, NodeView, TensorInfo

MATH_MODES = ("graph", "tf32", "tf32-conv", "amp-fp16", "amp-bf16")
AMP_DTYPES = {"amp-fp16": "float16", "amp-bf16": "bfloat16"}
TF32 = "tf32"  # the compute dtype of fp32 matrix kernels under --math tf32
# PyTorch 1.12+'s default on Ampere and newer: cuDNN convolutions in TF32
# (``torch.backends.cudnn.allow_tf32`` True), cuBLAS matmuls in fp32 (``matmul.allow_tf32``
# False); docs/math-and-runtimes.md, "Which frameworks use TF32 by default".
TF32_CONV = "tf32-conv"
TF32_MODES = frozenset({TF32, TF32_CONV})
MS = "com.microsoft"

# ONNX ops of the CUDA "autocast to lower precision" list (PyTorch op in the comment).
LOWER = frozenset({
    ("", "MatMul"), ("", "Gemm"),  # matmul / mm / bmm / addmm / linear / baddbmm
    ("", "Conv"), ("", "ConvTranspose"),  # conv1-3d, conv_transpose1-3d
    ("", "PRelu"), ("", "Einsum"),  # prelu; einsum (autocast_mode.h)
    ("", "LSTM"), ("", "GRU"), ("", "RNN"),  # LSTMCell / GRUCell / RNNCell
    ("", "Attention"), (MS, "Attention"), (MS, "MultiHeadAttention"),  # sdpa
    (MS, "GroupQueryAttention"), (MS, "FusedMatMul"),
})
# "Autocast to float32": half inputs are cast to fp32 by cast kernels.
FP32 = frozenset({
    ("", "LayerNormalization"), ("", "GroupNormalization"), ("", "LpNormalization"),
    ("", "ReduceL1"), ("", "ReduceL2"), ("", "ReduceLogSumExp"),  # norm, logsumexp
    ("", "Exp"), ("", "Log"), ("", "Pow"), ("", "Reciprocal"), ("", "Cosh"), ("", "Sinh"),
    ("", "Tan"), ("", "Acos"), ("", "Asin"), ("", "Softplus"),
    ("", "SoftmaxCrossEntropyLoss"), ("", "NegativeLogLikelihoodLoss"),
    (MS, "LayerNormalization"), (MS, "SkipLayerNormalization"),
})
# fp32_set_opt_dtype: the op reads half and writes fp32 itself, no cast kernel.
FP32_OUT = frozenset({("", "Softmax"), ("", "LogSoftmax"), ("", "ReduceSum"),
                      ("", "ReduceProd"), ("", "CumSum")})
# Run in the dtype of input 0 whatever their fp32 statistics (cuDNN batch norm).
INPUT0 = frozenset({("", "BatchNormalization"), ("", "InstanceNormalization")})
# Float widths for promotion; float64 ops are not eligible for autocast at all.
_RANK = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
_ONNX_ID = {name: i for i, (name, _) in DTYPES.items()}
AUTOCAST_REASON = "cast inserted by autocast"
FOLDED_WEIGHT_CAST = "weight cast folded at build (graph runtime): the engine stores it in half"


def check_math(math: str, device: Device) -> None:
    """Refuse a math mode the device cannot run, as the framework would."""
    if math not in MATH_MODES:
        raise TilecastError(f"unknown math mode {math!r}: choose one of {', '.join(MATH_MODES)}")
    if math in TF32_MODES and not device.peak_tflops_tf32_matrix:
        raise TilecastError(f"--math {math}: {device.name} ({device.arch}) has no TF32 tensor "
                            "cores (NVIDIA Ampere or newer, AMD CDNA3); forecast its fp32 graph "
                            "with --math graph")
    if math == "amp-bf16" and not device.peak_tflops_bf16_matrix:
        # torch.autocast raises "Current CUDA Device does not support bfloat16" here too.
        raise TilecastError(f"--math amp-bf16: {device.name} ({device.arch}) has no bfloat16 "
                            "tensor cores and PyTorch's autocast refuses bfloat16 on it; use "
                            "--math amp-fp16")


def tf32_kernels(kernels: Sequence[Kernel], math: str = TF32) -> list[Kernel]:
    """Under ``tf32``, fp32 kernels on the matrix unit (matmul, conv, attention, and their
    gradients) compute in TF32; under ``tf32-conv`` only the convolutions and their gradients
    (cuDNN's), the matmuls staying fp32 (cuBLAS's). Their bytes stay fp32. Other math modes
    leave the kernels as they are."""
    if math not in TF32_MODES:
        return list(kernels)

    def runs_tf32(k: Kernel) -> bool:
        return (k.cost.unit == "matrix" and k.cost.dtype == "float32"
                and (math == TF32 or k.cost.family == "conv"))

    return [replace(k, cost=replace(k.cost, dtype=TF32)) if runs_tf32(k) else k
            for k in kernels]


def _key(node: NodeView) -> tuple[str, str]:
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def _is_float(t: TensorInfo | None) -> bool:
    return t is not None and t.dtype in _RANK


def _scalar(t: TensorInfo) -> bool:
    # 0-d (and 1-element) constants do not promote a tensor's dtype in PyTorch.
    return t.shape is not None and all(d == 1 for d in t.shape)


def _widest(inputs: Sequence[TensorInfo | None]) -> str | None:
    floats = [t for t in inputs if _is_float(t)]
    big = [t for t in floats if not _scalar(t)] or floats
    if not big:
        return None
    top = max(_RANK[t.dtype] for t in big)
    kinds = {t.dtype for t in big if _RANK[t.dtype] == top}
    return kinds.pop() if len(kinds) == 1 else "float32"


def _io_bytes(node: NodeView) -> int:
    seen = {t.name: t.nbytes for t in (*node.inputs, *node.outputs)
            if t is not None and t.name and t.known}
    return sum(seen.values())


@dataclass
class _Rewriter:
    """Walks the results in graph order, tracking every tensor's dtype under autocast."""

    half: str
    tensors: dict[str, TensorInfo]  # original name -> the tensor as autocast produces it
    weight_casts: dict[str, TensorInfo]
    out: list[NodeResult]
    # a free view's output (an Identity, a Reshape) -> the initializer it shows: a parameter
    # of the model all the same (torch.onnx writes a parameter equal to another as an
    # Identity of it), cast once and read by the cast from the initializer
    weights: dict[str, TensorInfo] = field(default_factory=dict)

    def cast(self, t: TensorInfo, to: str, consumer: NodeView, i: int) -> TensorInfo:
        src = self.weights.get(t.name, t if t.is_initializer else None)
        if src is not None and to == self.half and t.name in self.weight_casts:
            return self.weight_casts[t.name]  # autocast's cast cache
        tag = "autocast" if src is not None else f"autocast.{consumer.name}.{i}"
        new = TensorInfo(f"{t.name}/{tag}", t.shape, to)
        node = NodeView(f"{t.name}/{tag}", "Cast", "", (src or t,), (new,),
                        {"to": _ONNX_ID[to]}, consumer.opset)
        entry = REGISTRY.lookup("", "Cast", consumer.opset)
        assert isinstance(entry, CostEntry)
        self.out.append(NodeResult(node, "costed", entry.fn(node), AUTOCAST_REASON))
        if src is not None and to == self.half:
            self.weight_casts[t.name] = new
        return new

    def _view_of_weight(self, r: NodeResult, ins: Sequence[TensorInfo | None]) -> None:
        x = ins[0] if ins else None
        src = self.weights.get(x.name, x if x.is_initializer else None) if x else None
        if src is not None and r.outcome == "zero" and r.node.op_type in FREE_VIEWS \
                and not r.node.domain and len(r.node.outputs) == 1:
            self.weights[r.node.outputs[0].name] = src

    def inputs(self, node: NodeView, to: str | None, from_dtype: str) -> tuple:
        ins = []
        for i, t in enumerate(node.inputs):
            cur = self.tensors.get(t.name, t) if t is not None else None
            if to is not None and cur is not None and cur.dtype == from_dtype and cur.known:
                cur = self.cast(cur, to, node, i)
            ins.append(cur)
        return tuple(ins)

    def rewrite(self, r: NodeResult) -> None:
        node = r.node
        key, ins0 = _key(node), [self.tensors.get(t.name, t) if t else None for t in node.inputs]
        self._view_of_weight(r, ins0)
        if any(t is not None and t.dtype == "float64" for t in ins0):
            policy, compute = "keep", None
        elif key in LOWER:
            policy, compute = "cast", self.half
        elif key in FP32:
            policy, compute = "cast", "float32"
        elif key in FP32_OUT:
            policy, compute = "read", "float32"
        elif key in INPUT0:
            x = ins0[0] if ins0 else None
            policy, compute = "read", x.dtype if x is not None and _is_float(x) else None
        else:
            policy, compute = "read", _widest(ins0)
        if policy == "cast":
            src = "float32" if compute == self.half else self.half
            ins = self.inputs(node, compute, src)
        else:
            ins = self.inputs(node, None, "")
        self.out.append(self._result(r, ins, compute))

    def _result(self, r: NodeResult, ins: tuple, compute: str | None) -> NodeResult:
        node = r.node
        old = _widest(node.inputs) or "float32"
        outs = []
        for t in node.outputs:
            follows = (compute is not None and _is_float(t) and t.dtype == old
                       and node.op_type not in ("Cast", "CastLike"))
            new = replace(t, dtype=compute) if follows and t.dtype != compute else t
            self.tensors[t.name] = new
            outs.append(new)
        view = replace(node, inputs=ins, outputs=tuple(outs))
        if r.cost is None:
            return replace(r, node=view)
        before, after = _io_bytes(node), _io_bytes(view)
        nbytes = r.cost.bytes if before in (0, after) else round(r.cost.bytes * after / before)
        dtype = compute if compute and r.cost.dtype == old else r.cost.dtype
        return replace(r, node=view, cost=replace(r.cost, bytes=nbytes, dtype=dtype))


def autocast_results(results: Sequence[NodeResult], half: str) -> tuple[NodeResult, ...]:
    """The results as ``torch.autocast`` to ``half`` runs them, with its cast kernels."""
    rw = _Rewriter(half, {}, {}, [])
    for r in results:
        rw.rewrite(r)
    return tuple(rw.out)


def apply_autocast(results: Sequence[NodeResult], math: str) -> tuple[NodeResult, ...]:
    half = AMP_DTYPES.get(math)
    return tuple(results) if half is None else autocast_results(results, half)


def fold_weight_casts(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    """Inference under a graph runtime: the autocast casts of weights (initializers) are done
    once, when the engine is built (TensorRT builds fp16 engines from fp32 weights, XLA and
    Inductor's freezing constant-fold them); zero-cost, with a reason. Activation casts stay."""
    return tuple(
        NodeResult(r.node, "zero", None, FOLDED_WEIGHT_CAST)
        if r.reason == AUTOCAST_REASON and r.node.inputs and r.node.inputs[0] is not None
        and r.node.inputs[0].is_initializer else r
        for r in results)
