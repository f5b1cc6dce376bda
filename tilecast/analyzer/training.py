"""Training mode: derive the backward and gradient-accumulation kernels from the forward graph.

One training step = forward kernels, then in reverse graph order each node's backward kernels
(by family, with their real shapes and bytes: no forward/backward ratio), then the gradient
accumulation kernels, then (optionally) the optimizer update.

- Which tensors need a gradient: the parameters (``params.py``: float initializers a parametric
  op consumes as a weight; not BatchNorm running statistics, masks or constant tables); a float
  output needs one when any input does. Integer/bool outputs (masks, indices) never do.
- A graph that cannot be trained as given (quantized, or without any parameter) is an error.
- BatchNormalization trains on batch statistics: a per-channel reduction pass for mean and
  variance, then the normalize pass; its backward is a reduction (dgamma, dbeta and the two
  sums dX needs) and an elementwise dX pass, as cuDNN's batch-norm training kernels run.
- A tensor read by k differentiable consumers gets k-1 gradient sums (``GradSum``: autograd's
  input buffer adds them during the backward); every parameter gets one accumulation into
  ``.grad`` (``GradAccumulate``: ``grad += new``), as PyTorch does when ``.grad`` exists.
- The backward starts from the graph outputs' gradients (no loss kernel is added).
- Dropout is zero-cost at inference but a real kernel when training: the forward draws a mask
  and scales (reads x, writes y and a one-byte mask per element), the backward applies it to
  dY. Export training graphs in train mode so the Dropout nodes are in the graph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from math import prod

from .analysis import NodeResult
from .grad_ops import elementwise_bw as _elementwise_bw
from .grad_ops import elementwise_kernel as _elementwise
from .grad_ops import reduce_to as _reduce_to
from .grad_ops import tensor_bytes as _nb
from .graph import Graph
from .native import POOL_THREADS, ceil_div
from .params import batch_norm_training, check_trainable, parameters, unfold_trained
from .registry import BACKWARD_STEPS
from .types import (
    Kernel,
    MatmulDims,
    NativeBatchNorm,
    NativeDepthwise,
    NativePool,
    NodeView,
    OpCost,
    RowDims,
    TensorInfo,
)

BackwardFn = Callable[[NodeResult, set[str]], list[tuple[str, OpCost]]]
OPTIMIZERS = ("none", "sgd", "adam")
# Optimizer update traffic per parameter element, in tensors of the parameter's size: SGD with
# momentum reads param, grad, momentum and writes param, momentum (5); Adam reads param, grad,
# exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq (7). FLOPs per element from the
# update formulas (Adam: 2 moment FMAs, sqrt, divide, bias corrections, weight decay).
OPTIMIZER_TRAFFIC = {"sgd": (5, 3), "adam": (7, 12)}
STATS_BYTES = 4  # per-channel batch statistics are float32
GRAD_SUM = "GradSum"  # op_type of the k-1 sums of a k-times-used tensor's gradients


def _matmul_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    c, node = r.cost, r.node
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    d = c.matmul
    out: list[tuple[str, OpCost]] = []
    if d is None:
        return _generic_bw(r, need)
    if a is not None and a.name in need:  # dA = dY . B^T
        out.append(("dA", _mm(MatmulDims(d.b, d.m, d.k, d.n, d.batched, d.weight_b),
                              _nb(y) + _nb(b) + _nb(a), c)))
    if b is not None and b.name in need:  # dB = A^T . dY (summed over batch for a 2-D weight)
        dims = MatmulDims(d.b, d.k, d.n, d.m, d.batched)
        out.append(("dB", _mm(dims, _nb(a) + _nb(y) + _nb(b), c)))
    bias = node.input(2)
    if bias is not None and bias.name in need:
        out.append(_reduce_to(bias, y, "dC"))
    return out


def _mm(d: MatmulDims, nbytes: int, fwd: OpCost) -> OpCost:
    return OpCost("matmul", 2 * d.b * d.m * d.n * d.k, nbytes, fwd.dtype, unit="matrix",
                  matmul=d, elements=d.b * d.m * d.n)


def _conv_grad_gemms(c: OpCost) -> tuple[MatmulDims | None, MatmulDims | None]:
    """Implicit-GEMM views of a dense conv's backward, as cuDNN's dgrad and wgrad run them:
    dX (N, C, H, W) is an (N H W) x C output reducing over K R S (strides folded in, so that
    2 m n k is the forward's FLOPs); dW (K, C, R, S) a K x (C R S) output reducing over the
    N P Q output pixels. Grouped convs keep the memory-bound rule (None): a depthwise group's
    GEMM is one channel wide. The forward's multiply-adds are read from its GEMM, not its
    FLOPs: those hold the bias add, which no gradient GEMM does (it was read as two more
    steps of a 1x1 conv's reduction, so that its dX lost the shape of a pointwise GEMM)."""
    g, d = c.conv, c.matmul
    if g is None or d is None or g.groups != 1 or c.flops <= 0:
        return None, None
    m = g.n * g.h * g.w
    dx = MatmulDims(1, m, g.c, max(1, round(d.b * d.m * d.n * d.k / (m * g.c))))
    return dx, MatmulDims(1, g.k, g.c * g.r * g.s, g.n * g.p * g.q)


def _grad_flops(c: OpCost) -> int:
    """A conv gradient's FLOPs: the forward's multiply-adds (its GEMM, without the bias add:
    the bias's gradient is its own reduction, ``dB``)."""
    d = c.matmul
    return 2 * d.b * d.m * d.n * d.k if d is not None else c.flops


def _depthwise_dx(c: OpCost, x: TensorInfo) -> NativeDepthwise | None:
    """PyTorch's own depthwise data gradient (``conv_depthwise2d_backward_kernel``): one
    thread per element of dX, in blocks of 1024 like the forward's (our H100's lease-14 rows),
    each visiting the taps of every output channel its input channel feeds; None unless the
    forward runs PyTorch's own kernel. Its weight gradient (a block reduction per weight)
    keeps the memory-bound rule."""
    fwd = c.native
    if not isinstance(fwd, NativeDepthwise) or c.conv is None:
        return None
    return NativeDepthwise(x.numel, fwd.taps * (c.conv.k // c.conv.c), fwd.channels)


def _conv_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    node, c = r.node, r.cost
    x, w, y = node.input(0), node.input(1), node.outputs[0]
    out = []
    # dX is a transposed convolution and dW a convolution of X with dY: each does exactly the
    # forward's multiply-adds.
    dx, dw = _conv_grad_gemms(c)
    flops = _grad_flops(c)
    if x is not None and x.name in need:
        out.append(("dX", OpCost("conv", flops, _nb(y) + _nb(w) + _nb(x), c.dtype, "matrix",
                                 matmul=dx, elements=x.numel, native=_depthwise_dx(c, x))))
    if w is not None and w.name in need:
        out.append(("dW", OpCost("conv", flops, _nb(x) + _nb(y) + _nb(w), c.dtype, "matrix",
                                 matmul=dw, elements=w.numel)))
    bias = node.input(2)
    if bias is not None and bias.name in need:
        out.append(_reduce_to(bias, y, "dB"))
    return out


# Row ops whose PyTorch backward first forms dY * Y in an elementwise kernel, then runs the
# row kernel on (dY * Y, Y): ATen's softmax_backward_cuda_out (SoftMax.cu, also its HIP port)
# does ``tmp = grad * output`` before host_softmax_backward, so dX moves six tensors, not three.
# LogSoftmax's backward runs the row kernel on dY directly. The labels' per-node CSVs agree:
# softmax backward / forward 2.55-3.0 on the V100, A100 80GB, L4, MI100 and MI210 (six passes
# against the forward's two), where a scalar divide of the same tensor is 0.92-1.01.
PRODUCT_FIRST = frozenset({("", "Softmax")})


def _rows_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """Softmax / normalization: one row kernel for dX (softmax: after the dY * Y kernel), plus
    column sums for scale and bias."""
    node, c, y = r.node, r.cost, r.node.outputs[0]
    x = node.input(0)
    out = []
    if x is not None and x.name in need and (node.domain, node.op_type) in PRODUCT_FIRST:
        out.append(_elementwise("dY_Y", y.dtype, 3 * _nb(y), y.numel))
    if x is not None and x.name in need:
        params = sum(_nb(t) for t in node.inputs[1:] if t is not None and t.is_initializer)
        out.append(("dX", OpCost(c.family, 2 * c.flops, 3 * _nb(y) + params, c.dtype,
                                 rows=c.rows, elements=y.numel)))
    params = [t for t in node.inputs[1:] if t is not None and t.name in need]
    if params:
        cols = max(params[0].numel, 1)
        out.append(("dParams", OpCost("reduction", 2 * y.numel * len(params),
                                      _nb(x) + _nb(y) + sum(_nb(t) for t in params), c.dtype,
                                      rows=RowDims(cols, y.numel // cols), elements=cols)))
    return out


def _gather_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    node, y = r.node, r.node.outputs[0]
    data, idx = node.input(0), node.input(1)
    if data is None or data.name not in need:
        return []
    # Dense embedding/gather backward: zero-fill the whole gradient, then scatter-add dY rows.
    return [("dData", OpCost("gather", y.numel, _nb(data) + _nb(y) + _nb(idx), y.dtype,
                             elements=y.numel))]


def _generic_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """Data movement, pooling, reductions, attention and estimated ops: the gradient moves the
    same tensors in the other direction (dY read, dX written), with the forward's FLOPs.
    A fused attention's backward (flash / memory-efficient kernels) recomputes the scores
    instead of reading them: Q K^T again, then dV, dP, dQ and dK, five matmuls against the
    forward's two (Dao, "FlashAttention-2", 2023, section 3.2), so 2.5 times its FLOPs."""
    node, c = r.node, r.cost
    grads = [t for t in node.inputs if t is not None and t.name in need]
    if not grads:
        return []
    flops = c.flops * 5 // 2 if c.family == "attention" else c.flops
    nbytes = sum(_nb(t) for t in node.outputs) + sum(2 * _nb(t) for t in grads)
    return [("dX", OpCost(c.family, flops, nbytes, c.dtype, c.unit, c.matmul, c.rows,
                          c.elements, c.estimated))]


def _cast_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """A dtype cast's gradient is the cast back: read dY, write dX in the input's dtype
    (autocast's casts: half gradients back to the fp32 weights and activations)."""
    x, y = r.node.input(0), r.node.outputs[0]
    if x is None or x.name not in need:
        return []
    return [("dX", OpCost("elementwise", x.numel, _nb(y) + _nb(x), x.dtype,
                          elements=x.numel))]


def _batch_norm_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """One kernel per batch norm, as both PyTorch's native ``batch_norm_backward_kernel`` and
    cuDNN's backward run it: a reduction of dY and dY * x_hat per channel (dgamma, dbeta and
    the sums dX needs: 2 FMAs per element), then, where x needs a gradient, dX (about 5 ops per
    element) from a second pass over x and dY. Natively each channel is one block walking its
    elements once per pass (analyzer.native)."""
    node, y = r.node, r.node.outputs[0]
    x = node.input(0)
    if x is None or not x.known:
        return _rows_bw(r, need)
    ch = x.shape[1] if len(x.shape) > 1 else 1
    stats, rows = 2 * ch * STATS_BYTES, RowDims(ch, x.numel // max(ch, 1))
    reduce_bytes, flops = _nb(x) + _nb(y) + stats, 4 * x.numel
    dx = x.name in need
    if dx:  # the second pass reads x, dY and the statistics again and writes dX
        reduce_bytes, flops = reduce_bytes + 2 * _nb(y) + _nb(x) + stats, flops + 5 * x.numel
    walk = None if len(x.shape) < 3 else NativeBatchNorm(
        x.shape[0], ch, prod(x.shape[2:]), "backward" if dx else "per_channel")
    return [("dX" if dx else "dStats", OpCost(
        "reduction", flops, reduce_bytes, y.dtype, rows=rows,
        elements=x.numel if dx else 2 * ch, native=walk))]


def _max_pool_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """A 2-D max pool's gradient as PyTorch's NCHW kernel runs it (``max_pool_backward_nchw``):
    one thread per input pixel, blocks of 256 over each (image, channel) plane, each thread
    reading the winner index of every window that covers it, one after another: up to
    ceil(k / stride) per dim (analyzer.native)."""
    out = _generic_bw(r, need)
    x, kernel = r.node.input(0), r.node.attr("kernel_shape")
    if not out or x is None or len(x.shape) != 4 or not kernel or len(kernel) != 2:
        return out
    strides = r.node.attr("strides") or [1, 1]
    n, c, h, w = x.shape
    threads = n * c * ceil_div(h * w, POOL_THREADS) * POOL_THREADS
    windows = prod(ceil_div(k, max(st, 1)) for k, st in zip(kernel, strides, strict=True))
    name, cost = out[0]
    return [(name, replace(cost, native=NativePool(threads, windows)))]


BACKWARD: dict[str, BackwardFn] = {
    "matmul": _matmul_bw, "conv": _conv_bw, "elementwise": _elementwise_bw,
    "softmax": _rows_bw, "normalization": _rows_bw, "gather": _gather_bw,
}
# Ops whose gradient kernels differ from their family's (keyed by (domain, op_type)).
BACKWARD_BY_OP: dict[tuple[str, str], BackwardFn] = {
    ("", "BatchNormalization"): _batch_norm_bw, ("", "Cast"): _cast_bw,
    ("", "MaxPool"): _max_pool_bw,
}


def trainable(results: Sequence[NodeResult]) -> tuple[set[str], dict[str, TensorInfo]]:
    """(tensors that need a gradient, parameters by name). Parameters: see ``params.py``."""
    params = parameters(results)
    need: set[str] = set(params)
    for r in results:
        if any(t is not None and t.name in need for t in r.node.inputs):
            need.update(t.name for t in r.node.outputs
                        if t.dtype.startswith(("float", "bfloat")))
    return need, params


def _accumulation(results: Sequence[NodeResult], need: set[str],
                  params: dict[str, TensorInfo]) -> list[Kernel]:
    uses: dict[str, int] = defaultdict(int)
    tensors: dict[str, TensorInfo] = {}
    for r in results:
        if r.outcome == "zero" and not any(t.name in need for t in r.node.outputs):
            continue
        for t in dict.fromkeys(u for u in r.node.inputs if u is not None and u.name in need):
            uses[t.name] += 1
            tensors[t.name] = t
    kernels = []
    for name, n in uses.items():
        t = tensors[name]
        # A gradient of unknown size is a flagged estimate, never a negative element count.
        cost = _elementwise("acc", t.dtype, 3 * _nb(t), t.numel)[1] if t.known else \
            OpCost("unshaped", 0, 0, t.dtype, estimated=True)
        # k-1 sums in autograd's input buffer (GradSum), then for a parameter ``grad += new``
        # (GradAccumulate): the labels' acc_latency times only the latter (per parameterized
        # module, independent of the batch), so the two are kept apart.
        kernels.extend(Kernel(f"{name}.grad_sum{j}", (), GRAD_SUM, cost, "backward")
                       for j in range(n - 1))
        if name in params:
            kernels.append(Kernel(f"{name}.grad_acc", (), "GradAccumulate", cost, "backward"))
    return kernels


def _optimizer(params: dict[str, TensorInfo], optimizer: str) -> list[Kernel]:
    if optimizer == "none":
        return []
    traffic, flops = OPTIMIZER_TRAFFIC[optimizer]
    return [Kernel(f"{name}.{optimizer}", (), f"{optimizer.capitalize()}Update",
                   OpCost("elementwise", flops * t.numel, traffic * _nb(t), t.dtype,
                          elements=t.numel), "update")
            for name, t in params.items()]


def backward_kernels(node: NodeView, r: NodeResult, need: set[str]) -> list[Kernel]:
    if r.cost is None or not any(t.name in need for t in node.outputs):
        return []
    if r.cost.estimated:  # an unshaped or unsupported forward: its gradient is a guess too
        kernels = _generic_bw(r, need)
    else:
        steps = BACKWARD_STEPS.get((node.domain, node.op_type))
        fn = BACKWARD_BY_OP.get((node.domain, node.op_type)) or BACKWARD.get(r.cost.family,
                                                                              _generic_bw)
        kernels = steps(node, need) if steps is not None else fn(r, need)
    return [Kernel(f"{node.name}.{suffix}", (node.name,), f"{node.op_type}Grad", cost,
                   "backward") for suffix, cost in kernels]


def _dropout_cost(node: NodeView, reads: int) -> OpCost:
    y = node.outputs[0]
    # mask: one byte per element (torch stores a bool mask)
    return OpCost("elementwise", 2 * y.numel, reads + _nb(y) + y.numel, y.dtype,
                  elements=y.numel)


def dropout_kernels(results: Sequence[NodeResult], need: set[str]) -> tuple[list[Kernel],
                                                                          list[Kernel]]:
    """(forward, backward) kernels of Dropout nodes, which cost nothing at inference."""
    fwd, bwd = [], []
    for r in results:
        n = r.node
        if n.op_type != "Dropout" or n.domain or not n.outputs[0].known:
            continue
        x = n.input(0)
        fwd.append(Kernel(n.name, (n.name,), "Dropout", _dropout_cost(n, _nb(x))))
        if x is not None and x.name in need:
            bwd.append(Kernel(f"{n.name}.dX", (n.name,), "DropoutGrad",
                              _dropout_cost(n, _nb(n.outputs[0])), "backward"))
    return fwd, bwd


def training_kernels(graph: Graph, results: Sequence[NodeResult], forward: Sequence[Kernel],
                     *, optimizer: str = "none") -> list[Kernel]:
    """Forward kernels, then backward and gradient accumulation, then the optimizer step."""
    if optimizer not in OPTIMIZERS:
        from ..errors import TilecastError

        raise TilecastError(f"unknown optimizer {optimizer!r}: choose one of "
                            f"{', '.join(OPTIMIZERS)}")
    check_trainable(results)
    results, rerun = unfold_trained(graph, results, parameters(results))
    need, params = trainable(results)
    drop_fwd, drop_bwd = dropout_kernels(results, need)
    kernels = [*(Kernel(r.node.name, (r.node.name,), r.node.op_type, r.cost) for r in rerun),
               *batch_norm_training(forward), *drop_fwd]
    for r in reversed(results):
        kernels.extend(backward_kernels(r.node, r, need))
    kernels.extend(drop_bwd)
    kernels.extend(_accumulation(results, need, params))
    kernels.extend(_optimizer(params, optimizer))
    return kernels
