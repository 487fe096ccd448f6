"""Stub for the compiled log scan kernel (twin: kbroker._core.ref.log_scan)."""
from typing_extensions import Buffer

RECORD_BATCH_OVERHEAD: int

class ScanResult:
    valid_bytes: int
    batch_count: int
    first_offset: int
    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    first_batch_max_timestamp: int
    error: str | None
    offset_index_entries: bytes
    time_index_entries: bytes
    epochs: list[tuple[int, int]]

def scan(buf: Buffer, base_offset: int, index_interval_bytes: int = 4096, verify_crc: bool = True,
         start: int = 0, end: int = -1, max_batch_size: int = 0x7FFFFFFF,
         expected_next_offset: int = -1) -> ScanResult: ...
def search_offset(fd: int, start: int, end: int, target_offset: int) -> tuple[int, int, int, int] | None:
    """(base_offset, last_offset, position, size) of the first batch with last_offset >= target."""
def search_timestamp(fd: int, start: int, end: int, target_timestamp: int,
                     starting_offset: int) -> tuple[int, int, int, int, int] | None:
    """(base_offset, last_offset, position, size, max_timestamp)."""
def scan_headers(fd: int, start: int, end: int) -> tuple[int, int, int, int, int, int]:
    """(next_offset, batch_count, max_timestamp, offset_of_max_timestamp, first_batch_max_timestamp, valid_end)."""
def prepare_append(buf: Buffer, next_offset: int, leader_epoch: int, segment_base_offset: int,
                   segment_position: int, bytes_since_last_index_entry: int, index_interval_bytes: int,
                   max_timestamp_so_far: int, offset_of_max_timestamp_so_far: int,
                   assign_offsets: bool = True
                   ) -> tuple[int, int, int, int, int, int, int, list[tuple[int, int, int, int]] | None]: ...
def append_batches(buf: Buffer, fd: int, position: int, next_offset: int, leader_epoch: int,
                   segment_base_offset: int, bytes_since_last_index_entry: int,
                   index_interval_bytes: int, segment_max_timestamp: int,
                   segment_offset_of_max_timestamp: int, roll_after_timestamp: int,
                   offset_index: object, time_index: object, assign_offsets: bool = True,
                   fsync: bool = False) -> tuple[int, int, int, int, int, int, int, int] | None: ...
