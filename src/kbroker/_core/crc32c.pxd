# CRC32C (Castagnoli) for other kernels to cimport:
#     from kbroker._core.crc32c cimport crc32c_update
# crc32c_update(0, p, n) is the CRC32C of p[0:n]; pass a previous result as
# `crc` to continue over more bytes (same convention as the `crc32c` package).
# Hardware (SSE4.2) or software path is chosen once, at import.
from libc.stdint cimport uint32_t

cdef uint32_t crc32c_update(uint32_t crc, const unsigned char* data, size_t length) noexcept nogil
