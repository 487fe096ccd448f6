"""Value types the storage engine hands to the broker."""
from __future__ import annotations

from typing import NamedTuple, Union

from kbroker.records.region import FileRegion

#: The empty records value of a FetchDataInfo (zero-length, nothing to send).
EMPTY_RECORDS = b""


class LogOffsetMetadata(NamedTuple):
    """An offset plus where it lives: the base offset of its segment and the
    byte position of its batch in that segment (Kafka's LogOffsetMetadata).
    -1 fields mean "unknown" (the message offset alone is known)."""

    message_offset: int
    segment_base_offset: int = -1
    relative_position_in_segment: int = -1

    @property
    def message_offset_only(self) -> bool:
        return self.segment_base_offset < 0


class FetchDataInfo(NamedTuple):
    """Result of ``Log.read``.

    ``records`` is a FileRegion (ready for sendfile, starting on a batch
    boundary; it may end inside a batch, which clients ignore — as Kafka) or
    EMPTY_RECORDS. ``first_entry_incomplete``: min_one_message was False and
    the first batch did not fit in max_bytes (records is then empty).
    """

    fetch_offset_metadata: LogOffsetMetadata
    records: Union[FileRegion, bytes] = EMPTY_RECORDS
    first_entry_incomplete: bool = False
    aborted_transactions: object = None

    @property
    def size_in_bytes(self) -> int:
        r = self.records
        return r.size if isinstance(r, FileRegion) else len(r)


class LogAppendInfo(NamedTuple):
    """What one append did (Kafka's LogAppendInfo, the fields the broker needs).

    first_offset / last_offset: offsets assigned to the first / last record;
    max_timestamp / offset_of_max_timestamp: over the appended batches;
    log_append_time_ms: -1 unless the topic uses LogAppendTime (the broker
    sets it); log_start_offset: the log's start offset after the append.
    """

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time_ms: int
    log_start_offset: int
    batch_count: int
    valid_bytes: int


class TimestampAndOffset(NamedTuple):
    """ListOffsets answer: a record's timestamp (-1 if n/a), offset and leader epoch (-1 if unknown)."""

    timestamp: int
    offset: int
    leader_epoch: int = -1
