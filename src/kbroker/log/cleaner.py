"""Log compaction: keep the latest record per key (Kafka's ``LogCleaner``,
``LogCleanerManager``, ``CleanerConfig``; core/.../log/LogCleaner.scala).

A compacted log (``cleanup.policy`` containing ``compact``) has two parts::

    | clean (compacted before) | dirty (written since)    | uncleanable    |
    0                 first_dirty_offset   first_uncleanable_offset   log end
                      (cleaner-offset-checkpoint)  (a segment base offset)

* ``first_dirty_offset`` is what the last cleaning reached, kept per
  partition in ``<log.dir>/cleaner-offset-checkpoint`` (Kafka's format:
  ``0`` / count / ``topic partition offset``). Missing, below the log start
  offset or past the log end, it is reset to the log start offset.
* ``first_uncleanable_offset`` is the base offset of the segment holding
  the smallest of: the last stable offset (no open transaction's data is
  cleaned), the active segment's base offset, and the first dirty
  segment whose largest timestamp is younger than ``min.compaction.lag.ms``.
  The active segment is never cleaned.

Choosing a log (``grab_filthiest_log``): among compacted logs not being
cleaned and not marked uncleanable, the one with the highest
``cleanable_ratio = dirty bytes / (clean + dirty bytes)`` that is above
``min.cleanable.dirty.ratio`` (Kafka compares with ``>``) — or that has
dirty bytes and a first dirty segment whose first batch is older than
``max.compaction.lag.ms`` (must be compacted now).

Cleaning one log (``Cleaner.clean``):

1. Build the offset map (kernel ``offset_map``: key hash -> latest offset)
   over the dirty segments from the first dirty offset. The map has a
   fixed size (``log.cleaner.dedupe.buffer.size`` / threads); when it is
   full, only the prefix mapped so far is cleaned this round:
   ``end_offset = map.latest_offset + 1``.
2. Group every segment below ``end_offset`` (clean ones too) into runs
   that fit ``segment.bytes`` and ``segment.index.bytes`` and a 32-bit
   offset range; each run becomes one new segment.
3. For each run, filter its batches record by record into
   ``<base>.log.cleaned`` (+ ``.index.cleaned``, ``.timeindex.cleaned``),
   keeping original offsets (see ``offset_map.filter_batches`` for what
   survives and how batch metadata is kept), flush it, give it the mtime
   of the run's last segment, then swap it in with ``Log.replace_segments``:
   ``.cleaned`` -> ``.swap``; segment list updated under the log lock, old
   segments renamed ``.deleted`` (removed after ``file.delete.delay.ms``);
   ``.swap`` -> live. recovery.py finishes or rolls back a swap cut short
   by a crash (``.cleaned`` files are dropped, ``.swap`` files completed).
4. Write ``end_offset`` to the checkpoint.

Tombstones (null values) are kept until ``delete.retention.ms`` after the
cleaning that first kept them (KIP-534: the batch gets a delete horizon).

Threads: ``log.cleaner.threads`` cleaner threads (``kbroker-log-cleaner-thread-N``),
each with its own OffsetMap, allocated on first use; a thread that finds
nothing to clean waits ``log.cleaner.backoff.ms`` (``maybe_clean`` wakes it).
``_lock`` guards the in-progress set, the uncleanable set and the
checkpoint cache; a log being cleaned is in ``_in_progress`` so no two
threads clean it at once. The cleaner reads segment files through its own
file descriptors without the log lock (non-active segments do not change);
the swap re-checks, under the log lock, that the segments it replaces are
still the log's (retention, truncation or deletion may have raced it) and
otherwise drops its work.

Transactions (Kafka's CleanedTransactionMetadata, ``_TxnCleanState``): the
batches of aborted transactions (from the ``.txnindex``) are dropped whole and
their keys never enter the offset map, so an aborted record cannot shadow a
committed one. A marker stays while its transaction's data was read in the
cleaning (an ABORT marker's ``.txnindex`` entry then goes to the cleaned segment,
renamed with it through ``.cleaned`` / ``.swap``); once its data is gone it gets
a delete horizon and goes at the first cleaning after ``delete.retention.ms``.
Logs without a sign of transactions skip the pass (``_txn_clean_state``).

Not done yet (seams): producer snapshots of replaced segments, I/O throttling
(``log.cleaner.io.max.bytes.per.second``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kbroker.kernels import crc32c as _crc32c
from kbroker.kernels import log_scan as _scan
from kbroker.kernels import offset_map as _omap
from kbroker.log.checkpoints import CheckpointError, OffsetCheckpointFile
from kbroker.log.errors import KafkaStorageError
from kbroker.log.segment import CLEANED_SUFFIX, LogSegment

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
INT32_MAX = 0x7FFFFFFF

TopicPartition = tuple  # (topic, partition)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class CleanerConfig:
    """Broker-level cleaner settings (Kafka's ``CleanerConfig``)."""

    num_threads: int = 1                        # log.cleaner.threads
    dedupe_buffer_size: int = 134217728         # log.cleaner.dedupe.buffer.size (all threads)
    dedupe_buffer_load_factor: float = 0.9      # log.cleaner.io.buffer.load.factor
    io_buffer_size: int = 524288                # log.cleaner.io.buffer.size (first read size)
    max_io_buffer_size: int = 1048588           # grown up to this (Kafka: message.max.bytes)
    backoff_ms: int = 15000                     # log.cleaner.backoff.ms
    enable_cleaner: bool = True                 # log.cleaner.enable

    @property
    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.num_threads, 1), INT32_MAX)


class CleaningAbortedError(Exception):
    """Cleaning of a log stopped: the cleaner is shutting down, the log was
    deleted or changed under it (Kafka's LogCleaningAbortedException)."""


@dataclass
class CleanerStats:
    """What one cleaning did (Kafka's CleanerStats)."""

    map_bytes_read: int = 0
    map_records_read: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    segments_replaced: int = 0
    groups: int = 0
    map_full: bool = False
    start_s: float = field(default_factory=time.monotonic)
    end_s: float = 0.0

    @property
    def elapsed_s(self) -> float:
        return (self.end_s or time.monotonic()) - self.start_s


def _segments_overlapping(segments, from_offset: int, to_offset: int):
    """Segments holding offsets in [from_offset, to_offset) (Kafka's
    logSegments(from, to)): the floor segment of from_offset on, while base < to."""
    out = []
    for i, seg in enumerate(segments):
        nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if nxt is not None and nxt <= from_offset:
            continue
        if seg.base_offset >= to_offset:
            break
        out.append(seg)
    return out


def _non_active_from(segments, from_offset: int):
    """Kafka's nonActiveLogSegmentsFrom: non-active segments overlapping [from, active base)."""
    active = segments[-1]
    if from_offset > active.base_offset:
        return []
    return _segments_overlapping(segments, from_offset, active.base_offset)


class LogToClean:
    """A candidate log and its clean / cleanable byte counts (Kafka's LogToClean)."""

    __slots__ = ("topic_partition", "log", "first_dirty_offset", "first_uncleanable_offset",
                 "clean_bytes", "cleanable_bytes", "need_compaction_now", "segments")

    def __init__(self, tp, lg, first_dirty_offset: int, uncleanable_offset: int, need_compaction_now: bool,
                 segments=None):
        segs = segments if segments is not None else lg.segments
        self.topic_partition = tp
        self.log = lg
        self.segments = segs
        self.first_dirty_offset = first_dirty_offset
        self.need_compaction_now = need_compaction_now
        self.clean_bytes = sum(s.size for s in segs if s.base_offset < first_dirty_offset)
        first_unc = _non_active_from(segs, uncleanable_offset)
        self.first_uncleanable_offset = first_unc[0].base_offset if first_unc else segs[-1].base_offset
        lo = min(first_dirty_offset, self.first_uncleanable_offset)
        self.cleanable_bytes = sum(s.size for s in _segments_overlapping(segs, lo, self.first_uncleanable_offset))

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        t = self.total_bytes
        return self.cleanable_bytes / t if t else 0.0

    def __repr__(self) -> str:
        return (f"LogToClean({self.log.name}, first_dirty_offset={self.first_dirty_offset}, "
                f"first_uncleanable_offset={self.first_uncleanable_offset}, "
                f"ratio={self.cleanable_ratio:.3f}, now={self.need_compaction_now})")


def cleanable_offsets(lg, last_clean_offset: int | None, now_ms: int, segments=None) -> tuple[int, int, bool]:
    """(first_dirty_offset, first_uncleanable_dirty_offset, force_update_checkpoint)
    (Kafka's LogCleanerManager.cleanableOffsets)."""
    segs = segments if segments is not None else lg.segments
    log_start = lg.log_start_offset
    checkpoint = log_start if last_clean_offset is None else last_clean_offset
    if checkpoint < log_start:
        first_dirty, force = log_start, True
        if not lg.config.delete:
            log.warning("Resetting first dirty offset of %s to log start offset %d since the checkpointed "
                        "offset %d is invalid.", lg.name, log_start, checkpoint)
    elif checkpoint > lg.log_end_offset:
        log.warning("The last checkpoint dirty offset for partition %s is %d, which is larger than the log "
                    "end offset %d. Resetting to the log start offset %d.", lg.name, checkpoint,
                    lg.log_end_offset, log_start)
        first_dirty, force = log_start, True
    else:
        first_dirty, force = checkpoint, False
    lso = getattr(lg, "last_stable_offset", None)
    candidates = [lg.high_watermark if lso is None else lso, segs[-1].base_offset]
    min_lag = max(lg.config.min_compaction_lag_ms, 0)
    if min_lag > 0:
        for s in _non_active_from(segs, first_dirty):
            if s.largest_timestamp > now_ms - min_lag:
                candidates.append(s.base_offset)
                break
    return first_dirty, min(candidates), force


def max_compaction_delay(lg, first_dirty_offset: int, now_ms: int, segments=None) -> int:
    """How far past max.compaction.lag.ms the oldest dirty segment is (0: not due)."""
    segs = segments if segments is not None else lg.segments
    firsts = [t for t in (s.rolling_based_timestamp for s in _non_active_from(segs, first_dirty_offset))
              if t is not None and t > 0]
    earliest = min(firsts) if firsts else None
    clean_until = now_ms - max(lg.config.max_compaction_lag_ms, 0)
    if earliest is not None and earliest < clean_until:
        return clean_until - earliest
    return 0


def _index_bytes(index) -> int:
    """Valid bytes of a non-active segment's index without loading it (its
    file is trimmed to its entries when the segment rolls)."""
    if index.is_loaded:
        return index.size_in_bytes
    try:
        return os.path.getsize(index.path)
    except OSError:
        return 0


def group_segments_by_size(segments, max_size: int, max_index_size: int, first_uncleanable_offset: int):
    """Runs of consecutive segments whose log, offset-index and time-index
    sizes fit one segment and whose offsets fit 32 bits relative to the run's
    base (Kafka's groupSegmentsBySize)."""
    groups = []
    segs = list(segments)
    i = 0
    while i < len(segs):
        group = [segs[i]]
        log_size = segs[i].size
        index_size = _index_bytes(segs[i].offset_index)
        time_size = _index_bytes(segs[i].time_index)
        i += 1
        while i < len(segs):
            s = segs[i]
            last_offset = (segs[i + 1].base_offset - 1 if i + 1 < len(segs) else first_uncleanable_offset - 1)
            si = _index_bytes(s.offset_index)
            st = _index_bytes(s.time_index)
            if (log_size + s.size <= max_size and index_size + si <= max_index_size
                    and time_size + st <= max_index_size
                    and (s.size == 0 or last_offset - group[0].base_offset <= INT32_MAX)):
                group.append(s)
                log_size += s.size
                index_size += si
                time_size += st
                i += 1
            else:
                break
        groups.append(group)
    return groups


def _active_producers(lg) -> dict[int, int] | None:
    """{producer_id: last data offset} of the log's active producers — their
    last batch keeps its header even when emptied (Kafka's
    lastRecordsOfActiveProducers). None until the log tracks producers."""
    psm = getattr(lg, "producer_state_manager", None) or getattr(lg, "producer_state", None)
    if psm is None:
        return None
    for _ in range(5):   # the map is the log's (append lock); a concurrent append may resize it
        try:
            return {pid: e.last_data_offset for pid, e in list(psm.active_producers.items())
                    if e.last_data_offset >= 0}
        except RuntimeError:
            continue
        except AttributeError:
            return None
    return None


_V2_HEADER_SIZE = 61
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_DELETE_HORIZON = 0x40


class _AbortedTracker:
    """Which transactional batches belong to an aborted transaction, walking batches in
    offset order (Kafka's CleanedTransactionMetadata): a producer is aborting from the
    first offset of one of its aborted transactions (``.txnindex``) until its ABORT marker."""

    def __init__(self, aborted):
        self.pending = sorted((a.first_offset, a.producer_id) for a in aborted)
        self.k = 0
        self.aborting: set[int] = set()

    def __bool__(self) -> bool:
        return self.k < len(self.pending) or bool(self.aborting)

    def discards(self, data, pos: int) -> bool:
        """True for a data batch of an aborted transaction (the batch at ``pos`` of ``data``,
        a whole v2 batch); updates the state for a marker."""
        attrs = int.from_bytes(data[pos + 21:pos + 23], "big")
        if not attrs & _TRANSACTIONAL:
            return False
        base = int.from_bytes(data[pos:pos + 8], "big", signed=True)
        last = base + int.from_bytes(data[pos + 23:pos + 27], "big", signed=True)
        pid = int.from_bytes(data[pos + 43:pos + 51], "big", signed=True)
        pending = self.pending
        while self.k < len(pending) and pending[self.k][0] <= last:
            self.aborting.add(pending[self.k][1])
            self.k += 1
        if attrs & _CONTROL:
            if pid in self.aborting:
                from kbroker.records.control import parse_end_txn_marker
                size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
                m = parse_end_txn_marker(bytes(data[pos:pos + size]))
                if m is not None and m.is_abort:
                    self.aborting.discard(pid)
            return False
        return pid in self.aborting


def _complete_batches(data) -> list[tuple[int, int]]:
    """(position, size) of the whole v2 batches at the start of ``data``."""
    out = []
    pos, n = 0, len(data)
    while n - pos >= _V2_HEADER_SIZE:
        size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big", signed=True)
        if size < _V2_HEADER_SIZE or size > n - pos:
            break
        out.append((pos, size))
        pos += size
    return out


def _mask_aborted(data, tracker: _AbortedTracker) -> bytes:
    """A copy of ``data`` whose aborted batches carry the control flag, so the map
    builder skips their keys (same size: its consumed counts stay valid)."""
    buf = None
    for pos, size in _complete_batches(data):
        if tracker.discards(data, pos):
            if buf is None:
                buf = bytearray(data)
            buf[pos + 22] |= _CONTROL
            crc = _crc32c.crc32c(memoryview(buf)[pos + 21:pos + size])   # the builder checks it
            buf[pos + 17:pos + 21] = crc.to_bytes(4, "big")
    return data if buf is None else bytes(buf)


class _TxnCleanState:
    """Kafka's CleanedTransactionMetadata for the filtering pass of one cleaning (all its
    groups, in offset order): which batches of transactions go, which markers may go.

    * A data batch of a producer inside one of its aborted transactions (from the first
      offset of the ``.txnindex`` entry to its ABORT marker) is dropped; its transaction
      is marked *observed*.
    * An ABORT marker whose transaction was observed in this pass stays, and its entry
      goes to the cleaned segment's ``.txnindex``; otherwise (its data is gone) it may go.
    * A COMMIT marker stays while a batch of its transaction was read in this pass.
    * A marker that may go gets a delete horizon (now + ``delete.retention.ms``) the first
      time, and is removed by the first cleaning after its horizon: consumers that
      started reading before it still see it.
    """

    def __init__(self, aborted, now_ms: int, delete_retention_ms: int):
        self.pending = sorted({(a.first_offset, a.producer_id): a for a in aborted}.items())
        self.k = 0
        self.aborting: dict[int, list] = {}      # producer id -> [AbortedTxn, observed]
        self.committing: set[int] = set()
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.cleaned_index = None                  # the TransactionIndex being written
        self.markers_dropped = 0

    def _consume_up_to(self, offset: int) -> None:
        pending = self.pending
        while self.k < len(pending) and pending[self.k][0][0] <= offset:
            txn = pending[self.k][1]
            self.aborting.setdefault(txn.producer_id, [txn, False])
            self.k += 1

    def filter(self, data):
        """``data``'s whole batches after the transaction rules: (kept bytes, bytes of whole
        batches consumed). Without a transactional batch among them, ``data``'s whole
        batches as they are (one byte test per batch, no copy)."""
        mv = memoryview(data)
        pos, n = 0, len(mv)
        kept = None             # bytearray once a batch changed
        start = 0               # first byte not yet copied to ``kept``
        while n - pos >= _V2_HEADER_SIZE:
            size = 12 + int.from_bytes(mv[pos + 8:pos + 12], "big", signed=True)
            if size < _V2_HEADER_SIZE or size > n - pos:
                break
            if mv[pos + 22] & (_TRANSACTIONAL | _CONTROL):
                batch = mv[pos:pos + size]
                out = self._batch(batch)
                if out is not batch:
                    if kept is None:
                        kept = bytearray()
                    kept += mv[start:pos]
                    if out is not None:
                        kept += out
                    start = pos + size
            pos += size
        if kept is None:
            return mv[:pos], pos
        kept += mv[start:pos]
        return bytes(kept), pos

    def _batch(self, batch):
        attrs = int.from_bytes(batch[21:23], "big")
        base = int.from_bytes(batch[0:8], "big", signed=True)
        last = base + int.from_bytes(batch[23:27], "big", signed=True)
        pid = int.from_bytes(batch[43:51], "big", signed=True)
        self._consume_up_to(last)
        transactional = bool(attrs & _TRANSACTIONAL) and pid >= 0
        if not attrs & _CONTROL:
            if transactional:
                meta = self.aborting.get(pid)
                if meta is not None:
                    meta[1] = True
                    return None
                self.committing.add(pid)
            return batch
        if not transactional:
            return batch
        from kbroker.records.control import parse_end_txn_marker
        marker = parse_end_txn_marker(bytes(batch))
        if marker is None:
            can_discard = True          # an empty control batch: its transaction was cleaned
        elif marker.is_abort:
            meta = self.aborting.pop(pid, None)
            if meta is not None and meta[1]:
                if self.cleaned_index is not None:
                    self.cleaned_index.append(meta[0])
                can_discard = False
            else:
                can_discard = True
        else:
            can_discard = pid not in self.committing
            self.committing.discard(pid)
        if not can_discard:
            return batch
        if attrs & _DELETE_HORIZON:
            horizon = int.from_bytes(batch[27:35], "big", signed=True)
            if horizon <= self.now_ms:
                self.markers_dropped += 1
                return None
            return batch
        if marker is None:
            self.markers_dropped += 1
            return None
        return _with_delete_horizon(batch, self.now_ms + self.delete_retention_ms)


def _with_delete_horizon(batch, horizon: int) -> bytes:
    """The control batch ``batch`` with a delete horizon (KIP-534: base timestamp = the
    horizon, record timestamps unchanged)."""
    from kbroker.kernels import records as _records
    b = _records.decode_batch(bytes(batch), check_crc=False)
    builder = _records.BatchBuilder(batch_size=1 << 30, base_timestamp=horizon, producer_id=b.producer_id,
                                    producer_epoch=b.producer_epoch, base_sequence=b.base_sequence,
                                    partition_leader_epoch=b.partition_leader_epoch, is_transactional=True,
                                    is_control=True, base_offset=b.base_offset)
    for r in b.records:
        builder.append(r.timestamp, r.key, r.value, r.headers)
    out = bytearray(builder.build())
    out[22] |= _DELETE_HORIZON
    out[17:21] = _crc32c.crc32c(memoryview(out)[21:]).to_bytes(4, "big")
    return bytes(out)


def _txn_clean_state(lg, now_ms: int) -> _TxnCleanState | None:
    """The transaction state of a cleaning; None (no pass) when the log shows no sign of
    transactions: no aborted one in its ``.txnindex`` and no producer that wrote a marker
    (coordinator epoch set) or has a transaction open. Markers of producers expired since
    then stay until one of those returns (the pass costs ~0.6 µs per batch: a log of tiny
    batches cleans up to 2x slower with it)."""
    collect = getattr(lg, "collect_aborted_transactions", None)
    psm = getattr(lg, "producer_state", None)
    if collect is None or psm is None:
        return None
    aborted = collect(0, lg.log_end_offset)
    if not aborted:
        try:
            seen = any(e.coordinator_epoch >= 0 or e.current_txn_first_offset is not None
                       for e in list(psm.active_producers.values()))
        except RuntimeError:        # resized by a concurrent append: run the pass
            seen = True
        if not seen:
            return None
    return _TxnCleanState(aborted, now_ms, lg.config.delete_retention_ms)


def _aborted_tracker(lg, start: int, end: int) -> _AbortedTracker | None:
    collect = getattr(lg, "collect_aborted_transactions", None)
    if collect is None:
        return None
    aborted = collect(start, end)
    return _AbortedTracker(aborted) if aborted else None


class _SegmentReader:
    """Reads whole batches of one segment file in chunks through its own fd."""

    def __init__(self, seg: LogSegment, io_buffer_size: int, max_io_buffer_size: int):
        try:
            self.fd = os.open(seg.log_path, os.O_RDONLY)
        except FileNotFoundError:
            raise CleaningAbortedError(f"segment {seg.log_path} is gone") from None
        self.size = seg.size
        self.chunk = io_buffer_size
        self.max_chunk = max(max_io_buffer_size, io_buffer_size)
        self.path = seg.log_path

    def close(self) -> None:
        os.close(self.fd)

    def read(self, pos: int) -> bytes:
        return os.pread(self.fd, min(self.chunk, self.size - pos), pos)

    def grow(self, pos: int) -> None:
        """No whole batch fit in a chunk: double it (Kafka's growBuffersOrFail)."""
        if self.chunk >= self.size - pos or self.chunk >= self.max_chunk * 2:
            raise KafkaStorageError(f"batch at position {pos} of {self.path} does not fit in "
                                    f"{self.chunk} bytes or is truncated")
        self.chunk *= 2


class Cleaner:
    """Does the cleaning of one log at a time (Kafka's ``Cleaner``); one per
    cleaner thread, owning its OffsetMap. ``check_done()`` raises
    CleaningAbortedError to stop early."""

    def __init__(self, config: CleanerConfig, time_ms: Callable[[], int], check_done: Callable[[tuple], None],
                 offset_map=None):
        self.config = config
        self._time_ms = time_ms
        self._check_done = check_done
        self._map = offset_map
        #: the aborted transactions of the log being mapped (None: none in range)
        self._aborted: _AbortedTracker | None = None
        #: the transaction rules of the filtering pass (None: no transactions in the log)
        self._txn: _TxnCleanState | None = None

    @property
    def offset_map(self):
        if self._map is None:
            self._map = _omap.OffsetMap(self.config.map_memory_per_thread, self.config.dedupe_buffer_load_factor)
        return self._map

    def clean(self, to_clean: LogToClean, now_ms: int | None = None) -> tuple[int, CleanerStats]:
        """Clean ``to_clean`` up to its first uncleanable offset (or less if the
        map fills). Returns (end_offset, stats): the next first dirty offset."""
        lg = to_clean.log
        tp = to_clean.topic_partition
        now = self._time_ms() if now_ms is None else now_ms
        stats = CleanerStats()
        m = self.offset_map
        upper = to_clean.first_uncleanable_offset
        segments = lg.segments
        dirty = _segments_overlapping(segments, to_clean.first_dirty_offset, upper)
        self._aborted = _aborted_tracker(lg, dirty[0].base_offset, upper) if dirty else None
        self.build_offset_map(tp, dirty, to_clean.first_dirty_offset, upper, stats, lg)
        end_offset = m.latest_offset + 1
        if end_offset <= 0:
            stats.end_s = time.monotonic()
            return to_clean.first_dirty_offset, stats
        cfg = lg.config
        to_group = [s for s in segments[:-1] if s.base_offset < end_offset]
        self._txn = _txn_clean_state(lg, now)
        try:
            for group in group_segments_by_size(to_group, cfg.segment_bytes, cfg.max_index_size, upper):
                self._check_done(tp)
                self.clean_segments(lg, group, now, stats)
                stats.groups += 1
        finally:
            self._txn = self._aborted = None
        stats.end_s = time.monotonic()
        return end_offset, stats

    def build_offset_map(self, tp, dirty, start: int, end: int, stats: CleanerStats, lg=None) -> None:
        """Kafka's buildOffsetMap: map the dirty segments in order until the map is full."""
        m = self.offset_map
        m.clear()
        for i, seg in enumerate(dirty):
            self._check_done(tp)
            nxt = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            if self._build_for_segment(tp, seg, start, nxt, stats):
                stats.map_full = True
                log.debug("Offset map of %s is full: %d segment(s) fully mapped, segment %d partly",
                          tp, i, seg.base_offset)
                break

    def _build_for_segment(self, tp, seg: LogSegment, start: int, next_segment_start: int,
                           stats: CleanerStats) -> bool:
        m = self.offset_map
        reader = _SegmentReader(seg, self.config.io_buffer_size, self.config.max_io_buffer_size)
        try:
            pos = 0
            if start > seg.base_offset:
                try:
                    pos = seg.offset_index.lookup(start)[1]
                except Exception:  # a damaged index only costs a longer scan
                    pos = 0
                if pos > reader.size:
                    pos = 0
            while pos < reader.size:
                self._check_done(tp)
                data = reader.read(pos)
                if not data:
                    raise CleaningAbortedError(f"{seg.log_path} shrank while being mapped")
                if self._aborted:
                    data = _mask_aborted(data, self._aborted)
                full, consumed, n = m.build(data, start)
                stats.map_records_read += n
                stats.map_bytes_read += consumed
                if full:
                    return True
                if consumed == 0:
                    reader.grow(pos)
                    continue
                pos += consumed
        finally:
            reader.close()
        m.update_latest_offset(next_segment_start - 1)
        return False

    def clean_segments(self, lg, group, now_ms: int, stats: CleanerStats) -> None:
        """Filter ``group`` into one ``.cleaned`` segment and swap it in (Kafka's cleanSegments)."""
        tp = lg.topic_partition
        cfg = lg.config
        m = self.offset_map
        retain_empty = _active_producers(lg)
        cleaned = LogSegment(lg.dir, group[0].base_offset, cfg, self._time_ms, create=True,
                             file_suffix=CLEANED_SUFFIX)
        txn = self._txn
        if txn is not None:
            txn.cleaned_index = cleaned.txn_index
        swapped = False
        try:
            next_offset = cleaned.base_offset
            for seg in group:
                reader = _SegmentReader(seg, self.config.io_buffer_size, self.config.max_io_buffer_size)
                try:
                    pos = 0
                    while pos < reader.size:
                        self._check_done(tp)
                        data = reader.read(pos)
                        if not data:
                            raise CleaningAbortedError(f"{seg.log_path} shrank while being cleaned")
                        if txn is not None:
                            data, whole = txn.filter(data)
                            if whole == 0:
                                reader.grow(pos)
                                continue
                            out, consumed, nread, nkept = _omap.filter_batches(
                                data, m, now_ms, cfg.delete_retention_ms, retain_empty)
                            consumed = whole
                        else:
                            out, consumed, nread, nkept = _omap.filter_batches(
                                data, m, now_ms, cfg.delete_retention_ms, retain_empty)
                        if consumed == 0:
                            reader.grow(pos)
                            continue
                        pos += consumed
                        stats.bytes_read += consumed
                        stats.records_read += nread
                        stats.records_written += nkept
                        if out:
                            next_offset = self._append(cleaned, out, next_offset)
                            stats.bytes_written += len(out)
                finally:
                    reader.close()
            cleaned.prepare_writable()      # creates both index files even if nothing survived
            cleaned.on_become_inactive()
            cleaned.flush()
            mtime = group[-1].last_modified_ms
            if mtime > 0:
                os.utime(cleaned.log_path, ns=(mtime * 1_000_000, mtime * 1_000_000))
            self._check_done(tp)
            swapped = lg.replace_segments([cleaned], group)
            if not swapped:
                raise CleaningAbortedError(f"segments of {lg.name} changed while being cleaned")
            stats.segments_replaced += len(group)
        finally:
            if not swapped:
                cleaned.delete_if_exists()

    @staticmethod
    def _append(seg: LogSegment, out: bytes, next_offset: int) -> int:
        """Append filtered batches (original offsets, gaps allowed) to the cleaned segment."""
        prep = _scan.prepare_append(out, next_offset, -1, seg.base_offset, seg.size,
                                    seg.bytes_since_last_index_entry, seg.index_interval_bytes, -1, -1, False)
        first, nxt, count, max_ts, off_max, first_ts, bsince, entries = prep
        if nxt - 1 - seg.base_offset > INT32_MAX:
            raise KafkaStorageError(f"cleaned segment {seg.log_path} would exceed the 32-bit offset range")
        seg.append(out, max_ts, off_max, bsince, entries)
        return nxt


class LogCleaner:
    """The cleaner threads plus Kafka's LogCleanerManager state (see module docstring).

    ``logs`` returns the broker's {TopicPartition: Log}; ``log_dirs`` are the
    directories holding ``cleaner-offset-checkpoint``.
    """

    def __init__(self, log_dirs, logs: Callable[[], Mapping], config: CleanerConfig | None = None, *,
                 time_ms: Callable[[], int] | None = None):
        self.config = config or CleanerConfig()
        self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        self._logs = logs
        self._time_ms = time_ms or _now_ms
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._in_progress: dict = {}          # tp -> "in-progress" | "aborted"
        self._uncleanable: set = set()        # (log dir, tp) that failed; skipped until restart
        self._checkpoints: dict[str, dict] = {}
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._wakeups = 0
        self._cleaners: list[Cleaner] = []
        self.last_stats: CleanerStats | None = None
        self.dirtiest_log_cleanable_ratio = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    def startup(self) -> None:
        """Start ``num_threads`` cleaner threads."""
        if self._threads or not self.config.enable_cleaner:
            return
        self._stopped.clear()
        for i in range(self.config.num_threads):
            t = threading.Thread(target=self._run, args=(i,), name=f"kbroker-log-cleaner-thread-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def shutdown(self) -> None:
        """Stop the threads; a cleaning in progress is aborted (its ``.cleaned`` files removed)."""
        self._stopped.set()
        with self._cv:
            for tp in self._in_progress:
                self._in_progress[tp] = "aborted"
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        self._threads = []

    def maybe_clean(self, lg=None) -> None:
        """LogManager seam: wake the cleaner threads (they check every compacted log)."""
        with self._cv:
            self._wakeups += 1
            self._cv.notify_all()

    def _run(self, thread_id: int) -> None:
        cleaner = Cleaner(self.config, self._time_ms, self._check_done)
        self._cleaners.append(cleaner)
        while not self._stopped.is_set():
            try:
                cleaned = self._clean_filthiest(cleaner) is not None
            except Exception:
                log.exception("log cleaner thread %d failed", thread_id)
                cleaned = False
            if not cleaned:
                with self._cv:
                    seen = self._wakeups
                    if not self._stopped.is_set():
                        self._cv.wait_for(lambda: self._stopped.is_set() or self._wakeups != seen,
                                          self.config.backoff_ms / 1000)

    # -- one step (what a thread does; callable directly) ----------------------------------
    def clean_once(self, now_ms: int | None = None, cleaner: Cleaner | None = None) -> LogToClean | None:
        """Clean the filthiest log once, synchronously; the LogToClean or None."""
        if cleaner is None:
            if not self._cleaners:
                self._cleaners.append(Cleaner(self.config, self._time_ms, self._check_done))
            cleaner = self._cleaners[0]
        return self._clean_filthiest(cleaner, now_ms)

    def _clean_filthiest(self, cleaner: Cleaner, now_ms: int | None = None) -> LogToClean | None:
        now = self._time_ms() if now_ms is None else now_ms
        ltc = self.grab_filthiest_log(now)
        if ltc is None:
            return None
        tp = ltc.topic_partition
        end_offset = None
        try:
            end_offset, stats = cleaner.clean(ltc, now)
            self.last_stats = stats
            log.info("Cleaned log %s: %d/%d records kept, %d -> %d bytes, %d segment(s) into %d, "
                     "offsets [%d, %d)%s in %.3fs", ltc.log.name, stats.records_written, stats.records_read,
                     stats.bytes_read, stats.bytes_written, stats.segments_replaced, stats.groups,
                     ltc.first_dirty_offset, end_offset, " (offset map full)" if stats.map_full else "",
                     stats.elapsed_s)
        except CleaningAbortedError as e:
            log.info("Cleaning of %s aborted: %s", ltc.log.name, e)
        except Exception:
            log.exception("Unexpected exception while cleaning log %s; marking it uncleanable", ltc.log.name)
            with self._lock:
                self._uncleanable.add((os.path.dirname(ltc.log.dir), tp))
        finally:
            self.done_cleaning(ltc, end_offset)
        return ltc

    # -- LogCleanerManager -------------------------------------------------------------------
    def grab_filthiest_log(self, now_ms: int | None = None) -> LogToClean | None:
        """Pick the compacted log most in need of cleaning and mark it in progress."""
        now = self._time_ms() if now_ms is None else now_ms
        with self._lock:
            candidates = []
            for tp, lg in self._logs().items():
                if lg.closed or not lg.config.compact or tp in self._in_progress:
                    continue
                d = os.path.dirname(lg.dir)
                if (d, tp) in self._uncleanable:
                    continue
                segs = lg.segments
                last_clean = self._checkpoints_of(d).get(tp)
                first_dirty, uncleanable, force = cleanable_offsets(lg, last_clean, now, segs)
                if force:
                    self._update_checkpoint_locked(d, tp, first_dirty)
                delay = max_compaction_delay(lg, first_dirty, now, segs)
                ltc = LogToClean(tp, lg, first_dirty, uncleanable, delay > 0, segs)
                if ltc.total_bytes > 0:
                    candidates.append(ltc)
            self.dirtiest_log_cleanable_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
            cleanable = [c for c in candidates
                         if (c.need_compaction_now and c.cleanable_bytes > 0)
                         or c.cleanable_ratio > c.log.config.min_cleanable_dirty_ratio]
            if not cleanable:
                return None
            best = max(cleanable, key=lambda c: c.cleanable_ratio)
            self._in_progress[best.topic_partition] = "in-progress"
            return best

    def done_cleaning(self, ltc: LogToClean, end_offset: int | None) -> None:
        """Record the new first dirty offset (unless aborted) and release the log."""
        tp = ltc.topic_partition
        with self._cv:
            state = self._in_progress.pop(tp, None)
            if end_offset is not None and state == "in-progress" and not ltc.log.closed:
                self._update_checkpoint_locked(os.path.dirname(ltc.log.dir), tp, end_offset)
            self._cv.notify_all()

    def _check_done(self, tp) -> None:
        if self._stopped.is_set() or self._in_progress.get(tp) == "aborted":
            raise CleaningAbortedError(f"cleaning of {tp[0]}-{tp[1]} aborted")

    def abort_cleaning(self, tp, log_dir: str | None = None, *, remove_checkpoint: bool = True) -> None:
        """The log of ``tp`` is going away (deletion): stop a cleaning in
        progress (its work is dropped at the next check or at the swap) and
        drop its checkpoint entry. Does not wait."""
        tp = (tp[0], int(tp[1]))
        with self._cv:
            if tp in self._in_progress:
                self._in_progress[tp] = "aborted"
            dirs = [os.path.abspath(log_dir)] if log_dir else self.log_dirs
            for d in dirs:
                self._uncleanable.discard((d, tp))
                if remove_checkpoint and tp in self._checkpoints_of(d):
                    offsets = dict(self._checkpoints_of(d))
                    del offsets[tp]
                    self._write_checkpoint_locked(d, offsets)

    def is_cleaning(self, tp) -> bool:
        with self._lock:
            return (tp[0], int(tp[1])) in self._in_progress

    def wait_idle(self, tp, timeout_s: float) -> bool:
        """Wait until ``tp`` is not being cleaned (tests, deletion)."""
        tp = (tp[0], int(tp[1]))
        with self._cv:
            return self._cv.wait_for(lambda: tp not in self._in_progress, timeout_s)

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_file(self, d: str) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(os.path.join(d, CLEANER_OFFSET_CHECKPOINT))

    def _checkpoints_of(self, d: str) -> dict:
        """Cached contents of ``d``'s cleaner-offset-checkpoint. Lock held."""
        cp = self._checkpoints.get(d)
        if cp is None:
            try:
                cp = self._checkpoint_file(d).read()
            except (CheckpointError, OSError) as e:
                log.warning("Error reading %s in %s (%s); starting from the log start offsets",
                            CLEANER_OFFSET_CHECKPOINT, d, e)
                cp = {}
            self._checkpoints[d] = cp
        return cp

    def _update_checkpoint_locked(self, d: str, tp, offset: int) -> None:
        offsets = dict(self._checkpoints_of(d))
        offsets[tp] = offset
        # Kafka keeps only entries of logs it still has.
        live = {t for t, lg in self._logs().items() if os.path.dirname(lg.dir) == d}
        offsets = {t: o for t, o in offsets.items() if t in live or t == tp}
        self._write_checkpoint_locked(d, offsets)

    def _write_checkpoint_locked(self, d: str, offsets: dict) -> None:
        try:
            os.makedirs(d, exist_ok=True)
            self._checkpoint_file(d).write(offsets)
        except OSError as e:
            raise KafkaStorageError(f"error writing {CLEANER_OFFSET_CHECKPOINT} in {d}: {e}") from e
        self._checkpoints[d] = offsets

    def all_cleaner_checkpoints(self) -> dict:
        """{TopicPartition: first dirty offset} over every log dir."""
        with self._lock:
            out = {}
            for d in self.log_dirs:
                out.update(self._checkpoints_of(d))
            return out
