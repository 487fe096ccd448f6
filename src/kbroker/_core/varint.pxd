# Kafka varints on raw memory, for other kernels to cimport.
#
# Kafka's record format uses zigzag-encoded signed varints: "varint" is a
# 32-bit value of at most 5 bytes, "varlong" a 64-bit value of at most 10
# bytes (org.apache.kafka.common.utils.ByteUtils). The protocol's compact
# lengths use *unsigned* varints (no zigzag).
#
# Readers take (buf, pos, end) and return the position after the varint, or
# -1 when the bytes run out before `end` or the varint is over-long (a
# continuation bit on the 5th / 10th byte). They never read at or beyond
# `end`; the caller guarantees 0 <= pos. Callers turn -1 into
# CorruptRecordError. As in Java's ByteUtils, bits of the last allowed byte
# beyond bit 31 / 63 are dropped, not rejected.
# Tested through the def API of varint.pyx (tests/test_varint.py).
# Writers write at most 5 / 10 bytes at p and return the count written.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t


cdef inline Py_ssize_t read_uvarint64(const unsigned char* buf, Py_ssize_t pos,
                                      Py_ssize_t end, uint64_t* out) noexcept nogil:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos >= end or shift > 63:
            return -1
        b = buf[pos]
        pos += 1
        result |= (<uint64_t>(b & 0x7f)) << shift
        if not (b & 0x80):
            out[0] = result
            return pos
        shift += 7


cdef inline Py_ssize_t read_uvarint32(const unsigned char* buf, Py_ssize_t pos,
                                      Py_ssize_t end, uint32_t* out) noexcept nogil:
    cdef uint32_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos >= end or shift > 28:
            return -1
        b = buf[pos]
        pos += 1
        result |= (<uint32_t>(b & 0x7f)) << shift
        if not (b & 0x80):
            out[0] = result
            return pos
        shift += 7


cdef inline Py_ssize_t read_varint(const unsigned char* buf, Py_ssize_t pos,
                                   Py_ssize_t end, int32_t* out) noexcept nogil:
    """Zigzag signed 32-bit varint (at most 5 bytes)."""
    cdef uint32_t raw = 0
    pos = read_uvarint32(buf, pos, end, &raw)
    if pos >= 0:
        out[0] = <int32_t>((raw >> 1) ^ (-(<int32_t>(raw & 1))))
    return pos


cdef inline Py_ssize_t read_varlong(const unsigned char* buf, Py_ssize_t pos,
                                    Py_ssize_t end, int64_t* out) noexcept nogil:
    """Zigzag signed 64-bit varint (at most 10 bytes)."""
    cdef uint64_t raw = 0
    pos = read_uvarint64(buf, pos, end, &raw)
    if pos >= 0:
        out[0] = <int64_t>((raw >> 1) ^ (-(<int64_t>(raw & 1))))
    return pos


cdef inline int write_uvarint64(unsigned char* p, uint64_t v) noexcept nogil:
    cdef int n = 0
    while v >= 0x80:
        p[n] = <unsigned char>((v & 0x7f) | 0x80)
        v >>= 7
        n += 1
    p[n] = <unsigned char>v
    return n + 1


cdef inline int write_varint(unsigned char* p, int32_t v) noexcept nogil:
    return write_uvarint64(p, <uint32_t>((<uint32_t>v << 1) ^ <uint32_t>(v >> 31)))


cdef inline int write_varlong(unsigned char* p, int64_t v) noexcept nogil:
    return write_uvarint64(p, (<uint64_t>v << 1) ^ <uint64_t>(v >> 63))


cdef inline int size_of_uvarint64(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline int size_of_varint(int32_t v) noexcept nogil:
    return size_of_uvarint64(<uint32_t>((<uint32_t>v << 1) ^ <uint32_t>(v >> 31)))


cdef inline int size_of_varlong(int64_t v) noexcept nogil:
    return size_of_uvarint64((<uint64_t>v << 1) ^ <uint64_t>(v >> 63))
