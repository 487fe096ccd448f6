"""Stub for the records kernel (kbroker/_core/records.pyx); the twin
kbroker/_core/ref/records.py has the same API."""
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from kbroker._core.compression import UnsupportedMagicError as UnsupportedMagicError
from kbroker._core.errors import (
    CorruptRecordError as CorruptRecordError,
    InvalidRecordError as InvalidRecordError,
    ProduceRecordsError as ProduceRecordsError,
    UnsupportedCompressionError as UnsupportedCompressionError,
)

NO_COMPRESSION: int
GZIP: int
SNAPPY: int
LZ4: int
ZSTD: int
TIMESTAMP_CREATE_TIME: int
TIMESTAMP_LOG_APPEND_TIME: int
NO_TIMESTAMP: int
RECORD_BATCH_OVERHEAD: int
NO_PRODUCER_ID: int
NO_PRODUCER_EPOCH: int
NO_SEQUENCE: int
NO_PARTITION_LEADER_EPOCH: int
RECORD_ERROR_NO_KEY: int
RECORD_ERROR_TIMESTAMP: int
RECORD_ERROR_LOG_APPEND_TIME: int
RECORD_ERROR_KEY_SCHEMA: int
RECORD_ERROR_VALUE_SCHEMA: int
SCHEMA_KEY: int
SCHEMA_VALUE: int

Header = tuple[str, bytes | None]
BytesLike = bytes | bytearray | memoryview
RecordTuple = tuple[int, BytesLike | None, BytesLike | None, Sequence[Header]]

class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    def __init__(self, offset: int, timestamp: int, key: bytes | None,
                 value: bytes | None, headers: list[Header]) -> None: ...

class _BatchBase:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    compression: int
    timestamp_type: int
    is_transactional: bool
    is_control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    last_offset: int
    next_offset: int
    size_in_bytes: int
    records: list[Record]
    def is_valid(self) -> bool: ...
    def validate(self) -> None: ...
    def __iter__(self) -> Iterator[Record]: ...
    def __len__(self) -> int: ...

class RecordBatch(_BatchBase):
    has_delete_horizon: bool

class LegacyBatch(_BatchBase):
    timestamp: int

class BatchInfo(NamedTuple):
    position: int
    size_in_bytes: int
    last_offset_delta: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    timestamp_type: int
    compression: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    partition_leader_epoch: int
    min_record_timestamp: int
    max_record_timestamp: int
    has_null_key: bool
    record_errors: tuple[tuple[int, int, int], ...]  # (index in batch, RECORD_ERROR_* kind, timestamp)
    schema_ids: tuple[tuple[int, int], ...]  # distinct (SCHEMA_KEY/SCHEMA_VALUE, schema id), sorted

class BatchBuilder:
    def __init__(self, *, compression: int = ..., batch_size: int = ...,
                 timestamp_type: int = ..., base_timestamp: int | None = ...,
                 producer_id: int = ..., producer_epoch: int = ...,
                 base_sequence: int = ..., partition_leader_epoch: int = ...,
                 is_transactional: bool = ..., is_control: bool = ...,
                 base_offset: int = ..., compression_level: int | None = ...) -> None: ...
    def append(self, timestamp_ms: int, key: BytesLike | None, value: BytesLike | None,
               headers: Sequence[Header] = ...) -> bool: ...
    @property
    def record_count(self) -> int: ...
    def size_in_bytes(self) -> int: ...
    def build(self) -> bytes: ...

def encode_batch(records: Iterable[RecordTuple], *, base_offset: int = ...,
                 compression: int = ..., timestamp_type: int = ...,
                 base_timestamp: int | None = ..., producer_id: int = ...,
                 producer_epoch: int = ..., base_sequence: int = ...,
                 partition_leader_epoch: int = ..., is_transactional: bool = ...,
                 is_control: bool = ..., compression_level: int | None = ...) -> bytes: ...
def decode_batch(buf: BytesLike, *, check_crc: bool = ...) -> RecordBatch: ...
def decode_batches(buf: BytesLike, *, check_crc: bool = ...) -> list[RecordBatch | LegacyBatch]: ...
def iter_batches(buf: BytesLike, *, check_crc: bool = ...) -> Iterator[RecordBatch | LegacyBatch]: ...
def validate_batches(buf: BytesLike, *, allow_control: bool = ..., timestamp_type: int = ...,
                     now_ms: int = ..., timestamp_before_max_ms: int = ...,
                     timestamp_after_max_ms: int = ..., compacted: bool = ...,
                     produce_version: int = ..., max_message_bytes: int = ...,
                     key_schema: bool = ..., value_schema: bool = ...) -> list[BatchInfo]: ...
def produce_records_error(buf: BytesLike | None, version: int) -> int: ...
def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None: ...
def set_partition_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None: ...
def set_max_timestamp(buf: bytearray | memoryview, position: int, timestamp_type: int,
                      max_timestamp: int) -> None: ...
def set_log_append_time(buf: bytearray | memoryview, position: int, timestamp_ms: int) -> None: ...
def assign_offsets(buf: bytearray | memoryview, infos: Iterable[BatchInfo], base_offset: int, *,
                   partition_leader_epoch: int | None = ...) -> int: ...
