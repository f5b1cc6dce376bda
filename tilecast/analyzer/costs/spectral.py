"""Signal processing: DFT, STFT, the window generators and MelWeightMatrix.

FFT work uses the conventional count of FFT benchmarks (FFTW's benchFFT reports "mflops" as
5 N log2 N per complex transform of length N; a real-input transform is counted as half). It is
a work measure, not the instruction count of a given library; cuFFT kernels are memory-bound on
the sizes networks use, so the bytes usually decide.
"""

from __future__ import annotations

import math

from ..registry import register_all
from ..types import NodeView, OpCost
from .common import in_shape, io_bytes, out_shape, prod, require, vector_cost
from .elementwise import elementwise


def fft_flops(n: int, transforms: int, complex_input: bool) -> int:
    """5 n log2 n per complex length-n transform, half that for real input."""
    per = 5 * n * math.log2(max(n, 2))
    return int(transforms * (per if complex_input else per / 2))


def _transform_length(outputs_along: int, onesided: bool) -> int:
    """A onesided transform keeps n // 2 + 1 bins; read n back as 2 (bins - 1)."""
    return max(2 * (outputs_along - 1), 1) if onesided else outputs_along


def dft(node: NodeView) -> OpCost:
    """input (..., L, ..., 1 | 2) -> output (..., n or n // 2 + 1, ..., 2): one length-n
    transform per position of the other dims. The axis is the dim whose size changes (the
    ``dft_length`` or onesided output), else the default axis (opset 17-19: attribute,
    default 1; 20+: an input, default -2)."""
    x, y = in_shape(node, 0), out_shape(node)
    require(node, len(x) == len(y) and len(x) >= 3 and x[-1] in (1, 2),
            f"input {list(x)} and output {list(y)} are not a DFT's")
    changed = [i for i in range(1, len(y) - 1) if x[i] != y[i]]
    axis = changed[0] if changed else (node.attr("axis", 1) if node.opset < 20 else -2)
    axis %= len(y)
    n = _transform_length(y[axis], bool(node.attr("onesided", 0)))
    transforms = prod(y[:-1]) // max(y[axis], 1)
    return vector_cost(node, "pooling", fft_flops(n, transforms, x[-1] == 2), io_bytes(node))


def stft(node: NodeView) -> OpCost:
    """signal (B, L, 1 | 2), frame_step, [window (n)], [frame_length] -> (B, frames, bins,
    2): per frame, the window multiply (n) and a length-n transform. n is the window's
    length, else read from the bins (onesided by default)."""
    x, y = in_shape(node, 0), out_shape(node)
    window = node.input(2)
    if window is not None and window.known:
        n = prod(window.shape)
    else:
        n = _transform_length(y[2], bool(node.attr("onesided", 1)))
    frames = y[0] * y[1]
    flops = fft_flops(n, frames, x[-1] == 2) + frames * n
    return vector_cost(node, "pooling", flops, io_bytes(node))


register_all(("DFT",), dft)
register_all(("STFT",), stft)
# Computed from the index alone (a scalar size in): elementwise at the output's dtype.
# a0 - a1 cos(2 pi k / N): the angle (1), cos (1), an FMA (2)
register_all(("HannWindow", "HammingWindow"), elementwise(4, out_dtype=True))
# a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N): two angles, two cosines, two FMAs
register_all(("BlackmanWindow",), elementwise(8, out_dtype=True))
# a triangle weight per (bin, mel band): two slopes (a subtract and a divide each), min, max
register_all(("MelWeightMatrix",), elementwise(6, out_dtype=True))
