"""Committed offsets of one group (Kafka: ``OffsetAndMetadata``, the offset half of
``GroupMetadata.scala`` and of 3.9's ``OffsetMetadataManager``).

A group's committed offsets live in memory, keyed by ``TopicPartition`` =
``(topic, partition)``, each with the ``__consumer_offsets`` offset of the
record that wrote it (``record_offset``; -1 while not yet written). The log is
the source of truth: an offset enters the map only after its record is
appended (acks=all), and a later record always wins over an earlier one, so
replaying the partition rebuilds exactly this map.

Thread-safety: not thread-safe; the owning group's lock guards it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = ["OffsetAndMetadata", "CommittedOffset", "OffsetStore", "INVALID_OFFSET", "NO_METADATA"]

TopicPartition = tuple  # (topic: str, partition: int)

INVALID_OFFSET = -1
NO_METADATA = ""


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """One commit: the offset, its leader epoch (-1: none), the client's metadata
    string, when it was committed and, for OffsetCommit v1-v4 commits that
    carried a retention, when it expires (-1: follow offsets.retention.minutes)."""

    committed_offset: int
    leader_epoch: int = -1
    metadata: str = NO_METADATA
    commit_timestamp_ms: int = 0
    expire_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: OffsetAndMetadata
    record_offset: int


class OffsetStore:
    """The committed offsets of one group, plus commits still being appended.

    ``pending`` counts in-flight commits per partition (for OffsetFetch
    ``require_stable`` → UNSTABLE_OFFSET_COMMIT, and to keep retention from
    expiring what is being rewritten). ``pending_txn``: TxnOffsetCommit offsets
    written but not yet visible, by producer id, until the transaction's COMMIT
    marker (:meth:`complete_txn`) or ABORT marker (Kafka's
    ``pendingTransactionalOffsetCommits``); they count as pending too.
    """

    __slots__ = ("committed", "pending", "pending_txn")

    def __init__(self) -> None:
        self.committed: dict[TopicPartition, CommittedOffset] = {}
        self.pending: dict[TopicPartition, int] = {}
        self.pending_txn: dict[int, dict[TopicPartition, CommittedOffset]] = {}

    def __len__(self) -> int:
        return len(self.committed)

    def has_offsets(self) -> bool:
        return bool(self.committed) or bool(self.pending) or bool(self.pending_txn)

    def get(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        c = self.committed.get(tp)
        return c.offset if c is not None else None

    def has_pending(self, tp: TopicPartition) -> bool:
        return self.pending.get(tp, 0) > 0 or any(tp in d for d in self.pending_txn.values())

    def put_txn(self, producer_id: int, tp: TopicPartition, offset: OffsetAndMetadata, record_offset: int) -> None:
        """A transactional commit was written at ``record_offset``: pending until its marker."""
        self.pending_txn.setdefault(producer_id, {})[tp] = CommittedOffset(offset, record_offset)

    def complete_txn(self, producer_id: int, commit: bool) -> int:
        """The producer's transaction ended: its offsets become committed (the higher record
        offset still wins) or are dropped. Returns how many it had."""
        pending = self.pending_txn.pop(producer_id, {})
        if commit:
            for tp, c in pending.items():
                self.put(tp, c.offset, c.record_offset)
        return len(pending)

    def prepare(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self.pending[tp] = self.pending.get(tp, 0) + 1

    def _unpend(self, tp: TopicPartition) -> None:
        n = self.pending.get(tp, 0) - 1
        if n > 0:
            self.pending[tp] = n
        else:
            self.pending.pop(tp, None)

    def complete(self, tp: TopicPartition, offset: OffsetAndMetadata, record_offset: int) -> None:
        """A prepared commit was appended at ``record_offset``: apply it unless a later record won."""
        self._unpend(tp)
        self.put(tp, offset, record_offset)

    def fail(self, tp: TopicPartition) -> None:
        self._unpend(tp)

    def put(self, tp: TopicPartition, offset: OffsetAndMetadata, record_offset: int) -> None:
        """Apply a written commit (also used by replay): the higher record offset wins."""
        cur = self.committed.get(tp)
        if cur is None or cur.record_offset < 0 or record_offset < 0 or record_offset >= cur.record_offset:
            self.committed[tp] = CommittedOffset(offset, record_offset)

    def remove(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Drop these partitions' offsets; the ones that existed (need a tombstone)."""
        removed = []
        for tp in tps:
            if self.committed.pop(tp, None) is not None:
                removed.append(tp)
        return removed

    def remove_all(self) -> list[TopicPartition]:
        removed = list(self.committed)
        self.committed.clear()
        return removed

    def expired(self, now_ms: int, retention_ms: int, base_timestamp: Callable[[OffsetAndMetadata], int],
                is_subscribed: Callable[[str], bool]) -> list[TopicPartition]:
        """Offsets due for expiry (KIP-211): not of a subscribed topic, no commit in
        flight, and past their explicit expire timestamp or ``retention_ms`` after
        ``base_timestamp(offset)`` (the commit time, or when the group became Empty)."""
        out = []
        for tp, c in self.committed.items():
            if is_subscribed(tp[0]) or self.has_pending(tp):
                continue
            o = c.offset
            if o.expire_timestamp_ms >= 0:
                if now_ms >= o.expire_timestamp_ms:
                    out.append(tp)
            elif now_ms - base_timestamp(o) >= retention_ms:
                out.append(tp)
        return out
