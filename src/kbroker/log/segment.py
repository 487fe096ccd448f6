"""LogSegment: one ``.log`` file plus its ``.index`` and ``.timeindex``.

Model: Kafka's ``LogSegment`` (storage/.../log/LogSegment.java).

Files, in ``<log.dir>/<topic>-<partition>/``, named by the 20-digit
zero-padded base offset (the first offset the segment may hold)::

    00000000000000001234.log        record batches exactly as on the wire
    00000000000000001234.index      sparse offset -> position (8-byte entries)
    00000000000000001234.timeindex  sparse timestamp -> offset (12-byte entries)
    00000000000000001234.txnindex   aborted transactions whose ABORT marker is here
                                    (34-byte entries, only once there is one; txn_index.py)

Every offset in the segment is in ``[base_offset, base_offset + 2**31 - 1]``
so that the indexes can store 32-bit relative offsets.

Index rule (Kafka's, per batch): before appending a batch, if more than
``index.interval.bytes`` have been appended since the last index entry,
add ``(batch last offset, batch position)`` to the offset index and the
running ``(max timestamp, its offset)`` to the time index.

Threads. Writers (append, roll, truncation, recovery, index rebuild on
open) are serialised by the owning ``Log``'s append lock. The read methods
(``translate_offset``, ``read``, ``find_offset_by_timestamp``,
``offset_of_max_timestamp_record``, ``max_timestamp_record_below``,
``max_timestamp_so_far`` / ``largest_timestamp``) may run without it,
concurrently with one writer, bounded by positions the Log published
(bytes below them are written; ``size`` only grows while the segment is
active). They rely on:

* the indexes' own locks (``kbroker._core.offset_index``): a lookup never
  meets an unmapped or remapped map (trim on roll, truncate, close);
* ``_lazy_lock`` for the lazy state: the first-use index sanity check (and
  rebuild), opening the ``.log`` fd, loading the largest timestamp;
* ``SegmentFile.pin``: the fd is closed only once no reader has it pinned,
  so a ``pread`` never reads a reused descriptor; a closed segment raises
  SegmentClosedError (an index, IndexClosedError) and the Log retries.

The ``.log`` file descriptor is opened lazily on first use and stays open
until the segment is closed or its deletion completes, so a FileRegion
handed out by ``read`` stays valid while a fetch is in flight.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from typing import Callable, Iterator, NamedTuple

from kbroker.kernels import log_scan as _scan
from kbroker.kernels import offset_index as _offset_index
from kbroker.kernels import time_index as _time_index
from kbroker.log.config import LogConfig
from kbroker.log.errors import CorruptIndexError, CorruptRecordError, KafkaStorageError, SegmentClosedError
from kbroker.log.info import EMPTY_RECORDS, FetchDataInfo, LogOffsetMetadata, TimestampAndOffset
from kbroker.log.txn_index import TransactionIndex
from kbroker.records.region import FileRegion

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

INT32_MAX = 0x7FFFFFFF
_INT64_MAX = (1 << 63) - 1
_MAX_TS = struct.Struct(">q")
_TIME_ENTRY = struct.Struct(">qi")     # a time-index entry: timestamp, relative offset


def _create_exclusive(path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data``; False (nothing written) if it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)
    return True


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


#: read_next_offset scans a segment this small from its start (a few window reads)
_SCAN_WITHOUT_INDEX = 256 * 1024


def _pread_exactly(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (fewer only if the file is shorter)."""
    data = os.pread(fd, size, 0)
    while len(data) < size:
        more = os.pread(fd, size - len(data), len(data))
        if not more:
            break
        data += more
    return data


def _write_file_unless_equal(path: str, data: bytes) -> bool:
    """Make ``path`` hold exactly ``data``; a file that already does is left alone (a
    recovery after a crash finds most index files right, and rewriting one costs an
    O_TRUNC, a write and their metadata updates per file). Returns True if it wrote."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        _write_file(path, data)
        return True
    try:
        size = os.fstat(fd).st_size
        if size == len(data) and (not data or os.pread(fd, size + 1, 0) == data):
            return False
        # in place: no O_TRUNC (freeing and reallocating the first block of a file that an
        # active segment extended to segment.index.bytes costs ~1 ms on a busy ext4)
        view = memoryview(data)
        done = 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        if size != len(data):
            os.ftruncate(fd, len(data))
        return True
    finally:
        os.close(fd)


class BatchHeader(NamedTuple):
    """The producer-relevant fields of one batch header, at ``position`` in its buffer or file.

    For a legacy (magic 0/1) batch only base_offset / position / size_in_bytes
    are real; it has no producer (producer_id -1)."""

    base_offset: int
    position: int
    size_in_bytes: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


# RecordBatch v2 header: base_offset, batch_length, partition_leader_epoch, magic, crc,
# attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
# producer_epoch, base_sequence, records_count (61 bytes)
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LOG_OVERHEAD = 12
_TRANSACTIONAL_FLAG = 0x10
_CONTROL_FLAG = 0x20


def iter_batch_headers(buf, start: int = 0, end: int = -1) -> Iterator[BatchHeader]:
    """Walk the batch framing of ``buf[start:end]`` (bytes, bytearray or mmap) and
    yield each batch's :class:`BatchHeader`. No CRC check (the caller appends
    validated batches or reads a recovered segment); raises CorruptRecordError
    when a batch's length field does not fit."""
    if end < 0:
        end = len(buf)
    pos = start
    while pos < end:
        if end - pos < _LOG_OVERHEAD + 5:
            raise CorruptRecordError(f"truncated batch header at position {pos}")
        base_offset, batch_length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
        size = _LOG_OVERHEAD + batch_length
        if batch_length < 14 or size > end - pos:
            raise CorruptRecordError(f"invalid batch length {batch_length} at position {pos}")
        if buf[pos + 16] != 2:   # legacy magic: no producer fields
            yield BatchHeader(base_offset, pos, size, 0, -1, -1, -1, -1, False, False)
        else:
            if size < _V2_HEADER.size:
                raise CorruptRecordError(f"batch of {size} bytes at position {pos} is below the v2 header size")
            (_, _, _, _, _, attributes, last_offset_delta, _, max_timestamp, producer_id, producer_epoch,
             base_sequence, _) = _V2_HEADER.unpack_from(buf, pos)
            yield BatchHeader(base_offset, pos, size, last_offset_delta, max_timestamp, producer_id,
                              producer_epoch, base_sequence, bool(attributes & _TRANSACTIONAL_FLAG),
                              bool(attributes & _CONTROL_FLAG))
        pos += size


def end_txn_marker(batch_bytes) -> tuple[bool, int] | None:
    """``(is_abort, coordinator_epoch)`` of a control batch holding a COMMIT/ABORT
    marker, else None (parsed by ``kbroker.records.control``)."""
    from kbroker.records.control import parse_end_txn_marker
    m = parse_end_txn_marker(batch_bytes)
    return None if m is None else (m.is_abort, m.coordinator_epoch)


def filename_prefix(offset: int) -> str:
    return f"{offset:020d}"


def offset_from_filename(name: str) -> int:
    return int(name.split(".", 1)[0])


class SegmentFile:
    """The open ``.log`` of a segment: what ``FileRegion.file`` refers to.

    Owns one fd; ``close`` is idempotent. Only the segment closes it. Lock-free
    readers ``pin`` the fd around their preads: ``close`` marks the file closed at
    once (``pin`` and ``fileno`` refuse) but closes the fd when the last pin goes.
    """

    __slots__ = ("fd", "path", "closed", "_pins", "_mutex")

    def __init__(self, path: str, create: bool):
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o644)
        self.path = path
        self.closed = False
        self._pins = 0
        self._mutex = threading.Lock()

    def fileno(self) -> int:
        if self.closed:
            raise ValueError(f"segment file {self.path} is closed")
        return self.fd

    def pin(self) -> int:
        """The fd, kept open until the matching ``unpin``; SegmentClosedError once closed."""
        with self._mutex:
            if self.closed:
                raise SegmentClosedError(f"segment file {self.path} is closed")
            self._pins += 1
            return self.fd

    def unpin(self) -> None:
        with self._mutex:
            self._pins -= 1
            if self._pins == 0 and self.closed:
                os.close(self.fd)

    def close(self) -> None:
        with self._mutex:
            if self.closed:
                return
            self.closed = True
            if self._pins == 0:
                os.close(self.fd)

    def __repr__(self) -> str:
        return f"SegmentFile({self.path!r}, fd={self.fd}{', closed' if self.closed else ''})"


class LogSegment:
    """One segment of a log (see module docstring). Not thread-safe."""

    def __init__(self, dir: str, base_offset: int, config: LogConfig, time_ms: Callable[[], int], *,
                 create: bool = False, file_suffix: str = "", roll_jitter_ms: int = 0,
                 fsync_every_append: bool = False, preallocate_bytes: int = 0):
        self.dir = dir
        self.base_offset = base_offset
        prefix = os.path.join(dir, filename_prefix(base_offset))
        self.log_path = prefix + LOG_SUFFIX + file_suffix
        self.offset_index = _offset_index.OffsetIndex(prefix + INDEX_SUFFIX + file_suffix, base_offset,
                                                      config.segment_index_bytes)
        self.time_index = _time_index.TimeIndex(prefix + TIME_INDEX_SUFFIX + file_suffix, base_offset,
                                                config.segment_index_bytes)
        #: aborted transactions whose ABORT marker is in this segment (file made on the first)
        self.txn_index = TransactionIndex(prefix + TXN_INDEX_SUFFIX + file_suffix)
        self.index_interval_bytes = config.index_interval_bytes
        self.max_index_size = config.segment_index_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self.fsync_every_append = fsync_every_append
        self._time_ms = time_ms
        self.created_ms = time_ms()
        self.bytes_since_last_index_entry = 0
        self._file: SegmentFile | None = None
        self._closed = False
        #: guards the lazy state readers may fill in: index check, fd, largest timestamp
        self._lazy_lock = threading.RLock()
        self._indexes_checked = create
        #: no index entry exists outside the index objects' own maps (a new segment, or a
        #: small one loaded without index files): while the offset index is not mapped, a
        #: lookup answers position 0 rather than create and map a file. Cleared where
        #: index files are written directly (on_become_inactive, _replace_index_files).
        self._indexes_maybe_absent = create
        self._preallocated = create and preallocate_bytes > 0
        self._writable_indexes = False
        if create:
            self._file = SegmentFile(self.log_path, create=True)
            # preallocate (Kafka's FileRecords.openChannel): the file is extended to
            # segment.bytes at once and trimmed to ``size`` on roll and close; ``size``
            # (not the file's length) bounds every read, and recovery after a crash
            # truncates the zero tail as it truncates any invalid bytes.
            os.ftruncate(self._file.fd, preallocate_bytes)
            self.size = 0
            self._max_ts, self._offset_of_max_ts = -1, -1
            self._max_ts_loaded = True
            self._rolling_ts: int | None = None
            self._rolling_ts_loaded = True
        else:
            self.size = os.stat(self.log_path).st_size
            self._max_ts, self._offset_of_max_ts = -1, -1
            self._max_ts_loaded = False
            self._rolling_ts = None
            self._rolling_ts_loaded = False

    # -- files -------------------------------------------------------------------
    @property
    def file(self) -> SegmentFile:
        f = self._file
        if f is None:
            with self._lazy_lock:
                f = self._file
                if f is None:
                    if self._closed:
                        raise SegmentClosedError(f"segment {self.log_path} is closed")
                    f = self._file = SegmentFile(self.log_path, create=False)
        return f

    @property
    def fd(self) -> int:
        f = self._file
        if f is None:
            f = self.file
        return f.fd

    def has_open_file(self) -> bool:
        return self._file is not None and not self._file.closed

    def _check_indexes(self) -> None:
        """Sanity-check both indexes on first use; rebuild them if corrupt. Under
        ``_lazy_lock``: concurrent readers wait for the one that checks."""
        if self._indexes_checked:
            return
        with self._lazy_lock:
            if self._indexes_checked:
                return
            try:
                self.offset_index.sanity_check()
                self.time_index.sanity_check()
            except (CorruptIndexError, OSError):
                self.rebuild_indexes()
            self._indexes_checked = True

    def index_files_exist(self) -> bool:
        return os.path.exists(self.offset_index.path) and os.path.exists(self.time_index.path)

    def index_files_absent(self) -> bool:
        """Neither index is mapped or has a file: both are empty. Without a stat when
        ``_indexes_maybe_absent`` (files of such a segment come only from its index
        objects, which are then mapped, or from the writers that clear the flag)."""
        if self._indexes_maybe_absent:
            return not self.offset_index.is_loaded and not self.time_index.is_loaded
        return self._unopened(self.offset_index) and self._unopened(self.time_index)

    def mark_index_files_absent(self) -> None:
        """Load: both index files are missing and the segment is at most
        index.interval.bytes (a clean ``close`` leaves such a segment without any): the
        indexes are empty, nothing to check or rebuild; each is created on first use."""
        self._indexes_checked = True
        self._indexes_maybe_absent = True

    # -- append ------------------------------------------------------------------
    def prepare_writable(self) -> None:
        """Make this the active segment: indexes checked and made ``growable``: each
        is extended to max size (Kafka's resize on becoming active) only when an entry
        needs the room, under its own lock. An index whose file does not exist yet (a
        new segment) stays unopened: its first use creates it at max size
        (MmapIndex._ensure), and an append adds an entry only every
        index.interval.bytes, so a partition that only ever got a few small records
        creates its index files when it closes (``close``), and one restarted with
        exact index files keeps them exact until an entry is due: a crash then finds
        files that recovery need not rewrite."""
        if not self._writable_indexes:
            self._check_indexes()
            self.offset_index.growable = True
            self.time_index.growable = True
            self._writable_indexes = True

    def _position_before(self, offset: int) -> int:
        """The offset index's position for ``offset``; 0 (the segment's start, where a
        scan finds it too) while the index is empty and has no file, instead of
        creating one at segment.index.bytes and mapping it for a read."""
        if self._indexes_maybe_absent and not self.offset_index.is_loaded:
            return 0
        return self.offset_index.lookup(offset)[1]

    @staticmethod
    def _unopened(idx) -> bool:
        """Not mapped and no file: no entries, and room for any append's entries."""
        return not idx.is_loaded and not os.path.exists(idx.path)

    def append(self, buf, max_timestamp: int, offset_of_max_timestamp: int, bytes_since: int,
               entries) -> None:
        """Write prepared batches (see ``log_scan.prepare_append``, called with
        this segment's size and ``bytes_since_last_index_entry`` and a -1
        running maximum) at the end of the ``.log`` and add their index entries."""
        if not self._writable_indexes:
            self.prepare_writable()
        pos = self.size
        fd = self.fd
        n = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
        try:
            written = os.pwrite(fd, buf, pos)
            if written != n:
                view = memoryview(buf).cast("B")
                while written < n:
                    written += os.pwrite(fd, view[written:], pos + written)
            if self.fsync_every_append:
                os.fdatasync(fd)
        except OSError as e:
            try:
                os.ftruncate(fd, pos)
            except OSError:
                pass
            raise KafkaStorageError(f"error while appending to {self.log_path}: {e}") from e
        if pos == 0:
            self._rolling_ts = max_timestamp
            self._rolling_ts_loaded = True
        self.size = pos + n
        if not self._max_ts_loaded:
            self._load_largest_timestamp()
        seg_max, seg_off = self._max_ts, self._offset_of_max_ts
        if max_timestamp > seg_max:
            self._max_ts, self._offset_of_max_ts = max_timestamp, offset_of_max_timestamp
        if entries is not None:
            oi, ti = self.offset_index, self.time_index
            for offset, position, ts, ts_offset in entries:
                oi.append(offset, position)
                # Entries carry the running max within this append; the
                # segment's running max is the larger of that and seg_max.
                if ts <= seg_max:
                    ts, ts_offset = seg_max, seg_off
                if ts >= 0:
                    ti.maybe_append(ts, ts_offset)
        self.bytes_since_last_index_entry = bytes_since

    def try_append(self, buf, n: int, next_offset: int, leader_epoch: int,
                   time_ms: Callable[[], int], segment_bytes: int, segment_ms: int,
                   assign_offsets: bool):
        """The append in one kernel call (``log_scan.append_batches``): ``n`` bytes of
        whole batches (validated, no producer ids to check) go to the end of this
        segment, offsets assigned from ``next_offset`` (or checked), with their index
        entries. None, with nothing written, when :meth:`should_roll` would be true;
        then the caller rolls and appends the slow way. Raises what
        ``prepare_append`` raises, KafkaStorageError on I/O failure.

        Returns ``(first_offset, next_offset, batch_count, max_timestamp,
        offset_of_max_timestamp, ...)``, the maxima those of these batches."""
        size = self.size
        if size > segment_bytes - n:
            return None
        if not self._writable_indexes:
            self.prepare_writable()
        oi = self.offset_index
        ti = self.time_index
        if (oi.is_loaded and oi.is_full) or (ti.is_loaded and ti.is_full):
            return None          # (an index not loaded here is one without a file: empty)
        roll_after = _INT64_MAX
        if size > 0:
            limit = segment_ms - self.roll_jitter_ms
            t = self._rolling_ts if self._rolling_ts_loaded else self.rolling_based_timestamp
            if t is not None and t >= 0:
                roll_after = t + limit           # roll when max_ts - t > limit
                if roll_after > _INT64_MAX:
                    roll_after = _INT64_MAX
            elif time_ms() - self.created_ms > limit:
                return None
        if not self._max_ts_loaded:
            self._load_largest_timestamp()
        try:
            f = self._file
            r = _scan.append_batches(buf, f.fd if f is not None else self.fd, size, next_offset,
                                     leader_epoch,
                                     self.base_offset, self.bytes_since_last_index_entry,
                                     self.index_interval_bytes, self._max_ts,
                                     self._offset_of_max_ts, roll_after, oi, ti,
                                     assign_offsets, self.fsync_every_append)
        except OSError as e:
            raise KafkaStorageError(f"error while appending to {self.log_path}: {e}") from e
        if r is None:
            return None
        if size == 0:
            self._rolling_ts = r[3]
            self._rolling_ts_loaded = True
        self.size = size + n
        self.bytes_since_last_index_entry = r[5]
        self._max_ts = r[6]
        self._offset_of_max_ts = r[7]
        return r

    # -- reads -------------------------------------------------------------------
    def translate_offset(self, offset: int, starting_position: int = 0):
        """(base_offset, last_offset, position, size) of the first batch whose
        last offset is >= ``offset``, or None if there is none."""
        if not self._indexes_checked:
            self._check_indexes()
        f = self._file or self.file
        fd = f.pin()
        try:
            pos = self._position_before(offset)
            if pos < starting_position:
                pos = starting_position
            return _scan.search_offset(fd, pos, self.size, offset)
        finally:
            f.unpin()

    def read(self, start_offset: int, max_size: int, max_position: int | None = None,
             min_one_message: bool = False) -> FetchDataInfo | None:
        """Batches from the one containing ``start_offset``, at most
        ``max_size`` bytes (or the whole first batch if min_one_message) and
        not past ``max_position``; None if start_offset is beyond this segment."""
        if max_size < 0:
            raise ValueError(f"Invalid max size {max_size} for log read from segment {self.log_path}")
        if max_position is None:
            max_position = self.size
        mapping = self.translate_offset(start_offset)
        if mapping is None:
            return None
        _, _, start_pos, batch_size = mapping
        meta = LogOffsetMetadata(start_offset, self.base_offset, start_pos)
        adjusted = max(max_size, batch_size) if min_one_message else max_size
        if adjusted == 0:
            return FetchDataInfo(meta, EMPTY_RECORDS)
        fetch_size = min(max_position - start_pos, adjusted)
        if fetch_size <= 0:
            return FetchDataInfo(meta, EMPTY_RECORDS)
        if adjusted < batch_size:
            return FetchDataInfo(meta, EMPTY_RECORDS, True)
        f = self.file
        if f.closed:
            raise SegmentClosedError(f"segment file {self.log_path} is closed")
        return FetchDataInfo(meta, FileRegion(f, start_pos, fetch_size), False)

    def batch_headers(self, start_offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches from the one holding ``start_offset`` to the end
        of the segment (producer-state rebuild). The file is mapped while iterating."""
        if self.size == 0:
            return
        size = self.size
        if size <= _SCAN_WITHOUT_INDEX:
            # one pread instead of mmap, madvise, faults, munmap; the batches below
            # start_offset are skipped here rather than found through the offset index,
            # which a restart's producer-state replay would otherwise open for every
            # partition (Kafka's lazy indexes)
            for h in iter_batch_headers(_pread_exactly(self.fd, size), 0, size):
                if h.base_offset + h.last_offset_delta >= start_offset:
                    yield h
            return
        if start_offset <= self.base_offset:
            pos = 0
        else:
            mapping = self.translate_offset(start_offset)
            if mapping is None:
                return
            pos = mapping[2]
        with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as m:
            yield from iter_batch_headers(m, pos, size)

    def read_end_txn_marker(self, header: BatchHeader) -> tuple[bool, int] | None:
        """The COMMIT/ABORT marker of the control batch ``header`` (see end_txn_marker)."""
        return end_txn_marker(os.pread(self.fd, header.size_in_bytes, header.position))

    def read_next_offset(self) -> int:
        """Offset after the last batch (base_offset if empty): scans headers
        from the last offset-index entry, or from the start of a segment of at most
        ``_SCAN_WITHOUT_INDEX`` bytes (its index then stays unchecked and unopened until
        first used, as Kafka's lazy indexes at start-up)."""
        if self.size <= _SCAN_WITHOUT_INDEX:
            pos = 0
        else:
            self._check_indexes()
            oi = self.offset_index
            n = oi.entries
            pos = oi.entry(n - 1)[1] if n else 0
        if pos > self.size:
            pos = 0
        nxt = _scan.scan_headers(self.fd, pos, self.size)[0]
        return self.base_offset if nxt < 0 else nxt

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int,
                                 max_position: int | None = None) -> TimestampAndOffset | None:
        """First record with timestamp >= ``timestamp`` and offset >= starting_offset,
        among the batches before ``max_position`` (default: the segment's size)."""
        if not self._indexes_checked:
            self._check_indexes()
        end = self.size if max_position is None else max_position
        f = self._file or self.file
        fd = f.pin()
        try:
            ts_off = self.time_index.lookup(timestamp)[1]
            pos = self.offset_index.lookup(max(ts_off, starting_offset))[1]
            while pos < end:
                hit = _scan.search_timestamp(fd, pos, end, timestamp, starting_offset)
                if hit is None:
                    return None
                bo, last, bpos, bsize, _ = hit
                found = self._record_at_or_after(fd, bpos, bsize, timestamp, starting_offset)
                if found is not None:
                    return found
                pos = bpos + bsize
            return None
        finally:
            f.unpin()

    @staticmethod
    def _record_at_or_after(fd: int, position: int, size: int, timestamp: int, starting_offset: int):
        from kbroker.kernels import records
        data = os.pread(fd, size, position)
        batch = records.decode_batch(data, check_crc=False)
        epoch = batch.partition_leader_epoch
        for r in batch.records:
            if r.timestamp >= timestamp and r.offset >= starting_offset:
                return TimestampAndOffset(r.timestamp, r.offset, epoch)
        return None

    def offset_of_max_timestamp_record(self, max_position: int | None = None) -> TimestampAndOffset | None:
        """Offset of the first record carrying this segment's max timestamp (ListOffsets
        MAX_TIMESTAMP); None if there is none before ``max_position``."""
        ts = self.max_timestamp_so_far
        if ts < 0:
            return None
        return self.find_offset_by_timestamp(ts, self.base_offset, max_position)

    def max_timestamp_record_below(self, max_position: int) -> TimestampAndOffset | None:
        """The first record with the largest timestamp among the batches before
        ``max_position``, by a header scan (the active segment, when its running
        maximum belongs to a batch past a reader's bound)."""
        f = self._file or self.file
        fd = f.pin()
        try:
            mts = _scan.scan_headers(fd, 0, max_position)[2]
        finally:
            f.unpin()
        if mts < 0:
            return None
        return self.find_offset_by_timestamp(mts, self.base_offset, max_position)

    # -- timestamps ------------------------------------------------------------
    def _load_largest_timestamp(self) -> None:
        """Kafka's loadLargestTimestamp: last time-index entry, then a header
        scan from the offset-index position of that entry's offset. Once, under
        ``_lazy_lock`` (a reader may load it while the writer appends: the writer
        checks ``_max_ts_loaded`` before it updates the running maximum)."""
        with self._lazy_lock:
            if self._max_ts_loaded:
                return
            self._check_indexes()
            f = self.file
            fd = f.pin()
            try:
                if self.index_files_absent():    # empty: the whole (small) .log, not a new file
                    ts, off, pos = -1, self.base_offset, 0
                else:
                    ts, off = self.time_index.last_entry
                    pos = self.offset_index.lookup(off)[1]
                size = self.size
                if pos > size:
                    pos = 0
                _, _, mts, moff, _, _ = _scan.scan_headers(fd, pos, size)
            finally:
                f.unpin()
            if mts > ts:
                ts, off = mts, moff
            self._max_ts, self._offset_of_max_ts = ts, (off if ts >= 0 else -1)
            self._max_ts_loaded = True

    @property
    def max_timestamp_so_far(self) -> int:
        if not self._max_ts_loaded:
            self._load_largest_timestamp()
        return self._max_ts

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        if not self._max_ts_loaded:
            self._load_largest_timestamp()
        return self._offset_of_max_ts

    @property
    def last_modified_ms(self) -> int:
        try:
            return int(os.stat(self.log_path).st_mtime * 1000)
        except FileNotFoundError:
            return 0

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime if no batch has one (Kafka)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    @property
    def rolling_based_timestamp(self) -> int | None:
        if not self._rolling_ts_loaded:
            self._rolling_ts_loaded = True
            if self.size >= 61:
                h = os.pread(self.fd, 61, 0)
                if len(h) == 61:
                    self._rolling_ts = _MAX_TS.unpack_from(h, 35)[0]
        return self._rolling_ts

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        t = self.rolling_based_timestamp
        if t is not None and t >= 0:
            return message_timestamp - t
        return now_ms - self.created_ms

    def should_roll(self, messages_size: int, max_timestamp: int, max_offset: int, now_ms: int,
                    segment_bytes: int, segment_ms: int) -> bool:
        """Kafka's shouldRoll: size, age (segment.ms minus this segment's
        jitter), a full index, or an offset that would not fit in 32 bits."""
        size = self.size
        if size > segment_bytes - messages_size:
            return True
        if size > 0 and self.time_waited_for_roll(now_ms, max_timestamp) > segment_ms - self.roll_jitter_ms:
            return True
        if max_offset - self.base_offset > INT32_MAX or max_offset < self.base_offset:
            return True
        if not self._writable_indexes:
            self.prepare_writable()
        oi, ti = self.offset_index, self.time_index
        return (oi.is_loaded and oi.is_full) or (ti.is_loaded and ti.is_full)

    # -- recovery / truncation ---------------------------------------------------
    def _scan_file(self, verify_crc: bool, expected_next_offset: int = -1, max_batch_size: int = INT32_MAX):
        size = self.size
        if size == 0:
            return _scan.scan(b"", self.base_offset, self.index_interval_bytes, verify_crc,
                              expected_next_offset=expected_next_offset)
        if size <= _SCAN_WITHOUT_INDEX:   # a small (active) segment: one pread, no mapping
            return _scan.scan(_pread_exactly(self.fd, size), self.base_offset, self.index_interval_bytes,
                              verify_crc, 0, size, max_batch_size, expected_next_offset)
        with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as m:
            try:
                m.madvise(mmap.MADV_SEQUENTIAL)
            except (AttributeError, OSError):
                pass
            return _scan.scan(m, self.base_offset, self.index_interval_bytes, verify_crc, 0, size,
                              max_batch_size, expected_next_offset)

    def recover(self, leader_epoch_cache=None, max_batch_size: int = INT32_MAX):
        """Kafka's LogSegment.recover: CRC-scan the whole ``.log``, truncate at
        the first invalid byte, rebuild both indexes. Returns (bytes truncated, ScanResult)."""
        self._indexes_checked = True
        self.size = os.fstat(self.fd).st_size
        r = self._scan_file(True, max_batch_size=max_batch_size)
        if not self._write_scanned_indexes(r):
            self.offset_index.reset()
            self.time_index.reset()
            self._apply_scan(r)
        if leader_epoch_cache is not None:
            for epoch, offset in r.epochs:
                latest = leader_epoch_cache.latest_epoch
                if latest is None or epoch > latest:
                    leader_epoch_cache.assign(epoch, offset)
        truncated = self.size - r.valid_bytes
        if truncated > 0:
            os.ftruncate(self.fd, r.valid_bytes)
            self.size = r.valid_bytes
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self._writable_indexes = False
        self.bytes_since_last_index_entry = 0
        self._rolling_ts = r.first_batch_max_timestamp if r.batch_count else None
        self._rolling_ts_loaded = True
        return truncated, r

    def _write_scanned_indexes(self, r) -> bool:
        """Write the indexes of a scan (its entries, plus the time index's final entry
        for the segment's max timestamp) as two files of exactly those entries, with
        ``pwrite``, and reopen them lazily. Storing through a fresh mapping of a
        sparse, preallocated index faults a block in on its first page, which costs
        milliseconds on a busy ext4, a buffered write does not. False (nothing done)
        if the entries do not fit the max index size; the caller then fills the maps."""
        oi_bytes = bytes(r.offset_index_entries)
        ti_bytes = bytes(r.time_index_entries)
        if not oi_bytes and not ti_bytes and r.valid_bytes <= self.index_interval_bytes \
                and self.index_files_absent():
            # a small segment without index files (LogSegment.close): it stays without
            self._max_ts, self._offset_of_max_ts = r.max_timestamp, r.offset_of_max_timestamp
            self._max_ts_loaded = True
            self._indexes_maybe_absent = True
            return True
        if r.max_timestamp >= 0:
            last_ts = _MAX_TS.unpack_from(ti_bytes, len(ti_bytes) - 12)[0] if ti_bytes else -1
            if r.max_timestamp > last_ts:
                ti_bytes += _TIME_ENTRY.pack(r.max_timestamp, r.offset_of_max_timestamp - self.base_offset)
        if len(oi_bytes) > self.max_index_size - 8 or len(ti_bytes) > self.max_index_size - 12:
            return False
        self._replace_index_files(oi_bytes, ti_bytes)
        self._max_ts, self._offset_of_max_ts = r.max_timestamp, r.offset_of_max_timestamp
        self._max_ts_loaded = True
        return True

    def _replace_index_files(self, oi_bytes: bytes | None, ti_bytes: bytes | None) -> None:
        """Replace the offset index (and/or the time index) file by exactly these
        entries (None: leave that one alone); the new index objects load lazily."""
        self._indexes_maybe_absent = False
        if oi_bytes is not None:
            path = self.offset_index.path
            self.offset_index.close_handler()
            _write_file_unless_equal(path, oi_bytes)
            self.offset_index = _offset_index.OffsetIndex(path, self.base_offset, self.max_index_size)
        if ti_bytes is not None:
            path = self.time_index.path
            self.time_index.close_handler()
            _write_file_unless_equal(path, ti_bytes)
            self.time_index = _time_index.TimeIndex(path, self.base_offset, self.max_index_size)
        self._writable_indexes = False

    def _apply_scan(self, r) -> None:
        self.offset_index.append_raw(r.offset_index_entries)
        self.time_index.append_raw(r.time_index_entries)
        if r.max_timestamp >= 0:
            self.time_index.maybe_append(r.max_timestamp, r.offset_of_max_timestamp, True)
        self._max_ts, self._offset_of_max_ts = r.max_timestamp, r.offset_of_max_timestamp
        self._max_ts_loaded = True

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the ``.log`` without touching it (corrupt
        or missing index found after start-up)."""
        # Recreate from scratch: a broken file may not even map.
        for idx in (self.offset_index, self.time_index):
            idx.delete_if_exists()
        prefix = os.path.join(self.dir, filename_prefix(self.base_offset))
        suffix = self.log_path[len(prefix) + len(LOG_SUFFIX):]
        self.offset_index = _offset_index.OffsetIndex(prefix + INDEX_SUFFIX + suffix, self.base_offset,
                                                      self.max_index_size)
        self.time_index = _time_index.TimeIndex(prefix + TIME_INDEX_SUFFIX + suffix, self.base_offset,
                                                self.max_index_size)
        self._indexes_checked = True
        r = self._scan_file(False)
        if not self._write_scanned_indexes(r):
            self._apply_scan(r)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self._writable_indexes = False

    def truncate_to(self, offset: int) -> int:
        """Remove every batch from the one containing ``offset`` on (Kafka's
        truncateTo); returns the bytes removed. The segment becomes writable."""
        mapping = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self.offset_index.resize(self.max_index_size)
        self.time_index.resize(self.max_index_size)
        self._writable_indexes = True
        if mapping is None:
            truncated = 0
        else:
            pos = mapping[2]
            truncated = self.size - pos
            os.ftruncate(self.fd, pos)
            self.size = pos
        if self.size == 0:
            self.created_ms = self._time_ms()
            self._rolling_ts, self._rolling_ts_loaded = None, True
        self.bytes_since_last_index_entry = 0
        self._max_ts_loaded = False
        return truncated

    def on_become_inactive(self) -> None:
        """Roll: final time-index entry for the max timestamp, trim both indexes.
        An index still without a file (``prepare_writable``) gets one of exactly its
        entries (none, or the final time entry), created only if no reader created it
        meanwhile; the index objects stay (lock-free readers may hold them)."""
        self._indexes_maybe_absent = False
        final = None
        if self._max_ts_loaded or self.time_index.is_loaded:
            ts = self.max_timestamp_so_far
            if ts >= 0:
                final = (ts, self._offset_of_max_ts)
        # the final entry grows an index that was never extended by just that entry
        # (maybe_append's skip_full_check), and trimming cuts any extension away
        if not (self._unopened(self.offset_index) and _create_exclusive(self.offset_index.path, b"")):
            self.offset_index.trim_to_valid_size()
        self.offset_index.growable = False
        ti = self.time_index
        first = b"" if final is None else _TIME_ENTRY.pack(final[0], final[1] - self.base_offset)
        if not (self._unopened(ti) and _create_exclusive(ti.path, first)):
            if final is not None:
                ti.maybe_append(final[0], final[1], True)
            ti.trim_to_valid_size()
        ti.growable = False
        self.trim()
        self._writable_indexes = False

    def trim(self) -> None:
        """Cut a preallocated ``.log`` back to its ``size`` (Kafka's FileRecords.trim).
        Only a segment created preallocated can be longer: a loaded one starts at its
        file's length and every append or truncation keeps the two equal."""
        f = self._file
        if self._preallocated and f is not None and not f.closed and os.fstat(f.fd).st_size > self.size:
            os.ftruncate(f.fd, self.size)

    # -- durability / lifecycle ----------------------------------------------------
    def flush(self) -> None:
        """fsync the ``.log`` and msync both indexes (Kafka's LogSegment.flush)."""
        if self._file is not None and not self._file.closed:
            os.fsync(self._file.fd)
        self.offset_index.flush()
        self.time_index.flush()
        if self.txn_index.entries:
            self.txn_index.flush()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the files (e.g. '' -> '.deleted'); open fds and maps stay valid."""
        def renamed(path: str) -> str:
            base = path[: len(path) - len(old_suffix)] if old_suffix and path.endswith(old_suffix) else path
            return base + new_suffix
        new_log = renamed(self.log_path)
        if os.path.exists(self.log_path):
            os.replace(self.log_path, new_log)
        self.log_path = new_log
        if self._file is not None:
            self._file.path = new_log
        self.offset_index.rename_to(renamed(self.offset_index.path))
        self.time_index.rename_to(renamed(self.time_index.path))
        self.txn_index.rename_to(renamed(self.txn_index.path))

    def moved_dir(self, old_dir: str, new_dir: str) -> None:
        """The partition directory was renamed: update paths (fds/maps stay valid)."""
        self.dir = new_dir
        self.log_path = new_dir + self.log_path[len(old_dir):]
        if self._file is not None:
            self._file.path = self.log_path
        self.offset_index.rename_to(new_dir + self.offset_index.path[len(old_dir):])
        self.time_index.rename_to(new_dir + self.time_index.path[len(old_dir):])
        self.txn_index.path = new_dir + self.txn_index.path[len(old_dir):]

    def close(self) -> None:
        """Clean close: trim indexes, unmap, close the fd. A segment of at most
        index.interval.bytes whose indexes have no file yet gets none: they hold no
        entry (the index rule adds the first only after index.interval.bytes), the time
        index's final entry is its max timestamp, which a load reads back from the
        ``.log`` in one small read, and ``recovery.load_log`` takes the two missing
        files of such a segment for empty ones (``mark_index_files_absent``), not lost
        ones. (Creating two files per partition was most of a clean stop at 10,000.)"""
        if self.size <= self.index_interval_bytes and self.index_files_absent():
            self.trim()
            self._writable_indexes = False
        elif self._writable_indexes:
            self.on_become_inactive()
        else:
            self.trim()
            if self.size == 0:      # a new segment never appended to: empty index files,
                # so the next start-up finds them and does not rebuild them
                for idx in (self.offset_index, self.time_index):
                    if self._unopened(idx):
                        _create_exclusive(idx.path, b"")
        self._closed = True
        self.offset_index.close()
        self.time_index.close()
        if self._file is not None:
            self._file.close()

    def close_handlers(self) -> None:
        self._closed = True
        self.offset_index.close_handler()
        self.time_index.close_handler()
        if self._file is not None:
            self._file.close()

    def delete_if_exists(self) -> None:
        """Close everything and unlink the files."""
        self.close_handlers()
        for path in (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, path={self.log_path!r})"
