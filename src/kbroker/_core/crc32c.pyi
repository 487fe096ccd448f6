"""Stub for the compiled CRC-32C kernel (twin: kbroker._core.ref.crc32c)."""
from typing_extensions import Buffer

#: True when crc32c() uses the SSE4.2 CRC32 instruction.
HARDWARE: bool
#: Buffers of at least this many bytes are checksummed without the GIL.
NOGIL_THRESHOLD: int

def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC-32C of a C-contiguous buffer, continuing ``value`` (0 <= value < 2**32)."""

def crc32c_sw(data: Buffer, value: int = 0) -> int:
    """Same as crc32c(), always on the software (slicing-by-8) path."""
