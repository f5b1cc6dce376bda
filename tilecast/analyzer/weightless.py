"""Read an ONNX model without its weight bytes: dims, dtypes and small constants only.

A model file is memory-mapped and walked at the protobuf wire level; every tensor larger than
``KEEP_BYTES`` (initializers, and the ``value`` of Constant nodes) is copied without its data
fields, so a 500 MB model costs a few MB to load and the weight pages are never read. Small
tensors keep their data: shape arithmetic (Reshape targets, Slice bounds, scalars) needs it.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

# Tensors whose serialized form is larger than this are weights for tilecast's purpose: an int64
# shape constant of 512 elements still fits (8 bytes each), a 32 x 32 float matrix does not.
KEEP_BYTES = 4096
# ... but integer index vectors are kept up to this size: a causal mask is built from two
# position ranges (``arange(seq)``, 8 bytes per position) that decide which (query, key) pairs
# a fused attention kernel computes (causal.py). Integer tensors are never float weights; an
# int8 / uint8 quantized weight keeps the small limit.
KEEP_INDEX_BYTES = 1 << 20
INDEX_DTYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})
TENSOR_DATA_TYPE = 2  # TensorProto.data_type (varint)
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
    index = any(f == TENSOR_DATA_TYPE and wire == 0 and _varint(buf, v, stop)[0] in INDEX_DTYPES
                for f, wire, _, v, stop in _fields(buf, start, end))
    return _rewrite(buf, start, end, dict.fromkeys(TENSOR_DATA_FIELDS),
                    KEEP_INDEX_BYTES if index else KEEP_BYTES)


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
                return strip_bytes(view)
            finally:
                view.release()


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
