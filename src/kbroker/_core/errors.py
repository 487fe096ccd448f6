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


class ProduceRecordsError(ValueError):
    """A Produce partition's records refused before any batch check
    (``validate_batches(produce_version=...)`` raises it; not a CorruptRecordError, so
    it is never mistaken for a batch failure). ``error_code`` is Kafka's answer:

    - Kafka's ProduceRequest.validateRecords: INVALID_RECORD (no complete batch, a first
      batch not of magic 2, a second batch), CORRUPT_MESSAGE (a batch size below the
      legacy minimum or a magic outside 0..2 in a header read),
      UNSUPPORTED_COMPRESSION_TYPE (zstd before Produce v7); ``base_offset`` and
      ``size`` are None;
    - then UnifiedLog.analyzeAndValidateRecords' first checks: a base offset other than
      0 (INVALID_RECORD, ``base_offset`` set), a batch above max.message.bytes
      (MESSAGE_TOO_LARGE, ``size`` set).
    """

    #: Kafka error codes (kbroker.protocol.ErrorCode values; the kernels do not import it)
    CORRUPT_MESSAGE = 2
    MESSAGE_TOO_LARGE = 10
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87

    def __init__(self, error_code: int, *, base_offset: int | None = None, size: int | None = None) -> None:
        super().__init__(f"produce records refused with error {error_code}")
        self.error_code = error_code
        self.base_offset = base_offset
        self.size = size
