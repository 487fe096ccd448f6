"""OffsetForLeaderEpoch: the end offset of a leader epoch (KIP-101/KIP-320 truncation)."""
from __future__ import annotations

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.offset_for_leader_epoch import (
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
)
from kbroker.server.apis import ApiHandler


def handle_offset_for_leader_epoch(broker, ctx, req) -> None:
    v = ctx.api_version
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r = EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1)
            part = broker.replica_manager.get_partition((t.topic, p.partition))
            if part is None or not part.is_leader:
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
