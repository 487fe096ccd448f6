"""The log a Raft replica keeps (Kafka's ``raft/ReplicatedLog.java``), and an in-memory one.

Offsets are record offsets; a *batch* is one Kafka record batch v2 whose
``partition_leader_epoch`` is the epoch of the leader that appended it. The log's *end
offset* (LEO) is the next offset to be written; its *durable end offset* is how far it has
been flushed (fsynced): a crash keeps exactly ``[start, durable end)``. The high watermark
is owned by the client and only mirrored here for readers.

The interface is kept small so an implementation over ``kbroker.log.Log`` fits later:
``append_as_leader``, ``append_as_follower``, ``truncate_to``, ``read``, ``flush`` and the
epoch cache behind ``end_offset_for_epoch``. Everything else is derived here.
"""
from __future__ import annotations

import bisect
import struct
from typing import NamedTuple, Optional, Sequence

from kbroker.kernels import load as _load_kernel

_records = _load_kernel("records")

#: ControlRecordType (Kafka ``common/record/ControlRecordType.java``)
LEADER_CHANGE = 2
SNAPSHOT_HEADER = 3
SNAPSHOT_FOOTER = 4
KRAFT_VERSION = 5
KRAFT_VOTERS = 6
DATA = -1

_KEY = struct.Struct(">hh")   # control record key: version 0, type


class OffsetAndEpoch(NamedTuple):
    offset: int
    epoch: int


class Batch(NamedTuple):
    """One record batch: ``records`` are the record values (opaque bytes to Raft);
    ``control_type`` is a ControlRecordType or DATA; ``data`` is the encoded batch v2."""
    base_offset: int
    epoch: int
    records: tuple
    control_type: int
    data: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    @property
    def is_control(self) -> bool:
        return self.control_type != DATA


def build_batch(base_offset: int, epoch: int, records: Sequence[bytes], control_type: int = DATA,
                timestamp_ms: int = 0) -> Batch:
    """Encode a batch v2 (control batches carry one record keyed by its control type)."""
    records = tuple(bytes(r) for r in records)
    if not records:
        raise ValueError("a batch holds at least one record")
    key = None if control_type == DATA else _KEY.pack(0, control_type)
    data = _records.encode_batch([(timestamp_ms, key, v, ()) for v in records], base_offset=base_offset,
                                 partition_leader_epoch=epoch, is_control=control_type != DATA)
    return Batch(base_offset, epoch, records, control_type, data)


def encode_batches(batches: Sequence[Batch]) -> bytes:
    return b"".join(b.data for b in batches)


def decode_batches(buf) -> list[Batch]:
    """Whole batches from record-set bytes (as a Fetch response carries them); CRCs checked."""
    out = []
    if not buf:
        return out
    buf = bytes(buf)
    # a record set may end inside a batch (a log read cut at max bytes): drop that tail
    whole = 0
    while whole + 12 <= len(buf):
        size = 12 + int.from_bytes(buf[whole + 8:whole + 12], "big")
        if whole + size > len(buf):
            break
        whole += size
    buf = buf[:whole]
    pos = 0
    for rb in _records.decode_batches(buf, check_crc=True):
        size = rb.size_in_bytes
        recs = rb.records
        ctype = DATA
        if rb.is_control:
            ctype = _KEY.unpack(bytes(recs[0].key)[:4])[1] if recs and recs[0].key else -2
        out.append(Batch(rb.base_offset, rb.partition_leader_epoch,
                         tuple(bytes(r.value) if r.value is not None else b"" for r in recs),
                         ctype, buf[pos:pos + size]))
        pos += size
    return out


class ValidOffsetAndEpoch(NamedTuple):
    """Kafka's ValidOffsetAndEpoch: kind is "valid", "diverging" or "snapshot"."""
    kind: str
    offset_and_epoch: OffsetAndEpoch


class ReplicatedLog:
    """What the Raft client needs from its log; subclasses implement the storage."""

    # -- to implement ------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        raise NotImplementedError

    @property
    def end_offset(self) -> int:
        raise NotImplementedError

    @property
    def durable_end_offset(self) -> int:
        """Offsets below this survive a crash (flushed)."""
        raise NotImplementedError

    def append_as_leader(self, records: Sequence[bytes], epoch: int, control_type: int = DATA,
                         timestamp_ms: int = 0) -> Batch:
        raise NotImplementedError

    def append_as_follower(self, batches: Sequence[Batch]) -> None:
        """Append batches fetched from the leader; the first must start at ``end_offset``."""
        raise NotImplementedError

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after ``offset``."""
        raise NotImplementedError

    def read(self, start_offset: int, max_bytes: int) -> list[Batch]:
        """Whole batches from ``start_offset`` (a batch boundary); at least one if any."""
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def epoch_entries(self) -> list[OffsetAndEpoch]:
        """The epoch cache: (start offset, epoch) for each epoch present, ascending."""
        raise NotImplementedError

    # snapshots (KIP-630): id = (end offset, epoch of the last record it covers)
    def latest_snapshot_id(self) -> Optional[OffsetAndEpoch]:
        return None

    def read_snapshot(self, snapshot_id: OffsetAndEpoch) -> Optional[bytes]:
        return None

    def create_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Store a snapshot (durably) and delete the log before it (log start offset moves)."""
        raise NotImplementedError("this log does not keep snapshots yet")

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """A follower's log becomes just this snapshot (fetched from the leader)."""
        raise NotImplementedError("this log does not keep snapshots yet")

    # -- derived ---------------------------------------------------------------------------
    high_watermark: int = 0

    def update_high_watermark(self, offset: int) -> None:
        self.high_watermark = offset

    @property
    def last_fetched_epoch(self) -> int:
        """Epoch of the last batch in the log; the snapshot's when only it is left; 0 when empty."""
        e = self.epoch_entries()
        if e:
            return e[-1].epoch
        snap = self.latest_snapshot_id()
        return snap.epoch if snap is not None else 0

    def end_offset_and_epoch(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self.end_offset, self.last_fetched_epoch)

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """(end offset, epoch) of the largest epoch <= ``epoch`` held: the start offset of the
        next epoch, or the log end offset for the last one; (start offset, 0) if none."""
        entries = self.epoch_entries()
        i = bisect.bisect_right([e.epoch for e in entries], epoch) - 1
        if i < 0:
            snap = self.latest_snapshot_id()
            if snap is not None and snap.epoch <= epoch:
                return OffsetAndEpoch(self.start_offset, snap.epoch)
            return OffsetAndEpoch(self.start_offset, 0)
        end = entries[i + 1].offset if i + 1 < len(entries) else self.end_offset
        return OffsetAndEpoch(end, entries[i].epoch)

    def validate_offset_and_epoch(self, offset: int, epoch: int) -> ValidOffsetAndEpoch:
        """The leader's check of a follower's (fetch offset, last fetched epoch)."""
        if offset == 0 and self.start_offset == 0:
            return ValidOffsetAndEpoch("valid", OffsetAndEpoch(0, 0))
        snap = self.latest_snapshot_id()
        if snap is not None and self.start_offset > 0 and (
                offset < self.start_offset or (offset == self.start_offset and epoch != snap.epoch)
                or epoch < snap.epoch):
            # what the fetcher needs is only in the snapshot: it must fetch that first
            return ValidOffsetAndEpoch("snapshot", snap)
        end = self.end_offset_for_epoch(epoch)
        if end.epoch != epoch or end.offset < offset:
            return ValidOffsetAndEpoch("diverging", end)
        return ValidOffsetAndEpoch("valid", OffsetAndEpoch(offset, epoch))

    def truncate_to_end_offset(self, diverging: OffsetAndEpoch) -> int:
        """Truncate after the leader said our log diverges at ``diverging``; returns the new end."""
        if diverging.epoch == 0:
            offset = min(diverging.offset, self.end_offset)
        else:
            local = self.end_offset_for_epoch(diverging.epoch)
            offset = min(local.offset, diverging.offset) if local.epoch == diverging.epoch else local.offset
        self.truncate_to(offset)
        return offset


class MemoryLog(ReplicatedLog):
    """An in-memory ReplicatedLog for the simulation. ``crash()`` drops the unflushed tail,
    as a power loss would; ``fsync_lies`` (test hook) makes flush() a no-op."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self._bases: list[int] = []
        self._start = 0
        self._end = 0
        self._durable = 0
        self._epochs: list[OffsetAndEpoch] = []
        self.snapshot: Optional[tuple[OffsetAndEpoch, bytes]] = None    # written durably at once
        self.high_watermark = 0

    @property
    def start_offset(self) -> int:
        return self._start

    def latest_snapshot_id(self):
        return self.snapshot[0] if self.snapshot else None

    def read_snapshot(self, snapshot_id):
        return self.snapshot[1] if self.snapshot and self.snapshot[0] == snapshot_id else None

    def create_snapshot(self, snapshot_id, data):
        off = snapshot_id.offset
        if off > self._durable or off < self._start:
            raise ValueError("snapshot at %d outside the durable log [%d, %d)" % (off, self._start, self._durable))
        i = bisect.bisect_left(self._bases, off)
        if i < len(self._bases) and self._bases[i] != off or (i == len(self._bases) and off != self._end):
            raise ValueError("snapshot at %d is not at a batch boundary" % off)
        self.snapshot = (snapshot_id, bytes(data))
        del self.batches[:i]
        del self._bases[:i]
        self._start = off
        # the epoch cache keeps the epochs of what is left, the first one starting at the start
        keep = [e for e in self._epochs if e.offset >= off]
        before = [e for e in self._epochs if e.offset < off]
        if before and (not keep or keep[0].offset > off) and off < self._end:
            keep.insert(0, OffsetAndEpoch(off, before[-1].epoch))
        self._epochs = keep

    def install_snapshot(self, snapshot_id, data):
        self.snapshot = (snapshot_id, bytes(data))
        self.batches, self._bases, self._epochs = [], [], []
        self._start = self._end = self._durable = snapshot_id.offset

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def durable_end_offset(self) -> int:
        return self._durable

    def _append(self, b: Batch) -> None:
        if b.base_offset != self._end:
            raise ValueError("append at %d but the log ends at %d" % (b.base_offset, self._end))
        if self._epochs and b.epoch < self._epochs[-1].epoch:
            raise ValueError("epoch %d after epoch %d" % (b.epoch, self._epochs[-1].epoch))
        if not self._epochs or b.epoch != self._epochs[-1].epoch:
            self._epochs.append(OffsetAndEpoch(b.base_offset, b.epoch))
        self.batches.append(b)
        self._bases.append(b.base_offset)
        self._end = b.next_offset

    def append_as_leader(self, records, epoch, control_type=DATA, timestamp_ms=0):
        b = build_batch(self._end, epoch, records, control_type, timestamp_ms)
        self._append(b)
        return b

    def append_as_follower(self, batches):
        for b in batches:
            if b.next_offset <= self._end:
                continue   # a duplicate of what we hold (same leader epoch chain)
            self._append(b)

    def truncate_to(self, offset):
        if offset >= self._end:
            return
        # always at a batch boundary in Raft: a diverging epoch ends where a batch does
        while self.batches and self.batches[-1].base_offset >= offset:
            self.batches.pop()
            self._bases.pop()
        if self.batches and self.batches[-1].next_offset > offset:
            raise ValueError("truncation to %d inside a batch" % offset)
        self._end = offset
        self._durable = min(self._durable, offset)
        while self._epochs and self._epochs[-1].offset >= offset:
            self._epochs.pop()

    def read(self, start_offset, max_bytes):
        i = bisect.bisect_right(self._bases, start_offset) - 1
        if i < 0 or start_offset >= self._end:
            return []
        out, size = [], 0
        while i < len(self.batches):
            b = self.batches[i]
            if out and size + len(b.data) > max_bytes:
                break
            out.append(b)
            size += len(b.data)
            i += 1
        return out

    fsync_lies = False

    def flush(self):
        if not self.fsync_lies:
            self._durable = self._end

    def epoch_entries(self):
        return self._epochs

    def crash(self) -> "MemoryLog":
        """The log as a restart finds it: the durable prefix only."""
        fresh = MemoryLog()
        fresh.snapshot = self.snapshot
        fresh._start = fresh._end = self._start
        for b in self.batches:
            if b.next_offset > self._durable:
                break
            fresh._append(b)
        fresh._durable = fresh._end
        return fresh
