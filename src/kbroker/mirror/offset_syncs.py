"""Offset syncs: the source side writes them, the checkpoint side translates with them.

OffsetSyncWriter (MM2's OffsetSyncWriter.PartitionState): after upstream offset u of a
source partition is acknowledged at downstream offset d, an OffsetSync(u, d) is *pending*
(sent at once) when this is the partition's first sync in this lifetime, when the last
sync is ``offset.lag.max`` or more downstream records stale (counting the one past it a
translation may use), when an upstream offset was skipped (compaction, a transaction
marker, a seek), or when the downstream offset went backwards; otherwise it is *delayed*
and sent at the next offset commit. MM2 keeps at most 10 syncs in flight and lets a newer
pending sync replace an unsent one; acknowledgements here are retired in bursts (one
drain per poll), which would drop most syncs of a burst, so every pending sync is sent
(at most one per ``offset.lag.max`` records, plus one per partition per commit).

OffsetSyncStore (MM2's OffsetSyncStore.translateDownstream): for a group at upstream
offset g, take the newest known sync s with s.upstream <= g; the translation is
s.downstream when g == s.upstream and s.downstream + 1 otherwise (records after the sync
may or may not have been replicated, so going further could skip one); if every known
sync is newer than g, it is -1 (not translatable). It declines (None) until the syncs
topic has been read to its end once. Per partition it keeps at most 64 syncs (MM2 keeps
64 too, in slots of power-of-two distance): all of them while there are fewer, so a group
re-reads at most ``offset.lag.max`` records; beyond that the sync whose loss costs the
least precision relative to its age goes, so recent positions stay exact, old ones
thin out, and the oldest stays. Any subset of the real syncs keeps the rule safe: a
translation never passes the group's position.
"""
from __future__ import annotations

import logging

from kbroker.client.metadata import TopicPartition
from kbroker.mirror.formats import FormatError, OffsetSync

log = logging.getLogger(__name__)
SYNCS_PER_PARTITION = 64


class _PartitionState:
    """MM2's OffsetSyncWriter.PartitionState (its shouldSyncOffsets flag is reset as soon
    as the sync is queued, so it is implicit here)."""

    __slots__ = ("previous_upstream", "previous_downstream", "last_sync_downstream")

    def __init__(self):
        self.previous_upstream = self.previous_downstream = self.last_sync_downstream = -1


class OffsetSyncWriter:
    """Queues and sends OffsetSyncs to partition 0 of ``topic`` with ``producer``.
    ``maybe_queue`` / ``fire_pending`` / ``promote_delayed`` are called from the source
    task's thread; the send callback (producer thread) only releases the semaphore."""

    def __init__(self, producer, topic: str, max_offset_lag: int):
        self.producer, self.topic, self.max_offset_lag = producer, topic, max_offset_lag
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._pending: dict[TopicPartition, OffsetSync] = {}
        self._delayed: dict[TopicPartition, OffsetSync] = {}
        self.sent = 0

    def maybe_queue(self, tp: TopicPartition, upstream: int, downstream: int) -> None:
        """Upstream offset ``upstream`` of ``tp`` is acknowledged at ``downstream`` (called
        once per record, in offset order per partition: kept cheap)."""
        st = self._states.get(tp)
        if st is None:
            st = self._states[tp] = _PartitionState()
        if (st.last_sync_downstream == -1
                or downstream - (st.last_sync_downstream + 1) >= self.max_offset_lag
                or upstream - st.previous_upstream != 1
                or downstream < st.previous_downstream):
            st.last_sync_downstream = downstream
            st.previous_upstream, st.previous_downstream = upstream, downstream
            self._delayed.pop(tp, None)
            self._pending[tp] = OffsetSync(tp, upstream, downstream)
            self.fire_pending()     # as MM2's commitRecord: at once, so a burst keeps its syncs
        else:
            st.previous_upstream, st.previous_downstream = upstream, downstream
            self._delayed[tp] = (upstream, downstream)

    def promote_delayed(self) -> None:
        for tp, (up, down) in self._delayed.items():
            self._pending[tp] = OffsetSync(tp, up, down)
        self._delayed.clear()

    def forget(self, tps) -> None:
        """Partitions revoked from this instance: a new owner starts a new lifetime."""
        for tp in tps:
            self._states.pop(tp, None)
            self._delayed.pop(tp, None)

    def fire_pending(self) -> None:
        while self._pending:
            tp = next(iter(self._pending))
            sync = self._pending.pop(tp)
            self.producer.send(self.topic, sync.record_value(), sync.record_key(), partition=0)
            self.sent += 1


class OffsetSyncStore:
    """Syncs read from the offset-syncs topic; fed by ``handle`` (one thread)."""

    def __init__(self):
        self._syncs: dict[TopicPartition, list[OffsetSync]] = {}   # newest first
        self.read_to_end = False

    def handle_record(self, key, value) -> None:
        try:
            self.handle(OffsetSync.deserialize(key, value))
        except FormatError as e:
            log.warning("skipping an offset-sync record that is not an OffsetSync: %s", e)

    def handle(self, sync: OffsetSync) -> None:
        syncs = self._syncs.get(sync.topic_partition)
        if not syncs or sync.upstream_offset < syncs[0].upstream_offset:
            # first sync, or the upstream rewound (topic recreated): older syncs are invalid
            self._syncs[sync.topic_partition] = [sync]
            return
        if sync.upstream_offset == syncs[0].upstream_offset:
            syncs[0] = sync
            return
        syncs.insert(0, sync)
        if len(syncs) > SYNCS_PER_PARTITION:
            # drop the inner sync whose loss costs the least precision relative to its age:
            # recent positions stay exact, old ones thin out; the oldest is always kept
            newest = sync.upstream_offset
            i = min(range(1, len(syncs) - 1),
                    key=lambda j: (syncs[j - 1].upstream_offset - syncs[j + 1].upstream_offset)
                    / (newest - syncs[j].upstream_offset))
            del syncs[i]

    def translate_downstream(self, tp: TopicPartition, upstream_offset: int) -> int | None:
        if not self.read_to_end:
            return None
        syncs = self._syncs.get(tp)
        if not syncs:
            return None
        for s in syncs:
            if s.upstream_offset <= upstream_offset:
                return s.downstream_offset + (0 if s.upstream_offset == upstream_offset else 1)
        return -1
