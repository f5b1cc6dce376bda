"""Read an ONNX model without its weight bytes: dims, dtypes and small constants only.

A model file is memory-mapped and walked at the protobuf wire level; every tensor larger than
``KEEP_BYTES`` (initializers, and the ``value`` of Constant nodes) is copied without its data
fields, so a 500 MB model costs a few MB to load and the weight pages are never read. Small
tensors keep their data: shape arithmetic (Reshape targets, Slice bounds, scalars) needs it.
A dropped matrix that may be a folded attention mask (a mask's dtype, every leading dim 1) has
four of its elements read, and all of them if those look like a mask's; a band mask is kept
as a tag in the tensor's ``doc_string`` (band_values.py), inline or in an external data file.
So is a dropped float vector whose bytes are all zero (``ZEROS_TAG``): torch.onnx writes a
Conv that has no bias with an all-zero bias initializer (zero_bias.py).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from .band_values import BandValues, band_of, encode, may_be_mask

# Tensors whose serialized form is larger than this are weights for tilecast's purpose: an int64
# shape constant of 512 elements still fits (8 bytes each), a 32 x 32 float matrix does not.
KEEP_BYTES = 4096
# ... but integer index vectors are kept up to this size: a causal mask is built from two
# position ranges (``arange(seq)``, 8 bytes per position) that decide which (query, key) pairs
# a fused attention kernel computes (causal.py). Integer tensors are never float weights; an
# int8 / uint8 quantized weight keeps the small limit.
KEEP_INDEX_BYTES = 1 << 20
INDEX_DTYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_RAW_DATA, TENSOR_DOC_STRING = 1, 2, 9, 12
# Dropped tensors whose values are read once to see whether they are a folded attention mask
# (band_values.py): the dtypes masks come in, up to a 4,096 x 4,096 fp32 matrix.
MASK_DTYPES = {onnx.TensorProto.FLOAT: np.dtype(np.float32),
               onnx.TensorProto.FLOAT16: np.dtype(np.float16),
               onnx.TensorProto.BFLOAT16: np.dtype(np.uint16),
               onnx.TensorProto.DOUBLE: np.dtype(np.float64),
               onnx.TensorProto.BOOL: np.dtype(np.bool_),
               onnx.TensorProto.UINT8: np.dtype(np.uint8)}
MASK_SCAN_BYTES = 64 << 20
ZEROS_TAG = "tilecast:zeros"
# Vectors up to this size are read to see whether they are all zero: a bias of 262,144 fp32
# channels, far past any conv's or linear's.
ZERO_SCAN_BYTES = 1 << 20
FLOAT_DTYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE})
# TensorProto fields holding data: float_data, int32_data, string_data, int64_data, raw_data,
# double_data, uint64_data (onnx.proto3 field numbers).
TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 9, 10, 11})
MODEL_GRAPH, GRAPH_NODE, GRAPH_INITIALIZER, NODE_ATTRIBUTE = 7, 1, 5, 5
ATTRIBUTE_TENSOR, ATTRIBUTE_TENSORS = 5, 10
LENGTH_DELIMITED = 2


class Malformed(ValueError):
    """The bytes are not a protobuf message."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview, start: int, end: int):
    """Yield (field number, wire type, span start, value start, span end) of each field."""
    pos = start
    while pos < end:
        span = pos
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        value = pos
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == LENGTH_DELIMITED:
            n, value = _varint(buf, pos, end)
            pos = value + n
        else:
            raise Malformed(f"unsupported wire type {wire}")
        if pos > end or field == 0:
            raise Malformed("field runs past its message")
        yield field, wire, span, value, pos


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _delimited(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _rewrite(buf: memoryview, start: int, end: int, big: dict[int, object],
             keep: int = KEEP_BYTES) -> bytes:
    """Copy a message, rewriting its length-delimited fields listed in ``big`` that are longer
    than ``keep`` bytes (field number -> rewriter, or None to drop the field)."""
    parts = []
    for field, wire, span, value, stop in _fields(buf, start, end):
        if field in big and wire == LENGTH_DELIMITED and stop - value > keep:
            fn = big[field]
            if fn is not None:
                parts.append(_delimited(field, fn(buf, value, stop)))
        else:
            parts.append(bytes(buf[span:stop]))
    return b"".join(parts)


def _tensor(buf: memoryview, start: int, end: int) -> bytes:
    dims: list[int] = []
    dtype, raw = None, None
    for f, wire, _, v, stop in _fields(buf, start, end):
        if f == TENSOR_DIMS and wire == 0:
            dims.append(_varint(buf, v, stop)[0])
        elif f == TENSOR_DIMS and wire == LENGTH_DELIMITED:  # packed
            while v < stop:
                d, v = _varint(buf, v, stop)
                dims.append(d)
        elif f == TENSOR_DATA_TYPE and wire == 0:
            dtype = _varint(buf, v, stop)[0]
        elif f == TENSOR_RAW_DATA and wire == LENGTH_DELIMITED:
            raw = (v, stop)
    keep = KEEP_INDEX_BYTES if dtype in INDEX_DTYPES else KEEP_BYTES
    out = _rewrite(buf, start, end, dict.fromkeys(TENSOR_DATA_FIELDS), keep)
    tag = None
    if raw is not None and raw[1] - raw[0] > keep:
        tag = _tag(lambda a, n: bytes(buf[raw[0] + a:raw[0] + a + n]), dims, dtype,
                   raw[1] - raw[0])
    return out if tag is None else out + _delimited(TENSOR_DOC_STRING, tag.encode())


def _tag(read: Callable[[int, int], bytes], dims: list[int], dtype: int | None, length: int
         ) -> str | None:
    """What a dropped tensor's ``doc_string`` keeps of its values: a band mask's band, or
    ``ZEROS_TAG`` for a float vector of zeros; None for anything else."""
    if len(dims) == 1 and dtype in FLOAT_DTYPES and length <= ZERO_SCAN_BYTES:
        data = read(0, length)  # a short external file is no evidence of zeros
        zeros = len(data) == length and not np.frombuffer(data, np.uint8).any()
        return ZEROS_TAG if zeros else None
    band = _band(read, dims, dtype, length)
    return None if band is None else encode(band)


def _band(read: Callable[[int, int], bytes], dims: list[int], dtype: int | None, length: int
          ) -> BandValues | None:
    """The band a dropped tensor's values hold, if they are a band mask (band_values.py);
    ``read(offset, n)``: n bytes of its data. Four elements are read unless they look like a
    mask's."""
    np_dtype = MASK_DTYPES.get(dtype) if dtype is not None else None
    if np_dtype is None or length > MASK_SCAN_BYTES or len(dims) < 2 \
            or math.prod(dims[:-2]) != 1 or math.prod(dims) * np_dtype.itemsize != length:
        return None
    sq, skv, size = dims[-2], dims[-1], np_dtype.itemsize
    corners = [0, skv - 1, (sq - 1) * skv, sq * skv - 1]
    probe = np.frombuffer(b"".join(read(e * size, size) for e in corners), np_dtype)
    if not may_be_mask(_widen(probe, dtype)):
        return None
    values = np.frombuffer(read(0, length), np_dtype).reshape(sq, skv)  # a copy
    return band_of(_widen(values, dtype))


def tag_external_values(model: onnx.ModelProto, base: Path) -> None:
    """Tag the initializers stored in an external data file next to the model whose values
    are a band mask or a vector of zeros, as ``_tensor`` tags inline ones. A file that is
    missing, outside the model's folder or short leaves its tensors untagged (a mask then
    counts every pair, a zero bias is read as a bias)."""
    root = base.resolve()
    with ExitStack() as files:
        opened: dict[Path, BinaryIO | None] = {}
        for t in model.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL or (
                    t.data_type not in MASK_DTYPES and t.data_type not in FLOAT_DTYPES):
                continue
            info = {e.key: e.value for e in t.external_data}
            try:
                path = (root / info.get("location", "")).resolve()
                offset, length = int(info.get("offset", 0)), int(info["length"])
                if path not in opened:  # each data file opened once
                    inside = path.is_relative_to(root) and path.is_file()
                    opened[path] = files.enter_context(open(path, "rb")) if inside else None
                fh = opened[path]
                tag = None if fh is None else _tag(_reader(fh, offset), list(t.dims),
                                                    t.data_type, length)
            except (KeyError, ValueError, OSError):
                continue
            if tag is not None:
                t.doc_string = tag


def _reader(fh: BinaryIO, offset: int) -> Callable[[int, int], bytes]:
    def read(a: int, n: int) -> bytes:
        fh.seek(offset + a)
        return fh.read(n)

    return read


def _widen(a: np.ndarray, dtype: int) -> np.ndarray:
    """bfloat16 bits (read as uint16) as the float32 values they are."""
    if dtype != onnx.TensorProto.BFLOAT16:
        return a
    return (a.astype(np.uint32) << 16).view(np.float32)


def _attribute(buf: memoryview, start: int, end: int) -> bytes:
    return _rewrite(buf, start, end, {ATTRIBUTE_TENSOR: _tensor, ATTRIBUTE_TENSORS: _tensor})


def _node(buf: memoryview, start: int, end: int) -> bytes:
    return _rewrite(buf, start, end, {NODE_ATTRIBUTE: _attribute})


def _graph(buf: memoryview, start: int, end: int) -> bytes:
    return _rewrite(buf, start, end, {GRAPH_INITIALIZER: _tensor, GRAPH_NODE: _node})


def strip_bytes(buf: memoryview) -> onnx.ModelProto:
    """Parse a serialized model, leaving out the data of every large tensor."""
    parts = []
    for field, wire, span, value, stop in _fields(buf, 0, len(buf)):
        if field == MODEL_GRAPH and wire == LENGTH_DELIMITED:
            parts.append(_delimited(field, _graph(buf, value, stop)))
        else:
            parts.append(bytes(buf[span:stop]))
    return onnx.ModelProto.FromString(b"".join(parts))


def load_weightless(path: Path) -> onnx.ModelProto:
    """The model at ``path`` without weight bytes. Raises ``Malformed`` or ``DecodeError``
    (the caller words the error) when the file is not a protobuf message."""
    with open(path, "rb") as fh:
        if fh.seek(0, 2) == 0:
            raise Malformed("empty file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                model = strip_bytes(view)
            finally:
                view.release()
    tag_external_values(model, path.parent)
    return model


def strip_proto(model: onnx.ModelProto) -> onnx.ModelProto:
    """A weightless copy of an in-memory model (the caller's proto is never changed)."""
    data = model.SerializeToString()
    try:
        return strip_bytes(memoryview(data))
    except (Malformed, DecodeError):  # cannot happen for a proto we serialized ourselves
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy


def has_data(t: onnx.TensorProto) -> bool:
    """Whether a tensor holds its values here (not stripped, not stored in an external file)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return False
    if any(d == 0 for d in t.dims):
        return True  # an empty tensor has nothing to hold
    return bool(t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data
                or t.uint64_data or t.string_data)
