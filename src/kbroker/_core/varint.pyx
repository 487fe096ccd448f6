# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Kafka varints: Python-level API over the inline readers/writers in varint.pxd.

Encoding (org.apache.kafka.common.utils.ByteUtils): little-endian base-128
groups of 7 bits, high bit = "more bytes follow".

========================  =========  ===========================================
kind                      max bytes  value range / use
========================  =========  ===========================================
varint   (zigzag)         5          int32; record fields (lengths, deltas)
varlong  (zigzag)         10         int64; record timestamp/offset deltas
unsigned varint           5          uint32; compact lengths/arrays (N+1, 0=null)
========================  =========  ===========================================

Zigzag maps 0, -1, 1, -2, ... to 0, 1, 2, 3, ... so small negative numbers
stay short. As in Java, the last allowed byte (5th / 10th) may carry bits
beyond 32 / 64; they are dropped. Truncated input, or a continuation bit on
the last allowed byte, raises CorruptRecordError. Encoders raise ValueError
for values outside the type's range. decode_* return ``(value, next_pos)``.

Every function here goes through the varint.pxd inline functions that the
record kernels cimport, so the tests of this module test those too.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from kbroker._core.errors import CorruptRecordError

cdef enum:
    _MAX_VARINT_BYTES = 5
    _MAX_VARLONG_BYTES = 10

cdef int64_t _INT32_MIN = -0x80000000
cdef int64_t _INT32_MAX = 0x7FFFFFFF


cdef int _acquire(object buf, Py_buffer* view, Py_ssize_t pos) except -1:
    if pos < 0:
        raise ValueError(f"pos must be >= 0, got {pos}")
    try:
        PyObject_GetBuffer(buf, view, PyBUF_SIMPLE)
    except (BufferError, ValueError) as exc:  # exporter cannot give a flat C-contiguous view
        raise TypeError(f"varint decoding needs a C-contiguous buffer: {exc}") from None
    return 0


cdef object _corrupt(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                     int max_bytes, str what):
    """The CorruptRecordError for a failed read at pos (truncated or over-long)."""
    cdef Py_ssize_t i = pos
    while i < end and i - pos < max_bytes and (p[i] & 0x80):
        i += 1
    if i - pos >= max_bytes:
        return CorruptRecordError(f"{what} longer than {max_bytes} bytes at position {pos}")
    return CorruptRecordError(f"truncated {what} at position {pos}")


cdef int64_t _int32_arg(object v, str what) except? -1:
    cdef object i = PyNumber_Index(v)
    if not (_INT32_MIN <= i <= _INT32_MAX):
        raise ValueError(f"{what} out of int32 range: {i}")
    return <int64_t>i


cdef int64_t _int64_arg(object v, str what) except? -1:
    cdef object i = PyNumber_Index(v)
    try:
        return <int64_t>i
    except OverflowError:
        raise ValueError(f"{what} out of int64 range: {i}") from None


cdef uint32_t _uint32_arg(object v, str what) except? 0xFFFFFFFF:
    cdef object i = PyNumber_Index(v)
    if not (0 <= i <= 0xFFFFFFFF):
        raise ValueError(f"{what} out of uint32 range: {i}")
    return <uint32_t>i


def encode_varint(v) -> bytes:
    """Zigzag varint of an int32 (1-5 bytes)."""
    cdef unsigned char tmp[_MAX_VARINT_BYTES]
    cdef int n = write_varint(tmp, <int32_t>_int32_arg(v, "varint"))
    return PyBytes_FromStringAndSize(<char*>tmp, n)


def encode_varlong(v) -> bytes:
    """Zigzag varint of an int64 (1-10 bytes)."""
    cdef unsigned char tmp[_MAX_VARLONG_BYTES]
    cdef int n = write_varlong(tmp, _int64_arg(v, "varlong"))
    return PyBytes_FromStringAndSize(<char*>tmp, n)


def encode_unsigned_varint(v) -> bytes:
    """Unsigned varint of a uint32 (1-5 bytes, no zigzag)."""
    cdef unsigned char tmp[_MAX_VARINT_BYTES]
    cdef int n = write_uvarint64(tmp, _uint32_arg(v, "unsigned varint"))
    return PyBytes_FromStringAndSize(<char*>tmp, n)


def decode_varint(buf, Py_ssize_t pos=0):
    """(int32 value, next_pos) of the zigzag varint at buf[pos:]."""
    cdef Py_buffer view
    cdef int32_t value = 0
    cdef Py_ssize_t nxt
    _acquire(buf, &view, pos)
    try:
        nxt = read_varint(<const unsigned char*>view.buf, pos, view.len, &value)
        if nxt < 0:
            raise _corrupt(<const unsigned char*>view.buf, pos, view.len,
                           _MAX_VARINT_BYTES, "varint")
    finally:
        PyBuffer_Release(&view)
    return value, nxt


def decode_varlong(buf, Py_ssize_t pos=0):
    """(int64 value, next_pos) of the zigzag varlong at buf[pos:]."""
    cdef Py_buffer view
    cdef int64_t value = 0
    cdef Py_ssize_t nxt
    _acquire(buf, &view, pos)
    try:
        nxt = read_varlong(<const unsigned char*>view.buf, pos, view.len, &value)
        if nxt < 0:
            raise _corrupt(<const unsigned char*>view.buf, pos, view.len,
                           _MAX_VARLONG_BYTES, "varlong")
    finally:
        PyBuffer_Release(&view)
    return value, nxt


def decode_unsigned_varint(buf, Py_ssize_t pos=0):
    """(uint32 value, next_pos) of the unsigned varint at buf[pos:]."""
    cdef Py_buffer view
    cdef uint32_t value = 0
    cdef Py_ssize_t nxt
    _acquire(buf, &view, pos)
    try:
        nxt = read_uvarint32(<const unsigned char*>view.buf, pos, view.len, &value)
        if nxt < 0:
            raise _corrupt(<const unsigned char*>view.buf, pos, view.len,
                           _MAX_VARINT_BYTES, "unsigned varint")
    finally:
        PyBuffer_Release(&view)
    return value, nxt


def size_of_unsigned_varint(v) -> int:
    """Encoded length of encode_unsigned_varint(v)."""
    return size_of_uvarint64(_uint32_arg(v, "unsigned varint"))


# The Python-level size_of_varint / size_of_varlong share their names with
# the cdef inline functions of varint.pxd (which other kernels cimport), so
# they are defined under other names and bound into the module dict below.
@cython.binding(True)
def _py_size_of_varint(v) -> int:
    """Encoded length of encode_varint(v)."""
    return size_of_varint(<int32_t>_int32_arg(v, "varint"))


@cython.binding(True)
def _py_size_of_varlong(v) -> int:
    """Encoded length of encode_varlong(v)."""
    return size_of_varlong(_int64_arg(v, "varlong"))


_py_size_of_varint.__name__ = _py_size_of_varint.__qualname__ = "size_of_varint"
_py_size_of_varlong.__name__ = _py_size_of_varlong.__qualname__ = "size_of_varlong"
globals().update(size_of_varint=_py_size_of_varint, size_of_varlong=_py_size_of_varlong)
del _py_size_of_varint, _py_size_of_varlong
