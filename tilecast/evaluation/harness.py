"""What NeuSight's per-node harness launches for a kernel, where a training step launches less.

The harness behind the labels' per-node CSVs times each backward node by calling it directly
from Python, ``grad_fn(torch.ones(...))``, with autograd's grad mode on; a training step's
``loss.backward()`` runs the engine with it off. Autograd formulas that branch on grad mode then
launch other kernels. Dropout is the one the labels hold: in a step its backward is
``native_dropout_backward`` (one kernel: dY x mask x scale, reading the one-byte mask), while
with grad mode on PyTorch takes the double-differentiable form
``grad * (mask.type_as(grad) * scale)`` (derivatives.yaml, ``native_dropout``): a cast of the mask
to dY's dtype, a scale, and the product. In fp32 that moves 25 bytes per element against 9, the
6.25 passes over the tensor that the labels show (``benchmarks/data_consistency.py`` check 4:
5.8-6.7 on five GPUs).

``evaluate --by-family`` costs each forecast kernel as the harness runs it (``timed_alone``), so
its rows compare like with like; forecasts of steps are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..analyzer.types import DTYPE_SIZE, Kernel, OpCost

DROPOUT_GRAD = "DropoutGrad"  # op_type of the training step's dropout backward kernel
MASK_ITEMSIZE = 1  # torch's dropout mask is bool


def _elementwise(k: Kernel, suffix: str, nbytes: float, elements: int) -> Kernel:
    cost = OpCost("elementwise", elements, int(nbytes), k.cost.dtype, elements=elements)
    return replace(k, name=f"{k.name}.{suffix}", cost=cost)


def _dropout_grad_with_grad_mode(k: Kernel) -> tuple[Kernel, ...]:
    n, size = k.cost.elements, DTYPE_SIZE.get(k.cost.dtype, 4)
    return (_elementwise(k, "mask_cast", n * (MASK_ITEMSIZE + size), n),  # bool -> dY's dtype
            _elementwise(k, "mask_scale", n * 2 * size, n),  # mask * scale
            _elementwise(k, "mul", n * 3 * size, n))  # dY * scaled mask


# Forecast kernels the harness runs differently, by op_type.
HARNESS_RULES: dict[str, Callable[[Kernel], tuple[Kernel, ...]]] = {
    DROPOUT_GRAD: _dropout_grad_with_grad_mode,
}


def timed_alone(k: Kernel) -> tuple[Kernel, ...]:
    """The kernels the per-node harness launches for forecast kernel ``k`` (usually ``k``)."""
    rule = HARNESS_RULES.get(k.op_type)
    return rule(k) if rule is not None and k.cost.elements > 0 else (k,)
