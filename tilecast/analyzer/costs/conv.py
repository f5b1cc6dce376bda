"""Convolutions (1-3D, any groups / strides / dilations / pads) as implicit GEMMs; deformable
convolution as its sampled columns and a GEMM; the stateful causal depthwise conv of opset 27.

Strides, pads, dilations and auto_pad only change the output's spatial size, which shape
inference has already worked out, so the formulas read the output shape instead of re-deriving
it. A dilated kernel reads the same number of taps as a dense one.
"""

from __future__ import annotations

from dataclasses import replace

from ..registry import REGISTRY, CostFn, register_all, register_steps
from ..shape_rules import nhwc_weight
from ..types import ConvDims, MatmulDims, NativeDepthwise, NodeView, OpCost
from .common import (
    Shape,
    attr_str,
    has_input,
    in_shape,
    io_bytes,
    nbytes,
    out_shape,
    prod,
    require,
    require_nonempty,
    unique_bytes,
)
from .elementwise import activation_flops

MS = "com.microsoft"


def _first(node: NodeView, key: str, default: int) -> int:
    """The largest per-axis value of an attribute (cuDNN's algorithms key on the worst axis)."""
    values = node.attr(key) or ()
    return int(max(values)) if len(values) else default


def conv_dims(node: NodeView, x: Shape, w: Shape, y: Shape, groups: int) -> ConvDims:
    """X (n, c, *in), W (k, c/g, *kernel), Y (n, k, *out) -> ConvDims. 1-D: h = p = r = 1;
    3-D: the leading spatial axes fold into h, p and r (the last one stays w, q, s)."""
    spatial_in, spatial_out, taps = (x[2:] or (1,)), (y[2:] or (1,)), (w[2:] or (1,))
    pads = node.attr("pads") or ()
    return ConvDims(n=x[0], c=x[1], k=w[0], h=prod(spatial_in[:-1]), w=spatial_in[-1],
                    p=prod(spatial_out[:-1]), q=spatial_out[-1], r=prod(taps[:-1]), s=taps[-1],
                    stride=_first(node, "strides", 1),
                    pad=int(max(pads)) if len(pads) else 0,
                    dilation=_first(node, "dilations", 1), groups=groups)


def _cost(node: NodeView, d: MatmulDims, x_index: int, bias_adds: int,
          geometry: ConvDims | None = None) -> OpCost:
    return OpCost("conv", 2 * d.b * d.m * d.n * d.k + bias_adds, io_bytes(node),
                  node.inputs[x_index].dtype, unit="matrix", matmul=d,
                  elements=prod(out_shape(node)), conv=geometry)


def depthwise(x: Shape, w: Shape, y: Shape, groups: int) -> NativeDepthwise | None:
    """The native kernel PyTorch may run a 2-D depthwise conv on (every input channel its own
    group, ``groups > 1``, any channel multiplier: ``is_depthwise`` in
    aten/src/ATen/native/Convolution.cpp); None for any other conv."""
    if len(x) != 4 or groups <= 1 or groups != x[1] or w[0] % x[1]:
        return None
    return NativeDepthwise(prod(y), prod(w[2:]), x[1])


def conv(x_index: int, w_index: int, bias_index: int | None, native: bool = False) -> CostFn:
    """Factory. X (N, C, *in), W (M, C/g, *kernel), Y (N, M, *out): per group an
    (N*out) x (C/g * kernel) @ (C/g * kernel) x (M/g) GEMM; the bias adds once per output.
    ``native``: a float conv that PyTorch may run on its own depthwise kernel."""

    def fn(node: NodeView) -> OpCost:
        x, w, y = in_shape(node, x_index), in_shape(node, w_index), out_shape(node)
        g = node.attr("group", 1)
        require(node, x[1] == w[1] * g and w[0] % g == 0,
                f"channels do not match group={g}: X {list(x)}, W {list(w)}")
        require_nonempty(node, y)
        # Implicit GEMM per group: M = N*P*Q rows, N = K/g output channels, K = C/g*R*S.
        d = MatmulDims(g, x[0] * prod(y[2:]), w[0] // g, w[1] * prod(w[2:]))
        has_bias = bias_index is not None and has_input(node, bias_index)
        cost = _cost(node, d, x_index, prod(y) if has_bias else 0, conv_dims(node, x, w, y, g))
        return replace(cost, native=depthwise(x, w, y, g) if native else None)

    return fn


def conv_transpose(node: NodeView) -> OpCost:
    """X (N, C, *in), W (C, M/g, *kernel): every input pixel scatters a (M/g * kernel) patch,
    an (N*in) x (C/g) @ (C/g) x (M/g * kernel) GEMM per group (col2im adds are its FMAs)."""
    x, w, y = in_shape(node, 0), in_shape(node, 1), out_shape(node)
    g = node.attr("group", 1)
    require(node, x[1] == w[0] and x[1] % g == 0,
            f"channels do not match group={g}: X {list(x)}, W {list(w)}")
    d = MatmulDims(g, x[0] * prod(x[2:]), w[1] * prod(w[2:]), x[1] // g)
    return _cost(node, d, 0, prod(y) if has_input(node, 2) else 0)


register_all(("Conv",), conv(0, 1, 2, native=True))
register_all(("ConvInteger",), conv(0, 1, None))  # x, w, x_zero_point, w_zero_point
register_all(("QLinearConv",), conv(0, 3, 8))  # x, x_scale, x_zp, w, w_scale, w_zp, y_s, y_zp, B
register_all(("ConvTranspose",), conv_transpose)


def deform_conv_steps(node: NodeView) -> list[tuple[str, OpCost]]:
    """X (N, C, H, W), W (M, C/g, kh, kw), offset (N, 2 og kh kw, oh, ow) [, B, mask] -> Y (N, M,
    oh, ow), as torchvision's deform_conv2d runs it. The columns kernel samples every tap at
    its offset position: bilinear (4 taps, 9 FLOPs) and the mask multiply (1), written as a
    (C kh kw) x (N oh ow) matrix. Then one GEMM per group, as a convolution's implicit GEMM,
    with the bias added once per output."""
    x, w, y = in_shape(node, 0), in_shape(node, 1), out_shape(node)
    g = node.attr("group", 1)
    require(node, len(x) == 4 and x[1] == w[1] * g and w[0] % g == 0,
            f"channels do not match group={g}: X {list(x)}, W {list(w)}")
    taps = x[0] * x[1] * prod(w[2:]) * prod(y[2:])
    item = node.inputs[0].itemsize
    cols_bytes = int(taps * item)
    sampled = min(int(4 * taps * item), nbytes(node, node.inputs[0]))
    mask = has_input(node, 4)
    reads = unique_bytes(node, (node.input(2), node.input(4) if mask else None))
    columns = OpCost("pooling", taps * (9 + mask), sampled + reads + cols_bytes,
                     node.inputs[0].dtype, elements=taps)
    d = MatmulDims(g, x[0] * prod(y[2:]), w[0] // g, w[1] * prod(w[2:]))
    bias = prod(y) if has_input(node, 3) else 0
    gemm_bytes = cols_bytes + unique_bytes(node, (node.input(1), node.input(3), node.outputs[0]))
    gemm = OpCost("matmul", 2 * d.b * d.m * d.n * d.k + bias, gemm_bytes, node.inputs[0].dtype,
                  unit="matrix", matmul=d, elements=prod(y))
    return [("columns", columns), ("gemm", gemm)]


register_steps("DeformConv", deform_conv_steps, "conv")


# a fused SiLU after the convolution: x * sigmoid(x), sigmoid 3 (elementwise.SIGMOID) + 1
SILU = 4


def causal_conv_with_state(node: NodeView) -> OpCost:
    """input (B, C, L), weight (C, 1, k) [, bias (C), past_state (B, C, k - 1)] -> output
    (B, C, L), present_state (B, C, k - 1): a depthwise causal Conv1d over the past state and
    the input, as a depthwise Conv: per channel an (B L) x k @ k x 1 GEMM; bias and SiLU per
    output when present."""
    x, w = in_shape(node, 0), in_shape(node, 1)
    require(node, len(x) == 3 and w[0] == x[1] and w[1] == 1,
            f"weight {list(w)} is not depthwise over input {list(x)}")
    b, c, length, k = x[0], x[1], x[2], w[2]
    d = MatmulDims(c, b * length, 1, k)
    extra = (1 if has_input(node, 2) else 0) + (SILU if attr_str(node, "activation", "none")
                                                 in ("silu", "swish") else 0)
    geometry = ConvDims(n=b, c=c, k=c, h=1, w=length + k - 1, p=1, q=length, r=1, s=k,
                        groups=c)
    return _cost(node, d, 0, extra * b * c * length, geometry)


REGISTRY.register("", "CausalConvWithState", causal_conv_with_state, since=27)


def nhwc_conv(node: NodeView) -> OpCost:
    """com.microsoft NhwcConv / NhwcFusedConv (ORT's Stable Diffusion optimizer): X (N, *in,
    C) -> Y (N, *out, M), the weight in Conv's layout or (M, *kernel, C / g). The same implicit
    GEMM as Conv on the NCHW view; a fused activation and the residual Z add per output."""
    x, w, y = in_shape(node, 0), in_shape(node, 1), out_shape(node)
    g = node.attr("group", 1)
    wn = nhwc_weight(x, w, g, tuple(node.attr("kernel_shape") or ()))
    require(node, wn is not None, f"weight {list(w)} fits neither layout of X {list(x)}")
    xn, yn = (x[0], x[-1], *x[1:-1]), (y[0], y[-1], *y[1:-1])
    d = MatmulDims(g, x[0] * prod(y[1:-1]), wn[0] // g, wn[1] * prod(wn[2:]))
    epilogue = has_input(node, 2) + has_input(node, 3) + activation_flops(node)
    return _cost(node, d, 0, epilogue * prod(y), conv_dims(node, xn, wn, yn, g))


REGISTRY.register(MS, "NhwcConv", nhwc_conv)
REGISTRY.register(MS, "NhwcFusedConv", nhwc_conv)
