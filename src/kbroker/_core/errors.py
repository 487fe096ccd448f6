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


class UnsupportedMagicError(InvalidRecordError):
    """A magic 0/1 (legacy) message set where only magic 2 is accepted.

    ``validate_batches`` raises it: ProduceRequest v3+ must carry record
    batch v2 (Kafka's ``ProduceRequest.validateRecords`` answers
    INVALID_RECORD). ``.magic`` holds the magic byte found, so a broker that
    wants UNSUPPORTED_VERSION for old produce versions can tell it apart.
    """

    def __init__(self, message: str, magic: int = -1) -> None:
        super().__init__(message)
        self.magic = magic
