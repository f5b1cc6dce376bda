"""An exported ``F.scaled_dot_product_attention`` call runs as one fused kernel under eager
PyTorch: torch.onnx decomposes it into Mul(Q, sqrt(scale)), K^T (one Transpose, or the dynamo
exporter's Reshape -> Transpose -> Reshape), Mul(K^T, sqrt(scale)), MatMul, [mask add],
Softmax, MatMul; PyTorch runs the call on flash or memory-efficient attention. Attention
written out by hand (Hugging Face's eager attention scales the scores) keeps each op."""

from __future__ import annotations

import onnx.parser
import pytest

import tilecast
from tilecast.analyzer.attention_fusion import SDPA_CALL
from tilecast.analyzer.fold import HOST

# B 2, H 4, S 8, D 16: Q, K, V (2, 4, 8, 16) as the heads' permute of (2, 8, 4, 16)
# projections, a padding mask (2, 1, 1, 8); sqrt(1 / sqrt(16)) = 0.5 on Q and on K^T
HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (T[2, 8, 4, 16] qp, T[2, 8, 4, 16] kp, T[2, 8, 4, 16] vp, T[2, 1, 1, 8] m)
    => (T[2, 8, 4, 16] y) <float halff = {0.5}, int64[3] s3 = {8, 8, 16},
                            int64[4] s4 = {2, 4, 16, 8}> {
  half = Cast <to = TO> (halff)
  q = Transpose <perm = [0, 2, 1, 3]> (qp)
  k = Transpose <perm = [0, 2, 1, 3]> (kp)
  v = Transpose <perm = [0, 2, 1, 3]> (vp)
"""
TAIL = """  u = Add(s, m)
  p = Softmax <axis = -1> (u)
  o = MatMul(p, v)
  y = Transpose <perm = [0, 2, 1, 3]> (o)
}"""
# torch.onnx's TorchScript exporter: K^T is one Transpose of K
LEGACY = HEAD + """  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  qs = Mul(q, half)
  ks = Mul(kt, half)
  s = MatMul(qs, ks)
""" + TAIL
# the dynamo exporter: K to 3-D, swapped, back to 4-D
DYNAMO = HEAD + """  k3 = Reshape(k, s3)
  k3t = Transpose <perm = [0, 2, 1]> (k3)
  kt = Reshape(k3t, s4)
  qs = Mul(q, half)
  ks = Mul(kt, half)
  s = MatMul(qs, ks)
""" + TAIL
# the TorchScript exporter's optimizer merges the heads' permute of K with SDPA's last-two
# swap into one Transpose (0, 2, 3, 1) of the (B, S, H, D) projection: the kernel reads it
MERGED = HEAD.replace("  k = Transpose <perm = [0, 2, 1, 3]> (kp)\n", "") + """\
  kt = Transpose <perm = [0, 2, 3, 1]> (kp)
  qs = Mul(q, half)
  ks = Mul(kt, half)
  s = MatMul(qs, ks)
""" + TAIL
# Hugging Face's eager attention: matmul(q, k^T) then the scores scaled -- not an SDPA call
SCORES_SCALED = HEAD + """  kt = Transpose <perm = [0, 1, 3, 2]> (k)
  s0 = MatMul(q, kt)
  s = Mul(s0, half)
""" + TAIL
# torch.onnx's scale from the head size: Shape -> Slice -> Cast -> Sqrt -> Div, then Sqrt
SHAPE_SCALE = LEGACY.replace("  qs = Mul(q, half)\n", """  sh = Shape(q)
  d = Slice(sh, minus1, big)
  df = Cast <to = 1> (d)
  sd = Sqrt(df)
  sc = Div(one, sd)
  half_ = Sqrt(sc)
  qs = Mul(q, half_)
""").replace("ks = Mul(kt, half)", "ks = Mul(kt, half_)").replace(
    "int64[3] s3", "int64[1] minus1 = {-1}, int64[1] big = {9}, float one = {1.0}, int64[3] s3")
# scores = 8 heads x 8 x 8 = 512: both products 2 * 512 * 16 each, softmax 6 and mask 1 per
# score; Q, K, V (1,024 elements each), the mask (16) and the output read/written once
FLOPS = 2 * 2 * 512 * 16 + 7 * 512
ELEMENTS = 4 * 1024 + 16
TO = {"float": 1, "float16": 10, "bfloat16": 16, "double": 11}  # ONNX dtype ids


def _model(text: str, dtype: str = "float") -> onnx.ModelProto:
    return onnx.parser.parse_model(text.replace("T[", f"{dtype}[").replace("TO", str(TO[dtype])))


def _run(text: str, runtime: str = "eager", dtype: str = "float", **kw):
    return tilecast.analyze(_model(text, dtype), "a100-sxm4-40gb", predictor="roofline",
                            runtime=runtime, **kw)


def _ops(f) -> list[str]:
    return [k.kernel.op_type for k in f.kernels]


def _reasons(f, reason: str) -> int:
    return sum(z.count for z in f.zero_cost_reasons if z.reason == reason)


# LEGACY and MERGED members: 2 Muls, QK^T, the mask add, softmax, K^T; DYNAMO adds its two
# Reshapes
@pytest.mark.parametrize(("text", "members"), [(LEGACY, 6), (DYNAMO, 8), (MERGED, 6)])
@pytest.mark.parametrize("runtime", ["eager", "cudagraph"])
def test_an_exported_sdpa_call_is_one_kernel_under_pytorch(text: str, members: int,
                                                           runtime: str) -> None:
    f = _run(text, runtime)
    assert _ops(f) == ["Attention"]  # the head transposes are views of its operands
    (att,) = [k.kernel for k in f.kernels]
    assert (att.cost.family, att.cost.flops, att.cost.bytes) == ("attention", FLOPS,
                                                                  4 * ELEMENTS)
    assert _reasons(f, SDPA_CALL) == members


def test_the_fused_call_reads_k_itself() -> None:
    """The kernel reads K (2, 4, 8, 16), as SDPA takes it, not the K^T the export builds."""
    f = tilecast.analyze(_model(DYNAMO), "a100-sxm4-40gb", predictor="roofline")
    k = next(r for r in f.kernels if r.kernel.op_type == "Attention")
    assert k.kernel.cost.matmul.k == 16 and k.kernel.cost.matmul.n == 8


# a boolean padding mask, as torch.onnx writes SDPA's: Where(mask, 0, -inf), then the add
BOOL_MASK = LEGACY.replace("T[2, 1, 1, 8] m)", "bool[2, 1, 1, 8] m)").replace(
    "  u = Add(s, m)", "  am = Where(m, zero, low)\n  u = Add(s, am)").replace(
    "<float halff", "<float zero = {0.0}, float low = {-10000.0}, float halff")


@pytest.mark.parametrize(("runtime", "where"), [
    # eager PyTorch turns a boolean attn_mask into an additive one before its kernel
    # (convert_boolean_attn_mask): the conversion stays a kernel
    ("eager", True),
    # a graph runtime's fused kernel builds the mask from the condition it reads
    ("graph", False),
])
def test_a_boolean_mask_is_converted_before_the_eager_kernel(runtime: str, where: bool) -> None:
    ops = _ops(_run(BOOL_MASK, runtime))
    assert ops.count("Attention") == 1 and ("Where" in ops) is where


def test_hand_written_attention_keeps_each_op_under_eager() -> None:
    ops = _ops(_run(SCORES_SCALED))
    assert "Attention" not in ops and ops.count("MatMul") == 2 and "Softmax" in ops


@pytest.mark.parametrize(("dtype", "fused"), [("float", True), ("float16", True),
                                              ("bfloat16", True), ("double", False)])
def test_only_dtypes_with_a_fused_sdpa_kernel_fuse(dtype: str, fused: bool) -> None:
    # fp64 runs SDPA's math path: the decomposed ops, one by one
    assert ("Attention" in _ops(_run(LEGACY, dtype=dtype))) is fused


@pytest.mark.parametrize(("device", "fused"), [("mi100", False), ("mi210", True), ("p100", True)])
def test_only_gpus_with_fused_sdpa_kernels_fuse(device: str, fused: bool) -> None:
    # ROCm's SDPA kernels (AOTriton) are built for CDNA2 and CDNA3, not the MI100's gfx908
    f = tilecast.analyze(_model(LEGACY), device, predictor="roofline")
    assert ("Attention" in _ops(f)) is fused


def test_an_unaligned_head_dim_takes_the_math_path() -> None:
    # head dim 12 in fp16: not a multiple of 8 (16 bytes), so no fused kernel; in fp32 it is
    # a multiple of 4 and fuses
    narrow = LEGACY.replace("4, 16]", "4, 12]").replace("{8, 8, 16}", "{8, 8, 12}")
    assert "Attention" not in _ops(_run(narrow, dtype="float16"))
    assert "Attention" in _ops(_run(narrow, dtype="float"))


def test_the_default_scale_from_the_head_size_is_host_arithmetic() -> None:
    """1 / sqrt(q.size(-1)) is a Python float in PyTorch: no GPU kernel for it."""
    f = _run(SHAPE_SCALE)
    assert _ops(f) == ["Attention"]
    assert _reasons(f, HOST) == 6  # Shape, Slice, Cast, Sqrt, Div, Sqrt


def test_graph_runtime_fuses_it_as_before() -> None:
    f = _run(LEGACY, runtime="graph")
    assert _ops(f).count("Attention") == 1 and _reasons(f, SDPA_CALL) == 0


def test_training_takes_the_fused_backward() -> None:
    """Under eager training the call's backward is SDPA's fused one (2.5x the forward's
    FLOPs: training.py), not the decomposed ops' gradients. A weight (16, 16) projects Q."""
    weights = ", ".join(["0.01"] * 256)
    text = LEGACY.replace("  q = Transpose <perm = [0, 2, 1, 3]> (qp)", """  qx = MatMul(qp, w)
  q = Transpose <perm = [0, 2, 1, 3]> (qx)""")
    text = text.replace("<float halff", f"<float[16, 16] w = {{{weights}}}, float halff")
    f = _run(text, mode="training")
    att = [k.kernel.cost for k in f.kernels if k.kernel.cost.family == "attention"]
    assert "Softmax" not in _ops(f) and len(att) == 2
    assert att[1].flops == att[0].flops * 5 // 2


def test_the_cli_names_the_call_s_nodes(tmp_path) -> None:
    from click.testing import CliRunner

    from tilecast.cli import main

    path = tmp_path / "sdpa.onnx"
    onnx.save(_model(DYNAMO), path)
    res = CliRunner().invoke(main, ["analyze", str(path), "-d", "t4", "--predictor",
                                    "roofline"])
    assert res.exit_code == 0, res.output
    assert "in an SDPA kernel 8" in res.output


# an --attn sdpa export: ONNX Attention (opset 23) given a padding mask of either dtype
ONNX_ATTENTION = """
<ir_version: 10, opset_import: ["" : 23]>
g (float[2, 4, 8, 16] q, float[2, 4, 8, 16] k, float[2, 4, 8, 16] v, M[2, 1, 8, 8] m)
    => (float[2, 4, 8, 16] y) {
  y = Attention(q, k, v, m)
}"""


@pytest.mark.parametrize(("mask", "runtime", "ops"), [
    # eager PyTorch converts the boolean mask first (convert_boolean_attn_mask)
    ("bool", "eager", ["Where", "Attention"]),
    ("bool", "cudagraph", ["Where", "Attention"]),
    ("float", "eager", ["Attention"]),  # an additive mask is read as it is
    ("bool", "graph", ["Attention"]),  # a compiled runtime's kernel reads the boolean mask
])
def test_an_onnx_attention_s_boolean_mask_is_converted_under_pytorch(mask, runtime, ops):
    f = _run(ONNX_ATTENTION.replace("M[", f"{mask}["), runtime)
    assert _ops(f) == ops


def test_the_converted_mask_is_read_at_the_query_s_dtype():
    # 128 mask elements: the conversion reads 128 bool bytes and writes 512 fp32 ones, which
    # the attention then reads, as it would read a float mask given directly
    converted = _run(ONNX_ATTENTION.replace("M[", "bool["))
    given = _run(ONNX_ATTENTION.replace("M[", "float["))
    where, att = (k.kernel.cost for k in converted.kernels)
    assert where.bytes == 128 + 512
    assert att == given.kernels[0].kernel.cost
