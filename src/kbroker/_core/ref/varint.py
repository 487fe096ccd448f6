"""Pure-Python twin of :mod:`kbroker._core.varint` (Kafka varints).

Same API, results and error classes as the compiled kernel; see its module
docstring for the encodings. Reference: org.apache.kafka.common.utils.ByteUtils.
"""
from __future__ import annotations

import operator

from kbroker._core.errors import CorruptRecordError

__all__ = [
    "decode_unsigned_varint",
    "decode_varint",
    "decode_varlong",
    "encode_unsigned_varint",
    "encode_varint",
    "encode_varlong",
    "size_of_unsigned_varint",
    "size_of_varint",
    "size_of_varlong",
]

_MAX_VARINT_BYTES = 5
_MAX_VARLONG_BYTES = 10
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _int_in(v, lo: int, hi: int, what: str, kind: str) -> int:
    i = operator.index(v)
    if not lo <= i <= hi:
        raise ValueError(f"{what} out of {kind} range: {i}")
    return i


def _zigzag32(v) -> int:
    i = _int_in(v, -(1 << 31), (1 << 31) - 1, "varint", "int32")
    return ((i << 1) ^ (i >> 31)) & _U32


def _zigzag64(v) -> int:
    i = _int_in(v, -(1 << 63), (1 << 63) - 1, "varlong", "int64")
    return ((i << 1) ^ (i >> 63)) & _U64


def _write_unsigned(u: int) -> bytes:
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _size_unsigned(u: int) -> int:
    n = 1
    while u >= 0x80:
        u >>= 7
        n += 1
    return n


def _read_unsigned(buf, pos: int, max_bytes: int, what: str) -> tuple[int, int]:
    """(raw unsigned value, next_pos); never reads past max_bytes bytes."""
    pos = operator.index(pos)
    if pos < 0:
        raise ValueError(f"pos must be >= 0, got {pos}")
    with memoryview(buf) as view:
        if not view.c_contiguous:
            raise TypeError("varint decoding needs a C-contiguous buffer")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        end = len(view)
        result = 0
        shift = 0
        for i in range(pos, pos + max_bytes):
            if i >= end:
                raise CorruptRecordError(f"truncated {what} at position {pos}")
            b = view[i]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result, i + 1
            shift += 7
    raise CorruptRecordError(f"{what} longer than {max_bytes} bytes at position {pos}")


def encode_varint(v) -> bytes:
    """Zigzag varint of an int32 (1-5 bytes)."""
    return _write_unsigned(_zigzag32(v))


def encode_varlong(v) -> bytes:
    """Zigzag varint of an int64 (1-10 bytes)."""
    return _write_unsigned(_zigzag64(v))


def encode_unsigned_varint(v) -> bytes:
    """Unsigned varint of a uint32 (1-5 bytes, no zigzag)."""
    return _write_unsigned(_int_in(v, 0, _U32, "unsigned varint", "uint32"))


def decode_varint(buf, pos: int = 0) -> tuple[int, int]:
    """(int32 value, next_pos) of the zigzag varint at buf[pos:]."""
    raw, nxt = _read_unsigned(buf, pos, _MAX_VARINT_BYTES, "varint")
    raw &= _U32  # like Java: bits beyond 32 in the 5th byte are dropped
    return (raw >> 1) ^ -(raw & 1), nxt


def decode_varlong(buf, pos: int = 0) -> tuple[int, int]:
    """(int64 value, next_pos) of the zigzag varlong at buf[pos:]."""
    raw, nxt = _read_unsigned(buf, pos, _MAX_VARLONG_BYTES, "varlong")
    raw &= _U64  # like Java: bits beyond 64 in the 10th byte are dropped
    return (raw >> 1) ^ -(raw & 1), nxt


def decode_unsigned_varint(buf, pos: int = 0) -> tuple[int, int]:
    """(uint32 value, next_pos) of the unsigned varint at buf[pos:]."""
    raw, nxt = _read_unsigned(buf, pos, _MAX_VARINT_BYTES, "unsigned varint")
    return raw & _U32, nxt


def size_of_varint(v) -> int:
    """Encoded length of encode_varint(v)."""
    return _size_unsigned(_zigzag32(v))


def size_of_varlong(v) -> int:
    """Encoded length of encode_varlong(v)."""
    return _size_unsigned(_zigzag64(v))


def size_of_unsigned_varint(v) -> int:
    """Encoded length of encode_unsigned_varint(v)."""
    return _size_unsigned(_int_in(v, 0, _U32, "unsigned varint", "uint32"))
