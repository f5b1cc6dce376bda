"""Gradient kernels of elementwise ops, as PyTorch's autograd computes them (derivatives.yaml,
FunctionsManual.cpp), and the small kernel builders the training step shares."""

from __future__ import annotations

from .analysis import NodeResult
from .types import OpCost, RowDims, TensorInfo


def tensor_bytes(t: TensorInfo | None) -> int:
    """A tensor's bytes; 0 for a missing tensor or one whose shape is not known."""
    return t.nbytes if t is not None and t.shape is not None and -1 not in t.shape else 0


def elementwise_kernel(name: str, dtype: str, nbytes: int, elements: int, flops_per: int = 1,
                       ) -> tuple[str, OpCost]:
    """A named elementwise gradient kernel of ``flops_per`` FLOPs per element."""
    return name, OpCost("elementwise", flops_per * elements, nbytes, dtype, elements=elements)


def reduce_to(t: TensorInfo, dy: TensorInfo, name: str) -> tuple[str, OpCost]:
    """Sum a broadcast gradient back to the input's shape (e.g. a bias gradient)."""
    out = max(t.numel, 1)
    return name, OpCost("reduction", dy.numel, tensor_bytes(dy) + tensor_bytes(t), dy.dtype,
                        rows=RowDims(out, dy.numel // out), elements=out)


# Short names for the formulas below.
_nb, _elementwise, _reduce_to = tensor_bytes, elementwise_kernel, reduce_to


def _input_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """dX_i = dY * f'(inputs): one kernel reading dY and the forward inputs, writing dX_i at
    full size."""
    node, y = r.node, r.node.outputs[0]
    reads = _nb(y) + sum(_nb(u) for u in dict.fromkeys(node.inputs) if u is not None)
    per = max(1, r.cost.flops // max(r.cost.elements, 1))
    return [_elementwise(f"d{i}", y.dtype, reads + _nb(y), y.numel, per)]


def _product_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's mul backward (derivatives.yaml, mul.Tensor): dX_i = dY * the other factor,
    one kernel reading dY and that factor only (a scalar factor: dY alone)."""
    node, y = r.node, r.node.outputs[0]
    other = node.input(1 - i) if len(node.inputs) == 2 else None
    return [_elementwise(f"d{i}", y.dtype, 2 * _nb(y) + _nb(other), y.numel)]


def _quotient_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's div backward (derivatives.yaml, div.Tensor): the dividend's gradient is
    ``grad / other``, one kernel reading dY and the divisor (a scalar divisor: dY alone). The
    labels' per-node CSVs time the attention scores' ``truediv`` backward at its forward's time
    (0.99-1.01x, GPT-2 on the MI100, MI210, A100 80GB, L4 and V100). The divisor's gradient
    reads both operands (the generic rule)."""
    if i != 0:
        return _input_grad(r, i)
    node, y = r.node, r.node.outputs[0]
    return [_elementwise("d0", y.dtype, 2 * _nb(y) + _nb(node.input(1)), y.numel)]


def _power_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's pow_backward for a constant exponent e: ``grad * (e * self.pow(e - 1))``,
    three kernels (the power, the scale, the product): seven tensor passes where one kernel
    would move three. The labels' per-node CSVs time it at 3.0-3.3x the forward's two passes
    (GPT-2's GELU cube on the A100 80GB, V100, MI210)."""
    node, y = r.node, r.node.outputs[0]
    exponent = node.input(1)
    if i != 0 or exponent is None or not (exponent.is_initializer or exponent.numel <= 1):
        return _input_grad(r, i)
    x = node.input(0)
    return [_elementwise("d0_pow", y.dtype, 2 * _nb(x), x.numel, 3),
            _elementwise("d0_scale", y.dtype, 2 * _nb(x), x.numel),
            _elementwise("d0", y.dtype, 3 * _nb(y), y.numel)]


def _extremum_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's maximum/minimum backward (derivatives.yaml): ``at::where(self == other,
    grad / 2, grad).masked_fill_(self < other, 0)``, five kernels per input: two compares
    writing one-byte masks, the halving, the select, the in-place fill: 40 bytes per fp32
    element against the forward's 8. The labels' per-node CSVs time OPT's score clamp
    ``torch.max(scores, finfo.min)`` backward at 4.9x its forward (A100 80GB: 7.00 vs 1.42 ms)."""
    node, y = r.node, r.node.outputs[0]
    if len(node.inputs) != 2:
        return _input_grad(r, i)
    inputs, g, mask = _nb(node.input(0)) + _nb(node.input(1)), _nb(y), y.numel
    return [_elementwise(f"d{i}_eq", y.dtype, inputs + mask, y.numel),
            _elementwise(f"d{i}_half", y.dtype, 2 * g, y.numel),
            _elementwise(f"d{i}_select", y.dtype, mask + 3 * g, y.numel),
            _elementwise(f"d{i}_compare", y.dtype, inputs + mask, y.numel),
            _elementwise(f"d{i}", y.dtype, mask + 2 * g, y.numel)]


def _clip_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's clamp_backward (FunctionsManual.cpp): ``where(self >= min, grad, 0)`` with one
    bound; with both, ``where((self >= min).logical_and_(self <= max), grad, 0)``: a compare
    per bound writing a one-byte mask, the in-place and, then the select."""
    node, y = r.node, r.node.outputs[0]
    x = node.input(0)
    if i != 0 or x is None:
        return []  # bounds given as tensors: constants in exported graphs, no gradient
    if node.opset >= 11:
        bounds = sum(node.input(j) is not None for j in (1, 2))
    else:  # Clip-6 holds its bounds as attributes
        bounds = sum(node.attr(a) is not None for a in ("min", "max"))
    if not bounds:
        return []  # no bound: autograd hands dY through
    mask = y.numel
    out = [_elementwise(f"d0_bound{j}", y.dtype, _nb(x) + mask, y.numel) for j in range(bounds)]
    if bounds == 2:
        out.append(_elementwise("d0_and", y.dtype, 3 * mask, y.numel))
    return [*out, _elementwise("d0", y.dtype, mask + 2 * _nb(y), y.numel)]


def _select_grad(r: NodeResult, i: int) -> list[tuple[str, OpCost]]:
    """PyTorch's where backward (derivatives.yaml, where.self): ``where(condition, grad, 0)``
    for the first branch, ``where(condition, 0, grad)`` for the second: one kernel reading the
    condition and dY, not the branches. The labels' per-node CSVs time GPT-2's causal `where`
    backward at its forward's time (0.98-1.07x on the V100, A100 80GB, MI100 and MI210)."""
    node, y = r.node, r.node.outputs[0]
    return [_elementwise(f"d{i}", y.dtype, _nb(node.input(0)) + 2 * _nb(y), y.numel)]


# Elementwise ops whose PyTorch gradient is not the generic one-kernel rule (_input_grad).
INPUT_GRADS = {"Mul": _product_grad, "Pow": _power_grad, "Max": _extremum_grad,
               "Min": _extremum_grad, "Clip": _clip_grad, "Where": _select_grad,
               "Div": _quotient_grad}


def elementwise_bw(r: NodeResult, need: set[str]) -> list[tuple[str, OpCost]]:
    """The gradient kernels of an elementwise node for each input that needs one."""
    node, y = r.node, r.node.outputs[0]
    grad = INPUT_GRADS.get(node.op_type, _input_grad) if not node.domain else _input_grad
    out = []
    for i, t in enumerate(node.inputs):
        if t is None or t.name not in need:
            continue
        passthrough = node.op_type == "Add" or (node.op_type == "Sub" and i == 0)
        if passthrough:
            # d(a+b)/da = 1: autograd passes dY through; only broadcasting needs a sum.
            if t.shape != y.shape:
                out.append(_reduce_to(t, y, f"d{i}"))
            continue
        out.extend(grad(r, i))
        if t.shape != y.shape:
            out.append(_reduce_to(t, y, f"d{i}_sum"))
    return out
