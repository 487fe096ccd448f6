# cython: boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Kafka's murmur2 key hash and default partition choice.

Bit-exact with Java's org.apache.kafka.common.utils.Utils.murmur2(byte[])
(seed 0x9747b28c, m 0x5bd1e995, r 24, little-endian 4-byte blocks, tail
bytes as the Java switch fall-through) and the producer's partition for a
non-null key: ``toPositive(murmur2(key)) % num_partitions`` with
``toPositive(h) = h & 0x7fffffff`` (not abs()).

murmur2() returns the signed int32 Java returns. The bulk forms return a
numpy int32 array; numpy is only used (from Python) to allocate it.
"""
import numpy

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, uint32_t


cdef inline uint32_t _murmur2(const unsigned char* data, Py_ssize_t length) noexcept nogil:
    cdef uint32_t m = 0x5BD1E995
    cdef uint32_t h = 0x9747B28CU ^ <uint32_t>length
    cdef uint32_t k
    cdef Py_ssize_t i
    cdef Py_ssize_t blocks_end = length & ~(<Py_ssize_t>3)
    cdef Py_ssize_t tail = length & 3
    i = 0
    while i < blocks_end:
        k = (<uint32_t>data[i] | (<uint32_t>data[i + 1] << 8)
             | (<uint32_t>data[i + 2] << 16) | (<uint32_t>data[i + 3] << 24))
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
        i += 4
    if tail == 3:
        h ^= <uint32_t>data[blocks_end + 2] << 16
    if tail >= 2:
        h ^= <uint32_t>data[blocks_end + 1] << 8
    if tail >= 1:
        h ^= <uint32_t>data[blocks_end]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h


cdef uint32_t _hash_object(object key) except? 0:
    """murmur2 bits of one key: exact bytes directly, else via the buffer protocol."""
    cdef Py_buffer view
    cdef uint32_t h
    if PyBytes_CheckExact(key):
        return _murmur2(<const unsigned char*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    try:
        PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    except (BufferError, ValueError) as exc:  # exporter cannot give a flat C-contiguous view
        raise TypeError(f"murmur2 needs a C-contiguous buffer: {exc}") from None
    h = _murmur2(<const unsigned char*>view.buf, view.len)
    PyBuffer_Release(&view)
    return h


cdef int32_t _num_partitions_arg(object num_partitions) except -1:
    cdef object n = PyNumber_Index(num_partitions)
    if not (0 < n <= 0x7FFFFFFF):
        raise ValueError(f"num_partitions must be in [1, 2**31), got {n}")
    return <int32_t>n


def murmur2(data) -> int:
    """Kafka's murmur2 of a bytes-like ``data``, as the signed int32 Java returns."""
    return <int32_t>_hash_object(data)


def partition_for_key(key, num_partitions) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    cdef int32_t n = _num_partitions_arg(num_partitions)
    return <int32_t>((_hash_object(key) & 0x7FFFFFFF) % <uint32_t>n)


cdef object _bulk(object keys, int32_t num_partitions):
    """int32 array of murmur2(key) (num_partitions == 0) or partitions."""
    cdef list seq = keys if type(keys) is list else list(keys)
    cdef Py_ssize_t n = len(seq)
    cdef Py_ssize_t i = 0
    cdef uint32_t h
    out = numpy.empty(n, dtype=numpy.int32)
    cdef int32_t[::1] res = out
    for key in seq:
        if i >= n:  # a buffer exporter grew the list under us
            break
        h = _hash_object(key)
        if num_partitions:
            res[i] = <int32_t>((h & 0x7FFFFFFF) % <uint32_t>num_partitions)
        else:
            res[i] = <int32_t>h
        i += 1
    return out if i == n else out[:i]


def murmur2_bulk(keys) -> numpy.ndarray:
    """numpy int32 array of murmur2(k) for each bytes-like key in ``keys``."""
    return _bulk(keys, 0)


def partitions_for_keys(keys, num_partitions) -> numpy.ndarray:
    """numpy int32 array of partition_for_key(k, num_partitions) for each key."""
    return _bulk(keys, _num_partitions_arg(num_partitions))
