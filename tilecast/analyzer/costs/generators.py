"""Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial.

Counted as the floating-point work on each output; the counter-based generator's integer
hashing (Philox in PyTorch and cuRAND) is not a FLOP. The ``*Like`` ops read only their input's
shape and dtype, never its data, so their bytes are the output written.
"""

from __future__ import annotations

from ..registry import CostFn, register_all
from ..types import NodeView, OpCost
from .common import in_shape, io_bytes, nbytes, out_shape, prod, vector_cost
from .elementwise import elementwise

UNIFORM = 3  # the integer to [0, 1) conversion (1) and the scale and shift (an FMA, 2)
# Box-Muller from two uniforms, per output: half of (log, sqrt, multiply, cos and sin, two
# multiplies), then the scale and shift (an FMA)
NORMAL = 6


def draw(flops_per_element: int) -> CostFn:
    """Factory: one value drawn per output element, from no input data (only the output is
    written)."""

    def fn(node: NodeView) -> OpCost:
        out = node.outputs[0]
        n = prod(out_shape(node))
        return vector_cost(node, "elementwise", flops_per_element * n, nbytes(node, out),
                           dtype=out.dtype, elements=n)

    return fn


def multinomial(node: NodeView) -> OpCost:
    """input (B, classes) unnormalized log-probabilities -> (B, samples) indices: per row, an
    exp and a prefix sum per class (2); per sample, a uniform draw and a binary search of the
    row's cumulative sums (log2 classes compares)."""
    b, classes = in_shape(node, 0)
    samples = out_shape(node)[1]
    flops = b * 2 * classes + b * samples * (UNIFORM + max(classes - 1, 1).bit_length())
    return vector_cost(node, "reduction", flops, io_bytes(node), dtype=node.inputs[0].dtype,
                       elements=b * samples)


register_all(("RandomUniform", "RandomUniformLike"), draw(UNIFORM))
register_all(("RandomNormal", "RandomNormalLike"), draw(NORMAL))
# reads its probabilities: a draw, then a compare per element
register_all(("Bernoulli",), elementwise(UNIFORM + 1, out_dtype=True))
register_all(("Multinomial",), multinomial)
