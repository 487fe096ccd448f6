"""ListOffsets: earliest / latest / max-timestamp / by-timestamp offsets (v1+)."""
from __future__ import annotations

from kbroker.log.errors import OffsetOutOfRangeError
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.list_offsets import (
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
)
from kbroker.server.apis import ApiHandler

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
#: lowest request version that may ask for each special timestamp (Kafka's ListOffsetsRequest)
_MIN_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


def handle_list_offsets(broker, ctx, req) -> None:
    v = ctx.api_version
    rm = broker.replica_manager
    topics = []
    counts: dict[tuple, int] = {}
    for t in req.topics:
        for p in t.partitions:
            counts[(t.name, p.partition_index)] = counts.get((t.name, p.partition_index), 0) + 1
    answered = set()
    for t in req.topics:
        parts = []
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if tp in answered:
                continue
            answered.add(tp)
            r = ListOffsetsPartitionResponse(partition_index=p.partition_index, timestamp=-1, offset=-1,
                                             leader_epoch=-1)
            if counts[tp] > 1:
                r.error_code = ErrorCode.INVALID_REQUEST
                parts.append(r)
                continue
            part = rm.get_partition(tp)
            ts = p.timestamp
            if part is None:
                r.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif ts < -5 or (ts in _MIN_VERSION and v < _MIN_VERSION[ts]):
                r.error_code = ErrorCode.UNSUPPORTED_VERSION
            else:
                err = part.check_leader_epoch(p.current_leader_epoch if v >= 4 else -1)
                if err != ErrorCode.NONE:
                    r.error_code = err
                else:
                    lg = part.log
                    if ts == LATEST and req.replica_id < 0:
                        # consumers see up to the high watermark (LSO for read_committed)
                        r.offset = lg.high_watermark
                        r.leader_epoch = part.leader_epoch if v >= 4 else -1
                        r.error_code = ErrorCode.NONE
                    else:
                        try:
                            found = lg.fetch_offset_by_timestamp(ts)
                        except (OffsetOutOfRangeError, ValueError):
                            found = None
                        r.error_code = ErrorCode.NONE
                        if found is not None and (ts < 0 or found.offset < lg.high_watermark):
                            r.timestamp, r.offset = found.timestamp, found.offset
                            r.leader_epoch = found.leader_epoch if v >= 4 else -1
            parts.append(r)
        topics.append(ListOffsetsTopicResponse(name=t.name, partitions=parts))
    ctx.respond(ListOffsetsResponse(throttle_time_ms=0, topics=topics))


HANDLERS = {ApiKey.LIST_OFFSETS: ApiHandler(1, 9, handle_list_offsets)}
