"""What ``tilecast collect`` measures: op names, their dims, default shape grid, shapes files.

Op names and dims follow the shared dataset's CSVs (``kernels/nvidia/train/<op>/<GPU>.csv``):
bmm/linear ``B, M, N, K``: ``(B x M x N) @ (B x N x K)``, N the reduction and the output M x K
(linear: B=1, ``Linear(N -> K)`` on M rows; the recorded launch grids are the evidence,
``learned.dataset.matmul_dims_of_row``); elementwise, softmax and
layer norm ``B, H`` (B rows of H elements); fused attention ``sdpa`` ``B, Heads, Seq,
Head_Dim, Causal`` (PyTorch's scaled_dot_product_attention, self-attention); conv ``B,
Input_Channel, Output_Channel, Kernel_Szie, Input_Size, Stride, Padding`` (the dataset's
spelling) plus ``Groups`` and
``Channels_Last`` (0: NCHW, 1: NHWC tensors), which a shapes file may leave out (1 and 0);
batch norm ``bn`` (inference, NCHW) ``B, Channels, Input_Size``.

Beyond the shared schema, the kernels eager PyTorch runs for a transformer layer that no shared
row measures (docs/predictor.md, "Open causes"): ``bmmt``, attention's ``Q K^T`` (a batched
product whose second operand, stored (B, N, K), is read transposed); the mask ops, which
broadcast an operand and so leave PyTorch's vectorized elementwise kernel (``addb`` adds a
(1, H) row to (B, H), ``whereb`` selects by a (1, H) bool mask against a 0-dim device tensor,
``maxt`` clamps against a 0-dim device tensor); ``and`` on bool tensors; ``cast`` to the
other float width (16-bit <-> fp32: what autocast inserts); ``permc``, the copy of permuted
attention heads (``B, H``: B tokens of H / 64 heads of 64, copied head-major, as
``.contiguous()`` or ``torch.matmul`` copies them: PyTorch's non-vectorized loop); and
``bnc``, an inference batch norm with fp32 weights and statistics whatever the input's dtype
(autocast's: cuDNN's kernel for fp16 input, PyTorch's own for bf16). Training reads none of
them yet
(``learned/dataset.py`` skips ops it does not model): they are the data a model input for
layout and broadcasting needs.

A Llama layer's and a training step's kernels: ``rms`` (RMS norm, ``B, H`` rows with a
gain), ``silu``; ``mmtn``, the weight gradient of a linear layer as autograd runs it
(``dY^T @ X``: the first operand stored (B, N, M) and read transposed; same ``B, M, N, K``
convention, N the reduction); ``convdx`` / ``convdw``, a convolution's data and weight
gradients (``aten.convolution_backward`` for one of them, the forward's dims); ``bnfw`` /
``bnbw``, batch norm's training forward (batch statistics) and its backward as autograd runs
it, ``B, Channels, Input_Size, Channels_Last`` (PyTorch's NCHW kernels run one block per
channel: docs/accuracy.md, "Training kernels on the H100").
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError

MATMUL_DIMS = ("B", "M", "N", "K")
ROW_DIMS = ("B", "H")
CONV_DIMS = ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
             "Padding", "Groups", "Channels_Last")
BN_DIMS = ("B", "Channels", "Input_Size")
# A training step's batch norm: the forward on batch statistics (``bnfw``) and autograd's
# backward of it (``bnbw``), in either layout (PyTorch runs other kernels for channels-last).
BN_TRAIN_DIMS = (*BN_DIMS, "Channels_Last")
BN_TRAIN_OPS = ("bnfw", "bnbw")
ATTENTION_DIMS = ("B", "Heads", "Seq", "Head_Dim", "Causal")
MATMUL_OPS = ("bmm", "bmmt", "linear", "mmtn")
CONV_OPS = ("conv", "convdx", "convdw")
# Trailing dims a shapes file may omit, with their defaults (older 7-column conv files).
OPTIONAL_DIMS: dict[str, tuple[int, ...]] = {op: (1, 0) for op in CONV_OPS}
ELEMENTWISE = ("add", "addu", "mul", "mulu", "div", "divu", "pow", "powu", "relu", "gelu",
               "tanh", "silu")
# Elementwise kernels outside the shared schema (module docstring): broadcast masks, bool, casts.
MASK_OPS = ("addb", "whereb", "maxt", "and", "cast")
LAYOUT_OPS = ("permc",)  # a permuted tensor's copy (module docstring)
HEAD_DIM = 64  # permc's head width (H / HEAD_DIM heads; 32 where H is no multiple of 64)
ROW_OPS = ELEMENTWISE + MASK_OPS + LAYOUT_OPS
BN_INFERENCE_OPS = ("bn", "bnc")
OP_DIMS: dict[str, tuple[str, ...]] = {
    **{op: MATMUL_DIMS for op in MATMUL_OPS}, "softmax": ROW_DIMS, "ln": ROW_DIMS,
    "rms": ROW_DIMS, **{op: CONV_DIMS for op in CONV_OPS},
    **{op: BN_DIMS for op in BN_INFERENCE_OPS},
    **{op: BN_TRAIN_DIMS for op in BN_TRAIN_OPS}, "sdpa": ATTENTION_DIMS,
    **{op: ROW_DIMS for op in ROW_OPS},
}
# Ops measured in one dtype whatever --dtype asks for (bool And: its operands are bool).
FIXED_DTYPES: dict[str, str] = {"and": "bool"}
FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": ("bmm", "bmmt", "mmtn"), "linear": ("linear",), "elementwise": ROW_OPS,
    "softmax": ("softmax",), "layernorm": ("ln", "rms"), "conv": ("conv",),
    "convbackward": ("convdx", "convdw"), "batchnorm": BN_INFERENCE_OPS,
    "batchnormtraining": BN_TRAIN_OPS, "attention": ("sdpa",),
}
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
SEED = 20250322  # fixed: the default grid must be the same on every machine


@dataclass(frozen=True)
class Shape:
    op: str
    dims: tuple[int, ...]

    @property
    def named(self) -> dict[str, int]:
        return dict(zip(OP_DIMS[self.op], self.dims, strict=True))


def parse_ops(text: str) -> tuple[str, ...]:
    """``matmul,softmax`` (families) or CSV op names (``add,bmm``) -> CSV op names."""
    ops: list[str] = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        if item in FAMILIES:
            ops.extend(FAMILIES[item])
        elif item in OP_DIMS:
            ops.append(item)
        else:
            known = ", ".join([*FAMILIES, *OP_DIMS])
            raise ConfigError(f"unknown op {item!r}: choose from {known}")
    return tuple(dict.fromkeys(ops))


def dtypes_for(op: str, dtypes: tuple[str, ...]) -> tuple[str, ...]:
    """The dtypes one op is measured in: the requested ones, or the op's fixed dtype."""
    return (FIXED_DTYPES[op],) if op in FIXED_DTYPES else dtypes


def parse_dtypes(text: str) -> tuple[str, ...]:
    out = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in out if d not in DTYPES]
    if bad or not out:
        raise ConfigError(f"unknown dtype {bad[0] if bad else text!r}: choose from "
                          f"{', '.join(DTYPES)}")
    return out


def read_shapes_file(path: Path, ops: tuple[str, ...]) -> list[Shape]:
    """Rows ``op,d1,d2,...`` (``#`` comments allowed); a malformed row names its line."""
    shapes = []
    with path.open(newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            op = row[0].strip()
            if op not in OP_DIMS:
                raise ConfigError(f"{path}:{lineno}: unknown op {op!r}")
            want = OP_DIMS[op]
            try:
                dims = tuple(int(x) for x in row[1:])
            except ValueError:
                raise ConfigError(f"{path}:{lineno}: dims must be integers, got "
                                  f"{','.join(row[1:])!r}") from None
            optional = OPTIONAL_DIMS.get(op, ())
            if len(want) - len(optional) <= len(dims) < len(want):
                dims += optional[len(dims) - len(want):]
            if len(dims) != len(want):
                raise ConfigError(f"{path}:{lineno}: {op} needs {len(want)} dims "
                                  f"({', '.join(want)}), got {len(dims)}")
            bad = bad_dim(dict(zip(want, dims, strict=True)))
            if bad:
                raise ConfigError(f"{path}:{lineno}: {op} {bad}")
            if op in ops:
                shapes.append(Shape(op, dims))
    return shapes


# Dims that may be 0 (a 1x1 conv has no padding) and flags that are 0 or 1; all others > 0.
ZERO_DIMS = ("Padding",)
FLAG_DIMS = ("Channels_Last", "Causal")


def bad_dim(named: dict[str, int]) -> str | None:
    """What is wrong with one row's dims, naming the dim; None when they are valid."""
    for name, value in named.items():
        if name in FLAG_DIMS and value not in (0, 1):
            return f"{name} must be 0 or 1, got {value}"
        if name in ZERO_DIMS and value < 0:
            return f"{name} must be 0 or more, got {value}"
        if name not in FLAG_DIMS + ZERO_DIMS and value <= 0:
            return f"{name} must be positive, got {value}"
    return None


def _log_uniform(rng: np.random.Generator, lo: int, hi: int, n: int, multiple: int = 1):
    vals = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    return [max(multiple, int(round(v / multiple)) * multiple) for v in vals]


def default_grid(op: str, per_op: int = 200) -> list[Shape]:
    """A log-uniform sample over the shared dataset's ranges (same seed everywhere)."""
    # A conv's gradients sample the forward's grid (same shapes): forward and backward pair up.
    rng = np.random.default_rng(SEED + sum(map(ord, "conv" if op in CONV_OPS else op)))
    if op in MATMUL_OPS:
        b = [1] * per_op if op == "linear" else _log_uniform(rng, 1, 512, per_op)
        mnk = [_log_uniform(rng, 16, 8192, per_op, 16) for _ in range(3)]
        return [Shape(op, (b[i], mnk[0][i], mnk[1][i], mnk[2][i])) for i in range(per_op)]
    if op in CONV_OPS:
        return [Shape(op, s.dims) for s in _conv_grid(rng, per_op)]
    if op == "sdpa":
        return _attention_grid(rng, per_op)
    if op in BN_TRAIN_OPS:  # the inference grid's shapes, in both layouts
        return [Shape(op, (*s.dims, int(rng.integers(0, 2)))) for s in default_grid("bn", per_op)]
    if op in BN_INFERENCE_OPS:
        return [Shape(op, (int(rng.choice([1, 2, 4, 8, 16, 32, 64])),
                           int(rng.choice([16, 32, 64, 128, 256, 512, 1024, 2048])),
                           int(rng.choice([7, 14, 28, 56, 112]))))
                for _ in range(per_op)]
    rows = _log_uniform(rng, 1, 65536, per_op)
    cols = _log_uniform(rng, 32, 16384, per_op, 32)
    return [Shape(op, (rows[i], cols[i])) for i in range(per_op)]


# Attention inputs up to this many elements per tensor (Q, K, V, O: 4 x 64 Mi x 2 bytes in
# fp16), so that every shape of the grid fits on any GPU the plan runs on.
ATTENTION_MAX_ELEMENTS = 2**26


def _attention_grid(rng: np.random.Generator, per_op: int) -> list[Shape]:
    """Heads of 64 or 128 (and 80, 96: Phi, Gemma-style), 128 to 16384 tokens, causal or not,
    batches up to what fits."""
    out = []
    for seq in _log_uniform(rng, 128, 16384, per_op, 64):
        dim = int(rng.choice([64, 64, 128, 128, 80, 96]))
        fit = [h for h in (8, 12, 16, 32, 40, 64) if h * seq * dim <= ATTENTION_MAX_ELEMENTS]
        heads = int(rng.choice(fit))  # 8 heads of 128 at 16384 tokens: 16 Mi, always fits
        most = ATTENTION_MAX_ELEMENTS // (heads * seq * dim)
        b = int(rng.choice([x for x in (1, 2, 4, 8, 16, 32) if x <= most]))
        out.append(Shape("sdpa", (b, heads, seq, dim, int(rng.integers(0, 2)))))
    return out


# Conv kinds of CNNs: dense (1x1, 3x3, 7x7 stem; stride 1 or 2), grouped (ResNeXt: 32
# groups) and depthwise (MobileNet: groups = channels), each in NCHW and channels-last.
CONV_KINDS = ("dense", "dense", "grouped", "depthwise")


def _conv_grid(rng: np.random.Generator, per_op: int) -> list[Shape]:
    out = []
    for _ in range(per_op):
        kind = str(rng.choice(CONV_KINDS))
        k = int(rng.choice([1, 3, 3, 7] if kind == "dense" else [3, 5]))
        c = int(rng.choice([3, 16, 32, 64, 128, 256, 512] if kind == "dense"
                           else [32, 64, 128, 256, 512]))
        cout = {"dense": int(rng.choice([16, 32, 64, 128, 256, 512])), "grouped": c,
                "depthwise": c}[kind]
        groups = {"dense": 1, "grouped": 32, "depthwise": c}[kind]
        out.append(Shape("conv", (int(rng.choice([1, 2, 4, 8, 16, 32])), c, cout, k,
                                  int(rng.choice([7, 14, 28, 56, 112, 224])),
                                  int(rng.choice([1, 2])), k // 2, groups,
                                  int(rng.choice([0, 1])))))
    return out


def _config_sizes(cfg: dict) -> tuple[int, int, int] | None:
    get = lambda *ks: next((cfg[k] for k in ks if isinstance(cfg.get(k), int)), None)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model")
    heads = get("num_attention_heads", "n_head", "num_heads")
    if not hidden or not heads:
        return None
    return hidden, heads, get("intermediate_size", "n_inner", "d_ff", "ffn_dim") or 4 * hidden


# Rows of a decode step's linears (one new token per sequence: the batch), where a GEMM reads
# its weight once and is memory-bound: the learned predictor's tensor-core streaming rule
# (learned/tensor_core.py) rests on physics and public benchmarks until these are measured.
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def _projections(h: int, ffn: int) -> tuple[tuple[int, int], ...]:
    """(in, out) features of a transformer layer's linears: fused QKV, output, MLP up, down."""
    return (h, 3 * h), (h, h), (h, ffn), (ffn, h)


def zoo_shapes(op: str, configs: list[Path], batches=(1, 8), seqs=(512, 2048)) -> list[Shape]:
    """The kernels of transformer layers of the given configs (linear, attention, rows), and
    for linears their decode steps too (``DECODE_ROWS`` rows). ``bmm`` also gets the linears'
    prefill shapes as batch-1 products: a weight stored (in, out) and multiplied as it is
    (Hugging Face GPT-2's ``Conv1D``, an ONNX ``Gemm`` with ``transB`` 0) runs cuBLAS's "nn"
    kernels, which the shared data holds almost only for batched shapes (docs/predictor.md,
    "Tried and rejected")."""
    out = []
    for path in configs:
        sizes = _config_sizes(json.loads(path.read_text()))
        if sizes is None:
            continue
        h, heads, ffn = sizes
        if op == "linear":
            out += [Shape(op, (1, m, i, o)) for m in DECODE_ROWS for i, o in _projections(h, ffn)]
        for b in batches:
            for s in seqs:
                t = b * s
                out += {
                    "linear": [Shape(op, (1, t, i, o)) for i, o in _projections(h, ffn)],
                    # causal (decoders) and not (encoders), whichever the model is
                    "sdpa": [Shape(op, (b, heads, s, h // heads, c)) for c in (1, 0)],
                    # Q K^T (reduce over the head) and P V (reduce over the keys)
                    "bmm": [Shape(op, (b * heads, s, h // heads, s)),
                            Shape(op, (b * heads, s, s, h // heads)),
                            *(Shape(op, (1, t, i, o)) for i, o in _projections(h, ffn))],
                    # Q K^T as eager attention runs it (the "bmm" row above is its "nn" twin)
                    "bmmt": [Shape(op, (b * heads, s, h // heads, s))],
                    "softmax": [Shape(op, (b * heads * s, s))],
                    "ln": [Shape(op, (t, h))],
                    "rms": [Shape(op, (t, h))],
                    # a linear's weight gradient: dY^T (out x tokens) @ X (tokens x in)
                    "mmtn": [Shape(op, (1, o, t, i)) for i, o in _projections(h, ffn)],
                    # the masks act on the attention scores; a cast on the hidden states
                    **{m: [Shape(op, (b * heads * s, s))] for m in MASK_OPS if m != "cast"},
                    "cast": [Shape(op, (t, h))],
                    "permc": [Shape(op, (t, h))],  # the heads' copy of the hidden states
                }.get(op, [Shape(op, (t, ffn))] if op in ELEMENTWISE else [])
    return list(dict.fromkeys(out))
