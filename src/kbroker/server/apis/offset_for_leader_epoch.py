"""OffsetForLeaderEpoch: the end offset of a leader epoch (KIP-101/KIP-320 truncation)."""
from __future__ import annotations

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.offset_for_leader_epoch import (
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import CLUSTER_ACTION, DESCRIBE, TOPIC, authz


def handle_offset_for_leader_epoch(broker, ctx, req) -> None:
    v = ctx.api_version
    topics = []
    # KafkaApis: a follower (replica id >= 0) needs CLUSTER_ACTION, a consumer DESCRIBE on the topic
    auth = authz(broker, ctx)
    follower_denied = (auth is not None and v >= 3 and req.replica_id >= 0
                       and not auth.cluster(CLUSTER_ACTION))
    for t in req.topics:
        parts = []
        denied = follower_denied or (auth is not None and not auth.allowed(DESCRIBE, TOPIC, t.topic))
        for p in t.partitions:
            r = EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1)
            part = broker.replica_manager.get_partition((t.topic, p.partition))
            if denied:
                r.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif part is None or not part.is_leader:
                r.error_code = broker.replica_manager.partition_error((t.topic, p.partition))
            else:
                err = part.check_leader_epoch(p.current_leader_epoch if v >= 2 else -1)
                if err != ErrorCode.NONE:
                    r.error_code = err
                else:
                    epoch, end = part.log.end_offset_for_epoch(p.leader_epoch)
                    r.error_code = ErrorCode.NONE
                    r.leader_epoch, r.end_offset = epoch, end
            parts.append(r)
        topics.append(OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
    ctx.respond(OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics))


HANDLERS = {ApiKey.OFFSET_FOR_LEADER_EPOCH: ApiHandler(0, 4, handle_offset_for_leader_epoch)}
