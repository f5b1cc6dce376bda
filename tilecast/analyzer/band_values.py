"""Which constant matrices are attention masks over a band of key - query offsets.

An exporter may fold a causal mask into a constant: ``torch.onnx``'s dynamo exporter turns
``nn.Transformer.generate_square_subsequent_mask(S)`` (0 on and below the diagonal, -inf
above) into an (S, S) float initializer. Such a tensor is as large as a weight, so the
weightless reader would drop its bytes; instead it reads the values once, while the file is
mapped, and when they are a band (row i visible exactly at keys i + lo .. i + hi, additive
0 / very negative or boolean) it keeps that finding in the tensor's ``doc_string``
(``encode`` / ``decode``) and drops the bytes as for any weight. ``causal.py`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HIDDEN_BELOW = -1.0e4  # a score plus this is exp() == 0 in fp16/bf16/fp32 softmax
TAG = "tilecast:band"


@dataclass(frozen=True)
class BandValues:
    """Visible where ``lo <= key - query <= hi`` (None: no edge inside the matrix);
    ``additive``: 0 there and very negative elsewhere, else True / nonzero there."""

    lo: int | None
    hi: int | None
    additive: bool


def _visible(m: np.ndarray) -> tuple[np.ndarray, bool] | None:
    if m.dtype == np.bool_:
        return m, False
    if np.issubdtype(m.dtype, np.floating) and bool(np.all((m == 0) | (m <= HIDDEN_BELOW))):
        return m == 0, True
    if bool(np.all((m == 0) | (m == 1))):  # a 0 / 1 float or integer matrix
        return m != 0, False
    return None


def may_be_mask(values: np.ndarray) -> bool:
    """Whether these few elements are all a mask's (0 / very negative, 0 / 1 or bool)."""
    return _visible(values) is not None


def band_of(a: np.ndarray) -> BandValues | None:
    """The band an (..., Sq, Skv) constant with every leading dim 1 holds, if it is one."""
    if a.ndim < 2 or min(a.shape[-2:]) < 2 or a.size != a.shape[-2] * a.shape[-1]:
        return None
    m = a.reshape(a.shape[-2:])
    if not may_be_mask(m[[0, 0, -1, -1], [0, -1, 0, -1]]):  # a weight fails at once
        return None
    found = _visible(m)
    if found is None or not found[0].any():
        return None
    visible, additive = found
    sq, skv = m.shape
    d = np.arange(skv)[None, :] - np.arange(sq)[:, None]
    lo, hi = int(d[visible].min()), int(d[visible].max())
    if not np.array_equal(visible, (d >= lo) & (d <= hi)):
        return None
    return BandValues(None if lo == -(sq - 1) else lo, None if hi == skv - 1 else hi, additive)


def encode(b: BandValues) -> str:
    return f"{TAG} {b.lo} {b.hi} {int(b.additive)}"


def decode(doc: str) -> BandValues | None:
    parts = doc.split()
    if len(parts) != 4 or parts[0] != TAG:
        return None
    lo, hi = (None if p == "None" else int(p) for p in parts[1:3])
    return BandValues(lo, hi, parts[3] == "1")
