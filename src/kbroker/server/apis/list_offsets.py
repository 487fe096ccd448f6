"""ListOffsets: earliest / latest / max-timestamp / by-timestamp offsets (v1+).

Visibility (Kafka's Partition.fetchOffsetForTimestamp and ReplicaManager.fetchOffset): a
consumer (a negative replica id) sees offsets below its last fetchable offset, the high
watermark (read_uncommitted) or the last stable offset (read_committed, which is the
high watermark while there are no transactions); a replica sees the log end offset. LATEST
answers that offset; a timestamp lookup or MAX_TIMESTAMP whose record lies at or beyond
it answers NONE with offset -1 and timestamp -1, as if nothing were found; EARLIEST and
EARLIEST_LOCAL are not limited.
"""
from __future__ import annotations

from kbroker.log.errors import OffsetOutOfRangeError
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.list_offsets import (
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import DESCRIBE, TOPIC, authz

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
    auth = authz(broker, ctx)
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
            if auth is not None and not auth.allowed(DESCRIBE, TOPIC, t.name):
                r.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED     # KafkaApis: DESCRIBE on the topic
            elif part is None or not part.is_leader:
                r.error_code = rm.partition_error(tp)
            elif ts < -5 or (ts in _MIN_VERSION and v < _MIN_VERSION[ts]):
                r.error_code = ErrorCode.UNSUPPORTED_VERSION
            else:
                err = part.check_leader_epoch(p.current_leader_epoch if v >= 4 else -1)
                if err != ErrorCode.NONE:
                    r.error_code = err
                else:
                    lg = part.log
                    # consumers see up to the high watermark (LSO for read_committed, equal to it
                    # without transactions); other replica ids up to the log end offset
                    if req.replica_id >= 0:
                        last_fetchable = None
                    elif v >= 2 and req.isolation_level == 1:
                        last_fetchable = lg.last_stable_offset
                    else:
                        last_fetchable = lg.high_watermark
                    if ts == LATEST and last_fetchable is not None:
                        r.offset = last_fetchable
                        r.leader_epoch = part.leader_epoch if v >= 4 else -1
                        r.error_code = ErrorCode.NONE
                    else:
                        try:
                            found = lg.fetch_offset_by_timestamp(ts)
                        except (OffsetOutOfRangeError, ValueError):
                            found = None
                        r.error_code = ErrorCode.NONE
                        visible = (ts in (EARLIEST, EARLIEST_LOCAL) or last_fetchable is None
                                   or (found is not None and found.offset < last_fetchable))
                        if found is not None and visible:
                            r.timestamp, r.offset = found.timestamp, found.offset
                            r.leader_epoch = found.leader_epoch if v >= 4 else -1
            parts.append(r)
        topics.append(ListOffsetsTopicResponse(name=t.name, partitions=parts))
    ctx.respond(ListOffsetsResponse(throttle_time_ms=0, topics=topics))


HANDLERS = {ApiKey.LIST_OFFSETS: ApiHandler(1, 9, handle_list_offsets)}
