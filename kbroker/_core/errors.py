"""Errors raised by the kernels; shared by the Cython kernels and their twins."""


class CorruptRecordError(ValueError):
    """Bytes that are not a valid record batch / message set / varint.

    The one error class the record hot path raises on bad input: no
    IndexError, struct.error or MemoryError escapes a kernel.
    """


class InvalidRecordError(CorruptRecordError):
    """A structurally valid batch that breaks a record-level rule
    (Kafka's INVALID_RECORD), e.g. non-monotonic offset deltas."""


class UnsupportedCompressionError(CorruptRecordError):
    """Compression codec id not known (Kafka maps this to CORRUPT_MESSAGE)."""
