"""kbroker's storage engine: the commit log in Kafka's on-disk format.

The broker only calls ``append`` / ``read`` / ``truncate_to`` / ``roll`` /
``delete_records`` / ``fetch_offset_by_timestamp`` on a :class:`Log` and
creates / looks up / deletes logs through the :class:`LogManager`; it never
touches files. See README.md in this package for the file layout and the
durability of each flush mode.
"""
from kbroker.log.config import LogConfig, LogManagerConfig
from kbroker.log.errors import (
    ConfigError, CorruptIndexError, CorruptRecordError, KafkaStorageError, OffsetOutOfRangeError,
    RecordBatchTooLargeError, RecordTooLargeError, UnexpectedAppendOffsetError,
)
from kbroker.log.info import EMPTY_RECORDS, FetchDataInfo, LogAppendInfo, LogOffsetMetadata, TimestampAndOffset
from kbroker.log.log import (
    EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, LATEST_TIERED_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, Log,
)
from kbroker.log.manager import LogManager

__all__ = [
    "ConfigError", "CorruptIndexError", "CorruptRecordError", "EARLIEST_LOCAL_TIMESTAMP", "EARLIEST_TIMESTAMP",
    "EMPTY_RECORDS", "FetchDataInfo", "KafkaStorageError", "LATEST_TIERED_TIMESTAMP", "LATEST_TIMESTAMP",
    "Log", "LogAppendInfo", "LogConfig", "LogManager", "LogManagerConfig", "LogOffsetMetadata", "MAX_TIMESTAMP",
    "OffsetOutOfRangeError", "RecordBatchTooLargeError", "RecordTooLargeError", "TimestampAndOffset",
    "UnexpectedAppendOffsetError",
]
