"""Pure-Python twin of :mod:`kbroker._core.crc32c` (CRC-32C, Castagnoli).

Same API and results as the compiled kernel; one table lookup per byte, so
about 1000x slower -- a fallback and a test oracle, not a hot path.
CRC-32C: reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF
(org.apache.kafka.common.utils.Crc32C); ``value`` continues a previous
result: ``crc32c(b, crc32c(a)) == crc32c(a + b)``.
"""
from __future__ import annotations

import operator

__all__ = ["HARDWARE", "NOGIL_THRESHOLD", "crc32c", "crc32c_sw"]

#: The twin never uses the CPU's CRC32 instruction.
HARDWARE = False
#: Kept for API parity with the compiled kernel; the twin never releases the GIL.
NOGIL_THRESHOLD = 8 * 1024

_POLY = 0x82F63B78


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()


def _as_bytes_view(data) -> memoryview:
    """A flat unsigned-byte view of ``data`` (no copy); TypeError unless C-contiguous."""
    view = memoryview(data)  # TypeError for non-buffers such as str
    if not view.c_contiguous:
        view.release()
        raise TypeError("crc32c needs a C-contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def crc32c(data, value: int = 0) -> int:
    """CRC-32C of ``data`` (any C-contiguous buffer), continuing ``value``."""
    value = operator.index(value)
    if not 0 <= value <= 0xFFFFFFFF:
        raise OverflowError("value must be in [0, 2**32)")
    table = _TABLE
    crc = value ^ 0xFFFFFFFF
    with _as_bytes_view(data) as view:
        for byte in view:
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


#: The twin has only a software path.
crc32c_sw = crc32c
