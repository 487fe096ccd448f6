"""Broker-side state of idempotent producers, per partition (Kafka KIP-98 / KIP-360).

Model: Kafka's ``ProducerStateManager``, ``ProducerAppendInfo``,
``ProducerStateEntry`` and ``BatchMetadata`` (storage/.../log/).

For every producer id that wrote to the partition we keep a
:class:`ProducerStateEntry`: its epoch, the metadata of its last
``NUM_BATCHES_TO_RETAIN`` (5) batches, its coordinator epoch and the first
offset of its ongoing transaction. A producer has at most 5 requests in
flight (``max.in.flight.requests.per.connection <= 5``), so a retried batch
is always among the last 5 and is answered from here without being appended
twice (:meth:`ProducerStateManager.find_duplicate_batch`).

Append protocol (the owning ``Log`` holds its lock around all of it, as
Kafka's ``UnifiedLog.append``)::

    dup = psm.find_duplicate_batch(info)            # CLIENT origin only
    if dup is not None: answer base_offset=dup.first_offset, append nothing
    pending = psm.prepare_update(info.producer_id, AppendOrigin.CLIENT)
    pending.append_data_batch(epoch, first_seq, last_seq, max_timestamp,
                              first_offset, last_offset, is_transactional)  # raises
    ... write the batch to the segment ...
    psm.update(pending)                             # only after a successful write
    psm.update_map_end_offset(last_offset + 1)      # after every append

(``analyze_and_validate`` / ``apply_append`` wrap those steps for a list of batches.)

Sequence and epoch rules (Kafka >= 2.5, ``ProducerAppendInfo.checkProducerEpoch``
/ ``checkSequence``; CLIENT origin checks both, COORDINATOR only the epoch,
REPLICATION nothing):

* epoch below the producer's current epoch -> :class:`InvalidProducerEpochError`
  (INVALID_PRODUCER_EPOCH, 47 — Kafka >= 2.7 answers this, not PRODUCER_FENCED).
* new (higher) epoch: the first sequence must be 0, else
  :class:`OutOfOrderSequenceError` — unless the broker has no epoch for the producer.
* same epoch: the first sequence must be ``last_seq + 1`` (``Int32.MAX`` wraps to 0),
  else :class:`OutOfOrderSequenceError` — unless the broker has no epoch for it.
* a producer the broker has no state for (never seen, expired after
  ``producer.id.expiration.ms``, or lost with a deleted snapshot) is accepted
  with ANY first sequence. Since KIP-360 (2.5) the broker no longer answers
  UNKNOWN_PRODUCER_ID for that (Kafka <= 2.4 did, when the first sequence was
  not 0); :class:`UnknownProducerIdError` is kept only so the broker's error
  map is complete.

Snapshot file ``<20-digit offset>.snapshot`` in the partition directory:
the state of every producer after all batches below ``offset``. Kafka's exact
layout (``ProducerStateManager.PID_SNAPSHOT_MAP_SCHEMA``), big-endian::

    version                   int16   = 1
    crc                       uint32  CRC-32C of every byte after this field
    producer_entries          int32 count, then count x 46-byte entries:
      producer_id             int64
      epoch                   int16
      last_sequence           int32   (-1 if no batch retained)
      last_offset             int64   (-1 if no batch retained)
      offset_delta            int32   last_offset - first offset of the last batch
      timestamp               int64   max timestamp of the last batch
      coordinator_epoch       int32
      current_txn_first_offset int64  (-1 if no ongoing transaction)

Only the last batch of each producer survives a snapshot (as Kafka), so after
a restart a retry of any older in-flight batch is OUT_OF_ORDER_SEQUENCE, not a
duplicate. A file that fails the version, length or CRC check is deleted and
the next older one is tried (:class:`CorruptSnapshotError` stays internal).

Transactions (Kafka's ongoingTxns / unreplicatedTxns): the first transactional
batch of a producer sets ``ProducerStateEntry.current_txn_first_offset`` and
enters the *ongoing* transactions (first offset -> producer id); its COMMIT/ABORT
marker yields a :class:`CompletedTxn`, which the log turns into a ``.txnindex``
entry (aborts) with :meth:`ProducerStateManager.last_stable_offset`, then hands
to :meth:`ProducerStateManager.complete_txn`: the transaction moves to the
*unreplicated* ones until the high watermark passes its marker
(:meth:`ProducerStateManager.on_high_watermark_updated`). The first unstable
offset — the smallest first offset among both — bounds the last stable offset
(LSO = min(first unstable offset, high watermark)). A snapshot keeps each
producer's ``current_txn_first_offset``, so loading one restores the ongoing
transactions; a producer with an ongoing transaction never expires.

Thread-safety: not thread-safe. The owning ``Log`` calls everything under its
append lock; ``producer_id_count`` may be read without it.
"""
from __future__ import annotations

import enum
import logging
import os
import struct
from collections import deque
from typing import Iterable, Iterator, Mapping, NamedTuple

from kbroker.kernels import crc32c as _crc32c
from kbroker.log.checkpoints import read_file_bytes
from kbroker.log.errors import LogError

__all__ = [
    "AppendOrigin", "BatchMetadata", "CompletedTxn", "CorruptSnapshotError", "InvalidProducerEpochError",
    "InvalidTxnStateError", "NO_PRODUCER_EPOCH", "NO_PRODUCER_ID", "NO_SEQUENCE", "NUM_BATCHES_TO_RETAIN",
    "OutOfOrderSequenceError", "ProducerAppendInfo", "ProducerStateEntry", "ProducerStateError",
    "ProducerStateManager", "PRODUCER_ID_EXPIRATION_MS_DEFAULT", "SNAPSHOT_SUFFIX", "TransactionCoordinatorFencedError",
    "UnknownProducerIdError", "decode_snapshot", "decrement_sequence", "encode_snapshot", "increment_sequence",
    "read_snapshot", "snapshot_file_name", "write_snapshot",
]

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
INT32_MAX = 0x7FFFFFFF
#: Batches remembered per producer for duplicate detection (max in-flight requests).
NUM_BATCHES_TO_RETAIN = 5
#: producer.id.expiration.ms default: 1 day.
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000

SNAPSHOT_SUFFIX = ".snapshot"
_TMP_SUFFIX = ".tmp"
_DELETED_SUFFIX = ".deleted"
_SNAPSHOT_TAILS = (SNAPSHOT_SUFFIX, SNAPSHOT_SUFFIX + _TMP_SUFFIX)
PRODUCER_SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hI")            # version, crc
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")       # see the module docstring; 46 bytes
_ENTRIES_OFFSET = _HEADER.size            # the CRC covers [6, end)


# -- errors ----------------------------------------------------------------------------------
class ProducerStateError(LogError):
    """A rejected producer append; ``error_code`` is the Kafka error the broker answers."""

    error_code = -1


class OutOfOrderSequenceError(ProducerStateError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER (45): a gap or a bad first sequence for a new epoch."""

    error_code = 45


class InvalidProducerEpochError(ProducerStateError):
    """INVALID_PRODUCER_EPOCH (47): the batch's epoch is below the producer's current epoch."""

    error_code = 47


class InvalidTxnStateError(ProducerStateError):
    """INVALID_TXN_STATE (48): a non-transactional batch inside the producer's open transaction."""

    error_code = 48


class TransactionCoordinatorFencedError(ProducerStateError):
    """TRANSACTION_COORDINATOR_FENCED (52): an end marker from an older coordinator epoch."""

    error_code = 52


class UnknownProducerIdError(ProducerStateError):
    """UNKNOWN_PRODUCER_ID (59). Not raised by the current (KIP-360) rules; see the module docstring."""

    error_code = 59


class CorruptSnapshotError(LogError):
    """A producer snapshot that fails the version, length or CRC check (internal: it is skipped)."""


# -- sequences -------------------------------------------------------------------------------
def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` wrapping past Int32.MAX to 0 (DefaultRecordBatch.incrementSequence)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    """Inverse of :func:`increment_sequence` (DefaultRecordBatch.decrementSequence)."""
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class AppendOrigin(enum.Enum):
    """Who appends, which decides how much is validated (Kafka's AppendOrigin)."""

    CLIENT = "client"            # Produce requests: epoch and sequence checked, duplicates detected
    COORDINATOR = "coordinator"  # group/txn coordinator writes: epoch checked only
    REPLICATION = "replication"  # followers, log recovery, snapshot rebuild: nothing checked


class BatchMetadata(NamedTuple):
    """What is remembered of one appended batch. Sequence and offset ranges have
    the same length in v2 batches, so one ``offset_delta`` describes both."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class CompletedTxn(NamedTuple):
    """A transaction closed by an end marker (seam for the LSO / ``.txnindex``)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


# -- one producer ---------------------------------------------------------------------------
class ProducerStateEntry:
    """The state of one producer id in one partition.

    Invariants: ``batch_metadata`` holds at most NUM_BATCHES_TO_RETAIN batches of
    the current ``producer_epoch``, oldest first (an epoch change clears it);
    ``last_timestamp`` is the max timestamp of the last batch or marker written.
    Not thread-safe (owned by a ProducerStateManager or a ProducerAppendInfo).
    """

    __slots__ = ("producer_id", "producer_epoch", "coordinator_epoch", "last_timestamp",
                 "current_txn_first_offset", "batch_metadata")

    def __init__(self, producer_id: int, producer_epoch: int = NO_PRODUCER_EPOCH, coordinator_epoch: int = -1,
                 last_timestamp: int = NO_TIMESTAMP, current_txn_first_offset: int | None = None,
                 batches: Iterable[BatchMetadata] = ()):
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.coordinator_epoch = coordinator_epoch
        self.last_timestamp = last_timestamp
        self.current_txn_first_offset = current_txn_first_offset
        self.batch_metadata: deque[BatchMetadata] = deque(batches, maxlen=NUM_BATCHES_TO_RETAIN)

    @classmethod
    def empty(cls, producer_id: int) -> "ProducerStateEntry":
        return cls(producer_id)

    @property
    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def first_seq(self) -> int:
        return self.batch_metadata[0].first_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def first_data_offset(self) -> int:
        return self.batch_metadata[0].first_offset if self.batch_metadata else -1

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batch_metadata[-1].offset_delta if self.batch_metadata else 0

    def _with_no_batches(self) -> "ProducerStateEntry":
        return ProducerStateEntry(self.producer_id, self.producer_epoch, self.coordinator_epoch,
                                  self.last_timestamp, self.current_txn_first_offset)

    def maybe_update_producer_epoch(self, producer_epoch: int) -> bool:
        """Adopt ``producer_epoch``; a change forgets the batches of the old epoch."""
        if self.producer_epoch != producer_epoch:
            self.batch_metadata.clear()
            self.producer_epoch = producer_epoch
            return True
        return False

    def add_batch(self, producer_epoch: int, last_seq: int, last_offset: int, offset_delta: int,
                  timestamp: int) -> None:
        self.maybe_update_producer_epoch(producer_epoch)
        self.batch_metadata.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def update(self, next_entry: "ProducerStateEntry") -> None:
        """Fold in the state a ProducerAppendInfo built on top of this entry."""
        self.maybe_update_producer_epoch(next_entry.producer_epoch)
        self.batch_metadata.extend(next_entry.batch_metadata)
        self.coordinator_epoch = next_entry.coordinator_epoch
        self.current_txn_first_offset = next_entry.current_txn_first_offset
        self.last_timestamp = next_entry.last_timestamp

    def find_duplicate_batch(self, producer_epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range, if any."""
        if producer_epoch != self.producer_epoch:
            return None
        return self.batch_with_sequence_range(first_seq, last_seq)

    def batch_with_sequence_range(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batch_metadata:
            if b.last_seq == last_seq and b.first_seq == first_seq:
                return b
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateEntry):
            return NotImplemented
        return (self.producer_id, self.producer_epoch, self.coordinator_epoch, self.last_timestamp,
                self.current_txn_first_offset, list(self.batch_metadata)) == (
                other.producer_id, other.producer_epoch, other.coordinator_epoch, other.last_timestamp,
                other.current_txn_first_offset, list(other.batch_metadata))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (f"ProducerStateEntry(producer_id={self.producer_id}, producer_epoch={self.producer_epoch}, "
                f"coordinator_epoch={self.coordinator_epoch}, last_timestamp={self.last_timestamp}, "
                f"current_txn_first_offset={self.current_txn_first_offset}, "
                f"batch_metadata={list(self.batch_metadata)})")


class ProducerAppendInfo:
    """Validates the batches of one producer in one append, before they are written.

    Starts from the producer's state after its last successful append
    (``current_entry``, never mutated here) and accumulates the would-be new state
    in a private entry; :meth:`ProducerStateManager.update` commits it only after
    the log write succeeded, so a failed write leaves the producer state untouched.
    Not thread-safe; lives for one append under the log lock.
    """

    __slots__ = ("producer_id", "origin", "topic_partition", "_current", "_updated", "started_transactions")

    def __init__(self, producer_id: int, current_entry: ProducerStateEntry, origin: AppendOrigin,
                 topic_partition: str = ""):
        self.producer_id = producer_id
        self.origin = origin
        self.topic_partition = topic_partition
        self._current = current_entry
        self._updated = current_entry._with_no_batches()
        #: first offsets of transactions begun by this append (ongoing-txn seam)
        self.started_transactions: list[int] = []

    # -- checks (Kafka's checkProducerEpoch / checkSequence) --------------------------------
    def _check_producer_epoch(self, producer_epoch: int, offset: int) -> None:
        current = self._updated.producer_epoch
        if producer_epoch < current:
            message = (f"Epoch of producer {self.producer_id} at offset {offset} in {self.topic_partition} "
                       f"is {producer_epoch}, which is smaller than the last seen epoch {current}")
            if self.origin is AppendOrigin.REPLICATION:
                log.warning("%s", message)
            else:
                raise InvalidProducerEpochError(message)

    def _check_sequence(self, producer_epoch: int, first_seq: int, offset: int) -> None:
        updated = self._updated
        if producer_epoch != updated.producer_epoch:
            # a new epoch (KIP-360 bump, or a new producer) starts over at sequence 0
            if first_seq != 0 and updated.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"Invalid sequence number for new epoch of producer {self.producer_id} at offset {offset} "
                    f"in partition {self.topic_partition}: {producer_epoch} (request epoch), {first_seq} "
                    f"(seq. number), {updated.producer_epoch} (current producer epoch)")
            return
        if not updated.is_empty:
            current_last_seq = updated.last_seq
        elif producer_epoch == self._current.producer_epoch:
            current_last_seq = self._current.last_seq
        else:
            current_last_seq = NO_SEQUENCE
        # no epoch at all (state expired / deleted by retention or DeleteRecords): accept any sequence
        if self._current.producer_epoch != NO_PRODUCER_EPOCH and not _in_sequence(current_last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"Out of order sequence number for producer {self.producer_id} at offset {offset} in partition "
                f"{self.topic_partition}: {first_seq} (incoming seq. number), {current_last_seq} "
                f"(current end sequence number)")

    # -- appends ---------------------------------------------------------------------------
    def append_data_batch(self, producer_epoch: int, first_seq: int, last_seq: int, timestamp: int,
                          first_offset: int, last_offset: int, is_transactional: bool = False) -> None:
        """Validate one data batch (offsets already assigned) and record it.

        Raises InvalidProducerEpochError / OutOfOrderSequenceError / InvalidTxnStateError;
        on error nothing of this batch is recorded.
        """
        self._check_producer_epoch(producer_epoch, first_offset)
        if self.origin is AppendOrigin.CLIENT:
            self._check_sequence(producer_epoch, first_seq, first_offset)
        txn_first = self._updated.current_txn_first_offset
        if txn_first is not None and not is_transactional:
            raise InvalidTxnStateError(
                f"Expected transactional write from producer {self.producer_id} at offset {first_offset} "
                f"in partition {self.topic_partition}")
        self._updated.add_batch(producer_epoch, last_seq, last_offset, last_offset - first_offset, timestamp)
        if txn_first is None and is_transactional:
            self._updated.current_txn_first_offset = first_offset
            self.started_transactions.append(first_offset)

    def append_batch(self, batch, first_offset: int, timestamp: int | None = None) -> CompletedTxn | None:
        """:meth:`append_data_batch` from a batch header (``kernels.records.BatchInfo`` or
        a decoded RecordBatch: producer_epoch, base_sequence, last_offset_delta,
        max_timestamp, is_transactional, is_control). ``first_offset`` is the
        batch's (assigned) base offset; ``timestamp`` overrides max_timestamp
        (LogAppendTime topics). A control batch is ignored here: its marker must
        be passed to :meth:`append_end_txn_marker`."""
        if batch.is_control:
            return None
        delta = batch.last_offset_delta
        self.append_data_batch(batch.producer_epoch, batch.base_sequence,
                               increment_sequence(batch.base_sequence, delta),
                               batch.max_timestamp if timestamp is None else timestamp,
                               first_offset, first_offset + delta, batch.is_transactional)
        return None

    def append_end_txn_marker(self, producer_epoch: int, coordinator_epoch: int, is_abort: bool, offset: int,
                              timestamp: int) -> CompletedTxn | None:
        """Record a COMMIT/ABORT control marker at ``offset`` (transactions seam;
        legacy TV0/TV1 epoch rule: marker epoch >= current). Returns the closed
        transaction, or None when the producer had none open."""
        self._check_producer_epoch(producer_epoch, offset)
        if self._updated.coordinator_epoch > coordinator_epoch:
            if self.origin is not AppendOrigin.REPLICATION:
                raise TransactionCoordinatorFencedError(
                    f"Invalid coordinator epoch for producerId {self.producer_id} at offset {offset} in partition "
                    f"{self.topic_partition}: {coordinator_epoch} (zombie), {self._updated.coordinator_epoch} "
                    f"(current)")
            log.info("stale coordinator epoch %d < %d for producer %d at offset %d in %s", coordinator_epoch,
                     self._updated.coordinator_epoch, self.producer_id, offset, self.topic_partition)
        first = self._updated.current_txn_first_offset
        completed = None if first is None else CompletedTxn(self.producer_id, first, offset, is_abort)
        upd = self._updated
        upd.maybe_update_producer_epoch(producer_epoch)
        upd.batch_metadata.clear()  # Kafka's update(epoch, coordinatorEpoch, ts) passes no batches
        upd.coordinator_epoch = coordinator_epoch
        upd.current_txn_first_offset = None
        upd.last_timestamp = timestamp
        return completed

    def to_entry(self) -> ProducerStateEntry:
        return self._updated

    def __repr__(self) -> str:
        u = self._updated
        return (f"ProducerAppendInfo(producer_id={self.producer_id}, producer_epoch={u.producer_epoch}, "
                f"first_sequence={u.first_seq}, last_sequence={u.last_seq}, "
                f"current_txn_first_offset={u.current_txn_first_offset}, origin={self.origin.name})")


class PendingAppend(NamedTuple):
    """Result of :meth:`ProducerStateManager.analyze_and_validate`.

    ``duplicate``: the retained metadata of an identical earlier batch — answer
    the produce request with ``duplicate.first_offset`` and append nothing.
    Otherwise ``updated_producers`` goes to :meth:`ProducerStateManager.apply_append`
    after the write. ``completed_txns``: the transactions its markers end, for the
    ``.txnindex`` and :meth:`ProducerStateManager.complete_txn` after the write."""

    updated_producers: dict
    duplicate: BatchMetadata | None
    completed_txns: list


# -- snapshot codec --------------------------------------------------------------------------
def snapshot_file_name(offset: int) -> str:
    """``<20-digit zero-padded offset>.snapshot`` (Kafka's LogFileUtils.producerSnapshotFile)."""
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """Kafka's snapshot bytes for ``entries`` (in the given order)."""
    rows = list(entries)
    buf = bytearray(_HEADER.size + _COUNT.size + _ENTRY.size * len(rows))
    _COUNT.pack_into(buf, _ENTRIES_OFFSET, len(rows))
    pos = _ENTRIES_OFFSET + _COUNT.size
    for e in rows:
        txn = e.current_txn_first_offset
        _ENTRY.pack_into(buf, pos, e.producer_id, e.producer_epoch, e.last_seq, e.last_data_offset,
                         e.last_offset_delta, e.last_timestamp, e.coordinator_epoch, -1 if txn is None else txn)
        pos += _ENTRY.size
    crc = _crc32c.crc32c(memoryview(buf)[_ENTRIES_OFFSET:])
    _HEADER.pack_into(buf, 0, PRODUCER_SNAPSHOT_VERSION, crc)
    return bytes(buf)


def decode_snapshot(data) -> list[ProducerStateEntry]:
    """Parse snapshot bytes; raises CorruptSnapshotError on any defect."""
    view = memoryview(data)
    n = len(view)
    if n < _HEADER.size + _COUNT.size:
        raise CorruptSnapshotError(f"Snapshot failed schema validation: {n} bytes is too short")
    version, crc = _HEADER.unpack_from(view, 0)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"Snapshot contained an unknown file version {version}")
    computed = _crc32c.crc32c(view[_ENTRIES_OFFSET:])
    if crc != computed:
        raise CorruptSnapshotError(f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
                                   f"Computed crc: {computed}")
    (count,) = _COUNT.unpack_from(view, _ENTRIES_OFFSET)
    body = n - _HEADER.size - _COUNT.size
    if count < 0 or count * _ENTRY.size != body:
        raise CorruptSnapshotError(f"Snapshot failed schema validation: {count} entries in {body} bytes")
    out = []
    for (pid, epoch, seq, offset, delta, ts, coord_epoch, txn_first) in _ENTRY.iter_unpack(
            view[_HEADER.size + _COUNT.size:]):
        batches = (BatchMetadata(seq, offset, delta, ts),) if offset >= 0 else ()
        out.append(ProducerStateEntry(pid, epoch, coord_epoch, ts, txn_first if txn_first >= 0 else None, batches))
    return out


def write_snapshot(path: str, entries: Iterable[ProducerStateEntry], *, sync: bool = True) -> None:
    """Write ``entries`` to ``path`` atomically and durably (tmp + fsync + rename + dir
    fsync); ``sync=False`` (the LogManager's shutdown, which syncs the whole file
    system before its clean-shutdown marker) skips both fsyncs."""
    data = encode_snapshot(entries)
    tmp = path + _TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if not sync:
        return
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_snapshot(path: str) -> list[ProducerStateEntry]:
    return decode_snapshot(read_file_bytes(path))


def _snapshot_offset(name: str) -> int | None:
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[:-len(SNAPSHOT_SUFFIX)]
    return int(stem) if stem.isdigit() else None


# -- the partition's producers ---------------------------------------------------------------
class ProducerStateManager:
    """All producers of one partition, plus its snapshot files.

    Offsets: ``map_end_offset`` — the state reflects every batch below it (the
    log moves it with :meth:`update_map_end_offset` after each append);
    a snapshot named ``N`` holds the state at map end offset ``N``.
    ``last_snap_offset`` — map end offset of the newest snapshot taken or loaded.

    Producers are kept until ``producer.id.expiration.ms`` after their last
    batch's timestamp (:meth:`remove_expired_producers`), also when retention
    moves the log start offset past their data (Kafka >= 2.5, KIP-360); a
    producer with an ongoing transaction never expires.

    Not thread-safe: the owning Log calls every method under its lock.
    """

    def __init__(self, log_dir: str, *, topic_partition: str = "",
                 producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
                 names: Iterable[str] | None = None):
        self.log_dir = log_dir
        self.topic_partition = topic_partition
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        self.producer_id_count = 0
        #: first offset -> producer id of every transaction without a marker yet
        self._ongoing: dict[int, int] = {}
        #: first offset -> (producer id, marker offset): decided, marker not yet below the high watermark
        self._unreplicated: dict[int, tuple[int, int]] = {}
        self._map_end_offset = 0
        self._last_snap_offset = 0
        #: ``names``: the directory's listing, when the caller just took one (start-up)
        self._snapshots: dict[int, str] = self._scan_snapshots(names)

    # -- snapshot files ------------------------------------------------------------------
    def _scan_snapshots(self, names: Iterable[str] | None = None) -> dict[int, str]:
        found: dict[int, str] = {}
        if names is None:
            try:
                names = os.listdir(self.log_dir)
            except FileNotFoundError:
                return found
        for name in names:
            if not name.endswith(_SNAPSHOT_TAILS):
                continue
            path = os.path.join(self.log_dir, name)
            if name.endswith(_TMP_SUFFIX):  # a write cut short by a crash
                _unlink(path)
                continue
            off = _snapshot_offset(name)
            if off is not None:        # only this manager writes *.snapshot names here
                found[off] = path
        return found

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files, ascending."""
        return sorted(self._snapshots)

    def latest_snapshot_offset(self) -> int | None:
        return max(self._snapshots) if self._snapshots else None

    def oldest_snapshot_offset(self) -> int | None:
        return min(self._snapshots) if self._snapshots else None

    def snapshot_path(self, offset: int) -> str | None:
        return self._snapshots.get(offset)

    def take_snapshot(self, sync: bool = True) -> str | None:
        """Write the state at ``map_end_offset`` (at segment roll and clean shutdown),
        unless a snapshot at that offset or later was already taken. Returns its path.
        ``sync``: see :func:`write_snapshot`."""
        if self._map_end_offset <= self._last_snap_offset:
            return None
        offset = self._map_end_offset
        path = os.path.join(self.log_dir, snapshot_file_name(offset))
        write_snapshot(path, (self._producers[pid] for pid in sorted(self._producers)), sync=sync)
        log.debug("wrote producer snapshot %s with %d producer ids", path, len(self._producers))
        self._snapshots[offset] = path
        self._last_snap_offset = offset
        return path

    def delete_snapshots_before(self, offset: int) -> None:
        """Delete every snapshot file below ``offset`` (exclusive)."""
        for off in [o for o in self._snapshots if o < offset]:
            self._remove_and_delete_snapshot(off)

    def remove_and_mark_snapshot_for_deletion(self, offset: int) -> str | None:
        """Forget the snapshot at ``offset`` and rename it ``*.snapshot.deleted``
        (async segment deletion removes it with its segment). Returns the new path."""
        path = self._snapshots.pop(offset, None)
        if path is None:
            return None
        try:
            os.replace(path, path + _DELETED_SUFFIX)
        except FileNotFoundError:
            return None
        return path + _DELETED_SUFFIX

    def remove_stray_snapshots(self, segment_base_offsets: Iterable[int], rescan: bool = True,
                               defer: bool = False) -> list[tuple[int, str]]:
        """Delete snapshots without a segment of the same base offset, except the
        newest stray one when it is above every segment (the clean-shutdown snapshot).
        ``rescan=False``: trust the listing taken when this manager was built.
        ``defer=True``: forget them but leave the files; returns their (offset, path)
        for :meth:`delete_forgotten_snapshots` (a start-up hands them to a background
        thread: one unlink per partition per restart is most of a 10,000-partition
        restart on a busy disk). Returns [] otherwise."""
        bases = set(segment_base_offsets)
        if rescan:
            self._snapshots = self._scan_snapshots()
        strays = [o for o in sorted(self._snapshots) if o not in bases]
        keep = strays[-1] if strays and (not bases or strays[-1] > max(bases)) else None
        forgotten = []
        for off in strays:
            if off != keep:
                if defer:
                    forgotten.append((off, self._snapshots.pop(off)))
                else:
                    self._remove_and_delete_snapshot(off)
        return forgotten

    def delete_forgotten_snapshots(self, forgotten: Iterable[tuple[int, str]]) -> int:
        """Unlink the files :meth:`remove_stray_snapshots` (``defer=True``) forgot, except
        one whose offset holds a snapshot again (taken since, same name) or that is no
        longer in this manager's directory. Lock held by the caller. Returns the count."""
        n = 0
        for off, path in forgotten:
            if off in self._snapshots or os.path.dirname(path) != self.log_dir:
                continue
            _unlink(path)
            n += 1
        return n

    def update_parent_dir(self, new_dir: str) -> None:
        """The partition directory was renamed (e.g. for deletion)."""
        self.log_dir = new_dir
        self._snapshots = {o: os.path.join(new_dir, os.path.basename(p)) for o, p in self._snapshots.items()}

    def _remove_and_delete_snapshot(self, offset: int) -> None:
        path = self._snapshots.pop(offset, None)
        if path is not None:
            _unlink(path)

    # -- loading / truncation ------------------------------------------------------------
    def _load_from_snapshot(self, log_start_offset: int, now_ms: int) -> None:
        while self._snapshots:
            offset = max(self._snapshots)
            path = self._snapshots[offset]
            try:
                entries = read_snapshot(path)
            except FileNotFoundError:  # deleted behind our back: forget it
                del self._snapshots[offset]
                continue
            except CorruptSnapshotError as e:
                log.warning("Failed to load producer snapshot from %s: %s", path, e)
                self._remove_and_delete_snapshot(offset)
                continue
            for entry in entries:
                if not self._is_expired(now_ms, entry):
                    self._producers[entry.producer_id] = entry
                    if entry.current_txn_first_offset is not None:
                        self._ongoing[entry.current_txn_first_offset] = entry.producer_id
            self.producer_id_count = len(self._producers)
            self._last_snap_offset = self._map_end_offset = offset
            return
        self._last_snap_offset = self._map_end_offset = log_start_offset

    def load_from_snapshot(self, log_start_offset: int, max_offset: int, now_ms: int) -> int:
        """Start-up: forget all state, delete snapshots outside
        ``(log_start_offset, max_offset]``, load the newest valid remaining one
        (corrupt ones are deleted and the next older is tried; producers expired
        at ``now_ms`` are dropped). Returns ``map_end_offset``: the log must replay
        its batches from there to its end through :meth:`update_from_batch`, then
        call ``update_map_end_offset(log_end_offset)`` and :meth:`take_snapshot`."""
        for off in [o for o in self._snapshots if o > max_offset or o <= log_start_offset]:
            self._remove_and_delete_snapshot(off)
        self._clear()
        self._load_from_snapshot(log_start_offset, now_ms)
        return self._map_end_offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> int:
        """The log was truncated to ``[log_start_offset, log_end_offset)`` (Kafka's
        truncateAndReload): snapshots outside ``(log_start_offset, log_end_offset]`` are
        deleted; if the state no longer ends at ``log_end_offset`` it is reloaded from
        the newest valid snapshot (the log then replays from the returned
        ``map_end_offset``). Returns ``map_end_offset``."""
        for off in [o for o in self._snapshots if o > log_end_offset or o <= log_start_offset]:
            self._remove_and_delete_snapshot(off)
        if log_end_offset != self._map_end_offset:
            self._clear()
            self._load_from_snapshot(log_start_offset, now_ms)
        else:
            self.on_log_start_offset_incremented(log_start_offset)
        return self._map_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """The log was emptied and restarts at ``offset``: no producers, no snapshots."""
        self._clear()
        for off in list(self._snapshots):
            self._remove_and_delete_snapshot(off)
        self._last_snap_offset = 0
        self._map_end_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """The log start offset moved forward; producers are kept (KIP-360)."""
        self._remove_unreplicated(log_start_offset)
        if self._map_end_offset < log_start_offset:
            self._map_end_offset = log_start_offset
        latest = self.latest_snapshot_offset()
        self._last_snap_offset = log_start_offset if latest is None else latest

    def truncate_head(self, log_start_offset: int) -> None:
        """Retention / DeleteRecords moved the log start offset: snapshots below it go
        (their segments are gone), producers stay until they expire."""
        self.delete_snapshots_before(log_start_offset)
        self.on_log_start_offset_incremented(log_start_offset)

    def _clear(self) -> None:
        self._producers.clear()
        self.producer_id_count = 0
        self._ongoing.clear()
        self._unreplicated.clear()

    # -- transactions ---------------------------------------------------------------------
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction that is undecided (ongoing) or
        decided with its marker not yet below the high watermark; None if there is none."""
        first = min(self._ongoing) if self._ongoing else None
        if self._unreplicated:
            u = min(self._unreplicated)
            if first is None or u < first:
                first = u
        return first

    def first_undecided_offset(self) -> int | None:
        """The first offset of the earliest ongoing transaction (no marker yet)."""
        return min(self._ongoing) if self._ongoing else None

    @property
    def ongoing_transactions(self) -> Mapping[int, int]:
        """first offset -> producer id of the ongoing transactions (read-only by convention)."""
        return self._ongoing

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Decided transactions whose marker is below ``high_watermark`` stop being unstable."""
        self._remove_unreplicated(high_watermark)

    def _remove_unreplicated(self, offset: int) -> None:
        if self._unreplicated:
            for first in [f for f, (_, last) in self._unreplicated.items() if last < offset]:
                del self._unreplicated[first]

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO stored with ``completed``'s ``.txnindex`` entry (Kafka's
        lastStableOffset(completedTxn)): the first offset of the earliest ongoing
        transaction of another producer, else the marker's offset + 1. Call before
        :meth:`complete_txn`."""
        pid = completed.producer_id
        for first in sorted(self._ongoing):
            if self._ongoing[first] != pid:
                return first
        return completed.last_offset + 1

    def complete_txn(self, completed: CompletedTxn) -> None:
        """The marker of ``completed`` is in the log: it leaves the ongoing transactions and
        stays unstable until the high watermark passes its marker."""
        if self._ongoing.pop(completed.first_offset, None) is None:
            log.warning("completed transaction %s of %s was not ongoing", completed, self.topic_partition)
        self._unreplicated[completed.first_offset] = (completed.producer_id, completed.last_offset)

    # -- queries --------------------------------------------------------------------------
    @property
    def map_end_offset(self) -> int:
        return self._map_end_offset

    @property
    def last_snap_offset(self) -> int:
        return self._last_snap_offset

    def update_map_end_offset(self, offset: int) -> None:
        self._map_end_offset = offset

    # -- the next batch of an idempotent producer (Log.append's fast path) ----------------
    def next_in_sequence(self, info) -> ProducerStateEntry | None:
        """The entry of ``info``'s producer when ``info`` (a ``BatchInfo`` of one data batch
        of a leader's client append) is simply that producer's next batch: the same epoch,
        its base sequence one past the last retained batch, and either not transactional
        with no transaction open, or transactional inside the transaction already open
        here. :meth:`analyze_and_validate` finds no duplicate and no error in that case and
        changes nothing but the batch list (a duplicate's sequence range is one of the
        retained, all at or below the last; the open transaction keeps its first offset).
        None otherwise: the caller takes the general path."""
        e = self._producers.get(info.producer_id)
        if (e is None or e.producer_epoch != info.producer_epoch
                or (e.current_txn_first_offset is not None) != bool(info.is_transactional)):
            return None
        bm = e.batch_metadata
        if not bm or info.base_sequence != increment_sequence(bm[-1].last_seq, 1):
            return None
        return e

    def append_in_sequence(self, entry: ProducerStateEntry, base_sequence: int, first_offset: int,
                           last_offset: int, timestamp: int, next_offset: int) -> None:
        """Commit a batch :meth:`next_in_sequence` accepted, after the log write: what
        ``analyze_and_validate`` then ``apply_append`` would have done for it."""
        delta = last_offset - first_offset
        entry.batch_metadata.append(BatchMetadata(increment_sequence(base_sequence, delta), last_offset,
                                                  delta, timestamp))
        entry.last_timestamp = timestamp
        self._map_end_offset = next_offset

    @property
    def active_producers(self) -> Mapping[int, ProducerStateEntry]:
        """producer id -> entry (read-only by convention; DescribeProducers seam)."""
        return self._producers

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def is_empty(self) -> bool:
        return not self._producers

    def __iter__(self) -> Iterator[ProducerStateEntry]:
        return iter(self._producers.values())

    # -- expiry ---------------------------------------------------------------------------
    def _is_expired(self, now_ms: int, entry: ProducerStateEntry) -> bool:
        return (entry.current_txn_first_offset is None
                and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms)

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Drop producers idle for ``producer.id.expiration.ms`` (measured from the
        max timestamp of their last batch, as Kafka). Returns the removed ids."""
        gone = [pid for pid, e in self._producers.items() if self._is_expired(now_ms, e)]
        for pid in gone:
            del self._producers[pid]
        self.producer_id_count = len(self._producers)
        return gone

    # -- appends --------------------------------------------------------------------------
    def prepare_update(self, producer_id: int, origin: AppendOrigin) -> ProducerAppendInfo:
        current = self._producers.get(producer_id)
        if current is None:
            current = ProducerStateEntry.empty(producer_id)
        return ProducerAppendInfo(producer_id, current, origin, self.topic_partition)

    def update(self, append_info: ProducerAppendInfo) -> None:
        """Commit a validated append (call only after the log write succeeded)."""
        pid = append_info.producer_id
        if pid == NO_PRODUCER_ID:
            raise ValueError(f"Invalid producer id {pid} passed to update for partition {self.topic_partition}")
        updated = append_info.to_entry()
        current = self._producers.get(pid)
        if current is not None:
            current.update(updated)
        else:
            self._producers[pid] = updated
            self.producer_id_count = len(self._producers)
        for first in append_info.started_transactions:
            self._ongoing[first] = pid

    def find_duplicate_batch(self, batch) -> BatchMetadata | None:
        """The earlier batch this one duplicates (same producer id and epoch, same
        sequence range, among the producer's last 5), else None. ``batch`` has
        producer_id, producer_epoch, base_sequence, last_offset_delta."""
        if batch.producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(batch.producer_id)
        if entry is None:
            return None
        return entry.find_duplicate_batch(batch.producer_epoch, batch.base_sequence,
                                          increment_sequence(batch.base_sequence, batch.last_offset_delta))

    def analyze_and_validate(self, batches: Iterable[tuple[object, int]],
                             origin: AppendOrigin = AppendOrigin.CLIENT, *,
                             log_append_time_ms: int | None = None, marker_of=None) -> PendingAppend:
        """Kafka's ``analyzeAndValidateProducerState`` for one append: ``batches`` are
        ``(batch_header, assigned_base_offset)`` pairs; ``log_append_time_ms`` replaces
        the batches' max timestamp on LogAppendTime topics. Stops at the first duplicate
        (CLIENT origin). ``marker_of(batch) -> (is_abort, coordinator_epoch) | None``
        parses a control batch's marker; the transactions the markers end are
        ``completed_txns``. Raises the ProducerStateError of the first bad batch."""
        updated: dict[int, ProducerAppendInfo] = {}
        completed: list[CompletedTxn] = []
        for batch, base_offset in batches:
            if batch.producer_id == NO_PRODUCER_ID:
                continue
            if origin is AppendOrigin.CLIENT:
                dup = self.find_duplicate_batch(batch)
                if dup is not None:
                    return PendingAppend(updated, dup, [])
            info = updated.get(batch.producer_id)
            if info is None:
                info = updated[batch.producer_id] = self.prepare_update(batch.producer_id, origin)
            if batch.is_control:
                marker = marker_of(batch) if marker_of is not None else None
                if marker is not None:   # an empty control batch changes nothing (Kafka)
                    is_abort, coordinator_epoch = marker
                    txn = info.append_end_txn_marker(batch.producer_epoch, coordinator_epoch, is_abort,
                                                     base_offset, batch.max_timestamp)
                    if txn is not None:
                        completed.append(txn)
            else:
                info.append_batch(batch, base_offset, log_append_time_ms)
        return PendingAppend(updated, None, completed)

    def apply_append(self, updated_producers: Mapping[int, ProducerAppendInfo], next_offset: int) -> None:
        """After a successful write: commit every producer's new state and move the
        map end offset to ``next_offset`` (the log end offset after the append)."""
        for info in updated_producers.values():
            self.update(info)
        self._map_end_offset = next_offset

    def update_from_batch(self, batch, base_offset: int, *, end_txn_marker: tuple[bool, int] | None = None,
                          origin: AppendOrigin = AppendOrigin.REPLICATION) -> CompletedTxn | None:
        """Replay one batch already in the log (recovery, follower append): no sequence
        checks. ``end_txn_marker=(is_abort, coordinator_epoch)`` for a control batch
        (parsed by the caller); a control batch without one is skipped (an empty
        control batch, as Kafka). Moves ``map_end_offset`` past the batch."""
        last_offset = base_offset + batch.last_offset_delta
        completed = None
        if batch.producer_id != NO_PRODUCER_ID:
            info = self.prepare_update(batch.producer_id, origin)
            if batch.is_control:
                if end_txn_marker is not None:
                    is_abort, coordinator_epoch = end_txn_marker
                    completed = info.append_end_txn_marker(batch.producer_epoch, coordinator_epoch, is_abort,
                                                           base_offset, batch.max_timestamp)
                    self.update(info)
            else:
                info.append_batch(batch, base_offset)
                self.update(info)
        self._map_end_offset = last_offset + 1
        return completed

    def __repr__(self) -> str:
        return (f"ProducerStateManager({self.topic_partition!r}, producers={len(self._producers)}, "
                f"map_end_offset={self._map_end_offset}, snapshots={self.snapshot_offsets()})")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
