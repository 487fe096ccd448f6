"""Errors of the storage engine, each mapped to the Kafka error the broker answers with.

============================  =====================================
class                         Kafka error code (ReplicaManager maps)
============================  =====================================
OffsetOutOfRangeError         OFFSET_OUT_OF_RANGE (1)
CorruptRecordError            CORRUPT_MESSAGE (2) — from kbroker._core
RecordTooLargeError           MESSAGE_TOO_LARGE (10)
RecordBatchTooLargeError      RECORD_LIST_TOO_LARGE (18)
KafkaStorageError             KAFKA_STORAGE_ERROR (56)
SegmentClosedError            (internal: a reader's view went stale; it retries)
ConfigError                   INVALID_CONFIG (40)
CorruptIndexError             (internal: the index is rebuilt)
IndexClosedError              (internal: as SegmentClosedError)
InvalidOffsetError            (internal: a bug if it escapes)
============================  =====================================
"""
from __future__ import annotations

from kbroker._core.errors import CorruptRecordError, InvalidRecordError
from kbroker._core.index_errors import CorruptIndexError, IndexClosedError, IndexFullError, InvalidOffsetError

__all__ = [
    "ConfigError", "CorruptIndexError", "CorruptRecordError", "IndexClosedError", "IndexFullError",
    "InvalidOffsetError", "InvalidRecordError", "KafkaStorageError", "LogError", "OffsetOutOfRangeError",
    "RecordBatchTooLargeError", "RecordTooLargeError", "SegmentClosedError", "UnexpectedAppendOffsetError",
]


class LogError(Exception):
    """Base of the storage engine's own errors."""


class OffsetOutOfRangeError(LogError):
    """A fetch / delete-records / truncate offset outside [log_start_offset, log_end_offset]."""

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset


class KafkaStorageError(LogError):
    """An I/O error on a log directory; the partition goes offline (KAFKA_STORAGE_ERROR)."""


class SegmentClosedError(KafkaStorageError):
    """A read of a segment whose file was closed (deleted by retention, a compaction
    swap or truncation after the reader took its view, or the log closed). Log's
    lock-free readers retry on the newer view; it escapes only once the log is closed."""


class RecordTooLargeError(LogError):
    """A batch larger than max.message.bytes (MESSAGE_TOO_LARGE)."""


class RecordBatchTooLargeError(LogError):
    """An append larger than segment.bytes (RECORD_LIST_TOO_LARGE)."""


class UnexpectedAppendOffsetError(LogError):
    """A non-assigning (follower) append whose first offset is below log_end_offset."""


class ConfigError(LogError, ValueError):
    """An invalid log configuration value; ``key`` names the offending config."""

    def __init__(self, key: str, value: object, message: str):
        super().__init__(f"Invalid value {value!r} for configuration {key}: {message}")
        self.key = key
        self.value = value
