"""Log: the segments of one partition and its offsets (Kafka's ``UnifiedLog`` + ``LocalLog``).

Offsets (all "next offset" style except the high watermark, which is one too):

* ``log_start_offset`` — first offset a client may read. Moved forward only
  by: ``delete_records`` (DeleteRecords, bounded by the high watermark),
  retention deleting whole segments (to the new first segment's base
  offset), ``truncate_fully_and_start_at``; moved back only by
  ``truncate_to`` below it.
* ``high_watermark`` — offsets below it are committed and visible to
  consumers. It only moves forward on the replication path:
  ``maybe_increment_high_watermark(meta)`` (Kafka's
  ``UnifiedLog.maybeIncrementHighWatermark``) takes, under the append lock,
  the minimum log end offset over the ISR with where it lives, and ignores
  anything not above the current value, so proposals computed from log end
  offsets read at different times (concurrent appends) can arrive in any
  order. ``update_high_watermark(offset)`` is the explicit path that may move
  it back: restart (the checkpoint), truncation, tests. ``append`` moves it
  only when asked (``high_watermark_follows``: a leader without followers,
  whose high watermark is its log end), by the same forward-only rule.
  Always within ``[log_start_offset, log_end_offset]``.
* ``recovery_point`` — every offset below it is fsynced; start-up after a
  crash scans only from the segment holding it.
* ``log_end_offset`` — the offset the next appended record gets.

Locking. One ``threading.Lock`` per log, the "append lock", serialises the
writers: append, roll, truncation, retention, start-offset and high-watermark
changes, segment swaps (compaction), close. fsyncs for flush run outside it.
Readers never take it: ``read``, ``convert_to_offset_metadata``,
``fetch_offset_by_timestamp``, ``end_offset_for_epoch``,
``high_watermark_metadata`` and the offset / segment properties work on the
published :class:`LogView` (``self._view``), one immutable snapshot of the
segment list and bases, the log start offset, the log end offset metadata
(offset, active segment, byte position) and the high watermark metadata.
(The leader-epoch cache they consult is copy-on-write, see leader_epoch.py.)
Invariants:

* A writer replaces ``_view`` (one reference assignment) while it holds the
  append lock, and only after its change is complete: an append publishes
  after its bytes are written (``pwrite`` returned) and its index entries
  added. So every byte below ``view.end``'s position of its segment, and every
  whole segment before it in ``view.segments``, is written, and a reader
  bounded by its view never sees an offset whose bytes are not yet there.
  Bytes past that bound may exist (a writer between write and publish);
  readers ignore them.
* In a view, ``high_watermark.message_offset <= end.message_offset`` and
  ``log_start_offset <= high_watermark.message_offset``. The high watermark
  metadata may be offset-only (after restart, truncation or a segment swap);
  readers resolve it against their own view (cached by identity of the
  metadata object, which writers replace whenever positions below it may
  change).
* Segments before the view's last one never change below their size while
  they are in a list (a roll only trims index and preallocated tails); the
  last one only grows past the view's bound. A segment leaves the list
  (retention, compaction swap, truncation) by a new view published *before*
  it is closed: later (two-phase delete, ``file.delete.delay.ms``) or at once
  with a delay of 0. A reader still on an older view then gets
  ``SegmentClosedError`` (its fd pin or index refuses) and retries on the
  newer view; once the log itself is closed, KafkaStorageError. A segment's
  ``.log`` fd is closed only when no reader has it pinned, so a pread never
  hits a reused descriptor. A FileRegion handed out is sent later by the
  network without a pin: it relies on the delete delay, as before.
* Index maps are guarded by each index's own lock (remap on roll/trim,
  truncate, close), never by the append lock; a segment's lazy state (index
  sanity check, open fd, largest timestamp) by the segment's own lock.
* ``truncate_to`` / ``truncate_fully_and_start_at`` change bytes below an
  already published bound. A reader racing one may return batches that are
  being removed (or, once new appends reuse the positions, other batches at
  those positions: the FileRegion is read by sendfile later), a region shorter
  than it claims, an OffsetOutOfRangeError, or a SegmentClosedError turned into
  KafkaStorageError; never a crash or another file's bytes. Kafka's readers
  have the same window; followers and consumers re-fetch from their position.

Idempotent producers: ``producer_state`` (a ProducerStateManager, owned by
this log and used only under the append lock) holds the last batches of each
producer id. A leader (client) append is checked against it after offsets are
assigned and before anything is written: a retried batch among a producer's
last 5 is answered with its original offsets and not appended; a sequence gap
or stale epoch raises the ProducerStateError the broker maps to its error
code. The state moves with the log: snapshot (``<offset>.snapshot``) at every
roll and at clean close; on open, the newest snapshot plus a replay of the
batches after it; reload on ``truncate_to``; snapshots below the log start
offset are deleted when it moves.

Transactions (Kafka's UnifiedLog): producer_state tracks the ongoing transactions;
an append whose COMMIT/ABORT markers end some writes an ``.txnindex`` entry per
abort into the segment holding the marker and completes them. The *first unstable
offset* (``_first_unstable``, the earliest first offset of a transaction that is
ongoing or whose marker is not yet below the high watermark, clamped to the log
start offset) is recomputed under the append lock after every append, high
watermark change, truncation and start-offset move, and set *before* the view that
depends on it is published; readers take the view first and then it, so
``last_stable_offset = min(first unstable offset, high watermark)`` never passes an
open transaction. Recovery replays markers into the ``.txnindex`` of their segment
(entries already there are kept once).

Deletion of segments is two-phase, as Kafka: the files are renamed to
``*.deleted`` at once (so a restart drops them) and closed/unlinked after
``file.delete.delay.ms`` by ``delete_pending_segments`` (the LogManager's
background task calls it), so FileRegions of in-flight fetches stay readable.
"""
from __future__ import annotations

import bisect
import logging
import os
import random
import shutil
import struct
import threading
import time
from typing import Callable, NamedTuple

from kbroker.kernels import log_scan as _scan
from kbroker.log.checkpoints import (
    LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA, LeaderEpochCheckpointFile, PartitionMetadataFile, fsync_dir,
)
from kbroker.log.config import LONG_MAX, LogConfig
from kbroker.log.errors import (
    CorruptRecordError, IndexClosedError, KafkaStorageError, OffsetOutOfRangeError, RecordBatchTooLargeError,
    RecordTooLargeError, SegmentClosedError, UnexpectedAppendOffsetError,
)
from kbroker.log.info import (
    EMPTY_RECORDS, FetchDataInfo, LogAppendInfo, LogOffsetMetadata, TimestampAndOffset,
)
from kbroker.log.leader_epoch import LeaderEpochFileCache
from kbroker.log.producer_state import (
    NO_PRODUCER_ID, PRODUCER_ID_EXPIRATION_MS_DEFAULT, AppendOrigin, ProducerStateManager,
)
from kbroker.log.recovery import LoadedLog, load_log
from kbroker.log.segment import DELETED_SUFFIX, LogSegment, end_txn_marker, iter_batch_headers
from kbroker.log.txn_index import AbortedTxn, collect_aborted
from kbroker.log.txn_verification import SENTINEL, VerificationGuard, VerificationStates

log = logging.getLogger(__name__)

# ListOffsets special timestamps (ListOffsetsRequest)
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5


#: ``LogAppendInfo(...)`` without the NamedTuple's Python-level ``__new__`` (hot path)
_new_tuple = tuple.__new__

#: the base offset field at the start of a batch
_FIRST_OFFSET = struct.Struct(">q")

#: a reader whose view went stale under it (segment closed) retries on a newer one
_READ_ATTEMPTS = 8
#: Log._dir_unsynced bits: the partition directory / its entry in the log dir
DIR_SELF, DIR_PARENT = 1, 2
_CLOSED_ERRORS = (SegmentClosedError, IndexClosedError)


class LogView(NamedTuple):
    """What readers of a log see: one immutable snapshot, replaced whole by writers
    under the append lock once their change is complete (module docstring, Locking).

    ``segments`` / ``bases``: the segment list and base offsets, oldest first (tuples,
    never mutated). ``end``: the log end offset, the base offset of the segment it is
    in (the last one) and its byte position there: every byte before it is written.
    ``high_watermark``: may be offset-only (``-1`` position); see ``Log.high_watermark_metadata``.
    """

    segments: tuple
    bases: tuple
    log_start_offset: int
    end: LogOffsetMetadata
    high_watermark: LogOffsetMetadata


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_topic_partition_name(name: str) -> tuple[str, int]:
    """``my-topic-3`` -> ("my-topic", 3); ValueError if not a partition directory."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"Found directory {name}, '{name}' is not in the form of topic-partition")
    return topic, int(part)


class Log:
    """The log of one partition. See the module docstring for offsets and locking."""

    def __init__(self, dir: str, topic: str, partition: int, config: LogConfig, loaded, *,
                 time_ms: Callable[[], int], leader_epoch_cache: LeaderEpochFileCache,
                 fsync_every_append: bool, topic_id=None, scheduler=None,
                 producer_state: ProducerStateManager | None = None):
        self.dir = dir
        self.topic = topic
        self.partition = partition
        self.config = config
        self.topic_id = topic_id
        self.leader_epoch_cache = leader_epoch_cache
        self._time_ms = time_ms
        self._lock = threading.Lock()
        #: KIP-890 verification guards of transactional producers (append lock)
        self._verification = VerificationStates()
        # Writer state: read and replaced only under the append lock; readers use _view.
        # _segments / _bases are tuples, replaced whole (a published view shares them).
        self._segments: tuple[LogSegment, ...] = tuple(loaded.segments)
        self._bases: tuple[int, ...] = tuple(s.base_offset for s in self._segments)
        self._leo: int = loaded.next_offset
        self._log_start_offset: int = loaded.log_start_offset
        self._recovery_point: int = loaded.recovery_point
        #: high watermark with where it lives; may be offset-only (position -1)
        self._hw: LogOffsetMetadata = LogOffsetMetadata(loaded.log_start_offset)
        #: (offset-only high watermark metadata, its resolution): a reader-filled cache
        self._hw_resolved: tuple | None = None
        self._view: LogView
        self._last_flush_ms: int = time_ms()
        self._fsync_every_append = fsync_every_append
        #: directory entries not yet fsynced (DIR_SELF: a segment created here since the
        #: last flush; DIR_PARENT: this directory's own entry in its log dir). The next
        #: flush fsyncs them before the recovery point moves (Kafka's LocalLog.flush);
        #: nothing on the request path does. Append lock.
        self._dir_unsynced = 0
        #: a topic id whose partition.metadata is not written yet (Log.open defers the
        #: write of a new directory's file to the scheduler's thread)
        self._pending_topic_id = None
        self._scheduler = scheduler
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._closed = False
        self.truncated_bytes_on_load = loaded.truncated_bytes
        self.recovered_segments_on_load = loaded.recovered_segments
        self._segments[-1].roll_jitter_ms = self._jitter()
        #: idempotent-producer state; guarded by the append lock
        self.producer_state = producer_state or ProducerStateManager(dir, topic_partition=self.name)
        #: first offset of the earliest unstable transaction, None if none (module docstring)
        self._first_unstable: int | None = None
        self._publish()

    # -- construction ----------------------------------------------------------------
    @classmethod
    def open(cls, dir: str, config: LogConfig | None = None, *, log_start_offset: int = 0,
             recovery_point: int = 0, high_watermark: int | None = None, had_clean_shutdown: bool = False,
             time_ms: Callable[[], int] | None = None, topic_id=None, fsync_every_append: bool | None = None,
             scheduler=None, producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
             sync_parent_dir: bool = True) -> "Log":
        """Open (creating if needed) the partition directory ``dir`` = ``<log.dir>/<topic>-<partition>``.

        ``log_start_offset`` / ``recovery_point`` / ``high_watermark`` come from the
        log dir's checkpoints; ``had_clean_shutdown`` skips recovery (see recovery.py).
        ``scheduler(fn) -> bool`` queues fn for a background thread (roll flushes);
        if it returns False or is None, the flush runs inline after the lock is released.
        Producer state is loaded from the newest snapshot plus the batches after it.
        A new directory is not fsynced here (Kafka's createLogDirectory does not either):
        the first flush that moves the recovery point fsyncs it and then its log dir, so
        CreateTopics costs no fsync per partition. With ``fsync_every_append`` (every
        acknowledged append durable) it is fsynced at once, and so is its log dir unless
        ``sync_parent_dir`` is False (the caller then fsyncs the log dir before anything
        relies on the log: LogManager.batched_dir_sync).
        """
        config = config or LogConfig()
        time_ms = time_ms or _now_ms
        topic, partition = parse_topic_partition_name(os.path.basename(os.path.normpath(dir)))
        if fsync_every_append is None:
            fsync_every_append = config.kbroker_fsync_every_append
        fresh = not os.path.isdir(dir)
        if fresh:
            os.makedirs(dir, exist_ok=True)
        cache = LeaderEpochFileCache(LeaderEpochCheckpointFile(os.path.join(dir, LEADER_EPOCH_CHECKPOINT)),
                                     sync=True, deferred=scheduler is not None)
        if fresh:
            # Nothing to load or recover: one empty segment (creates the .log).
            seg = LogSegment(dir, log_start_offset, config, time_ms, create=True,
                             fsync_every_append=fsync_every_append,
                             preallocate_bytes=config.segment_bytes if config.preallocate else 0)
            loaded = LoadedLog([seg], log_start_offset, log_start_offset, log_start_offset, 0, 0)
        else:
            loaded = load_log(dir, config, log_start_offset=log_start_offset, recovery_point=recovery_point,
                              had_clean_shutdown=had_clean_shutdown, time_ms=time_ms, leader_epoch_cache=cache,
                              fsync_every_append=fsync_every_append)
        meta = PartitionMetadataFile(os.path.join(dir, PARTITION_METADATA))
        deferred_meta = None
        if topic_id is not None:
            if fresh and scheduler is not None and not fsync_every_append:
                deferred_meta = topic_id     # written by the scheduler's thread, below
            elif fresh:
                # A new directory: written in place (a torn file reads as damaged and is
                # rewritten from the cluster metadata); the directory fsyncs below make
                # its entry and the segment's durable.
                meta.write(topic_id, sync=False)
            else:
                try:
                    current = meta.read()
                except Exception:       # missing or damaged: rewritten
                    current = None
                if current != topic_id:
                    meta.write(topic_id)
        elif not fresh:
            try:
                topic_id = meta.read()
            except FileNotFoundError:
                topic_id = None
            except Exception:  # a damaged partition.metadata is rewritten by the broker later
                topic_id = None
        psm = ProducerStateManager(dir, topic_partition=f"{topic}-{partition}",
                                   producer_id_expiration_ms=producer_id_expiration_ms,
                                   names=loaded.names)
        lg = cls(dir, topic, partition, config, loaded, time_ms=time_ms, leader_epoch_cache=cache,
                 fsync_every_append=fsync_every_append, topic_id=topic_id, scheduler=scheduler,
                 producer_state=psm)
        if fresh and fsync_every_append:
            # A new partition directory's entries (segment, partition.metadata) and its
            # own entry in the log dir are durable before anything in it can be fsynced.
            fsync_dir(dir)
            if sync_parent_dir:
                fsync_dir(os.path.dirname(os.path.abspath(dir)))
        elif fresh:
            lg._dir_unsynced = DIR_SELF | DIR_PARENT
        if deferred_meta is not None:
            # Kafka's UnifiedLog writes partition.metadata on its scheduler too
            # ("flush-metadata-file"): one file creation less on the CreateTopics path.
            lg._pending_topic_id = deferred_meta
            if not scheduler(lg._write_partition_metadata):
                lg._write_partition_metadata()
        if not fresh:
            with lg._lock:
                lg._load_producer_state_locked(had_clean_shutdown)
        if high_watermark is not None:
            lg.update_high_watermark(high_watermark)
        return lg

    #: set by a LogManager: a one-element counter bumped whenever the high watermark is
    #: set, so that its checkpoint task skips the scan of every log when none moved
    hw_changes: list | None = None

    def _publish(self) -> None:
        """Replace the readers' view by the writer state. Append lock held (or the log
        not yet shared); called once a change is complete (module docstring)."""
        seg = self._segments[-1]
        self._view = _new_tuple(LogView, (self._segments, self._bases, self._log_start_offset,
                                          _new_tuple(LogOffsetMetadata, (self._leo, seg.base_offset, seg.size)),
                                          self._hw))

    def _jitter(self) -> int:
        j = self.config.segment_jitter_ms
        return random.randrange(min(j, self.config.segment_ms)) if j > 0 else 0

    def _new_segment(self, base_offset: int) -> LogSegment:
        seg = LogSegment(self.dir, base_offset, self.config, self._time_ms, create=True,
                         roll_jitter_ms=self._jitter(), fsync_every_append=self._fsync_every_append,
                         preallocate_bytes=self.config.segment_bytes if self.config.preallocate else 0)
        if self._fsync_every_append:
            fsync_dir(self.dir)   # the new file's directory entry must be durable too
        else:
            self._dir_unsynced |= DIR_SELF      # the next flush fsyncs the directory
        return seg

    @property
    def dir_sync_pending(self) -> bool:
        """True while the next flush still has to fsync this log's directory entries
        (a new directory, or a segment created since the last flush)."""
        return self._dir_unsynced != 0

    def _sync_dirs(self, which: int) -> None:
        """fsync the directory entries ``which`` names: this directory, then its entry
        in the log dir (a file before the directory holding it, as in open)."""
        if which & DIR_SELF:
            fsync_dir(self.dir)
        if which & DIR_PARENT:
            fsync_dir(os.path.dirname(os.path.abspath(self.dir)))

    def set_fsync_every_append(self, enabled: bool) -> None:
        """Switch the fsync-every-append mode of this live log (AlterConfigs); the next
        append to the active segment, and every later segment, follows it."""
        with self._lock:
            self._fsync_every_append = enabled
            self._segments[-1].fsync_every_append = enabled
            if enabled and self._dir_unsynced:
                # From the next append on every acknowledged record is durable: so must
                # the directory entries be that hold it.
                self._sync_dirs(self._dir_unsynced)
                self._dir_unsynced = 0

    def set_topic_id(self, topic_id) -> None:
        """Record the topic id in ``partition.metadata``."""
        self._pending_topic_id = None
        PartitionMetadataFile(os.path.join(self.dir, PARTITION_METADATA)).write(topic_id)
        self.topic_id = topic_id

    def _write_partition_metadata(self) -> None:
        """Write the deferred ``partition.metadata`` of a new directory (in place, as
        Log.open did: a torn or missing file is rewritten from the cluster metadata).
        Runs once, on the scheduler's thread or at close, whichever comes first."""
        topic_id, self._pending_topic_id = self._pending_topic_id, None
        if topic_id is None:
            return
        try:
            PartitionMetadataFile(os.path.join(self.dir, PARTITION_METADATA)).write(topic_id, sync=False)
        except FileNotFoundError:
            pass            # the directory was renamed for deletion meanwhile

    # -- properties -------------------------------------------------------------------
    @property
    def topic_partition(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def view(self) -> LogView:
        """The published snapshot readers work on (see LogView)."""
        return self._view

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._view.end.message_offset

    @property
    def high_watermark(self) -> int:
        return self._view.high_watermark.message_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def last_flush_time_ms(self) -> int:
        return self._last_flush_ms

    @property
    def active_segment(self) -> LogSegment:
        return self._view.segments[-1]

    @property
    def segments(self) -> list[LogSegment]:
        """A snapshot of the segment list, oldest first."""
        return list(self._view.segments)

    @property
    def num_segments(self) -> int:
        return len(self._view.segments)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._view.segments)

    @property
    def unflushed_messages(self) -> int:
        return self._leo - self._recovery_point

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        """The log end offset with its segment and position (Kafka's logEndOffsetMetadata)."""
        return self._view.end

    @property
    def high_watermark_metadata(self) -> LogOffsetMetadata:
        """The high watermark with its segment and position, resolved against the
        current view if it is offset-only (Kafka's fetchHighWatermarkMetadata),
        without the append lock."""
        return self._read_with_retry(self._hw_metadata)

    @property
    def latest_epoch(self) -> int | None:
        return self.leader_epoch_cache.latest_epoch

    # -- append -------------------------------------------------------------------------
    def append(self, buf, infos=None, *, leader_epoch: int = -1, assign_offsets: bool = True,
               batch_epochs=None, origin: AppendOrigin | None = None,
               verification_guard: VerificationGuard | None = None,
               high_watermark_follows: bool = False) -> LogAppendInfo:
        """Append whole v2 record batches (already validated, e.g. by
        ``kernels.records.validate_batches``, whose BatchInfos are ``infos``).
        With ``infos`` and no producer ids among them, or one idempotent or
        transactional batch that is simply its producer's next
        (``ProducerStateManager.next_in_sequence``: the producer state then only
        records it), the append is one kernel call
        (``LogSegment.try_append``: framing walk, offsets, roll check, write,
        index entries); otherwise, or when the segment must roll first, the
        general path below (producer state, roll) does the same work.

        ``assign_offsets``: leader append — base offsets are rewritten in
        place so the batches get offsets ``log_end_offset ..`` without gaps.
        Otherwise (replica append) their offsets must start at or above
        ``log_end_offset``. ``leader_epoch >= 0`` is stamped into each batch
        and recorded in the leader-epoch cache. ``buf`` must be writable
        (bytearray / writable memoryview) when anything is rewritten; bytes
        are copied. Returns a LogAppendInfo; raises CorruptRecordError on bad
        framing, RecordBatchTooLargeError if the append exceeds segment.bytes,
        RecordTooLargeError for a batch above max.message.bytes,
        KafkaStorageError on I/O failure, a ProducerStateError (its
        ``error_code`` is the Kafka error) for a bad sequence or epoch.

        Idempotent batches of a leader append (client origin) are checked
        against ``producer_state``: a retry of one of a producer's last 5
        batches appends nothing and returns that batch's original offsets
        (``batch_count`` 0), as Kafka answers a duplicate. ``origin``: default
        CLIENT for a leader append, REPLICATION otherwise; COORDINATOR for the
        transaction markers (epochs checked, sequences not). COMMIT/ABORT control
        batches end their producer's transaction (``.txnindex``, last stable offset).

        ``verification_guard`` (a client append with KIP-890 verification on): a
        transactional batch of a producer with no ongoing transaction here needs it to
        be the producer's guard (:mod:`.txn_verification`), else InvalidTxnStateError.

        ``high_watermark_follows`` (a leader with no other replica, whose high watermark
        is its log end offset): the high watermark moves to the new log end in the same
        view as the append, under the same lock (``maybe_increment_high_watermark``'s
        rule), or, when a flush is due (flush.messages), right after that flush. When
        this returns, the high watermark is at or past the appended batches (a duplicate
        moves nothing).
        """
        t = type(buf)
        if t is memoryview:         # a client's records: a slice of the request
            n = buf.nbytes
        elif t is bytearray:
            n = len(buf)
        else:
            if isinstance(buf, bytes) and (assign_offsets or leader_epoch >= 0):
                buf = bytearray(buf)
            n = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        config = self.config
        if n > config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"Message batch size is {n} bytes in append to partition {self.name} which exceeds "
                f"the maximum configured segment size of {config.segment_bytes}.")
        with self._lock:
            if self._closed:
                raise KafkaStorageError(f"log {self.name} is closed")
            seg = self._segments[-1]
            pending = None
            fast = None
            in_sequence = None       # the producer entry of a next-in-sequence batch
            if infos is not None and n <= config.max_message_bytes:
                # The fast path: batches without producer ids (nothing to check against
                # producer_state), or one idempotent batch that is simply its producer's
                # next (ProducerStateManager.next_in_sequence), one kernel call from header
                # walk to index entries.
                plain = True
                for info in infos:
                    if info.producer_id != NO_PRODUCER_ID:
                        plain = False
                        # (no KIP-890 verification state here: nothing for it to check)
                        if (len(infos) == 1 and assign_offsets and not info.is_control
                                and (origin is None or origin is AppendOrigin.CLIENT)
                                and not self._verification):
                            in_sequence = self.producer_state.next_in_sequence(info)
                        break
                if plain or in_sequence is not None:
                    try:
                        fast = seg.try_append(buf, n, self._leo, leader_epoch, self._time_ms,
                                              config.segment_bytes, config.segment_ms,
                                              assign_offsets)
                    except ValueError as e:
                        if assign_offsets or type(e) is not ValueError:
                            raise
                        raise UnexpectedAppendOffsetError(str(e)) from None
            if fast is not None:
                first, next_offset, count, max_ts, off_max, _, _, _ = fast
            else:
                # Idempotent batches, a segment to roll first, or no BatchInfos.
                prep = self._prepare(buf, seg, leader_epoch, assign_offsets)
                first, next_offset, count, max_ts, off_max, first_ts, bsince, entries = prep
                if n > config.max_message_bytes:
                    sizes = [i.size_in_bytes for i in infos] if infos is not None else ([n] if count == 1 else [])
                    for size in sizes:
                        if size > config.max_message_bytes:
                            raise RecordTooLargeError(
                                f"The record batch size in the append to {self.name} is {size} bytes which "
                                f"exceeds the maximum configured value of {config.max_message_bytes}.")
                pending = self._analyze_producer_state_locked(buf, infos, assign_offsets, origin)
                if pending is not None and pending.duplicate is not None:
                    return self._duplicate_append_info(pending.duplicate)
                if verification_guard is not None and pending is not None and infos is not None:
                    self._verification.check(infos, verification_guard, self._has_ongoing_transaction_locked)
                if seg.should_roll(n, max_ts, next_offset - 1, self._time_ms(), config.segment_bytes,
                                   config.segment_ms):
                    seg = self._roll_locked(first if not assign_offsets else None)
                    prep = self._prepare(buf, seg, leader_epoch, assign_offsets)
                    first, next_offset, count, max_ts, off_max, first_ts, bsince, entries = prep
                seg.append(buf, max_ts, off_max, bsince, entries)
            self._leo = next_offset
            if pending is not None:
                self.producer_state.apply_append(pending.updated_producers, next_offset)
                if self._verification:
                    self._verification.clear(pending.updated_producers)
                if pending.completed_txns:
                    self._complete_txns_locked(pending.completed_txns, seg)
                if pending.updated_producers:
                    self._update_first_unstable_locked()
            elif in_sequence is not None and fast is not None:
                self.producer_state.append_in_sequence(in_sequence, infos[0].base_sequence, first,
                                                       next_offset - 1, max_ts, next_offset)
            else:
                self.producer_state.update_map_end_offset(next_offset)
            if leader_epoch >= 0:
                cache = self.leader_epoch_cache
                if cache.latest_epoch != leader_epoch:
                    cache.assign(leader_epoch, first)
            elif batch_epochs:
                # follower append: the epochs the leader stamped, [(epoch, first offset)]
                cache = self.leader_epoch_cache
                for epoch, start in batch_epochs:
                    if cache.latest_epoch != epoch:
                        cache.assign(epoch, start)
            # The bytes and index entries are in place: publish the new end to readers.
            end = _new_tuple(LogOffsetMetadata, (next_offset, seg.base_offset, seg.size))
            need_flush = next_offset - self._recovery_point >= config.flush_messages
            if high_watermark_follows and not need_flush:
                if self._first_unstable is None and self.hw_changes is not None:
                    self._hw = end          # _move_high_watermark_locked's common case, inline
                    self.hw_changes[0] += 1
                else:
                    self._move_high_watermark_locked(end)
            self._view = _new_tuple(LogView, (self._segments, self._bases, self._log_start_offset, end, self._hw))
            log_start = self._log_start_offset
        if self._pending_roll_flush is not None:
            self._run_pending_roll_flush()
        if need_flush:
            self.flush()
            if high_watermark_follows:
                self.maybe_increment_high_watermark(self._view.end)
        return _new_tuple(LogAppendInfo, (first, next_offset - 1, max_ts, off_max, -1, log_start, count, n))

    def _analyze_producer_state_locked(self, buf, infos, assign_offsets: bool, origin=None):
        """Validate the idempotent batches of ``buf`` (offsets already assigned) against
        ``producer_state``; None when no batch has a producer id. Lock held."""
        if infos is not None:  # validate_batches' BatchInfos: skip the header walk for plain producers
            for info in infos:
                if info.producer_id != NO_PRODUCER_ID:
                    break
            else:
                return None
        if isinstance(buf, memoryview) and buf.format != "B":
            buf = buf.cast("B")
        batches = [(h, h.base_offset) for h in iter_batch_headers(buf) if h.producer_id != NO_PRODUCER_ID]
        if not batches:
            return None
        if origin is None:
            origin = AppendOrigin.CLIENT if assign_offsets else AppendOrigin.REPLICATION

        def marker_of(h):
            return end_txn_marker(buf[h.position:h.position + h.size_in_bytes])
        return self.producer_state.analyze_and_validate(batches, origin, marker_of=marker_of)

    def _complete_txns_locked(self, completed, seg: LogSegment) -> None:
        """Markers just written to ``seg`` ended ``completed``: an aborted one gets its
        ``.txnindex`` entry (with the LSO Kafka stores), then each is completed. Lock held."""
        psm = self.producer_state
        for txn in completed:
            if txn.is_aborted:
                try:
                    seg.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                                    psm.last_stable_offset(txn)))
                except OSError as e:
                    raise KafkaStorageError(f"error appending to the transaction index of {self.name}: {e}") from e
            psm.complete_txn(txn)

    def _update_first_unstable_locked(self) -> None:
        """Recompute the first unstable offset from the producer state (module docstring).
        Lock held; call before publishing a view that depends on it."""
        fu = self.producer_state.first_unstable_offset()
        if fu is not None and fu < self._log_start_offset:
            fu = self._log_start_offset
        self._first_unstable = fu

    def append_end_txn_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                              is_commit: bool, *, leader_epoch: int = -1,
                              timestamp_ms: int | None = None) -> LogAppendInfo:
        """WriteTxnMarkers on the leader: append one COMMIT/ABORT control batch with
        COORDINATOR origin (an older producer epoch raises InvalidProducerEpochError, an
        older coordinator epoch than the producer's last marker
        TransactionCoordinatorFencedError)."""
        from kbroker.records.control import encode_end_txn_marker
        ts = self._time_ms() if timestamp_ms is None else timestamp_ms
        buf = bytearray(encode_end_txn_marker(producer_id, producer_epoch, coordinator_epoch, is_commit, ts))
        return self.append(buf, None, leader_epoch=leader_epoch, origin=AppendOrigin.COORDINATOR)

    def _duplicate_append_info(self, dup) -> LogAppendInfo:
        """The answer to a retried batch: its original offsets, nothing appended. Lock held."""
        append_time = dup.timestamp if self.config.message_timestamp_type == "LogAppendTime" else -1
        return LogAppendInfo(dup.first_offset, dup.last_offset, dup.timestamp, dup.last_offset, append_time,
                             self._log_start_offset, 0, 0)

    def _prepare(self, buf, seg: LogSegment, leader_epoch: int, assign_offsets: bool):
        try:
            return _scan.prepare_append(buf, self._leo, leader_epoch, seg.base_offset, seg.size,
                                        seg.bytes_since_last_index_entry, seg.index_interval_bytes,
                                        -1, -1, assign_offsets)
        except ValueError as e:
            if assign_offsets or type(e) is not ValueError:
                raise
            raise UnexpectedAppendOffsetError(str(e)) from None

    def append_as_leader(self, buf, *, leader_epoch: int = -1) -> LogAppendInfo:
        """Validate with ``kernels.records.validate_batches`` (CRC, record
        framing), then append with offsets assigned."""
        from kbroker.kernels import records
        infos = records.validate_batches(buf)
        return self.append(buf, infos, leader_epoch=leader_epoch)

    def append_as_follower(self, buf) -> LogAppendInfo:
        """Append the leader's batches exactly as they are (Kafka's ``appendAsFollower``):
        offsets, partition leader epochs, producer ids and sequences kept, nothing
        rewritten. Checked first, nothing appended on failure: every batch's framing and
        CRC (CorruptRecordError), offsets increasing from batch to batch, and the first
        batch's base offset equal to ``log_end_offset`` (above it only on a compacted
        topic, whose leader may have removed whole batches): else
        UnexpectedAppendOffsetError. Each new partition leader epoch among the batches
        gets its leader-epoch cache entry; idempotent producers' state is updated
        (replication origin: no sequence checks) so a new leader answers retries as the
        old one did. The high watermark is the caller's: min(leader's, own log end).
        """
        if isinstance(buf, memoryview) and buf.format != "B":
            buf = buf.cast("B")
        n = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        if n == 0:
            raise CorruptRecordError(f"empty follower append to {self.name}")
        leo = self._leo
        first = _FIRST_OFFSET.unpack_from(buf, 0)[0] if n >= 8 else -1
        if first != leo and not (self.config.compact and first > leo):
            raise UnexpectedAppendOffsetError(
                f"follower append to {self.name} starts at offset {first}, not at the log end offset {leo}")
        r = _scan.scan(buf, first, index_interval_bytes=-1, verify_crc=True, end=n)
        if r.error is not None or r.valid_bytes != n:
            raise CorruptRecordError(f"corrupt records in the follower append to {self.name}: "
                                     f"{r.error or 'trailing bytes'}")
        return self.append(buf, None, assign_offsets=False, batch_epochs=r.epochs)

    # -- read ---------------------------------------------------------------------------
    # Readers take no lock: they work on one published view (module docstring, Locking).

    def _read_with_retry(self, fn, *args):
        """``fn(view, *args)`` on the current view; again on a newer view if a segment of
        the old one was closed under the reader (retention, swap, truncation). Raises
        KafkaStorageError once the log itself is closed."""
        for _ in range(_READ_ATTEMPTS):
            v = self._view
            try:
                return fn(v, *args)
            except _CLOSED_ERRORS as e:
                if self._closed:
                    raise KafkaStorageError(f"log {self.name} is closed") from e
                if self._view is v:
                    raise KafkaStorageError(f"read of {self.name} hit a closed segment: {e}") from e
        raise KafkaStorageError(f"read of {self.name} kept hitting closed segments")

    def read(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchDataInfo:
        """Batches from the one containing ``fetch_offset``.

        ``max_offset`` is an exclusive upper bound (e.g. the high watermark for
        consumers; None = log end). At most ``max_bytes`` bytes unless the
        first batch alone is larger and ``min_one_message``. Raises
        OffsetOutOfRangeError outside [log_start_offset, log_end_offset].
        Takes no lock: bounded by the view it starts from.
        """
        return self._read_with_retry(self._read, fetch_offset, max_bytes, max_offset, min_one_message)

    def _read(self, v: LogView, fetch_offset: int, max_bytes: int, max_offset: int | None,
              min_one_message: bool) -> FetchDataInfo:
        end = v.end
        leo = end.message_offset
        if fetch_offset < v.log_start_offset or fetch_offset > leo:
            raise OffsetOutOfRangeError(
                f"Received request for offset {fetch_offset} for partition {self.name}, but we only "
                f"have log segments in the range {v.log_start_offset} to {leo}.", fetch_offset)
        if max_offset is None or max_offset >= leo:
            max_meta = end
        elif max_offset == v.high_watermark.message_offset:
            max_meta = self._hw_metadata(v)
        else:
            max_meta = self._offset_metadata(v, max_offset)
        if fetch_offset == max_meta.message_offset:
            return FetchDataInfo(max_meta, EMPTY_RECORDS)
        if fetch_offset > max_meta.message_offset:
            return FetchDataInfo(self._offset_metadata(v, fetch_offset), EMPTY_RECORDS)
        segs = v.segments
        i = bisect.bisect_right(v.bases, fetch_offset) - 1
        if i < 0:
            i = 0
        max_base = max_meta.segment_base_offset
        while i < len(segs):
            seg = segs[i]
            base = seg.base_offset
            if base == max_base:
                max_pos = max_meta.relative_position_in_segment
            elif base > max_base:
                break           # nothing below max_offset lies past its segment
            else:
                max_pos = seg.size   # a segment before the bound's: complete and immutable
            info = seg.read(fetch_offset, max_bytes, max_pos, min_one_message)
            if info is not None:
                return info
            i += 1
        return FetchDataInfo(end, EMPTY_RECORDS)

    def _offset_metadata(self, v: LogView, offset: int) -> LogOffsetMetadata:
        """Where ``offset`` lives in view ``v`` (the start of the batch holding it)."""
        end = v.end
        if offset >= end.message_offset:
            return end
        i = max(0, bisect.bisect_right(v.bases, offset) - 1)
        for seg in v.segments[i:]:
            m = seg.translate_offset(offset)
            if m is not None:
                return _new_tuple(LogOffsetMetadata, (offset, seg.base_offset, m[2]))
        return end

    def _hw_metadata(self, v: LogView) -> LogOffsetMetadata:
        """The high watermark of view ``v`` with its position. An offset-only one is
        resolved against ``v`` and cached by the identity of the metadata object:
        writers publish a new object whenever positions below it may change."""
        hw = v.high_watermark
        if hw.segment_base_offset >= 0:
            return hw
        c = self._hw_resolved
        if c is not None and c[0] is hw:
            return c[1]
        m = self._offset_metadata(v, hw.message_offset)
        self._hw_resolved = (hw, m)
        return m

    # -- transactions (readers: no lock) ----------------------------------------------------
    @property
    def last_stable_offset(self) -> int:
        """min(first unstable offset, high watermark): read_committed consumers see
        offsets below it (Kafka's lastStableOffset). No lock (module docstring)."""
        hw = self._view.high_watermark.message_offset
        fu = self._first_unstable
        return fu if fu is not None and fu < hw else hw

    @property
    def first_unstable_offset(self) -> int | None:
        return self._first_unstable

    def last_stable_offset_metadata(self) -> LogOffsetMetadata:
        """The last stable offset with its segment and position (DelayedFetch)."""
        v = self._view
        fu = self._first_unstable
        if fu is None or fu >= v.high_watermark.message_offset:
            return self.high_watermark_metadata
        return self.convert_to_offset_metadata(fu)

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping ``[fetch_offset, upper_bound_offset)``, from
        the ``.txnindex`` of the segment holding ``fetch_offset`` and the later ones."""
        v = self._view
        i = max(0, bisect.bisect_right(v.bases, fetch_offset) - 1)
        return collect_aborted(v.segments[i:], fetch_offset, upper_bound_offset)

    def aborted_transactions_for_read(self, fetch_offset: int, info: FetchDataInfo,
                                      max_offset: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed fetch needs with ``info`` (a ``read``
        of ``fetch_offset`` bounded by ``max_offset``, the LSO): those overlapping
        ``[fetch_offset, upper bound)``, the upper bound being the end of the segment the
        data came from (past fetch_offset's own segment after a gap) or ``max_offset``."""
        seg_base = info.fetch_offset_metadata.segment_base_offset
        upper = self.fetch_upper_bound_offset(max(seg_base, fetch_offset), max_offset)
        return self.collect_aborted_transactions(fetch_offset, upper)

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int | None = None) -> bool:
        """Whether ``producer_id`` has a transaction open in this partition — of
        ``producer_epoch`` when given: with a newer epoch the open one may have ended
        (Kafka 4's hasOngoingTransaction; KIP-890's produce-time verification)."""
        with self._lock:
            return self._has_ongoing_transaction_locked(producer_id, producer_epoch)

    def _has_ongoing_transaction_locked(self, producer_id: int, producer_epoch: int | None = None) -> bool:
        e = self.producer_state.last_entry(producer_id)
        return (e is not None and e.current_txn_first_offset is not None
                and (producer_epoch is None or e.producer_epoch == producer_epoch))

    def maybe_start_transaction_verification(self, producer_id: int, sequence: int,
                                             epoch: int) -> VerificationGuard:
        """KIP-890: SENTINEL if the producer has a transaction open here (no verification
        needed), else its verification guard (made now unless one is pending); an append
        carrying it goes ahead only while it is still the producer's guard."""
        with self._lock:
            if self._has_ongoing_transaction_locked(producer_id, epoch):
                return SENTINEL
            return self._verification.start(producer_id, sequence, epoch, self._time_ms())

    def verification_guard(self, producer_id: int) -> VerificationGuard:
        """The producer's pending verification guard, SENTINEL if none (tests)."""
        with self._lock:
            return self._verification.guard(producer_id)

    def fetch_upper_bound_offset(self, fetch_offset: int, max_offset: int) -> int:
        """Where a read of ``fetch_offset`` (or of the segment starting at it) bounded by
        ``max_offset`` ends at most: the base offset of the segment after the one holding
        it (a read returns one segment's batches) or ``max_offset`` (Kafka's upper bound
        for the aborted-transaction search)."""
        v = self._view
        i = bisect.bisect_right(v.bases, fetch_offset)
        nxt = v.bases[i] if i < len(v.bases) else v.end.message_offset
        return min(nxt, max_offset)

    def convert_to_offset_metadata(self, offset: int) -> LogOffsetMetadata:
        """Where ``offset`` lives (segment base offset, byte position); no lock taken."""
        return self._read_with_retry(self._convert_to_offset_metadata, offset)

    def _convert_to_offset_metadata(self, v: LogView, offset: int) -> LogOffsetMetadata:
        if offset < v.log_start_offset or offset > v.end.message_offset:
            raise OffsetOutOfRangeError(f"offset {offset} out of range for {self.name}", offset)
        return self._offset_metadata(v, offset)

    # -- offsets ---------------------------------------------------------------------------
    def maybe_increment_high_watermark(self, new_hw: LogOffsetMetadata) -> LogOffsetMetadata | None:
        """Move the high watermark forward to ``new_hw`` (Kafka's
        ``UnifiedLog.maybeIncrementHighWatermark``): the minimum log end offset
        metadata over the ISR, e.g. ``log_end_offset_metadata`` read after an append.

        Under the append lock, it only moves forward: a proposal at or below the
        current high watermark changes nothing, so proposals read at different
        times may be applied in any order. At the same offset, metadata on a newer
        segment (or with a position where the current one has none) replaces it,
        as Kafka does after a roll. Returns the old metadata if it moved, else None.
        Raises ValueError if ``new_hw`` is above the log end offset.
        """
        with self._lock:
            off = new_hw.message_offset
            if off > self._leo:
                raise ValueError(f"High watermark {new_hw} update exceeds the log end offset "
                                 f"{self._leo} of {self.name}")
            old = self._hw
            old_off = old.message_offset
            if old_off < off or (old_off == off and new_hw.segment_base_offset > old.segment_base_offset):
                self._move_high_watermark_locked(new_hw if new_hw.segment_base_offset >= 0
                                                 else LogOffsetMetadata(off))
                self._publish()
                return old
            return None

    def maybe_increment_high_watermark_to_end(self) -> LogOffsetMetadata | None:
        """``maybe_increment_high_watermark(log_end_offset_metadata)`` (a leader with no
        other replica), without the lock when the published high watermark already is
        the published end (an append with ``high_watermark_follows``)."""
        v = self._view
        if v.high_watermark is v.end:
            return None
        return self.maybe_increment_high_watermark(v.end)

    def _move_high_watermark_locked(self, new_hw: LogOffsetMetadata) -> None:
        """Make ``new_hw`` (above the current one) the high watermark. Lock held; the
        caller publishes."""
        self._hw = new_hw
        if self.hw_changes is not None:
            self.hw_changes[0] += 1
        if self._first_unstable is not None:
            self.producer_state.on_high_watermark_updated(new_hw.message_offset)
            self._update_first_unstable_locked()

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark, clamped to [log_start_offset, log_end_offset];
        returns it. The explicit path (restart, truncation, tests): unlike
        maybe_increment_high_watermark it may move it back."""
        with self._lock:
            hw = self._set_high_watermark_locked(offset)
            self._publish()
            return hw

    def _set_high_watermark_locked(self, offset: int) -> int:
        """Clamp ``offset`` to [log_start_offset, log_end_offset] and make it the high
        watermark: at the log end with its position, else offset-only (resolved by
        readers). Lock held; the caller publishes."""
        hw = min(max(offset, self._log_start_offset), self._leo)
        if hw == self._leo:
            seg = self._segments[-1]
            self._hw = LogOffsetMetadata(hw, seg.base_offset, seg.size)
        else:
            self._hw = LogOffsetMetadata(hw)
        if self.hw_changes is not None:
            self.hw_changes[0] += 1
        self.producer_state.on_high_watermark_updated(hw)
        self._update_first_unstable_locked()
        return hw

    def delete_records(self, offset: int) -> int:
        """DeleteRecords: move log_start_offset to ``offset`` (<= high watermark).
        Segments wholly below it go at the next retention pass. Returns the
        new log start offset."""
        with self._lock:
            hw = self._hw.message_offset
            if offset > hw:
                raise OffsetOutOfRangeError(
                    f"Cannot increment the log start offset to {offset} of partition {self.name} since it "
                    f"is larger than the high watermark {hw}", offset)
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                self.leader_epoch_cache.truncate_from_start(offset)
                self.producer_state.truncate_head(offset)
                self._update_first_unstable_locked()
                self._publish()
            return self._log_start_offset

    def fetch_offset_by_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets: the first record with timestamp >= ``timestamp`` (None if
        none), or the special -1 latest / -2 earliest / -3 max-timestamp /
        -4 earliest-local / -5 latest-tiered answers (Kafka's fetchOffsetByTimestamp).
        No lock: searched in the current view, up to its log end."""
        return self._read_with_retry(self._fetch_offset_by_timestamp, timestamp)

    def _fetch_offset_by_timestamp(self, v: LogView, timestamp: int) -> TimestampAndOffset | None:
        cache = self.leader_epoch_cache
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            so = v.log_start_offset
            return TimestampAndOffset(-1, so, _epoch_or(cache.epoch_for_offset(so)))
        if timestamp == LATEST_TIMESTAMP:
            return TimestampAndOffset(-1, v.end.message_offset, _epoch_or(cache.latest_epoch))
        if timestamp == LATEST_TIERED_TIMESTAMP:
            return TimestampAndOffset(-1, -1, -1)
        end = v.end
        last = v.segments[-1]
        bound = end.relative_position_in_segment     # of the view's last segment
        if timestamp == MAX_TIMESTAMP:
            best, best_ts = None, -1
            for seg in v.segments[:-1]:
                ts = seg.max_timestamp_so_far
                if ts > best_ts:
                    best, best_ts = seg, ts
            if last.max_timestamp_so_far > best_ts:
                found = last.offset_of_max_timestamp_record(bound)
                if found is None:   # its maximum is past this view's end (being appended)
                    found = last.max_timestamp_record_below(bound)
                if found is not None and found.timestamp > best_ts:
                    return found
            if best is None:
                return TimestampAndOffset(-1, -1, -1)
            return best.offset_of_max_timestamp_record()
        if timestamp < 0:
            raise ValueError(f"invalid ListOffsets timestamp {timestamp}")
        start = v.log_start_offset
        for seg in v.segments:
            if seg.largest_timestamp >= timestamp:
                found = seg.find_offset_by_timestamp(timestamp, start, bound if seg is last else None)
                if found is not None:
                    return found
        return None

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        """A replica becoming leader of ``epoch``: record that the epoch starts at
        ``start_offset`` (its log end offset) before anything is appended in it, so a
        follower's diverging-epoch check sees the new epoch at once (Kafka's
        assignEpochStartOffset). Written to the checkpoint now: once per leader change."""
        with self._lock:
            if self.leader_epoch_cache.latest_epoch != epoch:
                self.leader_epoch_cache.assign(epoch, start_offset)
        try:
            self.leader_epoch_cache.flush()
        except OSError as e:
            raise KafkaStorageError(f"error writing the leader-epoch checkpoint of {self.name}: {e}") from e

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (epoch, end offset) — see LeaderEpochFileCache.end_offset_for."""
        return self.leader_epoch_cache.end_offset_for(epoch, self._view.end.message_offset)

    # -- roll / flush -------------------------------------------------------------------------
    def roll(self, expected_next_offset: int | None = None) -> LogSegment:
        """Start a new active segment at log_end_offset (if the active one is non-empty)."""
        with self._lock:
            seg = self._roll_locked(expected_next_offset)
        self._run_pending_roll_flush()
        return seg

    def _roll_locked(self, expected_next_offset: int | None) -> LogSegment:
        new_offset = max(expected_next_offset or 0, self._leo)
        active = self._segments[-1]
        if active.base_offset == new_offset and active.size == 0:
            return active  # Kafka would replace an empty active segment by an identical one
        if new_offset <= active.base_offset:
            raise KafkaStorageError(
                f"Trying to roll a new log segment for {self.name} with start offset {new_offset} "
                f"<= the active segment's base offset {active.base_offset}")
        active.on_become_inactive()
        seg = self._new_segment(new_offset)
        self._segments = self._segments + (seg,)
        self._bases = self._bases + (new_offset,)
        self._publish()      # the log end now lives in the new (empty) segment, as Kafka's
        # Kafka snapshots the producer state at every roll, at the new segment's base
        # offset, so a restart replays at most the segments after the newest snapshot.
        psm = self.producer_state
        psm.update_map_end_offset(new_offset)
        try:
            psm.take_snapshot()
        except OSError as e:
            raise KafkaStorageError(f"error writing the producer snapshot of {self.name}: {e}") from e
        # Kafka flushes the rolled segment asynchronously and then moves the
        # recovery point to the new segment's base offset.
        if self._scheduler is None or not self._scheduler(lambda: self.flush(new_offset, including_offset=False)):
            self._pending_roll_flush = new_offset   # run inline once the lock is released
        return seg

    _pending_roll_flush: int | None = None

    def flush(self, offset: int | None = None, *, including_offset: bool = True, sync: bool = True) -> None:
        """fsync every segment holding offsets in [recovery_point, offset) and
        move the recovery point to ``offset`` (default: log end). The fsyncs
        run without the log lock. ``sync=False`` writes what must be written but
        fsyncs nothing: only for a caller that syncs the whole file system before
        anything relies on the new recovery point (LogManager.shutdown)."""
        with self._lock:
            if offset is None:
                offset = self._leo
            target = offset + 1 if including_offset and offset < self._leo else offset
            target = min(target, self._leo)
            if target <= self._recovery_point:
                return
            rp = self._recovery_point
            segs = [s for i, s in enumerate(self._segments)
                    if s.base_offset < target and (i + 1 == len(self._segments)
                                                   or self._segments[i + 1].base_offset > rp)]
            # Segments created before this point have their entries synced below; one
            # created later (a roll racing this flush) sets the flag again.
            dirs, self._dir_unsynced = (self._dir_unsynced, 0) if sync else (0, self._dir_unsynced)
        if not sync:
            segs = []
        try:
            for s in segs:
                try:
                    s.flush()
                except (ValueError, OSError) as e:
                    if s.has_open_file() and os.path.exists(s.log_path):
                        raise
                    log.debug("skipping flush of deleted segment %s: %s", s.log_path, e)
            if dirs:
                # Kafka's LocalLog.flush: new segments' directory entries (and a new
                # directory's own entry) before the recovery point passes them.
                try:
                    self._write_partition_metadata()     # if still pending: synced with them
                    self._sync_dirs(dirs)
                except FileNotFoundError:
                    pass        # renamed for deletion meanwhile: nothing left to keep
            self._flush_metadata(sync)
        except OSError as e:
            with self._lock:
                self._dir_unsynced |= dirs
            raise KafkaStorageError(f"error while flushing {self.name}: {e}") from e
        with self._lock:
            if target > self._recovery_point:
                self._recovery_point = min(target, self._leo)
            self._last_flush_ms = self._time_ms()

    def _flush_metadata(self, sync: bool = True) -> None:
        """Before the recovery point moves: the leader-epoch entries below it must be in
        their checkpoint (recovery rebuilds only those at or above it)."""
        self.leader_epoch_cache.flush(sync)

    def _run_pending_roll_flush(self) -> None:
        """Without a scheduler, a roll's flush runs inline, after the lock is released."""
        off = self._pending_roll_flush
        if off is not None:
            self._pending_roll_flush = None
            self.flush(off, including_offset=False)

    # -- truncation ------------------------------------------------------------------------------
    def truncate_to(self, target_offset: int) -> bool:
        """Remove every offset >= target_offset (whole batches: the batch
        holding target_offset goes too): segments, index entries, producer state
        (reloaded), leader-epoch entries; the high watermark and recovery point are
        clamped to the new end. Durable before it returns (_sync_truncation_locked).
        Returns True if anything was removed."""
        if target_offset < 0:
            raise ValueError(f"Cannot truncate partition {self.name} to a negative offset ({target_offset}).")
        with self._lock:
            if target_offset >= self._leo:
                # Nothing to cut, but an epoch entry at the log end with no batches (a
                # leader's, assign_epoch_start_offset) may conflict with the new leader's
                # log: Kafka truncates the epoch cache here too.
                cache = self.leader_epoch_cache
                if cache.latest_epoch is not None and cache.epoch_entries()[-1][1] >= target_offset:
                    cache.truncate_from_end(target_offset)
                    self._sync_truncation_locked(None)
                return False
            if target_offset < self._segments[0].base_offset:
                self._truncate_fully_locked(target_offset)
                self._sync_truncation_locked(None)
                return True
            i = bisect.bisect_right(self._bases, target_offset) - 1
            doomed = self._segments[i + 1:]
            seg = self._segments[i]
            mapping = seg.translate_offset(target_offset)
            seg.truncate_to(target_offset)
            self._segments = self._segments[: i + 1]
            self._bases = self._bases[: i + 1]
            new_leo = mapping[0] if mapping is not None and mapping[0] < target_offset else target_offset
            if seg.size == 0:
                new_leo = max(seg.base_offset, min(new_leo, target_offset))
            self._leo = new_leo
            self._after_truncation()
            self._reload_producer_state_locked()
            self._update_first_unstable_locked()
            self._publish()
            self._schedule_delete(doomed)    # after the view without them is published
            self._sync_truncation_locked(seg)
            return True

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and restart the log, empty, at ``new_offset``."""
        with self._lock:
            self._truncate_fully_locked(new_offset)
            self._sync_truncation_locked(None)

    def _sync_truncation_locked(self, seg: LogSegment | None) -> None:
        """Make a truncation durable before anything is appended after it, so no crash
        (not even a power loss) brings the removed batches back under new ones: the cut
        segment fsynced, the leader-epoch checkpoint written, and the directory (segments
        renamed ``.deleted``, snapshots unlinked) fsynced. Truncation is rare (a follower's
        divergence, a replica that was leader); Kafka's LogManager.truncateTo checkpoints
        the recovery points at the same place. Lock held."""
        try:
            if seg is not None:
                seg.flush()
            self.leader_epoch_cache.flush()
            fsync_dir(self.dir)
        except OSError as e:
            raise KafkaStorageError(f"error making the truncation of {self.name} durable: {e}") from e

    def _truncate_fully_locked(self, new_offset: int) -> None:
        doomed = self._segments
        # A new segment may have the base offset of a doomed one: rename those first.
        for s in doomed:
            self._rename_deleted(s)
        seg = self._new_segment(new_offset)
        self._segments = (seg,)
        self._bases = (new_offset,)
        self._leo = new_offset
        self._log_start_offset = new_offset
        self.leader_epoch_cache.clear()
        self._after_truncation()
        self.producer_state.truncate_fully_and_start_at(new_offset)
        self._update_first_unstable_locked()
        self._publish()
        self._schedule_delete(doomed, renamed=True)

    def _after_truncation(self) -> None:
        """Clamp the other offsets to the new log end. Lock held; the caller publishes."""
        leo = self._leo
        self._log_start_offset = min(self._log_start_offset, leo)
        self._set_high_watermark_locked(self._hw.message_offset)   # a new metadata object
        self._recovery_point = min(self._recovery_point, leo)
        self.leader_epoch_cache.truncate_from_end(leo)

    # -- retention ----------------------------------------------------------------------------------
    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """One retention pass (Kafka's deleteOldSegments): segments below the
        log start offset always; with cleanup.policy containing delete, also
        by retention.ms (segment's largest timestamp) and retention.bytes.
        Only segments wholly below the high watermark go; if every segment
        qualifies, the log rolls first so the active segment is never deleted.
        Returns the number of segments deleted."""
        now = self._time_ms() if now_ms is None else now_ms
        deleted = self._delete_by(lambda seg, nxt: nxt is not None and nxt.base_offset <= self._log_start_offset,
                                  "log start offset breach")
        if self.config.delete:
            rb = self.config.retention_bytes
            if rb >= 0:
                with self._lock:
                    diff = [self.size_in_bytes - rb]

                def size_breach(seg, nxt):
                    if diff[0] - seg.size >= 0:
                        diff[0] -= seg.size
                        return True
                    return False
                if diff[0] > 0:
                    deleted += self._delete_by(size_breach, "retention size breach")
            rms = self.config.retention_ms
            if rms >= 0:
                deleted += self._delete_by(lambda seg, nxt: now - seg.largest_timestamp > rms,
                                           "retention time breach")
        return deleted

    def _delete_by(self, predicate, reason: str) -> int:
        with self._lock:
            segs = self._segments
            hw = self._hw.message_offset
            deletable = []
            for i, seg in enumerate(segs):
                nxt = segs[i + 1] if i + 1 < len(segs) else None
                if nxt is None and seg.size == 0:
                    break
                upper = nxt.base_offset if nxt is not None else self._leo
                if predicate(seg, nxt) and hw >= upper:
                    deletable.append(seg)
                else:
                    break
            if not deletable:
                return 0
            if len(deletable) == len(self._segments):
                self._roll_locked(None)
            n = len(deletable)
            self._segments = self._segments[n:]
            self._bases = self._bases[n:]
            new_start = self._segments[0].base_offset
            if new_start > self._log_start_offset:
                self._log_start_offset = new_start
                self.leader_epoch_cache.truncate_from_start(new_start)
                self.producer_state.truncate_head(new_start)
                self._update_first_unstable_locked()
            self._publish()
            self._schedule_delete(deletable)    # after the view without them is published
            log.info("Deleting %d segment(s) of %s due to %s", n, self.name, reason)
        self._run_pending_roll_flush()
        return n

    def _rename_deleted(self, seg: LogSegment) -> None:
        try:
            seg.change_file_suffixes("", DELETED_SUFFIX)
        except OSError as e:
            raise KafkaStorageError(f"error renaming {seg.log_path}: {e}") from e

    def _schedule_delete(self, segments, renamed: bool = False) -> None:
        """Rename to .deleted now (unless ``renamed``); close + unlink after
        file.delete.delay.ms. Lock held, and the view without ``segments`` already
        published: a reader that still holds them gets SegmentClosedError and retries."""
        if not segments:
            return
        due = self._time_ms() + self.config.file_delete_delay_ms
        for seg in segments:
            if not renamed:
                self._rename_deleted(seg)
            if self.config.file_delete_delay_ms == 0:
                seg.delete_if_exists()
            else:
                self._pending_deletes.append((due, seg))

    def delete_pending_segments(self, now_ms: int | None = None, force: bool = False) -> int:
        """Unlink ``.deleted`` segments whose delay has passed (all if force)."""
        now = self._time_ms() if now_ms is None else now_ms
        with self._lock:
            ready = [s for due, s in self._pending_deletes if force or due <= now]
            self._pending_deletes = [(d, s) for d, s in self._pending_deletes if not (force or d <= now)]
        for s in ready:
            s.delete_if_exists()
        return len(ready)

    @property
    def pending_deletes(self) -> int:
        return len(self._pending_deletes)

    # -- compaction ------------------------------------------------------------------------------
    def replace_segments(self, new_segments, old_segments) -> bool:
        """Swap cleaned segments in for ``old_segments`` (Kafka's replaceSegments;
        called by the log cleaner, kbroker/log/cleaner.py).

        ``new_segments`` are flushed ``*.cleaned`` segments of this log holding
        the survivors of ``old_segments`` at their original offsets; the first
        has the base offset of the first old one. Under the append lock, in a
        crash-safe order (recovery.py completes a swap whose ``.swap`` files
        exist and drops ``.cleaned`` leftovers):

        1. ``.cleaned`` -> ``.swap`` (directory fsynced);
        2. the segment list takes the new segments, the old ones are renamed
           ``.deleted`` and closed/unlinked after file.delete.delay.ms (in-flight
           FileRegions stay readable);
        3. ``.swap`` -> live (directory fsynced).

        Returns False and changes nothing if the old segments are no longer a
        run of non-active segments of this log (retention, truncation or
        deletion raced the cleaner, or the log is closed or its directory
        moved); the caller then deletes its new segments.
        """
        from kbroker.log.segment import CLEANED_SUFFIX, SWAP_SUFFIX
        if not new_segments or not old_segments:
            raise ValueError("replace_segments needs new and old segments")
        new = sorted(new_segments, key=lambda s: s.base_offset)
        old = list(old_segments)
        with self._lock:
            segs = self._segments
            if self._closed or any(s.dir != self.dir for s in new):
                return False
            i = next((j for j, s in enumerate(segs) if s is old[0]), -1)
            n = len(old)
            if (i < 0 or i + n >= len(segs) or any(segs[i + k] is not old[k] for k in range(n))
                    or new[0].base_offset != old[0].base_offset):
                return False
            try:
                for s in reversed(new):
                    s.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
                fsync_dir(self.dir)
                self._segments = segs[:i] + tuple(new) + segs[i + n:]
                self._bases = tuple(s.base_offset for s in self._segments)
                # positions below the high watermark moved: a new (offset-only) metadata
                self._set_high_watermark_locked(self._hw.message_offset)
                self._publish()
                self._schedule_delete(old)
                for s in new:
                    s.change_file_suffixes(SWAP_SUFFIX, "")
                fsync_dir(self.dir)
            except OSError as e:
                raise KafkaStorageError(f"error swapping cleaned segments into {self.name}: {e}") from e
            return True

    # -- producer state -----------------------------------------------------------------------------
    def _load_producer_state_locked(self, had_clean_shutdown: bool) -> None:
        """Open: Kafka's rebuildProducerState. The newest snapshot in
        ``(log_start_offset, log_end_offset]`` plus a replay of the batches after it;
        a cleanly shut down log without any snapshot (written before producer state
        was kept, or closed without producers: ``close``) is not scanned: its state is
        empty; with more than one segment empty snapshots are written, at the last
        two segments' base offsets and the log end, as Kafka does on upgrade (a crash
        then replays from there, not from the log start)."""
        psm = self.producer_state
        # its directory was just listed; the strays' files go on the background thread
        stale = psm.remove_stray_snapshots(self._bases, rescan=False, defer=self._scheduler is not None)
        if stale and not self._scheduler(lambda: self._delete_forgotten_snapshots(stale)):
            psm.delete_forgotten_snapshots(stale)
        leo = self._leo
        if not had_clean_shutdown:
            # recovery may have cut the last segment: its markers past the end are gone
            self._segments[-1].txn_index.truncate_to(leo)
        if had_clean_shutdown and psm.latest_snapshot_offset() is None:
            if len(self._bases) == 1:
                # no producer state (close took no snapshot of an empty one, see
                # _no_producer_state_to_keep_locked): nothing to write either
                psm.update_map_end_offset(leo)
                return
            for offset in list(self._bases[-2:]) + [leo]:
                psm.update_map_end_offset(offset)
                psm.take_snapshot()
            return
        start = psm.load_from_snapshot(self._log_start_offset, leo, self._time_ms())
        self._replay_producer_state_locked(start, leo)
        if start < leo and (self._scheduler is None or not psm.is_empty()):
            # A snapshot at the log end saves the next start-up this replay. Without
            # producers it saves nothing worth an fsync per log at start-up (the replay
            # only reads headers); with some it is taken on the background thread.
            if self._scheduler is None or not self._scheduler(
                    lambda: None if self._closed else self.take_producer_snapshot()):
                psm.take_snapshot()

    def _delete_forgotten_snapshots(self, forgotten) -> None:
        """Background: unlink the stray snapshots start-up forgot (none of them is read)."""
        with self._lock:
            if not self._closed:
                self.producer_state.delete_forgotten_snapshots(forgotten)

    def _reload_producer_state_locked(self) -> None:
        """After truncate_to: back to the newest snapshot at or below the new log end, then replay."""
        start = self.producer_state.truncate_and_reload(self._log_start_offset, self._leo, self._time_ms())
        self._replay_producer_state_locked(start, self._leo)

    def _replay_producer_state_locked(self, start: int, end: int) -> None:
        """Feed the batches holding offsets ``[start, end)`` to the producer state
        (REPLICATION origin: nothing is checked), then set its map end offset to ``end``."""
        psm = self.producer_state
        if start < end:
            i = max(0, bisect.bisect_right(self._bases, start) - 1)
            replayed = 0
            try:
                for seg in self._segments[i:]:
                    if seg.base_offset >= end:
                        break
                    for h in seg.batch_headers(max(start, seg.base_offset)):
                        if h.base_offset >= end:
                            break
                        if h.producer_id == NO_PRODUCER_ID:
                            continue
                        marker = seg.read_end_txn_marker(h) if h.is_control else None
                        txn = psm.update_from_batch(h, h.base_offset, end_txn_marker=marker)
                        if txn is not None:
                            if txn.is_aborted:   # rebuild a missing .txnindex entry
                                seg.txn_index.append_if_absent(AbortedTxn(
                                    txn.producer_id, txn.first_offset, txn.last_offset,
                                    psm.last_stable_offset(txn)))
                            psm.complete_txn(txn)
                        replayed += 1
            except (CorruptRecordError, OSError) as e:
                log.warning("Stopped rebuilding the producer state of %s at a bad batch: %s", self.name, e)
            log.debug("Rebuilt the producer state of %s from offset %d to %d (%d idempotent batches)",
                      self.name, start, end, replayed)
        psm.update_map_end_offset(end)
        self._update_first_unstable_locked()

    def remove_expired_producers(self, now_ms: int | None = None) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms (the LogManager calls
        this every producer.id.expiration.check.interval.ms). Returns their ids."""
        now = self._time_ms() if now_ms is None else now_ms
        with self._lock:
            if self._closed:
                return []
            if self._verification:
                self._verification.remove_expired(now, self.producer_state.producer_id_expiration_ms)
            return self.producer_state.remove_expired_producers(now)

    def take_producer_snapshot(self) -> str | None:
        """Snapshot the producer state at the log end offset now (tests, tools)."""
        with self._lock:
            return self.producer_state.take_snapshot()

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self, sync: bool = True) -> None:
        """Clean close: snapshot the producer state at the log end offset (unless there
        is none to keep: ``_no_producer_state_to_keep_locked``), trim the active
        segment's indexes (a small one without index files gets none:
        ``LogSegment.close``), close every fd and map. Pending deletions are
        completed (their files are already ``.deleted``). ``sync=False``: nothing is
        fsynced (see ``flush``)."""
        try:
            self._write_partition_metadata()
        except OSError as e:
            log.warning("error writing the partition.metadata of %s: %s", self.name, e)
        try:
            self.leader_epoch_cache.flush(sync)
        except OSError as e:
            log.warning("error writing the leader-epoch checkpoint of %s: %s", self.name, e)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            segs = self._segments
            try:
                if not self._no_producer_state_to_keep_locked():
                    self.producer_state.take_snapshot(sync)
                snapshot_error = None
            except OSError as e:
                snapshot_error = e
        self.delete_pending_segments(force=True)
        for s in segs:
            s.close()
        if snapshot_error is not None:
            raise KafkaStorageError(f"error writing the producer snapshot of {self.name}: {snapshot_error}")

    def _no_producer_state_to_keep_locked(self) -> bool:
        """No producer id, no snapshot file and one segment: the clean-shutdown snapshot
        would be an empty one that no load needs. A clean load without any snapshot
        takes the state as empty (``_load_producer_state_locked``), and a crash replays
        from the log start, through the one segment recovery scans anyway."""
        psm = self.producer_state
        return len(self._segments) == 1 and psm.is_empty() and psm.latest_snapshot_offset() is None

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        with self._lock:
            self._closed = True
            segs = self._segments
        self.leader_epoch_cache.discard()
        self.delete_pending_segments(force=True)
        for s in segs:
            s.close_handlers()
        shutil.rmtree(self.dir, ignore_errors=True)

    def rename_dir(self, new_dir: str) -> None:
        """Move the partition directory (e.g. to ``...-delete``). Segments keep their fds."""
        with self._lock:
            os.replace(self.dir, new_dir)
            old = self.dir
            self.dir = new_dir
            for s in list(self._segments) + [s for _, s in self._pending_deletes]:
                s.moved_dir(old, new_dir)
            self.producer_state.update_parent_dir(new_dir)
            self.leader_epoch_cache.moved(os.path.join(new_dir, LEADER_EPOCH_CHECKPOINT))

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (f"Log({self.name}, log_start_offset={self._log_start_offset}, "
                f"log_end_offset={self._leo}, high_watermark={self._hw.message_offset}, "
                f"segments={len(self._segments)})")


def _epoch_or(e: int | None) -> int:
    return -1 if e is None else e
