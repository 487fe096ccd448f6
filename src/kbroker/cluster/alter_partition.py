"""AlterPartitionManager: a broker's ISR proposals, batched to the active controller.

Kafka: ``DefaultAlterPartitionManager``. At most one unsent proposal per partition (a
second one is refused with OPERATION_NOT_ATTEMPTED, as the leader only proposes from a
committed state), at most one AlterPartition request in flight carrying every unsent
proposal. A proposal leaves the queue when its partition's answer arrives; a partition
missing from an answer stays queued and is sent again; a top-level error or a failed
request sends everything again after ``retry_backoff_ms`` (AlterPartition is never
timed out: a newer partition state from the metadata log makes the answer moot).

Pure: ``poll(now_ms)`` returns the request to send, ``on_response(now_ms, response)``
(None for a failed request) returns the completions ``(on_done, result, error)`` to run.
The caller owns the thread and the lock.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Callable

from kbroker.cluster.partition_leader import LeaderAndIsr
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.alter_partition import (
    AlterPartitionRequest, AlterPartitionRequestPartitionData, AlterPartitionRequestTopicData, BrokerState,
)

log = logging.getLogger(__name__)

OnDone = Callable[[LeaderAndIsr | None, int], None]


@dataclass(frozen=True, slots=True)
class AlterPartitionItem:
    topic: str
    topic_id: uuid.UUID
    partition: int
    leader_and_isr: LeaderAndIsr
    on_done: OnDone


class AlterPartitionManager:
    def __init__(self, broker_id: int, broker_epoch: Callable[[], int], retry_backoff_ms: int = 50):
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.retry_backoff_ms = retry_backoff_ms
        self.unsent: dict[tuple[str, int], AlterPartitionItem] = {}
        self.in_flight: list[AlterPartitionItem] | None = None
        self._not_before_ms = 0

    def submit(self, topic: str, topic_id: uuid.UUID, partition: int, leader_and_isr: LeaderAndIsr,
               on_done: OnDone) -> bool:
        """Queue a proposal; False (and on_done(None, OPERATION_NOT_ATTEMPTED) is the
        caller's to run) when the partition already has one queued."""
        key = (topic, partition)
        if key in self.unsent:
            return False
        self.unsent[key] = AlterPartitionItem(topic, topic_id, partition, leader_and_isr, on_done)
        return True

    def poll(self, now_ms: int) -> AlterPartitionRequest | None:
        """The request to send now (AlterPartition v3: the ISR with broker epochs, KIP-903;
        ``new_isr`` is left empty, v3 has no such field), or None."""
        if self.in_flight is not None or not self.unsent or now_ms < self._not_before_ms:
            return None
        items = list(self.unsent.values())
        self.in_flight = items
        by_topic: dict[uuid.UUID, list[AlterPartitionItem]] = {}
        for it in items:
            by_topic.setdefault(it.topic_id, []).append(it)
        return AlterPartitionRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch(),
            topics=[AlterPartitionRequestTopicData(topic_name=its[0].topic, topic_id=tid, partitions=[
                AlterPartitionRequestPartitionData(
                    partition_index=it.partition, leader_epoch=it.leader_and_isr.leader_epoch,
                    new_isr_with_epochs=[BrokerState(broker_id=b, broker_epoch=e)
                                         for b, e in it.leader_and_isr.isr_with_epochs],
                    leader_recovery_state=it.leader_and_isr.leader_recovery_state,
                    partition_epoch=it.leader_and_isr.partition_epoch)
                for it in its]) for tid, its in by_topic.items()])

    def next_deadline_ms(self) -> int | None:
        if self.in_flight is not None or not self.unsent:
            return None
        return self._not_before_ms

    def on_response(self, now_ms: int, response) -> list[tuple[OnDone, LeaderAndIsr | None, int]]:
        items, self.in_flight = self.in_flight or [], None
        top = ErrorCode.NETWORK_EXCEPTION if response is None else response.error_code
        if top != ErrorCode.NONE:
            log.warning("AlterPartition failed with %s; retrying in %d ms", ErrorCode(top).name,
                        self.retry_backoff_ms)
            self._not_before_ms = now_ms + self.retry_backoff_ms
            return []
        answers: dict[tuple[uuid.UUID, int], object] = {}
        for t in response.topics:
            for p in t.partitions:
                answers[(t.topic_id, p.partition_index)] = p
        done = []
        for it in items:
            p = answers.get((it.topic_id, it.partition))
            if p is None:
                log.warning("Partition %s-%d was sent but not included in the response", it.topic, it.partition)
                continue
            if self.unsent.get((it.topic, it.partition)) is it:
                del self.unsent[(it.topic, it.partition)]
            if p.error_code != ErrorCode.NONE:
                done.append((it.on_done, None, p.error_code))
            else:
                result = LeaderAndIsr(p.leader_id, p.leader_epoch, tuple((b, -1) for b in p.isr),
                                      p.partition_epoch, p.leader_recovery_state)
                done.append((it.on_done, result, ErrorCode.NONE))
        return done
