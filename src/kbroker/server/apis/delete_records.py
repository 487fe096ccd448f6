"""DeleteRecords: move a partition's log start offset forward (AdminClient.deleteRecords).

Kafka: ``ReplicaManager.deleteRecords`` and ``Partition.deleteRecordsOnLeader``.
Offset -1 means "up to the high watermark"; any other negative offset, or one
beyond the high watermark, is OFFSET_OUT_OF_RANGE; a topic whose
cleanup.policy lacks "delete" refuses with POLICY_VIOLATION. The answer carries
the partition's low watermark (the minimum log start offset over its replicas;
with one replica, the log's). Kafka waits in a purgatory until every follower's
log start offset has caught up; with one replica the request completes at once,
so ``timeout_ms`` is never reached.
"""
from __future__ import annotations

import logging

from kbroker.log.errors import OffsetOutOfRangeError
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.delete_records import (
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import DELETE, TOPIC, authz

log = logging.getLogger(__name__)

HIGH_WATERMARK = -1
INVALID_LOW_WATERMARK = -1


def delete_records(broker, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """(error_code, low_watermark) for one partition."""
    part = broker.replica_manager.get_partition((topic, partition))
    if part is None or not part.is_leader:
        return broker.replica_manager.partition_error((topic, partition)), INVALID_LOW_WATERMARK
    lg = part.log
    if not lg.config.delete:
        return ErrorCode.POLICY_VIOLATION, INVALID_LOW_WATERMARK
    target = lg.high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0:
        return ErrorCode.OFFSET_OUT_OF_RANGE, INVALID_LOW_WATERMARK
    try:
        low = lg.delete_records(target)
    except OffsetOutOfRangeError as e:
        log.info("DeleteRecords on %s-%d: %s", topic, partition, e)
        return ErrorCode.OFFSET_OUT_OF_RANGE, INVALID_LOW_WATERMARK
    return ErrorCode.NONE, low


def handle_delete_records(broker, ctx, req) -> None:
    topics = []
    auth = authz(broker, ctx)
    for t in req.topics:
        parts = []
        denied = auth is not None and not auth.allowed(DELETE, TOPIC, t.name)   # KafkaApis: DELETE on the topic
        for p in t.partitions:
            code, low = ((ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1) if denied else
                         delete_records(broker, t.name, p.partition_index, p.offset))
            parts.append(DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=low,
                                                      error_code=code))
        topics.append(DeleteRecordsTopicResult(name=t.name, partitions=parts))
    ctx.respond(DeleteRecordsResponse(throttle_time_ms=0, topics=topics))


HANDLERS = {ApiKey.DELETE_RECORDS: ApiHandler(0, 2, handle_delete_records)}
