"""Pure-Python twin of :mod:`kbroker._core.murmur2` (Kafka's key hash).

Same API and results as the compiled kernel (see its docstring): Java's
Utils.murmur2(byte[]) as a signed int32, and the default partitioner's
``(murmur2(key) & 0x7fffffff) % num_partitions``. numpy is used only to
build the output arrays of the bulk forms.
"""
from __future__ import annotations

import operator
import struct

import numpy

__all__ = ["murmur2", "murmur2_bulk", "partition_for_key", "partitions_for_keys"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_U32 = 0xFFFFFFFF
_iter_u32le = struct.Struct("<I").iter_unpack


def _murmur2_u32(data) -> int:
    with memoryview(data) as view:
        if not view.c_contiguous:
            raise TypeError("murmur2 needs a C-contiguous buffer")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        length = len(view)
        blocks_end = length & ~3
        h = (_SEED ^ length) & _U32
        for (k,) in _iter_u32le(view[:blocks_end]):
            k = (k * _M) & _U32
            k ^= k >> 24
            k = (k * _M) & _U32
            h = ((h * _M) & _U32) ^ k
        tail = length & 3
        if tail == 3:
            h ^= view[blocks_end + 2] << 16
        if tail >= 2:
            h ^= view[blocks_end + 1] << 8
        if tail >= 1:
            h ^= view[blocks_end]
            h = (h * _M) & _U32
    h ^= h >> 13
    h = (h * _M) & _U32
    h ^= h >> 15
    return h


def _to_int32(u: int) -> int:
    return u - 0x100000000 if u & 0x80000000 else u


def _num_partitions_arg(num_partitions) -> int:
    n = operator.index(num_partitions)
    if not 0 < n <= 0x7FFFFFFF:
        raise ValueError(f"num_partitions must be in [1, 2**31), got {n}")
    return n


def murmur2(data) -> int:
    """Kafka's murmur2 of a bytes-like ``data``, as the signed int32 Java returns."""
    return _to_int32(_murmur2_u32(data))


def partition_for_key(key, num_partitions) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    n = _num_partitions_arg(num_partitions)
    return (_murmur2_u32(key) & 0x7FFFFFFF) % n


def murmur2_bulk(keys) -> numpy.ndarray:
    """numpy int32 array of murmur2(k) for each bytes-like key in ``keys``."""
    return numpy.array([murmur2(k) for k in keys], dtype=numpy.int32)


def partitions_for_keys(keys, num_partitions) -> numpy.ndarray:
    """numpy int32 array of partition_for_key(k, num_partitions) for each key."""
    n = _num_partitions_arg(num_partitions)
    return numpy.array([(_murmur2_u32(k) & 0x7FFFFFFF) % n for k in keys], dtype=numpy.int32)
