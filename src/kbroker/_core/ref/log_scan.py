"""Pure-Python twin of ``kbroker._core.log_scan`` (same API and results).

See the compiled kernel's docstring for the RecordBatch v2 header layout.
"""
from __future__ import annotations

import os
import struct

from kbroker._core.errors import CorruptRecordError
from kbroker._core.ref.crc32c import crc32c

HEADER_SIZE = 61
RECORD_BATCH_OVERHEAD = HEADER_SIZE
LOG_OVERHEAD = 12
HEADER_UP_TO_MAGIC = 17
MIN_BATCH_LENGTH = 49
CRC_START = 21
WINDOW = 16384
INT32_MAX = 0x7FFFFFFF

_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_UI = struct.Struct(">I")
_QI = struct.Struct(">qi")
_II = struct.Struct(">ii")


class ScanResult:
    """Outcome of ``scan`` (same fields as the compiled kernel's)."""

    __slots__ = ("valid_bytes", "batch_count", "first_offset", "next_offset", "max_timestamp",
                 "offset_of_max_timestamp", "first_batch_max_timestamp", "error",
                 "offset_index_entries", "time_index_entries", "epochs")

    def __repr__(self) -> str:
        return (f"ScanResult(valid_bytes={self.valid_bytes}, batch_count={self.batch_count}, "
                f"first_offset={self.first_offset}, next_offset={self.next_offset}, "
                f"max_timestamp={self.max_timestamp}, error={self.error!r})")


def scan(buf, base_offset: int, index_interval_bytes: int = 4096, verify_crc: bool = True,
         start: int = 0, end: int = -1, max_batch_size: int = 0x7FFFFFFF,
         expected_next_offset: int = -1) -> ScanResult:
    mv = memoryview(buf).cast("B")
    try:
        n = len(mv)
        if end < 0 or end > n:
            end = n
        if start < 0 or start > end:
            raise ValueError(f"invalid scan range [{start}, {end}) of {n} bytes")
        pos = last_index_pos = start
        floor_offset = expected_next_offset if expected_next_offset >= 0 else base_offset
        max_ts = off_max_ts = first_offset = next_offset = first_ts = -1
        last_time_entry_ts = -1
        count = 0
        last_epoch = -1
        oi = bytearray()
        ti = bytearray()
        epochs = []
        error = None
        while True:
            remaining = end - pos
            if remaining == 0:
                break
            if remaining < HEADER_UP_TO_MAGIC:
                error = "truncated batch header"
                break
            batch_length = _I.unpack_from(mv, pos + 8)[0]
            if batch_length < MIN_BATCH_LENGTH:
                error = "batch size below the v2 header size"
                break
            size = LOG_OVERHEAD + batch_length
            if batch_length > max_batch_size:
                error = "batch larger than the maximum batch size"
                break
            if size > remaining:
                error = "batch extends past the end of the log (torn write)"
                break
            if mv[pos + 16] != 2:
                error = "unsupported magic byte"
                break
            if verify_crc and crc32c(mv[pos + CRC_START: pos + size]) != _UI.unpack_from(mv, pos + 17)[0]:
                error = "CRC mismatch"
                break
            rel = _I.unpack_from(mv, pos + 23)[0]
            if rel < 0:
                error = "negative last_offset_delta"
                break
            if _I.unpack_from(mv, pos + 57)[0] < 0:
                error = "negative record count"
                break
            bo = _Q.unpack_from(mv, pos)[0]
            last = bo + rel
            if bo < floor_offset:
                error = "base offset not above the previous batch"
                break
            if last - base_offset > INT32_MAX:
                error = "offset outside the segment's 32-bit relative range"
                break
            ts = _Q.unpack_from(mv, pos + 35)[0]
            if count == 0:
                first_offset, first_ts = bo, ts
            if ts > max_ts:
                max_ts, off_max_ts = ts, last
            if index_interval_bytes >= 0 and pos - last_index_pos > index_interval_bytes:
                oi += _II.pack(last - base_offset, pos)
                if max_ts > last_time_entry_ts:
                    ti += _QI.pack(max_ts, off_max_ts - base_offset)
                    last_time_entry_ts = max_ts
                last_index_pos = pos
            floor_offset = next_offset = last + 1
            count += 1
            ple = _I.unpack_from(mv, pos + 12)[0]
            if ple >= 0 and ple > last_epoch:
                last_epoch = ple
                epochs.append((ple, bo))
            pos += size
        r = ScanResult()
        r.valid_bytes = pos
        r.batch_count = count
        r.first_offset = first_offset
        r.next_offset = next_offset
        r.max_timestamp = max_ts
        r.offset_of_max_timestamp = off_max_ts
        r.first_batch_max_timestamp = first_ts
        r.error = None if error is None else f"{error} at position {pos}"
        r.offset_index_entries = bytes(oi)
        r.time_index_entries = bytes(ti)
        r.epochs = epochs
        return r
    finally:
        mv.release()


class _Reader:
    def __init__(self, fd: int, end: int):
        self.fd, self.end = fd, end
        self.win_start, self.win = 0, b""

    def header(self, pos: int):
        if pos + HEADER_SIZE > self.end:
            return None
        off = pos - self.win_start
        if off >= 0 and off + HEADER_SIZE <= len(self.win):
            return self.win[off: off + HEADER_SIZE]
        try:
            data = os.pread(self.fd, min(self.end - pos, WINDOW), pos)
        except OSError:
            data = b""
        if len(data) < HEADER_SIZE:
            self.win = b""
            return None
        self.win_start, self.win = pos, data
        return data[:HEADER_SIZE]


def _header_ok(h: bytes) -> bool:
    return _I.unpack_from(h, 8)[0] >= MIN_BATCH_LENGTH and h[16] == 2 and _I.unpack_from(h, 23)[0] >= 0


def _walk(fd: int, start: int, end: int):
    r = _Reader(fd, end)
    pos = start
    while True:
        h = r.header(pos)
        if h is None or not _header_ok(h):
            return
        size = LOG_OVERHEAD + _I.unpack_from(h, 8)[0]
        if pos + size > end:
            return
        yield pos, size, h
        pos += size


def search_offset(fd: int, start: int, end: int, target_offset: int):
    for pos, size, h in _walk(fd, start, end):
        bo = _Q.unpack_from(h, 0)[0]
        last = bo + _I.unpack_from(h, 23)[0]
        if last >= target_offset:
            return (bo, last, pos, size)
    return None


def search_timestamp(fd: int, start: int, end: int, target_timestamp: int, starting_offset: int):
    for pos, size, h in _walk(fd, start, end):
        bo = _Q.unpack_from(h, 0)[0]
        last = bo + _I.unpack_from(h, 23)[0]
        ts = _Q.unpack_from(h, 35)[0]
        if ts >= target_timestamp and last >= starting_offset:
            return (bo, last, pos, size, ts)
    return None


def scan_headers(fd: int, start: int, end: int):
    next_offset, count, max_ts, off_max, first_ts, valid_end = -1, 0, -1, -1, -1, start
    for pos, size, h in _walk(fd, start, end):
        last = _Q.unpack_from(h, 0)[0] + _I.unpack_from(h, 23)[0]
        ts = _Q.unpack_from(h, 35)[0]
        if count == 0:
            first_ts = ts
        if ts > max_ts:
            max_ts, off_max = ts, last
        next_offset = last + 1
        count += 1
        valid_end = pos + size
    return (next_offset, count, max_ts, off_max, first_ts, valid_end)


def prepare_append(buf, next_offset: int, leader_epoch: int, segment_base_offset: int,
                   segment_position: int, bytes_since_last_index_entry: int,
                   index_interval_bytes: int, max_timestamp_so_far: int,
                   offset_of_max_timestamp_so_far: int, assign_offsets: bool = True):
    mv = memoryview(buf).cast("B")
    try:
        if (assign_offsets or leader_epoch >= 0) and mv.readonly:
            raise BufferError("prepare_append needs a writable buffer")
        n = len(mv)
        if n == 0:
            raise CorruptRecordError("empty append")
        pos = 0
        count = 0
        first_offset = first_ts = -1
        seg_pos = segment_position
        entries = None
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise CorruptRecordError(f"partial batch header at byte {pos} of {n}")
            batch_length = _I.unpack_from(mv, pos + 8)[0]
            if batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(f"batch length {batch_length} below the v2 minimum at byte {pos}")
            size = LOG_OVERHEAD + batch_length
            if size > n - pos:
                raise CorruptRecordError(f"batch at byte {pos} of size {size} overruns the buffer ({n})")
            if mv[pos + 16] != 2:
                raise CorruptRecordError(f"unsupported magic {mv[pos + 16]} at byte {pos}")
            rel = _I.unpack_from(mv, pos + 23)[0]
            if rel < 0:
                raise CorruptRecordError(f"negative last_offset_delta at byte {pos}")
            if assign_offsets:
                bo = next_offset
                _Q.pack_into(mv, pos, bo)
            else:
                bo = _Q.unpack_from(mv, pos)[0]
                if bo < next_offset:
                    raise ValueError(f"out of order offsets: batch base offset {bo} < next offset {next_offset}")
            last = bo + rel
            if leader_epoch >= 0:
                _I.pack_into(mv, pos + 12, leader_epoch)
            ts = _Q.unpack_from(mv, pos + 35)[0]
            if count == 0:
                first_offset, first_ts = bo, ts
            if ts > max_timestamp_so_far:
                max_timestamp_so_far, offset_of_max_timestamp_so_far = ts, last
            if bytes_since_last_index_entry > index_interval_bytes:
                if entries is None:
                    entries = []
                entries.append((last, seg_pos, max_timestamp_so_far, offset_of_max_timestamp_so_far))
                bytes_since_last_index_entry = 0
            seg_pos += size
            bytes_since_last_index_entry += size
            next_offset = last + 1
            count += 1
            pos += size
        return (first_offset, next_offset, count, max_timestamp_so_far, offset_of_max_timestamp_so_far,
                first_ts, bytes_since_last_index_entry, entries)
    finally:
        mv.release()


def append_batches(buf, fd: int, position: int, next_offset: int, leader_epoch: int,
                   segment_base_offset: int, bytes_since_last_index_entry: int,
                   index_interval_bytes: int, segment_max_timestamp: int,
                   segment_offset_of_max_timestamp: int, roll_after_timestamp: int,
                   offset_index, time_index, assign_offsets: bool = True, fsync: bool = False):
    """Twin of the compiled ``append_batches``: ``prepare_append``, the roll check,
    ``os.pwrite`` (+ ``os.fdatasync``), index entries."""
    first, nxt, count, _, _, _, since, _ = prepare_append(
        buf, next_offset, leader_epoch, segment_base_offset, position,
        bytes_since_last_index_entry, index_interval_bytes, -1, -1, assign_offsets)
    # the same walk again for the maxima of these batches alone and the index entries
    # with the segment's running maximum (prepare_append takes one running maximum)
    _, _, _, max_ts, off_max, _, _, _ = prepare_append(
        buf, first, -1, segment_base_offset, position, 0, 1 << 62, -1, -1, False)
    _, _, _, seg_max, seg_off, _, _, entries = prepare_append(
        buf, first, -1, segment_base_offset, position, bytes_since_last_index_entry,
        index_interval_bytes, segment_max_timestamp, segment_offset_of_max_timestamp, False)
    if (max_ts > roll_after_timestamp or nxt - 1 - segment_base_offset > INT32_MAX
            or nxt - 1 < segment_base_offset):
        return None
    if entries and (offset_index.free_slots(0) < len(entries)
                    or time_index.free_slots(1) < len(entries)):
        return None
    view = memoryview(buf).cast("B")
    done = 0
    try:
        while done < len(view):
            done += os.pwrite(fd, view[done:], position + done)
        if fsync:
            os.fdatasync(fd)
    except OSError:
        try:
            os.ftruncate(fd, position)
        except OSError:
            pass
        raise
    for offset, pos, ts, ts_offset in entries or ():
        offset_index.append(offset, pos)
        if ts >= 0:
            time_index.maybe_append(ts, ts_offset)
    return (first, nxt, count, max_ts, off_max, since, seg_max, seg_off)
