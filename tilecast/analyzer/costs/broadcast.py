"""Broadcast operands that elementwise kernels read more than once.

``bytes`` counts each tensor once (unique DRAM bytes). A kernel over the output in row-major
order reads a broadcast operand again each time a broadcast dim repeats: OPT's attention mask
``[b, 1, s, s]`` added to the scores ``[b, h, s, s]`` is read once per head, a 16.8 MB slice
per batch at s = 2048 (fp32). No cache serves a repeat of a slice larger than itself, so
at least the part of the slice beyond the L2 comes from DRAM again. The GPU decides, so the
analyzer records the extra reads and the slice (``BroadcastReread``); the predictor charges
that lower bound (``learned.features.broadcast_misses``).

Evidence, from the per-node CSVs of the shared labels (OPT-1.3B batch 2, fp32):
- The mask add moves 2.18 GB of unique bytes, plus 1.04 GB if every head reads the mask again.
- Priced at each GPU's own elementwise rate, the unique bytes alone come to 0.58-0.79x of
  the measured time on seven GPUs. With every re-read, 0.92-1.06x, the 40-48 MB L2s of the
  A100 and L4 included.
- Smaller sets stay: GPT-2's 1 MB bool causal mask, read again for each of 80 heads, costs
  its `where` nothing extra on the 2 MB and 4 MB L2s of the P4 and T4.

The bound charges the first case only where the slice outgrows the L2 (docs/predictor.md,
"Broadcast elementwise ops").
"""

from __future__ import annotations

from ..types import BroadcastReread, NodeView, TensorInfo
from .common import prod

Shape = tuple[int, ...]


def _aligned(shape: Shape, rank: int) -> Shape:
    """Numpy broadcasting: dims line up from the right."""
    return (1,) * (rank - len(shape)) + shape


def _inner_bytes(t: TensorInfo, rank: int, dim: int) -> float:
    """Bytes of ``t`` one step of output dim ``dim`` walks (its dims after ``dim``): the slice
    read again at the next step."""
    return prod(_aligned(t.shape, rank)[dim + 1:]) * t.itemsize


def _operand(t: TensorInfo, out: Shape) -> BroadcastReread | None:
    """The re-reads of one operand, or None when it is read once (a scalar, a same-shape
    tensor, or one broadcast only inside its innermost dims: those repeats follow each other
    and hit the L1)."""
    s = _aligned(t.shape, len(out))
    real = [d for d in range(len(out)) if s[d] == out[d] and out[d] > 1]
    if not real:
        return None
    # Broadcast dims with a real operand dim inside them: each repeat walks the operand again.
    outer = [d for d in range(real[-1]) if s[d] == 1 and out[d] > 1]
    if not outer:
        return None
    repeats = prod(out[d] for d in outer)
    return BroadcastReread(int((repeats - 1) * t.nbytes),
                           int(_inner_bytes(t, len(out), outer[-1])), int(t.nbytes))


def broadcast_reread(node: NodeView) -> BroadcastReread | None:
    """The largest broadcast operand's re-reads (None if no input is broadcast that way).
    Operands of unknown shape are skipped: the op's own cost formula reports them."""
    outs = [t for t in node.outputs if t.name and t.known]
    ins = [t for t in node.inputs if t is not None and t.name and t.known]
    if not outs or not ins:
        return None
    out = outs[0].shape
    if any(len(t.shape) > len(out) for t in ins):
        return None
    found = [r for t in ins if (r := _operand(t, out)) is not None]
    return max(found, key=lambda r: r.bytes, default=None)


def broadcasts_a_tensor(node: NodeView) -> bool:
    """Whether an input of more than one element is broadcast against the output: a dim the
    output has and the input lacks (size 1 or missing). TensorIterator then gives that
    operand a stride of 0, the operands are no longer one contiguous run, and PyTorch runs
    the op on its non-vectorized loop (``analyzer.native``): BERT's padding mask
    ``[b, 1, 1, s]`` added to the scores ``[b, h, s, s]``, a position embedding
    ``[1, s, d]`` added to ``[b, s, d]``. A one-element operand is left out: a Python scalar
    is passed to the vector kernel as an argument, and the graph does not say whether the
    value was one (a 0-dim device tensor takes the loop)."""
    outs = [t for t in node.outputs if t.name and t.known]
    if not outs:
        return False
    out = outs[0].shape
    for t in node.inputs:
        if t is None or not t.name or not t.known or t.numel <= 1 or len(t.shape) > len(out):
            continue
        s = _aligned(t.shape, len(out))
        if any(s[d] != out[d] for d in range(len(out))):
            return True
    return False
