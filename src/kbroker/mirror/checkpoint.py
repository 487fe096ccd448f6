"""MirrorCheckpointTask: translate the source cluster's consumer-group offsets into
checkpoints on the target (``<source>.checkpoints.internal``, partition 0) and, with
``sync.group.offsets.enabled``, commit them for groups with no active member there.

Every ``emit.checkpoints.interval.seconds``: read the offset-syncs topic to its current
end, then for each source group the group filter accepts (``groups`` / ``groups.exclude``,
and never the mirror's own ``mm2-*->*`` groups) and each committed partition of a topic
the topic filter accepts, translate the offset (OffsetSyncStore) and emit
Checkpoint(group, remote partition, upstream, downstream, metadata) when it is new:
the first for the partition, an upstream rewind, or a downstream advance (checkpoints
never move a group backwards otherwise). The latest checkpoints are read back from the
checkpoints topic at start, so a restart keeps that rule.

Runs on the flow's control thread, which owns every client here.
"""
from __future__ import annotations

import logging
import re
import time

from kbroker.client import Consumer, Producer, TopicPartition
from kbroker.client import errors as E
from kbroker.client.consumer import OffsetAndMetadata
from kbroker.mirror.formats import Checkpoint, FormatError
from kbroker.mirror.offset_syncs import OffsetSyncStore

log = logging.getLogger(__name__)
_MIRROR_GROUP = re.compile(r"mm2-.+->.+")


def read_to_end(consumer: Consumer, tp: TopicPartition, handle, timeout_s: float) -> bool:
    """Feed ``handle(record)`` everything of ``tp`` up to its end offset now; True if reached."""
    deadline = time.monotonic() + timeout_s
    end = consumer.end_offsets([tp], timeout=timeout_s)[tp]
    while consumer.position(tp, timeout=max(0.1, deadline - time.monotonic())) < end:
        if time.monotonic() >= deadline:
            return False
        for r in consumer.poll(0.2):
            handle(r)
    return True


class CheckpointTask:
    def __init__(self, fc, source_admin, target_admin):
        self.fc = fc
        self.source_admin, self.target_admin = source_admin, target_admin
        syncs_clients = fc.source_clients if fc.offset_syncs_on_source else fc.target_clients
        self._sync_consumer = Consumer({**syncs_clients["consumer"], "group.id": None,
                                        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self._syncs_tp = TopicPartition(fc.offset_syncs_topic, 0)
        self._sync_consumer.assign([self._syncs_tp])
        self.store = OffsetSyncStore()
        self.producer = Producer(fc.target_clients["producer"])
        self._timeout = fc["admin.timeout.ms"] / 1000.0
        #: group -> {remote tp: Checkpoint}, the latest emitted (or read back)
        self.checkpoints: dict[str, dict[TopicPartition, Checkpoint]] = {}
        self._loaded = False
        self.emitted = 0
        self.synced_groups = 0

    def _load_checkpoints(self) -> None:
        tp = TopicPartition(self.fc.checkpoints_topic, 0)
        c = Consumer({**self.fc.target_clients["consumer"], "group.id": None, "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        try:
            c.assign([tp])

            def handle(r):
                try:
                    cp = Checkpoint.deserialize(r.key, r.value)
                except FormatError:
                    return
                self.checkpoints.setdefault(cp.group_id, {})[cp.topic_partition] = cp
            read_to_end(c, tp, handle, self._timeout)
        finally:
            c.close()
        self._loaded = True

    def _read_syncs(self) -> None:
        if read_to_end(self._sync_consumer, self._syncs_tp,
                       lambda r: self.store.handle_record(r.key, r.value), self._timeout):
            self.store.read_to_end = True

    def _rename(self, tp: TopicPartition) -> TopicPartition:
        """MirrorCheckpointTask.renameTopicPartition: ``orders`` -> ``A.orders``, and a topic
        that came from the target back to its original name (``B.orders`` -> ``orders``)."""
        policy = self.fc.policy
        if policy.topic_source(tp.topic) == self.fc.target:
            return TopicPartition(policy.original_topic(tp.topic), tp.partition)
        return TopicPartition(self.fc.remote_topic(tp.topic), tp.partition)

    def groups(self) -> list[str]:
        return sorted(g.group_id for g in self.source_admin.list_consumer_groups(timeout=self._timeout)
                      if self.fc.group_filter.should_replicate_group(g.group_id)
                      and not _MIRROR_GROUP.fullmatch(g.group_id))

    def _more_recent(self, cp: Checkpoint) -> bool:
        last = self.checkpoints.get(cp.group_id, {}).get(cp.topic_partition)
        return (last is None or cp.upstream_offset < last.upstream_offset
                or cp.downstream_offset > last.downstream_offset)

    def checkpoints_for_group(self, group: str, offsets: dict) -> list[Checkpoint]:
        out = []
        for tp, om in sorted(offsets.items()):
            if om is None or not self.fc.topic_filter.should_replicate_topic(tp.topic):
                continue
            down = self.store.translate_downstream(tp, om.offset)
            if down is None or down < 0:
                continue
            cp = Checkpoint(group, self._rename(tp), om.offset, down, om.metadata or "")
            if self._more_recent(cp):
                out.append(cp)
        return out

    def emit(self) -> int:
        """One round of checkpoints; returns how many were written."""
        if not self._loaded:
            self._load_checkpoints()
        self._read_syncs()
        now = time.time_ns() // 1_000_000
        new = []
        for group in self.groups():
            try:
                offsets = self.source_admin.list_consumer_group_offsets(group, timeout=self._timeout)
            except E.KafkaError as e:
                log.warning("%s: cannot list the offsets of group %s: %s", self.fc.flow, group, e)
                continue
            new.extend(self.checkpoints_for_group(group, offsets))
        futs = [self.producer.send(self.fc.checkpoints_topic, cp.record_value(), cp.record_key(),
                                   partition=0, timestamp_ms=now) for cp in new]
        for cp, fut in zip(new, futs):
            fut.get(self._timeout)
            self.checkpoints.setdefault(cp.group_id, {})[cp.topic_partition] = cp
        self.emitted += len(new)
        log.debug("%s: %d checkpoints for %d groups", self.fc.flow, len(new), len({c.group_id for c in new}))
        return len(new)

    def sync_group_offsets(self) -> int:
        """Commit checkpointed offsets on the target for groups with no active member
        there (Empty or unknown), never moving a group's committed offset backwards."""
        synced = 0
        groups = sorted(self.checkpoints)
        if not groups:
            return 0
        try:
            described = self.target_admin.describe_consumer_groups(groups, timeout=self._timeout,
                                                                   raise_on_error=False)
        except E.KafkaError as e:
            log.warning("%s: cannot describe groups on %s: %s", self.fc.flow, self.fc.target, e)
            return 0
        for group in groups:
            d = described.get(group)
            if isinstance(d, Exception) or d is None or d.state not in ("Empty", "Dead"):
                continue
            try:
                current = self.target_admin.list_consumer_group_offsets(group, timeout=self._timeout)
            except E.KafkaError:
                continue
            todo = {tp: OffsetAndMetadata(cp.downstream_offset, cp.metadata)
                    for tp, cp in self.checkpoints[group].items()
                    if tp not in current or current[tp].offset < cp.downstream_offset}
            if not todo:
                continue
            try:
                self.target_admin.alter_consumer_group_offsets(group, todo, timeout=self._timeout)
                synced += 1
            except E.UnknownMemberIdError:
                log.info("%s: group %s became active on %s; not syncing its offsets", self.fc.flow, group,
                         self.fc.target)
            except E.KafkaError as e:
                log.warning("%s: cannot sync the offsets of group %s: %s", self.fc.flow, group, e)
        self.synced_groups += synced
        return synced

    def close(self) -> None:
        for c in (self.producer, self._sync_consumer):
            try:
                c.close(5.0)
            except Exception:
                pass
